//! The x86-64 kernels on 256-bit registers (AVX2 + FMA + F16C, with AVX-VNNI or 256-bit AVX-512 VNNI byte
//! dot products), const-generic over the block type; chosen at run time by the tier in the parent module.

use std::arch::x86_64::*;

use super::groups::{WGroup, XGroup};
use super::{BlockType, Q8Block};

mod rows8;
mod tiles;
pub(super) use rows8::{lane_scales, pack_rows8, tile_rows8, transpose8};
pub(super) use tiles::unsigned_block as unsigned_sub_block;
pub(super) use tiles::{pack_weight_groups, put_blocks, put_super_scales, tile_groups, tile_groups_vnni};

// Type codes for the const-generic kernels (a `match` on them folds away).
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q8_0: u8 = 3;
pub(super) const Q4K: u8 = 4;
pub(super) const Q6K: u8 = 5;
pub(super) const Q5K: u8 = 6;

pub(super) fn code(t: BlockType) -> u8 {
    match t {
        BlockType::Q4_0 => Q4_0,
        BlockType::Q4_1 => Q4_1,
        BlockType::Q5_0 => Q5_0,
        BlockType::Q8_0 => Q8_0,
        BlockType::Q4K => Q4K,
        BlockType::Q5K => Q5K,
        BlockType::Q6K => Q6K,
    }
}

pub(super) const fn block_bytes(t: u8) -> usize {
    match t {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q4K => 144,
        Q5K => 176,
        Q6K => 210,
        _ => 34,
    }
}

#[inline(always)]
pub(super) unsafe fn f16(b: *const u8) -> f32 {
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

/// 0x10 in each byte of `qh` that has bit `mask` set, else 0 (Q5_K's fifth bit).
#[inline(always)]
unsafe fn bit_as_16(qh: __m256i, mask: i32) -> __m256i {
    let m = _mm256_set1_epi8(mask as i8);
    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), _mm256_set1_epi8(0x10))
}

/// Asks for the cache lines `lines × 64` bytes from `b`, one group of `R` rows further down; with `R` = 1,
/// [`AHEAD`] bytes further down. Short rows read `R` at a time are a pattern the hardware prefetchers do
/// not pick up: without this, decode waits on memory at well under half the bandwidth (measured: +50%
/// decode speed on Qwen 0.5B from these hints alone). Rows read one at a time are one sequential stream,
/// which the prefetchers follow, but not far enough ahead of a kernel this fast.
#[inline(always)]
pub(super) unsafe fn prefetch_next_rows<const R: usize>(b: *const u8, stride: usize, lines: usize) {
    let ahead = if R == 1 { AHEAD } else { R * stride };
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(ahead + 64 * l) as *const i8);
    }
}

/// How far ahead (bytes) a stream of rows read one at a time is prefetched: about 0.3 µs of work at
/// decode speed, a DRAM latency and more. Measured on Qwen 1.5B's decode, AVX-512, 2 threads, Zen 5
/// (tok/s): one row ahead (864–5040 bytes) 33.6–36, 2048 bytes 34.4–38.5, 4096 bytes 41.8–42.1, 6144
/// bytes 41.8, 8192 bytes 39.3–39.9, 12288 bytes 37.5–37.8. AVX2 there: 31.7 → 32.8–33.1.
const AHEAD: usize = 4096;

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// How a 256-bit byte dot product runs: AVX2's `maddubs` + `madd`, or AVX-VNNI's `vpdpbusd` (VEX).
pub(super) const MADDUBS: u8 = 0;
pub(super) const AVX_VNNI: u8 = 1;

/// `Σ u·s` over 32 lanes of unsigned × signed bytes, as 8 × i32: one VNNI instruction, or AVX2's
/// maddubs (pairs to i16, cannot overflow for |u| ≤ 128, |s| ≤ 127) + madd.
#[inline(always)]
unsafe fn dot_us<const V: u8>(u: __m256i, s: __m256i) -> __m256i {
    match V {
        AVX_VNNI => _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s),
        _ => _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
    }
}

/// `Σ u·qx` of one block as 8 × i32, where `u` are the block's weights as unsigned bytes, with the
/// block's scale and its per-block correction `c` such that `Σ w·x = d·d_x·Σ u·qx + c·d_x·Σ qx`:
/// the offset of Q4_0 (u − 8) and Q5_0 (u − 16) times `d`, or Q4_1's minimum. Keeping those weights
/// unsigned saves the subtraction and two sign instructions per block a signed product would need.
///
/// The scale comes as a whole register (all lanes `d`): converted from a 16-bit load into lane 0 alone,
/// the compiler inserts it (`vpinsrw`) into whatever register it picks for the unused lanes, which was the
/// accumulator, and each block then waited for the previous block's sum.
#[inline(always)]
unsafe fn block<const T: u8, const V: u8>(b: *const u8, qx: __m256i) -> (__m256i, __m256, f32) {
    let (u, w, d, c) = unpack::<T>(b);
    (product::<T, V>(u, w, qx), d, c)
}

/// A block's weights as [`block`] takes them: as unsigned bytes, the signed weights themselves (Q8_0,
/// whose signs move onto the activations; zero for the others), the scale register and the correction.
/// Apart from [`product`], so that a short batch unpacks a block once for all its tokens.
#[inline(always)]
unsafe fn unpack<const T: u8>(b: *const u8) -> (__m256i, __m256i, __m256, f32) {
    let none = _mm256_setzero_si256();
    match T {
        Q4_0 => {
            let d = f16x8(b);
            (nibbles(b.add(2)), none, d, -8.0 * _mm256_cvtss_f32(d))
        }
        Q4_1 => {
            let dm = f16_pair(b);
            (nibbles(b.add(4)), none, _mm256_broadcastss_ps(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)))
        }
        Q5_0 => {
            let d = f16x8(b);
            let qh = std::ptr::read_unaligned(b.add(2) as *const u32);
            (_mm256_or_si256(nibbles(b.add(6)), fifth_bits(qh)), none, d, -16.0 * _mm256_cvtss_f32(d))
        }
        _ => {
            // Signed weights: their sign moves onto the activations (`|w| · ±qx`). Measured faster than
            // offsetting them to unsigned (xor 0x80), which maddubs could not take anyway (255 × 127
            // pairs overflow i16).
            let w = _mm256_loadu_si256(b.add(2) as *const __m256i);
            (_mm256_sign_epi8(w, w), w, f16x8(b), 0.0)
        }
    }
}

/// `Σ u·qx` of a block [`unpack`]ed as `(u, w)`, as 8 × i32.
#[inline(always)]
unsafe fn product<const T: u8, const V: u8>(u: __m256i, w: __m256i, qx: __m256i) -> __m256i {
    match T {
        Q8_0 => dot_us::<V>(u, _mm256_sign_epi8(qx, w)),
        _ => dot_us::<V>(u, qx),
    }
}

/// The f16 at `b` in all 8 lanes: a whole-register broadcast, with no dependency on an older register.
#[inline(always)]
unsafe fn f16x8(b: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(b as *const i16)))
}

/// The two f16 at `b` (a block's `d` and its minimum) in lanes 0 and 1, converted together from one 32-bit
/// load, which writes the whole register (see [`f16x8`]).
#[inline(always)]
unsafe fn f16_pair(b: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(b as *const i32)))
}

/// Dot products of `R` weight rows (starting at `rows`, `stride` bytes apart) with `x`: the activation
/// block is loaded once for all rows, and the rows' accumulators are independent chains.
#[inline(always)]
unsafe fn rows_dot_impl<const T: u8, const R: usize, const V: u8>(
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
            prefetch_next_rows::<R>(rows.add(r * stride + i * bb), stride, 1);
            let (p, d, c) = block::<T, V>(rows.add(r * stride + i * bb), qx);
            add_block::<T>(&mut acc[r], &mut mins[r], p, d, c, xb.d, sx);
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]) + mins[r];
    }
    out
}

/// One block's share of a row's dot product with one token: its product `p` times the block's scale `d`
/// and the token's `xd` into `acc`, its correction `c` times the token's scaled sum `sx` into `min` (none
/// for Q8_0). The mat-vec and the short batch both add through it, so each token's sums are the same bits.
#[inline(always)]
unsafe fn add_block<const T: u8>(acc: &mut __m256, min: &mut f32, p: __m256i, d: __m256, c: f32, xd: f32, sx: f32) {
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(xd)), *acc);
    if T != Q8_0 {
        *min += c * sx;
    }
}

/// Q4_K / Q5_K: chunk `j` of a super-block's quants (at `b + qs`) as its two sub-blocks' values, low
/// nibbles and high nibbles, with the fifth bits from `qh` for Q5_K.
#[inline(always)]
unsafe fn k4_pair<const T: u8>(b: *const u8, qs: usize, qh: __m256i, j: usize, m4: __m256i) -> (__m256i, __m256i) {
    let v = _mm256_loadu_si256(b.add(qs + 32 * j) as *const __m256i);
    let mut lo = _mm256_and_si256(v, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if T == Q5K {
        lo = _mm256_or_si256(lo, bit_as_16(qh, 1 << (2 * j)));
        hi = _mm256_or_si256(hi, bit_as_16(qh, 2 << (2 * j)));
    }
    (lo, hi)
}

/// Q6_K: half `half` of a super-block (at `b`) as its four 32-element quarters, unsigned 0..63,
/// assembled from the `ql` nibbles and `qh` bit pairs.
#[inline(always)]
unsafe fn q6k_quarters(b: *const u8, half: usize, m4: __m256i, m2: __m256i) -> [__m256i; 4] {
    let ql0 = _mm256_loadu_si256(b.add(64 * half) as *const __m256i);
    let ql1 = _mm256_loadu_si256(b.add(64 * half + 32) as *const __m256i);
    let qh = _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i);
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
        ),
    ]
}

/// Q6_K: each half's 8 scales (from the 16 as 16-bit lanes), each one doubled into a 32-bit lane
/// (`scales[h]` lane `j`: scale `8h + j`), so that quarter `k` takes scale `2k` for its first 16 elements
/// and `2k + 1` for the next 16 with one 32-bit permute ([`q6k_scale`]).
#[inline(always)]
unsafe fn q6k_half_scales(sc16: __m256i) -> [__m256i; 2] {
    let (lo, hi) = (_mm256_unpacklo_epi16(sc16, sc16), _mm256_unpackhi_epi16(sc16, sc16));
    [_mm256_permute2x128_si256::<0x20>(lo, hi), _mm256_permute2x128_si256::<0x31>(lo, hi)]
}

/// Q6_K: quarter `k`'s scales from its half's ([`q6k_half_scales`]).
#[inline(always)]
unsafe fn q6k_scale(half_scales: __m256i, k: usize) -> __m256i {
    let (a, b) = (2 * k as i32, 2 * k as i32 + 1);
    _mm256_permutevar8x32_epi32(half_scales, _mm256_setr_epi32(a, a, a, a, b, b, b, b))
}

/// Dot products of `R` K-quant weight rows with `x`, whose 8 activation blocks per super-block share
/// one scale (see [`super::quantize_row_q8_for`]).
///
/// As in llama.cpp, each sub-block's 6- or 8-bit scale is applied in the integer domain: `maddubs`
/// gives pair sums of quant × activation as i16 and `madd` with the scale broadcast as i16 turns them
/// into i32, so a super-block costs one conversion and one FMA per row. Q4_K: each 32-byte chunk of
/// quants holds two sub-blocks (low nibbles, high nibbles) lined up with two activation blocks; its
/// minimums contribute `−dmin·d_x·Σ min·Σ qx`. Q6_K: four 32-element quarters per 128-element half,
/// assembled from `ql` nibbles and `qh` bit pairs as unsigned 0..63, each 16-element half with its own
/// scale; the offset 32 comes off at the end as `32·Σ scale·Σx`, one `madd` of the row's 16 scales with
/// the token's 16 sums of 16 activations (packed once per token, [`block_sums`]).
#[inline(always)]
unsafe fn rows_dot_k_impl<const T: u8, const R: usize>(
    rows: *const u8,
    stride: usize,
    x: &[Q8Block],
    bsums: &[[i16; 16]],
) -> [f32; R] {
    let bb = block_bytes(T);
    let mut acc = [_mm256_setzero_ps(); R];
    // Q4_K, Q5_K: `Σ dmin·d_x·min·Σ qx` over the super-blocks, in 4 lanes.
    let mut min_acc = [_mm_setzero_ps(); R];
    let m4 = _mm256_set1_epi8(0x0F);
    for (sb, xs) in x.chunks_exact(8).enumerate() {
        // Loops, not `array::from_fn`: a closure does not inherit the target features, so its intrinsics
        // would be calls.
        let mut qx = [_mm256_setzero_si256(); 8];
        for (q, x) in qx.iter_mut().zip(xs) {
            *q = _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i);
        }
        let dx = xs[0].d;
        if T == Q4K || T == Q5K {
            // The activation blocks' sums as 16-bit lanes, for the minimums' term, one `madd` a row.
            let bsums = _mm_loadu_si128(bsums[sb].as_ptr() as *const __m128i);
            let dx4 = _mm_set1_ps(dx);
            // Q5_K: the quants start after 32 bytes of fifth bits; bit `s` of `qh[l]` belongs to element
            // `l` of sub-block `s`.
            let qs = if T == Q5K { 48 } else { 16 };
            for r in 0..R {
                let b = rows.add(r * stride + sb * bb);
                prefetch_next_rows::<R>(b, stride, bb.div_ceil(64));
                // `d` and `dmin` times the activations' scale.
                let dd = _mm_mul_ps(f16_pair(b), dx4);
                // The 8 scales and minimums unpacked at once into 16-bit lanes; each sub-block's scale is
                // broadcast from them with one shuffle.
                let (scales, mins) = super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
                let sc = _mm256_broadcastsi128_si256(widen_bytes(scales));
                let qh = if T == Q5K { _mm256_loadu_si256(b.add(16) as *const __m256i) } else { m4 };
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let (lo, hi) = k4_pair::<T>(b, qs, qh, j, m4);
                    let s0 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(SCALE_PICK[2 * j]));
                    let s1 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(SCALE_PICK[2 * j + 1]));
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, qx[2 * j]), s0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, qx[2 * j + 1]), s1);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
                }
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcastss_ps(dd), acc[r]);
                let summ = _mm_madd_epi16(widen_bytes(mins), bsums);
                min_acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(summ), _mm_permute_ps::<0b0101_0101>(dd), min_acc[r]);
            }
        } else {
            // The activations' 16 sums of 16, for the offset 32: one `madd` with the row's scales.
            let hsums = _mm256_loadu_si256(bsums[sb].as_ptr() as *const __m256i);
            let m2 = _mm256_set1_epi8(0x30);
            for (r, acc) in acc.iter_mut().enumerate() {
                let b = rows.add(r * stride + sb * bb);
                prefetch_next_rows::<R>(b, stride, 4);
                // `d` converted as a whole register (see `block`), times the activations' scale.
                let d = _mm256_mul_ps(f16x8(b.add(208)), _mm256_set1_ps(dx));
                // `Σ scale·32·Σx` over the 16 scale groups, taken off the sums at the end.
                let off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i)), hsums);
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
                let mut sumi = _mm256_setzero_si256();
                for (half, half_scales) in q6k_half_scales(sc16).into_iter().enumerate() {
                    for (k, qk) in q6k_quarters(b, half, m4, m2).into_iter().enumerate() {
                        let p16 = _mm256_maddubs_epi16(qk, qx[4 * half + k]);
                        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, q6k_scale(half_scales, k)));
                    }
                }
                let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(off));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, *acc);
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let m = _mm_hadd_ps(min_acc[r], min_acc[r]);
        out[r] = hsum(acc[r]) - _mm_cvtss_f32(_mm_hadd_ps(m, m));
    }
    out
}

/// One K-quant weight row's dot products with `C` tokens (a short batch), each super-block unpacked
/// once for all of them. Every token's sums go through the same operations in the same order as
/// [`rows_dot_k_impl`]'s for that row and token, so each result is bit for bit the token's own mat-vec.
#[inline(always)]
unsafe fn row_tokens_k_impl<const T: u8, const C: usize>(
    row: *const u8,
    xs: &[&[Q8Block]; C],
    bsums: &[&[[i16; 16]]; C],
) -> [f32; C] {
    let bb = block_bytes(T);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut min_acc = [_mm_setzero_ps(); C];
    let m4 = _mm256_set1_epi8(0x0F);
    let supers = xs[0].len() / 8;
    for sb in 0..supers {
        let b = row.add(sb * bb);
        prefetch_next_rows::<1>(b, bb, bb.div_ceil(64));
        // A macro, not a closure: a closure does not inherit the target features.
        macro_rules! qx {
            ($c:expr, $i:expr) => {
                _mm256_loadu_si256(xs[$c][8 * sb + $i].qs.as_ptr() as *const __m256i)
            };
        }
        if T == Q4K || T == Q5K {
            let qs = if T == Q5K { 48 } else { 16 };
            let mut dd = [_mm_setzero_ps(); C];
            for c in 0..C {
                dd[c] = _mm_mul_ps(f16_pair(b), _mm_set1_ps(xs[c][8 * sb].d));
            }
            let (scales, mins) = super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
            let sc = _mm256_broadcastsi128_si256(widen_bytes(scales));
            let qh = if T == Q5K { _mm256_loadu_si256(b.add(16) as *const __m256i) } else { m4 };
            let mut sumi = [_mm256_setzero_si256(); C];
            for j in 0..4 {
                let (lo, hi) = k4_pair::<T>(b, qs, qh, j, m4);
                let s0 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(SCALE_PICK[2 * j]));
                let s1 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(SCALE_PICK[2 * j + 1]));
                for c in 0..C {
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, qx!(c, 2 * j)), s0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, qx!(c, 2 * j + 1)), s1);
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p0, p1));
                }
            }
            for c in 0..C {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_broadcastss_ps(dd[c]), acc[c]);
                let bs = _mm_loadu_si128(bsums[c][sb].as_ptr() as *const __m128i);
                let summ = _mm_madd_epi16(widen_bytes(mins), bs);
                min_acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(summ), _mm_permute_ps::<0b0101_0101>(dd[c]), min_acc[c]);
            }
        } else {
            let m2 = _mm256_set1_epi8(0x30);
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
            let mut sumi = [_mm256_setzero_si256(); C];
            for (half, half_scales) in q6k_half_scales(sc16).into_iter().enumerate() {
                for (k, qk) in q6k_quarters(b, half, m4, m2).into_iter().enumerate() {
                    let s = q6k_scale(half_scales, k);
                    for c in 0..C {
                        let p16 = _mm256_maddubs_epi16(qk, qx!(c, 4 * half + k));
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p16, s));
                    }
                }
            }
            for c in 0..C {
                let d = _mm256_mul_ps(f16x8(b.add(208)), _mm256_set1_ps(xs[c][8 * sb].d));
                let hsums = _mm256_loadu_si256(bsums[c][sb].as_ptr() as *const __m256i);
                let off = _mm256_madd_epi16(sc16, hsums);
                let s = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32::<5>(off));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[c]);
            }
        }
    }
    let mut out = [0f32; C];
    for c in 0..C {
        let m = _mm_hadd_ps(min_acc[c], min_acc[c]);
        out[c] = hsum(acc[c]) - _mm_cvtss_f32(_mm_hadd_ps(m, m));
    }
    out
}

/// [`row_tokens_k_impl`] with the tier's features.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_tokens_k<const T: u8, const C: usize>(
    row: *const u8,
    xs: &[&[Q8Block]; C],
    bsums: &[&[[i16; 16]]; C],
) -> [f32; C] {
    row_tokens_k_impl::<T, C>(row, xs, bsums)
}

/// One weight row of a 32-element type (Q4_0, Q4_1, Q5_0, Q8_0) dotted with `C` tokens (a short batch),
/// each block unpacked once for all of them. Every token's sums go through [`rows_dot_impl`]'s operations
/// for that row ([`add_block`]), in its order, so each result is bit for bit the token's own mat-vec.
#[inline(always)]
// Block `i` is taken from every token's activations: a range, not one slice's iterator.
#[allow(clippy::needless_range_loop)]
unsafe fn row_tokens_impl<const T: u8, const V: u8, const C: usize>(row: *const u8, xs: &[&[Q8Block]; C]) -> [f32; C] {
    let bb = block_bytes(T);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut mins = [0f32; C];
    let blocks = xs[0].len();
    for i in 0..blocks {
        let b = row.add(i * bb);
        prefetch_next_rows::<1>(b, bb, 1);
        let (u, w, d, c) = unpack::<T>(b);
        for k in 0..C {
            let xb = &xs[k][i];
            let qx = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
            let p = product::<T, V>(u, w, qx);
            add_block::<T>(&mut acc[k], &mut mins[k], p, d, c, xb.d, xb.d * xb.sum as f32);
        }
    }
    let mut out = [0f32; C];
    for k in 0..C {
        out[k] = hsum(acc[k]) + mins[k];
    }
    out
}

/// [`row_tokens_impl`] with AVX2's byte products.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_tokens<const T: u8, const C: usize>(row: *const u8, xs: &[&[Q8Block]; C]) -> [f32; C] {
    row_tokens_impl::<T, MADDUBS, C>(row, xs)
}

/// [`row_tokens_impl`] with AVX-VNNI's byte products.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn row_tokens_vnni<const T: u8, const C: usize>(row: *const u8, xs: &[&[Q8Block]; C]) -> [f32; C] {
    row_tokens_impl::<T, AVX_VNNI, C>(row, xs)
}

/// `pshufb` indices that broadcast 16-bit lane `k` of a 128-bit lane to all 8 of its lanes.
const SCALE_PICK: [i16; 8] = {
    let mut p = [0i16; 8];
    let mut k = 0;
    while k < 8 {
        p[k] = ((2 * k as i16 + 1) << 8) | (2 * k as i16);
        k += 1;
    }
    p
};

/// Eight bytes as eight 16-bit lanes.
#[inline(always)]
unsafe fn widen_bytes(v: [u8; 8]) -> __m128i {
    _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(v)))
}

/// Writes 32 floats `q[l]·s_l + c` for bytes `q` (unsigned, or signed when `SIGNED`), where `s_l` is
/// `s0` for elements 0..16 and `s1` for 16..32.
#[inline(always)]
unsafe fn store_affine<const SIGNED: bool>(q: __m256i, s0: f32, s1: f32, c: f32, out: *mut f32) {
    let mut bytes = [0u8; 32];
    _mm256_storeu_si256(bytes.as_mut_ptr() as *mut __m256i, q);
    let cv = _mm256_set1_ps(c);
    for g in 0..4 {
        let b8 = _mm_loadl_epi64(bytes.as_ptr().add(8 * g) as *const __m128i);
        let i = if SIGNED { _mm256_cvtepi8_epi32(b8) } else { _mm256_cvtepu8_epi32(b8) };
        let s = _mm256_set1_ps(if g < 2 { s0 } else { s1 });
        _mm256_storeu_ps(out.add(8 * g), _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, cv));
    }
}

/// Dequantizes `n` consecutive blocks of type `T` at `src` into `out` (`n · elements per block` floats).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_blocks<const T: u8>(src: *const u8, n: usize, out: *mut f32) {
    let bb = block_bytes(T);
    for i in 0..n {
        let b = src.add(i * bb);
        match T {
            Q4_0 | Q4_1 | Q5_0 => {
                let d = f16(b);
                let (q, c) = match T {
                    Q4_0 => (nibbles(b.add(2)), -8.0 * d),
                    Q4_1 => (nibbles(b.add(4)), f16(b.add(2))),
                    _ => (
                        _mm256_or_si256(
                            nibbles(b.add(6)),
                            fifth_bits(std::ptr::read_unaligned(b.add(2) as *const u32)),
                        ),
                        -16.0 * d,
                    ),
                };
                store_affine::<false>(q, d, d, c, out.add(32 * i));
            }
            Q8_0 => {
                let d = f16(b);
                store_affine::<true>(_mm256_loadu_si256(b.add(2) as *const __m256i), d, d, 0.0, out.add(32 * i));
            }
            Q4K | Q5K => {
                let (d, dmin) = (f16(b), f16(b.add(2)));
                let sc: &[u8; 12] = &*(b.add(4) as *const [u8; 12]);
                let m4 = _mm256_set1_epi8(0x0F);
                let qs = if T == Q5K { 48 } else { 16 };
                let qh = if T == Q5K { _mm256_loadu_si256(b.add(16) as *const __m256i) } else { m4 };
                for j in 0..4 {
                    let v = _mm256_loadu_si256(b.add(qs + 32 * j) as *const __m256i);
                    let (s0, n0) = super::q4k_scale_min(2 * j, sc);
                    let (s1, n1) = super::q4k_scale_min(2 * j + 1, sc);
                    let o = out.add(256 * i + 64 * j);
                    let (f0, f1) = (d * s0 as f32, d * s1 as f32);
                    let mut lo = _mm256_and_si256(v, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if T == Q5K {
                        lo = _mm256_or_si256(lo, bit_as_16(qh, 1 << (2 * j)));
                        hi = _mm256_or_si256(hi, bit_as_16(qh, 2 << (2 * j)));
                    }
                    store_affine::<false>(lo, f0, f0, -dmin * n0 as f32, o);
                    store_affine::<false>(hi, f1, f1, -dmin * n1 as f32, o.add(32));
                }
            }
            _ => {
                // Q6_K: the quarters as in `rows_dot_k_impl`, minus the offset 32 in the float domain.
                let d = f16(b.add(208));
                let sc = b.add(192) as *const i8;
                let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
                for half in 0..2 {
                    let q = q6k_quarters(b, half, m4, m2);
                    for (k, qk) in q.iter().enumerate() {
                        let blk = 4 * half + k;
                        let (s0, s1) = (d * *sc.add(2 * blk) as f32, d * *sc.add(2 * blk + 1) as f32);
                        // (q − 32)·s = q·s − 32·s, with a different s per 16-element half.
                        let o = out.add(256 * i + 32 * blk);
                        store_affine::<false>(*qk, s0, s1, 0.0, o);
                        for l in 0..32 {
                            *o.add(l) -= 32.0 * if l < 16 { s0 } else { s1 };
                        }
                    }
                }
            }
        }
    }
}

/// [`dequantize_blocks`] for a block type known at run time.
pub(super) unsafe fn dequantize_blocks_of(t: BlockType, src: *const u8, n: usize, out: *mut f32) {
    match code(t) {
        Q4_0 => dequantize_blocks::<Q4_0>(src, n, out),
        Q4_1 => dequantize_blocks::<Q4_1>(src, n, out),
        Q5_0 => dequantize_blocks::<Q5_0>(src, n, out),
        Q8_0 => dequantize_blocks::<Q8_0>(src, n, out),
        Q4K => dequantize_blocks::<Q4K>(src, n, out),
        Q5K => dequantize_blocks::<Q5K>(src, n, out),
        _ => dequantize_blocks::<Q6K>(src, n, out),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_dot_k<const T: u8, const R: usize>(
    rows: *const u8,
    stride: usize,
    x: &[Q8Block],
    bsums: &[[i16; 16]],
) -> [f32; R] {
    rows_dot_k_impl::<T, R>(rows, stride, x, bsums)
}

/// Each super-block's activation sums as i16, packed once per token, not once per row: for Q4_K and
/// Q5_K the 8 block sums (lanes 0..8; a block of 32 bytes sums to at most 4096 in magnitude), which the
/// kernels multiply with the rows' minimums; for Q6_K the 16 sums of 16, which they multiply with the
/// rows' scales for the offset 32.
pub(crate) fn block_sums(t: u8, x: &[Q8Block], out: &mut Vec<[i16; 16]>) {
    out.clear();
    out.extend(x.chunks_exact(8).map(|xs| {
        std::array::from_fn(|i| match t {
            Q6K => xs[i / 2].qs[16 * (i % 2)..16 * (i % 2) + 16].iter().map(|&q| q as i16).sum(),
            _ if i < 8 => xs[i].sum as i16,
            _ => 0,
        })
    }));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_dot<const T: u8, const R: usize>(rows: *const u8, stride: usize, x: &[Q8Block]) -> [f32; R] {
    rows_dot_impl::<T, R, MADDUBS>(rows, stride, x)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn rows_dot_vnni<const T: u8, const R: usize>(
    rows: *const u8,
    stride: usize,
    x: &[Q8Block],
) -> [f32; R] {
    rows_dot_impl::<T, R, AVX_VNNI>(rows, stride, x)
}

/// [`super::quantize_groups`]: the same scale, products and rounding (ties to even), 8 lanes at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_groups(x: &[f32], out: &mut [Q8Block], group: usize) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for (xg, bg) in x.chunks_exact(group * 32).zip(out.chunks_exact_mut(group)) {
        let mut m = _mm256_setzero_ps();
        for v in xg.chunks_exact(8) {
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v.as_ptr()), abs));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        for (xb, b) in xg.chunks_exact(32).zip(bg.iter_mut()) {
            let p = xb.as_ptr();
            let q: [__m256i; 4] = [
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), inv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(8)), inv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(16)), inv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(24)), inv)),
            ];
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01));
            // Packing works within 128-bit lanes: the permute puts the four 8-element runs back in order.
            let w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, w);
            b.d = d;
            b.sum = _mm_cvtsi128_si32(s1);
        }
    }
}
