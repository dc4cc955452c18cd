//! Building blocks shared by the architectures: quantized linear layers, RMS norm, rotary embeddings, a
//! gated MLP (the KV cache and attention are in `model::attention`).

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

    /// Rows `rows` of tensor `name`, a matrix of shape `total` (`[rows, cols]`): one part of a fused matrix
    /// (Phi 3's q/k/v and gate/up), in place in the file where the kernels take its type.
    pub(crate) fn load_rows(
        g: &GgufFile,
        name: &str,
        rows: std::ops::Range<usize>,
        total: [usize; 2],
        dev: &Device,
    ) -> Result<Self> {
        let (_, dtype) = g.tensor_info(name)?;
        let bad = |reason: String| Error::Tensor { path: g.path().to_path_buf(), tensor: name.to_string(), reason };
        // Rows of whole blocks, whatever path takes them: a row that splits a block is no matrix.
        if !total[1].is_multiple_of(dtype.block_size()) {
            return Err(bad(format!("rows of {} elements are not whole {dtype:?} blocks", total[1])));
        }
        let m = g.mapped(name, Some(&total))?;
        let part = m
            .rows(rows.start, rows.len())
            .ok_or_else(|| bad(format!("rows {rows:?} are not inside its {} rows", total[0])))?;
        Ok(match BlockType::of(dtype) {
            Some(t) if dev.is_cpu() => Weight::Mapped { t, m: part },
            _ => {
                let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    dtype,
                    part.bytes(),
                    vec![rows.len(), total[1]],
                    dev,
                )
                .map_err(|e| bad(e.to_string()))?;
                Weight::Candle(Arc::new(q))
            }
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

    /// Rows `rows` of the fused matrix `{name}.weight` of shape `total`, as a layer of their own (no bias:
    /// a fused matrix with one is refused, naming it).
    pub(crate) fn load_rows(
        g: &GgufFile,
        name: &str,
        rows: std::ops::Range<usize>,
        total: [usize; 2],
        dev: &Device,
    ) -> Result<Self> {
        let bias = format!("{name}.bias");
        if g.has_tensor(&bias) {
            return Err(Error::Tensor {
                path: g.path().to_path_buf(),
                tensor: bias,
                reason: "a bias on a fused matrix is not supported".into(),
            });
        }
        Self::new(g, Weight::load_rows(g, &format!("{name}.weight"), rows, total, dev)?)
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
        host_vec(&self.forward(&Tensor::from_slice(x, (1, 1, x.len()), dev)?)?)
    }

    /// `x · Wᵀ (+ b)` for `m` host rows: on the kernels where the weights are ([`matvec_host_rows`]), else
    /// through candle on `dev`.
    pub(crate) fn rows_host(&self, xs: &[f32], m: usize, dev: &Device) -> Result<Vec<f32>> {
        if self.on_kernels() {
            let mut y = Vec::new();
            matvec_host_rows([self], xs, m, [&mut y])?;
            return Ok(y);
        }
        host_vec(&self.forward(&Tensor::from_slice(xs, (1, m, xs.len() / m.max(1)), dev)?)?)
    }

    /// The batched host kernel this layer multiplies `rows` rows on, if any: AMX tiles where the CPU has
    /// them, else reagent's integer tiles; `None` for the other paths (the f32 reference, candle's
    /// weights, weights no such kernel takes, or too few rows).
    fn host_batch(&self, rows: usize) -> Result<Option<HostBatch>> {
        let Weight::Mapped { t, .. } = &self.w else { return Ok(None) };
        if self.reference {
            return Ok(None);
        }
        let (kind, min_rows) = match amx_ok(*t, self.w.dims()?) {
            true => (HostBatch::Amx, AMX_BATCH_MIN),
            false if kernels::int_matmul_supports(*t) => (HostBatch::Int, kernels::int_matmul_min_rows()),
            false => return Ok(None),
        };
        Ok((rows >= min_rows).then_some(kind))
    }

    /// `x · Wᵀ (+ b)` for the host rows `xs` on `kind` ([`Self::host_batch`]).
    fn matmul_host(&self, kind: HostBatch, xs: &[f32]) -> Result<Vec<f32>> {
        let Weight::Mapped { t, m } = &self.w else { unreachable!("host_batch takes mapped weights only") };
        let (n, k) = self.w.dims()?;
        let mut y = match kind {
            HostBatch::Amx => amx::matmul_t(*t, m.bytes(), n, k, xs),
            HostBatch::Int => kernels::matmul(*t, m.bytes(), n, k, xs),
        };
        if let Some(b) = &self.b_host {
            for row in y.chunks_exact_mut(n) {
                super::host::add(row, b);
            }
        }
        Ok(y)
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        if x.device().is_cpu() {
            if let Some(kind) = self.host_batch(rows)? {
                let xs = host_vec(x)?;
                return shaped_like(x, self.matmul_host(kind, &xs)?, self.w.dims()?.0);
            }
        }
        // The integer tiles' and AMX's thresholds are at most this one: fewer rows on those weights go
        // to the short-batch mat-vec below.
        let batched = self.reference || rows >= MATMUL_BATCH_MIN;
        let y = match (&self.w, &self.mm) {
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
    let xs = host_vec(x)?;
    let mut ys: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
    matvec_host(layers, &xs, ys.each_mut())?;
    let mut out = Vec::with_capacity(N);
    for y in ys {
        let n = y.len();
        out.push(shaped_like(x, y, n)?);
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per layer")))
}

/// `m` rows of host activations quantized for layers on the kernels ([`Linear::on_kernels`]): once per
/// block size (32-element blocks, and super-blocks for the K-quants), after checking that every layer
/// takes rows of their width.
struct Quantized {
    per_block: Option<Vec<Q8Block>>,
    per_super: Option<Vec<Q8Block>>,
}

impl Quantized {
    fn for_layers(layers: &[&Linear], xs: &[f32], m: usize) -> Result<Self> {
        if m == 0 || !xs.len().is_multiple_of(m) {
            return Err(Error::param("x", format!("{} values are not {m} rows", xs.len())));
        }
        let k = xs.len() / m;
        let mut q = Self { per_block: None, per_super: None };
        for l in layers {
            let (Weight::Mapped { t, .. }, false) = (&l.w, l.reference) else {
                return Err(Error::param("layer", "products on host rows need weights on the kernels"));
            };
            let cols = l.w.dims()?.1;
            if cols != k {
                return Err(Error::param("x", format!("rows of {k} values for a layer of {cols} inputs")));
            }
            let slot = if t.block_elems() == kernels::QK { &mut q.per_block } else { &mut q.per_super };
            if slot.is_none() {
                let blocks = k / kernels::QK;
                let mut v = vec![Q8Block::default(); m * blocks];
                for (xr, qr) in xs.chunks_exact(k).zip(v.chunks_exact_mut(blocks)) {
                    kernels::quantize_row_q8_for(*t, xr, qr);
                }
                *slot = Some(v);
            }
        }
        Ok(q)
    }

    /// The activations as a layer of block type `t` takes them.
    fn of(&self, t: BlockType) -> &[Q8Block] {
        let q = if t.block_elems() == kernels::QK { &self.per_block } else { &self.per_super };
        q.as_deref().expect("quantized for every layer's block type")
    }
}

/// `ys[i] = x · W_iᵀ (+ b_i)` for one row on host buffers, every layer on the kernels
/// ([`Linear::on_kernels`]): `x` quantized once per block size, every product in one dispatch to the
/// workers. `ys` are resized to the layers' outputs.
pub(crate) fn matvec_host<const N: usize>(layers: [&Linear; N], x: &[f32], ys: [&mut Vec<f32>; N]) -> Result<()> {
    let q = Quantized::for_layers(&layers, x, 1)?;
    let mut jobs = Vec::with_capacity(N);
    let mut biases = Vec::with_capacity(N);
    for (l, y) in layers.iter().zip(ys) {
        let Weight::Mapped { t, m } = &l.w else { unreachable!("checked by Quantized::for_layers") };
        let rows = l.w.dims()?.0;
        y.clear();
        y.resize(rows, 0.0);
        biases.push(l.b_host.as_deref());
        jobs.push(kernels::MatVecJob { t: *t, w: m.bytes(), rows, x: q.of(*t), y: y.as_mut_slice() });
    }
    kernels::matvec_jobs(&mut jobs);
    for (job, b) in jobs.iter_mut().zip(biases) {
        if let Some(b) = b {
            super::host::add(job.y, b);
        }
    }
    Ok(())
}

/// [`matvec_host`] for `m` rows of `xs` (row after row), each weight read from memory once for all of
/// them ([`kernels::matvec_tokens`]): `ys[i]` gets `m` rows of layer `i`'s outputs. One row is
/// [`matvec_host`]. The batch of a speculative step: a handful of tokens at the cost of about one.
pub(crate) fn matvec_host_rows<const N: usize>(
    layers: [&Linear; N],
    xs: &[f32],
    m: usize,
    ys: [&mut Vec<f32>; N],
) -> Result<()> {
    if m == 1 {
        return matvec_host(layers, xs, ys);
    }
    let q = Quantized::for_layers(&layers, xs, m)?;
    for (l, y) in layers.iter().zip(ys) {
        let Weight::Mapped { t, m: w } = &l.w else { unreachable!("checked by Quantized::for_layers") };
        let rows = l.w.dims()?.0;
        y.clear();
        y.resize(m * rows, 0.0);
        kernels::matvec_tokens(*t, w.bytes(), rows, q.of(*t), m, y);
        if let Some(b) = &l.b_host {
            y.chunks_exact_mut(rows).for_each(|row| super::host::add(row, b));
        }
    }
    Ok(())
}

/// The batched kernels on host buffers ([`Linear::host_batch`]).
#[derive(Clone, Copy)]
enum HostBatch {
    /// The AMX tile unit, bf16 (`model::amx`).
    Amx,
    /// reagent's integer tiles on 8-bit activations ([`kernels::matmul`]).
    Int,
}

/// Whether a batch goes through the AMX tile unit (see `model::amx`) for this weight.
fn amx_ok(t: BlockType, (n, k): (usize, usize)) -> bool {
    amx::available() && amx::supports(t, n, k)
}

/// Rows of `x` times a block-quantized `[n, k]` matrix through reagent's own kernels: one row a mat-vec,
/// a few rows one pass over the weights for all of them ([`kernels::matvec_tokens`]).
fn block_matvec(t: BlockType, w: &[u8], (n, k): (usize, usize), x: &Tensor) -> Result<Tensor> {
    let xs = host_vec(x)?;
    let rows = xs.len() / k;
    let mut y = vec![0f32; rows * n];
    if rows == 0 {
        return shaped_like(x, y, n);
    }
    let blocks = k / kernels::QK;
    let mut xq = vec![Q8Block::default(); rows * blocks];
    for (xr, q) in xs.chunks_exact(k).zip(xq.chunks_exact_mut(blocks)) {
        kernels::quantize_row_q8_for(t, xr, q);
    }
    kernels::matvec_tokens(t, w, n, &xq, rows, &mut y);
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

    /// `out = norm(row)` for every row of `x` (host buffers, CPU only).
    pub(crate) fn host_rows(&self, x: &[f32], out: &mut Vec<f32>) {
        out.resize(x.len(), 0.0);
        let d = self.w_host.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            super::host::rms_norm(xr, &self.w_host, self.eps, or);
        }
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
    /// The head size: the rotated dimensions are the first `2·half` of each head (all of it, or part:
    /// Phi 3's partial rotary), the others pass unchanged.
    head: usize,
}

impl Rope {
    /// `factors`: per-frequency divisors of the rotation speed (Llama 3.x's `rope_freqs`), one per pair.
    pub(crate) fn new(
        dim: usize,
        base: f32,
        scale: f32,
        max_pos: usize,
        style: RopeStyle,
        factors: Option<&[f32]>,
        dev: &Device,
    ) -> Result<Self> {
        let factor = |i: usize| factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
        let inv: Vec<f32> = (0..dim / 2).map(|i| 1.0 / base.powf(2.0 * i as f32 / dim as f32) / factor(i)).collect();
        let inv = Tensor::from_vec(inv, (1, dim / 2), dev)?;
        let pos =
            (Tensor::arange(0u32, max_pos as u32, dev)?.to_dtype(DType::F32)? / scale as f64)?.reshape((max_pos, 1))?;
        let freqs = pos.broadcast_mul(&inv)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let host = match dev.is_cpu() {
            true => Some((cos.flatten_all()?.to_vec1::<f32>()?, sin.flatten_all()?.to_vec1::<f32>()?)),
            false => None,
        };
        Ok(Self { cos, sin, style, host, half: dim / 2, head: dim })
    }

    /// Rotates the first dimensions of heads of `head` (more than the rotary size: partial rotary).
    pub(crate) fn with_head(mut self, head: usize) -> Self {
        self.head = head.max(2 * self.half);
        self
    }

    /// Scales the rotated dimensions by `m` (LongRoPE's attention factor: cos and sin times `m`).
    pub(crate) fn with_magnitude(mut self, m: f32) -> Result<Self> {
        if m != 1.0 {
            self.cos = (&self.cos * m as f64)?;
            self.sin = (&self.sin * m as f64)?;
            if let Some((c, s)) = &mut self.host {
                c.iter_mut().chain(s.iter_mut()).for_each(|v| *v *= m);
            }
        }
        Ok(self)
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
        super::host::rope(x, cos, sin, 2 * h, self.head, self.style == RopeStyle::Interleaved);
        Ok(())
    }

    /// Rotates `x` of shape `[batch, heads, seq, head_dim]` for positions `pos..pos+seq`.
    pub(crate) fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let rotate = |x: &Tensor| -> Result<Tensor> {
            let x = x.contiguous()?;
            Ok(match self.style {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
                RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
            })
        };
        let (d, rot) = (x.dim(3)?, 2 * self.half);
        if rot == d {
            return rotate(x);
        }
        let (head, tail) = (x.narrow(3, 0, rot)?, x.narrow(3, rot, d - rot)?);
        Ok(Tensor::cat(&[&rotate(&head)?, &tail], 3)?)
    }
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

/// A tensor's values, flattened, as host `f32` (a layer's input rows, `[1, 1, vocab]` logits).
pub(crate) fn host_vec(x: &Tensor) -> Result<Vec<f32>> {
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

    /// Phi 3's MLP: one `{p}.ffn_up` matrix of `2·ffn` rows, the gate's (through the activation) first.
    pub(crate) fn load_fused(g: &GgufFile, p: &str, dim: usize, ffn: usize, dev: &Device) -> Result<Self> {
        let up = format!("{p}.ffn_up");
        Ok(Self {
            gate: Linear::load_rows(g, &up, 0..ffn, [2 * ffn, dim], dev)?,
            up: Linear::load_rows(g, &up, ffn..2 * ffn, [2 * ffn, dim], dev)?,
            down: Linear::load(g, &format!("{p}.ffn_down"), [dim, ffn], dev)?,
            gelu: false,
        })
    }

    /// Whether its three layers take single rows on the kernels ([`Linear::on_kernels`]).
    pub(crate) fn on_kernels(&self) -> bool {
        [&self.gate, &self.up, &self.down].iter().all(|l| l.on_kernels())
    }

    /// `down(act(gate(x)) · up(x))` for `m` host rows of `x` into `out`, with `gate` and `up` as scratch,
    /// each weight read once for all of them (one row: a decode step's mat-vecs).
    pub(crate) fn host_rows(
        &self,
        x: &[f32],
        m: usize,
        (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        matvec_host_rows([&self.gate, &self.up], x, m, [&mut *gate, &mut *up])?;
        super::host::gated(gate, up, self.gelu);
        matvec_host_rows([&self.down], gate, m, [out])
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // A batch that every product takes on the host's batched kernels stays on host buffers from the
        // input to the output: no copy of the 4·ffn-byte intermediate rows in and out of tensors.
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        if x.device().is_cpu() {
            let kinds = [self.gate.host_batch(rows)?, self.up.host_batch(rows)?, self.down.host_batch(rows)?];
            if let [Some(g), Some(u), Some(d)] = kinds {
                let xs = host_vec(x)?;
                let mut gs = self.gate.matmul_host(g, &xs)?;
                super::host::gated(&mut gs, &self.up.matmul_host(u, &xs)?, self.gelu);
                return shaped_like(x, self.down.matmul_host(d, &gs)?, self.down.w.dims()?.0);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Frequency factors (Llama 3.x's `rope_freqs`) divide each pair's rotation speed: at position p, pair
    /// i turns by p · base^(-2i/d) / factor_i.
    #[test]
    fn rotary_factors_slow_their_pairs() {
        let (dim, base, pos) = (4, 10_000f32, 7);
        let plain = Rope::new(dim, base, 1.0, 16, RopeStyle::Halves, None, &Device::Cpu).unwrap();
        let slowed = Rope::new(dim, base, 1.0, 16, RopeStyle::Halves, Some(&[1.0, 8.0]), &Device::Cpu).unwrap();
        let (cos, _) = plain.host.as_ref().unwrap();
        let (cos_f, sin_f) = slowed.host.as_ref().unwrap();
        let theta = |i: usize, f: f32| pos as f32 * base.powf(-2.0 * i as f32 / dim as f32) / f;
        assert_eq!(cos[pos * 2], cos_f[pos * 2], "factor 1 leaves pair 0");
        assert!((cos_f[pos * 2 + 1] - theta(1, 8.0).cos()).abs() < 1e-6);
        assert!((sin_f[pos * 2 + 1] - theta(1, 8.0).sin()).abs() < 1e-6);
        assert!((cos[pos * 2 + 1] - cos_f[pos * 2 + 1]).abs() > 1e-4, "pair 1 is slowed");
    }
}
