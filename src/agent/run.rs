//! One run of the agent: the step loop, each step's attempts (decide → check → retry with the error fed
//! back), abstention on ungrounded first calls, tool execution and observations.

use std::time::Instant;

use serde_json::Value;

use super::decision::{self, Decision, DecisionFormat, ToolChoice};
use super::events::{AgentEvent, DecisionStats, RunStats, Step, StopReason, Transcript};
use super::grounding::Evidence;
use super::native;
use super::{Agent, RecordedStep};
use crate::error::{Error, Result};
use crate::text::chat::{ChatMessage, Role};
use crate::tools::{CallOutcome, Need, ToolCall, ToolSpec};

mod answer;
mod attempt;
mod branch;
mod calls;
mod checks;
mod context;
mod extra_calls;
mod needs;
mod support;
mod validate;

pub(super) use validate::StepGrammar;
use validate::StepGrammars;

/// What one step's attempts produced.
enum Attempt {
    Decided(Box<Decided>),
    Stop(StopReason),
}

/// One valid decision, as the step keeps it.
struct Decided {
    decision: Decision,
    /// The thinking before the decision, if the model thought.
    thinking: Option<String>,
    /// The decision as the conversation keeps it.
    text: String,
    stats: DecisionStats,
    retries: usize,
    /// An answer whose text is still to come: the decision stopped where it chose to answer
    /// ([`DecisionRequest::stop_at_answer`]).
    answer_pending: bool,
    /// A call made instead of an answer whose arithmetic was wrong ([`Step::corrects_arithmetic`]).
    corrects_arithmetic: bool,
}

/// Where a run stands between steps.
#[derive(Default)]
struct RunState {
    steps: Vec<Step>,
    stats: RunStats,
    /// The latest run of identical calls with their outcomes, to refuse repeats.
    recent: Vec<(ToolCall, CallOutcome)>,
    /// Every call executed, as asked, with its outcome: to refuse a cycle (A, B, A).
    history: Vec<(ToolCall, CallOutcome)>,
    /// A repeated call was refused: an `auto` run must answer now.
    force_answer: bool,
    /// The previous step's call failed (and the step before was not already forced by a failure).
    after_error: bool,
    /// The equations already sent back as arithmetic slips: each is sent back once a run, so a model that
    /// writes it again (or a slip that is none) cannot keep a run from answering.
    flagged_slips: Vec<String>,
    /// The first decision must call a tool ([`AgentConfig::first_call`]), and which calls where the
    /// request says ([`Need`]).
    first_call_required: bool,
    first_need: Option<Need>,
    /// Each failed call's tool and error text: an answer that repeats one is not an answer.
    failures: Vec<(String, String)>,
    /// The last user message.
    task: String,
    /// The conversation as the caller gave it: the start of an answer in the model's own words.
    request: Vec<ChatMessage>,
    /// Tools a failed call's error named as the ones for the job ("other tools for this: …"): the next
    /// decision calls one of them (live state: what the failed tool said, not the request's words).
    alternatives: Vec<String>,
    /// The tools of the last step's failed calls whose errors named no other tool: the next decision
    /// calls one of them again (with other arguments) or answers ([`AgentConfig::retry_failed_tool`]).
    failed_tools: Vec<String>,
    /// What the request still needed when an answer was sent back for it ([`Checks::pending`]): each
    /// once a run.
    pending_raised: Vec<String>,
}

/// What a step's attempts check beyond validity, and how they retry.
struct Checks<'a> {
    /// The grammar of the attempt after an arithmetic slip or an answer that repeats an error: calls only
    /// (under `auto`: a small model told the right sum still writes its own, but computes it when made to
    /// call; one that answered with an error tries another call).
    call_only: Option<&'a StepGrammar>,
    /// The run's [`RunState::flagged_slips`], where the arithmetic is checked
    /// ([`AgentConfig::check_arithmetic`]).
    slips: Option<&'a mut Vec<String>>,
    /// The run's [`RunState::failures`].
    failures: &'a [(String, String)],
    /// The request: an answer that only writes it back is not an answer.
    task: &'a str,
    /// What the request still needs a tool for, not yet raised this run ([`Tool::needed_for`]
    /// (crate::tools::Tool::needed_for)): an answer is then sent back to make one of the calls that meet
    /// it (once), and the reason noted in `raised`.
    pending: Option<Need>,
    raised: &'a mut Vec<String>,
    /// The first attempt may stop where it chooses to answer: the answer will be the model's own reply.
    stop_at_answer: bool,
}

impl Agent {
    /// [`run`](Self::run) for a conversation: its system messages are added to the agent's system prompt,
    /// the other turns follow it.
    pub fn run_conversation(&mut self, conversation: &[ChatMessage]) -> Result<Transcript> {
        let cancel = self.cancel.clone();
        cancel.scope(|| self.run_in_scope(conversation, Vec::new())).map(|(t, _)| t)
    }

    /// [`run_conversation`](Self::run_conversation), also returning the conversation as the run left it
    /// (without the system prompt): `conversation`'s turns, then each decision and observation the run
    /// added. A [`Session`](super::Session) sends it back, with the next user turn, as the next run's
    /// conversation, whose prompt then starts as this run's did (only the new turn is computed).
    pub fn run_kept(&mut self, conversation: &[ChatMessage]) -> Result<(Transcript, Vec<ChatMessage>)> {
        let cancel = self.cancel.clone();
        cancel.scope(|| self.run_in_scope(conversation, Vec::new()))
    }

    /// Goes on with a run that stopped (killed, interrupted) from what its trace recorded
    /// ([`read_trace`](crate::agent::read_trace)): the recorded steps are replayed into the conversation
    /// without deciding or running them again, then the run continues. A call that started but whose
    /// outcome was not recorded runs again only when its tool is read-only; otherwise the model is told
    /// its outcome is unknown. The caller checks that the trace is this task's, model's and tools'.
    pub fn resume(&mut self, conversation: &[ChatMessage], recorded: Vec<RecordedStep>) -> Result<Transcript> {
        let cancel = self.cancel.clone();
        cancel.scope(|| self.run_in_scope(conversation, recorded)).map(|(t, _)| t)
    }

    fn run_in_scope(
        &mut self,
        conversation: &[ChatMessage],
        recorded: Vec<RecordedStep>,
    ) -> Result<(Transcript, Vec<ChatMessage>)> {
        let task = conversation
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .ok_or_else(|| Error::param("conversation", "it has no user message"))?;
        let t0 = Instant::now();
        // A request far over the context is refused before anything is built from it.
        let bytes = conversation.iter().filter(|m| m.role != Role::Tool).map(|m| m.content.len()).sum();
        if let Some((at_least, capacity)) = self.driver.prompt_bound(bytes) {
            let needed = at_least + self.decision_room();
            if needed > capacity {
                let stop = StopReason::ContextOverflow { needed, capacity };
                self.emit(AgentEvent::RunFailed { reason: stop.clone() });
                let stats = RunStats { seconds: t0.elapsed().as_secs_f64(), ..RunStats::default() };
                let kept = conversation.iter().filter(|m| m.role != Role::System).cloned().collect();
                return Ok((
                    Transcript { task, steps: Vec::new(), final_answer: None, stop_reason: stop, stats },
                    kept,
                ));
            }
        }
        let specs = self.executor.tools().specs();
        let tools_value =
            (self.config.format == DecisionFormat::Native && !specs.is_empty()).then(|| native::tools_value(&specs));
        let grammars = self.step_grammars()?;
        let mut messages = self.opening_messages(conversation, &specs);
        let names = specs.iter().map(|s| s.name.clone()).collect();
        self.driver.reseed();
        self.emit(AgentEvent::RunStarted { task: task.clone(), tools: names, driver: self.driver.name().into() });
        let (first_call_required, first_need) = self.first_call_required(&task);
        let request = conversation.to_vec();
        let mut run = RunState { first_call_required, first_need, task: task.clone(), request, ..RunState::default() };
        let mut replay = std::collections::VecDeque::from(recorded);
        if !replay.is_empty() {
            self.emit(AgentEvent::RunResumed { steps: replay.len() });
        }
        let stop = loop {
            if let Some(rec) = replay.pop_front() {
                match self.replay_step(&mut run, &mut messages, rec) {
                    Some(stop) => break stop,
                    None => continue,
                }
            }
            if crate::limits::interrupted() {
                break StopReason::Interrupted;
            }
            if run.steps.len() >= self.config.max_steps {
                break StopReason::MaxSteps { steps: run.steps.len() };
            }
            if let Some(stop) =
                self.step(&mut run, &mut messages, &grammars, tools_value.as_ref(), !specs.is_empty())?
            {
                break stop;
            }
        };
        if stop != StopReason::FinalAnswer {
            self.emit(AgentEvent::RunFailed { reason: stop.clone() });
        }
        let RunState { steps, mut stats, .. } = run;
        stats.decisions = steps.len();
        stats.seconds = t0.elapsed().as_secs_f64();
        let final_answer = match steps.last().map(|s| &s.decision) {
            Some(Decision::FinalAnswer { answer, .. }) if stop == StopReason::FinalAnswer => Some(answer.clone()),
            _ => None,
        };
        // The system prompt is the agent's, built again for every run.
        let kept = messages.into_iter().skip_while(|m| m.role == Role::System).collect();
        Ok((Transcript { task, steps, final_answer, stop_reason: stop, stats }, kept))
    }

    /// The system prompt (ReAct: the decision format and the tools; native: the chat template renders the
    /// tools, and the system prompt holds only what the caller gave) followed by the conversation's turns.
    fn opening_messages(&self, conversation: &[ChatMessage], specs: &[ToolSpec]) -> Vec<ChatMessage> {
        let mut system = match self.config.format {
            DecisionFormat::React => {
                decision::decision_instructions(specs, &self.config.tool_choice, &self.config.decision)
            }
            DecisionFormat::Native => String::new(),
        };
        let extra = self.config.system_prompt.iter().map(String::as_str);
        for text in extra.chain(conversation.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str())) {
            if !system.is_empty() {
                system.push('\n');
            }
            system.push_str(text);
        }
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(ChatMessage::system(system));
        }
        messages.extend(conversation.iter().filter(|m| m.role != Role::System).cloned());
        messages
    }

    /// One step: a decision (re-decided as an answer when its first call is ungrounded), then its calls.
    /// Returns the stop reason when the run ends here.
    fn step(
        &mut self,
        run: &mut RunState,
        messages: &mut Vec<ChatMessage>,
        grammars: &StepGrammars,
        tools: Option<&Value>,
        has_tools: bool,
    ) -> Result<Option<StopReason>> {
        let step_no = run.steps.len() + 1;
        let forced_call = (run.steps.is_empty() && run.first_call_required) || run.after_error;
        // The first step's calls, where the request named what they must be (a file to read).
        let first = run.first_need.take().filter(|_| run.steps.is_empty() && !run.force_answer);
        // After a failure that named the tools for the job: one of them, by grammar.
        let alternatives = std::mem::take(&mut run.alternatives);
        let first = first.or_else(|| {
            let specs: Vec<ToolSpec> =
                alternatives.iter().filter_map(|n| self.executor.tools().get(n).map(|t| t.spec().clone())).collect();
            let auto = self.config.tool_choice == ToolChoice::Auto;
            (auto && !run.force_answer && !specs.is_empty())
                .then(|| Need::new("the failed call's error names the tools for it", 0).calls(specs))
        });
        let first_grammar = first.as_ref().and_then(|n| self.need_grammar(n));
        // After a failed call whose error named no other tool: that tool again or an answer, not a tool
        // the request gave no reason for (live state: which call failed).
        let (retry_step, retry_call) = self.retry_grammars(run, forced_call, first_grammar.is_none());
        let retry_grammar = retry_step.as_ref().or(retry_call.as_ref().filter(|_| forced_call));
        // The first free choice between calling and answering, from the model's own call score.
        let free = run.steps.is_empty() && !forced_call && !run.force_answer && first_grammar.is_none() && has_tools;
        let mut branch = match grammars.native_branch.as_ref().filter(|_| free) {
            Some((grammar, tools)) => self.native_branch(run, grammar, tools)?,
            None => None,
        };
        // Where the call score chose to answer, the model's own reply is the step's decision.
        let own = match branch.as_mut().filter(|b| !b.call) {
            Some(b) => self.own_words(run, &mut b.stats)?,
            None => None,
        };
        let forced_after_error = std::mem::take(&mut run.after_error);
        let mut decided = match (own, &branch) {
            (Some(answer), Some(b)) => Decided {
                text: answer::answer_text(&answer),
                decision: Decision::FinalAnswer { thought: String::new(), answer },
                thinking: None,
                stats: b.stats.clone(),
                retries: 0,
                answer_pending: false,
                corrects_arithmetic: false,
            },
            _ => {
                let grammar = match (&first_grammar, &branch) {
                    (Some(g), _) => g,
                    (None, Some(b)) if b.call => grammars.pick(true, false),
                    (None, Some(_)) => &grammars.answer_only,
                    (None, None) => retry_grammar.unwrap_or_else(|| grammars.pick(forced_call, run.force_answer)),
                };
                // A step that must answer is not asked to call after a slip.
                let call_only = retry_call.as_ref().or(grammars.call_only.as_ref().filter(|_| !run.force_answer));
                let pending = call_only.and_then(|_| self.still_needed(run));
                // Where the answer would be replaced by the model's own reply, the decision stops at the
                // choice, unless an answer is checked against what the request still needs.
                let stop_at_answer = branch.is_none() && pending.is_none() && self.answers_in_own_words(run);
                let checks = Checks {
                    call_only,
                    slips: (self.config.check_arithmetic && !run.force_answer).then_some(&mut run.flagged_slips),
                    failures: &run.failures,
                    task: &run.task,
                    stop_at_answer,
                    pending,
                    raised: &mut run.pending_raised,
                };
                let mut decided = match self.attempt(step_no, messages, grammar, checks, tools, &mut run.stats)? {
                    Attempt::Decided(d) => *d,
                    Attempt::Stop(s) => return Ok(Some(s)),
                };
                if let Some(b) = &branch {
                    // The choice was the model's call score: its margin is the step's.
                    decided.stats.add_generation(&b.stats);
                    decided.stats.branch_margins = b.stats.branch_margins.clone();
                }
                decided
            }
        };
        // The first free choice between calling and answering: a call made of values the user never
        // wrote means no listed tool fits.
        let free_first = run.steps.is_empty() && !forced_call && !run.force_answer && has_tools;
        let evidence = Evidence::of(messages);
        let grounding =
            match (free_first && self.config.tool_choice == ToolChoice::Auto, decided.decision.calls().first()) {
                (true, Some(call)) => match self.executor.tools().get(&call.tool) {
                    Some(tool) => evidence.grounding_of_stated(call, &tool.spec().parameters),
                    None => evidence.grounding(call),
                },
                _ => None,
            };
        // The same choice from the model's scores: a call the request hardly made more likely.
        let measured = self.config.min_support.is_some() || self.config.min_tool_support.is_some();
        let scores = match free_first && self.config.tool_choice == ToolChoice::Auto && measured {
            true => self.first_call_scores(messages, tools, &decided.decision, &decided.text)?,
            false => support::CallScores::default(),
        };
        let support = support::support_of(&scores.values);
        let tool_support = scores.tool.as_ref().map(|t| t.with - t.without);
        // A tool the user named is not a guess: its values are derived, not made up.
        let named = |call: &ToolCall| {
            self.executor.tools().get(&call.tool).is_some_and(|t| evidence.names_tool(&call.tool, &t.spec().parameters))
        };
        let named = self.config.keep_named_tool_calls && decided.decision.calls().first().is_some_and(named);
        if let Some((g, threshold, measure)) =
            support::dropped_by(&self.config, grounding, named, support, tool_support)
        {
            let calls = decided.decision.calls();
            self.emit(AgentEvent::CallsDropped { step: step_no, calls, grounding: g, threshold, measure });
            match self.answer_instead(step_no, run, messages, grammars, tools, true)? {
                Attempt::Decided(answer) => decided = merge_redecided(decided, *answer),
                Attempt::Stop(s) => return Ok(Some(s)),
            }
        }
        // After abstention, which looks at the first call only: a dropped decision needs no more calls.
        let turns = Turns { messages, evidence };
        if let Some(more) = &grammars.more_calls {
            self.propose_more_calls(step_no, &turns, &mut decided, more, tools, &mut run.stats)?;
        }
        if self.config.format == DecisionFormat::Native {
            self.drop_unstated(&turns.evidence, &mut decided);
        }
        let Decided {
            mut decision,
            thinking,
            mut text,
            mut stats,
            mut retries,
            answer_pending,
            mut corrects_arithmetic,
        } = decided;
        // Not asked again where the call score chose the answer and the model's own reply failed (where it
        // chose a call that was then dropped, the reply is asked for the first time).
        if matches!(decision, Decision::FinalAnswer { .. }) && branch.as_ref().is_none_or(|b| b.call) {
            match self.own_words(run, &mut stats)? {
                // The conversation keeps the answer given.
                Some(own) => {
                    text = answer::answer_text(&own);
                    decision = Decision::FinalAnswer { thought: String::new(), answer: own };
                }
                // The decision stopped at its choice, and the reply failed: its answer is written after all.
                None if answer_pending => match self.answer_instead(step_no, run, messages, grammars, tools, true)? {
                    Attempt::Decided(d) => {
                        stats.add_generation(&d.stats);
                        (decision, text, retries) = (d.decision, d.text, retries + d.retries);
                        corrects_arithmetic = d.corrects_arithmetic;
                    }
                    Attempt::Stop(s) => return Ok(Some(s)),
                },
                None => {}
            }
        }
        self.emit(AgentEvent::DecisionExtracted {
            step: step_no,
            decision: decision.clone(),
            stats: stats.clone(),
            text: text.clone(),
            thinking: thinking.clone(),
        });
        // The conversation keeps the decision, not the thinking (as the thinking templates render turns).
        messages.push(self.kept_turn(&text, &decision));
        let step = Step {
            decision: decision.clone(),
            thinking,
            calls: Vec::new(),
            observation: None,
            retries,
            stats,
            grounding,
            support,
            support_values: scores.values,
            tool_support: scores.tool,
            corrects_arithmetic,
        };
        if let Decision::FinalAnswer { answer, .. } = &decision {
            self.emit(AgentEvent::FinalAnswer { step: step_no, answer: answer.clone() });
            run.steps.push(step);
            return Ok(Some(StopReason::FinalAnswer));
        }
        self.finish_step(step_no, step, run, messages, forced_after_error, &[]);
        Ok(None)
    }

    /// Runs a decided step's calls (`known`: see [`Self::run_calls`]), adds their observations to the
    /// conversation (whose last turn is the decision), records the step and says it is complete.
    fn finish_step(
        &mut self,
        step_no: usize,
        mut step: Step,
        run: &mut RunState,
        messages: &mut Vec<ChatMessage>,
        forced_after_error: bool,
        known: &[(ToolCall, Option<CallOutcome>)],
    ) {
        let decision = step.decision.clone();
        let held_all = self.run_calls(step_no, &decision, &mut step, run, forced_after_error, known);
        self.answer_after_correction(&step, run);
        if held_all {
            // Every call was held: the model never sees them (it would make them again, or give the reason
            // as its answer) and answers from what it had (the transcript keeps the step).
            messages.pop();
        } else {
            messages.extend(self.observation_messages(&mut step));
        }
        self.emit(AgentEvent::StepCompleted { step: step_no, record: step.clone() });
        run.steps.push(step);
    }

    /// After a call made instead of an answer whose arithmetic was wrong, and that succeeded, the next
    /// decision answers (under `auto`): the model had its answer but for the sum, which the call now
    /// gives; left free it goes on calling (a small model reads the file again, asks the time, searches).
    fn answer_after_correction(&self, step: &Step, run: &mut RunState) {
        let ok = !step.calls.is_empty() && step.calls.iter().all(|c| c.outcome.is_ok());
        // Unless the request still needs a call (a file it names that no call has read): that decision is
        // left free, and an answer before it is sent back for it.
        if step.corrects_arithmetic
            && ok
            && self.config.tool_choice == ToolChoice::Auto
            && self.still_needed(run).is_none()
        {
            run.force_answer = true;
        }
    }

    /// A step of an earlier, interrupted run, from its trace: the decision is not made again, and the calls
    /// whose outcomes were recorded are not run again. Returns the stop reason when the run ends here.
    fn replay_step(
        &mut self,
        run: &mut RunState,
        messages: &mut Vec<ChatMessage>,
        rec: RecordedStep,
    ) -> Option<StopReason> {
        let step_no = run.steps.len() + 1;
        run.first_need = None;
        let forced_after_error = std::mem::take(&mut run.after_error);
        messages.push(self.kept_turn(&rec.text, &rec.decision));
        if let Some(mut record) = rec.record {
            // Complete: the conversation and the run's bookkeeping as they were, nothing run.
            let known: Vec<(ToolCall, Option<CallOutcome>)> =
                record.calls.iter().map(|c| (c.call.clone(), Some(c.outcome.clone()))).collect();
            let held_all = !record.calls.is_empty() && record.observation.is_none();
            let mut step = Step { calls: Vec::new(), ..record.clone() };
            self.run_calls(step_no, &record.decision, &mut step, run, forced_after_error, &known);
            self.answer_after_correction(&step, run);
            if held_all {
                messages.pop();
                run.force_answer = self.config.tool_choice == ToolChoice::Auto;
            } else {
                messages.extend(self.observation_messages(&mut record));
            }
            run.steps.push(record);
            return None;
        }
        let step = Step {
            decision: rec.decision.clone(),
            thinking: None,
            calls: Vec::new(),
            observation: None,
            retries: 0,
            stats: DecisionStats::default(),
            grounding: None,
            support: None,
            support_values: Vec::new(),
            tool_support: None,
            // Not in the trace of a step the run stopped inside: the next decision is free.
            corrects_arithmetic: false,
        };
        if let Decision::FinalAnswer { answer, .. } = &rec.decision {
            self.emit(AgentEvent::FinalAnswer { step: step_no, answer: answer.clone() });
            run.steps.push(step);
            return Some(StopReason::FinalAnswer);
        }
        self.finish_step(step_no, step, run, messages, forced_after_error, &rec.started);
        None
    }

    /// The step decided again as an answer, its last decision forgotten: after a first call that was
    /// dropped, or after a decision that stopped at its choice to answer and whose reply failed. An
    /// answer that repeats a tool's error is sent back; where `arithmetic`, so is one whose arithmetic is
    /// wrong, as the call that computes it (the reply that failed for a wrong sum is mostly followed by
    /// an answer that writes another; a dropped call's answer "8080 + 42000 EUR = 42800 EUR" is the
    /// model's own expression, which the calculator then computes).
    fn answer_instead(
        &mut self,
        step: usize,
        run: &mut RunState,
        messages: &mut [ChatMessage],
        grammars: &StepGrammars,
        tools: Option<&Value>,
        arithmetic: bool,
    ) -> Result<Attempt> {
        self.driver.rollback();
        let checked = arithmetic && self.config.check_arithmetic && !run.force_answer;
        let checks = Checks {
            call_only: grammars.call_only.as_ref().filter(|_| checked),
            slips: checked.then_some(&mut run.flagged_slips),
            failures: &run.failures,
            task: &run.task,
            pending: None,
            raised: &mut run.pending_raised,
            stop_at_answer: false,
        };
        self.attempt(step, messages, &grammars.answer_only, checks, tools, &mut run.stats)
    }
}

/// A step's conversation and what its user and tool turns say (read once per step).
struct Turns<'a> {
    messages: &'a [ChatMessage],
    evidence: Evidence,
}

/// A step whose first decision was dropped as ungrounded and decided again: the second decision, with the
/// figures of both generations (its branch margins are the first's, where the choice was made).
fn merge_redecided(first: Decided, mut second: Decided) -> Decided {
    second.stats.add_generation(&first.stats);
    second.stats.branch_margins = first.stats.branch_margins;
    second.retries += first.retries;
    second
}
