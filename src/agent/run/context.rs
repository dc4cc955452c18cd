//! Fitting a step's prompt to the context: room for the decision, and the oldest observations shortened
//! first.

use serde_json::Value;

use super::StopReason;
use crate::agent::Agent;
use crate::error::Result;
use crate::text::chat::{ChatMessage, Role};

impl Agent {
    /// Makes the request fit the context with room for a decision: shortens the oldest observations
    /// first (in the kept conversation too); `Some(stop)` when even that is not enough.
    pub(super) fn fit_context(
        &mut self,
        kept: &mut [ChatMessage],
        request: &mut [ChatMessage],
        tools: Option<&Value>,
    ) -> Result<Option<StopReason>> {
        const SHORT: usize = 200;
        loop {
            let Some((needed, capacity)) = self.driver.measure(request, tools)? else { return Ok(None) };
            let needed = needed + self.decision_room();
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

    /// Tokens a decision may add after its prompt: its own limit, and its thinking with the markers around
    /// it.
    pub(super) fn decision_room(&self) -> usize {
        let thinking = match self.config.think_budget {
            0 => 0,
            n => n.saturating_add(8),
        };
        self.config.max_decision_tokens.saturating_add(thinking)
    }
}
