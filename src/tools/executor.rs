//! Runs tool calls: argument validation with a real JSON-schema validator, interceptors before and after,
//! a timeout, and panics caught. Every failure becomes a [`CallOutcome`] whose observation the model sees;
//! nothing here aborts a run.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::{observation_text, Tool, ToolCall, ToolError, ToolSet};

/// What an interceptor decides before a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterceptorAction {
    /// Go on (possibly with the call modified in place).
    Continue,
    /// Do not run the call; the model is told it was blocked, with this reason.
    Block(String),
}

/// Hooks around every tool call.
pub trait Interceptor: Send {
    /// Runs before the call; may modify it or block it.
    fn before(&mut self, _call: &mut ToolCall) -> InterceptorAction {
        InterceptorAction::Continue
    }
    /// Runs after the call; may modify the result.
    fn after(&mut self, _call: &ToolCall, _result: &mut std::result::Result<Value, ToolError>) {}
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallOutcome {
    /// The tool returned a result.
    Ok { output: String },
    /// The tool returned an error.
    Error { message: String },
    /// No tool of that name.
    UnknownTool { tool: String, known: Vec<String> },
    /// The arguments failed the schema or the tool's own validator.
    InvalidArgs { message: String },
    /// The tool ran past the timeout.
    Timeout { seconds: f64 },
    /// The tool panicked.
    Panic { message: String },
    /// An interceptor blocked the call.
    Blocked { reason: String },
    /// The same call as the previous one(s): not run again; the earlier output is repeated.
    Repeated { output: String, times: usize },
}

impl CallOutcome {
    /// The observation text the model sees.
    pub fn observation(&self) -> String {
        match self {
            CallOutcome::Ok { output } => output.clone(),
            CallOutcome::Blocked { reason } => format!("The call was blocked: {reason}"),
            CallOutcome::Repeated { output, times } => format!("{output}\n({})", repeat_note(*times)),
            other => format!("{ERROR_MARK}{}", other.error_text().unwrap_or_default()),
        }
    }

    /// What went wrong, as the observation says it without its `Error: ` (`None` when the tool produced
    /// a result).
    pub fn error_text(&self) -> Option<String> {
        Some(match self {
            CallOutcome::Ok { .. } | CallOutcome::Repeated { .. } => return None,
            CallOutcome::Error { message } => message.clone(),
            CallOutcome::UnknownTool { tool, known } => {
                format!("there is no tool `{tool}`; the tools are: {}", known.join(", "))
            }
            CallOutcome::InvalidArgs { message } => format!("invalid arguments: {message}"),
            CallOutcome::Timeout { seconds } => format!("the tool did not finish within {seconds} s"),
            CallOutcome::Panic { message } => format!("the tool crashed: {message}"),
            CallOutcome::Blocked { reason } => format!("the call was blocked: {reason}"),
        })
    }

    /// Whether the tool produced a result.
    pub fn is_ok(&self) -> bool {
        matches!(self, CallOutcome::Ok { .. })
    }
}

/// How an observation opens the error of a call that failed.
pub(crate) const ERROR_MARK: &str = "Error: ";

/// What the observation of a refused repeat says after the earlier output.
pub fn repeat_note(times: usize) -> String {
    format!("The same call was already made {times} time(s) with this result; it was not run again.")
}

/// Validates and runs calls against a tool set.
pub struct Executor {
    tools: ToolSet,
    /// Each tool's compiled argument validator (or why its schema does not compile), by name.
    validators: HashMap<String, std::result::Result<jsonschema::Validator, String>>,
    timeout: Duration,
    interceptors: Vec<Box<dyn Interceptor>>,
}

impl Executor {
    /// An executor over `tools` with a per-call timeout.
    pub fn new(tools: ToolSet, timeout: Duration) -> Self {
        let validators = tools
            .specs()
            .into_iter()
            .map(|s| (s.name, jsonschema::validator_for(&s.parameters).map_err(|e| e.to_string())))
            .collect();
        Self { tools, validators, timeout, interceptors: Vec::new() }
    }

    /// Adds an interceptor (they run in the order added).
    pub fn intercept(&mut self, i: Box<dyn Interceptor>) {
        self.interceptors.push(i);
    }

    /// The tools.
    pub fn tools(&self) -> &ToolSet {
        &self.tools
    }

    /// Checks a call without running it: the tool exists and its arguments pass the schema and the tool's
    /// own validator.
    pub fn check(&self, call: &ToolCall) -> std::result::Result<(), CallOutcome> {
        let Some(tool) = self.tools.get(&call.tool) else {
            return Err(CallOutcome::UnknownTool {
                tool: call.tool.clone(),
                known: self.tools.names().into_iter().map(String::from).collect(),
            });
        };
        let validator = match self.validators.get(&call.tool) {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(CallOutcome::InvalidArgs { message: format!("the tool's schema is invalid: {e}") })
            }
            None => unreachable!("every tool of the set has a validator entry"),
        };
        if let Some(e) = validator.iter_errors(&call.args).next() {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { String::new() } else { format!(" at {at}") };
            return Err(CallOutcome::InvalidArgs { message: format!("{e}{at}") });
        }
        tool.validate(&call.args).map_err(|message| CallOutcome::InvalidArgs { message })
    }

    /// Runs a call through the interceptors, validation and the tool. Returns the call as finally made
    /// (interceptors may change it) and its outcome.
    pub fn execute(&mut self, mut call: ToolCall) -> (ToolCall, CallOutcome) {
        for i in &mut self.interceptors {
            if let InterceptorAction::Block(reason) = i.before(&mut call) {
                return (call, CallOutcome::Blocked { reason });
            }
        }
        if let Err(outcome) = self.check(&call) {
            return (call, outcome);
        }
        let tool = self.tools.get(&call.tool).expect("checked above").clone();
        let mut result = match run_with_timeout(tool, call.args.clone(), self.timeout) {
            Ran::Done(r) => r,
            Ran::Timeout => return (call, CallOutcome::Timeout { seconds: self.timeout.as_secs_f64() }),
            Ran::Panic(message) => return (call, CallOutcome::Panic { message }),
        };
        for i in &mut self.interceptors {
            i.after(&call, &mut result);
        }
        let outcome = match result {
            Ok(v) => CallOutcome::Ok { output: observation_text(&v) },
            Err(ToolError(message)) => CallOutcome::Error { message },
        };
        (call, outcome)
    }
}

enum Ran {
    Done(std::result::Result<Value, ToolError>),
    Timeout,
    Panic(String),
}

/// Runs the tool on its own thread. A call that overruns is abandoned (a thread cannot be killed; program
/// tools kill their own child process on their own timeout).
fn run_with_timeout(tool: Arc<dyn Tool>, args: Value, timeout: Duration) -> Ran {
    let (tx, rx) = mpsc::channel();
    // The tool sees the cancellation handles of the run that called it.
    let scopes = crate::limits::current_scopes();
    let spawned = std::thread::Builder::new().name("reagent-tool".into()).spawn(move || {
        let call = || crate::limits::in_scopes(&scopes, || tool.call(&args));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
        // Let go of the tool before answering: the agent may drop its own handle right after, and the
        // last handle's drop (an MCP server's shutdown) must not be left to a thread nobody waits for.
        drop(tool);
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        return Ran::Done(Err(ToolError(format!("cannot start the tool: {e}"))));
    }
    // Waited for in slices, so that an interrupt ends the wait (a program tool kills itself on one).
    let deadline = std::time::Instant::now() + timeout;
    let received = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() && !crate::limits::interrupted() => continue,
            Err(mpsc::RecvTimeoutError::Timeout) if crate::limits::interrupted() => {
                // The tool sees the interrupt too (a program tool kills its process group within a few
                // milliseconds): give it a moment, so that the group is gone before the run ends.
                return match rx.recv_timeout(Duration::from_secs(1)) {
                    Ok(Ok(r)) => Ran::Done(r),
                    _ => Ran::Done(Err(ToolError("interrupted".into()))),
                };
            }
            r => break r,
        }
    };
    match received {
        Ok(Ok(r)) => Ran::Done(r),
        Ok(Err(panic)) => Ran::Panic(
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into()),
        ),
        Err(mpsc::RecvTimeoutError::Timeout) => Ran::Timeout,
        Err(mpsc::RecvTimeoutError::Disconnected) => Ran::Panic("the tool thread ended without a result".into()),
    }
}
