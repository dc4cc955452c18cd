//! The short way to generate with a loaded [`Model`]: a prompt (raw text or chat messages) and params,
//! optionally a grammar, the tokenizer and stop tokens taken from the model itself. The free functions in
//! [`super::generate`] remain for callers that bring their own tokens or keep a KV prefix.

use super::constraint::{Grammar, GrammarEngine};
use super::generate::{generate_with, GenerateParams, Generation};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::text::chat::ChatMessage;
use crate::text::Model;

impl Model {
    /// Continues `prompt`, raw text (the model's BOS token first where it wants one), on a fresh cache.
    pub fn generate(&mut self, prompt: &str, params: &GenerateParams) -> Result<Generation> {
        self.generate_streaming(prompt, params, &mut |_| {})
    }

    /// [`generate`](Self::generate), handing text to `on_text` as soon as it is final.
    pub fn generate_streaming(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let tok = self.tokenizer().clone();
        let mut ids: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { Vec::new() };
        ids.extend(tok.encode(prompt, false)?);
        self.run(&ids, params, None, on_text)
    }

    /// Answers a conversation: `messages` rendered with the model's chat template (and the prompt of an
    /// assistant turn), the reply streamed to `on_text`.
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let ids = self.chat_template().render_tokens(self.tokenizer(), messages, true, None)?;
        self.run(&ids, params, None, on_text)
    }

    /// [`chat`](Self::chat) with the reply constrained by `grammar` (a JSON schema, Lark grammar or
    /// regex): it ends when the grammar is complete, and parses by construction. Builds the grammar
    /// engine for this model each time (0.1–0.5 s); keep a [`GrammarEngine`] to make many.
    pub fn chat_constrained(
        &mut self,
        messages: &[ChatMessage],
        grammar: &Grammar,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let engine = GrammarEngine::new(self.tokenizer().clone(), self.vocab_size(), self.stop_tokens())?;
        let mut constraint = engine.constraint(grammar)?;
        let ids = self.chat_template().render_tokens(self.tokenizer(), messages, true, None)?;
        self.run(&ids, params, Some(&mut constraint), on_text)
    }

    fn run(
        &mut self,
        ids: &[u32],
        params: &GenerateParams,
        constraint: Option<&mut super::constraint::Constraint>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        if ids.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let tok = self.tokenizer().clone();
        let stops = self.stop_tokens().to_vec();
        generate_with(self, &tok, &stops, ids, params, constraint, on_text)
    }
}
