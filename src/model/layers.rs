//! Building blocks shared by the architectures: quantized linear layers, RMS norm, rotary embeddings,
//! a truncatable KV cache and grouped-query attention.

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::amx;
use super::kernels::{self, BlockType, Q8Block};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, MappedTensor};

/// A weight matrix (`[rows, cols]`, outermost first). On the CPU, the 32-element block types reagent's
/// kernels handle are read in place from the memory-mapped file; everything else (K-quants, floats, GPU
/// devices) is a candle `QTensor`.
#[derive(Clone)]
pub(crate) enum Weight {
    Mapped { t: BlockType, m: MappedTensor },
    Candle(Arc<QTensor>),
}

impl Weight {
    /// Loads tensor `name` of shape `[rows, cols]`.
    pub(crate) fn load(g: &GgufFile, name: &str, rows_cols: [usize; 2], dev: &Device) -> Result<Self> {
        let (_, dtype) = g.tensor_info(name)?;
        Ok(match BlockType::of(dtype) {
            Some(t) if dev.is_cpu() => {
                if !rows_cols[1].is_multiple_of(t.block_elems()) {
                    return Err(Error::Tensor {
                        path: g.path().to_path_buf(),
                        tensor: name.to_string(),
                        reason: format!("rows of {} elements are not whole {dtype:?} blocks", rows_cols[1]),
                    });
                }
                Weight::Mapped { t, m: g.mapped(name, Some(&rows_cols))? }
            }
            _ => Weight::Candle(Arc::new(g.tensor(name, Some(&rows_cols), dev)?)),
        })
    }

    fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Weight::Mapped { m, .. } => (m.dims[0], m.dims[1]),
            Weight::Candle(q) => q.shape().dims2()?,
        })
    }

    /// Rows `ids` of the matrix as f32, shape `[ids.len(), cols]` (an embedding lookup).
    pub(crate) fn rows(&self, ids: &[u32], dev: &Device) -> Result<Tensor> {
        match self {
            Weight::Mapped { t, m } => {
                let (rows, cols) = self.dims()?;
                let row_bytes = t.row_bytes(cols);
                let w = m.bytes();
                let mut out = vec![0f32; ids.len() * cols];
                for (&id, o) in ids.iter().zip(out.chunks_exact_mut(cols)) {
                    if id as usize >= rows {
                        return Err(Error::TokenOutOfRange { id, vocab_size: rows });
                    }
                    let r = &w[id as usize * row_bytes..(id as usize + 1) * row_bytes];
                    for (b, ob) in r.chunks_exact(t.block_bytes()).zip(o.chunks_exact_mut(t.block_elems())) {
                        kernels::dequantize_block(*t, b, ob);
                    }
                }
                Ok(Tensor::from_vec(out, (ids.len(), cols), dev)?)
            }
            Weight::Candle(q) => Ok(q.embedding(&Tensor::new(ids, dev)?)?),
        }
    }
}

/// A linear layer over quantized (or f32) weights, with an optional f32 bias.
pub(crate) struct Linear {
    w: Weight,
    /// candle's layer over a [`Weight::Candle`].
    mm: Option<QMatMul>,
    b: Option<Tensor>,
    /// The bias on the host, for [`matvec_host`] (CPU only).
    b_host: Option<Vec<f32>>,
    /// Every product in f32 on dequantized weights (see `LoadOptions::f32_reference`).
    reference: bool,
}

/// Batches of at least this many rows are multiplied as matrices instead of row by row through the
/// mat-vec kernel: on CPUs with AMX, in the tile unit with bf16 inputs (`model::amx`: weights dequantized a
/// 32-row panel at a time); elsewhere by weights dequantized to f32, one matrix at a time, and candle's f32
/// GEMM (exact f32 results; the copy is dropped after the call, so memory stays at the quantized size).
/// Decode steps (one row) and short forced-token batches keep the quantized mat-vec.
pub(crate) const MATMUL_BATCH_MIN: usize = 16;

/// The same threshold for the integer prefill (`kernels::matmul`): its tiles read each weight block once
/// per 2 tokens, after packing the weights once per call, where the mat-vec reads it once per token.
pub(crate) const INT_BATCH_MIN: usize = 4;

/// The same threshold for weights the AMX path takes. Its cost at small batches is preparing the weights
/// (dequantize, round to bf16, lay out as tiles: ~0.1 s for all of Qwen 0.5B on 2 threads); measured on
/// Qwen 0.5B, 2 threads, it matches the mat-vec kernel at 8 rows (74 tok/s each) and is 1.7× faster at 15.
pub(crate) const AMX_BATCH_MIN: usize = 10;

impl Linear {
    /// Loads `{name}.weight` (shape `[out, in]`) and `{name}.bias` if present.
    pub(crate) fn load(g: &GgufFile, name: &str, out_in: [usize; 2], dev: &Device) -> Result<Self> {
        let w = Weight::load(g, &format!("{name}.weight"), out_in, dev)?;
        let bias_name = format!("{name}.bias");
        let b = if g.has_tensor(&bias_name) {
            Some(g.tensor(&bias_name, Some(&[out_in[0]]), dev)?.dequantize(dev)?)
        } else {
            None
        };
        let mut l = Self::new(g, w)?;
        if dev.is_cpu() {
            l.b_host = b.as_ref().map(|b| b.to_vec1::<f32>()).transpose()?;
        }
        l.b = b;
        Ok(l)
    }

    /// A bias-free layer over an already loaded weight of `g` (tied embeddings).
    pub(crate) fn new(g: &GgufFile, w: Weight) -> Result<Self> {
        let mm = match &w {
            Weight::Candle(q) => Some(QMatMul::from_arc(q.clone())?),
            Weight::Mapped { .. } => None,
        };
        Ok(Self { w, mm, b: None, b_host: None, reference: g.f32_reference })
    }

    /// Whether single rows go through reagent's mat-vec kernels ([`matvec_host`]): weights mapped from the
    /// file on the CPU, not the f32 reference.
    pub(crate) fn on_kernels(&self) -> bool {
        !self.reference && matches!(self.w, Weight::Mapped { .. })
    }

    /// `x · Wᵀ (+ b)` for one host row: on the kernels where the weights are, else through candle on `dev`.
    pub(crate) fn row_host(&self, x: &[f32], dev: &Device) -> Result<Vec<f32>> {
        if self.on_kernels() {
            let mut y = Vec::new();
            matvec_host([self], x, [&mut y])?;
            return Ok(y);
        }
        logits_to_vec(&self.forward(&Tensor::from_slice(x, (1, 1, x.len()), dev)?)?)
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        let on_amx = match &self.w {
            Weight::Mapped { t, .. } => !self.reference && x.device().is_cpu() && amx_ok(*t, self.w.dims()?),
            Weight::Candle(_) => false,
        };
        let on_int = match &self.w {
            Weight::Mapped { t, .. } => {
                !on_amx && !self.reference && x.device().is_cpu() && kernels::int_matmul_supports(*t)
            }
            Weight::Candle(_) => false,
        };
        let min_rows = match (on_amx, on_int) {
            (true, _) => AMX_BATCH_MIN,
            (_, true) => INT_BATCH_MIN,
            _ => MATMUL_BATCH_MIN,
        };
        let batched = self.reference || rows >= min_rows;
        let y = match (&self.w, &self.mm) {
            (Weight::Mapped { t, m }, _) if batched && on_amx => {
                let (n, k) = self.w.dims()?;
                let xs = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                shaped_like(x, amx::matmul_t(*t, m.bytes(), n, k, &xs), n)?
            }
            (Weight::Mapped { t, m }, _) if batched && on_int => {
                let (n, k) = self.w.dims()?;
                let xs = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                shaped_like(x, kernels::matmul(*t, m.bytes(), n, k, &xs), n)?
            }
            (Weight::Mapped { t, m }, _) if batched => {
                let (n, k) = self.w.dims()?;
                let w = Tensor::from_vec(kernels::dequantize(*t, m.bytes(), n, k), (n, k), x.device())?;
                x.broadcast_matmul(&w.t()?)?
            }
            (Weight::Mapped { t, m }, _) => block_matvec(*t, m.bytes(), self.w.dims()?, x)?,
            (Weight::Candle(q), Some(QMatMul::QTensor(_))) if batched && x.device().is_cpu() => {
                let w = q.dequantize(x.device())?;
                x.broadcast_matmul(&w.t()?)?
            }
            (_, Some(mm)) => mm.forward(x)?,
            (Weight::Candle(_), None) => unreachable!("`new` builds a QMatMul for every candle weight"),
        };
        self.add_bias(y)
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// `x · Wᵀ (+ b)` for several layers that share their input (q/k/v, gate/up). A decode row on the CPU
/// kernels quantizes `x` once per block size and runs every product in one dispatch to the workers;
/// anything else goes layer by layer through [`Linear::forward`]. Same results either way.
pub(crate) fn forward_shared<const N: usize>(layers: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
    let k = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / k;
    if rows != 1 || !layers.iter().all(|l| l.on_kernels()) || !x.device().is_cpu() {
        let mut out = Vec::with_capacity(N);
        for l in layers {
            out.push(l.forward(x)?);
        }
        return Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per layer")));
    }
    let xs = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let mut ys: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
    matvec_host(layers, &xs, ys.each_mut())?;
    let mut out = Vec::with_capacity(N);
    for y in ys {
        let n = y.len();
        out.push(shaped_like(x, y, n)?);
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per layer")))
}

/// `ys[i] = x · W_iᵀ (+ b_i)` for one row on host buffers, every layer on the kernels
/// ([`Linear::on_kernels`]): `x` quantized once per block size, every product in one dispatch to the
/// workers. `ys` are resized to the layers' outputs.
pub(crate) fn matvec_host<const N: usize>(layers: [&Linear; N], x: &[f32], ys: [&mut Vec<f32>; N]) -> Result<()> {
    let k = x.len();
    // Activations quantized per 32-element block, and per super-block for the K-quants.
    let (mut per_block, mut per_super) = (None, None);
    for l in &layers {
        let (Weight::Mapped { t, .. }, false) = (&l.w, l.reference) else {
            return Err(Error::param("layer", "single-row products on the host need weights on the kernels"));
        };
        let cols = l.w.dims()?.1;
        if cols != k {
            return Err(Error::param("x", format!("{k} values for a layer of {cols} inputs")));
        }
        let slot = if t.block_elems() == kernels::QK { &mut per_block } else { &mut per_super };
        if slot.is_none() {
            let mut q = vec![Q8Block::default(); k / kernels::QK];
            kernels::quantize_row_q8_for(*t, x, &mut q);
            *slot = Some(q);
        }
    }
    let mut jobs = Vec::with_capacity(N);
    let mut biases = Vec::with_capacity(N);
    for (l, y) in layers.iter().zip(ys) {
        let Weight::Mapped { t, m } = &l.w else { unreachable!("checked above") };
        let rows = l.w.dims()?.0;
        y.clear();
        y.resize(rows, 0.0);
        let x = if t.block_elems() == kernels::QK { &per_block } else { &per_super };
        let x = x.as_deref().expect("quantized above");
        biases.push(l.b_host.as_deref());
        jobs.push(kernels::MatVecJob { t: *t, w: m.bytes(), rows, x, y: y.as_mut_slice() });
    }
    kernels::matvec_jobs(&mut jobs);
    for (job, b) in jobs.iter_mut().zip(biases) {
        if let Some(b) = b {
            super::host::add(job.y, b);
        }
    }
    Ok(())
}

/// Whether a batch goes through the AMX tile unit (see `model::amx`) for this weight.
fn amx_ok(t: BlockType, (n, k): (usize, usize)) -> bool {
    amx::available() && amx::supports(t, n, k)
}

/// Rows of `x` times a 32-element-block quantized `[n, k]` matrix, through reagent's own kernels.
fn block_matvec(t: BlockType, w: &[u8], (n, k): (usize, usize), x: &Tensor) -> Result<Tensor> {
    let xs = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let rows = xs.len() / k;
    let mut y = vec![0f32; rows * n];
    let mut xq = vec![Q8Block::default(); k / kernels::QK];
    for (xr, yr) in xs.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
        kernels::quantize_row_q8_for(t, xr, &mut xq);
        kernels::matvec(t, w, n, &xq, yr);
    }
    shaped_like(x, y, n)
}

/// `y` as a tensor of `x`'s shape with the last dimension `n` (the output of a layer applied to `x`).
fn shaped_like(x: &Tensor, y: Vec<f32>, n: usize) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("at least one dimension") = n;
    Ok(Tensor::from_vec(y, dims, x.device())?)
}

/// RMS normalisation with a learned scale (GGUF stores Gemma's `1 + w` already folded in).
pub(crate) struct RmsNorm {
    w: Tensor,
    /// The scale on the host (CPU only), for [`Self::host`].
    w_host: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub(crate) fn load(g: &GgufFile, name: &str, dim: usize, eps: f32, dev: &Device) -> Result<Self> {
        let w = g.tensor(&format!("{name}.weight"), Some(&[dim]), dev)?.dequantize(dev)?;
        let w_host = if dev.is_cpu() { w.to_dtype(DType::F32)?.to_vec1::<f32>()? } else { Vec::new() };
        Ok(Self { w, w_host, eps })
    }

    /// `out = norm(x)` on host buffers (CPU only).
    pub(crate) fn host(&self, x: &[f32], out: &mut Vec<f32>) {
        out.resize(x.len(), 0.0);
        super::host::rms_norm(x, &self.w_host, self.eps, out);
    }

    /// Every `w`-sized head of `x` normalised in place (CPU only).
    pub(crate) fn host_heads(&self, x: &mut [f32]) {
        for head in x.chunks_exact_mut(self.w_host.len()) {
            super::host::rms_norm_in_place(head, &self.w_host, self.eps);
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.w, self.eps)?)
    }
}

/// How rotary embeddings pair up dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeStyle {
    /// Adjacent pairs (llama GGUF files, whose q/k rows were permuted at conversion).
    Interleaved,
    /// First half with second half (qwen2, gemma3: "NeoX" style).
    Halves,
}

/// Precomputed cos/sin tables for every position of the context.
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
    /// The tables on the host (CPU only), `max_pos × dim/2` each, for [`Self::host`].
    host: Option<(Vec<f32>, Vec<f32>)>,
    half: usize,
}

impl Rope {
    pub(crate) fn new(
        dim: usize,
        base: f32,
        scale: f32,
        max_pos: usize,
        style: RopeStyle,
        dev: &Device,
    ) -> Result<Self> {
        let inv: Vec<f32> = (0..dim / 2).map(|i| 1.0 / base.powf(2.0 * i as f32 / dim as f32)).collect();
        let inv = Tensor::from_vec(inv, (1, dim / 2), dev)?;
        let pos =
            (Tensor::arange(0u32, max_pos as u32, dev)?.to_dtype(DType::F32)? / scale as f64)?.reshape((max_pos, 1))?;
        let freqs = pos.broadcast_mul(&inv)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let host = match dev.is_cpu() {
            true => Some((cos.flatten_all()?.to_vec1::<f32>()?, sin.flatten_all()?.to_vec1::<f32>()?)),
            false => None,
        };
        Ok(Self { cos, sin, style, host, half: dim / 2 })
    }

    /// Rotates every head of `x` (host buffers, heads of exactly the rotary size) for position `pos`.
    pub(crate) fn host(&self, x: &mut [f32], pos: usize) -> Result<()> {
        let Some((cos, sin)) = &self.host else {
            return Err(Error::param("rope", "rotary tables are on the host only on the CPU"));
        };
        let h = self.half;
        let (cos, sin) = match (cos.get(pos * h..(pos + 1) * h), sin.get(pos * h..(pos + 1) * h)) {
            (Some(c), Some(s)) => (c, s),
            _ => return Err(Error::param("pos", format!("position {pos} is past the rotary tables"))),
        };
        super::host::rope(x, cos, sin, 2 * h, self.style == RopeStyle::Interleaved);
        Ok(())
    }

    /// The rotary size (dimensions rotated per head).
    pub(crate) fn dims(&self) -> usize {
        2 * self.half
    }

    /// Rotates `x` of shape `[batch, heads, seq, head_dim]` for positions `pos..pos+seq`.
    pub(crate) fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        })
    }
}

/// Keys and values of one layer, grown in chunks and truncatable to any earlier length.
///
/// On the CPU they are host buffers, per KV head `len × head_dim`, which a decode step reads and extends in
/// place ([`Self::push_host`], [`Self::host`]); the batched path gets them as `[1, kv_heads, len, head_dim]`
/// tensors (a copy, as its attention made before). On other devices, tensors of that layout with room to
/// grow. Truncation moves `len`, so rolling back a rejected decision costs nothing.
pub(crate) struct KvCache {
    store: KvStore,
    len: usize,
    max: usize,
}

enum KvStore {
    /// Per KV head, `len × d` values (the buffers hold exactly `len` positions).
    Host {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
        d: usize,
    },
    Device {
        k: Option<Tensor>,
        v: Option<Tensor>,
    },
}

/// Positions added to a KV buffer when it grows (at the least).
const KV_CHUNK: usize = 128;

/// The capacity a buffer grows to for `needed` positions: whole chunks, and at least a quarter more than
/// before so long contexts grow geometrically (the copies stay linear in the final length) while short ones
/// waste at most a chunk; never past `max`.
fn grown(cap: usize, needed: usize, max: usize) -> usize {
    needed.div_ceil(KV_CHUNK).saturating_mul(KV_CHUNK).max(cap + cap / 4).min(max).max(needed)
}

impl KvCache {
    pub(crate) fn new(max: usize, dev: &Device) -> Self {
        let store = match dev.is_cpu() {
            true => KvStore::Host { k: Vec::new(), v: Vec::new(), d: 0 },
            false => KvStore::Device { k: None, v: None },
        };
        Self { store, len: 0, max }
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        if let KvStore::Host { k, v, d } = &mut self.store {
            let keep = self.len * *d;
            k.iter_mut().chain(v.iter_mut()).for_each(|b| b.truncate(keep));
        }
    }

    /// The live keys and values on the host (CPU only).
    fn host(&self) -> Option<super::host::KvView<'_>> {
        match &self.store {
            KvStore::Host { k, v, d } => Some(super::host::KvView { k, v, len: self.len, d: *d }),
            KvStore::Device { .. } => None,
        }
    }

    /// Appends one position's keys and values (`kv_heads × d` each) and writes the attention of `q` (`heads
    /// × d`, already scaled) over the cache, seeing the last `window` positions, into `out` (host buffers;
    /// CPU only).
    pub(crate) fn attend_host(
        &mut self,
        q: &[f32],
        (keys, values): (&[f32], &[f32]),
        kv_heads: usize,
        window: Option<usize>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.push_host(keys, values, kv_heads)?;
        out.resize(q.len(), 0.0);
        let view = self.host().expect("pushed to host buffers above");
        super::host::attend_one(q, &view, window, out);
        Ok(())
    }

    /// Appends one position's keys and values (`kv_heads × d` each, host buffers; CPU only).
    fn push_host(&mut self, keys: &[f32], values: &[f32], kv_heads: usize) -> Result<()> {
        let KvStore::Host { k, v, d } = &mut self.store else {
            return Err(Error::param("cache", "host buffers are for the CPU"));
        };
        if self.len >= self.max {
            return Err(Error::ContextOverflow { needed: self.len + 1, capacity: self.max });
        }
        let hd = keys.len() / kv_heads;
        if k.is_empty() {
            *k = vec![Vec::new(); kv_heads];
            *v = vec![Vec::new(); kv_heads];
            *d = hd;
        }
        let (len, max) = (self.len, self.max);
        for (buf, src) in k.iter_mut().zip(keys.chunks_exact(hd)).chain(v.iter_mut().zip(values.chunks_exact(hd))) {
            if buf.capacity() < (len + 1) * hd {
                buf.reserve_exact(grown(buf.capacity() / hd.max(1), len + 1, max) * hd - buf.len());
            }
            buf.extend_from_slice(src);
        }
        self.len += 1;
        Ok(())
    }

    fn grow(buf: &Option<Tensor>, like: &Tensor, needed: usize, max: usize) -> Result<Tensor> {
        let (b, h, _, d) = like.dims4()?;
        let cap = buf.as_ref().map(|t| t.dim(2)).transpose()?.unwrap_or(0);
        if cap >= needed {
            return Ok(buf.clone().expect("capacity implies a buffer"));
        }
        let fresh = Tensor::zeros((b, h, grown(cap, needed, max), d), like.dtype(), like.device())?;
        if let Some(old) = buf {
            fresh.slice_set(old, 2, 0)?;
        }
        Ok(fresh)
    }

    /// Appends `k`, `v` (`[1, kv_heads, seq, head_dim]`) and returns all live keys and values.
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (_, kv_heads, seq, hd) = k.dims4()?;
        let needed = self.len + seq;
        match &mut self.store {
            KvStore::Host { k: kh, v: vh, d } => {
                if kh.is_empty() {
                    *kh = vec![Vec::new(); kv_heads];
                    *vh = vec![Vec::new(); kv_heads];
                    *d = hd;
                }
                let live = |bufs: &mut Vec<Vec<f32>>, new: &Tensor| -> Result<Tensor> {
                    let new = new.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                    let mut all = Vec::with_capacity(kv_heads * needed * hd);
                    for (buf, src) in bufs.iter_mut().zip(new.chunks_exact(seq * hd)) {
                        if buf.capacity() < needed * hd {
                            buf.reserve_exact(grown(buf.capacity() / hd, needed, self.max) * hd - buf.len());
                        }
                        buf.extend_from_slice(src);
                        all.extend_from_slice(buf);
                    }
                    Ok(Tensor::from_vec(all, (1, kv_heads, needed, hd), k.device())?)
                };
                let ks = live(kh, k)?;
                let vs = live(vh, v)?;
                self.len = needed;
                Ok((ks, vs))
            }
            KvStore::Device { k: kb, v: vb } => {
                let kt = Self::grow(kb, k, needed, self.max)?;
                let vt = Self::grow(vb, v, needed, self.max)?;
                kt.slice_set(&k.contiguous()?, 2, self.len)?;
                vt.slice_set(&v.contiguous()?, 2, self.len)?;
                self.len = needed;
                let ks = kt.narrow(2, 0, needed)?;
                let vs = vt.narrow(2, 0, needed)?;
                *kb = Some(kt);
                *vb = Some(vt);
                Ok((ks, vs))
            }
        }
    }
}

/// Queries per attention chunk on long prompts.
const ATTENTION_CHUNK: usize = 128;

/// Scaled dot-product attention with grouped KV heads and a causal (optionally sliding-window) mask.
///
/// `q`: `[1, heads, seq, d]` (already scaled), `k`/`v`: `[1, kv_heads, len, d]` where the queries sit at
/// positions `len-seq .. len`. Returns `[1, seq, heads*d]`.
pub(crate) fn attention(q: &Tensor, k: &Tensor, v: &Tensor, window: Option<usize>) -> Result<Tensor> {
    let (b, heads, seq, d) = q.dims4()?;
    let (_, kv_heads, len, _) = k.dims4()?;
    if seq > ATTENTION_CHUNK {
        // Long prompts a chunk of queries at a time, each against only the keys up to its last position:
        // the score matrices stay a few MB instead of `seq × len` per head (tens of MB on a 512-token
        // prompt), and the fully masked upper triangle is never computed.
        let mut outs = Vec::with_capacity(seq.div_ceil(ATTENTION_CHUNK));
        for s in (0..seq).step_by(ATTENTION_CHUNK) {
            let c = ATTENTION_CHUNK.min(seq - s);
            let visible = len - seq + s + c;
            outs.push(attention(&q.narrow(2, s, c)?, &k.narrow(2, 0, visible)?, &v.narrow(2, 0, visible)?, window)?);
        }
        return Ok(Tensor::cat(&outs, 1)?);
    }
    let rep = heads / kv_heads;
    // Fold the query heads that share a KV head into the row dimension: no KV copy per head.
    let q = q.contiguous()?.reshape((b, kv_heads, rep * seq, d))?;
    let k = k.contiguous()?;
    let v = v.contiguous()?;
    let scores = q.matmul(&k.t()?)?; // [b, kv, rep*seq, len]
    let start = len - seq;
    let needs_mask = seq > 1 || window.is_some_and(|w| len > w);
    let scores = if needs_mask {
        let mask: Vec<f32> = (0..seq)
            .flat_map(|i| {
                let qpos = start + i;
                (0..len).map(move |j| {
                    let future = j > qpos;
                    let too_old = window.is_some_and(|w| qpos - j.min(qpos) >= w);
                    if future || too_old {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (seq, len), q.device())?;
        scores.reshape((b, kv_heads, rep, seq, len))?.broadcast_add(&mask)?.reshape((b, kv_heads, rep * seq, len))?
    } else {
        scores
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = probs.matmul(&v)?; // [b, kv, rep*seq, d]
    Ok(out.reshape((b, heads, seq, d))?.transpose(1, 2)?.reshape((b, seq, heads * d))?)
}

/// Splits `[1, seq, heads*d]` into `[1, heads, seq, d]`.
pub(crate) fn split_heads(x: &Tensor, heads: usize, d: usize) -> Result<Tensor> {
    let (b, seq, _) = x.dims3()?;
    Ok(x.reshape((b, seq, heads, d))?.transpose(1, 2)?)
}

/// Picks the last position of `[1, seq, dim]` as `[1, 1, dim]`.
pub(crate) fn last_position(x: &Tensor) -> Result<Tensor> {
    let seq = x.dim(1)?;
    Ok(x.narrow(1, seq - 1, 1)?)
}

/// Flattens `[1, 1, vocab]` logits into a host vector.
pub(crate) fn logits_to_vec(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// `silu(gate(x)) * up(x)` or the GELU variant, then `down`.
pub(crate) struct GatedMlp {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
    pub(crate) gelu: bool,
}

impl GatedMlp {
    pub(crate) fn load(g: &GgufFile, p: &str, dim: usize, ffn: usize, gelu: bool, dev: &Device) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(g, &format!("{p}.ffn_gate"), [ffn, dim], dev)?,
            up: Linear::load(g, &format!("{p}.ffn_up"), [ffn, dim], dev)?,
            down: Linear::load(g, &format!("{p}.ffn_down"), [dim, ffn], dev)?,
            gelu,
        })
    }

    /// Whether its three layers take single rows on the kernels ([`Linear::on_kernels`]).
    pub(crate) fn on_kernels(&self) -> bool {
        [&self.gate, &self.up, &self.down].iter().all(|l| l.on_kernels())
    }

    /// `down(act(gate(x)) · up(x))` for one host row into `out`, with `gate` and `up` as scratch.
    pub(crate) fn host(&self, x: &[f32], (gate, up): (&mut Vec<f32>, &mut Vec<f32>), out: &mut Vec<f32>) -> Result<()> {
        matvec_host([&self.gate, &self.up], x, [&mut *gate, &mut *up])?;
        super::host::gated(gate, up, self.gelu);
        matvec_host([&self.down], gate, [out])
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [g, u] = forward_shared([&self.gate, &self.up], x)?;
        let h = match x.device().is_cpu() && g.dtype() == DType::F32 {
            // The activation on host buffers (`host::gated`: no libm call per element).
            true => {
                let mut gs = g.flatten_all()?.to_vec1::<f32>()?;
                super::host::gated(&mut gs, &u.flatten_all()?.to_vec1::<f32>()?, self.gelu);
                Tensor::from_vec(gs, g.shape(), g.device())?
            }
            false => ((if self.gelu { g.gelu()? } else { candle_nn::ops::silu(&g)? }) * u)?,
        };
        self.down.forward(&h)
    }
}

/// Reads a GGUF `{arch}.*` hyper-parameter set common to the decoder-only transformers.
#[derive(Debug, Clone)]
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
        let scale =
            if g.get(&k("rope.scaling.type")).is_some_and(|_| g.str(&k("rope.scaling.type")).ok() == Some("linear")) {
                g.f32_or(&k("rope.scaling.factor"), 1.0)?
            } else {
                1.0
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

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Attention written out with loops: query `i` of `seq` sits at position `len − seq + i` and sees keys
    /// `j ≤` its position (and within `window` of it).
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: (usize, usize, usize, usize, usize),
        window: Option<usize>,
    ) -> Vec<f32> {
        let (heads, kv_heads, seq, len, d) = dims;
        let rep = heads / kv_heads;
        let mut out = vec![0f32; seq * heads * d];
        for h in 0..heads {
            let kh = h / rep;
            for i in 0..seq {
                let pos = len - seq + i;
                let qi = &q[(h * seq + i) * d..][..d];
                let visible: Vec<usize> = (0..=pos).filter(|&j| window.is_none_or(|w| pos - j < w)).collect();
                let scores: Vec<f32> = visible
                    .iter()
                    .map(|&j| qi.iter().zip(&k[(kh * len + j) * d..][..d]).map(|(a, b)| a * b).sum())
                    .collect();
                let max = scores.iter().copied().fold(f32::MIN, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f32 = e.iter().sum();
                for (&j, w) in visible.iter().zip(&e) {
                    for c in 0..d {
                        out[(i * heads + h) * d + c] += w / z * v[(kh * len + j) * d + c];
                    }
                }
            }
        }
        out
    }

    /// Short and chunked (longer than one chunk, with a ragged last chunk and cached positions before the
    /// prompt) attention against the loops, with and without a sliding window.
    #[test]
    fn attention_matches_the_definition_in_one_piece_and_in_chunks() {
        let dev = Device::Cpu;
        let (heads, kv_heads, d) = (4, 2, 8);
        for (seq, len) in [(5, 5), (1, 40), (300, 310), (ATTENTION_CHUNK + 1, ATTENTION_CHUNK + 1)] {
            for window in [None, Some(50)] {
                let q = random(heads * seq * d, seq as u64);
                let k = random(kv_heads * len * d, len as u64 + 1);
                let v = random(kv_heads * len * d, len as u64 + 2);
                let t = |x: &[f32], h, n| Tensor::from_vec(x.to_vec(), (1, h, n, d), &dev).unwrap();
                let got = attention(&t(&q, heads, seq), &t(&k, kv_heads, len), &t(&v, kv_heads, len), window).unwrap();
                assert_eq!(got.dims(), &[1, seq, heads * d]);
                let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let want = naive(&q, &k, &v, (heads, kv_heads, seq, len, d), window);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() < 1e-4, "seq {seq}, len {len}, window {window:?}: [{i}] {a} vs {b}");
                }
            }
        }
    }
}
