//! The generation loop: prefill, then sample token by token until a stop token, a stop string, the
//! token limit or the end of the context, streaming complete UTF-8 text to a callback.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::sampler::{Sampler, Sampling};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::text::tokenizer::{StreamDecoder, Tokenizer};

/// Prompts longer than this are prefilled in chunks, bounding the attention scratch memory.
pub const PREFILL_CHUNK: usize = 512;

/// Parameters of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop_strings: Vec<String>,
    /// Keep going past stop tokens (benchmarks).
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self { max_tokens: 256, sampling: Sampling::Greedy, seed: 0, stop_strings: Vec::new(), ignore_eos: false }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StopReason {
    /// The model emitted a stop token (not included in the text).
    StopToken { token: u32 },
    /// A stop string appeared (not included in the text).
    StopString { stop: String },
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context window is full.
    ContextFull,
}

/// Timing and token counts of one generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    #[serde(with = "secs")]
    pub prefill_time: Duration,
    pub generated_tokens: usize,
    #[serde(with = "secs")]
    pub decode_time: Duration,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
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

/// The result of [`generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub stats: GenerationStats,
}

/// Runs `prompt` through the model in chunks starting at `pos`; returns the last logits.
pub fn prefill(model: &mut dyn LanguageModel, prompt: &[u32], pos: usize) -> Result<Vec<f32>> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("empty prompt".into()));
    }
    let mut logits = Vec::new();
    for (i, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        logits = model.forward(chunk, pos + i * PREFILL_CHUNK)?;
    }
    Ok(logits)
}

/// Generates from `prompt` on a fresh cache. `on_text` receives text as soon as it is complete UTF-8 and
/// cannot be the start of a stop string.
pub fn generate(
    model: &mut dyn LanguageModel,
    tok: &Tokenizer,
    stop_tokens: &[u32],
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    let capacity = model.context_length();
    if prompt.len() >= capacity {
        return Err(Error::ContextOverflow { needed: prompt.len() + 1, capacity });
    }
    let t0 = Instant::now();
    let mut logits = prefill(model, prompt, 0)?;
    let prefill_time = t0.elapsed();
    let mut sampler = Sampler::new(params.sampling, params.seed);
    let mut stream = StreamDecoder::default();
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut emitted: usize = 0;
    let hold = params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
    let t1 = Instant::now();
    let stop = loop {
        if tokens.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let Some(next) = sampler.sample(&logits) else {
            return Err(Error::InvalidArgument("every token has -inf logit".into()));
        };
        if !params.ignore_eos && stop_tokens.contains(&next) {
            break StopReason::StopToken { token: next };
        }
        tokens.push(next);
        if !tok.is_special(next) {
            text.push_str(&stream.push(tok.token_bytes(next)));
        }
        if let Some((at, s)) = find_stop(&text, &params.stop_strings, emitted.saturating_sub(hold)) {
            text.truncate(at);
            if at > emitted {
                on_text(&text[emitted..]);
            }
            emitted = text.len();
            break StopReason::StopString { stop: s.to_string() };
        }
        let mut safe = text.len().saturating_sub(hold).max(emitted);
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > emitted {
            on_text(&text[emitted..safe]);
            emitted = safe;
        }
        if prompt.len() + tokens.len() >= capacity {
            break StopReason::ContextFull;
        }
        if tokens.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        logits = model.forward(&[next], prompt.len() + tokens.len() - 1)?;
    };
    let decode_time = t1.elapsed();
    if !matches!(stop, StopReason::StopString { .. }) {
        text.push_str(&stream.finish());
        if text.len() > emitted {
            on_text(&text[emitted..]);
        }
    }
    let stats =
        GenerationStats { prompt_tokens: prompt.len(), prefill_time, generated_tokens: tokens.len(), decode_time };
    Ok(Generation { text, tokens, stop, stats })
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
