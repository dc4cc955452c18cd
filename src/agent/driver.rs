//! Drivers produce one decision's text from the conversation: [`ModelDriver`] with the decision grammar
//! (constrained, the default) or without it (free-form, the JSON extracted from the text), and
//! [`ScriptedDriver`], which replays given decisions with no model (for tests, reagent's and users').

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::decision::{BranchBiases, DecisionFormat};
use super::events::DecisionStats;
use super::native::{CallSyntax, NativeTokens};
use super::recent::RecentPrefixes;
use crate::decode::constraint::{Allowed, BranchBias, BranchPoint, Constraint, Grammar, GrammarEngine};
use crate::decode::generate::{generate, FinishReason, GenerateParams, Generation, Request};
use crate::decode::sampler::Sampling;
use crate::error::{Error, Result};
use crate::model::prompt_cache::PromptCache;
use crate::model::LanguageModel;
use crate::text::chat::{ChatMessage, Role};
use crate::text::Model;

mod extract;
mod prefix;
mod remote;
mod scripted;
mod thinking;

pub use extract::extract_json;
pub use remote::{gbnf, RemoteConstraint, RemoteDriver};
pub use scripted::{ScriptItem, ScriptedDriver};

/// What a driver is asked for.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DecisionRequest<'a> {
    pub messages: &'a [ChatMessage],
    /// The decision grammar for this step's tool choice (a JSON schema for ReAct, Lark for native).
    pub grammar: &'a Grammar,
    /// The tools, for the chat template to render (native format).
    pub tools: Option<&'a Value>,
    pub format: DecisionFormat,
    /// Thresholds at the decision's branches.
    pub biases: BranchBiases,
    pub max_tokens: usize,
    /// 0 for the first attempt at a step, then 1, 2, … for retries.
    pub attempt: usize,
    /// Tokens of free thinking before the decision ([`AgentConfig::think_budget`](super::AgentConfig)).
    pub think_budget: usize,
    /// A ReAct decision may end where it chose to answer, before writing the answer (its text then stops
    /// before `"type":"final_answer"` and [`DriverOutput::answer_pending`] is set): the answer is to be
    /// the model's own reply ([`AgentConfig::answer_in_own_words`](super::AgentConfig)), which then
    /// starts without waiting for an answer that would be dropped. A driver may ignore it.
    pub stop_at_answer: bool,
}

/// Where a ReAct decision that chose to answer ends under [`DecisionRequest::stop_at_answer`].
pub(crate) const ANSWER_CHOSEN: &str = r#""type":"final_answer""#;

/// A driver's output: the text, and whether generation ended on a complete decision.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DriverOutput {
    pub text: String,
    /// The thinking before the decision, when there was some (never part of `text`).
    pub thinking: Option<String>,
    /// False when generation stopped early (token limit, context end) or, under a grammar, before the
    /// grammar was complete.
    pub complete: bool,
    pub stats: DecisionStats,
    /// The decision stopped where it chose to answer ([`DecisionRequest::stop_at_answer`]); `text` is
    /// what came before.
    pub answer_pending: bool,
}

impl DriverOutput {
    /// What a [`Driver`] of one's own returns: the decision's text, whether it is complete, and its stats.
    pub fn new(text: String, complete: bool, stats: DecisionStats) -> Self {
        Self { text, thinking: None, complete, stats, answer_pending: false }
    }
}

/// Produces decisions.
pub trait Driver: Send {
    /// `constrained`, `free-form` or `scripted`.
    fn name(&self) -> &'static str;
    /// Generates the next decision's text.
    fn decide(&mut self, req: &DecisionRequest<'_>) -> Result<DriverOutput>;
    /// Continues the last decision, from where it ended, under `req.grammar` (one more call: see
    /// [`native_extension_grammar`](super::native::native_extension_grammar)); the continuation's text.
    /// `None` when the driver cannot (the default; a scripted driver replays [`ScriptItem::More`]).
    fn extend(&mut self, _req: &DecisionRequest<'_>) -> Result<Option<DriverOutput>> {
        Ok(None)
    }
    /// The model's own reply to `messages` as free text: the chat template with no tools and no grammar,
    /// at most `max_tokens` tokens, ended by the model (an answer in its own words once a decision chose
    /// to answer), each piece of its text given to `on_text` as it is generated. `None` where the driver
    /// cannot (the default).
    fn answer(
        &mut self,
        _messages: &[ChatMessage],
        _max_tokens: usize,
        _on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<DriverOutput>> {
        Ok(None)
    }
    /// The model's score for calling a tool at the start of its reply to `req.messages` in its own call
    /// syntax (`req`: a native request under `req.grammar`, the tools rendered by the template): the
    /// margin of the best call-starting token over the best other one, before any bias, and the figures
    /// of computing it. `None` where the driver cannot score (the default; a driver with no grammar or a
    /// template with no call syntax). [`AgentConfig::native_branch`](super::AgentConfig) chooses with it.
    fn call_margin(&mut self, _req: &DecisionRequest<'_>) -> Result<Option<(f32, DecisionStats)>> {
        Ok(None)
    }
    /// The log-probability of each token of `text` as the model's reply to `messages` (the tools
    /// rendered as for a decision), unconstrained: `None` where the driver cannot score (the default).
    fn score(
        &mut self,
        _messages: &[ChatMessage],
        _tools: Option<&Value>,
        _text: &str,
    ) -> Result<Option<Vec<(String, f32)>>> {
        Ok(None)
    }
    /// Forgets the last decision's tokens (after a failed attempt), so the retry starts from its prompt.
    fn rollback(&mut self) {}
    /// The chat role observations are sent with: `tool` where the model's template has a tool turn
    /// (Qwen's wraps it in `<tool_response>`), else `user`.
    fn observation_role(&self) -> Role {
        Role::User
    }
    /// Tokens `messages` (and `tools`, rendered by the template) take as a prompt, and the context
    /// capacity; `None` when unbounded.
    fn measure(&mut self, _messages: &[ChatMessage], _tools: Option<&Value>) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }
    /// The model's own call syntax, for decisions in the native format: read from its chat template
    /// ([`CallSyntax::of`]); `None` when the template neither renders nor describes calls. Qwen 2.5's
    /// by default.
    fn call_syntax(&self) -> Option<CallSyntax> {
        Some(CallSyntax::hermes())
    }
    /// Whether decisions can be made in the native format ([`call_syntax`](Self::call_syntax)).
    fn supports_native(&self) -> bool {
        self.call_syntax().is_some()
    }
    /// Whether decisions can think first ([`DecisionRequest::think_budget`]): the model's template has a
    /// thinking section.
    fn supports_thinking(&self) -> bool {
        false
    }
    /// The fewest tokens `bytes` of text can take, and the context capacity, without tokenizing it (text
    /// far over the context is refused before it is tokenized); `None` when unbounded.
    fn prompt_bound(&mut self, _bytes: usize) -> Option<(usize, usize)> {
        None
    }
    /// Forgets what the driver keeps between decisions (a model's KV cache), so that the next decision
    /// is computed as if it were the first.
    fn forget(&mut self) {}
    /// Starts the sampling seed over; called at the start of each run, so that a run's sampled retries
    /// are the same whatever ran on the driver before it (an eval's earlier tasks, a server's earlier
    /// requests, a resumed eval's missing ones).
    fn reseed(&mut self) {}
    /// Whether the driver can decode under `grammar` (a constrained driver compiles it); drivers that
    /// apply no grammar accept any.
    fn check_grammar(&self, _grammar: &Grammar) -> Result<()> {
        Ok(())
    }
    /// The catalog entry of the driver's model, whose decision settings an agent built without an
    /// explicit configuration takes ([`AgentBuilder`](super::AgentBuilder)).
    fn catalog_entry(&self) -> Option<crate::catalog::CatalogEntry> {
        None
    }
}

/// What [`ModelDriver::with_recent_prefixes`] keeps where reagent keeps copies of the KV cache (an agent
/// built on a model, `reagent chat`, `reagent serve`): the system prompt of a 1.5B model takes ~60 MB.
pub const RECENT_PREFIX_BYTES: usize = 256 << 20;

/// A model, constrained by the decision grammar or free.
pub struct ModelDriver {
    model: Model,
    engine: Option<Arc<GrammarEngine>>,
    sampling: Sampling,
    seed: u64,
    /// The seed given, which [`Driver::reseed`] restores.
    first_seed: u64,
    /// Tokens in the model's KV cache: the last prompt and decision.
    cached: Vec<u32>,
    prompt_len: usize,
    reuse_prefix: bool,
    /// [`GenerateParams::speculate`] of every generation.
    speculate: usize,
    /// The model's call syntax (a probe of its template, done once).
    call_syntax: std::sync::OnceLock<Option<CallSyntax>>,
    /// The native format's branch tokens (a vocabulary scan, done once).
    native_tokens: std::sync::OnceLock<Option<NativeTokens>>,
    /// The tokens that start a ReAct decision's `type`: a call's, an answer's (a vocabulary scan, done once).
    react_tokens: std::sync::OnceLock<ReactTokens>,
    /// The most bytes of text one token stands for (a vocabulary scan, done once).
    longest_token: std::sync::OnceLock<usize>,
    /// Where prompt prefixes are saved and loaded across processes (off unless asked for).
    prompt_cache: Option<PromptCache>,
    /// The system turn's tokens last saved or found saved (not looked up again).
    saved_system: Vec<u32>,
    /// Copies of the KV of recent conversations (off unless asked for).
    recent: Option<RecentPrefixes>,
    /// The last decision thought first: prompts render with the template's thinking on.
    thinking: bool,
}

impl ModelDriver {
    /// Constrained decoding (builds the grammar engine: ~0.1–0.5 s once per model).
    pub fn constrained(model: Model, sampling: Sampling, seed: u64) -> Result<Self> {
        let engine = GrammarEngine::new(model.tokenizer().clone(), model.vocab_size(), model.stop_tokens())?;
        Ok(Self::new(model, Some(Arc::new(engine)), sampling, seed))
    }

    /// Free-form generation; the decision is extracted from the text.
    pub fn free_form(model: Model, sampling: Sampling, seed: u64) -> Self {
        Self::new(model, None, sampling, seed)
    }

    fn new(model: Model, engine: Option<Arc<GrammarEngine>>, sampling: Sampling, seed: u64) -> Self {
        Self {
            model,
            engine,
            sampling,
            seed,
            first_seed: seed,
            cached: Vec::new(),
            prompt_len: 0,
            reuse_prefix: true,
            speculate: crate::decode::generate::SPECULATE,
            call_syntax: Default::default(),
            native_tokens: Default::default(),
            react_tokens: Default::default(),
            longest_token: Default::default(),
            prompt_cache: None,
            saved_system: Vec::new(),
            recent: None,
            thinking: false,
        }
    }

    /// Recompute every prompt from scratch instead of reusing the KV cache of the previous step (to
    /// measure what reuse saves).
    pub fn without_prefix_reuse(mut self) -> Self {
        self.reuse_prefix = false;
        self
    }

    /// Decode one token at a time, without drafts from the context ([`GenerateParams::speculate`]): the
    /// same decisions, slower where they copy (to measure what speculation saves).
    pub fn without_speculation(mut self) -> Self {
        self.speculate = 0;
        self
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model, to generate with directly; [`Driver::forget`] afterwards, since the KV cache no longer
    /// holds what the driver last put there.
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// The grammar engine of a constrained driver.
    pub fn engine(&self) -> Option<&Arc<GrammarEngine>> {
        self.engine.as_ref()
    }

    /// The tokens of the last prompt (for inspection and tests).
    pub fn last_prompt(&self) -> &[u32] {
        &self.cached[..self.prompt_len.min(self.cached.len())]
    }

    fn longest_token_bytes(&self) -> usize {
        *self.longest_token.get_or_init(|| {
            let tok = self.model.tokenizer();
            (0..tok.vocab_size() as u32).map(|id| tok.token_bytes(id).len()).max().unwrap_or(1).max(1)
        })
    }

    fn tokens(&self, messages: &[ChatMessage], tools: Option<&Value>) -> Result<Vec<u32>> {
        let tok = self.model.tokenizer();
        let template = self.model.chat_template();
        match template.has_thinking() {
            // Thinking or the template's no-thinking mode, never its default: under a grammar the decision
            // starts at once, so a template that thinks by default would get no thinking and no close.
            true => template.with_thinking(self.thinking).render_tokens(tok, messages, true, tools),
            false => template.render_tokens(tok, messages, true, tools),
        }
    }

    /// Generates after `prompt`, whose first `cached` tokens are in the KV cache, and records what the
    /// cache then holds (the prompt and the generated tokens; after an error, only those first tokens).
    fn generate(
        &mut self,
        prompt: &[u32],
        cached: usize,
        params: &GenerateParams,
        constraint: Option<&mut Constraint>,
    ) -> Result<Generation> {
        self.generate_streamed(prompt, cached, params, constraint, &mut |_| {})
    }

    /// [`generate`](Self::generate), giving the text to `on_text` as it comes.
    fn generate_streamed(
        &mut self,
        prompt: &[u32],
        cached: usize,
        params: &GenerateParams,
        constraint: Option<&mut Constraint>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let tok = self.model.tokenizer().clone();
        let stops = self.model.stop_tokens().to_vec();
        let request = Request::new(prompt).cached(cached).stop_tokens(&stops).constraint(constraint);
        let generated = generate(&mut self.model, &tok, request, params, on_text);
        let in_cache = self.model.cache_len();
        self.cached = match &generated {
            Ok(g) => prompt.iter().chain(&g.tokens).copied().take(in_cache).collect(),
            Err(_) => prompt[..cached.min(in_cache)].to_vec(),
        };
        generated
    }

    /// A generation's text, with the control tokens it wrote other than those that end it: a call
    /// syntax's markers may be control tokens (`<|tool_call|>`), which plain text leaves out.
    fn text_of(&self, g: Generation) -> String {
        g.text_with_control_tokens(self.model.tokenizer(), self.model.stop_tokens())
    }

    /// The model's call syntax, read from its template once.
    fn syntax(&self) -> Option<&CallSyntax> {
        let model = &self.model;
        self.call_syntax.get_or_init(|| CallSyntax::of(model.chat_template(), model.tokenizer())).as_ref()
    }

    /// The branch biases of a native decision: on the tokens that start a call, at the start (call or
    /// answer), on the end of the turn after each call (stop or call again), and where an argument value
    /// can end: close the object or add an optional argument; end an array or add an item; inside a
    /// string, end it or go on at a comma (a list written as one string).
    fn branches(&self, req: &DecisionRequest<'_>) -> Vec<BranchBias> {
        if req.format == DecisionFormat::React {
            // A decision's `type`: where the grammar allows only the starts of `call_tool(s)` and of
            // `final_answer`.
            let t = self.react_tokens.get_or_init(|| react_type_tokens(self.model.tokenizer()));
            return vec![BranchBias {
                label: "call",
                at: BranchPoint::Anywhere,
                tokens: t.call.clone(),
                against: Some(t.answer.clone()),
                bias: req.biases.call,
                when: Allowed::Within(t.within.clone()),
            }];
        }
        let tokens = || Some(NativeTokens::of(self.model.tokenizer(), self.syntax()?));
        let Some(t) = self.native_tokens.get_or_init(tokens) else {
            return Vec::new();
        };
        let BranchBiases { call, more_calls, close, end_list } = req.biases;
        let one_sided = |label, at, tokens: &Vec<u32>, bias| BranchBias {
            label,
            at,
            tokens: tokens.clone(),
            against: None,
            bias,
            when: Allowed::Always,
        };
        let mut b = vec![one_sided("call", BranchPoint::Start, &t.call_starts, call)];
        let stops = self.model.stop_tokens().to_vec();
        for &end in &t.call_ends {
            b.push(one_sided("stop", BranchPoint::After(end), &stops, -more_calls));
        }
        b.extend(t.ends.branches(close, end_list));
        b
    }
}

impl Driver for ModelDriver {
    fn forget(&mut self) {
        self.cached.clear();
        self.model.truncate(0);
    }

    fn reseed(&mut self) {
        self.seed = self.first_seed;
    }

    fn check_grammar(&self, grammar: &Grammar) -> Result<()> {
        match &self.engine {
            Some(e) => e.constraint(grammar).map(drop),
            None => Ok(()),
        }
    }

    fn name(&self) -> &'static str {
        if self.engine.is_some() {
            "constrained"
        } else {
            "free-form"
        }
    }

    fn decide(&mut self, req: &DecisionRequest<'_>) -> Result<DriverOutput> {
        let t = Instant::now();
        if req.think_budget > 0 && !self.model.chat_template().has_thinking() {
            return Err(Error::param("think budget", "the model's chat template has no thinking section"));
        }
        self.thinking = req.think_budget > 0;
        let rendered = self.tokens(req.messages, req.tools)?;
        let (prompt, thought) = match req.think_budget {
            0 => (rendered.clone(), None),
            budget => {
                let (p, thought) = self.think(&rendered, budget)?;
                (p, Some(thought))
            }
        };
        let (reused, loaded) = self.prepare_prefix(&prompt);
        // With thinking, the decision's prompt was in the cache already: what counts is what the thinking
        // found there.
        let (prompt_reused, prompt_loaded) = thought.as_ref().map_or((None, loaded), |t| (Some(t.reused), t.loaded));
        let thinking_tokens = thought.as_ref().map_or(0, |t| t.tokens);
        let thinking = thought.map(|t| t.text);
        let mut constraint = match &self.engine {
            Some(e) => Some(e.constraint(req.grammar)?.with_branches(self.branches(req))),
            None => None,
        };
        // Greedy decoding would repeat a failed attempt token for token (a runaway string stays a runaway
        // string), so retries of a greedy driver sample, seeded and so still reproducible.
        let sampling = match (self.sampling, req.attempt) {
            (Sampling::Greedy, 1..) => Sampling::Random { temperature: 0.7, top_k: Some(40), top_p: None },
            (s, _) => s,
        };
        let stop_at_answer = req.stop_at_answer && req.format == DecisionFormat::React && constraint.is_some();
        let params = GenerateParams {
            max_tokens: req.max_tokens,
            sampling,
            seed: self.seed,
            speculate: self.speculate,
            stop_strings: if stop_at_answer { vec![ANSWER_CHOSEN.to_string()] } else { Vec::new() },
            ..GenerateParams::default()
        };
        let g = self.generate(&prompt, reused, &params, constraint.as_mut())?;
        let answer_pending = stop_at_answer && matches!(g.stop, FinishReason::StopString { .. });
        self.seed = self.seed.wrapping_add(1);
        self.prompt_len = prompt.len();
        self.save_prefix(req, &rendered);
        // Under a grammar: complete when the grammar is (even if the last token also hit the limit).
        // Free: when it stopped by itself, or a whole JSON object came out before the limit cut it.
        let complete = match (&constraint, &g.stop) {
            (Some(c), s) => c.is_finished() || *s == FinishReason::GrammarComplete,
            (None, s) => {
                !matches!(s, FinishReason::MaxTokens | FinishReason::ContextFull) || extract_json(&g.text).is_some()
            }
        };
        let stats = DecisionStats {
            prompt_tokens: rendered.len(),
            reused_tokens: prompt_reused.unwrap_or(g.stats.cached_tokens).min(rendered.len()),
            loaded_tokens: prompt_loaded,
            generated_tokens: g.tokens.len() + thinking_tokens,
            thinking_tokens,
            forced_tokens: constraint.as_ref().map_or(0, |c| c.stats().forced_tokens),
            drafted_tokens: g.stats.speculation.drafted,
            accepted_tokens: g.stats.speculation.accepted,
            seconds: t.elapsed().as_secs_f64(),
            branch_margins: constraint.as_ref().map(|c| c.stats().branch_margins.clone()).unwrap_or_default(),
        };
        let text = if req.format == DecisionFormat::Native { self.text_of(g) } else { g.text };
        Ok(DriverOutput { text, thinking, complete, stats, answer_pending })
    }

    fn answer(
        &mut self,
        messages: &[ChatMessage],
        max_tokens: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<DriverOutput>> {
        let t = Instant::now();
        self.thinking = false;
        let prompt = self.tokens(messages, None)?;
        let (reused, loaded) = self.prepare_prefix(&prompt);
        let params = GenerateParams {
            max_tokens,
            sampling: self.sampling,
            seed: self.seed,
            speculate: self.speculate,
            ..GenerateParams::default()
        };
        let g = self.generate_streamed(&prompt, reused, &params, None, on_text)?;
        self.seed = self.seed.wrapping_add(1);
        self.prompt_len = prompt.len();
        let complete = !matches!(g.stop, FinishReason::MaxTokens | FinishReason::ContextFull);
        let stats = DecisionStats {
            prompt_tokens: prompt.len(),
            reused_tokens: g.stats.cached_tokens.min(prompt.len()),
            loaded_tokens: loaded,
            generated_tokens: g.tokens.len(),
            drafted_tokens: g.stats.speculation.drafted,
            accepted_tokens: g.stats.speculation.accepted,
            seconds: t.elapsed().as_secs_f64(),
            ..DecisionStats::default()
        };
        Ok(Some(DriverOutput::new(g.text, complete, stats)))
    }

    fn score(
        &mut self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        text: &str,
    ) -> Result<Option<Vec<(String, f32)>>> {
        let prompt = self.tokens(messages, tools)?;
        let reply = self.model.tokenizer().encode(text, false)?;
        if reply.is_empty() || prompt.len() + reply.len() >= self.model.context_length() {
            return Ok(None);
        }
        // The prompt's last token is run again whatever the cache holds: its logits score the first token.
        let (reused, _) = self.prepare_prefix(&prompt);
        let from = reused.min(prompt.len() - 1);
        self.cached.truncate(from);
        self.model.truncate(from);
        let Some(first) = crate::decode::generate::prefill(&mut self.model, &prompt[from..], from)? else {
            return Ok(None);
        };
        let vocab = first.len();
        let mut rows = first;
        if reply.len() > 1 {
            rows.extend(self.model.forward_all(&reply[..reply.len() - 1], prompt.len())?);
        }
        self.cached = prompt.iter().chain(&reply[..reply.len() - 1]).copied().collect();
        let lp = |row: &[f32], t: u32| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|&l| (l - max).exp()).sum();
            row.get(t as usize).map_or(f32::NEG_INFINITY, |&l| l - max - sum.ln())
        };
        let tok = self.model.tokenizer();
        let piece = |t: u32| tok.decode(&[t], false).unwrap_or_default();
        Ok(Some(reply.iter().enumerate().map(|(i, &t)| (piece(t), lp(&rows[i * vocab..(i + 1) * vocab], t))).collect()))
    }

    fn call_margin(&mut self, req: &DecisionRequest<'_>) -> Result<Option<(f32, DecisionStats)>> {
        if self.engine.is_none() || self.syntax().is_none() || req.format != DecisionFormat::Native {
            return Ok(None);
        }
        // The first token is all it takes: the margin is recorded where the grammar offers both sides.
        let req = DecisionRequest { max_tokens: 1, attempt: 0, think_budget: 0, stop_at_answer: false, ..*req };
        let out = self.decide(&req)?;
        let margin = out.stats.branch_margins.iter().find(|m| m.label == "call").map(|m| m.margin);
        Ok(margin.map(|m| (m, out.stats)))
    }

    fn extend(&mut self, req: &DecisionRequest<'_>) -> Result<Option<DriverOutput>> {
        let Some(engine) = self.engine.clone() else { return Ok(None) };
        if self.cached.len() <= self.prompt_len || self.model.cache_len() < self.cached.len() {
            return Ok(None);
        }
        let t = Instant::now();
        // The last prompt and decision are in the KV cache: only the last token is run again.
        let prompt = self.cached.clone();
        let mut constraint = engine.constraint(req.grammar)?.with_branches(self.branches(req));
        let params = GenerateParams {
            max_tokens: req.max_tokens,
            sampling: self.sampling,
            seed: self.seed,
            speculate: self.speculate,
            ..Default::default()
        };
        // The seed is left as it was: a proposal does not change what later decisions sample.
        let g = self.generate(&prompt, prompt.len(), &params, Some(&mut constraint))?;
        let complete = constraint.is_finished() || g.stop == FinishReason::GrammarComplete;
        let stats = DecisionStats {
            prompt_tokens: 0,
            reused_tokens: g.stats.cached_tokens,
            loaded_tokens: 0,
            generated_tokens: g.tokens.len(),
            thinking_tokens: 0,
            forced_tokens: constraint.stats().forced_tokens,
            drafted_tokens: g.stats.speculation.drafted,
            accepted_tokens: g.stats.speculation.accepted,
            seconds: t.elapsed().as_secs_f64(),
            branch_margins: Vec::new(),
        };
        Ok(Some(DriverOutput { text: self.text_of(g), thinking: None, complete, stats, answer_pending: false }))
    }

    fn observation_role(&self) -> Role {
        let src = self.model.chat_template().source();
        if src.contains("\"tool\"") || src.contains("'tool'") {
            Role::Tool
        } else {
            Role::User
        }
    }

    fn rollback(&mut self) {
        self.cached.truncate(self.prompt_len);
        self.model.truncate(self.prompt_len);
    }

    fn measure(&mut self, messages: &[ChatMessage], tools: Option<&Value>) -> Result<Option<(usize, usize)>> {
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if let Some((at_least, capacity)) = self.prompt_bound(bytes).filter(|(n, c)| n > c) {
            return Ok(Some((at_least, capacity)));
        }
        Ok(Some((self.tokens(messages, tools)?.len(), self.model.context_length())))
    }

    /// Text longer than the context holds even at the longest token's bytes each cannot fit (the tokenizer
    /// takes about 100 bytes of memory per byte of a 50 MB text).
    fn prompt_bound(&mut self, bytes: usize) -> Option<(usize, usize)> {
        Some((bytes / self.longest_token_bytes(), self.model.context_length()))
    }

    fn catalog_entry(&self) -> Option<crate::catalog::CatalogEntry> {
        self.model.catalog_entry()
    }

    fn supports_thinking(&self) -> bool {
        self.model.chat_template().has_thinking()
    }

    fn call_syntax(&self) -> Option<CallSyntax> {
        self.syntax().cloned()
    }
}

/// The tokens that can make a ReAct decision's `type` choice, by side: a call's (`call_tool`, `call_tools`)
/// and an answer's (`final_answer`). A token may begin with the end of the key before the value (`":"call`)
/// and run on past the value's end (`final_answer","`).
///
/// Returns the call side, the answer side and every token that may be allowed where the choice is made
/// (both sides and the ends of the key alone, `"`), sorted.
fn react_type_tokens(tok: &crate::text::tokenizer::Tokenizer) -> ReactTokens {
    const KEY: &[u8] = b"\"type\":\"";
    let sides: [(&[u8], bool); 3] = [(b"call_tool\"", true), (b"call_tools\"", true), (b"final_answer\"", false)];
    let (mut call, mut answer, mut within) = (Vec::new(), Vec::new(), Vec::new());
    for id in 0..tok.vocab_size() as u32 {
        if tok.is_special(id) {
            continue;
        }
        let b = tok.token_bytes(id);
        if b.is_empty() {
            continue;
        }
        // The token's value part: after the longest end of the key it starts with.
        let lead = (0..=KEY.len()).rev().find(|&n| b.starts_with(&KEY[KEY.len() - n..])).unwrap_or(0);
        let v = &b[lead..];
        if v.is_empty() {
            within.push(id);
            continue;
        }
        let side = sides.iter().find(|(x, _)| x.starts_with(v) || v.starts_with(x)).map(|(_, c)| *c);
        match side {
            Some(true) => call.push(id),
            Some(false) => answer.push(id),
            None => continue,
        }
        within.push(id);
    }
    ReactTokens { call, answer, within }
}

/// See [`react_type_tokens`].
struct ReactTokens {
    call: Vec<u32>,
    answer: Vec<u32>,
    within: Vec<u32>,
}
