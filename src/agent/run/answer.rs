//! The answer in the model's own words: once a decision chose to answer before any call, its reply as a
//! plain chat turn.

use super::checks::copied_failure;
use super::{Decision, DecisionFormat, RunState};
use crate::agent::events::DecisionStats;
use crate::agent::Agent;
use crate::error::Result;
use crate::text::chat::{ChatMessage, Role};

/// The system turn of an answer in the model's own words where the caller gave none. A template's own
/// default can be a narrow role: Qwen 2.5 Coder's refuses "who painted the Mona Lisa?" under it, and
/// answers under this one.
const ANSWER_SYSTEM: &str = "You are a helpful assistant.";

impl Agent {
    /// The answer in the model's own words ([`AgentConfig::answer_in_own_words`](crate::agent::AgentConfig)):
    /// where no call has run in the conversation, the model's reply to it as a plain chat turn; `None`
    /// where the decision's text stays the answer (after calls it is grounded in their results, written
    /// where they are in view). The reply's tokens and time join the step's `stats`.
    pub(super) fn own_words(&mut self, run: &RunState, stats: &mut DecisionStats) -> Result<Option<String>> {
        let called = run.steps.iter().any(|s| !s.calls.is_empty())
            || run.request.iter().any(|m| m.role == Role::Tool || !m.tool_calls.is_empty());
        if !self.config.answer_in_own_words || self.config.format != DecisionFormat::React || called {
            return Ok(None);
        }
        let given = self.config.system_prompt.iter().map(String::as_str);
        let given: Vec<&str> =
            given.chain(run.request.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str())).collect();
        let system = if given.is_empty() { ANSWER_SYSTEM.to_string() } else { given.join("\n") };
        let mut messages = vec![ChatMessage::system(system)];
        messages.extend(run.request.iter().filter(|m| m.role != Role::System).cloned());
        let Some(out) = self.driver.answer(&messages, self.config.answer_tokens)? else { return Ok(None) };
        stats.generated_tokens += out.stats.generated_tokens;
        stats.prompt_tokens += out.stats.prompt_tokens;
        stats.reused_tokens += out.stats.reused_tokens;
        stats.seconds += out.stats.seconds;
        let text = out.text.trim();
        let own = Decision::FinalAnswer { thought: String::new(), answer: text.to_string() };
        if text.is_empty() || !out.complete || copied_failure(&own, &run.failures).is_some() {
            return Ok(None);
        }
        Ok(Some(text.to_string()))
    }
}
