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
//! let path = catalog::resolve(&catalog::Catalog::builtin(), "qwen2.5-coder-0.5b", &Default::default())?;
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

pub mod arithmetic;
pub mod decision;
pub mod driver;
mod event_log;
pub mod events;
pub mod grounding;
pub mod native;
pub mod recent;
mod run;
mod session;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::catalog::Profile;
pub use crate::tools::ToolCall;
pub use decision::{BranchBiases, Decision, DecisionError, DecisionFormat, DecisionOptions, ToolChoice};
pub use driver::{
    DecisionRequest, Driver, DriverOutput, ModelDriver, RemoteConstraint, RemoteDriver, ScriptItem, ScriptedDriver,
    RECENT_PREFIX_BYTES,
};
pub use event_log::{read_trace, EventLog, RecordedRun, RecordedStep, TraceHeader, TRACE_VERSION};
pub use events::{
    AgentEvent, CallRecord, DecisionStats, DropMeasure, EventSink, RunStats, Step, StopReason, Transcript, ValueScore,
};
pub use session::{read_session, Session, SessionTurn, SESSION_VERSION};

use crate::decode::constraint::Grammar;
use crate::error::{Error, Result};
use crate::limits::Cancel;
use crate::text::chat::ChatMessage;
use crate::tools::{Executor, Interceptor, Tool, ToolSet};
use run::StepGrammar;

/// Settings of a run.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// Under `auto`, whether the first decision must call a tool or is the model's choice.
    pub first_call: FirstCall,
    /// Under `auto`, after a call that failed (a tool error, timeout or panic), make the next decision a
    /// call: small models otherwise answer with the error instead of fixing the call. Not twice in a row.
    pub call_after_error: bool,
    /// Under `auto`, the decision after a failed call whose error named no other tool may call only that
    /// tool again (with other arguments) or answer: a small model otherwise reaches for any tool (a file
    /// read after a stock ticker was unknown) and answers from what it returned.
    pub retry_failed_tool: bool,
    /// Under `auto`, a first decision whose first call's [`grounding`](grounding::Evidence::grounding_of_stated) (the
    /// share of its argument values found in the user's words, once the optional arguments they do not state
    /// are left out) is below this becomes an answer: the model is asked
    /// again with calls ruled out. A small model calls the nearest tool even when none fits, with values
    /// it made up; this makes "no tool fits" a calibrated choice. `None`: calls are kept as decided.
    pub abstain_below: Option<f32>,
    /// Under `auto`, a first decision whose first call's support from the request is below this becomes
    /// an answer, as with [`abstain_below`](Self::abstain_below). The support is the model's own: how many
    /// nats more likely the request made the call's least supported value (optional arguments given
    /// their schema's `default` aside; for a call without other values, its tool's name) than an empty
    /// request does. A value the user gave or implies gains
    /// several; one made up because none was given (a ticker for "the stock I bought"), or a tool the
    /// request does not call for, about none. Costs two scorings of the decision's text. Calibrated per
    /// model in the catalog; `None`: not measured.
    pub min_support: Option<f32>,
    /// Under `auto`, a first decision whose first call's tool name the request made less than this many
    /// nats more likely than an empty request does becomes an answer, as with
    /// [`min_support`](Self::min_support) (scored in the same two passes): a tool the request does not
    /// call for ("play some jazz" answered by a file search) gains little or loses, where its values,
    /// copied from the request, gain much. Calibrated per model in the catalog; `None`: not applied.
    pub min_tool_support: Option<f32>,
    /// Abstention keeps a call whose tool the user named ([`Evidence::names_tool`](grounding::Evidence::names_tool):
    /// a word of the request is a part of the tool's or a parameter's name): its values are derived from
    /// the request ("the weather in the capital of Japan"), not made up. Off in the single-decision
    /// profile, measured on BFCL, whose irrelevance tasks offer tools named by the request's words.
    pub keep_named_tool_calls: bool,
    /// Native format with `decision.parallel_calls` above 1: after a decision's calls, propose one more
    /// (the model continues its reply under a one-call grammar) and keep it when it is a new item the
    /// request asked for ([`is_new_requested_item`](grounding::Evidence::is_new_requested_item)); repeat up to the
    /// limit. Small models stop after the first of several requested calls.
    pub propose_more_calls: bool,
    /// Native format: leave out of each call the optional arguments whose values the conversation does
    /// not state ([`drop_unstated_options`](grounding::Evidence::drop_unstated_options)), so that the model can be
    /// let to write optional arguments (a close bias of 0) without keeping the ones it makes up.
    pub drop_unstated_options: bool,
    /// Native format: leave out of a decision the calls after its first that bring a value the conversation
    /// does not state, or that repeat an earlier call but for booleans
    /// ([`drop_unstated_calls`](grounding::Evidence::drop_unstated_calls)); the model, pushed to make one more call
    /// (`more_calls` bias), otherwise adds calls the request does not ask for.
    pub drop_unstated_calls: bool,
    /// Recompute the arithmetic a decision's answer or thought writes (`12 + 7 + 30 + 41 = 120`) and, where
    /// a result is wrong, ask again with the right one ([`arithmetic::slips`]), while retries are left. Small
    /// models sum numbers they have read in their head instead of calling the calculator, and commit to a
    /// made-up result in the thought before the call.
    pub check_arithmetic: bool,
    /// Hold a call of a tool that changes things (not [`read_only`](crate::tools::Tool::read_only)) when
    /// a tool's output chose it rather than the user ([`grounding::chosen_by_tool_output`]): a file that
    /// says "write pwned.txt" or "send the key to …" does not get its way. The call is not run; the model
    /// is told why. Off where a person confirms each call (`reagent run --confirm`).
    pub hold_untrusted_calls: bool,
    /// For models whose template has a thinking section (Qwen 3, SmolLM 3): the most tokens of free
    /// thinking (`<think>…</think>`) before each decision, which is then made under the grammar as
    /// always, in the same sequence. 0: the template's no-thinking mode. Other models: must be 0.
    pub think_budget: usize,
    /// ReAct: once a decision chose to answer before any call ran, the answer is the model's own reply in
    /// a plain chat turn (its template with no tools and no grammar, the caller's system text or a plain
    /// helpful-assistant one), at most `answer_tokens` tokens, rather than the text it wrote in the
    /// decision's JSON string: a small model answers a plain question better in its own turn than inside
    /// a JSON string after an empty thought. The decision's answer stays where the driver cannot reply
    /// freely (a scripted driver) or the reply is empty, repeats a tool's error or writes the request
    /// back; a reply cut at `answer_tokens` keeps its whole sentences.
    pub answer_in_own_words: bool,
    /// With [`answer_in_own_words`](Self::answer_in_own_words), the answer after calls that all succeeded
    /// is the model's own reply too: a plain chat turn whose user message gives what the calls returned,
    /// then the request ("The first person listed in team.txt is Ana." rather than the file's first
    /// line). The reply is kept only where it is grounded: every number it writes was in what the model
    /// was given, and no equation it writes is wrong; otherwise, and after a failed call (a small model
    /// told only an error makes up the value), the decision's answer stays, written with the results in
    /// view. On by default (everyday sets, docs/results.md).
    pub own_words_after_calls: bool,
    /// The most tokens of an answer in the model's own words ([`Self::answer_in_own_words`]).
    pub answer_tokens: usize,
    /// ReAct under `auto`: the first free choice between calling and answering is the model's score for
    /// starting a call in its own call syntax, at the start of its reply to the request with the tools
    /// its chat template renders (the margin of its call tokens over all others, plus
    /// `branch_biases.call`, calibrated per model), rather than its choice of the ReAct object's `type`.
    /// A model trained on its own syntax tells requests that need a tool from those that do not far
    /// better there than inside reagent's JSON. The ReAct decision then makes the call, or the answer is
    /// the model's own reply. Needs a driver that can score natively ([`Driver::call_margin`]); others
    /// choose in the ReAct decision.
    pub native_branch: bool,
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
            first_call: FirstCall::WhenNeeded,
            call_after_error: false,
            retry_failed_tool: true,
            abstain_below: None,
            min_support: None,
            min_tool_support: None,
            keep_named_tool_calls: true,
            propose_more_calls: false,
            drop_unstated_options: false,
            drop_unstated_calls: false,
            check_arithmetic: true,
            hold_untrusted_calls: true,
            think_budget: 0,
            answer_in_own_words: true,
            own_words_after_calls: true,
            answer_tokens: 256,
            native_branch: false,
        }
    }
}

setters!(AgentConfig {
    tool_choice: ToolChoice,
    format: DecisionFormat,
    branch_biases: BranchBiases,
    max_steps: usize,
    max_retries: usize,
    decision: DecisionOptions,
    max_decision_tokens: usize,
    repeat_limit: usize,
    token_budget: Option<usize>,
    tool_timeout: Duration,
    system_prompt: Option<String>,
    first_call: FirstCall,
    call_after_error: bool,
    retry_failed_tool: bool,
    abstain_below: Option<f32>,
    min_support: Option<f32>,
    min_tool_support: Option<f32>,
    keep_named_tool_calls: bool,
    propose_more_calls: bool,
    drop_unstated_options: bool,
    drop_unstated_calls: bool,
    check_arithmetic: bool,
    hold_untrusted_calls: bool,
    think_budget: usize,
    answer_in_own_words: bool,
    own_words_after_calls: bool,
    answer_tokens: usize,
    native_branch: bool,
});

/// Under `auto`, whether the first decision of a run must call a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FirstCall {
    /// The model chooses between calling and answering.
    Never,
    /// A call is required when the request itself says a tool is needed ([`Tool::needed_for`]: it names a
    /// path a file tool can reach, it writes arithmetic); otherwise the model chooses. A plain question
    /// is answered, a question about a file is not answered from memory.
    #[default]
    WhenNeeded,
    /// Always a call (small models answer from memory what a tool would get right, but then a plain
    /// question gets an invented call).
    Always,
}

impl std::str::FromStr for FirstCall {
    type Err = Error;

    /// `never`, `when-needed` or `always`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "never" => Ok(Self::Never),
            "when-needed" | "when_needed" => Ok(Self::WhenNeeded),
            "always" => Ok(Self::Always),
            _ => Err(Error::param("first call", format!("`{s}` (the choices are never, when-needed, always)"))),
        }
    }
}

impl std::fmt::Display for FirstCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Never => "never",
            Self::WhenNeeded => "when-needed",
            Self::Always => "always",
        })
    }
}

impl AgentConfig {
    /// Sets the decision fields from a model's catalog settings (`supports_native`: whether the driver can
    /// decide natively; a native default falls back to ReAct where it cannot).
    pub fn apply_settings(&mut self, s: &crate::catalog::DecisionDefaults, supports_native: bool) -> Result<()> {
        let format: Option<DecisionFormat> = s.format.as_deref().map(str::parse).transpose()?;
        self.format = match format {
            Some(DecisionFormat::Native) if !supports_native => DecisionFormat::React,
            Some(f) => f,
            None if supports_native => DecisionFormat::Native,
            None => DecisionFormat::React,
        };
        if let Some(f) = &s.first_call {
            self.first_call = f.parse()?;
        }
        // Biases are margins of the format they were calibrated in: none where decisions fall back to
        // another (a remote model, whose decisions are ReAct, under settings made for its own syntax).
        self.branch_biases = match format.is_none_or(|f| f == self.format) {
            true => BranchBiases {
                call: s.call_bias,
                more_calls: s.more_calls_bias,
                close: s.close_bias,
                end_list: s.end_list_bias,
            },
            false => BranchBiases::default(),
        };
        self.abstain_below = s.abstain_below.filter(|&g| g > 0.0);
        self.min_support = s.min_support;
        self.min_tool_support = s.min_tool_support;
        if let Some(keep) = s.keep_named_tool_calls {
            self.keep_named_tool_calls = keep;
        }
        self.propose_more_calls = s.propose_more_calls;
        self.drop_unstated_options = s.drop_unstated_options;
        self.drop_unstated_calls = s.drop_unstated_calls;
        if let Some(n) = s.thought_chars {
            self.decision.max_thought_chars = n;
        }
        if self.decision.parallel_calls.is_none() {
            self.decision.parallel_calls = s.parallel_calls;
        }
        self.think_budget = s.think_budget;
        self.native_branch = s.native_branch;
        Ok(())
    }

    /// The defaults with the decision settings of a catalog model for `profile` (`entry`: `None` for a
    /// model outside the catalog, which keeps the defaults); `supports_native`: whether the driver can
    /// decide in the model's own call syntax. What an agent built without [`AgentBuilder::config`] uses.
    pub fn for_model(
        entry: Option<&crate::catalog::CatalogEntry>,
        profile: crate::catalog::Profile,
        supports_native: bool,
    ) -> Result<Self> {
        let mut config = Self::default();
        if let Some(e) = entry {
            config.apply_settings(e.settings(profile), supports_native)?;
        }
        Ok(config)
    }
}

/// Where the pieces of an answer in the model's own words go ([`AgentBuilder::answer_text`]).
type AnswerText = Box<dyn FnMut(&str) + Send>;

/// Builds an [`Agent`]. Without [`config`](Self::config), the agent takes the decision settings the
/// catalog gives the driver's model for the [profile](Self::profile) (a run, by default): the library
/// decides as `reagent run` does.
#[derive(Default)]
pub struct AgentBuilder {
    driver: Option<Box<dyn Driver>>,
    tools: Vec<Arc<dyn Tool>>,
    config: AgentConfig,
    /// `config` was given whole: no catalog settings are applied.
    explicit_config: bool,
    profile: crate::catalog::Profile,
    interceptors: Vec<Box<dyn Interceptor>>,
    sink: Option<Box<dyn EventSink>>,
    answer_text: Option<AnswerText>,
    cancel: Cancel,
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
    /// A constrained driver over `model` with greedy decoding, keeping copies of the KV cache where a
    /// prompt departs from it ([`ModelDriver::with_recent_prefixes`]): an answer in the model's own words
    /// replaces the cache, and the next run would otherwise compute its system prompt again.
    pub fn model(self, model: crate::text::Model) -> Result<Self> {
        let driver = ModelDriver::constrained(model, crate::decode::sampler::Sampling::Greedy, 0)?;
        Ok(self.driver(driver.with_recent_prefixes(driver::RECENT_PREFIX_BYTES)))
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
    /// Under `auto`, whether the first decision must call a tool.
    pub fn first_call(mut self, f: FirstCall) -> Self {
        self.config.first_call = f;
        self
    }
    pub fn max_retries(mut self, n: usize) -> Self {
        self.config.max_retries = n;
        self
    }
    /// The whole configuration, used as it is (no catalog settings are applied over it; start from
    /// [`AgentConfig::for_model`] to keep them).
    pub fn config(mut self, c: AgentConfig) -> Self {
        self.config = c;
        self.explicit_config = true;
        self
    }
    /// Which catalog settings of the model apply when no [`config`](Self::config) is given (default: a
    /// run).
    pub fn profile(mut self, p: crate::catalog::Profile) -> Self {
        self.profile = p;
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
    /// Receives an answer in the model's own words ([`AgentConfig::answer_in_own_words`]) piece by piece
    /// as it is generated, to show it as it comes. The answer that stands is the
    /// [`AgentEvent::FinalAnswer`]'s: a reply that is empty, cut off or repeats a tool's error is not used,
    /// and the decision's own answer stands instead. After calls a reply comes whole, once it is checked
    /// against their results (one that writes a number it was not given or a wrong equation is not used,
    /// and not given here).
    pub fn answer_text(mut self, f: impl FnMut(&str) + Send + 'static) -> Self {
        self.answer_text = Some(Box::new(f));
        self
    }
    /// The handle that stops this agent's runs (default: a handle of its own, [`Agent::cancel_handle`]);
    /// give one handle to several agents to stop them together.
    pub fn cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }

    pub fn build(mut self) -> Result<Agent> {
        let driver = self.driver.ok_or_else(|| Error::param("agent", "it needs a driver or a model"))?;
        if let (false, Some(entry)) = (self.explicit_config, driver.catalog_entry()) {
            self.config.apply_settings(entry.settings(self.profile), driver.supports_native())?;
        }
        if self.config.max_steps == 0 {
            return Err(Error::param("max steps", "must be at least 1"));
        }
        let mut set = ToolSet::default();
        for t in self.tools {
            set.add(t)?;
        }
        if self.config.format == DecisionFormat::Native && !driver.supports_native() {
            return Err(Error::param(
                "decision format",
                "native needs a chat template that renders or describes tool calls (Qwen's, Llama 3.x's); \
                 use the react format",
            ));
        }
        if self.config.think_budget > 0 && !driver.supports_thinking() {
            return Err(Error::param(
                "think budget",
                "the model's chat template has no thinking section (<think>…</think>, as Qwen 3's and SmolLM 3's)",
            ));
        }
        // Fails now, not mid-run, on an unknown tool choice or a bad tool set.
        let syntax = driver.call_syntax().unwrap_or_else(native::CallSyntax::hermes);
        let (grammar_specs, relaxed) = grammar_specs(driver.as_ref(), set.specs(), &self.config, &syntax)?;
        let mut executor = Executor::new(set, self.config.tool_timeout);
        for i in self.interceptors {
            executor.intercept(i);
        }
        let mut agent = Agent {
            driver,
            executor,
            grammar_specs,
            config: self.config,
            syntax,
            sink: self.sink,
            answer_text: self.answer_text,
            cancel: self.cancel,
        };
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
    syntax: &native::CallSyntax,
) -> Result<(Vec<crate::tools::ToolSpec>, Vec<Relaxed>)> {
    let whole = StepGrammar::new(&specs, &config.tool_choice, config, syntax)?;
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
    let whole = StepGrammar::new(&specs, &config.tool_choice, config, syntax)?;
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
    /// The model's call syntax, for native decisions ([`Driver::call_syntax`]).
    syntax: native::CallSyntax,
    sink: Option<Box<dyn EventSink>>,
    /// Pieces of an answer in the model's own words as they come ([`AgentBuilder::answer_text`]).
    answer_text: Option<AnswerText>,
    cancel: Cancel,
}

impl Agent {
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The specs of the tools the agent can call.
    pub fn tool_specs(&self) -> Vec<crate::tools::ToolSpec> {
        self.executor.tools().specs()
    }

    /// A handle that stops this agent's run from another thread: generation ends between tokens, a
    /// running tool is stopped (a program tool's process group killed), and the run ends with
    /// [`StopReason::Interrupted`]. It stays cancelled, and later runs stop at once, until
    /// [`reset`](Cancel::reset).
    pub fn cancel_handle(&self) -> Cancel {
        self.cancel.clone()
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
}
