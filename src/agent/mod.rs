//! The ReAct agent: each step one decision from a [`Driver`] → checked → executed → observation, until a
//! final answer, the step limit, or a budget runs out. Talks to a model only through the driver.
//!
//! ```no_run
//! use std::sync::Arc;
//! use reagent::agent::{Agent, ModelDriver};
//! use reagent::tools::{builtin_tools, BuiltinOptions};
//! use reagent::{catalog, LoadOptions, Model, Sampling, ToolChoice};
//!
//! # fn main() -> reagent::Result<()> {
//! let path = catalog::resolve(&catalog::Catalog::builtin(), "qwen2.5-coder-0.5b", true, &Default::default())?;
//! let model = Model::load(&path, &LoadOptions::default())?;
//! let mut agent = Agent::builder()
//!     .driver(ModelDriver::constrained(model, Sampling::Greedy, 0)?)
//!     .tools(builtin_tools(&BuiltinOptions::default())?)
//!     .tool_choice(ToolChoice::Auto)
//!     .max_steps(8)
//!     .build()?;
//! let transcript = agent.run("What is 37 * 43 + 12?")?;
//! println!("{:?}", transcript.final_answer);
//! # Ok(()) }
//! ```

pub mod decision;
pub mod driver;
pub mod events;
pub mod grounding;
pub mod native;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::tools::ToolCall;
pub use decision::{BranchBiases, Decision, DecisionError, DecisionFormat, DecisionOptions, ToolChoice};
pub use driver::{DecisionRequest, Driver, DriverOutput, ModelDriver, ScriptItem, ScriptedDriver};
pub use events::{AgentEvent, CallRecord, DecisionStats, EventSink, RunStats, Step, StopReason, Transcript};

use crate::decode::constraint::Grammar;
use crate::error::{Error, Result};
use crate::text::chat::{ChatMessage, Role};
use crate::tools::{CallOutcome, Executor, Interceptor, Tool, ToolSet};

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub tool_choice: ToolChoice,
    /// How decisions are written: reagent's ReAct object or the model's own call syntax.
    pub format: DecisionFormat,
    /// Thresholds of the call/answer and more-calls/stop choices (native format).
    pub branch_biases: BranchBiases,
    /// Decisions before the run stops without an answer.
    pub max_steps: usize,
    /// Extra attempts per step after an extraction or validation failure.
    pub max_retries: usize,
    pub decision: DecisionOptions,
    /// Token limit of one decision.
    pub max_decision_tokens: usize,
    /// The n-th identical consecutive call (same tool, same arguments) is not run: the model gets the
    /// earlier result again and, under `auto`, the next decision must be the final answer.
    pub repeat_limit: usize,
    /// Total generated tokens allowed in a run.
    pub token_budget: Option<usize>,
    /// Per-call timeout of tools.
    pub tool_timeout: Duration,
    /// Text added to the system prompt after the decision instructions.
    pub system_prompt: Option<String>,
    /// Under `auto`, make the first decision a tool call (small models otherwise answer from memory what
    /// a tool would get right); later decisions may answer.
    pub first_decision_calls: bool,
    /// Under `auto`, after a call that failed (a tool error, timeout or panic), make the next decision a
    /// call: small models otherwise answer with the error instead of fixing the call. Not twice in a row.
    pub call_after_error: bool,
    /// Under `auto`, a first decision whose first call's [`grounding`](grounding::grounding) (the share of
    /// its argument values found in the user's words) is below this becomes an answer: the model is asked
    /// again with calls ruled out. A small model calls the nearest tool even when none fits, with values
    /// it made up; this makes "no tool fits" a calibrated choice. `None`: calls are kept as decided.
    pub abstain_below: Option<f32>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            tool_choice: ToolChoice::Auto,
            format: DecisionFormat::React,
            branch_biases: BranchBiases::default(),
            max_steps: 8,
            max_retries: 2,
            decision: DecisionOptions::default(),
            max_decision_tokens: 512,
            repeat_limit: 2,
            token_budget: None,
            tool_timeout: Duration::from_secs(30),
            system_prompt: None,
            first_decision_calls: false,
            call_after_error: false,
            abstain_below: None,
        }
    }
}

/// Builds an [`Agent`].
#[derive(Default)]
pub struct AgentBuilder {
    driver: Option<Box<dyn Driver>>,
    tools: Vec<Arc<dyn Tool>>,
    config: AgentConfig,
    interceptors: Vec<Box<dyn Interceptor>>,
    sink: Option<Box<dyn EventSink>>,
}

impl AgentBuilder {
    /// The decision driver (a [`ModelDriver`] or a [`ScriptedDriver`]).
    pub fn driver(mut self, d: impl Driver + 'static) -> Self {
        self.driver = Some(Box::new(d));
        self
    }
    /// A driver already boxed (to move one driver, and its loaded model, from agent to agent).
    pub fn boxed_driver(mut self, d: Box<dyn Driver>) -> Self {
        self.driver = Some(d);
        self
    }
    /// A constrained driver over `model` with greedy decoding.
    pub fn model(self, model: crate::text::Model) -> Result<Self> {
        Ok(self.driver(ModelDriver::constrained(model, crate::decode::sampler::Sampling::Greedy, 0)?))
    }
    pub fn tool(mut self, t: impl Tool + 'static) -> Self {
        self.tools.push(Arc::new(t));
        self
    }
    pub fn tools(mut self, ts: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.tools.extend(ts);
        self
    }
    pub fn tool_choice(mut self, c: ToolChoice) -> Self {
        self.config.tool_choice = c;
        self
    }
    pub fn max_steps(mut self, n: usize) -> Self {
        self.config.max_steps = n;
        self
    }
    pub fn max_retries(mut self, n: usize) -> Self {
        self.config.max_retries = n;
        self
    }
    pub fn config(mut self, c: AgentConfig) -> Self {
        self.config = c;
        self
    }
    pub fn interceptor(mut self, i: impl Interceptor + 'static) -> Self {
        self.interceptors.push(Box::new(i));
        self
    }
    /// Where events go as they happen.
    pub fn events(mut self, sink: impl EventSink + 'static) -> Self {
        self.sink = Some(Box::new(sink));
        self
    }

    pub fn build(self) -> Result<Agent> {
        let driver = self.driver.ok_or_else(|| Error::InvalidArgument("an agent needs a driver or a model".into()))?;
        if self.config.max_steps == 0 {
            return Err(Error::InvalidArgument("max steps must be at least 1".into()));
        }
        let mut set = ToolSet::default();
        for t in self.tools {
            set.add(t)?;
        }
        if self.config.format == DecisionFormat::Native && !driver.supports_native() {
            return Err(Error::InvalidArgument(
                "the native decision format needs a chat template that renders tools and the model's call \
                 markers (Qwen 2.5's); use the react format"
                    .into(),
            ));
        }
        // Fails now, not mid-run, on an unknown tool choice or a bad tool set.
        let (grammar_specs, relaxed) = grammar_specs(driver.as_ref(), set.specs(), &self.config)?;
        let mut executor = Executor::new(set, self.config.tool_timeout);
        for i in self.interceptors {
            executor.intercept(i);
        }
        let mut agent = Agent { driver, executor, grammar_specs, config: self.config, sink: self.sink };
        for (tool, reason) in relaxed {
            agent.emit(AgentEvent::ArgsRelaxed { tool, reason });
        }
        Ok(agent)
    }
}

/// A tool whose argument schema the grammar does not follow exactly, and why.
type Relaxed = (String, String);

/// The tool specs the decision grammar is built from: the tools' own, except where the driver cannot
/// compile a tool's argument schema (llguidance refuses some regex features, for one). Such a tool's
/// schema is tried without `pattern` and `format`, then as any object; its arguments are still checked
/// against its own schema after decoding (a failure is a validation failure, retried). Returns the
/// specs and, for each relaxed tool, why.
fn grammar_specs(
    driver: &dyn Driver,
    mut specs: Vec<crate::tools::ToolSpec>,
    config: &AgentConfig,
) -> Result<(Vec<crate::tools::ToolSpec>, Vec<Relaxed>)> {
    let whole = StepGrammar::new(&specs, &config.tool_choice, config)?;
    let Err(first_error) = driver.check_grammar(&whole.grammar) else { return Ok((specs, Vec::new())) };
    let compiles = |params: &Value| {
        let args = decision::bounded_args(params, &config.decision);
        driver.check_grammar(&Grammar::JsonSchema(args))
    };
    let mut relaxed = Vec::new();
    for spec in &mut specs {
        let Err(e) = compiles(&spec.parameters) else { continue };
        let mut looser = spec.parameters.clone();
        strip_keywords(&mut looser, &["pattern", "format", "patternProperties"]);
        spec.parameters = match compiles(&looser) {
            Ok(()) => looser,
            Err(_) => serde_json::json!({"type": "object", "additionalProperties": true}),
        };
        relaxed.push((spec.name.clone(), crate::error::one_line(&e.to_string())));
    }
    if relaxed.is_empty() {
        return Err(first_error);
    }
    let whole = StepGrammar::new(&specs, &config.tool_choice, config)?;
    driver.check_grammar(&whole.grammar)?;
    Ok((specs, relaxed))
}

/// Removes `keys` from every schema object in `v`, keeping property names that happen to match.
fn strip_keywords(v: &mut Value, keys: &[&str]) {
    match v {
        Value::Object(o) => {
            for k in keys {
                o.remove(*k);
            }
            for (k, x) in o.iter_mut() {
                match (k.as_str(), x) {
                    ("properties" | "$defs" | "definitions", Value::Object(props)) => {
                        props.values_mut().for_each(|p| strip_keywords(p, keys))
                    }
                    (_, x) => strip_keywords(x, keys),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip_keywords(x, keys)),
        _ => {}
    }
}

/// A ReAct agent.
pub struct Agent {
    driver: Box<dyn Driver>,
    executor: Executor,
    /// The specs the decision grammar is built from (see [`grammar_specs`]).
    grammar_specs: Vec<crate::tools::ToolSpec>,
    config: AgentConfig,
    sink: Option<Box<dyn EventSink>>,
}

/// What one step's attempts produced.
enum Attempt {
    Decided { decision: Decision, text: String, stats: DecisionStats, retries: usize },
    Stop(StopReason),
}

impl Agent {
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The settings.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    fn emit(&mut self, e: AgentEvent) {
        if let Some(s) = &mut self.sink {
            s.on_event(&e);
        }
    }

    /// Gives the driver back (with its model and KV cache), for the next agent.
    pub fn into_driver(self) -> Box<dyn Driver> {
        self.driver
    }

    /// Runs `task` to a final answer or a stop reason. Errors are only for failures outside the run's
    /// control (the driver's model failing); everything else ends in the transcript's stop reason.
    pub fn run(&mut self, task: &str) -> Result<Transcript> {
        self.run_conversation(&[ChatMessage::user(task)])
    }

    /// [`run`](Self::run) for a conversation: its system messages are added to the agent's system prompt,
    /// the other turns follow it.
    pub fn run_conversation(&mut self, conversation: &[ChatMessage]) -> Result<Transcript> {
        if !conversation.iter().any(|m| m.role == Role::User) {
            return Err(Error::InvalidArgument("the conversation has no user message".into()));
        }
        let task = conversation.iter().rev().find(|m| m.role == Role::User).map(|m| m.content.as_str()).unwrap_or("");
        let t0 = Instant::now();
        let specs = self.executor.tools().specs();
        let native = self.config.format == DecisionFormat::Native;
        // ReAct: the decision format and the tools are described in the system prompt. Native: the chat
        // template renders the tools, and the system prompt holds only what the caller gave.
        let mut system = match native {
            false => decision::decision_instructions(&specs, &self.config.tool_choice, &self.config.decision),
            true => String::new(),
        };
        let extra = self.config.system_prompt.iter().map(String::as_str);
        for text in extra.chain(conversation.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str())) {
            if !system.is_empty() {
                system.push('\n');
            }
            system.push_str(text);
        }
        let tools_value = (native && !specs.is_empty()).then(|| native::tools_value(&specs));
        let gspecs = &self.grammar_specs;
        let schema = StepGrammar::new(gspecs, &self.config.tool_choice, &self.config)?;
        // After a repeated call is refused, an `auto` run must answer: the grammar then allows nothing else.
        let answer_only = StepGrammar::new(gspecs, &ToolChoice::None, &self.config)?;
        let must_call = self.config.first_decision_calls || self.config.call_after_error;
        let call_only = (must_call && self.config.tool_choice == ToolChoice::Auto && !specs.is_empty())
            .then(|| StepGrammar::new(gspecs, &ToolChoice::Required, &self.config))
            .transpose()?;
        let mut force_answer = false;
        // The previous step's call failed (and the step before was not already forced by a failure).
        let mut after_error = false;
        let observation_role = self.driver.observation_role();
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(ChatMessage::system(system));
        }
        messages.extend(conversation.iter().filter(|m| m.role != Role::System).cloned());
        let names = specs.iter().map(|s| s.name.clone()).collect();
        self.emit(AgentEvent::RunStarted { task: task.into(), tools: names, driver: self.driver.name().into() });
        let mut steps: Vec<Step> = Vec::new();
        let mut stats = RunStats::default();
        let mut recent: Vec<(ToolCall, CallOutcome)> = Vec::new();
        let stop = 'run: loop {
            if crate::limits::interrupted() {
                break StopReason::Interrupted;
            }
            if steps.len() >= self.config.max_steps {
                break StopReason::MaxSteps { steps: steps.len() };
            }
            let step_no = steps.len() + 1;
            let forced_call = (steps.is_empty() && self.config.first_decision_calls) || after_error;
            let step_schema = match (&call_only, forced_call, force_answer) {
                (_, _, true) => &answer_only,
                (Some(required), true, _) => required,
                _ => &schema,
            };
            let forced_after_error = after_error;
            after_error = false;
            let (mut decision, mut text, mut dstats, mut retries) =
                match self.attempt(step_no, &mut messages, step_schema, tools_value.as_ref(), &mut stats)? {
                    Attempt::Decided { decision, text, stats, retries } => (decision, text, stats, retries),
                    Attempt::Stop(s) => break s,
                };
            // The first free choice between calling and answering: a call made of values the user never
            // wrote means no listed tool fits.
            let free_first = steps.is_empty() && !forced_call && !force_answer && !specs.is_empty();
            let grounding = match (free_first && self.config.tool_choice == ToolChoice::Auto, decision.calls().first())
            {
                (true, Some(call)) => grounding::grounding(call, &messages),
                _ => None,
            };
            if let (Some(g), Some(threshold)) = (grounding, self.config.abstain_below) {
                if g < threshold {
                    self.emit(AgentEvent::CallsDropped {
                        step: step_no,
                        calls: decision.calls(),
                        grounding: g,
                        threshold,
                    });
                    self.driver.rollback();
                    match self.attempt(step_no, &mut messages, &answer_only, tools_value.as_ref(), &mut stats)? {
                        Attempt::Decided { decision: d, text: t, stats: mut s, retries: r } => {
                            // The step's figures cover both generations; its margins are the first's.
                            s.generated_tokens += dstats.generated_tokens;
                            s.forced_tokens += dstats.forced_tokens;
                            s.seconds += dstats.seconds;
                            s.branch_margins = std::mem::take(&mut dstats.branch_margins);
                            (decision, text, dstats, retries) = (d, t, s, retries + r)
                        }
                        Attempt::Stop(s) => break s,
                    }
                }
            }
            self.emit(AgentEvent::DecisionExtracted {
                step: step_no,
                decision: decision.clone(),
                stats: dstats.clone(),
            });
            messages.push(ChatMessage::assistant(text));
            let mut step = Step {
                decision: decision.clone(),
                calls: Vec::new(),
                observation: None,
                retries,
                stats: dstats,
                grounding,
            };
            if let Decision::FinalAnswer { answer, .. } = &decision {
                self.emit(AgentEvent::FinalAnswer { step: step_no, answer: answer.clone() });
                steps.push(step);
                break 'run StopReason::FinalAnswer;
            }
            let mut observations = Vec::new();
            for call in decision.calls() {
                let (call, outcome) = self.call(step_no, call, &mut recent);
                if matches!(outcome, CallOutcome::Repeated { .. }) {
                    force_answer = self.config.tool_choice == ToolChoice::Auto;
                }
                let failed = matches!(
                    outcome,
                    CallOutcome::Error { .. } | CallOutcome::Timeout { .. } | CallOutcome::Panic { .. }
                );
                after_error |= failed && self.config.call_after_error && !forced_after_error;
                observations.push(match native {
                    // The template wraps each tool turn as the model saw results in training.
                    true => outcome.observation(),
                    // Naming the call next to its result lets small models connect the two.
                    false => format!("{} {} returned: {}", call.tool, call.args, outcome.observation()),
                });
                step.calls.push(CallRecord { call, outcome });
            }
            if native {
                for o in &observations {
                    messages.push(ChatMessage::new(Role::Tool, o.clone()));
                }
                step.observation = Some(observations.join("\n"));
            } else {
                // After a failure the error speaks for itself (small models copy any advice into their answer).
                let failed = step.calls.iter().any(|c| !c.outcome.is_ok());
                let next = match (&self.config.tool_choice, failed) {
                    (ToolChoice::Auto, false) => "\nIf this answers the task, give the final answer now.",
                    _ => "",
                };
                let observation = format!("Observation: {}{next}", observations.join("\n"));
                messages.push(ChatMessage::new(observation_role, observation.clone()));
                step.observation = Some(observation);
            }
            steps.push(step);
        };
        if stop != StopReason::FinalAnswer {
            self.emit(AgentEvent::RunFailed { reason: stop.clone() });
        }
        stats.decisions = steps.len();
        stats.seconds = t0.elapsed().as_secs_f64();
        let final_answer = match steps.last().map(|s| &s.decision) {
            Some(Decision::FinalAnswer { answer, .. }) if stop == StopReason::FinalAnswer => Some(answer.clone()),
            _ => None,
        };
        Ok(Transcript { task: task.into(), steps, final_answer, stop_reason: stop, stats })
    }

    /// Gets one valid decision, retrying extraction and validation failures with the error fed back.
    fn attempt(
        &mut self,
        step: usize,
        messages: &mut [ChatMessage],
        schema: &StepGrammar,
        tools: Option<&Value>,
        stats: &mut RunStats,
    ) -> Result<Attempt> {
        let mut feedback: Option<String> = None;
        let mut last_error = String::new();
        for attempt in 0..=self.config.max_retries {
            self.emit(AgentEvent::StepStarted { step, attempt });
            // The failed output is not kept; the retry sees the conversation plus what was wrong.
            let mut request_messages = messages.to_vec();
            if let Some(f) = &feedback {
                request_messages.push(ChatMessage::user(f.clone()));
            }
            if let Some(stop) = self.fit_context(messages, &mut request_messages, tools)? {
                return Ok(Attempt::Stop(stop));
            }
            let req = DecisionRequest {
                messages: &request_messages,
                grammar: &schema.grammar,
                tools,
                format: self.config.format,
                biases: self.config.branch_biases,
                max_tokens: self.config.max_decision_tokens,
                attempt,
            };
            let out = match self.driver.decide(&req) {
                Ok(o) => o,
                Err(e) => return Ok(Attempt::Stop(StopReason::DriverError { message: e.to_string() })),
            };
            if crate::limits::interrupted() {
                return Ok(Attempt::Stop(StopReason::Interrupted));
            }
            stats.prompt_tokens += out.stats.prompt_tokens;
            stats.reused_tokens += out.stats.reused_tokens;
            stats.generated_tokens += out.stats.generated_tokens;
            if let Some(budget) = self.config.token_budget.filter(|&b| stats.generated_tokens > b) {
                return Ok(Attempt::Stop(StopReason::TokenBudget { used: stats.generated_tokens, budget }));
            }
            let error = match self.check(&out, schema) {
                Ok(decision) => {
                    let (decision, cut) = decision.until_repeated_call();
                    let text = match (self.config.format, cut) {
                        (DecisionFormat::React, false) => serde_json::to_string(&decision_value(&out.text))?,
                        (DecisionFormat::React, true) => {
                            let mut v = decision_value(&out.text);
                            v["calls"] = serde_json::to_value(decision.calls())?;
                            serde_json::to_string(&v)?
                        }
                        (DecisionFormat::Native, false) => out.text.trim().to_string(),
                        (DecisionFormat::Native, true) => native::render_calls(&decision.calls()),
                    };
                    return Ok(Attempt::Decided { decision, text, stats: out.stats, retries: attempt });
                }
                Err(Failure::Extraction(error)) => {
                    self.emit(AgentEvent::ExtractionFailed {
                        step,
                        attempt,
                        error: error.clone(),
                        output: out.text.clone(),
                        stats: out.stats.clone(),
                    });
                    error
                }
                Err(Failure::Validation(error, decision)) => {
                    self.emit(AgentEvent::ValidationFailed { step, attempt, error: error.clone(), decision });
                    error
                }
            };
            stats.retries += 1;
            self.driver.rollback();
            feedback = Some(match self.config.format {
                DecisionFormat::React => format!(
                    "Your last reply was not a valid decision: {error}. Reply with exactly one JSON decision object."
                ),
                DecisionFormat::Native => format!("Your last reply was not valid: {error}."),
            });
            last_error = error;
        }
        stats.retries -= 1; // the last failure was not followed by a retry
        Ok(Attempt::Stop(StopReason::RetriesExhausted { step, last_error }))
    }

    /// Extraction (a complete JSON object) and validation (the decision schema, known tools, the tools'
    /// argument schemas and validators).
    fn check(&self, out: &DriverOutput, schema: &StepGrammar) -> std::result::Result<Decision, Failure> {
        if schema.validator.is_none() {
            return self.check_native(out, schema);
        }
        if !out.complete {
            return Err(Failure::Extraction(format!(
                "the reply ended before the decision was complete ({} tokens)",
                out.stats.generated_tokens
            )));
        }
        let v = driver::extract_json(&out.text)
            .ok_or_else(|| Failure::Extraction("the reply contains no JSON object".into()))?;
        // Calls first: a wrong tool or argument gets a precise message rather than "matches no
        // alternative of the decision schema".
        let calls: Vec<&Value> = match v.get("calls").and_then(|c| c.as_array()) {
            Some(cs) => cs.iter().collect(),
            None if v.get("tool").is_some() => vec![&v],
            None => Vec::new(),
        };
        for c in calls {
            let Some(tool) = c.get("tool").and_then(|t| t.as_str()) else { continue };
            let call = ToolCall { tool: tool.to_string(), args: c.get("args").cloned().unwrap_or(Value::Null) };
            if let Err(e) = self.check_call(&call) {
                return Err(Failure::Validation(e, v));
            }
        }
        let validator = schema.validator.as_ref().expect("ReAct steps have a validator");
        let decision = validator.parse(v.clone()).map_err(|e| Failure::Validation(e.to_string(), v))?;
        Ok(decision)
    }

    /// [`check`](Self::check) for the native format. An answer cut off at the token limit is kept as it
    /// is (an answer has no structure to lose); a cut-off call is an extraction failure.
    fn check_native(&self, out: &DriverOutput, step: &StepGrammar) -> std::result::Result<Decision, Failure> {
        let decision = match native::parse_native(&out.text) {
            Ok(d) if out.complete || d.calls().is_empty() => d,
            Err(e) if out.complete => return Err(Failure::Extraction(e.to_string())),
            // Cut off by the token limit inside a later call (a runaway string or array): the calls that
            // were complete are kept.
            _ => native::parse_complete_calls(&out.text).ok_or_else(|| {
                Failure::Extraction(format!(
                    "the reply ended before the call was complete ({} tokens)",
                    out.stats.generated_tokens
                ))
            })?,
        };
        let as_value = || serde_json::to_value(&decision).unwrap_or(Value::Null);
        let calls = decision.calls();
        let max = self.config.decision.parallel_calls.unwrap_or(1).max(1);
        let shape_error = match (&step.choice, calls.is_empty()) {
            (ToolChoice::None, false) => Some("no tool may be called at this step: answer".to_string()),
            (ToolChoice::Required | ToolChoice::Specific(_), true) => Some("a tool must be called".to_string()),
            _ if calls.len() > max => Some(format!("{} calls in one reply; at most {max}", calls.len())),
            (ToolChoice::Specific(name), _) => {
                calls.iter().find(|c| &c.tool != name).map(|c| format!("`{}` called; only `{name}` may be", c.tool))
            }
            _ => None,
        };
        if let Some(e) = shape_error {
            return Err(Failure::Validation(e, as_value()));
        }
        for call in &calls {
            if let Err(e) = self.check_call(call) {
                return Err(Failure::Validation(e, as_value()));
            }
        }
        Ok(decision)
    }

    /// A call's validation error (unknown tool, arguments failing its schema or validator), naming the tool.
    fn check_call(&self, call: &ToolCall) -> std::result::Result<(), String> {
        self.executor.check(call).map_err(|outcome| {
            format!("{} (tool `{}`)", outcome.error_text().unwrap_or_else(|| outcome.observation()), call.tool)
        })
    }

    /// Executes one call, unless it repeats the previous ones too often. Returns the call as made
    /// (interceptors may change it) and its outcome.
    fn call(
        &mut self,
        step: usize,
        call: ToolCall,
        recent: &mut Vec<(ToolCall, CallOutcome)>,
    ) -> (ToolCall, CallOutcome) {
        if recent.last().is_some_and(|(c, _)| c != &call) {
            recent.clear();
        }
        if recent.len() + 1 >= self.config.repeat_limit.max(1) {
            if let Some((_, first)) = recent.first() {
                let output = match first {
                    CallOutcome::Repeated { output, .. } => output.clone(),
                    other => other.observation(),
                };
                let outcome = CallOutcome::Repeated { output, times: recent.len() };
                let reason = format!("repeats the previous call ({} time(s) already)", recent.len());
                recent.push((call.clone(), outcome.clone()));
                self.emit(AgentEvent::ToolCallBlocked { step, call: call.clone(), reason });
                return (call, outcome);
            }
        }
        self.emit(AgentEvent::ToolCallStarted { step, call: call.clone() });
        let t = Instant::now();
        // Repeats are judged on the calls the model made, before interceptors rewrite them.
        let asked = call.clone();
        let (call, outcome) = self.executor.execute(call);
        match &outcome {
            CallOutcome::Blocked { reason } => {
                self.emit(AgentEvent::ToolCallBlocked { step, call: call.clone(), reason: reason.clone() })
            }
            _ => self.emit(AgentEvent::ToolCallCompleted {
                step,
                call: call.clone(),
                outcome: outcome.clone(),
                seconds: t.elapsed().as_secs_f64(),
            }),
        }
        recent.push((asked, outcome.clone()));
        (call, outcome)
    }

    /// Makes the request fit the context with room for a decision: shortens the oldest observations
    /// first (in the kept conversation too); `Some(stop)` when even that is not enough.
    fn fit_context(
        &mut self,
        kept: &mut [ChatMessage],
        request: &mut [ChatMessage],
        tools: Option<&Value>,
    ) -> Result<Option<StopReason>> {
        const SHORT: usize = 200;
        loop {
            let Some((needed, capacity)) = self.driver.measure(request, tools)? else { return Ok(None) };
            let needed = needed + self.config.max_decision_tokens;
            if needed <= capacity {
                return Ok(None);
            }
            // The oldest observation that is still long.
            let victim = (1..kept.len()).find(|&i| {
                let m = &kept[i];
                (m.role == Role::Tool || (m.role == Role::User && i >= 2 && m.content.starts_with("Observation")))
                    && m.content.len() > SHORT + 40
            });
            let Some(i) = victim else {
                return Ok(Some(StopReason::ContextOverflow { needed, capacity }));
            };
            let mut cut = SHORT;
            while !kept[i].content.is_char_boundary(cut) {
                cut -= 1;
            }
            let short = format!("{} [... shortened to fit the context]", &kept[i].content[..cut]);
            kept[i].content = short.clone();
            request[i].content = short;
        }
    }
}

/// The grammar of one step's decisions, with the compiled validator of a ReAct schema.
struct StepGrammar {
    grammar: Grammar,
    choice: ToolChoice,
    validator: Option<decision::DecisionValidator>,
}

impl StepGrammar {
    fn new(specs: &[crate::tools::ToolSpec], choice: &ToolChoice, config: &AgentConfig) -> Result<Self> {
        let opts = &config.decision;
        // The ReAct schema also checks the tool set (duplicates, an unknown tool choice) for both formats.
        let schema = decision::decision_schema(specs, choice, opts)?;
        Ok(match config.format {
            DecisionFormat::React => Self {
                validator: Some(decision::DecisionValidator::new(&schema)?),
                grammar: Grammar::JsonSchema(schema),
                choice: choice.clone(),
            },
            DecisionFormat::Native => Self {
                grammar: Grammar::Lark(native::native_grammar(specs, choice, opts)?),
                choice: choice.clone(),
                validator: None,
            },
        })
    }
}

enum Failure {
    Extraction(String),
    Validation(String, Value),
}

/// The decision JSON as the conversation keeps it (compact; free-form prose around it is dropped).
fn decision_value(text: &str) -> Value {
    driver::extract_json(text).unwrap_or(Value::Null)
}
