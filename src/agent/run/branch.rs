//! The first choice between calling and answering from the model's own score
//! ([`AgentConfig::native_branch`](crate::agent::AgentConfig)): its margin for starting a call in its own
//! call syntax, with the tools its chat template renders, where its reply to the request begins.

use super::RunState;
use crate::agent::decision::{BranchBiases, DecisionFormat};
use crate::agent::driver::DecisionRequest;
use crate::agent::events::DecisionStats;
use crate::agent::Agent;
use crate::decode::constraint::Grammar;
use crate::error::Result;
use serde_json::Value;

/// What the model's call score chose, and the figures of scoring.
pub(super) struct Branch {
    pub(super) call: bool,
    /// The scoring's tokens and time, with its margin as the step's `call` margin.
    pub(super) stats: DecisionStats,
}

impl Agent {
    /// Scores the request under `grammar` (a native decision's under `auto`): a call where the margin plus
    /// the call bias is above 0. `None` where the driver cannot score.
    pub(super) fn native_branch(
        &mut self,
        run: &mut RunState,
        grammar: &Grammar,
        tools: &Value,
    ) -> Result<Option<Branch>> {
        // Scored on the request as a plain chat, which a conversation with calls in it no longer is.
        if super::answer::called_in(&run.request) {
            return Ok(None);
        }
        let messages = self.plain_turns(run);
        let req = DecisionRequest {
            messages: &messages,
            grammar,
            tools: Some(tools),
            format: DecisionFormat::Native,
            biases: BranchBiases::default(),
            max_tokens: 1,
            attempt: 0,
            think_budget: 0,
            stop_at_answer: false,
        };
        let Some((margin, stats)) = self.driver.call_margin(&req)? else { return Ok(None) };
        run.stats.count(&stats);
        Ok(Some(Branch { call: margin + self.config.branch_biases.call > 0.0, stats }))
    }
}
