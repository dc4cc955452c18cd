//! The llama family: `llama` (SmolLM2, Llama 3.x), `qwen2` (Qwen2.5-Coder), `qwen3`, `smollm3` and `phi3`
//! GGUF files.
//!
//! Pre-norm decoder blocks with grouped-query attention, rotary embeddings and a SiLU-gated MLP. The
//! architectures differ only in details kept in [`Variant`]: qwen2 has biases on q/k/v and "NeoX" (split
//! halves) rotary pairing; Llama 3.x files carry per-frequency rotary factors (`rope_freqs`); qwen3 has NeoX pairing, no biases, and an RMS norm over each query and key head
//! before the rotation; llama GGUF files were converted with q/k rows permuted for interleaved pairing;
//! phi3 (Phi-3, Phi-4-mini) fuses q/k/v and gate/up into one matrix each (split by rows at load), rotates
//! only the first dimensions of each head, and carries LongRoPE's short and long factors.

use candle_core::Device;

use super::attention::{attention, KvCache};
use super::host;
use super::layers::{
    forward_shared, host_vec, last_position, matvec_host_rows, split_heads, GatedMlp, Linear, RmsNorm, Rope, RopeStyle,
    Weight,
};
use super::{HostPath, Hparams, Logits};
use crate::error::Result;
use crate::gguf::GgufFile;

/// Which member of the family a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Llama,
    Qwen2,
    Qwen3,
    /// Llama's block; every fourth layer (the 4th, 8th, …) attends without rotary positions ("NoPE").
    SmolLM3,
    /// Fused `attn_qkv` and `ffn_up` (gate rows first), NeoX pairing on part of each head, LongRoPE.
    Phi3,
}

struct Block {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Per-head norms of the queries and keys (qwen3).
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
    cache: KvCache,
    /// Rotary positions on this layer's queries and keys (off in SmolLM3's NoPE layers).
    rotary: bool,
}

/// A loaded llama-family model with its KV cache.
pub struct Llama {
    hp: Hparams,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    output: Linear,
    rope: Rope,
    device: Device,
    len: usize,
    max_len: usize,
    /// Which batches run on host buffers ([`Self::steps`]).
    host: HostPath,
    scratch: host::Scratch,
}

impl Llama {
    pub(crate) fn load(g: &mut GgufFile, variant: Variant, max_len: usize, dev: &Device) -> Result<Self> {
        let arch = match variant {
            Variant::Llama => "llama",
            Variant::Qwen2 => "qwen2",
            Variant::Qwen3 => "qwen3",
            Variant::SmolLM3 => "smollm3",
            Variant::Phi3 => "phi3",
        };
        let hp = Hparams::read(g, arch)?;

        let (d, hd) = (hp.dim, hp.head_dim);
        let embed = Weight::load(g, "token_embd.weight", [hp.vocab, d], dev)?;
        let mut blocks = Vec::with_capacity(hp.layers);
        for i in 0..hp.layers {
            let p = format!("blk.{i}");
            let (qd, kvd) = (hp.heads * hd, hp.kv_heads * hd);
            let fused = format!("{p}.attn_qkv");
            let [q, k, v] = match variant == Variant::Phi3 && g.has_tensor(&format!("{fused}.weight")) {
                true => [0..qd, qd..qd + kvd, qd + kvd..qd + 2 * kvd]
                    .map(|rows| Linear::load_rows(g, &fused, rows, [qd + 2 * kvd, d], dev)),
                false => [("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)]
                    .map(|(n, out)| Linear::load(g, &format!("{p}.{n}"), [out, d], dev)),
            };
            blocks.push(Block {
                attn_norm: RmsNorm::load(g, &format!("{p}.attn_norm"), d, hp.eps, dev)?,
                q: q?,
                k: k?,
                v: v?,
                o: Linear::load(g, &format!("{p}.attn_output"), [d, hp.heads * hd], dev)?,
                qk_norm: match variant {
                    Variant::Qwen3 => Some((
                        RmsNorm::load(g, &format!("{p}.attn_q_norm"), hd, hp.eps, dev)?,
                        RmsNorm::load(g, &format!("{p}.attn_k_norm"), hd, hp.eps, dev)?,
                    )),
                    _ => None,
                },
                ffn_norm: RmsNorm::load(g, &format!("{p}.ffn_norm"), d, hp.eps, dev)?,
                mlp: match variant {
                    Variant::Phi3 => GatedMlp::load_fused(g, &p, d, hp.ffn, dev)?,
                    _ => GatedMlp::load(g, &p, d, hp.ffn, false, dev)?,
                },
                cache: KvCache::new(max_len, dev),
                rotary: !(variant == Variant::SmolLM3 && (i + 1) % 4 == 0),
            });
        }
        let norm = RmsNorm::load(g, "output_norm", d, hp.eps, dev)?;
        let output = if g.has_tensor("output.weight") {
            Linear::load(g, "output", [hp.vocab, d], dev)?
        } else {
            Linear::new(g, embed.clone())?
        };
        let rope_dim = hp.rope_dims(g, arch)?;
        let style = match variant {
            Variant::Llama | Variant::SmolLM3 => RopeStyle::Interleaved,
            Variant::Qwen2 | Variant::Qwen3 | Variant::Phi3 => RopeStyle::Halves,
        };
        // Per-frequency rotary factors (one per pair of rotated dimensions): Llama 3.x's `rope_freqs`;
        // Phi 3's LongRoPE factors, the long ones for a context past the one it was trained at (as
        // llama.cpp picks them, by the context the model runs with), with their attention factor.
        let (factors_name, magnitude) = match variant {
            Variant::Phi3 => {
                let orig = g.usize_or("phi3.rope.scaling.original_context_length", hp.context_length)?;
                let long = max_len > orig;
                let name = if long { "rope_factors_long.weight" } else { "rope_factors_short.weight" };
                (name, g.f32_or("phi3.rope.scaling.attn_factor", 1.0)?)
            }
            _ => ("rope_freqs.weight", 1.0),
        };
        let factors = match g.has_tensor(factors_name) {
            true => Some(
                g.tensor(factors_name, Some(&[rope_dim / 2]), &Device::Cpu)?
                    .dequantize(&Device::Cpu)?
                    .to_dtype(candle_core::DType::F32)?
                    .to_vec1::<f32>()?,
            ),
            false => None,
        };
        if let Some(bad) = factors.iter().flatten().find(|f| !(f.is_finite() && **f > 0.0)) {
            return Err(crate::error::Error::Tensor {
                path: g.path().into(),
                tensor: factors_name.into(),
                reason: format!("a factor of {bad}; each must be a positive number"),
            });
        }
        if !(magnitude.is_finite() && magnitude > 0.0) {
            return Err(crate::error::Error::Metadata {
                path: g.path().into(),
                key: "phi3.rope.scaling.attn_factor".into(),
                problem: format!("{magnitude} is not a positive number"),
            });
        }
        let rope = Rope::new(rope_dim, hp.rope_base, hp.rope_scale, max_len, style, factors.as_deref(), dev)?
            .with_head(hd)
            .with_magnitude(magnitude)?;
        let host_steps = dev.is_cpu()
            && blocks.iter().all(|b| [&b.q, &b.k, &b.v, &b.o].iter().all(|l| l.on_kernels()) && b.mlp.on_kernels());
        let scratch = host::Scratch::default();
        Ok(Self {
            hp,
            embed,
            blocks,
            norm,
            output,
            rope,
            device: dev.clone(),
            len: 0,
            max_len,
            host: HostPath::new(host_steps),
            scratch,
        })
    }

    /// Tokens on host buffers (`model::host`: the blocks' element-wise work and attention without
    /// tensors, the products on the kernels), each weight read once for all of them, every row with a
    /// decode step's arithmetic: one token is a decode step, and a token's numbers are the same bits in
    /// any batch. The logits `want` says (every position's: `tokens.len() × vocab`).
    fn steps(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let (m, kv, hd) = (tokens.len(), hp.kv_heads, hp.head_dim);
        let pos = self.len;
        let scale = 1.0 / (hd as f32).sqrt();
        let s = &mut self.scratch;
        s.x = self.embed.rows(tokens, &self.device)?.flatten_all()?.to_vec1::<f32>()?;
        let mut one = Vec::new();
        for b in &mut self.blocks {
            b.attn_norm.host_rows(&s.x, &mut s.h);
            matvec_host_rows([&b.q, &b.k, &b.v], &s.h, m, [&mut s.q, &mut s.k, &mut s.v])?;
            if let Some((qn, kn)) = &b.qk_norm {
                qn.host_heads(&mut s.q);
                kn.host_heads(&mut s.k);
            }
            s.q.iter_mut().for_each(|x| *x *= scale);
            let (qw, kw) = (s.q.len() / m, s.k.len() / m);
            s.a.clear();
            for i in 0..m {
                let q = &mut s.q[i * qw..(i + 1) * qw];
                let k = &mut s.k[i * kw..(i + 1) * kw];
                if b.rotary {
                    self.rope.host(q, pos + i)?;
                    self.rope.host(k, pos + i)?;
                }
                // Each position joins the cache before it attends: the batch sees itself causally.
                b.cache.attend_host(q, (k, &s.v[i * kw..(i + 1) * kw]), kv, None, &mut one)?;
                s.a.extend_from_slice(&one);
            }
            matvec_host_rows([&b.o], &s.a, m, [&mut s.y])?;
            host::add(&mut s.x, &s.y);
            b.ffn_norm.host_rows(&s.x, &mut s.h);
            b.mlp.host_rows(&s.h, m, (&mut s.gate, &mut s.up), &mut s.y)?;
            host::add(&mut s.x, &s.y);
        }
        self.len += m;
        super::host_logits((&self.norm, &self.output), &s.x, m, want, &mut s.h, &self.device)
    }
}

impl super::Network for Llama {
    fn hparams(&self) -> &Hparams {
        &self.hp
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for b in &mut self.blocks {
            b.cache.truncate(self.len);
        }
    }

    fn set_batch_invariant(&mut self, on: bool) -> bool {
        self.host.set_invariant(on)
    }

    fn export_kv(&self, len: usize) -> Option<Vec<super::attention::KvBlock>> {
        super::attention::export_layers(self.blocks.iter().map(|b| &b.cache), len)
    }

    fn import_kv(&mut self, blocks: &[super::attention::KvBlock]) -> Result<()> {
        let caches = self.blocks.iter_mut().map(|b| &mut b.cache).collect();
        self.len = super::attention::import_layers(caches, blocks, self.hp.kv_heads, self.hp.head_dim)?;
        Ok(())
    }

    fn verify_batch(&self) -> usize {
        self.host.verify_batch()
    }

    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self.host.takes(tokens.len()) {
            true => super::host_chunks(tokens, Logits::All, |t, want| self.steps(t, want)),
            false => super::forward_each(self, tokens),
        }
    }

    /// Runs `tokens` at the end of the cache; returns the last position's logits.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        // Batch invariance: on host buffers every batch (a decode step, a prompt, a sampled token with
        // forced ones, speculation's drafts) goes through `steps`, whose arithmetic is one token's, row
        // by row: a token's logits and KV entries are the same bits however the tokens are grouped and
        // wherever the batch starts, so a prefix loaded, kept or computed anew gives the same answer.
        // Without it (`LoadOptions::batch_invariant` off) only decode-sized batches do, and prompts take
        // the tensor path's batched kernels.
        if self.host.takes(tokens.len()) {
            return super::host_chunks(tokens, Logits::Last, |t, want| self.steps(t, want));
        }
        let hp = &self.hp;
        let (heads, kv, hd) = (hp.heads, hp.kv_heads, hp.head_dim);
        let pos = self.len;
        let mut x = self.embed.rows(tokens, &self.device)?.unsqueeze(0)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for b in &mut self.blocks {
            let h = b.attn_norm.forward(&x)?;
            let [q, k, v] = forward_shared([&b.q, &b.k, &b.v], &h)?;
            let (q, k) = (split_heads(&q, heads, hd)?, split_heads(&k, kv, hd)?);
            let (q, k) = match &b.qk_norm {
                Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
                None => (q, k),
            };
            let q = (q * scale)?;
            let v = split_heads(&v, kv, hd)?;
            let (q, k) = match b.rotary {
                true => (self.rope.apply(&q, pos)?, self.rope.apply(&k, pos)?),
                false => (q, k),
            };
            let (ks, vs) = b.cache.append(&k, &v)?;
            let a = attention(&q, &ks, &vs, None)?;
            x = (x + b.o.forward(&a)?)?;
            let h = b.ffn_norm.forward(&x)?;
            x = (x + b.mlp.forward(&h)?)?;
        }
        self.len += tokens.len();
        let x = self.norm.forward(&last_position(&x)?)?;
        host_vec(&self.output.forward(&x)?)
    }
}
