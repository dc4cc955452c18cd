//! [`ScriptedDriver`]: decisions replayed in order, with no model (for tests, reagent's and users').

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::{DecisionRequest, Driver, DriverOutput};
use crate::agent::events::DecisionStats;
use crate::error::{Error, Result};
use crate::text::chat::ChatMessage;

/// One scripted reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptItem {
    /// A reply that ended normally (it may still be invalid: that is for the agent to find).
    Reply(String),
    /// A reply cut off before it was complete (as by a token limit).
    CutOff(String),
    /// The continuation of the decision before it, when the agent proposes one more call
    /// ([`Driver::extend`]); it is not a decision of its own.
    More(String),
    /// The model's own reply in words ([`Driver::answer`]), given where the agent asks for one; a
    /// driver holding such items also stops an answer at its choice where asked
    /// ([`DecisionRequest::stop_at_answer`]), as the model's driver does.
    Words(String),
}

impl<S: Into<String>> From<S> for ScriptItem {
    fn from(s: S) -> Self {
        ScriptItem::Reply(s.into())
    }
}

/// Replays decisions in order, with no model.
pub struct ScriptedDriver {
    items: VecDeque<ScriptItem>,
    context: Option<usize>,
    seen: Arc<Mutex<Vec<Vec<ChatMessage>>>>,
}

impl ScriptedDriver {
    /// Replays `items`; running out is a driver error.
    pub fn new(items: impl IntoIterator<Item = impl Into<ScriptItem>>) -> Self {
        Self { items: items.into_iter().map(Into::into).collect(), context: None, seen: Arc::default() }
    }

    /// Pretends to have a context window of `bytes` (one token per byte of message content), so context
    /// management can be tested without a model.
    pub fn with_context(mut self, bytes: usize) -> Self {
        self.context = Some(bytes);
        self
    }

    /// The conversations the driver was asked to continue, in order (a handle that stays valid after
    /// the driver is moved into an agent).
    pub fn log(&self) -> Arc<Mutex<Vec<Vec<ChatMessage>>>> {
        self.seen.clone()
    }
}

impl Driver for ScriptedDriver {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn decide(&mut self, req: &DecisionRequest<'_>) -> Result<DriverOutput> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(req.messages.to_vec());
        // Continuations and replies in words the agent did not ask for are skipped.
        while matches!(self.items.front(), Some(ScriptItem::More(_) | ScriptItem::Words(_))) {
            self.items.pop_front();
        }
        let item = self.items.pop_front().ok_or_else(|| Error::param("scripted driver", "no decisions left"))?;
        let (mut text, complete) = match item {
            ScriptItem::Reply(t) | ScriptItem::More(t) | ScriptItem::Words(t) => (t, true),
            ScriptItem::CutOff(t) => (t, false),
        };
        let prompt_tokens = req.messages.iter().map(|m| m.content.len()).sum();
        let stats = DecisionStats { prompt_tokens, generated_tokens: text.len(), ..DecisionStats::default() };
        // A script with replies in words stops an answer where it chose to answer, as a model's driver.
        let has_words = self.items.iter().any(|i| matches!(i, ScriptItem::Words(_)));
        let cut = text.find(super::ANSWER_CHOSEN).filter(|_| req.stop_at_answer && complete && has_words);
        if let Some(at) = cut {
            text.truncate(at);
        }
        Ok(DriverOutput { text, thinking: None, complete, stats, answer_pending: cut.is_some() })
    }

    fn answer(
        &mut self,
        _messages: &[ChatMessage],
        _max_tokens: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<DriverOutput>> {
        let Some(ScriptItem::Words(text)) = self.items.front().cloned() else { return Ok(None) };
        self.items.pop_front();
        on_text(&text);
        let stats = DecisionStats { generated_tokens: text.len(), ..DecisionStats::default() };
        Ok(Some(DriverOutput::new(text, true, stats)))
    }

    fn extend(&mut self, _req: &DecisionRequest<'_>) -> Result<Option<DriverOutput>> {
        let Some(ScriptItem::More(text)) = self.items.front().cloned() else { return Ok(None) };
        self.items.pop_front();
        let stats = DecisionStats { generated_tokens: text.len(), ..DecisionStats::default() };
        Ok(Some(DriverOutput { text, thinking: None, complete: true, stats, answer_pending: false }))
    }

    fn measure(&mut self, messages: &[ChatMessage], _tools: Option<&Value>) -> Result<Option<(usize, usize)>> {
        Ok(self.context.map(|c| (messages.iter().map(|m| m.content.len()).sum(), c)))
    }
}
