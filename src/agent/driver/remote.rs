//! [`RemoteDriver`]: decisions made by a model on an OpenAI-compatible server (vLLM, SGLang, llama.cpp's
//! server, `reagent serve`), constrained as the engine can take it ([`RemoteConstraint`]). Everything else of
//! the agent (tools, MCP, traces, retries, eval) runs here unchanged; each decision is parsed and
//! validated here as a local one is. The call bias of a ReAct decision is applied from the
//! log-probabilities the server returns ([`branch`]); a native decision (the model's file here) takes its
//! call bias, its more-calls bias and its proposed calls as `logit_bias` and continued requests to
//! `/completions` ([`RemoteDriver::with_template`]). The call's support, which needs the model's scores
//! of a given text, is not applied: scored through a grammar that allows only that text, a server's
//! greedy tokenisation of it is not the model's (`src/catalog.rs` written as `src`, `/c`, `atal`, `og`,
//! …), and the scores of such pieces say little.

mod branch;
pub mod gbnf;
mod native;
mod tools;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{DecisionRequest, Driver, DriverOutput};
use crate::agent::decision::DecisionFormat;
use crate::agent::events::DecisionStats;
use crate::agent::native::CallSyntax;
use crate::decode::constraint::BranchMargin;
use crate::decode::constraint::Grammar;
use crate::error::{Error, Result};
use crate::text::chat::{ChatMessage, Role};
use branch::Side;

/// How a decision's grammar reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RemoteConstraint {
    /// The decision's grammar in llguidance's Lark dialect as `structured_outputs.grammar` (vLLM's and
    /// SGLang's llguidance backends, `reagent serve`): decisions valid by construction.
    #[default]
    Grammar,
    /// The decision's grammar written in GBNF as `grammar` (llama.cpp's server, llama-cpp-python's): a
    /// schema translated whole, a native grammar but for what GBNF cannot say (see [`gbnf`]); valid
    /// by construction where the translation is whole, checked here as always.
    Gbnf,
    /// The decision's JSON schema as `response_format` (llama.cpp's server, Ollama, hosted APIs): valid
    /// where the engine enforces the schema.
    JsonSchema,
    /// The decision's tools as OpenAI `tools` and `tool_choice`, for engines with neither grammars nor
    /// schemas: the reply's calls are taken as the decision and validated here.
    Tools,
    /// No constraint: the text is parsed and validated here, and retried when it does not hold.
    None,
}

impl std::str::FromStr for RemoteConstraint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "grammar" => Ok(Self::Grammar),
            "gbnf" => Ok(Self::Gbnf),
            "json-schema" => Ok(Self::JsonSchema),
            "tools" => Ok(Self::Tools),
            "none" => Ok(Self::None),
            other => Err(Error::param(
                "constraint",
                format!("`{other}`: expected grammar, gbnf, json-schema, tools or none"),
            )),
        }
    }
}

impl std::fmt::Display for RemoteConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Grammar => "grammar",
            Self::Gbnf => "gbnf",
            Self::JsonSchema => "json-schema",
            Self::Tools => "tools",
            Self::None => "none",
        })
    }
}

/// Makes decisions on an OpenAI-compatible chat-completions endpoint. A clone talks to the same server
/// as it was found to take (an eval's workers on one endpoint).
#[derive(Clone)]
pub struct RemoteDriver {
    /// The API's base, ending before `/chat/completions` (`http://host:8080/v1`).
    base: String,
    model: String,
    api_key: Option<String>,
    constraint: RemoteConstraint,
    http: ureq::Agent,
    /// Attempts after a failed request (a transport error, a 429 or a 5xx), each after twice the wait.
    retries: u32,
    backoff: Duration,
    /// The catalog's entry for the served model, whose settings then apply (those that need no scores).
    entry: Option<crate::catalog::CatalogEntry>,
    /// The schema goes as `{"type": "json_object", "schema": …}` (llama-cpp-python's server, which refuses
    /// `json_schema`): switched to after the first refusal that names the type.
    schema_in_json_object: bool,
    /// The served model's template and tokenizer, read here from its file: native decisions
    /// ([`with_template`](Self::with_template)).
    local: Option<std::sync::Arc<native::Local>>,
    /// The last native decision's prompt and text as tokens, where [`Driver::extend`] goes on.
    last: Option<Vec<u32>>,
}

impl std::fmt::Debug for RemoteDriver {
    // The key is never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDriver")
            .field("base", &self.base)
            .field("model", &self.model)
            .field("constraint", &self.constraint)
            .finish_non_exhaustive()
    }
}

impl RemoteDriver {
    /// A driver for `model` at `base` (`http://host:port/v1`), each request bounded by `timeout`.
    pub fn new(base: &str, model: impl Into<String>, constraint: RemoteConstraint, timeout: Duration) -> Result<Self> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::param("endpoint", format!("`{base}`: expected an http:// or https:// URL")));
        }
        let http = ureq::AgentBuilder::new().timeout(timeout).build();
        let (retries, backoff) = (2, Duration::from_millis(500));
        Ok(Self {
            base,
            model: model.into(),
            api_key: None,
            constraint,
            http,
            retries,
            backoff,
            entry: None,
            schema_in_json_object: false,
            local: None,
            last: None,
        })
    }

    /// The first choice of a response, its text at `text` (`/message/content` for chat, `/text` for a
    /// completion): the text, whether it ended by itself, and the usage figures.
    fn first_choice<'r>(&self, resp: &'r Value, text: &str, started: Instant) -> Result<(DriverOutput, &'r Value)> {
        let choice = resp.pointer("/choices/0").ok_or_else(|| Error::Remote {
            endpoint: self.base.clone(),
            problem: format!("the response has no choices: {}", excerpt(&resp.to_string())),
        })?;
        let text = choice.pointer(text).and_then(Value::as_str).unwrap_or_default().to_string();
        let complete = choice.get("finish_reason").and_then(Value::as_str) == Some("stop");
        let count = |p: &str| resp.pointer(p).and_then(Value::as_u64).unwrap_or(0) as usize;
        let stats = DecisionStats {
            prompt_tokens: count("/usage/prompt_tokens"),
            reused_tokens: count("/usage/prompt_tokens_details/cached_tokens"),
            generated_tokens: count("/usage/completion_tokens"),
            seconds: started.elapsed().as_secs_f64(),
            ..DecisionStats::default()
        };
        Ok((DriverOutput::new(text, complete, stats), choice))
    }

    /// Sent as `Authorization: Bearer KEY`.
    #[must_use]
    pub fn api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key.filter(|k| !k.is_empty());
        self
    }

    /// Attempts after a failed request and the wait before the first (default: 2, 0.5 s).
    #[must_use]
    pub fn retries(mut self, times: u32, backoff: Duration) -> Self {
        (self.retries, self.backoff) = (times, backoff);
        self
    }

    /// The catalog's entry of the model the server runs: its decision settings apply, but for those that
    /// need the model's scores.
    #[must_use]
    pub fn catalog_entry(mut self, entry: Option<crate::catalog::CatalogEntry>) -> Self {
        self.entry = entry;
        self
    }

    pub fn constraint(&self) -> RemoteConstraint {
        self.constraint
    }

    /// Finds the strongest constraint the server enforces, and takes it: a grammar (a reply held to a
    /// one-word Lark grammar), else GBNF where the model's call syntax is known here (the same word in
    /// GBNF), else a JSON schema (either form; a reply held to a schema with one constant), else GBNF,
    /// else OpenAI tools (a named function called), else none. Each probe is one short request; a server
    /// that refuses a field is a probe that failed, a server that cannot be reached an error.
    pub fn probe(&mut self) -> Result<RemoteConstraint> {
        const WORD: &str = "reagent-probe";
        let messages = [ChatMessage::user("Write one word.")];
        let base = self.body(&messages, None, 48)?;
        let with = |field: &str, value: Value| {
            let mut b = base.clone();
            b[field] = value;
            b
        };
        // The first choice's message of a reply, or none where the server refused the request.
        let reply = |d: &Self, body: &Value| -> Result<Option<Value>> {
            match d.post(body) {
                Ok(r) => Ok(r.pointer("/choices/0/message").cloned()),
                Err(Error::Remote { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let content = |m: &Option<Value>| {
            m.as_ref().and_then(|m| m.get("content")).and_then(Value::as_str).unwrap_or_default().trim().to_string()
        };
        let grammar = with("structured_outputs", json!({"grammar": format!("start: \"{WORD}\"")}));
        if content(&reply(self, &grammar)?) == WORD {
            self.constraint = RemoteConstraint::Grammar;
            return Ok(self.constraint);
        }
        // GBNF before a schema where the model's own call syntax is known here (native decisions need a
        // grammar), after it otherwise (a schema is the engine's own translation).
        let gbnf = with("grammar", json!(format!("root ::= \"{WORD}\"")));
        let native = self.local.as_ref().is_some_and(|l| l.syntax.is_some());
        if native && content(&reply(self, &gbnf)?) == WORD {
            self.constraint = RemoteConstraint::Gbnf;
            return Ok(self.constraint);
        }
        let schema = json!({"type": "object", "properties": {"probe": {"const": WORD}}, "required": ["probe"]});
        let forms = [
            json!({"type": "json_schema", "json_schema": {"name": "probe", "schema": schema, "strict": true}}),
            json!({"type": "json_object", "schema": schema}),
        ];
        // Probed as the mode it would be, so that a refusal of the form that names the other is not
        // tried again.
        (self.constraint, self.schema_in_json_object) = (RemoteConstraint::JsonSchema, false);
        for (json_object, form) in [false, true].into_iter().zip(forms) {
            let written = content(&reply(self, &with("response_format", form))?);
            let held = serde_json::from_str::<Value>(&written).ok().is_some_and(|v| v["probe"] == WORD);
            if held {
                (self.constraint, self.schema_in_json_object) = (RemoteConstraint::JsonSchema, json_object);
                return Ok(self.constraint);
            }
        }
        self.schema_in_json_object = false;
        if !native && content(&reply(self, &gbnf)?) == WORD {
            self.constraint = RemoteConstraint::Gbnf;
            return Ok(self.constraint);
        }
        let name = "reagent_probe";
        let mut tools = with(
            "tools",
            json!([{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}]),
        );
        tools["tool_choice"] = json!({"type": "function", "function": {"name": name}});
        let called = reply(self, &tools)?
            .and_then(|m| m.pointer("/tool_calls/0/function/name").and_then(Value::as_str).map(str::to_string));
        self.constraint = match called.as_deref() {
            Some(n) if n == name => RemoteConstraint::Tools,
            _ => RemoteConstraint::None,
        };
        Ok(self.constraint)
    }

    /// The request body of a decision under `grammar` (or of an answer in words, with none).
    pub fn body(&self, messages: &[ChatMessage], grammar: Option<&Grammar>, max_tokens: usize) -> Result<Value> {
        let mut body = json!({
            "model": self.model,
            "messages": messages.iter().map(message).collect::<Vec<_>>(),
            "temperature": 0,
            "max_tokens": max_tokens,
        });
        let (Some(g), Some(o)) = (grammar, body.as_object_mut()) else { return Ok(body) };
        match (self.constraint, g) {
            (RemoteConstraint::None, _) => {}
            (RemoteConstraint::Grammar, Grammar::Lark(lark)) => {
                o.insert("structured_outputs".into(), json!({"grammar": lark}));
            }
            (RemoteConstraint::Grammar, Grammar::JsonSchema(s)) => {
                o.insert("structured_outputs".into(), json!({"grammar": format!("start: %json {s}")}));
            }
            (RemoteConstraint::Gbnf, Grammar::JsonSchema(s)) => {
                o.insert("grammar".into(), json!(gbnf::schema(s)?));
            }
            (RemoteConstraint::JsonSchema, Grammar::JsonSchema(s)) => {
                let mut schema = s.clone();
                // llguidance's options mean nothing to other engines.
                if let Some(m) = schema.as_object_mut() {
                    m.remove("x-guidance");
                }
                let format = match self.schema_in_json_object {
                    true => json!({"type": "json_object", "schema": schema}),
                    false => {
                        json!({"type": "json_schema", "json_schema": {"name": "decision", "schema": schema, "strict": true}})
                    }
                };
                o.insert("response_format".into(), format);
            }
            (RemoteConstraint::Tools, Grammar::JsonSchema(s)) => {
                if let Some((tools, choice)) = tools::request_tools(s) {
                    o.insert("tools".into(), tools);
                    o.insert("tool_choice".into(), choice);
                }
            }
            (c, g) => {
                return Err(Error::param(
                    "constraint",
                    format!("a {} cannot be sent as `{c}`: use the react decision format", g.kind()),
                ))
            }
        }
        Ok(body)
    }

    /// Posts `body` to `/chat/completions`; the response's JSON. Transport errors, 429s and 5xxs are
    /// tried again, then are [`Error::EndpointDown`]; a 4xx is not tried again.
    fn post(&self, body: &Value) -> Result<Value> {
        self.post_to("chat/completions", body)
    }

    /// [`post`](Self::post) to `/ROUTE`.
    fn post_to(&self, route: &str, body: &Value) -> Result<Value> {
        let url = format!("{}/{route}", self.base);
        let fail = |problem: String| Error::Remote { endpoint: self.base.clone(), problem };
        let mut wait = self.backoff;
        let mut attempt = 0;
        loop {
            let mut req = self.http.post(&url).set("Content-Type", "application/json");
            if let Some(k) = &self.api_key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            let problem = match req.send_string(&body.to_string()) {
                Ok(resp) => {
                    let text = resp.into_string().map_err(|e| fail(format!("reading the response: {e}")))?;
                    return serde_json::from_str(&text)
                        .map_err(|e| fail(format!("the response is not JSON ({e}): {}", excerpt(&text))));
                }
                Err(ureq::Error::Status(code, resp)) => {
                    let text = resp.into_string().unwrap_or_default();
                    let problem = format!("HTTP {code}: {}", error_message(&text));
                    // A refusal of the schema's form (llama-cpp-python answers it with a 500) is not
                    // tried again: `request` switches the form.
                    if (code != 429 && code < 500) || self.refuses_json_schema(&problem) {
                        return Err(fail(problem));
                    }
                    problem
                }
                Err(ureq::Error::Transport(t)) => t.to_string(),
            };
            if attempt >= self.retries {
                let tries = if attempt == 0 { String::new() } else { format!(" (after {} attempts)", attempt + 1) };
                return Err(Error::EndpointDown { endpoint: self.base.clone(), problem: format!("{problem}{tries}") });
            }
            attempt += 1;
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    }

    /// The text of the first choice, whether it ended by itself, and the figures; with its tokens'
    /// log-probabilities (`logprobs.content`) where the server returned them.
    /// Under `--constraint tools`, the reply's calls are the decision's text (`schema`: the decision's).
    fn complete(&self, body: &Value, schema: Option<&Value>, started: Instant) -> Result<(DriverOutput, Vec<Value>)> {
        let resp = self.post(body)?;
        let (mut out, choice) = self.first_choice(&resp, "/message/content", started)?;
        let logprobs = choice.pointer("/logprobs/content").and_then(Value::as_array).cloned().unwrap_or_default();
        if let (RemoteConstraint::Tools, Some(schema), Some(m)) = (self.constraint, schema, choice.get("message")) {
            out.text = tools::decision_text(m, schema);
            // A reply that called ended by calling.
            out.complete |= choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls");
        }
        Ok((out, logprobs))
    }

    /// Whether `problem` is a server's refusal of `response_format: json_schema` that names the form it
    /// takes instead, while the schema still goes as `json_schema`.
    fn refuses_json_schema(&self, problem: &str) -> bool {
        self.constraint == RemoteConstraint::JsonSchema
            && !self.schema_in_json_object
            && problem.contains("json_object")
    }

    /// A decision under `grammar`, with its tokens' log-probabilities and `TOP_LOGPROBS` alternatives
    /// where `logprobs`. A server that takes a schema only as a `json_object` says so naming the types it
    /// knows: the schema goes that way from then on.
    fn request(
        &mut self,
        messages: &[ChatMessage],
        grammar: &Grammar,
        max_tokens: usize,
        logprobs: bool,
    ) -> Result<(DriverOutput, Vec<Value>)> {
        let body = |d: &Self| -> Result<Value> {
            let mut b = d.body(messages, Some(grammar), max_tokens)?;
            if logprobs {
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(TOP_LOGPROBS);
            }
            Ok(b)
        };
        let schema = match grammar {
            Grammar::JsonSchema(s) => Some(s),
            _ => None,
        };
        match self.complete(&body(self)?, schema, Instant::now()) {
            Err(Error::Remote { problem, .. }) if self.refuses_json_schema(&problem) => {
                self.schema_in_json_object = true;
                self.complete(&body(self)?, schema, Instant::now())
            }
            done => done,
        }
    }

    /// A ReAct decision whose first choice between calling and answering takes `bias` (see [`branch`]):
    /// the server's decision, or the same request narrowed to the other side where the bias turns the
    /// margin over. The server's own choice where it returns no log-probabilities.
    fn biased(&mut self, req: &DecisionRequest<'_>, schema: &Value, bias: f32) -> Result<DriverOutput> {
        let (mut first, content) = self.request(req.messages, req.grammar, req.max_tokens, true)?;
        let Some(t) = branch::type_token(&content, TOP_LOGPROBS) else { return Ok(first) };
        // The call's margin, given the other side's log-probability; whether the server's choice stands.
        let margin_with = |other: f32| if t.side == Side::Call { t.logprob - other } else { other - t.logprob };
        let stands = |margin: f32| (t.side == Side::Call) == (margin + bias > 0.0);
        if t.other.is_none() && t.ceiling.is_some_and(|c| stands(margin_with(c))) {
            // The other side is below every alternative listed: even at their least it would not turn
            // the choice.
            return Ok(first);
        }
        let Some(narrow) = branch::narrowed(schema, t.side.other()) else { return Ok(first) };
        let narrow = Grammar::JsonSchema(narrow);
        // The other side's decision, asked for now where its log-probability is needed.
        let mut other_out = None;
        let other = match t.other {
            Some(o) => o,
            None => {
                let (out, content) = self.request(req.messages, &narrow, req.max_tokens, true)?;
                let measured = branch::type_token(&content, TOP_LOGPROBS).filter(|o| o.side == t.side.other());
                let Some(o) = measured else {
                    first.stats.add_generation(&out.stats);
                    return Ok(first);
                };
                other_out = Some(out);
                o.logprob
            }
        };
        let margin = margin_with(other);
        let mut kept = match (stands(margin), other_out) {
            (true, spent) => {
                if let Some(o) = spent {
                    first.stats.add_generation(&o.stats);
                }
                first
            }
            (false, other_out) => {
                let mut turned = match other_out {
                    Some(o) => o,
                    None => self.request(req.messages, &narrow, req.max_tokens, false)?.0,
                };
                turned.stats.add_generation(&first.stats);
                turned
            }
        };
        kept.stats.branch_margins = vec![BranchMargin { label: "call", margin }];
        Ok(kept)
    }
}

/// The alternatives asked for with each token of a decision whose call bias is applied here.
const TOP_LOGPROBS: usize = 20;

/// The alternatives of a ReAct decision schema: its `anyOf`, or the schema itself where it has one.
fn alternatives(schema: &Value) -> Vec<&Value> {
    match schema.get("anyOf").and_then(Value::as_array) {
        Some(a) => a.iter().collect(),
        None => vec![schema],
    }
}

/// An alternative's `type` (`call_tool`, `call_tools`, `final_answer`).
fn type_of(alternative: &Value) -> Option<&str> {
    alternative.pointer("/properties/type/const").and_then(Value::as_str)
}

impl Driver for RemoteDriver {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn decide(&mut self, req: &DecisionRequest<'_>) -> Result<DriverOutput> {
        if req.think_budget > 0 {
            return Err(Error::param("think budget", "not available on a remote model"));
        }
        if req.format == DecisionFormat::Native {
            return self.native(req);
        }
        let bias = req.biases.call;
        match req.grammar {
            Grammar::JsonSchema(s)
                if bias != 0.0
                    && req.format == DecisionFormat::React
                    && matches!(
                        self.constraint,
                        RemoteConstraint::Grammar | RemoteConstraint::Gbnf | RemoteConstraint::JsonSchema
                    )
                    && branch::offers_both(s) =>
            {
                self.biased(req, s, bias)
            }
            g => Ok(self.request(req.messages, g, req.max_tokens, false)?.0),
        }
    }

    /// Goes on from the last native decision (and what was added to it), its prompt and text sent
    /// again as tokens, under `req.grammar` (one more call).
    fn extend(&mut self, req: &DecisionRequest<'_>) -> Result<Option<DriverOutput>> {
        self.go_on(req)
    }

    fn rollback(&mut self) {
        self.last = None;
    }

    fn answer(
        &mut self,
        messages: &[ChatMessage],
        max_tokens: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<DriverOutput>> {
        let body = self.body(messages, None, max_tokens)?;
        let (out, _) = self.complete(&body, None, Instant::now())?;
        on_text(&out.text);
        Ok(Some(out))
    }

    fn catalog_entry(&self) -> Option<crate::catalog::CatalogEntry> {
        self.entry.clone()
    }

    /// The model's own call syntax where its template was read here ([`RemoteDriver::with_template`])
    /// and the server takes grammars (Lark or GBNF); else none: decisions are ReAct, whose text any model can write.
    fn call_syntax(&self) -> Option<CallSyntax> {
        let local = self
            .local
            .as_ref()
            .filter(|_| matches!(self.constraint, RemoteConstraint::Grammar | RemoteConstraint::Gbnf))?;
        local.syntax.clone()
    }

    fn observation_role(&self) -> Role {
        match self.call_syntax() {
            Some(_) => Role::Tool,
            None => Role::User,
        }
    }
}

/// A message as the API takes it. Observations come as user turns (a driver that cannot see the
/// server's template says [`Role::User`] for them), so no turn needs a call id.
fn message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User | Role::Tool => "user",
        Role::Assistant => "assistant",
    };
    json!({"role": role, "content": m.content})
}

/// The API error object's message, else the start of the body.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| excerpt(body))
}

/// At most 200 characters of `s`, on one line.
fn excerpt(s: &str) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one[..i]),
        None => one,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(c: RemoteConstraint) -> RemoteDriver {
        RemoteDriver::new("http://127.0.0.1:9/v1/", "m", c, Duration::from_secs(1)).unwrap()
    }

    /// Thinking needs the model's own template: a remote decision with a think budget is refused before
    /// anything is sent (the driver's endpoint takes no connection).
    #[test]
    fn a_think_budget_is_refused() {
        let g = Grammar::JsonSchema(json!({"type": "object"}));
        let msgs = [ChatMessage::user("u")];
        let req = DecisionRequest {
            messages: &msgs,
            grammar: &g,
            tools: None,
            format: crate::agent::DecisionFormat::React,
            biases: Default::default(),
            max_tokens: 8,
            attempt: 0,
            think_budget: 16,
            stop_at_answer: false,
        };
        let e = driver(RemoteConstraint::Grammar).decide(&req).unwrap_err().to_string();
        assert!(e.contains("think budget") && e.contains("remote"), "{e}");
    }

    #[test]
    fn each_constraint_sends_what_it_should() {
        let schema = json!({"type": "object", "x-guidance": {"whitespace_flexible": false}});
        let g = Grammar::JsonSchema(schema.clone());
        let msgs = [ChatMessage::system("s"), ChatMessage::user("u"), ChatMessage::new(Role::Tool, "obs")];
        let b = driver(RemoteConstraint::Grammar).body(&msgs, Some(&g), 64).unwrap();
        assert_eq!(b["structured_outputs"]["grammar"], format!("start: %json {schema}"));
        assert_eq!(b["messages"][2], json!({"role": "user", "content": "obs"}));
        assert_eq!(
            (b["model"].as_str(), b["max_tokens"].as_u64(), b["temperature"].as_u64()),
            (Some("m"), Some(64), Some(0))
        );
        assert!(b.get("response_format").is_none());
        let b = driver(RemoteConstraint::Grammar).body(&msgs, Some(&Grammar::Lark("start: /a/".into())), 8).unwrap();
        assert_eq!(b["structured_outputs"], json!({"grammar": "start: /a/"}));
        let b = driver(RemoteConstraint::JsonSchema).body(&msgs, Some(&g), 64).unwrap();
        assert_eq!(b["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert!(b.get("structured_outputs").is_none());
        let b = driver(RemoteConstraint::Gbnf).body(&msgs, Some(&g), 64).unwrap();
        assert_eq!(b["grammar"], gbnf::schema(&schema).unwrap());
        assert!(b.get("structured_outputs").is_none() && b.get("response_format").is_none());
        // Tools: the schema's call alternatives as functions; nothing where it has none.
        let decision = json!({"anyOf": [
            {"properties": {"type": {"const": "call_tool"}, "tool": {"const": "calc"}, "args": {"type": "object"}}},
            {"properties": {"type": {"const": "final_answer"}}}]});
        let b = driver(RemoteConstraint::Tools).body(&msgs, Some(&Grammar::JsonSchema(decision)), 64).unwrap();
        assert_eq!(
            (b["tools"][0]["function"]["name"].as_str(), b["tool_choice"].as_str()),
            (Some("calc"), Some("auto"))
        );
        assert!(b.get("response_format").is_none() && b.get("structured_outputs").is_none());
        let b = driver(RemoteConstraint::Tools).body(&msgs, Some(&g), 64).unwrap();
        assert!(b.get("tools").is_none());
        let b = driver(RemoteConstraint::None).body(&msgs, Some(&g), 64).unwrap();
        assert!(b.get("structured_outputs").is_none() && b.get("response_format").is_none());
        // An answer in words carries no constraint whatever the mode.
        let b = driver(RemoteConstraint::Grammar).body(&msgs, None, 64).unwrap();
        assert!(b.get("structured_outputs").is_none());
        // A Lark grammar has no JSON schema to send.
        let e =
            driver(RemoteConstraint::JsonSchema).body(&msgs, Some(&Grammar::Lark("start: /a/".into())), 8).unwrap_err();
        assert!(e.to_string().contains("Lark grammar cannot be sent as `json-schema`"), "{e}");
    }

    #[test]
    fn a_server_that_is_not_there_is_an_error_naming_it_after_the_retries() {
        let d = driver(RemoteConstraint::Grammar).retries(1, Duration::from_millis(1)).api_key(Some("secret".into()));
        let e = d.post(&json!({})).unwrap_err().to_string();
        assert!(e.starts_with("http://127.0.0.1:9/v1: "), "{e}");
        assert!(e.contains("after 2 attempts"), "{e}");
        assert!(!e.contains("secret") && !format!("{d:?}").contains("secret"));
        assert!("tools".parse::<RemoteConstraint>().is_ok() && "logits".parse::<RemoteConstraint>().is_err());
        assert!(RemoteDriver::new("localhost:8080", "m", RemoteConstraint::None, Duration::from_secs(1)).is_err());
    }
}
