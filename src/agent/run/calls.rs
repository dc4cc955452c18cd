//! A step's tool calls: executed through the agent's executor, repeats and cycles back to a known result
//! refused, failures noted for the next step, and the observation turns that carry the results back.

use std::time::Instant;

use super::{Decision, RunState};
use crate::agent::decision::{DecisionFormat, ToolChoice};
use crate::agent::events::{AgentEvent, CallRecord, Step};
use crate::agent::Agent;
use crate::text::chat::{ChatMessage, Role};
use crate::tools::{repeat_note, CallOutcome, ToolCall};

/// How many calls before the previous one a call is compared with, to refuse a cycle.
const CYCLE_WINDOW: usize = 2;

impl Agent {
    /// Runs the decision's calls into `step.calls`, noting in `run` whether the next step must answer (a
    /// refused repeat, a held call) or call again (a failure, when the settings ask for it). Returns
    /// whether every call was held ([`Self::untrusted`]). `known`: for a step replayed from a trace, the
    /// calls that started before the run stopped, with their outcomes where they are known; those are not
    /// run again, and one whose outcome is unknown runs again only when it is read-only.
    pub(super) fn run_calls(
        &mut self,
        step_no: usize,
        decision: &Decision,
        step: &mut Step,
        run: &mut RunState,
        forced_after_error: bool,
        known: &[(ToolCall, Option<CallOutcome>)],
    ) -> bool {
        let calls = decision.calls();
        let mut held = 0;
        // Each decision call takes the first recorded call equal to it that no earlier one took: calls that
        // were held or refused never started, so positions do not line up.
        let mut taken = vec![false; known.len()];
        for call in decision.calls() {
            let slot = known.iter().enumerate().position(|(j, (c, _))| !taken[j] && *c == call);
            let recorded = slot.map(|j| {
                taken[j] = true;
                known[j].1.clone()
            });
            // A call whose outcome the trace did not record did not fail: it is not retried as one.
            let unknown = matches!(recorded, Some(None));
            let (call, outcome) = match recorded {
                // A held call is replayed as it was: no bookkeeping, and the next step answers.
                Some(Some(outcome)) if is_held(&outcome) => {
                    run.force_answer = self.config.tool_choice == ToolChoice::Auto;
                    step.calls.push(CallRecord { call, outcome });
                    held += 1;
                    continue;
                }
                Some(Some(outcome)) => {
                    note_outcome(&call, &outcome, &mut run.recent, &mut run.history);
                    (call, outcome)
                }
                Some(None) if !self.executor.tools().get(&call.tool).is_some_and(|t| t.read_only()) => {
                    let outcome = CallOutcome::Error {
                        message: "the run stopped while this call ran, so whether it did anything is unknown; \
                                  it was not run again"
                            .into(),
                    };
                    self.emit(AgentEvent::ToolCallBlocked {
                        step: step_no,
                        call: call.clone(),
                        reason: outcome.observation(),
                    });
                    note_outcome(&call, &outcome, &mut run.recent, &mut run.history);
                    (call, outcome)
                }
                _ => {
                    if let Some(reason) = self.untrusted(&call, run) {
                        // Not a failure to retry or to keep out of the answer: the model answers without it
                        // (a model that was told to make the call otherwise makes it again until the steps
                        // run out).
                        run.force_answer = self.config.tool_choice == ToolChoice::Auto;
                        self.emit(AgentEvent::ToolCallBlocked {
                            step: step_no,
                            call: call.clone(),
                            reason: reason.clone(),
                        });
                        let outcome = CallOutcome::Blocked { reason: format!("{reason}{HELD}") };
                        step.calls.push(CallRecord { call, outcome });
                        held += 1;
                        continue;
                    }
                    self.call(step_no, call, &mut run.recent, &mut run.history)
                }
            };
            if matches!(outcome, CallOutcome::Repeated { .. }) {
                run.force_answer = self.config.tool_choice == ToolChoice::Auto;
            }
            let failed =
                matches!(outcome, CallOutcome::Error { .. } | CallOutcome::Timeout { .. } | CallOutcome::Panic { .. });
            run.after_error |= failed && self.config.call_after_error && !forced_after_error;
            // The tools its error names for the job make the next decision (see `with_alternatives`).
            let others = match outcome {
                CallOutcome::Error { .. } => self.alternatives(&call.tool),
                _ => Vec::new(),
            };
            // A failure that names no other tool: the next decision tries that tool again or answers.
            if failed && !unknown && others.is_empty() && !run.failed_tools.contains(&call.tool) {
                run.failed_tools.push(call.tool.clone());
            }
            run.alternatives.extend(others);
            if let Some(error) = outcome.error_text() {
                run.failures.push((call.tool.clone(), error));
            }
            // The note on a refused repeat is no answer either.
            if let CallOutcome::Repeated { times, .. } = &outcome {
                run.failures.push((call.tool.clone(), repeat_note(*times)));
            }
            step.calls.push(CallRecord { call, outcome });
        }
        held > 0 && held == calls.len()
    }

    /// Why `call` is held ([`AgentConfig::hold_untrusted_calls`](crate::agent::AgentConfig::hold_untrusted_calls)):
    /// a tool that changes things, called with what an earlier tool output chose.
    fn untrusted(&self, call: &ToolCall, run: &RunState) -> Option<String> {
        let changes_things = self.executor.tools().get(&call.tool).is_some_and(|t| !t.read_only());
        if !self.config.hold_untrusted_calls || !changes_things {
            return None;
        }
        let outputs: Vec<&str> = run
            .history
            .iter()
            .filter_map(|(_, o)| match o {
                CallOutcome::Ok { output } | CallOutcome::Repeated { output, .. } => Some(output.as_str()),
                _ => None,
            })
            .collect();
        crate::agent::grounding::chosen_by_tool_output(call, &run.task, &outputs)
    }

    /// The turns that carry the step's results back to the model, and `step.observation`.
    pub(super) fn observation_messages(&self, step: &mut Step) -> Vec<ChatMessage> {
        if self.config.format == DecisionFormat::Native {
            // The template wraps each tool turn as the model saw results in training: a repeated call's turn
            // is its result alone (the next decision must answer anyway; a note about the repeat in a tool
            // turn drew answers about the repeat instead of the result).
            let observations: Vec<String> = step
                .calls
                .iter()
                .map(|c| match &c.outcome {
                    CallOutcome::Repeated { output, .. } => output.clone(),
                    other => other.observation(),
                })
                .collect();
            step.observation = Some(observations.join("\n"));
            return observations.into_iter().map(|o| ChatMessage::new(Role::Tool, o)).collect();
        }
        // Naming the call next to its result lets small models connect the two.
        let observations: Vec<String> = step
            .calls
            .iter()
            .map(|c| format!("{} {} returned: {}", c.call.tool, c.call.args, c.outcome.observation()))
            .collect();
        // After a failure the error speaks for itself (small models copy any advice into their answer).
        let failed = step.calls.iter().any(|c| !c.outcome.is_ok());
        let next = match (&self.config.tool_choice, failed) {
            (ToolChoice::Auto, false) => "\nIf this answers the task, give the final answer now.",
            _ => "",
        };
        let observation = format!("Observation: {}{next}", observations.join("\n"));
        step.observation = Some(observation.clone());
        vec![ChatMessage::new(self.driver.observation_role(), observation)]
    }

    /// Executes one call, unless it repeats the previous ones too often, or goes back to a call made
    /// just before the previous one (a cycle: read, compute, read again; within [`CYCLE_WINDOW`] calls)
    /// that succeeded: its result is known. Returns the call as made (interceptors may change it) and its
    /// outcome.
    fn call(
        &mut self,
        step: usize,
        call: ToolCall,
        recent: &mut Vec<(ToolCall, CallOutcome)>,
        history: &mut Vec<(ToolCall, CallOutcome)>,
    ) -> (ToolCall, CallOutcome) {
        if recent.last().is_some_and(|(c, _)| c != &call) {
            recent.clear();
        }
        if let Some(earlier) = self.goes_back(&call, history) {
            let outcome = CallOutcome::Repeated { output: earlier.observation(), times: 1 };
            let reason = "goes back to a call made before the previous one (its result is known)".to_string();
            self.emit(AgentEvent::ToolCallBlocked { step, call: call.clone(), reason });
            return (call, outcome);
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
        let (call, outcome) = self.execute_with_retries(step, call);
        let outcome = self.with_alternatives(&call.tool, outcome);
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
        recent.push((asked.clone(), outcome.clone()));
        history.push((asked, outcome.clone()));
        (call, outcome)
    }

    /// Executes `call`, making it again while it fails transiently and its tool's [`Retry`] allows
    /// ([`Tool::retryable`](crate::tools::Tool::retryable): nothing ran, or a read-only tool timed out),
    /// each attempt after its wait and recorded as an event.
    ///
    /// [`Retry`]: crate::tools::Retry
    fn execute_with_retries(&mut self, step: usize, call: ToolCall) -> (ToolCall, CallOutcome) {
        let tool = self.executor.tools().get(&call.tool).cloned();
        let mut attempt = 0;
        loop {
            let (made, outcome) = self.executor.execute(call.clone());
            let Some(tool) = &tool else { return (made, outcome) };
            let transient = match &outcome {
                CallOutcome::Timeout { .. } => tool.read_only(),
                CallOutcome::Error { message } => tool.retryable(message),
                _ => false,
            };
            let retry = tool.retry();
            if !transient || attempt >= retry.times || crate::limits::interrupted() {
                return (made, outcome);
            }
            attempt += 1;
            let wait = retry.wait(attempt);
            self.emit(AgentEvent::ToolCallRetried {
                step,
                call: made.clone(),
                attempt,
                error: outcome.error_text().unwrap_or_default(),
                wait_seconds: wait.as_secs_f64(),
            });
            // Waited in slices, so that a cancellation ends the wait.
            let until = Instant::now() + wait;
            while Instant::now() < until && !crate::limits::interrupted() {
                std::thread::sleep(
                    until.saturating_duration_since(Instant::now()).min(std::time::Duration::from_millis(50)),
                );
            }
            // A cancellation during the wait: the call is not made again.
            if crate::limits::interrupted() {
                return (made, outcome);
            }
        }
    }

    /// A tool's error with the other tools that may do what it was asked ([`Self::alternatives`]).
    fn with_alternatives(&self, tool: &str, outcome: CallOutcome) -> CallOutcome {
        let CallOutcome::Error { message } = outcome else { return outcome };
        let others = self.alternatives(tool);
        if others.is_empty() {
            return CallOutcome::Error { message };
        }
        let others: Vec<String> = others.iter().map(|n| format!("`{n}`")).collect();
        CallOutcome::Error { message: format!("{message} (other tools for this: {})", others.join(", ")) }
    }

    /// The other tools that may do what a failed call of `tool` was asked (an MCP server's
    /// `read_text_file` where the built-in `read_file` refused a path outside its root): tools whose name,
    /// without a `server.` prefix, has every part of the failed tool's name (`read`, `file`; a part may be
    /// longer: `dir` → `directory`). At most three.
    fn alternatives(&self, tool: &str) -> Vec<String> {
        let parts = |name: &str| -> Vec<String> {
            let bare = name.rsplit('.').next().unwrap_or(name);
            bare.split(['_', '-']).filter(|p| !p.is_empty()).map(str::to_lowercase).collect()
        };
        let wanted = parts(tool);
        self.executor
            .tools()
            .names()
            .into_iter()
            .filter(|n| *n != tool)
            .filter(|n| {
                let have = parts(n);
                wanted.iter().all(|w| have.iter().any(|h| h.starts_with(w.as_str())))
            })
            .take(3)
            .map(String::from)
            .collect()
    }

    /// The earlier outcome of `call` when it goes back to a call made two or three calls before (within
    /// [`CYCLE_WINDOW`] before the previous one) that returned a result or an error, of a
    /// [read-only](crate::tools::Tool::read_only) tool, with only read-only tools called since: its
    /// outcome is known (a timeout or a crash is not: it may go otherwise).
    fn goes_back<'h>(&self, call: &ToolCall, history: &'h [(ToolCall, CallOutcome)]) -> Option<&'h CallOutcome> {
        let read_only = |c: &ToolCall| self.executor.tools().get(&c.tool).is_some_and(|t| t.read_only());
        if history.last().is_none_or(|(last, _)| last == call) || !read_only(call) {
            return None;
        }
        for (i, (earlier, outcome)) in history.iter().enumerate().rev().skip(1).take(CYCLE_WINDOW) {
            if earlier == call {
                let pure_since = history[i + 1..].iter().all(|(c, _)| read_only(c));
                let known = matches!(outcome, CallOutcome::Ok { .. } | CallOutcome::Error { .. });
                return (pure_since && known).then_some(outcome);
            }
        }
        None
    }
}

/// How the outcome of a held call ([`Agent::untrusted`]) ends.
const HELD: &str = "; it was not run";

/// Whether `outcome` is a held call's.
fn is_held(outcome: &CallOutcome) -> bool {
    matches!(outcome, CallOutcome::Blocked { reason } if reason.ends_with(HELD))
}

/// Records a call's known outcome as [`Agent::call`] records the ones it runs: in the run of identical
/// calls, and in the history.
fn note_outcome(
    call: &ToolCall,
    outcome: &CallOutcome,
    recent: &mut Vec<(ToolCall, CallOutcome)>,
    history: &mut Vec<(ToolCall, CallOutcome)>,
) {
    if recent.last().is_some_and(|(c, _)| c != call) {
        recent.clear();
    }
    recent.push((call.clone(), outcome.clone()));
    history.push((call.clone(), outcome.clone()));
}
