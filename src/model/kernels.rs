//! CPU mat-vec kernels for the quantizations of the catalogue's files: the 32-element block types (Q4_0,
//! Q4_1, Q5_0, Q8_0), which candle 0.11 runs through a scalar path (Q4_1, Q5_0) or that we want on the same
//! fast path (Q4_0, Q8_0), and the 256-element K-quant super-blocks Q4_K and Q6_K.
//!
//! Decode multiplies each weight matrix by one activation row. As in llama.cpp, the row is first quantized
//! to 8 bits per 32-element block ([`Q8Block`]: an f32 scale, the block's integer sum, 32 × i8), so the
//! inner loop is an integer dot product of weight nibbles/bytes with activation bytes; the block scales are
//! applied once per block. The weight bytes are read in place, in GGUF's own block layout.
//!
//! Every kernel has a portable scalar version and SIMD versions chosen at run time ([`Tier`]: AVX-512 VNNI,
//! AVX-VNNI, AVX2); tests check that every tier the CPU has agrees with the scalar code, and the scalar
//! code with dequantize-then-f32. Rows are split across the kernels' own worker pool (`model::pool`),
//! which costs a few microseconds per call rather than rayon's tens, and yields its cores under contention.
//!
//! Prompt-sized batches ([`matmul`]) use the same 8-bit activations: on the SIMD tiers the weights and
//! the tokens are packed into groups of 8 blocks whose lanes interleave the blocks, and tiles of a few
//! rows × a few tokens reuse every packed block across tokens.

use candle_core::quantized::GgmlDType;

/// Elements per block.
pub const QK: usize = 32;

/// A 32-element block of an activation row quantized to 8 bits.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// Scale: element ≈ `d * qs[i]`.
    pub d: f32,
    /// `Σ qs[i]`, for the weight types with an offset (Q4_0, Q5_0) or a minimum (Q4_1).
    pub sum: i32,
    pub qs: [i8; QK],
}

impl Default for Q8Block {
    fn default() -> Self {
        Self { d: 0.0, sum: 0, qs: [0; QK] }
    }
}

/// Quantizes `x` (a multiple of 32 long) into `out`: a scale per 32-element block, each element rounded to
/// the nearest step (ties to even, as the SIMD conversion does, so every tier gives the same bits).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    quantize_groups(x, out, 1)
}

/// Quantizes `x` for a matrix of type `t`: the K-quant kernels need the 8 blocks of each 256-element
/// super-block to share one scale (so sub-block scales can be applied to integer sums); the others get a
/// scale per 32-element block.
pub fn quantize_row_q8_for(t: BlockType, x: &[f32], out: &mut [Q8Block]) {
    quantize_groups(x, out, t.block_elems() / QK)
}

/// Quantizes `x` with one scale per `group` blocks.
fn quantize_groups(x: &[f32], out: &mut [Q8Block], group: usize) {
    assert_eq!(x.len(), out.len() * QK, "{} activations for {} blocks", x.len(), out.len());
    assert!(out.len().is_multiple_of(group));
    #[cfg(target_arch = "x86_64")]
    if Tier::best() >= Tier::Avx2 {
        // SAFETY: AVX2/FMA/F16C are present (every tier above scalar has them); lengths asserted above.
        unsafe { avx2::quantize_groups(x, out, group) };
        return;
    }
    quantize_groups_scalar(x, out, group)
}

fn quantize_groups_scalar(x: &[f32], out: &mut [Q8Block], group: usize) {
    for (xg, bg) in x.chunks_exact(group * QK).zip(out.chunks_exact_mut(group)) {
        let amax = xg.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (xb, b) in xg.chunks_exact(QK).zip(bg.iter_mut()) {
            let mut sum = 0i32;
            for (q, &v) in b.qs.iter_mut().zip(xb) {
                *q = (v * inv).round_ties_even() as i8;
                sum += *q as i32;
            }
            b.d = d;
            b.sum = sum;
        }
    }
}

/// The ggml types reagent's kernels handle (each maps to a [`BlockType`]).
pub const KERNEL_TYPES: [GgmlDType; 7] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// The weight types these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    /// 256-element super-blocks: 8 sub-blocks of 32 with 6-bit scales and minimums, 4-bit quants.
    Q4K,
    /// Q4_K's layout plus a fifth bit per quant (`qh`, 32 bytes): 5-bit quants.
    Q5K,
    /// 256-element super-blocks: 16 sub-blocks of 16 with 8-bit scales, 6-bit quants.
    Q6K,
}

impl BlockType {
    /// The kernel type for a ggml type, if there is one.
    pub fn of(t: GgmlDType) -> Option<Self> {
        match t {
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            GgmlDType::Q4K => Some(Self::Q4K),
            GgmlDType::Q5K => Some(Self::Q5K),
            GgmlDType::Q6K => Some(Self::Q6K),
            _ => None,
        }
    }

    /// Elements per block (super-block for the K-quants).
    pub fn block_elems(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
            _ => QK,
        }
    }

    /// Whether a block's weights are `d·q + min` (Q4_1, Q4_K, Q5_K) rather than `d·(q − offset)`.
    pub fn has_minimum(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q4K | Self::Q5K)
    }

    /// Bytes of a row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Dequantizes one block into 32 floats (the reference the kernels are tested against).
pub fn dequantize_block(t: BlockType, b: &[u8], out: &mut [f32]) {
    match t {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let d = f16(b);
            let (m, qs) = match t {
                BlockType::Q4_1 => (f16(&b[2..]), &b[4..20]),
                _ => (-8.0 * d, &b[2..18]),
            };
            for j in 0..16 {
                out[j] = d * (qs[j] & 0xF) as f32 + m;
                out[j + 16] = d * (qs[j] >> 4) as f32 + m;
            }
        }
        BlockType::Q5_0 => {
            let d = f16(b);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for j in 0..16 {
                let h0 = ((qh >> j) & 1) << 4;
                let h1 = ((qh >> (j + 16)) & 1) << 4;
                out[j] = d * (((qs[j] & 0xF) as u32 | h0) as f32 - 16.0);
                out[j + 16] = d * (((qs[j] >> 4) as u32 | h1) as f32 - 16.0);
            }
        }
        BlockType::Q8_0 => {
            let d = f16(b);
            for j in 0..QK {
                out[j] = d * (b[2 + j] as i8) as f32;
            }
        }
        BlockType::Q4K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            for j in 0..4 {
                let qs = &b[16 + 32 * j..48 + 32 * j];
                let (s0, m0) = q4k_scale_min(2 * j, scales);
                let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
                for l in 0..32 {
                    out[64 * j + l] = d * s0 as f32 * (qs[l] & 0xF) as f32 - dmin * m0 as f32;
                    out[64 * j + 32 + l] = d * s1 as f32 * (qs[l] >> 4) as f32 - dmin * m1 as f32;
                }
            }
        }
        BlockType::Q5K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let qh = &b[16..48];
            for j in 0..4 {
                let qs = &b[48 + 32 * j..80 + 32 * j];
                let (s0, m0) = q4k_scale_min(2 * j, scales);
                let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
                for l in 0..32 {
                    let lo = (qs[l] & 0xF) | ((qh[l] >> (2 * j)) & 1) << 4;
                    let hi = (qs[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    out[64 * j + l] = d * s0 as f32 * lo as f32 - dmin * m0 as f32;
                    out[64 * j + 32 + l] = d * s1 as f32 * hi as f32 - dmin * m1 as f32;
                }
            }
        }
        BlockType::Q6K => {
            let d = f16(&b[208..]);
            for (i, o) in out[..256].iter_mut().enumerate() {
                *o = d * (b[192 + i / 16] as i8) as f32 * (q6k_quant(b, i) as i32 - 32) as f32;
            }
        }
    }
}

/// Q4_K's 6-bit scale and minimum of sub-block `j` (0..8), packed in 12 bytes.
fn q4k_scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q4_K's 8 scales and 8 minimums of 6 bits, unpacked from their 12 bytes all at once (as
/// [`q4k_scale_min`] does one at a time): bytes 0..4 hold scales 0..4 and the top bits of scales 4..8,
/// bytes 4..8 minimums 0..4 and the top bits of minimums 4..8, bytes 8..12 the low nibbles of scales 4..8
/// (low) and minimums 4..8 (high).
pub(crate) fn q4k_scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let (low6, low4, top2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
    let scales_hi = (c & low4) | (((a >> 6) & top2) << 4);
    let mins_hi = ((c >> 4) & low4) | (((b >> 6) & top2) << 4);
    let join = |lo: u32, hi: u32| (lo as u64 | (hi as u64) << 32).to_le_bytes();
    (join(a & low6, scales_hi), join(b & low6, mins_hi))
}

/// Q6_K's unsigned 6-bit quant (0..63, offset 32) of element `i` of a super-block: the low 4 bits in `ql`
/// (bytes 0..128), the high 2 in `qh` (bytes 128..192). Each 128-element half takes 64 `ql` bytes (low
/// nibbles: elements 0..64, high nibbles: 64..128) and 32 `qh` bytes (2 bits for each of 4 elements 32 apart).
fn q6k_quant(b: &[u8], i: usize) -> u8 {
    let (half, e) = (i / 128, i % 128);
    let (quarter, l) = (e / 32, e % 32);
    let ql = b[64 * half + 32 * (quarter % 2) + l];
    let low = if quarter < 2 { ql & 0xF } else { ql >> 4 };
    let high = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
    low | (high << 4)
}

/// The scales of block `i`'s two halves and its minimum, as [`unsigned_block`] gives them.
pub(crate) fn block_scales(t: BlockType, row: &[u8], i: usize) -> ([f32; 2], f32) {
    if t.block_elems() == QK {
        let b = &row[i * t.block_bytes()..];
        let d = f16(b);
        return ([d, d], if t == BlockType::Q4_1 { f16(&b[2..]) } else { 0.0 });
    }
    let (b, s) = (&row[i / 8 * t.block_bytes()..(i / 8 + 1) * t.block_bytes()], i % 8);
    if t == BlockType::Q6K {
        let d = f16(&b[208..]);
        return ([d * (b[192 + 2 * s] as i8) as f32, d * (b[193 + 2 * s] as i8) as f32], 0.0);
    }
    let (d, dmin) = (f16(b), f16(&b[2..]));
    let (sc, mn) = q4k_scales_mins(b[4..16].try_into().expect("12 bytes"));
    ([d * sc[s] as f32; 2], -dmin * mn[s] as f32)
}

/// Block `i` (a 32-element block, or a K-quant's 32-element sub-block) of a weight row as unsigned bytes
/// `u` with the scales `d` of its two 16-element halves and its minimum `c`, such that element `e` is
/// `d[e / 16]·(u[e] − offset) + c`, where the offset is 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 32 (Q6_K) or 0:
/// the portable reference for the SIMD weight packers.
#[cfg(test)]
pub(crate) fn unsigned_block(t: BlockType, row: &[u8], i: usize) -> ([u8; QK], [f32; 2], f32) {
    let mut u = [0u8; QK];
    let (d, c) = block_scales(t, row, i);
    if t.block_elems() == QK {
        let b = &row[i * t.block_bytes()..(i + 1) * t.block_bytes()];
        if t == BlockType::Q8_0 {
            u.iter_mut().zip(&b[2..34]).for_each(|(u, &w)| *u = w ^ 0x80);
            return (u, d, c);
        }
        let at = match t {
            BlockType::Q4_1 => 4,
            BlockType::Q5_0 => 6,
            _ => 2,
        };
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            u[j] = b[at + j] & 0xF;
            u[j + 16] = b[at + j] >> 4;
            if t == BlockType::Q5_0 {
                u[j] |= (((qh >> j) & 1) << 4) as u8;
                u[j + 16] |= (((qh >> (j + 16)) & 1) << 4) as u8;
            }
        }
        return (u, d, c);
    }
    let (b, s) = (&row[i / 8 * t.block_bytes()..(i / 8 + 1) * t.block_bytes()], i % 8);
    for (l, v) in u.iter_mut().enumerate() {
        *v = match t {
            BlockType::Q6K => q6k_quant(b, QK * s + l),
            _ => {
                let qs = if t == BlockType::Q5K { 48 } else { 16 };
                let q = b[qs + 32 * (s / 2) + l];
                let q = if s % 2 == 1 { q >> 4 } else { q & 0xF };
                if t == BlockType::Q5K {
                    q | ((b[16 + l] >> s) & 1) << 4
                } else {
                    q
                }
            }
        };
    }
    (u, d, c)
}

/// A whole `rows × cols` matrix in GGUF block layout dequantized to f32 (row-major), rows split across
/// threads.
pub fn dequantize(t: BlockType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    dequantize_on(Tier::best(), t, w, rows, cols)
}

/// [`dequantize`] on a given tier, which must be one of [`Tier::supported`].
pub fn dequantize_on(tier: Tier, t: BlockType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    let row_bytes = t.row_bytes(cols);
    assert_eq!(w.len(), rows * row_bytes, "weight bytes do not match {rows} rows of {cols} columns");
    // Every element is written below; skipping the zero fill saves a pass over the whole matrix.
    let mut out: Vec<f32> = Vec::with_capacity(rows * cols);
    const ROWS_PER_ITEM: usize = 64;
    let out_ptr = out.as_mut_ptr() as usize;
    crate::model::pool::pool().for_chunks(rows.div_ceil(ROWS_PER_ITEM), |items| {
        let first = items.start * ROWS_PER_ITEM;
        let last = rows.min(items.end * ROWS_PER_ITEM);
        let src = &w[first * row_bytes..last * row_bytes];
        let blocks = src.len() / t.block_bytes();
        let o = (out_ptr as *mut f32).wrapping_add(first * cols);
        #[cfg(target_arch = "x86_64")]
        if tier != Tier::Scalar {
            // SAFETY: AVX2/FMA/F16C are present (checked above); `src` holds `blocks` whole blocks and the
            // work items write disjoint ranges of `out`'s allocation (`last <= rows`).
            unsafe { avx2::dequantize_blocks_of(t, src.as_ptr(), blocks, o) };
            return;
        }
        // SAFETY: as above; the range is zeroed before it is viewed as floats.
        let o = unsafe {
            std::ptr::write_bytes(o, 0, (last - first) * cols);
            std::slice::from_raw_parts_mut(o, (last - first) * cols)
        };
        for (b, ob) in src.chunks_exact(t.block_bytes()).zip(o.chunks_exact_mut(t.block_elems())) {
            dequantize_block(t, b, ob);
        }
    });
    // SAFETY: the work items covered rows 0..rows, and each wrote all of its rows' elements.
    unsafe { out.set_len(rows * cols) };
    out
}

/// Dequantizes one row (`row`: whole blocks of type `t`) into `out` on a given tier, on this thread.
pub fn dequantize_row_on(tier: Tier, t: BlockType, row: &[u8], out: &mut [f32]) {
    let blocks = row.len() / t.block_bytes();
    assert_eq!(row.len(), blocks * t.block_bytes(), "a row of whole {t:?} blocks");
    assert_eq!(out.len(), blocks * t.block_elems());
    #[cfg(target_arch = "x86_64")]
    if tier != Tier::Scalar && Tier::supported().contains(&tier) {
        // SAFETY: AVX2/FMA/F16C are present (the tier is supported); `row` holds `blocks` whole blocks and
        // `out` their elements (asserted).
        unsafe { avx2::dequantize_blocks_of(t, row.as_ptr(), blocks, out.as_mut_ptr()) };
        return;
    }
    for (b, ob) in row.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(t.block_elems())) {
        dequantize_block(t, b, ob);
    }
}

/// Unsigned weight quants of one block (Q4 nibbles 0..15, Q5 values 0..31, Q8 signed) and how the block
/// turns `Σ w·x` into a float: `d_w·d_x·(Σ q·qx − offset·Σ qx) + min·d_x·Σ qx`. K-quant super-blocks take
/// 8 activation blocks and apply a scale (and Q4_K's minimum) per sub-block.
fn block_dot_scalar(t: BlockType, b: &[u8], xs: &[Q8Block]) -> f32 {
    let dot = |q: &[i32], x: &[i8]| -> i32 { q.iter().zip(x).map(|(&a, &b)| a * b as i32).sum() };
    let mut q = [0i32; QK];
    let x = &xs[0];
    let (d, offset, min) = match t {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let qs = if t == BlockType::Q4_1 { &b[4..20] } else { &b[2..18] };
            for j in 0..16 {
                q[j] = (qs[j] & 0xF) as i32;
                q[j + 16] = (qs[j] >> 4) as i32;
            }
            if t == BlockType::Q4_1 {
                (f16(b), 0, f16(&b[2..]))
            } else {
                (f16(b), 8, 0.0)
            }
        }
        BlockType::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                q[j] = ((b[6 + j] & 0xF) as u32 | (((qh >> j) & 1) << 4)) as i32;
                q[j + 16] = ((b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32;
            }
            (f16(b), 16, 0.0)
        }
        BlockType::Q8_0 => {
            for j in 0..QK {
                q[j] = (b[2 + j] as i8) as i32;
            }
            (f16(b), 0, 0.0)
        }
        BlockType::Q4K | BlockType::Q5K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let five = t == BlockType::Q5K;
            let qs = if five { 48 } else { 16 };
            let mut total = 0f32;
            for (s, x) in xs[..8].iter().enumerate() {
                let (j, high) = (s / 2, s % 2 == 1);
                for l in 0..QK {
                    let v = b[qs + 32 * j + l];
                    let fifth = if five { ((b[16 + l] >> s) & 1) << 4 } else { 0 };
                    q[l] = (if high { v >> 4 } else { v & 0xF } | fifth) as i32;
                }
                let (sc, m) = q4k_scale_min(s, scales);
                total += d * sc as f32 * x.d * dot(&q, &x.qs) as f32 - dmin * m as f32 * x.d * x.sum as f32;
            }
            return total;
        }
        BlockType::Q6K => {
            let d = f16(&b[208..]);
            let mut total = 0f32;
            for (blk, x) in xs[..8].iter().enumerate() {
                for (l, v) in q.iter_mut().enumerate() {
                    *v = q6k_quant(b, QK * blk + l) as i32 - 32;
                }
                for h in 0..2 {
                    let sc = b[192 + 2 * blk + h] as i8;
                    total += d * sc as f32 * x.d * dot(&q[16 * h..16 * h + 16], &x.qs[16 * h..16 * h + 16]) as f32;
                }
            }
            return total;
        }
    };
    d * x.d * (dot(&q, &x.qs) - offset * x.sum) as f32 + min * x.d * x.sum as f32
}

/// Scalar dot product of one weight row (GGUF blocks) with a quantized activation row.
pub fn row_dot_scalar(t: BlockType, row: &[u8], x: &[Q8Block]) -> f32 {
    let per = t.block_elems() / QK;
    row.chunks_exact(t.block_bytes()).zip(x.chunks_exact(per)).map(|(b, xs)| block_dot_scalar(t, b, xs)).sum()
}

/// Which implementation of the kernels runs. Ordered: a CPU runs every tier it supports, and
/// `REAGENT_KERNELS` caps the choice (Zen 4 has AVX-512 but not AVX-VNNI, so a cap at `vnni` gives AVX2
/// there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with AVX-VNNI byte dot products (Intel client chips since Alder Lake).
    AvxVnni,
    /// AVX-512 F/BW/VL/VNNI, 512-bit byte dot products (AMD Zen 4/5, Intel Xeons since Ice Lake): also runs
    /// prefill on 8-bit integers ([`matmul`]).
    Avx512,
}

impl Tier {
    /// Every tier, lowest first.
    pub const ALL: [Tier; 4] = [Tier::Scalar, Tier::Avx2, Tier::AvxVnni, Tier::Avx512];

    /// The name `REAGENT_KERNELS` and `reagent bench` use.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "vnni",
            Tier::Avx512 => "avx512",
        }
    }

    /// The best tier this CPU supports, capped by `REAGENT_KERNELS` (`scalar`, `avx2`, `vnni`, `avx512`;
    /// `amx` or unset: no cap).
    pub fn best() -> Tier {
        static BEST: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = std::env::var("REAGENT_KERNELS").ok();
            let cap = Tier::ALL.into_iter().find(|t| cap.as_deref() == Some(t.name())).unwrap_or(Tier::Avx512);
            Tier::supported().into_iter().filter(|&t| t <= cap).max().unwrap_or(Tier::Scalar)
        })
    }

    /// Every tier this CPU can run.
    pub fn supported() -> Vec<Tier> {
        let mut tiers = vec![Tier::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            tiers.push(Tier::Avx2);
            if is_x86_feature_detected!("avxvnni") {
                tiers.push(Tier::AvxVnni);
            }
            if avx512::detected() {
                tiers.push(Tier::Avx512);
            }
        }
        tiers
    }
}

/// `y[r] = W[r] · x` for a `rows × (x.len()*32)` matrix in GGUF block layout, rows split across threads.
pub fn matvec(t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], y: &mut [f32]) {
    matvec_on(Tier::best(), t, w, rows, x, y)
}

/// [`matvec`] on a given tier, which must be one of [`Tier::supported`].
pub fn matvec_on(tier: Tier, t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], y: &mut [f32]) {
    matvec_jobs_on(tier, &mut [MatVecJob { t, w, rows, x, y }]);
}

/// One product of a fused mat-vec: `y[r] = W[r] · x` for a `rows × (x.len()*32)` matrix `w` of type `t`.
pub struct MatVecJob<'a> {
    pub t: BlockType,
    pub w: &'a [u8],
    pub rows: usize,
    pub x: &'a [Q8Block],
    pub y: &'a mut [f32],
}

/// Several mat-vec products in one dispatch to the workers (a decode step's q/k/v, or gate/up): one wake-up
/// and one barrier instead of one per matrix, which on small models is a visible share of a token.
pub fn matvec_jobs(jobs: &mut [MatVecJob]) {
    matvec_jobs_on(Tier::best(), jobs)
}

/// [`matvec_jobs`] on a given tier, which must be one of [`Tier::supported`].
pub fn matvec_jobs_on(tier: Tier, jobs: &mut [MatVecJob]) {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    const ROWS_PER_ITEM: usize = 16;
    let mut bytes = 0;
    // Per job: row bytes, the output's address, the first work item, and the activations packed for the
    // AVX-512 K-quant kernels.
    let mut plan = Vec::with_capacity(jobs.len());
    let mut items = 0;
    for j in jobs.iter_mut() {
        let cols = j.x.len() * QK;
        assert_eq!(cols % j.t.block_elems(), 0, "{cols} columns are not whole {:?} blocks", j.t);
        let row_bytes = j.t.row_bytes(cols);
        assert_eq!(j.w.len(), j.rows * row_bytes, "weight bytes do not match {} rows of {cols} columns", j.rows);
        assert_eq!(j.y.len(), j.rows);
        bytes += j.w.len();
        plan.push((row_bytes, j.y.as_mut_ptr() as usize, items, pack(tier, j.t, j.x)));
        items += j.rows.div_ceil(ROWS_PER_ITEM);
    }
    // Small products are not worth waking the workers for.
    if bytes < 64 * 1024 {
        for (j, (row_bytes, .., packed)) in jobs.iter_mut().zip(&plan) {
            rows_dot_into(tier, j.t, j.w, *row_bytes, 0, j.x, packed, j.y);
        }
        return;
    }
    let jobs = &*jobs;
    crate::model::pool::pool().for_chunks(items, |range| {
        // The range may span jobs: one contiguous run of rows per job it touches.
        let mut item = range.start;
        while item < range.end {
            let k = plan.partition_point(|p| p.2 <= item) - 1;
            let (j, (row_bytes, y_ptr, first_item, packed)) = (&jobs[k], &plan[k]);
            let end = plan.get(k + 1).map_or(range.end, |p| p.2.min(range.end));
            let first = (item - first_item) * ROWS_PER_ITEM;
            let last = j.rows.min((end - first_item) * ROWS_PER_ITEM);
            // SAFETY: work items are disjoint row ranges of one job's `y` (`last <= rows == y.len()`), and the
            // jobs' outputs are distinct `&mut` slices.
            let out = unsafe { std::slice::from_raw_parts_mut((*y_ptr as *mut f32).add(first), last - first) };
            rows_dot_into(tier, j.t, j.w, *row_bytes, first, j.x, packed, out);
            item = end;
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Activations packed for the AVX-512 K-quant kernels.
#[cfg(target_arch = "x86_64")]
type Packed = avx512::XSuper;
#[cfg(not(target_arch = "x86_64"))]
type Packed = ();

/// `x` packed for weights of type `t` where the tier's kernels want it so (AVX-512 K-quants), else empty.
fn pack(tier: Tier, t: BlockType, x: &[Q8Block]) -> Vec<Packed> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if tier == Tier::Avx512 && t.block_elems() > QK {
        avx512::pack_supers(avx2::code(t), x, &mut out);
    }
    let _ = (tier, t, x);
    out
}

/// `R` consecutive weight rows from `w` (`row_bytes` apart) times one activation row on the AVX-512
/// kernels: `xq` for the 32-element block types, `xp` (packed) for the K-quants, `blocks` blocks long.
///
/// # Safety
/// The CPU has the AVX-512 tier; the `R` rows and the activations lie inside their buffers, and `xp` holds
/// the packed activations when `t` is a K-quant.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn avx512_rows_dot<const R: usize>(
    t: BlockType,
    w: *const u8,
    row_bytes: usize,
    xq: *const Q8Block,
    xp: *const Packed,
    blocks: usize,
) -> [f32; R] {
    use avx2::*;
    use avx512::{rows_dot, rows_dot_k};
    match code(t) {
        Q4_0 => rows_dot::<Q4_0, R>(w, row_bytes, xq, blocks),
        Q4_1 => rows_dot::<Q4_1, R>(w, row_bytes, xq, blocks),
        Q5_0 => rows_dot::<Q5_0, R>(w, row_bytes, xq, blocks),
        Q8_0 => rows_dot::<Q8_0, R>(w, row_bytes, xq, blocks),
        Q4K => rows_dot_k::<Q4K, R>(w, row_bytes, xp, blocks / 8),
        Q5K => rows_dot_k::<Q5K, R>(w, row_bytes, xp, blocks / 8),
        _ => rows_dot_k::<Q6K, R>(w, row_bytes, xp, blocks / 8),
    }
}

/// Row length (bytes) from which the SIMD mat-vecs take rows one at a time.
const LONG_ROW: usize = 768;

/// `out[i] = W[first + i] · x` for consecutive rows, on the best kernel available.
#[allow(clippy::too_many_arguments)]
fn rows_dot_into(
    tier: Tier,
    t: BlockType,
    w: &[u8],
    row_bytes: usize,
    first: usize,
    x: &[Q8Block],
    packed: &[Packed],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    // Q8_0 runs the 256-bit kernel with AVX-512 VNNI's 256-bit `vpdpbusd` (below): one block per
    // instruction with the weights' signs moved onto the activations measured 22% faster than two blocks
    // per 512-bit instruction with the weights made unsigned (+128) and corrected.
    if tier == Tier::Avx512 && t != BlockType::Q8_0 {
        let n = out.len();
        assert!((first + n) * row_bytes <= w.len());
        assert!(t.block_elems() == QK || packed.len() * 8 == x.len(), "K-quant activations are packed");
        let mut r = 0;
        // SAFETY: the tier's CPU features are present (`matvec_on` checks), every row read lies inside `w`
        // (asserted), and the activations are whole rows of `x.len()` blocks (packed for the K-quants).
        unsafe {
            let base = w.as_ptr().add(first * row_bytes);
            let (xq, xp) = (x.as_ptr(), packed.as_ptr());
            // Short rows go four at a time, sharing each activation load, with the next four prefetched;
            // long rows one at a time, a sequential stream the hardware prefetcher follows (measured on
            // Qwen 1.5B, 864 to 5040-byte K-quant rows: 28 tok/s against 19.6 four at a time).
            let long = row_bytes >= LONG_ROW;
            while r + 4 <= n && !long {
                let y = avx512_rows_dot::<4>(t, base.add(r * row_bytes), row_bytes, xq, xp, x.len());
                out[r..r + 4].copy_from_slice(&y);
                r += 4;
            }
            while r < n {
                out[r] = avx512_rows_dot::<1>(t, base.add(r * row_bytes), row_bytes, xq, xp, x.len())[0];
                r += 1;
            }
        }
        return;
    }
    let _ = packed;
    #[cfg(target_arch = "x86_64")]
    if tier != Tier::Scalar {
        use avx2::*;
        let n = out.len();
        assert!((first + n) * row_bytes <= w.len());
        let mut r = 0;
        // SAFETY: the tier's CPU features are present (`matvec_on` checks) and every row read lies inside
        // `w` (asserted).
        unsafe {
            let base = w.as_ptr().add(first * row_bytes);
            let long = row_bytes >= LONG_ROW;
            macro_rules! run {
                ($f:ident, $code:expr) => {{
                    while r + 4 <= n && !long {
                        out[r..r + 4].copy_from_slice(&$f::<{ $code }, 4>(base.add(r * row_bytes), row_bytes, x));
                        r += 4;
                    }
                    while r < n {
                        out[r] = $f::<{ $code }, 1>(base.add(r * row_bytes), row_bytes, x)[0];
                        r += 1;
                    }
                }};
            }
            match (code(t), tier == Tier::AvxVnni) {
                (Q8_0, _) if tier == Tier::Avx512 => run!(rows_dot_vnni512, Q8_0),
                (Q4_0, false) => run!(rows_dot, Q4_0),
                (Q4_1, false) => run!(rows_dot, Q4_1),
                (Q5_0, false) => run!(rows_dot, Q5_0),
                (Q8_0, false) => run!(rows_dot, Q8_0),
                (Q4K, false) => run!(rows_dot_k, Q4K),
                (Q5K, false) => run!(rows_dot_k, Q5K),
                (_, false) => run!(rows_dot_k, Q6K),
                (Q4_0, true) => run!(rows_dot_vnni, Q4_0),
                (Q4_1, true) => run!(rows_dot_vnni, Q4_1),
                (Q5_0, true) => run!(rows_dot_vnni, Q5_0),
                (Q8_0, true) => run!(rows_dot_vnni, Q8_0),
                // The K-quant kernels scale in the integer domain with `madd`, which VNNI has no form of.
                (Q4K, true) => run!(rows_dot_k, Q4K),
                (Q5K, true) => run!(rows_dot_k, Q5K),
                (_, true) => run!(rows_dot_k, Q6K),
            }
        }
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let r = first + i;
        *o = row_dot_scalar(t, &w[r * row_bytes..(r + 1) * row_bytes], x);
    }
}

mod batched;
pub use batched::{int_matmul_name, int_matmul_supports, matmul, matmul_on};

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
            })
            .collect()
    }

    const TYPES: [GgmlDType; 7] = KERNEL_TYPES;

    /// Quantizes a random `rows × cols` matrix with candle (ggml's own quantizers) and returns its bytes
    /// and candle's dequantization of it.
    fn matrix(ty: GgmlDType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let t = Tensor::from_vec(random(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, ty).unwrap();
        let deq = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        (q.data().unwrap().into_owned(), deq)
    }

    #[test]
    fn block_dequantization_matches_candle() {
        for ty in TYPES {
            let t = BlockType::of(ty).unwrap();
            let (bytes, deq) = matrix(ty, 3, 512, 1);
            let mut out = vec![0f32; 3 * 512];
            for (b, o) in bytes.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(t.block_elems())) {
                dequantize_block(t, b, o);
            }
            assert_eq!(out, deq, "{ty:?}");
            assert_eq!(dequantize_on(Tier::Scalar, t, &bytes, 3, 512), deq, "{ty:?}");
        }
    }

    /// A tier's whole-matrix dequantization against candle's.
    fn check_dequantization(tier: Tier) {
        for ty in TYPES {
            let (bytes, deq) = matrix(ty, 3, 512, 1);
            let simd = dequantize_on(tier, BlockType::of(ty).unwrap(), &bytes, 3, 512);
            // FMA rounds once where the scalar code rounds twice.
            let close = simd.iter().zip(&deq).all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs()));
            assert!(close, "{tier:?} {ty:?}");
        }
    }

    /// Odd shapes: 1 block, many blocks, row counts that are not multiples of the work item, big enough
    /// matrices to go through the worker pool, short and long rows.
    const MATVEC_SHAPES: [(usize, usize); 7] =
        [(1, 32), (7, 64), (33, 800), (300, 1024), (1, 256), (9, 768), (37, 2304)];

    #[test]
    fn scalar_matches_dequantized_f32() {
        for (rows, cols) in MATVEC_SHAPES {
            for ty in TYPES {
                let t = BlockType::of(ty).unwrap();
                if cols % t.block_elems() != 0 {
                    continue;
                }
                let (w, deq) = matrix(ty, rows, cols, rows as u64 * 7 + cols as u64);
                let x = random(cols, 99);
                let mut xq = vec![Q8Block::default(); cols / QK];
                quantize_row_q8_for(t, &x, &mut xq);
                let row_bytes = w.len() / rows;
                for r in 0..rows {
                    let scalar = row_dot_scalar(t, &w[r * row_bytes..(r + 1) * row_bytes], &xq);
                    // The only difference is the 8-bit rounding of x (≤ d_x/2 per element).
                    let exact: f32 = deq[r * cols..(r + 1) * cols].iter().zip(&x).map(|(a, b)| a * b).sum();
                    let bound: f32 = deq[r * cols..(r + 1) * cols]
                        .iter()
                        .enumerate()
                        .map(|(i, a)| a.abs() * xq[i / QK].d * 0.5)
                        .sum();
                    assert!(
                        (scalar - exact).abs() <= bound + 1e-4,
                        "{ty:?} row {r}: {scalar} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    /// A tier's mat-vec against the scalar row dot products.
    fn check_matvec(tier: Tier) {
        for (rows, cols) in MATVEC_SHAPES {
            for ty in TYPES {
                let t = BlockType::of(ty).unwrap();
                if cols % t.block_elems() != 0 {
                    continue;
                }
                let (w, _) = matrix(ty, rows, cols, rows as u64 * 7 + cols as u64);
                let mut xq = vec![Q8Block::default(); cols / QK];
                quantize_row_q8_for(t, &random(cols, 99), &mut xq);
                let row_bytes = w.len() / rows;
                let mut y = vec![0f32; rows];
                matvec_on(tier, t, &w, rows, &xq, &mut y);
                for (r, y) in y.iter().enumerate() {
                    let scalar = row_dot_scalar(t, &w[r * row_bytes..(r + 1) * row_bytes], &xq);
                    // Same integer sums, different float summation order.
                    assert!(
                        (y - scalar).abs() <= 1e-4 * (1.0 + scalar.abs()),
                        "{tier:?} {ty:?} {rows}x{cols} row {r}: {y} vs {scalar}"
                    );
                }
            }
        }
    }

    /// One dispatch over several matrices (different types, row counts that end mid work item, enough
    /// bytes to go through the worker pool) gives each the same bits as its own `matvec_on`.
    fn check_fused_jobs(tier: Tier) {
        let cols = 512;
        let specs = [(GgmlDType::Q5_0, 333), (GgmlDType::Q4K, 70), (GgmlDType::Q8_0, 129), (GgmlDType::Q6K, 1)];
        let mats: Vec<(BlockType, Vec<u8>, usize)> = specs
            .iter()
            .map(|&(ty, rows)| (BlockType::of(ty).unwrap(), matrix(ty, rows, cols, rows as u64).0, rows))
            .collect();
        let x = random(cols, 5);
        let quantized = |t: BlockType| {
            let mut q = vec![Q8Block::default(); cols / QK];
            quantize_row_q8_for(t, &x, &mut q);
            q
        };
        let xs: Vec<Vec<Q8Block>> = mats.iter().map(|(t, ..)| quantized(*t)).collect();
        let mut ys: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; m.2]).collect();
        let mut jobs: Vec<MatVecJob> = mats
            .iter()
            .zip(&xs)
            .zip(ys.iter_mut())
            .map(|(((t, w, rows), x), y)| MatVecJob { t: *t, w, rows: *rows, x, y })
            .collect();
        matvec_jobs_on(tier, &mut jobs);
        drop(jobs);
        for (((t, w, rows), x), y) in mats.iter().zip(&xs).zip(&ys) {
            let mut alone = vec![0f32; *rows];
            matvec_on(tier, *t, w, *rows, x, &mut alone);
            assert_eq!(&alone, y, "{tier:?} {t:?}");
        }
    }

    #[test]
    fn scalar_fused_jobs_match_separate_products_bit_for_bit() {
        check_fused_jobs(Tier::Scalar);
    }

    /// Every check of a SIMD tier, which the build machine has (`build.rs`), so it must be detected.
    fn check_tier(tier: Tier) {
        assert!(Tier::supported().contains(&tier), "the build machine has {} but it is not detected", tier.name());
        check_dequantization(tier);
        check_matvec(tier);
        check_fused_jobs(tier);
        check_batched(tier);
    }

    #[test]
    #[cfg_attr(not(reagent_host_avx2), ignore = "this CPU lacks AVX2/FMA/F16C")]
    fn avx2_kernels_match_scalar() {
        check_tier(Tier::Avx2);
    }

    #[test]
    #[cfg_attr(not(reagent_host_avxvnni), ignore = "this CPU lacks AVX-VNNI")]
    fn vnni_kernels_match_scalar() {
        check_tier(Tier::AvxVnni);
    }

    #[test]
    #[cfg_attr(not(reagent_host_avx512), ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI")]
    fn avx512_kernels_match_scalar() {
        check_tier(Tier::Avx512);
    }

    #[test]
    fn q4k_scales_unpack_all_at_once_as_one_at_a_time() {
        let mut s = 7u64;
        for _ in 0..200 {
            let q: [u8; 12] = std::array::from_fn(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            });
            let (sc, mn) = q4k_scales_mins(&q);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), q4k_scale_min(j, &q), "sub-block {j} of {q:?}");
            }
        }
    }

    /// A tier's batched product against per-token scalar mat-vecs (the scalar tier's `matmul_on`): tails
    /// of rows and tokens that do not fill a tile, an odd number of 32-element blocks and partial groups,
    /// and enough tokens for more than one pass.
    fn check_batched(tier: Tier) {
        for (n, k, m) in [(1, 32, 1), (7, 96, 5), (33, 256, 4), (9, 768, 70), (64, 512, 131), (5, 4864, 40)] {
            for ty in TYPES {
                let t = BlockType::of(ty).unwrap();
                if k % t.block_elems() != 0 {
                    continue;
                }
                let (w, _) = matrix(ty, n, k, (n * k) as u64);
                let x = random(m * k, 3);
                let reference = matmul_on(Tier::Scalar, t, &w, n, k, &x);
                let y = matmul_on(tier, t, &w, n, k, &x);
                for (i, (a, b)) in y.iter().zip(&reference).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{tier:?} {ty:?} {n}x{k}, {m} tokens: token {} row {}: {a} vs {b}",
                        i / n,
                        i % n
                    );
                }
            }
        }
    }

    /// The AVX-512 and AVX2 weight packers (SIMD unpacking) and the portable one (`unsigned_block`) give the
    /// same groups: the same bytes and scales, and the same minimums where the kernel reads them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(reagent_host_avx512), ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI")]
    fn simd_and_portable_weight_packing_agree() {
        for ty in TYPES {
            let t = BlockType::of(ty).unwrap();
            let (n, k) = (5, if t.block_elems() == QK { 96 } else { 512 });
            let (w, _) = matrix(ty, n, k, 17);
            let (mut simd, mut simd2, mut portable) = (Vec::new(), Vec::new(), Vec::new());
            // SAFETY: AVX-512 (and so AVX2) is present (the build machine has it, and the tests run where they are
            // built); `w` holds `n` rows.
            unsafe {
                avx512::pack_weight_groups(avx2::code(t), w.as_ptr(), w.len() / n, n, k / QK, &mut simd);
                avx2::pack_weight_groups(t, &w, w.len() / n, n, k / QK, &mut simd2);
            }
            avx512::pack_weight_groups_portable(t, &w, w.len() / n, n, k / QK, &mut portable);
            let min = t.has_minimum();
            for (i, ((a, a2), b)) in simd.iter().zip(&simd2).zip(&portable).enumerate() {
                assert_eq!((a.u, a.d), (b.u, b.d), "{ty:?} group {i}");
                assert_eq!((a2.u, a2.d, a2.c), (b.u, b.d, b.c), "{ty:?} group {i} (AVX2 packer)");
                if min {
                    assert_eq!(a.c, b.c, "{ty:?} group {i}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(reagent_host_avx2), ignore = "this CPU lacks AVX2/FMA/F16C")]
    fn simd_quantization_gives_the_scalar_bits() {
        // Exact ties included: 0.5 steps of a block whose largest value is 127.
        let mut x = random(1024, 11);
        for (i, v) in x[..64].iter_mut().enumerate() {
            *v = (i as f32 - 32.0) * 0.5;
        }
        x[63] = 127.0;
        for group in [1, 8] {
            let mut scalar = vec![Q8Block::default(); 32];
            quantize_groups_scalar(&x, &mut scalar, group);
            let mut simd = vec![Q8Block::default(); 32];
            // SAFETY: AVX2 is present (the build machine has it, and the tests run where they are built).
            unsafe { avx2::quantize_groups(&x, &mut simd, group) };
            for (a, b) in simd.iter().zip(&scalar) {
                assert_eq!((a.d, a.sum, a.qs), (b.d, b.sum, b.qs), "group {group}");
            }
        }
    }

    #[test]
    fn quantized_activations_round_trip_within_half_a_step() {
        let x = random(256, 5);
        let mut q = vec![Q8Block::default(); 8];
        quantize_row_q8(&x, &mut q);
        for (i, v) in x.iter().enumerate() {
            let b = &q[i / QK];
            assert!((b.d * b.qs[i % QK] as f32 - v).abs() <= b.d * 0.5 + 1e-7);
        }
        assert!(q.iter().all(|b| b.sum == b.qs.iter().map(|&v| v as i32).sum::<i32>()));
    }
}
