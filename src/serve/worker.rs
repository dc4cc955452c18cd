//! The one thread that owns the model: requests arrive in a bounded queue and are served one at a time.
//! A request with tools is one agent decision (the same grammar, calibration and retries as `reagent
//! run`), with the conversation's earlier calls and results replayed as recorded steps; a request
//! without them is a chat generation, optionally under a JSON response format.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{ApiError, ChatRequest, Choice, Format, Message, Prompt};
use super::Metrics;
use crate::agent::decision::{DecisionFormat, ToolChoice};
use crate::agent::driver::{DecisionRequest, Driver, DriverOutput, ModelDriver};
use crate::agent::Decision;
use crate::agent::{native, Agent, AgentConfig, RecordedStep};
use crate::catalog::Profile;
use crate::decode::constraint::Grammar;
use crate::decode::generate::{generate, FinishReason, GenerateParams, Request};
use crate::decode::sampler::Sampling;
use crate::limits::Cancel;
use crate::model::LanguageModel;
use crate::text::chat::{ChatMessage, Role};
use crate::tools::{CallOutcome, FnTool, Tool, ToolCall, ToolError};

/// What the worker sends back for a request.
#[derive(Debug)]
pub(crate) enum Event {
    /// Text of the answer as it is generated (chat generations, and answers in the model's own words).
    Delta(String),
    Done(Completion),
    Failed(ApiError),
}

/// A finished request.
#[derive(Debug, Clone)]
pub(crate) struct Completion {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    /// The thinking before a decision (the API's `reasoning_content`).
    pub reasoning: Option<String>,
    /// Prompt tokens whose KV was already computed (the API's `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// One queued request.
pub(crate) struct Job {
    pub req: ChatRequest,
    pub events: UnboundedSender<Event>,
    /// Cancelled when the client goes away.
    pub cancel: Cancel,
}

/// The longest answer of a chat request that sets no `max_tokens`.
const DEFAULT_MAX_TOKENS: usize = 2048;

pub(crate) struct Worker {
    driver: Arc<Mutex<ModelDriver>>,
    profile: Profile,
    parallel_calls: Option<usize>,
    think_budget: Option<usize>,
    metrics: Arc<Metrics>,
}

type Res<T> = std::result::Result<T, ApiError>;

fn server_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(500, "server_error", crate::error::one_line(&e.to_string()))
}

impl Worker {
    pub(crate) fn new(
        driver: ModelDriver,
        profile: Profile,
        parallel_calls: Option<usize>,
        think_budget: Option<usize>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let driver = Arc::new(Mutex::new(driver.with_recent_prefixes(crate::agent::RECENT_PREFIX_BYTES)));
        Self { driver, profile, parallel_calls, think_budget, metrics }
    }

    /// Serves jobs until the queue closes.
    pub(crate) fn run(mut self, jobs: std::sync::mpsc::Receiver<Job>) {
        for job in jobs {
            self.metrics.dequeued();
            if job.events.is_closed() {
                continue; // the client left while queued
            }
            let out = job.cancel.scope(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve(&job)))
                    .unwrap_or_else(|_| Err(ApiError::new(500, "server_error", "the request's generation panicked")))
            });
            if out.as_ref().is_err_and(|e| e.status >= 500) {
                // A failure may leave the KV cache anywhere: the next request starts from nothing.
                self.reset();
            }
            let _ = job.events.send(match out {
                Ok(c) => Event::Done(c),
                Err(e) => Event::Failed(e),
            });
        }
    }

    fn reset(&mut self) {
        lock(&self.driver).forget();
    }

    fn serve(&mut self, job: &Job) -> Res<Completion> {
        let req = &job.req;
        match req.prompt.is_some() || req.tools.is_empty() || req.choice == Choice::None {
            true => self.chat(req, &job.events, &job.cancel),
            false => self.decide(req, &job.events),
        }
    }

    /// A chat generation, streamed, under the response format's grammar if any.
    fn chat(&mut self, req: &ChatRequest, events: &UnboundedSender<Event>, cancel: &Cancel) -> Res<Completion> {
        let mut driver = lock(&self.driver);
        let engine = driver.engine().cloned();
        let model = driver.model();
        let tok = model.tokenizer().clone();
        let vocab = model.vocab_size();
        let prompt = match &req.prompt {
            // A completion's text as llama.cpp's server reads it: special tokens' texts are those tokens,
            // after the BOS the model's tokenizer adds.
            Some(Prompt::Text(text)) => {
                let mut ids: Vec<u32> = tok.bos().filter(|_| tok.add_bos()).into_iter().collect();
                ids.extend(
                    tok.encode(text, true)
                        .map_err(|e| ApiError::bad("prompt", crate::error::one_line(&e.to_string())))?,
                );
                ids
            }
            Some(Prompt::Tokens(ids)) => match ids.iter().find(|&&id| id as usize >= vocab) {
                Some(id) => {
                    return Err(ApiError::bad("prompt", format!("token {id} is past the vocabulary ({vocab})")))
                }
                None => ids.clone(),
            },
            // A template that refuses the conversation (roles out of the order it wants) refuses the request.
            None => model
                .chat_template()
                .render_tokens(&tok, &flatten(&req.messages, None), true, None)
                .map_err(|e| ApiError::bad("messages", crate::error::one_line(&e.to_string())))?,
        };
        if let Some((id, _)) = req.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            return Err(ApiError::bad("logit_bias", format!("token {id} is past the vocabulary ({vocab})")));
        }
        let field = if req.prompt.is_some() { "prompt" } else { "messages" };
        let capacity = model.context_length();
        if prompt.is_empty() {
            return Err(ApiError::bad(field, "has no tokens"));
        }
        if prompt.len() >= capacity {
            return Err(ApiError::bad(
                field,
                format!("the prompt takes {} tokens; the model's context holds {capacity}", prompt.len()),
            ));
        }
        let room = capacity - prompt.len();
        let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
        let grammar = match &req.format {
            Format::Text => None,
            Format::JsonObject => Some(Grammar::JsonSchema(json!({"type": "object"}))),
            Format::JsonSchema(s) => Some(Grammar::JsonSchema(s.clone())),
            Format::Grammar(g) => Some(Grammar::Lark(g.clone())),
        };
        let field = match &req.format {
            Format::Grammar(_) => "structured_outputs.grammar",
            _ => "response_format.json_schema.schema",
        };
        let mut constraint = match (&grammar, &engine) {
            (Some(g), Some(e)) => {
                Some(e.constraint(g).map_err(|e| ApiError::bad(field, crate::error::one_line(&e.to_string())))?)
            }
            _ => None,
        };
        let sampling = Sampling::from_params(req.temperature, None, req.top_p)
            .map_err(|e| ApiError::bad("temperature", e.to_string()))?;
        let params = GenerateParams::default()
            .max_tokens(max_tokens)
            .sampling(sampling)
            .seed(req.seed.unwrap_or_else(rand::random))
            .stop_strings(req.stop.clone())
            .logit_bias(req.logit_bias.clone());
        let stops = model.stop_tokens().to_vec();
        // The conversation's prefix in the KV cache: the last request's, or a recent conversation's.
        let (cached, _) = driver.prepare_prefix(&prompt);
        let model = driver.model_mut();
        let request = Request::new(&prompt).cached(cached).stop_tokens(&stops).constraint(constraint.as_mut());
        let g = generate(model, &tok, request, &params, &mut |text| {
            if events.send(Event::Delta(text.to_string())).is_err() {
                cancel.cancel();
            }
        })
        .map_err(server_error)?;
        driver.set_cached(prompt.iter().chain(&g.tokens).copied().collect());
        let finish_reason = match g.stop {
            FinishReason::MaxTokens | FinishReason::ContextFull => "length",
            FinishReason::Interrupted => {
                return Err(ApiError::new(503, "server_error", "the generation was interrupted"));
            }
            _ => "stop",
        };
        let completion_tokens = g.tokens.len();
        let cached_tokens = g.stats.cached_tokens.min(prompt.len());
        // The text with its control tokens', where asked (the stop token that ended it aside).
        let text = match req.special_text {
            true => g.text_with_control_tokens(&tok, &stops),
            false => g.text,
        };
        Ok(Completion {
            content: Some(text),
            calls: Vec::new(),
            finish_reason,
            prompt_tokens: prompt.len(),
            reasoning: None,
            cached_tokens,
            completion_tokens,
        })
    }

    /// One agent decision over the request's tools (never run here: the client runs them).
    fn decide(&mut self, req: &ChatRequest, events: &UnboundedSender<Event>) -> Res<Completion> {
        let shared = Shared(self.driver.clone());
        let entry = shared.catalog_entry();
        let mut config =
            AgentConfig::for_model(entry.as_ref(), self.profile, shared.supports_native()).map_err(server_error)?;
        config.tool_choice = match &req.choice {
            Choice::Auto => ToolChoice::Auto,
            Choice::None => ToolChoice::None,
            Choice::Required => ToolChoice::Required,
            Choice::Function(name) => ToolChoice::Specific(name.clone()),
        };
        // The client runs the calls and decides about them; nothing here has side effects to hold.
        config.hold_untrusted_calls = false;
        // The request's token limit bounds an answer in words (a native-format answer; a ReAct answer is
        // bounded in characters). Calls are not cut: a call cut short would not parse.
        if let Some(n) = req.max_tokens {
            config.decision.max_answer_tokens = config.decision.max_answer_tokens.min(n);
            config.answer_tokens = config.answer_tokens.min(n);
        }
        let answer_cap = config.decision.max_answer_tokens;
        if let Some(n) = self.think_budget {
            config.think_budget = n;
        }
        // One call a decision unless the server was started with more: the catalog's number for runs
        // (the 0.5B's 3) was chosen on agent runs, not measured on requests a client decides about.
        config.decision.parallel_calls = match (req.parallel_tool_calls, self.parallel_calls) {
            (true, Some(n)) => Some(n),
            _ => None,
        };
        // The choice between calling and answering is the decision's own: the native call score
        // (`native_branch`) was chosen on agent runs, and scoring a client's long tool lists again in the
        // model's own syntax would double their prefill (not measured on When2Call yet).
        config.native_branch = false;
        let stubs: Vec<Arc<dyn Tool>> = req
            .tools
            .iter()
            .map(|s| Arc::new(FnTool::new(s.clone(), |_| Err(ToolError("run by the client".into())))) as Arc<dyn Tool>)
            .collect();
        let format = config.format;
        let syntax = shared.call_syntax().unwrap_or_else(native::CallSyntax::hermes);
        let (conversation, recorded) = history(&req.messages, format, &syntax)?;
        config.max_steps = recorded.len() + 1;
        let replayed = recorded.len();
        // The conversation's calls whose results the client's tool reported as failures.
        let failed: Vec<(ToolCall, String)> = recorded
            .iter()
            .flat_map(|s| &s.started)
            .filter_map(|(c, o)| Some((c.clone(), o.as_ref()?.error_text()?)))
            .collect();
        // An answer in the model's own words goes out as it is generated (a streamed response sends it on).
        let deltas = events.clone();
        let mut agent = Agent::builder()
            .boxed_driver(Box::new(shared))
            .tools(stubs)
            .config(config)
            .answer_text(move |t| {
                let _ = deltas.send(Event::Delta(t.to_string()));
            })
            .build()
            .map_err(|e| ApiError::bad("tools", crate::error::one_line(&e.to_string())))?;
        let t = agent.resume(&conversation, recorded).map_err(server_error)?;
        let Some(step) = t.steps.get(replayed) else {
            // Every answer repeated a failed tool's error: the reply says that it failed, as `reagent run`
            // does, rather than passing the error on as the answer.
            if let crate::agent::StopReason::ToolFailed { .. } = &t.stop_reason {
                return Ok(Completion {
                    content: Some(format!("No answer: {}", t.stop_reason)),
                    calls: Vec::new(),
                    finish_reason: "stop",
                    prompt_tokens: t.stats.prompt_tokens,
                    reasoning: None,
                    cached_tokens: t.stats.reused_tokens.min(t.stats.prompt_tokens),
                    completion_tokens: t.stats.generated_tokens,
                });
            }
            let why = format!("no decision was made: {}", t.stop_reason);
            return Err(match t.stop_reason {
                crate::agent::StopReason::ContextOverflow { .. } => ApiError::bad("messages", why),
                crate::agent::StopReason::Interrupted => ApiError::new(503, "server_error", why),
                _ => ApiError::new(500, "server_error", why),
            });
        };
        let (content, calls, finish_reason) = match &step.decision {
            Decision::FinalAnswer { answer, .. } => {
                // The answer's own tokens (the step's count also holds thinking and any first attempt).
                let answer_tokens = lock(&self.driver).model().tokenizer().encode(answer, false).map_or(0, |t| t.len());
                let cut = format == DecisionFormat::Native && answer_tokens >= answer_cap;
                (Some(answer.clone()), Vec::new(), if cut { "length" } else { "stop" })
            }
            d => {
                // A call that failed before is not sent again (the client would run it again, and the
                // model would ask for it again): the reply says that it failed, as `reagent run` does.
                let calls = d.calls();
                match calls.iter().find_map(|c| failed.iter().find(|(f, _)| f == c)) {
                    Some((f, error)) => {
                        let stop = crate::agent::StopReason::ToolFailed { tool: f.tool.clone(), error: error.clone() };
                        (Some(format!("No answer: {stop}")), Vec::new(), "stop")
                    }
                    None => (None, calls, "tool_calls"),
                }
            }
        };
        Ok(Completion {
            content,
            calls,
            finish_reason,
            prompt_tokens: step.stats.prompt_tokens,
            reasoning: step.thinking.clone(),
            cached_tokens: step.stats.reused_tokens.min(step.stats.prompt_tokens),
            completion_tokens: step.stats.generated_tokens,
        })
    }
}

fn lock(d: &Mutex<ModelDriver>) -> MutexGuard<'_, ModelDriver> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

/// The conversation as chat messages: earlier turns' calls in the model's call syntax (native decisions),
/// else written out as JSON (a generation without tools, ReAct decisions).
fn flatten(messages: &[Message], syntax: Option<&native::CallSyntax>) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|m| match m {
            Message::System(s) => ChatMessage::system(s.clone()),
            Message::User(s) => ChatMessage::user(s.clone()),
            Message::Assistant { content, calls } => match syntax.filter(|_| !calls.is_empty()) {
                Some(syntax) => {
                    let mut turn = syntax.turn(calls.iter().map(|(_, c)| c.clone()).collect());
                    if let Some(text) = content.as_deref().filter(|t| !t.trim().is_empty()) {
                        // Beside calls the template renders; before calls written as the turn's text.
                        turn.content = if turn.tool_calls.is_empty() {
                            format!("{text}\n{}", turn.content)
                        } else {
                            text.to_string()
                        };
                    }
                    turn
                }
                None => {
                    let mut text = content.clone().unwrap_or_default();
                    for (_, c) in calls {
                        text.push_str(&json!({"name": c.tool, "arguments": c.args}).to_string());
                    }
                    ChatMessage::assistant(text)
                }
            },
            Message::Tool { content, .. } => ChatMessage::new(Role::Tool, content.clone()),
        })
        .collect()
}

/// The conversation up to the last user message, and what follows it (the assistant's calls and their
/// results) as recorded steps, written as the agent writes its own decisions in `format`.
fn history(
    messages: &[Message],
    format: DecisionFormat,
    syntax: &native::CallSyntax,
) -> Res<(Vec<ChatMessage>, Vec<RecordedStep>)> {
    let last_user = messages.iter().rposition(|m| matches!(m, Message::User(_))).expect("checked: a user message");
    let conversation = flatten(&messages[..=last_user], (format == DecisionFormat::Native).then_some(syntax));
    let mut steps = Vec::new();
    let mut i = last_user + 1;
    while i < messages.len() {
        let Message::Assistant { calls, .. } = &messages[i] else {
            return Err(ApiError::bad(
                format!("messages[{i}]"),
                "after the last user message only assistant tool calls and their tool results may follow",
            ));
        };
        if calls.is_empty() {
            return Err(ApiError::bad(format!("messages[{i}]"), "an assistant answer after the last user message"));
        }
        let mut results: Vec<Option<String>> = vec![None; calls.len()];
        i += 1;
        while let Some(Message::Tool { call_id, content }) = messages.get(i) {
            let k = calls.iter().position(|(id, _)| id == call_id).ok_or_else(|| {
                ApiError::bad(
                    format!("messages[{i}].tool_call_id"),
                    format!("`{call_id}` is no call of the message before"),
                )
            })?;
            results[k] = Some(content.clone());
            i += 1;
        }
        let plain: Vec<ToolCall> = calls.iter().map(|(_, c)| c.clone()).collect();
        let text = match format {
            DecisionFormat::Native => syntax.render(&plain),
            _ => match plain.as_slice() {
                [c] => json!({"thought": "", "type": "call_tool", "tool": c.tool, "args": c.args}).to_string(),
                _ => json!({"thought": "", "type": "call_tools", "calls": plain}).to_string(),
            },
        };
        let started = plain
            .iter()
            .cloned()
            .zip(results)
            .map(|(c, r)| {
                let outcome = match r {
                    // A result the client's tool reports as a failure is one: kept out of the answer and
                    // retried like a failed call of the agent's own.
                    Some(output) => match client_failure(&output) {
                        Some(message) => CallOutcome::Error { message },
                        None => CallOutcome::Ok { output },
                    },
                    None => CallOutcome::Error { message: "no result was given for this call".into() },
                };
                (c, Some(outcome))
            })
            .collect();
        steps.push(RecordedStep { decision: Decision::from_calls(String::new(), plain), text, record: None, started });
    }
    Ok((conversation, steps))
}

/// The worker's driver lent to one request's agent (which owns its driver).
struct Shared(Arc<Mutex<ModelDriver>>);

impl Driver for Shared {
    fn name(&self) -> &'static str {
        lock(&self.0).name()
    }
    fn decide(&mut self, req: &DecisionRequest<'_>) -> crate::error::Result<DriverOutput> {
        lock(&self.0).decide(req)
    }
    fn extend(&mut self, req: &DecisionRequest<'_>) -> crate::error::Result<Option<DriverOutput>> {
        lock(&self.0).extend(req)
    }
    fn answer(
        &mut self,
        messages: &[ChatMessage],
        max_tokens: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> crate::error::Result<Option<DriverOutput>> {
        lock(&self.0).answer(messages, max_tokens, on_text)
    }
    fn call_margin(
        &mut self,
        req: &DecisionRequest<'_>,
    ) -> crate::error::Result<Option<(f32, crate::agent::DecisionStats)>> {
        lock(&self.0).call_margin(req)
    }
    fn score(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        text: &str,
    ) -> crate::error::Result<Option<Vec<(String, f32)>>> {
        lock(&self.0).score(messages, tools, text)
    }
    fn rollback(&mut self) {
        lock(&self.0).rollback()
    }
    fn observation_role(&self) -> Role {
        lock(&self.0).observation_role()
    }
    fn measure(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
    ) -> crate::error::Result<Option<(usize, usize)>> {
        lock(&self.0).measure(messages, tools)
    }
    fn call_syntax(&self) -> Option<native::CallSyntax> {
        lock(&self.0).call_syntax()
    }
    fn supports_thinking(&self) -> bool {
        lock(&self.0).supports_thinking()
    }
    fn prompt_bound(&mut self, bytes: usize) -> Option<(usize, usize)> {
        lock(&self.0).prompt_bound(bytes)
    }
    fn forget(&mut self) {
        lock(&self.0).forget()
    }
    fn reseed(&mut self) {
        lock(&self.0).reseed()
    }
    fn check_grammar(&self, grammar: &Grammar) -> crate::error::Result<()> {
        lock(&self.0).check_grammar(grammar)
    }
    fn catalog_entry(&self) -> Option<crate::catalog::CatalogEntry> {
        lock(&self.0).catalog_entry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's earlier turn of text and calls: the calls go to a template that renders them, or into
    /// the turn's text after the words where the template takes fewer calls a turn (Llama 3.x's one).
    #[test]
    fn earlier_calls_keep_their_words_and_their_calls() {
        let calls = vec![
            ("a".to_string(), ToolCall::new("f", json!({"x": 1}))),
            ("b".to_string(), ToolCall::new("g", json!({}))),
        ];
        let turn = [Message::Assistant { content: Some("Checking.".into()), calls }];
        let qwen = native::CallSyntax::hermes();
        let [m] = flatten(&turn, Some(&qwen)).try_into().unwrap();
        assert_eq!((m.content.as_str(), m.tool_calls.len()), ("Checking.", 2));
        let mut one_a_turn = native::CallSyntax::hermes();
        one_a_turn.separator = None;
        let [m] = flatten(&turn, Some(&one_a_turn)).try_into().unwrap();
        assert!(m.tool_calls.is_empty());
        assert!(m.content.starts_with("Checking.\n<tool_call>") && m.content.contains("\"g\""), "{}", m.content);
    }
}

/// The failure a client's tool result reports, where its shape says so: a JSON object whose one key is
/// `error` (a message, or an object with a `message`), or text that opens with `Error:` (the mark of the
/// agent's own failed observations, [`ERROR_MARK`](crate::tools::ERROR_MARK)) or `error:`.
fn client_failure(output: &str) -> Option<String> {
    let text = output.trim();
    let mark = crate::tools::ERROR_MARK.trim_end();
    if let Some(rest) = text.strip_prefix(mark).or_else(|| text.strip_prefix(&mark.to_lowercase())) {
        let message = rest.trim();
        return Some(if message.is_empty() { text } else { message }.to_string());
    }
    let v: Value = serde_json::from_str(text).ok()?;
    let o = v.as_object().filter(|o| o.len() == 1)?;
    match o.get("error")? {
        Value::String(m) => Some(m.clone()),
        Value::Object(e) => {
            Some(e.get("message").and_then(Value::as_str).map_or_else(|| text.to_string(), str::to_string))
        }
        _ => None,
    }
}

#[cfg(test)]
mod failure_tests {
    use super::client_failure;

    #[test]
    fn a_client_tool_result_is_a_failure_only_where_its_shape_says_so() {
        let stock = r#"{"error": "Stock with symbol 'Quasar Ltd.' not found."}"#;
        assert_eq!(client_failure(stock).as_deref(), Some("Stock with symbol 'Quasar Ltd.' not found."));
        assert_eq!(client_failure(r#"{"error": {"message": "denied", "code": 3}}"#).as_deref(), Some("denied"));
        assert_eq!(client_failure("Error: no such file").as_deref(), Some("no such file"));
        // Results that carry an `error` field beside their data, or mention errors, are results.
        assert_eq!(client_failure(r#"{"error": null, "price": 3}"#), None);
        assert_eq!(client_failure(r#"{"errors_today": 0}"#), None);
        assert_eq!(client_failure("18 C"), None);
        assert_eq!(client_failure("The error rate was 2%"), None);
    }
}
