//! The native format's extra calls: one more proposed after a decision's calls, kept when the request
//! asked for it; calls and optional arguments the conversation does not state left out.

use serde_json::Value;

use super::{Decided, Turns};
use crate::agent::decision::{Decision, DecisionFormat};
use crate::agent::driver::DecisionRequest;
use crate::agent::events::{AgentEvent, RunStats};
use crate::agent::grounding::Evidence;
use crate::agent::native;
use crate::agent::Agent;
use crate::decode::constraint::Grammar;
use crate::error::Result;

impl Agent {
    /// Proposes one more call after the decision's calls (the driver continues the reply under `grammar`)
    /// and keeps it while it is a new item the request asked for, up to the parallel-call limit. The
    /// proposals' tokens count in the step's figures.
    pub(super) fn propose_more_calls(
        &mut self,
        step: usize,
        turns: &Turns,
        decided: &mut Decided,
        grammar: &Grammar,
        tools: Option<&Value>,
        run_stats: &mut RunStats,
    ) -> Result<()> {
        let limit = self.config.decision.parallel_calls.unwrap_or(1);
        let mut calls = decided.decision.calls();
        while !calls.is_empty() && calls.len() < limit {
            let req = DecisionRequest {
                messages: turns.messages,
                grammar,
                tools,
                format: DecisionFormat::Native,
                biases: self.config.branch_biases,
                max_tokens: self.config.max_decision_tokens,
                attempt: 0,
                think_budget: 0,
                stop_at_answer: false,
            };
            let Some(out) = self.driver.extend(&req)? else { break };
            decided.stats.add_generation(&out.stats);
            run_stats.generated_tokens += out.stats.generated_tokens;
            run_stats.reused_tokens += out.stats.reused_tokens;
            let proposed = match native::parse_native(out.text.trim(), &self.syntax) {
                Ok(d) if out.complete => d.calls(),
                _ => break,
            };
            let [call] = proposed.as_slice() else { break };
            let kept = self.check_call(call).is_ok()
                && self.executor.tools().get(&call.tool).is_some_and(|tool| {
                    let schema = self.config.drop_unstated_options.then_some(&tool.spec().parameters);
                    turns.evidence.is_new_requested_item(call, &calls, schema)
                });
            self.emit(AgentEvent::CallProposed { step, call: call.clone(), kept });
            if !kept {
                break;
            }
            calls.push(call.clone());
            decided.text.push_str(&out.text);
        }
        if calls.len() > decided.decision.calls().len() {
            decided.decision = Decision::from_calls(decided.decision.thought().to_string(), calls);
        }
        Ok(())
    }

    /// Leaves out of the decision's calls the optional arguments the conversation does not state, then
    /// the later calls it does not state (as the settings say); the reply kept in the conversation then
    /// shows the calls as they are made.
    pub(super) fn drop_unstated(&self, evidence: &Evidence, decided: &mut Decided) {
        let mut calls = decided.decision.calls();
        let mut dropped = false;
        if self.config.drop_unstated_options {
            for call in &mut calls {
                if let Some(tool) = self.executor.tools().get(&call.tool) {
                    dropped |= evidence.drop_unstated_options(call, &tool.spec().parameters);
                }
            }
        }
        if self.config.drop_unstated_calls {
            dropped |= evidence.drop_unstated_calls(&mut calls);
        }
        if dropped {
            decided.text = self.syntax.render(&calls);
            decided.decision = Decision::from_calls(decided.decision.thought().to_string(), calls);
        }
    }
}
