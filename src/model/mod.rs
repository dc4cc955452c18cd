//! Model loading and the forward pass.
//!
//! [`LanguageModel`] is the small trait everything above this layer talks to: run new tokens at a
//! position, get the last position's logits; the KV cache persists between calls and can be truncated
//! back to any earlier length. [`Model`] is a GGUF file loaded with its tokenizer, chat template and stop
//! tokens. This module knows nothing about tools, grammars or agents.

pub mod amx;
pub mod gemma3;
pub mod gguf;
pub mod kernels;
pub(crate) mod layers;
pub mod llama;
pub mod tiny;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;

pub use layers::Hparams;

/// How prompt-sized batches are multiplied on the CPU: `amx_bf16` (the AMX tile unit, where the CPU and
/// kernel allow it and `REAGENT_KERNELS` does not cap it) or `f32_gemm` (weights dequantized to f32).
pub fn prefill_kernel() -> &'static str {
    if amx::available() {
        "amx_bf16"
    } else {
        "f32_gemm"
    }
}

use crate::error::{Error, Result};
use crate::text::chat::ChatTemplate;
use crate::text::tokenizer::{TokenKind, Tokenizer};
use gguf::GgufFile;

/// A causal language model with a persistent, truncatable KV cache.
pub trait LanguageModel {
    /// Width of the logits (number of token ids).
    fn vocab_size(&self) -> usize;
    /// Maximum number of positions the cache can hold.
    fn context_length(&self) -> usize;
    /// Number of positions currently in the KV cache.
    fn cache_len(&self) -> usize;
    /// Runs `tokens` at positions `pos..pos+tokens.len()` and returns the logits of the last one.
    /// Cached positions at or after `pos` are dropped first; `pos` past the cache end is an error.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>>;
    /// Drops cached positions from `len` on.
    fn truncate(&mut self, len: usize);
}

/// The supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Gemma3,
}

impl Arch {
    fn parse(path: &Path, s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(Error::UnsupportedArch { path: path.to_path_buf(), arch: other.to_string() }),
        }
    }

    /// The GGUF architecture name.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gemma3 => "gemma3",
        }
    }
}

enum Net {
    Llama(llama::Llama),
    Gemma3(gemma3::Gemma3),
}

/// Options for [`Model::load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Where tensors live.
    pub device: Device,
    /// Cap on the context (KV cache and rotary tables); defaults to `min(file's context, 8192)`.
    pub max_context: Option<usize>,
    /// Use this tokenizer.json instead of the GGUF's tokenizer.
    pub tokenizer_json: Option<PathBuf>,
    /// Compute every matrix product in f32 on dequantized weights, decode steps included: slow, and the
    /// reference the quantized kernels are tested against.
    pub f32_reference: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { device: Device::Cpu, max_context: None, tokenizer_json: None, f32_reference: false }
    }
}

/// Facts about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub arch: Arch,
    pub name: Option<String>,
    pub file_bytes: u64,
    pub hparams: Hparams,
    pub load_time: Duration,
}

/// A GGUF model loaded with everything needed to prompt it.
pub struct Model {
    net: Net,
    tokenizer: Arc<Tokenizer>,
    chat: ChatTemplate,
    stop_tokens: Vec<u32>,
    info: ModelInfo,
}

/// Texts of end-of-turn control tokens used by common chat formats (as llama.cpp's EOG list).
const END_OF_TURN_TEXTS: &[&str] =
    &["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|end_of_text|>", "<EOT>"];

impl Model {
    /// Loads a GGUF file.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Self> {
        let start = Instant::now();
        let path = path.as_ref();
        let mut g = GgufFile::open(path)?;
        g.f32_reference = opts.f32_reference;
        let file_bytes = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        let arch = Arch::parse(path, g.str("general.architecture")?)?;
        let tokenizer = match &opts.tokenizer_json {
            Some(p) => Tokenizer::from_json_file(p)?,
            None => Tokenizer::from_gguf(&g)?,
        };
        let file_ctx = g.usize_or(&format!("{}.context_length", arch.as_str()), 2048)?;
        let max_len = opts.max_context.unwrap_or(8192).min(file_ctx).max(1);
        let dev = &opts.device;
        let net = match arch {
            Arch::Llama => Net::Llama(llama::Llama::load(&mut g, llama::Variant::Llama, max_len, dev)?),
            Arch::Qwen2 => Net::Llama(llama::Llama::load(&mut g, llama::Variant::Qwen2, max_len, dev)?),
            Arch::Gemma3 => Net::Gemma3(gemma3::Gemma3::load(&mut g, max_len, dev)?),
        };
        let hparams = match &net {
            Net::Llama(m) => m.hparams().clone(),
            Net::Gemma3(m) => m.hparams().clone(),
        };
        if hparams.vocab < tokenizer.vocab_size() {
            return Err(Error::Tokenizer(format!(
                "{}: tokenizer has {} tokens but the embedding has only {} rows",
                path.display(),
                tokenizer.vocab_size(),
                hparams.vocab
            )));
        }
        let template_src = match g.str_opt("tokenizer.chat_template")? {
            Some(t) => t.to_string(),
            None => match arch {
                Arch::Gemma3 => gemma3::FALLBACK_CHAT_TEMPLATE.to_string(),
                _ => crate::text::chat::CHATML_TEMPLATE.to_string(),
            },
        };
        let mut stop_tokens: Vec<u32> = tokenizer.eos().into_iter().collect();
        if let Some(Ok(id)) = g.get("tokenizer.ggml.eot_token_id").map(|_| g.u64("tokenizer.ggml.eot_token_id")) {
            stop_tokens.push(id as u32);
        }
        for t in END_OF_TURN_TEXTS {
            if let Some(id) = tokenizer.token_id(t) {
                if tokenizer.token_kind(id) == Some(TokenKind::Control) {
                    stop_tokens.push(id);
                }
            }
        }
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        let chat = ChatTemplate::new(&template_src, &tokenizer)?;
        let name = g.str_opt("general.name")?.map(String::from);
        let info = ModelInfo { path: path.to_path_buf(), arch, name, file_bytes, hparams, load_time: start.elapsed() };
        Ok(Self { net, tokenizer: Arc::new(tokenizer), chat, stop_tokens, info })
    }

    /// The tokenizer (shared).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The chat template.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// Tokens that end a turn or the text (EOS, end-of-turn).
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop_tokens
    }

    /// Facts about the file and the load.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }
}

impl LanguageModel for Model {
    fn vocab_size(&self) -> usize {
        self.info.hparams.vocab
    }

    fn context_length(&self) -> usize {
        match &self.net {
            Net::Llama(m) => m.max_len(),
            Net::Gemma3(m) => m.max_len(),
        }
    }

    fn cache_len(&self) -> usize {
        match &self.net {
            Net::Llama(m) => m.len(),
            Net::Gemma3(m) => m.len(),
        }
    }

    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        let len = self.cache_len();
        if pos > len {
            return Err(Error::BadPosition { pos, len });
        }
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("forward called with no tokens".into()));
        }
        let capacity = self.context_length();
        if pos + tokens.len() > capacity {
            return Err(Error::ContextOverflow { needed: pos + tokens.len(), capacity });
        }
        let vocab = self.tokenizer.vocab_size().max(1) as u32;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= self.info.hparams.vocab as u32) {
            return Err(Error::TokenOutOfRange { id: bad, vocab_size: vocab as usize });
        }
        self.truncate(pos);
        let _span = tracing::trace_span!("forward", n = tokens.len(), pos).entered();
        match &mut self.net {
            Net::Llama(m) => m.forward(tokens),
            Net::Gemma3(m) => m.forward(tokens),
        }
    }

    fn truncate(&mut self, len: usize) {
        match &mut self.net {
            Net::Llama(m) => m.truncate(len),
            Net::Gemma3(m) => m.truncate(len),
        }
    }
}
