//! CPU mat-vec kernels for the 32-element block quantizations (Q4_0, Q4_1, Q5_0, Q8_0) that candle 0.11
//! runs through a scalar path (Q4_1, Q5_0) or that we want on the same fast path (Q4_0, Q8_0).
//!
//! Decode multiplies each weight matrix by one activation row. As in llama.cpp, the row is first quantized
//! to 8 bits per 32-element block ([`Q8Block`]: an f32 scale, the block's integer sum, 32 × i8), so the
//! inner loop is an integer dot product of weight nibbles/bytes with activation bytes; the block scales are
//! applied once per block. The weight bytes are read in place, in GGUF's own block layout.
//!
//! Every kernel has a portable scalar version and an AVX2+FMA+F16C version chosen at run time; tests check
//! that both agree, and that both agree with dequantize-then-f32. Rows are split across candle's spinning
//! worker pool, which costs a few microseconds per call rather than rayon's tens.

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

/// Quantizes `x` (a multiple of 32 long) into `out`.
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    debug_assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * inv).round() as i8;
            sum += *q as i32;
        }
        b.d = d;
        b.sum = sum;
    }
}

/// The weight types these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
}

impl BlockType {
    /// The kernel type for a ggml type, if there is one.
    pub fn of(t: GgmlDType) -> Option<Self> {
        match t {
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
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
    }
}

/// Unsigned weight quants of one block (Q4 nibbles 0..15, Q5 values 0..31, Q8 signed) and how the block
/// turns `Σ w·x` into a float: `d_w·d_x·(Σ q·qx − offset·Σ qx) + min·d_x·Σ qx`.
fn block_dot_scalar(t: BlockType, b: &[u8], x: &Q8Block) -> f32 {
    let mut q = [0i32; QK];
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
    };
    let dot: i32 = q.iter().zip(&x.qs).map(|(&a, &b)| a * b as i32).sum();
    d * x.d * (dot - offset * x.sum) as f32 + min * x.d * x.sum as f32
}

/// Scalar dot product of one weight row (GGUF blocks) with a quantized activation row.
pub fn row_dot_scalar(t: BlockType, row: &[u8], x: &[Q8Block]) -> f32 {
    row.chunks_exact(t.block_bytes()).zip(x).map(|(b, xb)| block_dot_scalar(t, b, xb)).sum()
}

/// Which implementation of the kernels runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with AVX-VNNI byte dot products.
    AvxVnni,
}

impl Tier {
    /// The best tier this CPU supports (`REAGENT_KERNELS=scalar|avx2` caps it, to compare tiers).
    pub fn best() -> Tier {
        static BEST: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var("REAGENT_KERNELS").as_deref() {
                Ok("scalar") => Tier::Scalar,
                Ok("avx2") => Tier::Avx2,
                _ => Tier::AvxVnni,
            };
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
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    let row_bytes = x.len() * t.block_bytes();
    assert_eq!(w.len(), rows * row_bytes, "weight bytes do not match {rows} rows of {} blocks", x.len());
    assert_eq!(y.len(), rows);
    // Small matrices are not worth waking the workers for.
    if rows * row_bytes < 64 * 1024 {
        rows_dot_into(tier, t, w, row_bytes, 0, x, y);
        return;
    }
    const ROWS_PER_ITEM: usize = 16;
    let y_ptr = y.as_mut_ptr() as usize;
    candle_core::utils::barrier_pool().execute_chunked(rows.div_ceil(ROWS_PER_ITEM), |items| {
        let first = items.start * ROWS_PER_ITEM;
        let last = rows.min(items.end * ROWS_PER_ITEM);
        // SAFETY: work items cover disjoint row ranges of `y` (`last <= rows == y.len()`).
        let out = unsafe { std::slice::from_raw_parts_mut((y_ptr as *mut f32).add(first), last - first) };
        rows_dot_into(tier, t, w, row_bytes, first, x, out);
    });
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BlockType, Q8Block};

    // Type codes for the const-generic kernels (a `match` on them folds away).
    pub(super) const Q4_0: u8 = 0;
    pub(super) const Q4_1: u8 = 1;
    pub(super) const Q5_0: u8 = 2;
    pub(super) const Q8_0: u8 = 3;

    pub(super) fn code(t: BlockType) -> u8 {
        match t {
            BlockType::Q4_0 => Q4_0,
            BlockType::Q4_1 => Q4_1,
            BlockType::Q5_0 => Q5_0,
            BlockType::Q8_0 => Q8_0,
        }
    }

    const fn block_bytes(t: u8) -> usize {
        match t {
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            _ => 34,
        }
    }

    #[inline(always)]
    unsafe fn f16(b: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(b as *const u16) as i32)))
    }

    /// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0..15), then high nibbles (16..31).
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        let v = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, m);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
        _mm256_set_m128i(hi, lo)
    }

    /// 32 bits → 32 bytes, byte i = 0x10 where bit i is set (Q5_0's fifth bit).
    #[inline(always)]
    unsafe fn fifth_bits(qh: u32) -> __m256i {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `Σ u·s` over 32 lanes of unsigned × signed bytes, as 8 × i32: one VNNI instruction, or AVX2's
    /// maddubs (pairs to i16, cannot overflow for |u| ≤ 128, |s| ≤ 127) + madd.
    #[inline(always)]
    unsafe fn dot_us<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }

    /// `Σ u·qx` of one block as 8 × i32, where `u` are the block's weights as unsigned bytes, with the
    /// block's scale and its per-block correction `c` such that `Σ w·x = d·d_x·Σ u·qx + c·d_x·Σ qx`:
    /// the offset of Q4_0 (u − 8) and Q5_0 (u − 16) times `d`, or Q4_1's minimum. Keeping those weights
    /// unsigned saves the subtraction and two sign instructions per block a signed product would need.
    #[inline(always)]
    unsafe fn block<const T: u8, const VNNI: bool>(b: *const u8, qx: __m256i) -> (__m256i, f32, f32) {
        let d = f16(b);
        match T {
            Q4_0 => (dot_us::<VNNI>(nibbles(b.add(2)), qx), d, -8.0 * d),
            Q4_1 => (dot_us::<VNNI>(nibbles(b.add(4)), qx), d, f16(b.add(2))),
            Q5_0 => {
                let qh = std::ptr::read_unaligned(b.add(2) as *const u32);
                (dot_us::<VNNI>(_mm256_or_si256(nibbles(b.add(6)), fifth_bits(qh)), qx), d, -16.0 * d)
            }
            _ => {
                // Signed weights: their sign moves onto the activations (`|w| · ±qx`). Measured faster than
                // offsetting them to unsigned (xor 0x80), which maddubs could not take anyway (255 × 127
                // pairs overflow i16).
                let w = _mm256_loadu_si256(b.add(2) as *const __m256i);
                (dot_us::<VNNI>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qx, w)), d, 0.0)
            }
        }
    }

    /// Dot products of `R` weight rows (starting at `rows`, `stride` bytes apart) with `x`: the activation
    /// block is loaded once for all rows, and the rows' accumulators are independent chains.
    #[inline(always)]
    unsafe fn rows_dot_impl<const T: u8, const R: usize, const VNNI: bool>(
        rows: *const u8,
        stride: usize,
        x: &[Q8Block],
    ) -> [f32; R] {
        let bb = block_bytes(T);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = [0f32; R];
        for (i, xb) in x.iter().enumerate() {
            let qx = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
            let sx = xb.d * xb.sum as f32;
            for r in 0..R {
                let (p, d, c) = block::<T, VNNI>(rows.add(r * stride + i * bb), qx);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * xb.d), acc[r]);
                mins[r] += c * sx;
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) + mins[r];
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_dot<const T: u8, const R: usize>(
        rows: *const u8,
        stride: usize,
        x: &[Q8Block],
    ) -> [f32; R] {
        rows_dot_impl::<T, R, false>(rows, stride, x)
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub(super) unsafe fn rows_dot_vnni<const T: u8, const R: usize>(
        rows: *const u8,
        stride: usize,
        x: &[Q8Block],
    ) -> [f32; R] {
        rows_dot_impl::<T, R, true>(rows, stride, x)
    }
}

/// `out[i] = W[first + i] · x` for consecutive rows, on the best kernel available.
fn rows_dot_into(tier: Tier, t: BlockType, w: &[u8], row_bytes: usize, first: usize, x: &[Q8Block], out: &mut [f32]) {
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
            macro_rules! run {
                ($f:ident, $code:expr) => {{
                    while r + 4 <= n {
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
                (Q4_0, false) => run!(rows_dot, Q4_0),
                (Q4_1, false) => run!(rows_dot, Q4_1),
                (Q5_0, false) => run!(rows_dot, Q5_0),
                (_, false) => run!(rows_dot, Q8_0),
                (Q4_0, true) => run!(rows_dot_vnni, Q4_0),
                (Q4_1, true) => run!(rows_dot_vnni, Q4_1),
                (Q5_0, true) => run!(rows_dot_vnni, Q5_0),
                (_, true) => run!(rows_dot_vnni, Q8_0),
            }
        }
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let r = first + i;
        *o = row_dot_scalar(t, &w[r * row_bytes..(r + 1) * row_bytes], x);
    }
}

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

    const TYPES: [GgmlDType; 4] = [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0];

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
            let (bytes, deq) = matrix(ty, 3, 96, 1);
            let mut out = vec![0f32; 3 * 96];
            for (b, o) in bytes.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(QK)) {
                dequantize_block(t, b, o);
            }
            assert_eq!(out, deq, "{ty:?}");
        }
    }

    #[test]
    fn simd_matches_scalar_and_scalar_matches_dequantized_f32() {
        // Odd shapes: 1 block, many blocks, row counts that are not multiples of the work item, and big
        // enough matrices to go through the worker pool.
        for (rows, cols) in [(1, 32), (7, 64), (33, 800), (300, 1024)] {
            for ty in TYPES {
                let t = BlockType::of(ty).unwrap();
                let (w, deq) = matrix(ty, rows, cols, rows as u64 * 7 + cols as u64);
                let x = random(cols, 99);
                let mut xq = vec![Q8Block::default(); cols / QK];
                quantize_row_q8(&x, &mut xq);
                let row_bytes = w.len() / rows;
                let ys: Vec<(Tier, Vec<f32>)> = Tier::supported()
                    .into_iter()
                    .map(|tier| {
                        let mut y = vec![0f32; rows];
                        matvec_on(tier, t, &w, rows, &xq, &mut y);
                        (tier, y)
                    })
                    .collect();
                for r in 0..rows {
                    let row = &w[r * row_bytes..(r + 1) * row_bytes];
                    let scalar = row_dot_scalar(t, row, &xq);
                    for (tier, y) in &ys {
                        // Same integer sums, different float summation order.
                        assert!(
                            (y[r] - scalar).abs() <= 1e-4 * (1.0 + scalar.abs()),
                            "{tier:?} {ty:?} {rows}x{cols} row {r}: {} vs {scalar}",
                            y[r]
                        );
                    }
                    // Against f32: the only difference is the 8-bit rounding of x (≤ d_x/2 per element).
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
