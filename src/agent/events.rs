//! Typed events of an agent run, delivered to an [`EventSink`] as they happen, and the [`Transcript`]
//! a run returns.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::decision::Decision;
use crate::tools::{CallOutcome, ToolCall};

/// Token counts and time of one decision's generation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DecisionStats {
    /// Prompt tokens of this decision.
    pub prompt_tokens: usize,
    /// Of those, how many were already in the KV cache (reused from the previous step, or loaded).
    pub reused_tokens: usize,
    /// Prompt tokens this decision loaded from the prompt cache on disk
    /// ([`ModelDriver::with_prompt_cache`](super::ModelDriver::with_prompt_cache)), a re-decision's first
    /// generation included.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub loaded_tokens: usize,
    pub generated_tokens: usize,
    /// Of those, the tokens of thinking before the decision ([`AgentConfig::think_budget`](super::AgentConfig)).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thinking_tokens: usize,
    /// Tokens the grammar forced.
    pub forced_tokens: usize,
    /// Tokens drafted from the context and run ahead of the sampler (speculative decoding), and how many
    /// of them it picked: each accepted one is a forward pass saved.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drafted_tokens: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_tokens: usize,
    pub seconds: f64,
    /// Logit margins where branch biases applied (native format: call vs answer, then one more call vs
    /// stop after each call), for tuning the biases offline.
    #[serde(default, skip_serializing_if = "Vec::is_empty", skip_deserializing)]
    pub branch_margins: Vec<crate::decode::constraint::BranchMargin>,
}

/// What dropped a first decision's calls ([`AgentEvent::CallsDropped`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropMeasure {
    /// The share of the call's values that are words of the request.
    #[default]
    Grounding,
    /// The call's support from the request, in nats.
    Support,
    /// The support from the request of the call's tool's name, in nats.
    ToolSupport,
}

impl DecisionStats {
    /// Adds the tokens and time of another generation made for the same decision (a re-decision, a
    /// proposed call); the prompt and margins stay this decision's.
    pub(crate) fn add_generation(&mut self, other: &DecisionStats) {
        self.generated_tokens += other.generated_tokens;
        self.thinking_tokens += other.thinking_tokens;
        self.forced_tokens += other.forced_tokens;
        self.loaded_tokens += other.loaded_tokens;
        self.drafted_tokens += other.drafted_tokens;
        self.accepted_tokens += other.accepted_tokens;
        self.seconds += other.seconds;
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Something that happened during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// A tool's argument schema could not be compiled into the decision grammar (llguidance refused it):
    /// its arguments are decoded under a looser schema and checked against the tool's own after
    /// decoding. Sent once, when the agent is built.
    ArgsRelaxed {
        tool: String,
        reason: String,
    },
    RunStarted {
        task: String,
        tools: Vec<String>,
        driver: String,
    },
    StepStarted {
        step: usize,
        attempt: usize,
    },
    DecisionExtracted {
        step: usize,
        decision: Decision,
        stats: DecisionStats,
        /// The decision as the model wrote it (the assistant turn the conversation keeps).
        text: String,
        /// What the model thought before deciding ([`AgentConfig::think_budget`](super::AgentConfig));
        /// never part of the decision or its arguments.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thinking: Option<String>,
    },
    /// The generation ended without a complete decision (token limit, unparsable output).
    ExtractionFailed {
        step: usize,
        attempt: usize,
        error: String,
        output: String,
        stats: DecisionStats,
    },
    /// A complete decision was rejected (unknown tool, arguments failing the schema or a validator).
    ValidationFailed {
        step: usize,
        attempt: usize,
        error: String,
        decision: Value,
    },
    ToolCallStarted {
        step: usize,
        call: ToolCall,
    },
    ToolCallCompleted {
        step: usize,
        call: ToolCall,
        outcome: CallOutcome,
        seconds: f64,
    },
    /// A call failed transiently (nothing ran, or a read-only tool timed out) and is made again after
    /// `wait_seconds` ([`Tool::retry`](crate::tools::Tool::retry)); `attempt` counts the retries.
    ToolCallRetried {
        step: usize,
        call: ToolCall,
        attempt: u32,
        error: String,
        wait_seconds: f64,
    },
    ToolCallBlocked {
        step: usize,
        call: ToolCall,
        reason: String,
    },
    /// The first decision's calls were dropped for an answer: `grounding`, the `measure` of the first
    /// call, was below `threshold` (their values were not the user's words,
    /// [`AgentConfig::abstain_below`](super::AgentConfig::abstain_below); or the request hardly made the
    /// call more likely, [`AgentConfig::min_support`](super::AgentConfig::min_support)).
    CallsDropped {
        step: usize,
        calls: Vec<ToolCall>,
        grounding: f32,
        threshold: f32,
        #[serde(default)]
        measure: DropMeasure,
    },
    /// One more call was proposed after a decision's calls
    /// ([`AgentConfig::propose_more_calls`](super::AgentConfig::propose_more_calls)); `kept` when it passed
    /// the test of a new requested item.
    CallProposed {
        step: usize,
        call: ToolCall,
        kept: bool,
    },
    /// The request itself says a tool is needed ([`crate::tools::Tool::needed_for`]): under
    /// [`FirstCall::WhenNeeded`](super::FirstCall::WhenNeeded) the first decision must call one.
    CallRequired {
        step: usize,
        tool: String,
        reason: String,
    },
    /// A step's calls ran (or were refused) and their results are known: the record a resumed run
    /// replays ([`Agent::resume`](super::Agent::resume)). Each output is written once in a run's events:
    /// as JSON, the record leaves out the outputs of the calls whose
    /// [`ToolCallCompleted`](Self::ToolCallCompleted) carried them and of refused repeats (the earlier call's), read back as
    /// empty ones that [`read_trace`](super::read_trace) fills from the events, and the observation text,
    /// which is made from the outcomes (`observed` says whether there was one; read back as empty).
    StepCompleted {
        step: usize,
        #[serde(with = "compact_record")]
        record: Step,
    },
    /// A run resumed from a trace: its first `steps` steps were replayed from the record, not made again.
    RunResumed {
        steps: usize,
    },
    FinalAnswer {
        step: usize,
        answer: String,
    },
    RunFailed {
        reason: StopReason,
    },
}

/// Receives events.
pub trait EventSink: Send {
    fn on_event(&mut self, event: &AgentEvent);
}

impl<F: FnMut(&AgentEvent) + Send> EventSink for F {
    fn on_event(&mut self, event: &AgentEvent) {
        self(event)
    }
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model gave a final answer.
    FinalAnswer,
    /// `max_steps` decisions were made without an answer.
    MaxSteps { steps: usize },
    /// A step failed `max_retries + 1` times.
    RetriesExhausted { step: usize, last_error: String },
    /// The conversation no longer fits in the context window, even with observations shortened.
    ContextOverflow { needed: usize, capacity: usize },
    /// The token budget of the run is spent.
    TokenBudget { used: usize, budget: usize },
    /// The model or driver failed (an I/O or inference error, a scripted driver that ran out).
    DriverError { message: String },
    /// The server of a remote model could not be reached or kept failing
    /// ([`crate::Error::EndpointDown`]): the run may be tried again there or on another server.
    EndpointDown { endpoint: String, problem: String },
    /// Every answer the model gave repeated the error of a failed call: what failed, said plainly.
    ToolFailed { tool: String, error: String },
    /// The run was cancelled: its [`Cancel`](crate::limits::Cancel) handle, or the process-wide interrupt
    /// ([`crate::limits::request_interrupt`]: the CLI's Ctrl-C).
    Interrupted,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::FinalAnswer => write!(f, "final answer"),
            StopReason::MaxSteps { steps } => write!(f, "no answer after {steps} steps (--max-steps)"),
            StopReason::RetriesExhausted { step, last_error } => {
                write!(f, "step {step} failed after all retries: {last_error}")
            }
            StopReason::ContextOverflow { needed, capacity } => {
                write!(f, "the conversation needs {needed} tokens but the context holds {capacity}")
            }
            StopReason::TokenBudget { used, budget } => write!(f, "token budget spent ({used} of {budget})"),
            StopReason::DriverError { message } => write!(f, "{message}"),
            StopReason::EndpointDown { endpoint, problem } => write!(f, "{endpoint}: {problem}"),
            StopReason::ToolFailed { tool, error } => write!(f, "`{tool}` failed: {error}"),
            StopReason::Interrupted => write!(f, "interrupted"),
        }
    }
}

/// One executed tool call of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CallRecord {
    pub call: ToolCall,
    pub outcome: CallOutcome,
}

/// One step: the decision, what its calls returned, and how it was produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Step {
    pub decision: Decision,
    /// What the model thought before deciding, if it thought.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub calls: Vec<CallRecord>,
    /// The observation text the model saw next.
    pub observation: Option<String>,
    /// Failed attempts before this decision.
    pub retries: usize,
    pub stats: DecisionStats,
    /// The first decision under `auto`: the [grounding](super::grounding::Evidence::grounding) of the first call the
    /// model made, whether or not it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grounding: Option<f32>,
    /// The first decision under `auto`: its first call's [support](super::AgentConfig::min_support) from
    /// the request, where it was measured, whether or not the call was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub support: Option<f32>,
    /// What [`support`](Self::support) was measured from: each value of the call with its tokens'
    /// log-probabilities, so that other measures can be tried offline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub support_values: Vec<ValueScore>,
    /// The first decision under `auto`: the score of its first call's tool name, as its values' are
    /// scored ([`AgentConfig::min_tool_support`](super::AgentConfig::min_tool_support)), kept or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_support: Option<ValueScore>,
    /// The decision is a call made instead of an answer whose arithmetic was wrong (sent back by
    /// [`AgentConfig::check_arithmetic`](super::AgentConfig::check_arithmetic)): once it succeeds, the next
    /// decision answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub corrects_arithmetic: bool,
}

/// A call's value scored for its support ([`Step::support_values`]): its JSON text (the tool's name for
/// a call without values) and the sums of its tokens' log-probabilities after the conversation with the
/// request and with the request emptied. Its support is `with - without`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ValueScore {
    pub value: String,
    pub with: f32,
    pub without: f32,
}

/// Totals over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RunStats {
    pub decisions: usize,
    pub retries: usize,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
}

impl RunStats {
    /// Counts one generation's prompt, reused and generated tokens.
    pub(crate) fn count(&mut self, s: &DecisionStats) {
        self.prompt_tokens += s.prompt_tokens;
        self.reused_tokens += s.reused_tokens;
        self.generated_tokens += s.generated_tokens;
    }
}

/// What a run returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Transcript {
    pub task: String,
    pub steps: Vec<Step>,
    pub final_answer: Option<String>,
    pub stop_reason: StopReason,
    pub stats: RunStats,
}

/// A step record as [`AgentEvent::StepCompleted`] writes it: without the outputs its calls'
/// `tool_call_completed` events carry, and without the observation text.
/// The digest a compact step record keeps of each output it leaves out: 16 hex digits of its SHA-256.
pub(crate) fn output_digest(output: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(output.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

mod compact_record {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use super::{output_digest, Step};

    pub(super) fn serialize<S: Serializer>(step: &Step, s: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::to_value(step).map_err(serde::ser::Error::custom)?;
        for call in v.get_mut("calls").and_then(Value::as_array_mut).into_iter().flatten() {
            let outcome = call.get_mut("outcome").and_then(Value::as_object_mut);
            if let Some(o) = outcome.filter(|o| output_left_out(o)) {
                // What it was, so that an output edited in its event line is found when read back.
                if let Some(Value::String(out)) = o.remove("output") {
                    o.insert("output_digest".into(), Value::String(output_digest(&out)));
                }
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("observation");
            o.insert("observed".into(), Value::Bool(step.observation.is_some()));
        }
        v.serialize(s)
    }

    /// The outcomes whose output the record leaves out: a completed call's (its event carries it) and a
    /// refused repeat's (the earlier call's).
    fn output_left_out(outcome: &serde_json::Map<String, Value>) -> bool {
        matches!(outcome.get("kind").and_then(Value::as_str), Some("ok" | "repeated"))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Step, D::Error> {
        let mut v = Value::deserialize(d)?;
        // A record written whole (an earlier build's) is read as it is.
        if let Some(o) = v.as_object_mut().filter(|o| !o.contains_key("observation")) {
            let observed = o.remove("observed").and_then(|b| b.as_bool()).unwrap_or(false);
            o.insert("observation".into(), if observed { Value::String(String::new()) } else { Value::Null });
        }
        for call in v.get_mut("calls").and_then(Value::as_array_mut).into_iter().flatten() {
            let outcome = call.get_mut("outcome").and_then(Value::as_object_mut);
            if let Some(o) = outcome.filter(|o| output_left_out(o)) {
                o.remove("output_digest");
                o.entry("output").or_insert_with(|| Value::String(String::new()));
            }
        }
        serde_json::from_value(v).map_err(serde::de::Error::custom)
    }
}
