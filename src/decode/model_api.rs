//! The one way to generate with a loaded [`Model`]: an [`Input`] (raw text, chat messages or tokens, and
//! optionally a grammar) and [`GenerateParams`]; the tokenizer and stop tokens come from the model itself.
//! [`super::generate::generate`] remains for callers that keep a KV prefix or a [`Constraint`] of their
//! own.

use super::constraint::{Constraint, Grammar, GrammarEngine};
use super::generate::{generate, GenerateParams, Generation, Request};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::text::chat::ChatMessage;
use crate::text::Model;

/// What [`Model::generate`] starts from.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Input<'a> {
    pub prompt: Source<'a>,
    /// The output follows this grammar (a JSON schema, Lark grammar or regex): it ends when the grammar
    /// is complete, and parses by construction.
    pub grammar: Option<&'a Grammar>,
}

/// The prompt of an [`Input`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Source<'a> {
    /// Raw text, continued (the model's BOS token first where it wants one).
    Text(&'a str),
    /// A conversation, rendered with the model's chat template and the prompt of an assistant turn.
    Chat(&'a [ChatMessage]),
    /// Token ids as they are.
    Tokens(&'a [u32]),
}

impl<'a> Input<'a> {
    pub fn text(text: &'a str) -> Self {
        Self { prompt: Source::Text(text), grammar: None }
    }
    pub fn chat(messages: &'a [ChatMessage]) -> Self {
        Self { prompt: Source::Chat(messages), grammar: None }
    }
    pub fn tokens(ids: &'a [u32]) -> Self {
        Self { prompt: Source::Tokens(ids), grammar: None }
    }
    /// Constrains the output by `grammar`.
    #[must_use]
    pub fn grammar(mut self, grammar: &'a Grammar) -> Self {
        self.grammar = Some(grammar);
        self
    }
}

impl<'a> From<&'a str> for Input<'a> {
    fn from(text: &'a str) -> Self {
        Self::text(text)
    }
}

impl<'a> From<&'a [ChatMessage]> for Input<'a> {
    fn from(messages: &'a [ChatMessage]) -> Self {
        Self::chat(messages)
    }
}

impl<'a, const N: usize> From<&'a [ChatMessage; N]> for Input<'a> {
    fn from(messages: &'a [ChatMessage; N]) -> Self {
        Self::chat(messages)
    }
}

impl<'a> From<&'a Vec<ChatMessage>> for Input<'a> {
    fn from(messages: &'a Vec<ChatMessage>) -> Self {
        Self::chat(messages)
    }
}

impl Model {
    /// Generates from `input` on a fresh cache, handing text to `on_text` as soon as it is final:
    ///
    /// ```no_run
    /// # fn f(model: &mut reagent::Model, schema: serde_json::Value) -> reagent::Result<()> {
    /// use reagent::{ChatMessage, GenerateParams, Grammar, Input};
    /// let question = [ChatMessage::user("What is the capital of France?")];
    /// let answer = model.generate(&question, &GenerateParams::default(), &mut |t| print!("{t}"))?;
    /// let json = Grammar::JsonSchema(schema);
    /// let city = model.generate(Input::chat(&question).grammar(&json), &GenerateParams::default(), &mut |_| {})?;
    /// # Ok(()) }
    /// ```
    ///
    /// Under a grammar, the grammar engine is built for this model each call (0.1–0.5 s); to make many,
    /// keep a [`GrammarEngine`] and call [`generate`](super::generate::generate) with its constraints.
    pub fn generate<'a>(
        &mut self,
        input: impl Into<Input<'a>>,
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let input = input.into();
        let tok = self.tokenizer().clone();
        let ids = match input.prompt {
            Source::Text(text) => {
                let mut ids: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { Vec::new() };
                ids.extend(tok.encode(text, false)?);
                ids
            }
            Source::Chat(messages) => self.chat_template().render_tokens(&tok, messages, true, None)?,
            Source::Tokens(ids) => ids.to_vec(),
        };
        if ids.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let mut constraint: Option<Constraint> = match input.grammar {
            Some(g) => Some(GrammarEngine::new(tok.clone(), self.vocab_size(), self.stop_tokens())?.constraint(g)?),
            None => None,
        };
        let stops = self.stop_tokens().to_vec();
        let request = Request::new(&ids).stop_tokens(&stops).constraint(constraint.as_mut());
        generate(self, &tok, request, params, on_text)
    }
}
