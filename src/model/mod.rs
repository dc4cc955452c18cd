//! Model loading and the forward pass.
//!
//! [`LanguageModel`] is the small trait everything above this layer talks to: run new tokens at a
//! position, get the last position's logits; the KV cache persists between calls and can be truncated
//! back to any earlier length. [`Transformer`] is a GGUF file's network: weights on a device and the KV
//! cache, one `Network` per architecture. This module knows nothing about text, tools, grammars or
//! agents: the tokenizer, chat template and stop tokens are joined to it in `text` ([`crate::text::Model`]).

// Internals that tests and benches reach (hidden from the docs; not a stable API).
#[doc(hidden)]
pub mod amx;
pub mod attention;
#[doc(hidden)]
pub mod gemma3;
pub(crate) mod host;
mod hparams;
#[doc(hidden)]
pub mod kernels;
pub(crate) mod layers;
#[doc(hidden)]
pub mod llama;
pub(crate) mod pool;
pub mod prompt_cache;
#[doc(hidden)]
pub mod tiny;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::Device;

pub use hparams::Hparams;

/// How prompt-sized batches are multiplied on the CPU: `amx_bf16` (the AMX tile unit, where the CPU and
/// kernel allow it and `REAGENT_KERNELS` does not cap it), `int8_avx512`, `int8_vnni` or `int8_avx2`
/// (activations quantized to 8 bits, integer dot products in tiles of rows × tokens; Q8_0 matrices take
/// the f32 GEMM on AVX2) or `f32_gemm` (weights dequantized to f32).
pub fn prefill_kernel() -> &'static str {
    if amx::available() {
        "amx_bf16"
    } else if let Some(name) = kernels::int_matmul_name() {
        name
    } else {
        "f32_gemm"
    }
}

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

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
    /// [`Self::forward`], returning the logits of every position (`tokens.len() × vocab_size`, position
    /// after position): what a speculative step verifies its drafted tokens with.
    fn forward_all(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        let mut all = Vec::with_capacity(tokens.len() * self.vocab_size());
        for (i, &t) in tokens.iter().enumerate() {
            all.extend(self.forward(&[t], pos + i)?);
        }
        Ok(all)
    }
    /// How many tokens [`Self::forward_all`] runs at about the cost of one: 1 where it has no batched
    /// path, and drafting tokens would cost a step each.
    fn verify_batch(&self) -> usize {
        1
    }
}

/// The supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arch {
    Llama,
    Qwen2,
    /// Qwen 3: Qwen 2's block without q/k/v biases, with an RMS norm over each query and key head.
    Qwen3,
    /// SmolLM3: llama's block, without rotary positions in every fourth layer.
    SmolLM3,
    /// Phi 3 and Phi-4-mini: fused q/k/v and gate/up matrices, rotary on part of each head, LongRoPE.
    Phi3,
    Gemma3,
}

impl Arch {
    fn parse(path: &Path, s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "smollm3" => Ok(Arch::SmolLM3),
            "phi3" => Ok(Arch::Phi3),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(Error::UnsupportedArch { path: path.to_path_buf(), arch: other.to_string() }),
        }
    }

    /// The architecture a GGUF file declares (`general.architecture`); an unsupported one is an error.
    pub fn of(g: &GgufFile) -> Result<Self> {
        Self::parse(g.path(), g.str("general.architecture")?)
    }

    /// The GGUF architecture name.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::SmolLM3 => "smollm3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
        }
    }
}

/// One architecture's forward pass over its own KV cache.
pub(crate) trait Network: Send {
    fn hparams(&self) -> &Hparams;
    /// Positions the cache can hold.
    fn max_len(&self) -> usize;
    /// Positions in the cache.
    fn len(&self) -> usize;
    fn truncate(&mut self, len: usize);
    /// Runs `tokens` after the cached positions; the logits of the last one.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Runs `tokens` after the cached positions; the logits of every one, `tokens.len() × vocab`.
    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        forward_each(self, tokens)
    }
    /// How many tokens [`Self::forward_all`] runs at about the cost of one (1: no batch path).
    fn verify_batch(&self) -> usize {
        1
    }
    /// Asks for batch invariance ([`LoadOptions::batch_invariant`]); says whether it holds (the CPU, every
    /// block's weights on the kernels).
    fn set_batch_invariant(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// Each layer's keys and values for the first `len` positions (`None` off the CPU).
    fn export_kv(&self, len: usize) -> Option<Vec<attention::KvBlock>>;
    /// Replaces the cache with saved positions.
    fn import_kv(&mut self, blocks: &[attention::KvBlock]) -> Result<()>;
}

/// The most tokens a batched decode step takes ([`LanguageModel::forward_all`] on host buffers).
pub const VERIFY_BATCH: usize = 16;

/// Tokens per pass of a batch on host buffers (`Llama::steps`, `Gemma3::steps`): the activations of a
/// pass stay in L2 while every weight row is read once for all of them. The split changes no bit of the
/// result (each token's arithmetic is its own), only the speed.
const HOST_CHUNK: usize = 64;

/// Which batches a network runs on host buffers (its `steps`): a decode step's arithmetic, token by token.
#[derive(Clone, Copy, Default)]
struct HostPath {
    /// The CPU, every block's weights on the kernels: decode steps and decode-sized batches.
    steps: bool,
    /// Every batch, prompts too (batch invariance, [`LoadOptions::batch_invariant`]).
    invariant: bool,
}

impl HostPath {
    fn new(steps: bool) -> Self {
        Self { steps, invariant: false }
    }

    /// Asks for batch invariance; says whether it holds.
    fn set_invariant(&mut self, on: bool) -> bool {
        self.invariant = on && self.steps;
        self.invariant
    }

    /// Whether a batch of `n` tokens runs on host buffers.
    fn takes(&self, n: usize) -> bool {
        self.steps && (self.invariant || n <= VERIFY_BATCH)
    }

    /// [`Network::verify_batch`].
    fn verify_batch(&self) -> usize {
        if self.steps {
            VERIFY_BATCH
        } else {
            1
        }
    }
}

/// Which logits a batch on host buffers returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    /// None: an earlier pass of a prompt, wanted for its KV entries only.
    Skip,
    /// The last position's.
    Last,
    /// Every position's, one row after another.
    All,
}

/// The logits `want` says of a batch's `m` final host rows `x`: the final norm, then the output layer
/// (`h` is scratch).
fn host_logits(
    (norm, output): (&layers::RmsNorm, &layers::Linear),
    x: &[f32],
    m: usize,
    want: Logits,
    h: &mut Vec<f32>,
    dev: &Device,
) -> Result<Vec<f32>> {
    match want {
        Logits::Skip => Ok(Vec::new()),
        Logits::Last => {
            let d = x.len() / m;
            norm.host(&x[(m - 1) * d..], h);
            output.row_host(h, dev)
        }
        Logits::All => {
            norm.host_rows(x, h);
            output.rows_host(h, m, dev)
        }
    }
}

/// `steps` over `tokens` in passes of [`HOST_CHUNK`]: every position's logits for [`Logits::All`], else
/// the last one's.
fn host_chunks(
    tokens: &[u32],
    want: Logits,
    mut steps: impl FnMut(&[u32], Logits) -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    let passes = tokens.len().div_ceil(HOST_CHUNK);
    for (i, chunk) in tokens.chunks(HOST_CHUNK).enumerate() {
        match want {
            Logits::All => out.extend(steps(chunk, Logits::All)?),
            _ if i + 1 == passes => out = steps(chunk, Logits::Last)?,
            _ => drop(steps(chunk, Logits::Skip)?),
        }
    }
    Ok(out)
}

/// [`Network::forward_all`] one token at a time.
fn forward_each<N: Network + ?Sized>(net: &mut N, tokens: &[u32]) -> Result<Vec<f32>> {
    let mut all = Vec::with_capacity(tokens.len() * net.hparams().vocab);
    for &t in tokens {
        all.extend(net.forward(&[t])?);
    }
    Ok(all)
}

/// Options for [`crate::text::Model::load`] (the tokenizer option is read there).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Where tensors live.
    pub device: Device,
    /// Cap on the context (KV cache and rotary tables); defaults to `min(file's context, 8192)`.
    pub max_context: Option<usize>,
    /// Use this tokenizer.json instead of the GGUF's tokenizer.
    pub tokenizer_json: Option<PathBuf>,
    /// Use this Jinja chat template instead of the GGUF's `tokenizer.chat_template`: one that renders tools
    /// and calls where the file's own does not (Phi-4-mini's takes its tools in a system message's text
    /// and renders no calls), or a fixed one.
    pub chat_template: Option<PathBuf>,
    /// Compute every matrix product in f32 on dequantized weights, decode steps included: slow, and the
    /// reference the quantized kernels are tested against.
    pub f32_reference: bool,
    /// On the CPU, read the weights into memory on huge pages ([`GgufFile::copy_to_huge_pages`]) rather
    /// than use them from the file's map: decoding a memory-bound model up to a quarter faster (the 1.5B
    /// +25% on the development machine; the small models unchanged), for a private copy of the file instead
    /// of shared page cache (peak RSS about 10% over the file) and the kernel's time to find the pages at
    /// load (0.05 to 1.3 s for 1.1 GB). On by default; `REAGENT_HUGE_PAGES=0` turns the default off.
    pub huge_pages: bool,
    /// Batch invariance (on the CPU, every weight on the kernels): every batch, a prompt's included, runs
    /// each token through a decode step's arithmetic, so a token's logits and KV entries are the same bits
    /// however the tokens were batched, and no result depends on what a cache held. Off, prompts of more
    /// than 16 tokens take the integer tiles (or AMX): about twice the prefill speed, with results that
    /// differ in their last bits with the split. On by default; `REAGENT_BATCH_INVARIANT=0` turns the
    /// default off.
    pub batch_invariant: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let huge_pages = std::env::var("REAGENT_HUGE_PAGES").map_or(true, |v| v != "0");
        let batch_invariant = std::env::var("REAGENT_BATCH_INVARIANT").map_or(true, |v| v != "0");
        Self {
            device: Device::Cpu,
            max_context: None,
            tokenizer_json: None,
            chat_template: None,
            f32_reference: false,
            huge_pages,
            batch_invariant,
        }
    }
}

setters!(LoadOptions {
    device: Device,
    max_context: Option<usize>,
    tokenizer_json: Option<PathBuf>,
    chat_template: Option<PathBuf>,
    f32_reference: bool,
    huge_pages: bool,
    batch_invariant: bool,
});

/// Facts about a loaded model.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ModelInfo {
    pub path: PathBuf,
    pub arch: Arch,
    pub name: Option<String>,
    pub file_bytes: u64,
    /// Bytes of weights a decode step reads ([`GgufFile::decode_bytes_per_token`]).
    pub decode_bytes_per_token: u64,
    pub hparams: Hparams,
    pub load_time: Duration,
    /// Whether the weights are on huge pages ([`LoadOptions::huge_pages`], granted by the kernel).
    pub huge_pages: bool,
    /// Whether every product runs in f32 ([`LoadOptions::f32_reference`]).
    pub f32_reference: bool,
    /// Whether batches run a decode step's arithmetic token by token ([`LoadOptions::batch_invariant`],
    /// where the device and weights allow it).
    pub batch_invariant: bool,
}

impl ModelInfo {
    /// How prompt-sized batches are computed: `invariant` (a decode step's arithmetic, token by token),
    /// else [`prefill_kernel`]'s name.
    pub fn prefill_path(&self) -> &'static str {
        if self.batch_invariant {
            "invariant"
        } else {
            prefill_kernel()
        }
    }
}

/// A GGUF file's network: its weights on a device and the KV cache.
pub struct Transformer {
    net: Box<dyn Network>,
    info: ModelInfo,
}

impl Transformer {
    /// Builds the network of an open GGUF file; `info().load_time` counts from `started`.
    pub fn load(g: &mut GgufFile, opts: &LoadOptions, started: Instant) -> Result<Self> {
        kernels::check_kernel_cap()?;
        g.f32_reference = opts.f32_reference;
        let path = g.path().to_path_buf();
        let file_bytes = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
        let arch = Arch::of(g)?;
        let file_ctx = g.usize_or(&format!("{}.context_length", arch.as_str()), 2048)?;
        let max_len = opts.max_context.unwrap_or(8192).min(file_ctx).max(1);
        let dev = &opts.device;
        // After the checks that can refuse the file, before the layers take their tensors. Only an
        // optimisation: a copy that fails (no memory for it) leaves the weights in the file's map.
        let huge_pages = dev.is_cpu() && opts.huge_pages && g.copy_to_huge_pages().unwrap_or(false);
        let mut net: Box<dyn Network> = match arch {
            Arch::Llama => Box::new(llama::Llama::load(g, llama::Variant::Llama, max_len, dev)?),
            Arch::Qwen2 => Box::new(llama::Llama::load(g, llama::Variant::Qwen2, max_len, dev)?),
            Arch::Qwen3 => Box::new(llama::Llama::load(g, llama::Variant::Qwen3, max_len, dev)?),
            Arch::SmolLM3 => Box::new(llama::Llama::load(g, llama::Variant::SmolLM3, max_len, dev)?),
            Arch::Phi3 => Box::new(llama::Llama::load(g, llama::Variant::Phi3, max_len, dev)?),
            Arch::Gemma3 => Box::new(gemma3::Gemma3::load(g, max_len, dev)?),
        };
        let batch_invariant = net.set_batch_invariant(opts.batch_invariant);
        let hparams = net.hparams().clone();
        let name = g.str_opt("general.name")?.map(String::from);
        let decode_bytes_per_token = g.decode_bytes_per_token();
        let info = ModelInfo {
            path,
            arch,
            name,
            file_bytes,
            decode_bytes_per_token,
            hparams,
            load_time: started.elapsed(),
            huge_pages,
            f32_reference: opts.f32_reference,
            batch_invariant,
        };
        Ok(Self { net, info })
    }

    /// Facts about the file and the load.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The KV cache's first `len` positions, to save ([`prompt_cache`]); `None` off the CPU or when fewer
    /// positions are cached.
    pub fn export_prefix(&self, len: usize) -> Option<KvPrefix> {
        Some(KvPrefix { layers: self.net.export_kv(len)?, len })
    }

    /// Refuses a batch that cannot run at `pos`: past the cache's end, empty, over the context, or with a
    /// token outside the vocabulary.
    fn check_batch(&self, tokens: &[u32], pos: usize) -> Result<()> {
        let len = self.cache_len();
        if pos > len {
            return Err(Error::BadPosition { pos, len });
        }
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let capacity = self.context_length();
        if pos + tokens.len() > capacity {
            return Err(Error::ContextOverflow { needed: pos + tokens.len(), capacity });
        }
        let vocab = self.info.hparams.vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { id: bad, vocab_size: vocab });
        }
        Ok(())
    }

    /// Replaces the KV cache with a saved prefix.
    pub fn import_prefix(&mut self, prefix: &KvPrefix) -> Result<()> {
        if prefix.len > self.context_length() {
            return Err(Error::ContextOverflow { needed: prefix.len, capacity: self.context_length() });
        }
        self.net.import_kv(&prefix.layers)
    }
}

/// Saved KV cache positions of a model: every layer's keys and values for the first `len` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPrefix {
    pub len: usize,
    pub layers: Vec<attention::KvBlock>,
}

impl KvPrefix {
    /// Keeps the first `len` positions (all of them when there are fewer).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for layer in &mut self.layers {
            let keep = len * layer.d;
            layer.k.iter_mut().chain(layer.v.iter_mut()).for_each(|b| b.truncate(keep));
            layer.len = len;
        }
        self.len = len;
    }

    /// A copy of the first `len` positions (all of them when there are fewer), copying only those.
    pub fn prefix(&self, len: usize) -> KvPrefix {
        let len = len.min(self.len);
        let cut = |b: &Vec<f32>, d: usize| b[..(len * d).min(b.len())].to_vec();
        let layers = self
            .layers
            .iter()
            .map(|l| attention::KvBlock {
                d: l.d,
                len,
                k: l.k.iter().map(|b| cut(b, l.d)).collect(),
                v: l.v.iter().map(|b| cut(b, l.d)).collect(),
            })
            .collect();
        KvPrefix { len, layers }
    }

    /// Bytes the keys and values take.
    pub fn bytes(&self) -> usize {
        let floats: usize = self.layers.iter().flat_map(|l| l.k.iter().chain(&l.v)).map(Vec::len).sum();
        floats * std::mem::size_of::<f32>()
    }
}

impl LanguageModel for Transformer {
    fn vocab_size(&self) -> usize {
        self.info.hparams.vocab
    }

    fn context_length(&self) -> usize {
        self.net.max_len()
    }

    fn cache_len(&self) -> usize {
        self.net.len()
    }

    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.check_batch(tokens, pos)?;
        self.truncate(pos);
        let _span = tracing::trace_span!("forward", n = tokens.len(), pos).entered();
        self.net.forward(tokens)
    }

    fn truncate(&mut self, len: usize) {
        self.net.truncate(len)
    }

    fn forward_all(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.check_batch(tokens, pos)?;
        self.truncate(pos);
        let _span = tracing::trace_span!("forward_all", n = tokens.len(), pos).entered();
        self.net.forward_all(tokens)
    }

    fn verify_batch(&self) -> usize {
        self.net.verify_batch()
    }
}
