//! The generation loop: prefill, then sample token by token until a stop token, a stop string, the
//! token limit or the end of the context, streaming complete UTF-8 text to a callback.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::constraint::Constraint;
use super::sampler::{Sampler, Sampling};
use super::speculate::{self, SpeculationStats};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::text::tokenizer::{StreamDecoder, Tokenizer};

/// Prompts longer than this are prefilled in chunks, bounding the attention scratch memory.
pub const PREFILL_CHUNK: usize = 512;

/// The default [`GenerateParams::close_within`]: room for the end of a string, a few required fields
/// and brackets, and a closing tag.
pub const CLOSE_WITHIN: usize = 32;

/// Parameters of one generation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop_strings: Vec<String>,
    /// Keep going past stop tokens (benchmarks).
    pub ignore_eos: bool,
    /// Under a grammar, the last this many tokens of `max_tokens` are steered to close what is open
    /// ([`Constraint::prefer_closing`]), so that constrained output ends complete within the limit.
    pub close_within: usize,
    /// Speculative decoding: at most this many tokens drafted from the context ([`speculate::lookup`])
    /// are run with each sampled token in one forward pass, and kept as far as the sampler picks them.
    /// The output is the same as without (to the batched kernels' float summation order); 0 turns it off.
    /// Only where the model has a batched step ([`LanguageModel::verify_batch`]).
    pub speculate: usize,
    /// Added to these tokens' logits at every sampled position (an API's `logit_bias`); forced tokens
    /// are not sampled and take none.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The default [`GenerateParams::speculate`].
pub const SPECULATE: usize = 12;

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            sampling: Sampling::Greedy,
            seed: 0,
            stop_strings: Vec::new(),
            ignore_eos: false,
            close_within: CLOSE_WITHIN,
            speculate: SPECULATE,
            logit_bias: Vec::new(),
        }
    }
}

setters!(GenerateParams {
    max_tokens: usize,
    sampling: Sampling,
    seed: u64,
    stop_strings: Vec<String>,
    ignore_eos: bool,
    close_within: usize,
    speculate: usize,
    logit_bias: Vec<(u32, f32)>,
});

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum FinishReason {
    /// The model emitted a stop token (not included in the text).
    StopToken { token: u32 },
    /// A stop string appeared (not included in the text).
    StopString { stop: String },
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context window is full.
    ContextFull,
    /// The grammar is complete and admits nothing more.
    GrammarComplete,
    /// An interrupt was requested ([`crate::limits::interrupted`]: a [`Cancel`](crate::limits::Cancel)
    /// handle in scope, or the process-wide interrupt).
    Interrupted,
}

/// Timing and token counts of one generation.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens that were already in the KV cache (not recomputed).
    pub cached_tokens: usize,
    #[serde(with = "secs")]
    pub prefill_time: Duration,
    pub generated_tokens: usize,
    #[serde(with = "secs")]
    pub decode_time: Duration,
    /// Drafted tokens, accepted drafts and forward passes of the decode.
    pub speculation: SpeculationStats,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens - self.cached_tokens, self.prefill_time)
    }
    /// Generated tokens per second of decode time (the first token comes from the prefill logits).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

pub(crate) fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// The result of a generation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub stop: FinishReason,
    pub stats: GenerationStats,
}

impl Generation {
    /// The text with the control tokens it wrote other than `stops` (those that end it): a call
    /// syntax's markers may be control tokens (`<|tool_call|>`), which [`text`](Self::text) leaves out.
    pub fn text_with_control_tokens(self, tok: &Tokenizer, stops: &[u32]) -> String {
        let kept = |t: &&u32| !stops.contains(t);
        if !self.tokens.iter().filter(kept).any(|&t| tok.is_special(t)) {
            return self.text;
        }
        let ids: Vec<u32> = self.tokens.iter().filter(kept).copied().collect();
        tok.decode(&ids, true).unwrap_or(self.text)
    }
}

/// Runs `prompt` through the model in chunks starting at `pos`; returns the last logits, or `None` when
/// an interrupt ([`crate::limits::interrupted`]: a client gone) came between chunks, so that a long prompt
/// is not computed to the end for nobody.
pub fn prefill(model: &mut dyn LanguageModel, prompt: &[u32], pos: usize) -> Result<Option<Vec<f32>>> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let mut logits = Vec::new();
    for (i, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        if crate::limits::interrupted() {
            return Ok(None);
        }
        logits = model.forward(chunk, pos + i * PREFILL_CHUNK)?;
    }
    Ok(Some(logits))
}

/// What a token-level generation starts from: the prompt's tokens, how many of them the model's KV cache
/// already holds, the tokens that end it, and the grammar it follows.
///
/// ```ignore
/// let req = Request::new(&prompt).stop_tokens(model.stop_tokens()).constraint(Some(&mut constraint));
/// ```
#[non_exhaustive]
pub struct Request<'a> {
    pub tokens: &'a [u32],
    /// The first this many tokens are already in the KV cache (kept from an earlier call): only the rest
    /// is computed. At least the last prompt token is always run, since its logits start the generation.
    pub cached: usize,
    /// Tokens that end the generation (not included in its text).
    pub stop_tokens: &'a [u32],
    /// Forced tokens are appended with one batched forward pass, every sampled token is drawn from the
    /// grammar's mask, and generation ends when the grammar is complete (or accepts and the model picks a
    /// stop token).
    pub constraint: Option<&'a mut Constraint>,
}

impl<'a> Request<'a> {
    /// `tokens` on a fresh cache, no stop tokens, no grammar.
    pub fn new(tokens: &'a [u32]) -> Self {
        Self { tokens, cached: 0, stop_tokens: &[], constraint: None }
    }
    #[must_use]
    pub fn cached(mut self, n: usize) -> Self {
        self.cached = n;
        self
    }
    #[must_use]
    pub fn stop_tokens(mut self, stops: &'a [u32]) -> Self {
        self.stop_tokens = stops;
        self
    }
    #[must_use]
    pub fn constraint(mut self, c: Option<&'a mut Constraint>) -> Self {
        self.constraint = c;
        self
    }
}

/// Generates from a [`Request`] at the token level: prefill (of what the cache does not hold), then one
/// token at a time until a stop token, a stop string, the grammar's end, the token limit or the end of
/// the context. `on_text` receives text as soon as it is complete UTF-8 and cannot be the start of a stop
/// string. [`Model::generate`](crate::Model::generate) is the short way, from text or chat messages.
pub fn generate(
    model: &mut dyn LanguageModel,
    tok: &Tokenizer,
    request: Request<'_>,
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    let Request { tokens: prompt, cached, stop_tokens, mut constraint } = request;
    let capacity = model.context_length();
    if prompt.len() >= capacity {
        return Err(Error::ContextOverflow { needed: prompt.len() + 1, capacity });
    }
    let start = cached.min(model.cache_len()).min(prompt.len().saturating_sub(1));
    let t0 = Instant::now();
    let Some(mut logits) = prefill(model, &prompt[start..], start)? else {
        let stats = GenerationStats { prompt_tokens: prompt.len(), cached_tokens: start, ..Default::default() };
        return Ok(Generation { text: String::new(), tokens: Vec::new(), stop: FinishReason::Interrupted, stats });
    };
    let prefill_time = t0.elapsed();
    let mut sampler = Sampler::new(params.sampling, params.seed);
    let mut run =
        Decoding { params, prompt_len: prompt.len(), capacity, tokens: Vec::new(), out: TextOut::new(params) };
    let t1 = Instant::now();
    // A sampled token not yet run through the model: it goes into the next forward pass, together with
    // the tokens the grammar forces after it if there are any (a short batch reads the weights once for
    // all its tokens, where the sampled token alone would take one pass and the forced run another).
    let mut lead = None;
    // Drafted tokens run through the model after the last accepted token, each with the logits after it:
    // the sampler's picks are checked against them in order. They are the last positions of the KV cache.
    let mut drafts: VecDeque<(u32, Vec<f32>)> = VecDeque::new();
    let max_draft = params.speculate.min(model.verify_batch().saturating_sub(1));
    let mut spec = SpeculationStats::default();
    // Drafting pays only while the output copies the context: a draft is run only after the token just
    // picked was the one a lookup proposed (`guess`), so free text, where lookups rarely come true, pays
    // for no batch it does not use.
    let (mut guess, mut copying, mut batch_accepted) = (None, false, 0);
    // The draft length follows the copying: doubled after a draft that came true whole, cut back to what
    // came true (plus one) after one that did not, since each drafted token costs a fraction of a pass.
    let mut draft_len = max_draft.min(speculate::FIRST_DRAFT);
    // What drafts are looked up in (only when drafting).
    let mut context: Vec<u32> = if max_draft > 0 { prompt.to_vec() } else { Vec::new() };
    // Positions run ahead of what one token at a time would have run when the generation ended (an
    // accepted draft as the last token): dropped, so the KV cache is left as without drafts.
    let mut unrun = 0;
    let constrained = constraint.is_some();
    let stop = (|| -> Result<FinishReason> {
        Ok(loop {
            if let Some(s) = run.limit_reached() {
                break s;
            }
            if let Some(c) = constraint.as_deref_mut() {
                let mut forced = c.forced_tokens()?;
                if !forced.is_empty() {
                    forced.truncate(run.remaining());
                    if run.pos() + forced.len() > capacity {
                        break FinishReason::ContextFull;
                    }
                    // Forced tokens that drafts ran already (with their logits) are taken as they are.
                    let mut ran = 0;
                    while let Some(after) = take_draft(&mut drafts, forced.get(ran).copied()) {
                        logits = after;
                        ran += 1;
                    }
                    discard(model, &mut drafts);
                    spec.accepted += ran;
                    batch_accepted += ran;
                    match run.force(model, tok, lead.take(), forced, ran, on_text)? {
                        Ok(Some(next_logits)) => {
                            spec.passes += 1;
                            logits = next_logits;
                        }
                        Ok(None) => {}
                        Err(s) => {
                            // Without drafts none of them would have run.
                            unrun = ran;
                            break s;
                        }
                    }
                    continue;
                }
            }
            if let Some(t) = lead.take() {
                let pos = run.pos() - 1;
                let room = draft_len.min(run.remaining()).min(capacity.saturating_sub(pos + 2));
                let mut draft = Vec::new();
                if max_draft > 0 {
                    // The prompt and the output so far, brought up to date with the tokens added since.
                    context.extend_from_slice(&run.tokens[context.len() - prompt.len()..]);
                    let (found, n) = speculate::lookup_match(&context, room);
                    guess = found.first().copied();
                    if copying || speculate::sure_match(n) {
                        draft = found.to_vec();
                    }
                }
                if let Some(c) = constraint.as_deref_mut() {
                    draft.truncate(c.valid_prefix(&draft));
                }
                spec.passes += 1;
                if draft.is_empty() {
                    logits = model.forward(&[t], pos)?;
                } else {
                    let batch: Vec<u32> = std::iter::once(t).chain(draft.iter().copied()).collect();
                    let all = model.forward_all(&batch, pos)?;
                    let mut rows = all.chunks_exact(all.len() / batch.len()).map(<[f32]>::to_vec);
                    logits = rows.next().expect("a row per token");
                    drafts.extend(draft.iter().copied().zip(rows));
                    spec.drafted += draft.len();
                    batch_accepted = 0;
                }
            }
            for &(id, bias) in &params.logit_bias {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l += bias;
                }
            }
            if let Some(c) = constraint.as_deref_mut() {
                if c.is_finished() {
                    break FinishReason::GrammarComplete;
                }
                c.mask_logits(&mut logits)?;
                if run.remaining() <= params.close_within {
                    c.prefer_closing(&mut logits);
                }
            }
            let Some(next) = sampler.sample(&logits) else {
                return Err(match constrained {
                    true => Error::Constraint { problem: "the grammar allows no token here".into() },
                    false => Error::param("logits", "every token has -inf logit"),
                });
            };
            if let Some(c) = constraint.as_deref_mut() {
                c.consume(next)?;
            }
            if !params.ignore_eos && stop_tokens.contains(&next) {
                break FinishReason::StopToken { token: next };
            }
            // The sampler picked the drafted token: it is in the cache already, with the logits after it.
            let drafted = take_draft(&mut drafts, Some(next));
            // A draft that came true in part still shows copying (a copied line that ends, a word changed).
            copying = match (&drafted, drafts.is_empty()) {
                (Some(_), _) => true,
                (None, false) => batch_accepted > 0,
                (None, true) => guess == Some(next),
            };
            match (&drafted, drafts.is_empty()) {
                (Some(_), true) => draft_len = (draft_len * 2).min(max_draft),
                (None, false) => {
                    draft_len = (batch_accepted + 1).clamp(speculate::FIRST_DRAFT.min(max_draft), max_draft)
                }
                _ => {}
            }
            guess = None;
            if drafted.is_none() {
                discard(model, &mut drafts);
            }
            if let Some(s) = run.accept(tok, next, on_text) {
                // Without drafts the last token would not have run.
                unrun = usize::from(drafted.is_some());
                break s;
            }
            match drafted {
                Some(after) => {
                    spec.accepted += 1;
                    batch_accepted += 1;
                    logits = after;
                }
                None => lead = Some(next),
            }
        })
    })();
    // On every way out, errors included: no rejected draft stays in the KV cache.
    discard(model, &mut drafts);
    if unrun > 0 {
        model.truncate(model.cache_len().saturating_sub(unrun));
    }
    let stop = stop?;
    let Decoding { tokens, out, .. } = run;
    let decode_time = t1.elapsed();
    let text = out.finish(&stop, on_text);
    let stats = GenerationStats {
        prompt_tokens: prompt.len(),
        cached_tokens: start,
        prefill_time,
        generated_tokens: tokens.len(),
        decode_time,
        speculation: spec,
    };
    Ok(Generation { text, tokens, stop, stats })
}

/// The logits after the first drafted token, taken off the queue, if it is `token`.
fn take_draft(drafts: &mut VecDeque<(u32, Vec<f32>)>, token: Option<u32>) -> Option<Vec<f32>> {
    match drafts.front() {
        Some((d, _)) if Some(*d) == token => drafts.pop_front().map(|(_, after)| after),
        _ => None,
    }
}

/// Drops drafted tokens the sampler did not pick from the end of the KV cache.
fn discard(model: &mut dyn LanguageModel, drafts: &mut VecDeque<(u32, Vec<f32>)>) {
    if !drafts.is_empty() {
        model.truncate(model.cache_len().saturating_sub(drafts.len()));
        drafts.clear();
    }
}

/// The decode loop's state: the tokens so far, their text, and the limits that end it.
struct Decoding<'a> {
    params: &'a GenerateParams,
    prompt_len: usize,
    capacity: usize,
    tokens: Vec<u32>,
    out: TextOut<'a>,
}

impl Decoding<'_> {
    /// The position of the next token.
    fn pos(&self) -> usize {
        self.prompt_len + self.tokens.len()
    }

    /// Tokens left of the budget.
    fn remaining(&self) -> usize {
        self.params.max_tokens.saturating_sub(self.tokens.len())
    }

    /// The token budget spent, or an interrupt.
    fn limit_reached(&self) -> Option<FinishReason> {
        if self.tokens.len() >= self.params.max_tokens {
            return Some(FinishReason::MaxTokens);
        }
        crate::limits::interrupted().then_some(FinishReason::Interrupted)
    }

    /// Appends the tokens the grammar forces (within the budget and the context: the caller checked),
    /// of which the first `ran` are already in the KV cache (drafts), and runs the others through the
    /// model after `lead` (a sampled token already appended but not yet run) if given, in batches of the
    /// model's batched step: the logits after them (`None` when nothing was left to run), or why the
    /// generation ends.
    fn force(
        &mut self,
        model: &mut dyn LanguageModel,
        tok: &Tokenizer,
        lead: Option<u32>,
        forced: Vec<u32>,
        ran: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<std::result::Result<Option<Vec<f32>>, FinishReason>> {
        // The lead token is already accepted (the last of `tokens`) but not yet run.
        let pos = self.pos() - usize::from(lead.is_some()) + ran;
        let batch: Vec<u32> = lead.into_iter().chain(forced[ran..].iter().copied()).collect();
        if let Some(s) = self.append_forced(tok, &forced, on_text) {
            return Ok(Err(s));
        }
        if batch.is_empty() {
            return Ok(Ok(None));
        }
        // Grouped as a model with a batched step groups them, each group gives the same bits as one
        // token at a time (where the whole run in one pass might not): drafts change the grouping.
        let step = model.verify_batch().max(1);
        let mut logits = Vec::new();
        for (i, chunk) in batch.chunks(if step > 1 { step } else { batch.len() }).enumerate() {
            logits = model.forward(chunk, pos + i * step)?;
        }
        Ok(Ok(Some(logits)))
    }

    /// Appends forced tokens (the grammar's, within the budget): why the generation ends after them, if
    /// it does.
    fn append_forced(
        &mut self,
        tok: &Tokenizer,
        forced: &[u32],
        on_text: &mut dyn FnMut(&str),
    ) -> Option<FinishReason> {
        for &t in forced {
            self.tokens.push(t);
            self.out.push(tok, t, on_text);
        }
        if let Some(s) = self.out.check_stop(on_text) {
            return Some(s);
        }
        (self.tokens.len() >= self.params.max_tokens).then_some(FinishReason::MaxTokens)
    }

    /// Appends a sampled token: why the generation ends after it, if it does.
    fn accept(&mut self, tok: &Tokenizer, next: u32, on_text: &mut dyn FnMut(&str)) -> Option<FinishReason> {
        self.tokens.push(next);
        self.out.push(tok, next, on_text);
        if let Some(s) = self.out.check_stop(on_text) {
            return Some(s);
        }
        if self.pos() >= self.capacity {
            return Some(FinishReason::ContextFull);
        }
        (self.tokens.len() >= self.params.max_tokens).then_some(FinishReason::MaxTokens)
    }
}

/// Streams generated text: complete UTF-8 only, holding back any tail that could start a stop string.
struct TextOut<'a> {
    stream: StreamDecoder,
    text: String,
    emitted: usize,
    hold: usize,
    stops: &'a [String],
}

impl<'a> TextOut<'a> {
    fn new(params: &'a GenerateParams) -> Self {
        let hold = params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
        Self { stream: StreamDecoder::default(), text: String::new(), emitted: 0, hold, stops: &params.stop_strings }
    }

    fn push(&mut self, tok: &Tokenizer, id: u32, on_text: &mut dyn FnMut(&str)) {
        if !tok.is_special(id) {
            self.text.push_str(&self.stream.push(tok.token_bytes(id)));
        }
        let mut safe = self.text.len().saturating_sub(self.hold).max(self.emitted);
        while !self.text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > self.emitted && find_stop(&self.text, self.stops, self.emitted.saturating_sub(self.hold)).is_none() {
            on_text(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
    }

    /// Cuts the text before the first stop string, if one appeared.
    fn check_stop(&mut self, on_text: &mut dyn FnMut(&str)) -> Option<FinishReason> {
        let (at, s) = find_stop(&self.text, self.stops, self.emitted.saturating_sub(self.hold))?;
        self.text.truncate(at);
        if at > self.emitted {
            on_text(&self.text[self.emitted..]);
        }
        self.emitted = self.text.len();
        Some(FinishReason::StopString { stop: s.to_string() })
    }

    fn finish(mut self, stop: &FinishReason, on_text: &mut dyn FnMut(&str)) -> String {
        if !matches!(stop, FinishReason::StopString { .. }) {
            self.text.push_str(&self.stream.finish());
            if self.text.len() > self.emitted {
                on_text(&self.text[self.emitted..]);
            }
        }
        self.text
    }
}

fn find_stop<'a>(text: &str, stops: &'a [String], from: usize) -> Option<(usize, &'a str)> {
    let mut from = from.min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text[from..].find(s.as_str()).map(|i| (from + i, s.as_str())))
        .min_by_key(|(i, _)| *i)
}
