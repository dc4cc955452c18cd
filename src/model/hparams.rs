//! The hyper-parameters every decoder-only architecture reads from its GGUF metadata.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Reads a GGUF `{arch}.*` hyper-parameter set common to the decoder-only transformers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Hparams {
    pub layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub rope_scale: f32,
    pub context_length: usize,
    pub vocab: usize,
}

impl Hparams {
    pub(crate) fn read(g: &GgufFile, arch: &str) -> Result<Self> {
        let k = |s: &str| format!("{arch}.{s}");
        let bad = |key: &str, problem: String| Error::Metadata { path: g.path().into(), key: k(key), problem };
        // Sizes are checked before anything is allocated by them: a damaged count is an error naming its
        // key, not a shape mismatch at the first token or an allocation the size of the address space.
        let size = |key: &str| -> Result<usize> {
            match g.usize(&k(key))? {
                0 => Err(bad(key, "is zero".into())),
                n if n > MAX_DIM => Err(bad(key, format!("{n} is beyond any model (at most {MAX_DIM})"))),
                n => Ok(n),
            }
        };
        let dim = size("embedding_length")?;
        let heads = size("attention.head_count")?;
        if heads > dim {
            return Err(bad("attention.head_count", format!("{heads} heads for an embedding of {dim}")));
        }
        let kv_heads = g.usize_or(&k("attention.head_count_kv"), heads)?;
        if kv_heads == 0 || kv_heads > heads || heads % kv_heads != 0 {
            return Err(bad(
                "attention.head_count_kv",
                format!("{kv_heads} does not divide the {heads} attention heads"),
            ));
        }
        let head_dim = match g.get(&k("attention.key_length")) {
            Some(_) => size("attention.key_length")?,
            None if dim % heads != 0 => {
                return Err(bad("embedding_length", format!("{dim} is not a multiple of the {heads} attention heads")))
            }
            None => dim / heads,
        };
        let (tok_dims, _) = g.tensor_info("token_embd.weight")?;
        let vocab = tok_dims.first().copied().unwrap_or(0);
        // Rotary scaling this code does not implement is refused, never ignored (the positions would be
        // silently wrong).
        let scale = match g.get(&k("rope.scaling.type")).map(|_| g.str(&k("rope.scaling.type"))).transpose()? {
            Some("linear") => g.f32_or(&k("rope.scaling.factor"), 1.0)?,
            None | Some("none") => 1.0,
            Some(other) => {
                return Err(bad("rope.scaling.type", format!("`{other}` scaling is not supported (linear is)")));
            }
        };
        // Every block has tensors of its own: more blocks than tensors is a damaged count, refused before
        // anything is sized by it.
        let layers = g.usize(&k("block_count"))?;
        if layers == 0 || layers > g.tensor_count() {
            return Err(bad("block_count", format!("{layers} blocks for a file of {} tensors", g.tensor_count())));
        }
        let positive = |key: &str, default: f32| -> Result<f32> {
            match g.f32_or(&k(key), default)? {
                x if x.is_finite() && x > 0.0 => Ok(x),
                x => Err(bad(key, format!("{x} is not a positive number"))),
            }
        };
        let context_length = match g.get(&k("context_length")) {
            Some(_) => size("context_length")?,
            None => 2048,
        };
        Ok(Self {
            layers,
            dim,
            ffn: size("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            eps: positive("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base: positive("rope.freq_base", 10_000.0)?,
            rope_scale: positive("rope.scaling.factor", 1.0).map(|_| scale)?,
            context_length,
            vocab,
        })
    }

    /// The rotary dimensions (`{arch}.rope.dimension_count`, default the head size): even, and at most
    /// the head size.
    pub(crate) fn rope_dims(&self, g: &GgufFile, arch: &str) -> Result<usize> {
        let key = format!("{arch}.rope.dimension_count");
        match g.usize_or(&key, self.head_dim)? {
            n if n > 0 && n % 2 == 0 && n <= self.head_dim => Ok(n),
            n => Err(Error::Metadata {
                path: g.path().into(),
                key,
                problem: format!("{n} is not an even number of dimensions up to the head size {}", self.head_dim),
            }),
        }
    }
}

/// The largest embedding, feed-forward, head or context size a file may declare (2^24): far above any
/// model, far below sizes whose products overflow.
const MAX_DIM: usize = 1 << 24;
