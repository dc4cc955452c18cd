//! A step's attempts: decide, check, and retry with what was wrong fed back (extraction, validation,
//! wrong arithmetic, an answer that must be a call), until a decision stands or the attempts run out.

use serde_json::Value;

use super::checks::{arithmetic_slips, copied_failure, echoes_request, Failure};
use super::{Attempt, Checks, Decided, StepGrammar};
use crate::agent::decision::{Decision, DecisionFormat};
use crate::agent::driver::{DecisionRequest, DriverOutput};
use crate::agent::events::{AgentEvent, RunStats, StopReason};
use crate::agent::Agent;
use crate::error::{Error, Result};
use crate::text::chat::ChatMessage;

impl Agent {
    /// Gets one valid decision, retrying extraction and validation failures with the error fed back. An
    /// answer that repeats the error of a failed call ([`Checks::failures`]) is retried too, as a call and
    /// with no words about it (small models copy what they are told into the answer); on the last attempt
    /// the run stops, saying what failed.
    pub(super) fn attempt(
        &mut self,
        step: usize,
        messages: &mut [ChatMessage],
        schema: &StepGrammar,
        mut checks: Checks,
        tools: Option<&Value>,
        stats: &mut RunStats,
    ) -> Result<Attempt> {
        let mut feedback: Option<String> = None;
        let mut last_error = String::new();
        // After an arithmetic slip the retries call a tool where there is a call-only grammar, the one right
        // after it decoded as the first attempt was (greedy stays greedy); after an answer that must be a call it calls too,
        // one of the calls the request still needs where it was given too early.
        let (mut after_slip, mut call_instead, mut too_early) = (false, false, false);
        // Whether an attempt of this step slipped: its retries stay calls (the calculator's where one says
        // so) until a decision stands, and the call that stands corrects the slip.
        let mut slipped = false;
        // The grammar of the calls the pending need names, built the first time an answer comes too early.
        let mut needed: Option<StepGrammar> = None;
        // After a slip, the calls a tool says the wrong equation needs (the calculator), where one does.
        let mut computes: Option<StepGrammar> = None;
        for attempt in 0..=self.config.max_retries {
            self.emit(AgentEvent::StepStarted { step, attempt });
            // The failed output is not kept; the retry sees the conversation plus what was wrong.
            let step_grammar = match (&needed, &computes, checks.call_only) {
                (Some(g), _, _) if too_early => g,
                (_, Some(g), Some(_)) if slipped => g,
                (_, _, Some(g)) if slipped || call_instead => g,
                _ => schema,
            };
            let mut request_messages = messages.to_vec();
            if let Some(f) = &feedback {
                request_messages.push(ChatMessage::user(f.clone()));
            }
            if let Some(stop) = self.fit_context(messages, &mut request_messages, tools)? {
                return Ok(Attempt::Stop(stop));
            }
            // A ReAct decision's call bias is the first decision's choice between calling and answering
            // (calibrated on requests a person makes); later, after observations, the model chooses. Where
            // the choice is the native call score's ([`AgentConfig::native_branch`]), the bias is that
            // score's: a ReAct decision it did not choose (a driver that cannot score, a conversation with
            // calls in it) is the model's own choice.
            //
            // [`AgentConfig::native_branch`]: crate::agent::AgentConfig::native_branch
            let mut biases = self.config.branch_biases;
            if self.config.format == DecisionFormat::React && (step > 1 || self.config.native_branch) {
                biases.call = 0.0;
            }
            let req = DecisionRequest {
                messages: &request_messages,
                grammar: &step_grammar.grammar,
                tools,
                format: self.config.format,
                biases,
                max_tokens: self.config.max_decision_tokens,
                attempt: if after_slip { 0 } else { attempt },
                think_budget: self.config.think_budget,
                stop_at_answer: checks.stop_at_answer && attempt == 0,
            };
            let out = match self.driver.decide(&req) {
                Ok(o) => o,
                // A generation stopped by the cancel handle (thinking returns no partial decision).
                Err(_) if crate::limits::interrupted() => return Ok(Attempt::Stop(StopReason::Interrupted)),
                Err(Error::EndpointDown { endpoint, problem }) => {
                    return Ok(Attempt::Stop(StopReason::EndpointDown { endpoint, problem }))
                }
                Err(e) => return Ok(Attempt::Stop(StopReason::DriverError { message: e.to_string() })),
            };
            if crate::limits::interrupted() {
                return Ok(Attempt::Stop(StopReason::Interrupted));
            }
            stats.count(&out.stats);
            if let Some(budget) = self.config.token_budget.filter(|&b| stats.generated_tokens > b) {
                return Ok(Attempt::Stop(StopReason::TokenBudget { used: stats.generated_tokens, budget }));
            }
            if out.answer_pending {
                let decision = Decision::FinalAnswer { thought: String::new(), answer: String::new() };
                let (thinking, text) = (out.thinking.clone(), out.text.clone());
                let decided = Decided {
                    decision,
                    thinking,
                    text,
                    stats: out.stats,
                    retries: attempt,
                    answer_pending: true,
                    corrects_arithmetic: false,
                };
                return Ok(Attempt::Decided(Box::new(decided)));
            }
            let last = attempt >= self.config.max_retries;
            let checked = self.check(&out, step_grammar).and_then(|d| match checks.slips.as_deref_mut() {
                // The last attempt's answer stands as it is, and so does one cut off by the token limit (its
                // last number may be cut).
                Some(flagged) if !last && out.complete => match arithmetic_slips(&d, messages, flagged) {
                    Some(failure) => Err(failure),
                    None => Ok(d),
                },
                _ => Ok(d),
            });
            // An answer while the request still needs a tool (a second file not yet read): call instead.
            too_early = false;
            let checked = match (checked, checks.pending.as_ref()) {
                (Ok(d @ Decision::FinalAnswer { .. }), Some(need))
                    if !last && !checks.raised.contains(&need.reason) =>
                {
                    checks.raised.push(need.reason.clone());
                    too_early = true;
                    needed = needed.or_else(|| self.need_grammar(need));
                    let error = format!("answered too early: {}", need.reason);
                    Err(Failure::CallInstead(error, serde_json::to_value(&d).unwrap_or(Value::Null)))
                }
                (c, _) => c,
            };
            // An answer that repeats a tool's error, or writes the request back after one, says only
            // that the call failed.
            let no_answer = |d: &Decision| match copied_failure(d, checks.failures) {
                Some(f) => Some((format!("the answer repeats the error of `{}`", f.0), f)),
                None => checks
                    .failures
                    .last()
                    .filter(|_| echoes_request(d, checks.task))
                    .map(|f| (format!("the answer repeats the request after `{}` failed", f.0), f)),
            };
            let checked = match checked.map(|d| (no_answer(&d), d)) {
                Ok((Some((_, (tool, error))), _)) if last => {
                    return Ok(Attempt::Stop(StopReason::ToolFailed { tool: tool.clone(), error: error.clone() }))
                }
                Ok((Some((why, _)), d)) => {
                    Err(Failure::CallInstead(why, serde_json::to_value(&d).unwrap_or(Value::Null)))
                }
                Ok((None, d)) => Ok(d),
                Err(e) => Err(e),
            };
            after_slip = matches!(checked, Err(Failure::Arithmetic(..)));
            slipped |= after_slip;
            if after_slip {
                // Left to any call, a small model makes the call it made before (the file read again).
                let slip = checks.slips.as_deref().and_then(|flagged| flagged.last());
                computes = slip.and_then(|expression| self.grammar_computing(expression));
            }
            call_instead = matches!(checked, Err(Failure::CallInstead(..)));
            let error = match checked {
                Ok(decision) => {
                    let (decision, cut) = decision.until_repeated_call();
                    let corrects_arithmetic = slipped && !matches!(decision, Decision::FinalAnswer { .. });
                    let text = self.kept_text(&out.text, &decision, cut)?;
                    return Ok(Attempt::Decided(Box::new(Decided {
                        decision,
                        thinking: out.thinking.clone(),
                        text,
                        stats: out.stats,
                        retries: attempt,
                        answer_pending: false,
                        corrects_arithmetic,
                    })));
                }
                Err(failure) => self.report_failure(step, attempt, failure, &out),
            };
            stats.retries += 1;
            self.driver.rollback();
            feedback = (!call_instead).then(|| match self.config.format {
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

    /// Sends the failure's event; its message, for the retry's feedback.
    fn report_failure(&mut self, step: usize, attempt: usize, failure: Failure, out: &DriverOutput) -> String {
        match failure {
            Failure::Extraction(error) => {
                self.emit(AgentEvent::ExtractionFailed {
                    step,
                    attempt,
                    error: error.clone(),
                    output: out.text.clone(),
                    stats: out.stats.clone(),
                });
                error
            }
            Failure::Validation(error, decision)
            | Failure::Arithmetic(error, decision)
            | Failure::CallInstead(error, decision) => {
                self.emit(AgentEvent::ValidationFailed { step, attempt, error: error.clone(), decision });
                error
            }
        }
    }
}
