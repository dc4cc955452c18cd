//! Gemma 3 (`gemma3` GGUF files, e.g. Gemma3-270M).
//!
//! Differences from the llama family: embeddings scaled by √dim; RMS norms on q and k per head; norms
//! after attention and after the MLP as well as before; a GELU-gated MLP; five sliding-window layers
//! (window from `gemma3.attention.sliding_window`, rotary base 10 000) for every global layer (rotary
//! base `gemma3.rope.freq_base`); output tied to the embeddings.

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

/// Layers whose index + 1 is a multiple of this are global; the others use the sliding window.
const GLOBAL_EVERY: usize = 6;
const LOCAL_ROPE_BASE: f32 = 10_000.0;

struct Block {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
    post_ffn_norm: RmsNorm,
    window: Option<usize>,
    cache: KvCache,
}

/// A loaded Gemma 3 model with its KV cache.
pub struct Gemma3 {
    hp: Hparams,
    embed: Weight,
    blocks: Vec<Block>,
    norm: RmsNorm,
    output: Linear,
    rope_local: Rope,
    rope_global: Rope,
    device: Device,
    len: usize,
    max_len: usize,
    /// Which batches run on host buffers ([`Self::steps`]).
    host: HostPath,
    scratch: host::Scratch,
}

impl Gemma3 {
    pub(crate) fn load(g: &mut GgufFile, max_len: usize, dev: &Device) -> Result<Self> {
        let hp = Hparams::read(g, "gemma3")?;
        let (d, hd) = (hp.dim, hp.head_dim);
        let window = match g.usize_or("gemma3.attention.sliding_window", 512)? {
            0 => {
                return Err(crate::error::Error::Metadata {
                    path: g.path().into(),
                    key: "gemma3.attention.sliding_window".into(),
                    problem: "is zero".into(),
                })
            }
            w => w,
        };
        let embed = Weight::load(g, "token_embd.weight", [hp.vocab, d], dev)?;
        let mut blocks = Vec::with_capacity(hp.layers);
        for i in 0..hp.layers {
            let p = format!("blk.{i}");
            let norm = |g: &mut GgufFile, n: &str, dim| RmsNorm::load(g, &format!("{p}.{n}"), dim, hp.eps, dev);
            blocks.push(Block {
                attn_norm: norm(g, "attn_norm", d)?,
                q: Linear::load(g, &format!("{p}.attn_q"), [hp.heads * hd, d], dev)?,
                k: Linear::load(g, &format!("{p}.attn_k"), [hp.kv_heads * hd, d], dev)?,
                v: Linear::load(g, &format!("{p}.attn_v"), [hp.kv_heads * hd, d], dev)?,
                o: Linear::load(g, &format!("{p}.attn_output"), [d, hp.heads * hd], dev)?,
                q_norm: norm(g, "attn_q_norm", hd)?,
                k_norm: norm(g, "attn_k_norm", hd)?,
                post_attn_norm: norm(g, "post_attention_norm", d)?,
                ffn_norm: norm(g, "ffn_norm", d)?,
                mlp: GatedMlp::load(g, &p, d, hp.ffn, true, dev)?,
                post_ffn_norm: norm(g, "post_ffw_norm", d)?,
                window: ((i + 1) % GLOBAL_EVERY != 0).then_some(window),
                cache: KvCache::new(max_len, dev),
            });
        }
        let norm = RmsNorm::load(g, "output_norm", d, hp.eps, dev)?;
        let output = if g.has_tensor("output.weight") {
            Linear::load(g, "output", [hp.vocab, d], dev)?
        } else {
            Linear::new(g, embed.clone())?
        };
        let rope_local = Rope::new(hd, LOCAL_ROPE_BASE, 1.0, max_len, RopeStyle::Halves, None, dev)?;
        let rope_global = Rope::new(hd, hp.rope_base, hp.rope_scale, max_len, RopeStyle::Halves, None, dev)?;
        let host_steps = dev.is_cpu()
            && blocks.iter().all(|b| [&b.q, &b.k, &b.v, &b.o].iter().all(|l| l.on_kernels()) && b.mlp.on_kernels());
        Ok(Self {
            hp,
            embed,
            blocks,
            norm,
            output,
            rope_local,
            rope_global,
            device: dev.clone(),
            len: 0,
            max_len,
            host: HostPath::new(host_steps),
            scratch: Default::default(),
        })
    }

    /// Tokens on host buffers, each with a decode step's arithmetic (see `Llama::steps`), with Gemma's
    /// scaled embedding, per-head q/k norms, post-norms and sliding windows; the logits `want` says.
    fn steps(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let (m, kv, hd) = (tokens.len(), hp.kv_heads, hp.head_dim);
        let pos = self.len;
        let scale = 1.0 / (hd as f32).sqrt();
        let s = &mut self.scratch;
        s.x = self.embed.rows(tokens, &self.device)?.flatten_all()?.to_vec1::<f32>()?;
        let embed_scale = (hp.dim as f64).sqrt() as f32;
        s.x.iter_mut().for_each(|x| *x *= embed_scale);
        let mut one = Vec::new();
        for b in &mut self.blocks {
            b.attn_norm.host_rows(&s.x, &mut s.h);
            matvec_host_rows([&b.q, &b.k, &b.v], &s.h, m, [&mut s.q, &mut s.k, &mut s.v])?;
            b.q_norm.host_heads(&mut s.q);
            b.k_norm.host_heads(&mut s.k);
            let rope = if b.window.is_some() { &self.rope_local } else { &self.rope_global };
            let (qw, kw) = (s.q.len() / m, s.k.len() / m);
            s.a.clear();
            for i in 0..m {
                let q = &mut s.q[i * qw..(i + 1) * qw];
                let k = &mut s.k[i * kw..(i + 1) * kw];
                rope.host(q, pos + i)?;
                q.iter_mut().for_each(|x| *x *= scale);
                rope.host(k, pos + i)?;
                // Each position joins the cache before it attends: the batch sees itself causally.
                b.cache.attend_host(q, (k, &s.v[i * kw..(i + 1) * kw]), kv, b.window, &mut one)?;
                s.a.extend_from_slice(&one);
            }
            matvec_host_rows([&b.o], &s.a, m, [&mut s.y])?;
            b.post_attn_norm.host_rows(&s.y, &mut s.h);
            host::add(&mut s.x, &s.h);
            b.ffn_norm.host_rows(&s.x, &mut s.h);
            b.mlp.host_rows(&s.h, m, (&mut s.gate, &mut s.up), &mut s.y)?;
            b.post_ffn_norm.host_rows(&s.y, &mut s.h);
            host::add(&mut s.x, &s.h);
        }
        self.len += m;
        super::host_logits((&self.norm, &self.output), &s.x, m, want, &mut s.h, &self.device)
    }
}

impl super::Network for Gemma3 {
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

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        // On host buffers every token is computed as it would be alone (batch invariance: see
        // `Llama::forward`).
        if self.host.takes(tokens.len()) {
            return super::host_chunks(tokens, Logits::Last, |t, want| self.steps(t, want));
        }
        let hp = &self.hp;
        let (heads, kv, hd) = (hp.heads, hp.kv_heads, hp.head_dim);
        let pos = self.len;
        let mut x = (self.embed.rows(tokens, &self.device)?.unsqueeze(0)? * (hp.dim as f64).sqrt())?;
        let scale = 1.0 / (hd as f64).sqrt();
        for b in &mut self.blocks {
            let h = b.attn_norm.forward(&x)?;
            let [q, k, v] = forward_shared([&b.q, &b.k, &b.v], &h)?;
            let q = b.q_norm.forward(&split_heads(&q, heads, hd)?)?;
            let k = b.k_norm.forward(&split_heads(&k, kv, hd)?)?;
            let v = split_heads(&v, kv, hd)?;
            let rope = if b.window.is_some() { &self.rope_local } else { &self.rope_global };
            let q = (rope.apply(&q, pos)? * scale)?;
            let k = rope.apply(&k, pos)?;
            let (ks, vs) = b.cache.append(&k, &v)?;
            let a = attention(&q, &ks, &vs, b.window)?;
            x = (x + b.post_attn_norm.forward(&b.o.forward(&a)?)?)?;
            let h = b.ffn_norm.forward(&x)?;
            x = (x + b.post_ffn_norm.forward(&b.mlp.forward(&h)?)?)?;
        }
        self.len += tokens.len();
        let x = self.norm.forward(&last_position(&x)?)?;
        host_vec(&self.output.forward(&x)?)
    }
}
