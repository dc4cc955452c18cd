//! One decode step on plain `f32` buffers: the element-wise work and the attention of a single query
//! position, without candle's tensors.
//!
//! A decode step through candle costs some thirty tensor operations per block, each allocating its
//! output, and its attention copies the whole live KV cache to make it contiguous (K and V of every
//! block, every token: 23 MB a token for SmolLM2 at 500 positions). On small models that is a visible
//! share of the token beside the mat-vecs. Here the step reads the cache in place and writes into
//! buffers kept from token to token; the mat-vecs are the same kernels (`layers::matvec_host`). The
//! arithmetic follows candle's definitions (RMS norm, rotary pairs, tanh GELU, SiLU), and the results
//! match the tensor path to rounding (`tests/model.rs`).

use super::kernels::Tier;
use super::pool::pool;

/// The buffers of a host decode step, kept from token to token.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) x: Vec<f32>,
    pub(crate) h: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) a: Vec<f32>,
    pub(crate) y: Vec<f32>,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
}

/// `out = x / rms(x) * w`, as candle's `rms_norm` computes it.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let m = rms(x, eps);
    for ((o, &v), &a) in out.iter_mut().zip(x).zip(w) {
        *o = v / m * a;
    }
}

/// [`rms_norm`] of `x` into itself.
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let m = rms(x, eps);
    for (v, &a) in x.iter_mut().zip(w) {
        *v = *v / m * a;
    }
}

/// `sqrt(mean(x²) + eps)`.
fn rms(x: &[f32], eps: f32) -> f32 {
    let sum2: f32 = x.iter().map(|&v| v * v).sum();
    (sum2 / x.len() as f32 + eps).sqrt()
}

/// Rotates every `d`-element head of `x` by the rotary angles of one position (`cos`, `sin`: `d/2`
/// each), pairing adjacent elements or the two halves.
pub(crate) fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], d: usize, stride: usize, interleaved: bool) {
    let half = d / 2;
    for head in x.chunks_exact_mut(stride) {
        for i in 0..half {
            let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// `gate = act(gate) * up`, SiLU or candle's tanh-approximated GELU, on the tier's vector width: the
/// exponential is computed inline ([`exp`]), not by a libm call per element (candle's GELU spent 18% of
/// Gemma 3's prefill in `tanhf`).
pub(crate) fn gated(gate: &mut [f32], up: &[f32], gelu: bool) {
    #[cfg(target_arch = "x86_64")]
    match Tier::best() {
        // SAFETY: the tier is one this CPU supports (`Tier::best`).
        Tier::Avx512 => return unsafe { gated_avx512(gate, up, gelu) },
        Tier::Avx2 | Tier::AvxVnni => return unsafe { gated_avx2(gate, up, gelu) },
        Tier::Scalar => {}
    }
    gated_generic(gate, up, gelu)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gated_avx512(gate: &mut [f32], up: &[f32], gelu: bool) {
    gated_generic(gate, up, gelu)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2(gate: &mut [f32], up: &[f32], gelu: bool) {
    gated_generic(gate, up, gelu)
}

#[inline(always)]
fn gated_generic(gate: &mut [f32], up: &[f32], gelu: bool) {
    // Two loops, so that each has no branch inside and vectorizes.
    if gelu {
        let c = (2.0 / std::f32::consts::PI).sqrt();
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = *g;
            // tanh(v) = 1 − 2 / (e^{2v} + 1)
            let t = 1.0 - 2.0 / (exp(2.0 * c * (x + 0.044715 * x * x * x)) + 1.0);
            *g = 0.5 * x * (1.0 + t) * u;
        }
    } else {
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = *g;
            *g = x / (1.0 + exp(-x)) * u;
        }
    }
}

/// `e^x` in plain arithmetic the compiler can vectorize: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, `e^r` by
/// its Taylor polynomial to degree 7, `2^n` put into the exponent bits. Relative error about 1e-7; inputs
/// are clamped to where the result is a normal float or infinity-free (`e^-87.3` to `e^88.3`).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x += y`.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// The keys and values of one block's cache, per KV head `len × d` (position-major).
pub(crate) struct KvView<'a> {
    pub k: &'a [Vec<f32>],
    pub v: &'a [Vec<f32>],
    pub len: usize,
    pub d: usize,
}

/// Query heads attended together at most: their sums stay in registers.
const MAX_GROUP: usize = 8;

/// Attention of the query at the last cached position: `q` is `heads × d` (already scaled), query head
/// `h` reads KV head `h / (heads / kv_heads)`, and sees the last `window` positions (all without one).
/// Writes `heads × d` into `out`. The query heads that read one KV head go in groups (at most
/// [`MAX_GROUP`], enough groups for every thread of the kernel pool), each group reading the keys and
/// values once; every head's arithmetic is `head`'s, so the result is the same bits however the heads
/// are grouped.
pub(crate) fn attend_one(q: &[f32], kv: &KvView<'_>, window: Option<usize>, out: &mut [f32]) {
    let d = kv.d;
    let heads = q.len() / d;
    let kv_heads = kv.k.len();
    let rep = heads / kv_heads;
    let from = window.map_or(0, |w| kv.len.saturating_sub(w));
    let parts = pool().threads().div_ceil(kv_heads).max(rep.div_ceil(MAX_GROUP)).min(rep);
    let size = rep.div_ceil(parts);
    let per_kv = rep.div_ceil(size);
    let out_addr = out.as_mut_ptr() as usize;
    let tier = Tier::best();
    pool().for_chunks(kv_heads * per_kv, |range| {
        let mut scores = Vec::new();
        for unit in range {
            let kh = unit / per_kv;
            let first = kh * rep + (unit % per_kv) * size;
            let last = (first + size).min((kh + 1) * rep);
            // SAFETY: each group's heads' outputs are written by the one chunk that holds the group.
            let o =
                unsafe { std::slice::from_raw_parts_mut((out_addr as *mut f32).add(first * d), (last - first) * d) };
            let (k, v) = (&kv.k[kh][from * d..kv.len * d], &kv.v[kh][from * d..kv.len * d]);
            group(tier, d, &q[first * d..last * d], k, v, &mut scores, o);
        }
    });
}

/// Query heads `q` (`n × d`, n ≤ [`MAX_GROUP`]) over the same keys and values: `head` for each, each key
/// and value row read once for all of them.
fn group(tier: Tier, d: usize, q: &[f32], k: &[f32], v: &[f32], scores: &mut Vec<f32>, out: &mut [f32]) {
    macro_rules! by_size {
        ($f:ident) => {
            match q.len() / d {
                1 => $f::<1>(d, q, k, v, scores, out),
                2 => $f::<2>(d, q, k, v, scores, out),
                3 => $f::<3>(d, q, k, v, scores, out),
                4 => $f::<4>(d, q, k, v, scores, out),
                5 => $f::<5>(d, q, k, v, scores, out),
                6 => $f::<6>(d, q, k, v, scores, out),
                7 => $f::<7>(d, q, k, v, scores, out),
                8 => $f::<8>(d, q, k, v, scores, out),
                n => unreachable!("a group of {n} heads"),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    match tier {
        // SAFETY: the tier is one this CPU supports (`Tier::best`).
        Tier::Avx512 => return unsafe { by_size!(group_avx512) },
        Tier::Avx2 | Tier::AvxVnni => return unsafe { by_size!(group_avx2) },
        Tier::Scalar => {}
    }
    let _ = tier;
    by_size!(group_portable)
}

fn group_portable<const N: usize>(d: usize, q: &[f32], k: &[f32], v: &[f32], s: &mut Vec<f32>, o: &mut [f32]) {
    group_generic::<N>(d, q, k, v, s, o, no_scores16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn group_avx512<const N: usize>(d: usize, q: &[f32], k: &[f32], v: &[f32], s: &mut Vec<f32>, o: &mut [f32]) {
    // SAFETY: AVX-512F is there: this function's own target feature, which the caller checked.
    group_generic::<N>(d, q, k, v, s, o, |q, k, s| unsafe { scores16(q, k, s) })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2<const N: usize>(d: usize, q: &[f32], k: &[f32], v: &[f32], s: &mut Vec<f32>, o: &mut [f32]) {
    group_generic::<N>(d, q, k, v, s, o, no_scores16)
}

/// The tiers without sixteen-row scores: each row's dot product on its own.
fn no_scores16(_: &[f32], _: &[f32], _: &mut [f32; 16]) -> bool {
    false
}

/// `head_generic` for `N` heads at once, in its order of operations for each head (the same dot
/// products, the same running maximum and sum, each column's weighted sum over the positions in order
/// from zero): bit for bit the same outputs.
/// `scores16(q, k, s)` writes the scores of sixteen rows at once where the tier can (and says so), in
/// `dot`'s order of operations.
#[inline(always)]
fn group_generic<const N: usize>(
    d: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
    scores16: impl Fn(&[f32], &[f32], &mut [f32; 16]) -> bool,
) {
    let len = k.len() / d;
    scores.clear();
    scores.resize(N * len, 0.0);
    let mut max = [f32::NEG_INFINITY; N];
    // Sixteen positions at a time where the tier can (the same sums), then one at a time.
    let mut j0 = 0;
    'blocks: while d.is_multiple_of(16) && j0 + 16 <= len {
        for h in 0..N {
            let s: &mut [f32; 16] = (&mut scores[h * len + j0..h * len + j0 + 16]).try_into().expect("16 scores");
            if !scores16(&q[h * d..(h + 1) * d], &k[j0 * d..(j0 + 16) * d], s) {
                break 'blocks;
            }
            max[h] = s.iter().fold(max[h], |m, &x| m.max(x));
        }
        j0 += 16;
    }
    for (j, kj) in k.chunks_exact(d).enumerate().skip(j0) {
        for h in 0..N {
            let s = dot(&q[h * d..(h + 1) * d], kj);
            max[h] = max[h].max(s);
            scores[h * len + j] = s;
        }
    }
    let mut z = [0f32; N];
    for h in 0..N {
        for s in scores[h * len..(h + 1) * len].iter_mut() {
            *s = (*s - max[h]).exp();
            z[h] += *s;
        }
    }
    let mut col = 0;
    while col + 16 <= d {
        let mut acc = [[0f32; 16]; N];
        for (j, row) in v.chunks_exact(d).enumerate() {
            let r: &[f32; 16] = row[col..col + 16].try_into().expect("16 columns");
            for h in 0..N {
                let w = scores[h * len + j];
                for i in 0..16 {
                    acc[h][i] += w * r[i];
                }
            }
        }
        for h in 0..N {
            out[h * d + col..h * d + col + 16].copy_from_slice(&acc[h]);
        }
        col += 16;
    }
    for h in 0..N {
        let p = &scores[h * len..(h + 1) * len];
        for c in col..d {
            out[h * d + c] = p.iter().zip(v.chunks_exact(d)).map(|(&p, row)| p * row[c]).sum();
        }
        let inv = 1.0 / z[h];
        out[h * d..(h + 1) * d].iter_mut().for_each(|o| *o *= inv);
    }
}

#[cfg(test)]
/// One head: softmax of `q · k_j` over the positions of `k`, times `v`, into `out` (the reference the
/// grouped heads are checked against).
fn head(tier: Tier, q: &[f32], k: &[f32], v: &[f32], scores: &mut Vec<f32>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match tier {
        // SAFETY: the tier is one this CPU supports (`Tier::best`).
        Tier::Avx512 => return unsafe { head_avx512(q, k, v, scores, out) },
        Tier::Avx2 | Tier::AvxVnni => return unsafe { head_avx2(q, k, v, scores, out) },
        Tier::Scalar => {}
    }
    let _ = tier;
    head_generic(q, k, v, scores, out)
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn head_avx512(q: &[f32], k: &[f32], v: &[f32], scores: &mut Vec<f32>, out: &mut [f32]) {
    head_generic(q, k, v, scores, out)
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2(q: &[f32], k: &[f32], v: &[f32], scores: &mut Vec<f32>, out: &mut [f32]) {
    head_generic(q, k, v, scores, out)
}

/// Written for the compiler to vectorize: sixteen independent sums per dot product, whole rows of `v`
/// added at a time. Compiled once per tier by the wrappers above.
#[cfg(test)]
#[inline(always)]
fn head_generic(q: &[f32], k: &[f32], v: &[f32], scores: &mut Vec<f32>, out: &mut [f32]) {
    let d = q.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for kj in k.chunks_exact(d) {
        let s = dot(q, kj);
        max = max.max(s);
        scores.push(s);
    }
    let mut z = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        z += *s;
    }
    // Columns in blocks whose sums stay in registers across all positions (a sum kept in `out` would be
    // stored and loaded again for every position).
    let mut col = 0;
    while col + 64 <= d {
        weighted_rows::<64>(scores, v, d, col, out);
        col += 64;
    }
    while col + 16 <= d {
        weighted_rows::<16>(scores, v, d, col, out);
        col += 16;
    }
    for c in col..d {
        out[c] = scores.iter().zip(v.chunks_exact(d)).map(|(&p, row)| p * row[c]).sum();
    }
    let inv = 1.0 / z;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// `out[col..col+B] = Σ_j p[j] · v[j][col..col+B]` over the rows `v[j]` of `d` values.
#[cfg(test)]
#[inline(always)]
fn weighted_rows<const B: usize>(p: &[f32], v: &[f32], d: usize, col: usize, out: &mut [f32]) {
    let mut acc = [0f32; B];
    for (&w, row) in p.iter().zip(v.chunks_exact(d)) {
        let r: &[f32; B] = row[col..col + B].try_into().expect("B columns");
        for i in 0..B {
            acc[i] += w * r[i];
        }
    }
    out[col..col + B].copy_from_slice(&acc);
}

/// `dot(q, k_j)` for the sixteen rows `k_j` of `k` (`d` values each, `d` a multiple of 16), in `dot`'s
/// order of operations: sixteen lanes of products summed over the row, then the lanes added in order. The
/// rows' lane sums are transposed so that sixteen rows are reduced at once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores16(q: &[f32], k: &[f32], out: &mut [f32; 16]) -> bool {
    use std::arch::x86_64::*;
    let d = q.len();
    debug_assert!(d.is_multiple_of(16) && k.len() == 16 * d);
    let mut r = [_mm512_setzero_ps(); 16];
    for c in (0..d).step_by(16) {
        // SAFETY: `c + 16 <= d` and each row of `k` holds `d` values.
        let qc = unsafe { _mm512_loadu_ps(q.as_ptr().add(c)) };
        for (j, acc) in r.iter_mut().enumerate() {
            let kc = unsafe { _mm512_loadu_ps(k.as_ptr().add(j * d + c)) };
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(qc, kc));
        }
    }
    // Transpose: t[i] holds lane i of every row. Pairs of rows interleaved, then pairs of pairs (as
    // doubles), then 128-bit lanes gathered across the four groups of four rows.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (r0, r1, r2, r3) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
        let (t0, t1) = (_mm512_unpacklo_ps(r0, r1), _mm512_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm512_unpacklo_ps(r2, r3), _mm512_unpackhi_ps(r2, r3));
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        // u[4g + m], 128-bit lane L: column 4L + m of rows 4g..4g+4.
        u[4 * g] = ps(_mm512_unpacklo_pd(pd(t0), pd(t2)));
        u[4 * g + 1] = ps(_mm512_unpackhi_pd(pd(t0), pd(t2)));
        u[4 * g + 2] = ps(_mm512_unpacklo_pd(pd(t1), pd(t3)));
        u[4 * g + 3] = ps(_mm512_unpackhi_pd(pd(t1), pd(t3)));
    }
    let mut t = [_mm512_setzero_ps(); 16];
    for m in 0..4 {
        let y0 = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
        let y1 = _mm512_shuffle_f32x4::<0xDD>(u[m], u[4 + m]);
        let y2 = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
        let y3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + m], u[12 + m]);
        t[m] = _mm512_shuffle_f32x4::<0x88>(y0, y2);
        t[4 + m] = _mm512_shuffle_f32x4::<0x88>(y1, y3);
        t[8 + m] = _mm512_shuffle_f32x4::<0xDD>(y0, y2);
        t[12 + m] = _mm512_shuffle_f32x4::<0xDD>(y1, y3);
    }
    // `dot`'s lane sum starts from -0.0, which adds nothing: lane 0, then lanes 1 to 15 in order.
    let mut s = t[0];
    for ti in &t[1..] {
        s = _mm512_add_ps(s, *ti);
    }
    // SAFETY: `out` holds sixteen values.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), s) };
    true
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline exponential against the library's, and the gated activations of every tier against
    /// their definitions with the library's `exp` and `tanh`.
    #[test]
    fn exp_and_activations_match_the_library() {
        // Normal results only: below e^-87.3 the input is clamped.
        for i in -1995..=2000 {
            let x = i as f32 * 0.0437;
            let (got, want) = (exp(x), x.exp());
            assert!((got - want).abs() <= 4e-7 * want, "exp({x}) = {got}, not {want}");
        }
        assert!(exp(-1000.0) >= 0.0 && exp(-1000.0) < 1e-37 && exp(1000.0).is_finite());
        let xs: Vec<f32> = (-400..400).map(|i| i as f32 * 0.031).collect();
        let up: Vec<f32> = xs.iter().map(|x| 1.0 - x * 0.1).collect();
        for gelu in [false, true] {
            let want: Vec<f32> = xs
                .iter()
                .zip(&up)
                .map(|(&x, &u)| {
                    let a = match gelu {
                        true => {
                            0.5 * x * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                        }
                        false => x / (1.0 + (-x).exp()),
                    };
                    a * u
                })
                .collect();
            for tier in Tier::supported() {
                let mut g = xs.clone();
                match tier {
                    #[cfg(target_arch = "x86_64")]
                    Tier::Avx512 => unsafe { gated_avx512(&mut g, &up, gelu) },
                    #[cfg(target_arch = "x86_64")]
                    Tier::Avx2 | Tier::AvxVnni => unsafe { gated_avx2(&mut g, &up, gelu) },
                    _ => gated_generic(&mut g, &up, gelu),
                }
                for ((a, b), x) in g.iter().zip(&want).zip(&xs) {
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{tier:?} gelu {gelu} at {x}: {a} vs {b}");
                }
            }
        }
    }

    /// Heads attended in groups are bit for bit the heads attended one at a time, on every tier, for every
    /// group size and head sizes with and without a tail of single columns.
    #[test]
    fn grouped_heads_are_the_heads_one_at_a_time() {
        for d in [40, 64, 96, 136] {
            let len = 37;
            let val = |i: usize| ((i * 37 % 101) as f32 / 50.0) - 1.0;
            let k: Vec<f32> = (0..len * d).map(|i| val(i + 3)).collect();
            let v: Vec<f32> = (0..len * d).map(|i| val(i * 7 + 11)).collect();
            for n in 1..=MAX_GROUP {
                let q: Vec<f32> = (0..n * d).map(|i| val(i * 13 + 5) * 0.3).collect();
                for tier in Tier::supported() {
                    let mut grouped = vec![0f32; n * d];
                    group(tier, d, &q, &k, &v, &mut Vec::new(), &mut grouped);
                    for h in 0..n {
                        let mut one = vec![0f32; d];
                        head(tier, &q[h * d..(h + 1) * d], &k, &v, &mut Vec::new(), &mut one);
                        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&grouped[h * d..(h + 1) * d]),
                            bits(&one),
                            "{tier:?}, d {d}, {n} heads, head {h}"
                        );
                    }
                }
            }
        }
    }

    /// The tiers' compilations of one head agree with the portable one and with the definition.
    #[test]
    fn one_head_matches_the_definition_on_every_tier() {
        // Head sizes with 64-column blocks, 16-column blocks and a tail of single columns.
        for d in [40, 64, 96, 136] {
            let n = 7;
            let val = |i: usize| ((i * 37 % 101) as f32 / 50.0) - 1.0;
            let q: Vec<f32> = (0..d).map(val).collect();
            let k: Vec<f32> = (0..n * d).map(|i| val(i + 3)).collect();
            let v: Vec<f32> = (0..n * d).map(|i| val(i + 11)).collect();
            let s: Vec<f32> = k.chunks(d).map(|kj| kj.iter().zip(&q).map(|(a, b)| a * b).sum()).collect();
            let m = s.iter().copied().fold(f32::MIN, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let want: Vec<f32> =
                (0..d).map(|c| e.iter().enumerate().map(|(j, w)| w / z * v[j * d + c]).sum::<f32>()).collect();
            for tier in Tier::supported() {
                let mut out = vec![0f32; d];
                head(tier, &q, &k, &v, &mut Vec::new(), &mut out);
                for (c, (a, b)) in out.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() < 1e-5, "{tier:?}, d {d}, column {c}: {a} vs {b}");
                }
            }
        }
    }
}
