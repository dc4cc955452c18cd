//! The AVX-512 kernels (F + BW + VL + VNNI), for CPUs such as AMD Zen 4/5 and Intel Xeons before AMX.
//!
//! Decode multiplies `R` weight rows at a time with one activation row, and a short batch ([`rows_run`])
//! one row at a time with up to 4 tokens' rows; a 512-bit register holds two 32-element blocks (or two
//! K-quant sub-blocks):
//! - 32-element block types: `vpdpbusd` of the unsigned weights with the 8-bit activations gives 8 partial
//!   sums per block, converted to f32 and scaled by `d_w·d_x` per lane; the types' offsets and minimums
//!   (`Σ w·x = d_w·d_x·Σ u·qx + c·d_x·Σ qx`) are one more FMA per pair of blocks. Q8_0's signed weights
//!   are made unsigned by flipping their top bit (`u = w + 128`, `c = −128·d_w`).
//! - K-quants: `vpmaddubsw` gives pair sums as i16 and `vpdpwssd` multiplies them by the sub-block scales
//!   and accumulates in i32, so a 256-element super-block costs one conversion to f32 per row. The
//!   minimums (Q4_K, Q5_K) and Q6_K's offset 32 are one `vpmaddwd` of the row's 16 scale or minimum values
//!   with the token's 16 sums of 16 activations. The activations are first packed ([`XSuper`]) in the
//!   order the weights unpack in.
//!
//! The batched product ([`super::matmul`]) packs weights and tokens into interleaved groups of 8 blocks
//! ([`WGroup`], [`XGroup`]) and runs tiles of rows × tokens over them ([`tile_groups`]).

use std::arch::x86_64::*;

use super::avx2::{block_bytes, f16, prefetch_next_rows, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q6K, Q8_0};
use super::groups::{WGroup, XGroup, GROUP};
use super::Q8Block;

mod rows16;
pub(super) use rows16::{pack_rows16, tile_rows16};

/// A K-quant super-block of one token's activations, packed for these kernels: the 8 activation blocks as
/// four 64-byte pairs in the order the weights unpack in (Q4_K, Q5_K: blocks 0+2, 1+3, 4+6, 5+7; Q6_K:
/// 0+1, 2+3, 4+5, 6+7), the sums of each 16 activations, and the super-block's scale.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct XSuper {
    qs: [[i8; 64]; 4],
    bsum: [i16; 16],
    d: f32,
}

impl XSuper {
    const ZERO: XSuper = XSuper { qs: [[0; 64]; 4], bsum: [0; 16], d: 0.0 };
}

/// Two 32-element activation blocks packed for the 32-element block kernels ([`rows_dot_impl`]): their
/// quants, the start of a row's sums (`−o·Σ q_x` per 4-element group, `o` the weight type's offset), each
/// lane's activation scale, and for Q4_1 each block's `d·Σ q_x` (lanes 0 and 8). Everything a pair costs
/// apart from the weights is done once per token, not once per row.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct XPair {
    qx: [i8; 64],
    start: [i32; 16],
    dx: [f32; 16],
    sx: [f32; 16],
}

/// Packs a row of 32-element activation blocks, two at a time (the last alone when their count is odd),
/// for weights of type `t`.
pub(crate) fn pack_pairs(t: u8, x: &[Q8Block], out: &mut Vec<XPair>) {
    let offset = offset(t);
    out.clear();
    for pair in x.chunks(2) {
        let mut p = XPair { qx: [0; 64], start: [0; 16], dx: [0.0; 16], sx: [0.0; 16] };
        for (k, b) in pair.iter().enumerate() {
            p.qx[32 * k..32 * k + 32].copy_from_slice(&b.qs);
            for l in 0..8 {
                let group: i32 = b.qs[4 * l..4 * l + 4].iter().map(|&q| q as i32).sum();
                p.start[8 * k + l] = -offset * group;
                p.dx[8 * k + l] = b.d;
            }
            p.sx[8 * k] = b.d * b.sum as f32;
        }
        out.push(p);
    }
}

/// Packs a row of K-quant activations (8 blocks per super-block, one scale per super-block, as
/// [`super::quantize_row_q8_for`] makes them) for weights of type `t`.
pub(crate) fn pack_supers(t: u8, x: &[Q8Block], out: &mut Vec<XSuper>) {
    let order: [usize; 8] = if t == Q6K { [0, 1, 2, 3, 4, 5, 6, 7] } else { [0, 2, 1, 3, 4, 6, 5, 7] };
    out.clear();
    for xs in x.chunks_exact(8) {
        let mut p = XSuper::ZERO;
        for (j, pair) in p.qs.iter_mut().enumerate() {
            pair[..32].copy_from_slice(&xs[order[2 * j]].qs);
            pair[32..].copy_from_slice(&xs[order[2 * j + 1]].qs);
        }
        for (i, s) in p.bsum.iter_mut().enumerate() {
            *s = xs[i / 2].qs[16 * (i % 2)..16 * (i % 2) + 16].iter().map(|&v| v as i16).sum();
        }
        p.d = xs[0].d;
        out.push(p);
    }
}

/// [`unpack_pair`] for any 32-element type, Q8_0 included (made unsigned: +128), with each block's scale
/// `d` and correction `c` (the weight is `d·u + c`), as the batched product's packing wants them.
#[inline(always)]
unsafe fn unpack_pair_scaled<const T: u8>(b: *const u8, single: bool) -> (__m512i, [f32; 2], [f32; 2]) {
    let b1 = b.add(block_bytes(T));
    let d = [f16(b), if single { 0.0 } else { f16(b1) }];
    let c = match T {
        Q4_1 => [f16(b.add(2)), if single { 0.0 } else { f16(b1.add(2)) }],
        _ => [-(offset(T) as f32) * d[0], -(offset(T) as f32) * d[1]],
    };
    (unpack_pair::<T>(b, single), d, c)
}

/// Two blocks' weights as unsigned bytes (block 0's 32 elements, then block 1's); when `single`, only
/// block 0 is read and block 1 is all zero. Q8_0's signed weights are made unsigned (+128).
#[inline(always)]
unsafe fn unpack_pair<const T: u8>(b: *const u8, single: bool) -> __m512i {
    let b1 = b.add(block_bytes(T));
    if T == Q8_0 {
        let lo = _mm256_loadu_si256(b.add(2) as *const __m256i);
        let hi = if single { _mm256_setzero_si256() } else { _mm256_loadu_si256(b1.add(2) as *const __m256i) };
        let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        return _mm512_xor_si512(w, _mm512_set1_epi8(-128));
    }
    let at = match T {
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 2,
    };
    let lo = _mm_loadu_si128(b.add(at) as *const __m128i);
    let hi = if single { _mm_setzero_si128() } else { _mm_loadu_si128(b1.add(at) as *const __m128i) };
    // [q0, q1] → [q0, q0, q1, q1] per 128-bit lane, then the odd lanes shifted right by 4: low nibbles
    // (elements 0..16) and high nibbles (16..32) of each block.
    let y = _mm512_castsi256_si512(_mm256_set_m128i(hi, lo));
    let z = _mm512_shuffle_i64x2::<0b01_01_00_00>(y, y);
    let shifts = _mm512_set_epi64(W4, W4, 0, 0, W4, W4, 0, 0);
    let mut u = _mm512_and_si512(_mm512_srlv_epi16(z, shifts), _mm512_set1_epi8(0x0F));
    if T == Q5_0 {
        // The fifth bits: bit i of a block's `qh` belongs to its element i.
        let h0 = std::ptr::read_unaligned(b.add(2) as *const u32) as u64;
        let h1 = if single { 0 } else { std::ptr::read_unaligned(b1.add(2) as *const u32) as u64 };
        u = _mm512_mask_add_epi8(u, h0 | (h1 << 32), u, _mm512_set1_epi8(16));
    }
    u
}

/// The lanes of each accumulator added up.
#[inline(always)]
unsafe fn sums<const R: usize, const C: usize>(acc: &[[__m512; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    out
}

/// Shift counts of 2 and 4 in every 16-bit lane of a 64-bit lane.
const W2: i64 = 0x0002_0002_0002_0002;
const W4: i64 = 0x0004_0004_0004_0004;

/// The scales of two blocks (`b`, and `b1` unless `single`) as `[d0; 8] ++ [d1; 8]`: both converted in
/// one instruction and spread by one permute.
#[inline(always)]
unsafe fn pair_scales(b: *const u8, b1: *const u8, single: bool) -> __m512 {
    let d0 = _mm_cvtsi32_si128(std::ptr::read_unaligned(b as *const u16) as i32);
    let d = if single { d0 } else { _mm_insert_epi16::<1>(d0, std::ptr::read_unaligned(b1 as *const u16) as i32) };
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(d)))
}

/// Dot products of `R` rows of a 32-element block type (`stride` bytes apart, `blocks` blocks each) with
/// `C` tokens' packed activation rows (`xstride` pairs apart), as unreduced accumulators; each unpacked
/// pair of weight blocks serves every token.
///
/// Q4_0, Q5_0 and Q8_0 weights are `d·(q − o)` with unsigned `q` and a fixed offset `o` (8, 16; Q8_0's
/// signed bytes made unsigned by +128, `o` = 128): per block the
/// product is `d·d_x·(Σ q·q_x − o·Σ q_x)`, and `o·q_x` summed as `vpdpbusd` sums it (packed once per
/// token, [`XPair`]) starts each row's accumulation negated, so a pair costs one `vpdpbusd`, one
/// conversion and one FMA per row and token. Q4_1's minimum (`d·q + m`) adds `m·d_x·Σ q_x` per
/// block with a second FMA.
#[inline(always)]
unsafe fn rows_dot_impl<const T: u8, const R: usize, const C: usize>(
    w: *const u8,
    stride: usize,
    x: *const XPair,
    xstride: usize,
    blocks: usize,
) -> [[__m512; C]; R] {
    let bb = block_bytes(T);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut i = 0;
    while i < blocks {
        let single = i + 1 == blocks;
        for (r, acc) in acc.iter_mut().enumerate() {
            let b = w.add(r * stride + i * bb);
            prefetch_next_rows::<R>(b, stride, (2 * bb).div_ceil(64));
            let u = unpack_pair::<T>(b, single);
            let d = pair_scales(b, b.add(bb), single);
            let m = if T == Q4_1 { pair_scales(b.add(2), b.add(bb + 2), single) } else { d };
            // Each token's pair: with one token (decode) its loads are shared by the `R` rows; with
            // several (a short batch) the unpacked weights are shared by the `C` tokens.
            for (c, acc) in acc.iter_mut().enumerate() {
                let xp = &*x.add(c * xstride + i / 2);
                let qx = _mm512_load_si512(xp.qx.as_ptr() as *const __m512i);
                let start = _mm512_load_si512(xp.start.as_ptr() as *const __m512i);
                let dx = _mm512_load_ps(xp.dx.as_ptr());
                let p = _mm512_dpbusd_epi32(start, u, qx);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, dx), *acc);
                if T == Q4_1 {
                    *acc = _mm512_fmadd_ps(m, _mm512_load_ps(xp.sx.as_ptr()), *acc);
                }
            }
        }
        i += 2;
    }
    acc
}

/// One K-quant super-block's weights: four 64-byte pairs of sub-blocks as unsigned bytes (in [`XSuper`]'s
/// order), the i16 scale of each of their 16-bit lanes, the 16 values that multiply the token's 16-element
/// sums (Q4_K/Q5_K: each minimum twice; Q6_K: the scales) with their factor, and the scale `d`.
#[inline(always)]
unsafe fn unpack_super<const T: u8>(b: *const u8) -> ([__m512i; 4], [__m512i; 4], __m256i, __m512, __m512) {
    let m4 = _mm512_set1_epi8(0x0F);
    if T == Q6K {
        let d = f16_splat(b.add(208));
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
        let scz = _mm512_castsi256_si512(sc);
        // Pair j covers scales 4j .. 4j+4, 8 lanes each. (Loops, not closures: a closure would not inherit
        // the caller's target features, and each intrinsic would become a call.)
        let mut s = [_mm512_setzero_si512(); 4];
        for (j, s) in s.iter_mut().enumerate() {
            let j = j as i16 * 4;
            let idx = _mm512_set_epi16(
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j,
                j,
                j,
                j,
                j,
                j,
                j,
                j,
            );
            *s = _mm512_permutexvar_epi16(idx, scz);
        }
        let m30 = _mm512_set1_epi8(0x30);
        let mut u = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // ql of quarters 0|1 (low nibbles) and 2|3 (high nibbles); qh's bit pairs 0,1|2,3 and 4,5|6,7.
            let l = _mm512_loadu_si512(b.add(64 * h) as *const __m512i);
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i));
            let up = _mm512_sllv_epi16(qh, _mm512_set_epi64(W2, W2, W2, W2, W4, W4, W4, W4));
            let down = _mm512_srlv_epi16(qh, _mm512_set_epi64(W2, W2, W2, W2, 0, 0, 0, 0));
            u[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(up, m30));
            u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(down, m30));
        }
        return (u, s, sc, d, _mm512_mul_ps(d, _mm512_set1_ps(-32.0)));
    }
    let (d, dmin) = (f16_splat(b), f16_splat(b.add(2)));
    let (sc, mn) = super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
    let scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(sc))));
    // Pairs 0+2, 1+3, 4+6, 5+7: 16 lanes each.
    let mut s = [_mm512_setzero_si512(); 4];
    for (j, s) in s.iter_mut().enumerate() {
        let a = [0i16, 1, 4, 5][j];
        let b = a + 2;
        let idx = _mm512_set_epi16(
            b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a,
        );
        *s = _mm512_permutexvar_epi16(idx, scz);
    }
    let mv = _mm_cvtsi64_si128(i64::from_le_bytes(mn));
    let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    let qs = if T == Q5K { 48 } else { 16 };
    let a = _mm512_loadu_si512(b.add(qs) as *const __m512i);
    let c = _mm512_loadu_si512(b.add(qs + 64) as *const __m512i);
    let mut u = [
        _mm512_and_si512(a, m4),
        _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
        _mm512_and_si512(c, m4),
        _mm512_and_si512(_mm512_srli_epi16(c, 4), m4),
    ];
    if T == Q5K {
        // Bit s of qh[l] is the fifth bit of element l of sub-block s.
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
        for (j, u) in u.iter_mut().enumerate() {
            let (lo, hi) = ([0, 1, 4, 5][j], [2, 3, 6, 7][j]);
            let bit = _mm512_mask_blend_epi8(
                0xFFFF_FFFF_0000_0000,
                _mm512_set1_epi8((1u8 << lo) as i8),
                _mm512_set1_epi8((1u8 << hi) as i8),
            );
            *u = _mm512_mask_add_epi8(*u, _mm512_test_epi8_mask(qh, bit), *u, _mm512_set1_epi8(16));
        }
    }
    (u, s, mins, d, _mm512_sub_ps(_mm512_setzero_ps(), dmin))
}

/// The f16 at `b` in every lane. A whole-register broadcast: a scalar conversion (`f16`) of a 16-bit load
/// compiles to `vpinsrw` into whatever register the compiler picks, which made each super-block wait for
/// the previous one's accumulator (a false dependency through the unused lanes).
#[inline(always)]
unsafe fn f16_splat(b: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(std::ptr::read_unaligned(b as *const i16)))
}

/// Dot products of `R` K-quant rows with `C` packed activation rows (`xstride` super-blocks apart,
/// `supers` super-blocks each): each super-block of weights is unpacked once for all the tokens.
#[inline(always)]
unsafe fn rows_dot_k_impl<const T: u8, const R: usize, const C: usize>(
    w: *const u8,
    stride: usize,
    x: *const XSuper,
    xstride: usize,
    supers: usize,
) -> [[__m512; C]; R] {
    let bb = block_bytes(T);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for sb in 0..supers {
        for (r, acc) in acc.iter_mut().enumerate() {
            let b = w.add(r * stride + sb * bb);
            prefetch_next_rows::<R>(b, stride, bb.div_ceil(64));
            let (u, s, m, d, dm) = unpack_super::<T>(b);
            for (c, acc) in acc.iter_mut().enumerate() {
                let xp = &*x.add(c * xstride + sb);
                // Two chains of two, not one of four: `vpdpwssd`'s latency would otherwise bound the loop.
                let mut q = [_mm512_setzero_si512(); 4];
                for (q, x) in q.iter_mut().zip(&xp.qs) {
                    *q = _mm512_loadu_si512(x.as_ptr() as *const __m512i);
                }
                let s0 = _mm512_madd_epi16(_mm512_maddubs_epi16(u[0], q[0]), s[0]);
                let s1 = _mm512_madd_epi16(_mm512_maddubs_epi16(u[1], q[1]), s[1]);
                let s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(u[2], q[2]), s[2]);
                let s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(u[3], q[3]), s[3]);
                let sumi = _mm512_add_epi32(s0, s1);
                let mm = _mm256_madd_epi16(m, _mm256_loadu_si256(xp.bsum.as_ptr() as *const __m256i));
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), d);
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mm)), dm, v);
                *acc = _mm512_fmadd_ps(v, _mm512_set1_ps(xp.d), *acc);
            }
        }
    }
    acc
}

/// [`rows_dot_impl`]: `R` rows of a 32-element block type with a quantized activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_dot<const T: u8, const R: usize>(
    w: *const u8,
    stride: usize,
    x: *const XPair,
    blocks: usize,
) -> [f32; R] {
    sums(&rows_dot_impl::<T, R, 1>(w, stride, x, 0, blocks)).map(|r| r[0])
}

/// [`rows_dot_k_impl`]: `R` K-quant rows with a packed activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_dot_k<const T: u8, const R: usize>(
    w: *const u8,
    stride: usize,
    x: *const XSuper,
    supers: usize,
) -> [f32; R] {
    sums(&rows_dot_k_impl::<T, R, 1>(w, stride, x, 0, supers)).map(|r| r[0])
}

/// Four rows of type `T` (`stride` bytes apart) with `C` tokens' activations (as [`rows_run`] takes them):
/// `y[c·ystride + r]`, each token's four sums reduced as [`rows_dot`] and [`rows_dot_k`] reduce them, so a
/// token's results are bit for bit those of its own mat-vec where that takes rows four at a time.
///
/// # Safety
/// As [`rows_run`], for four rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows4_tokens<const T: u8, const C: usize>(
    w: *const u8,
    stride: usize,
    xp: *const XPair,
    xs: *const XSuper,
    xstride: usize,
    blocks: usize,
    y: *mut f32,
    ystride: usize,
) {
    let s = match T {
        Q4K | Q5K | Q6K => sums(&rows_dot_k_impl::<T, 4, C>(w, stride, xs, xstride, blocks / 8)),
        _ => sums(&rows_dot_impl::<T, 4, C>(w, stride, xp, xstride, blocks)),
    };
    for (r, row) in s.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            *y.add(c * ystride + r) = v;
        }
    }
}

/// Dot products of `rows` consecutive rows of type `T` (`row_bytes` apart, `blocks` 32-element blocks each)
/// with `C` tokens' activations (packed [`XPair`]s for the 32-element types, [`XSuper`]s for the K-quants,
/// `xstride` apart): `y[c·ystride + r]`. One row at a time, a sequential stream, each unpacked block serving
/// every token; the sums of four rows are reduced together.
///
/// # Safety
/// The CPU has these kernels' features; the rows, the `C` packed activation rows of `T`'s packing and the
/// outputs lie inside their buffers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_run<const T: u8, const C: usize>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    xp: *const XPair,
    xs: *const XSuper,
    xstride: usize,
    blocks: usize,
    y: *mut f32,
    ystride: usize,
) {
    let mut r = 0;
    while r < rows {
        let q = (rows - r).min(4);
        let mut acc = [[_mm512_setzero_ps(); 4]; C];
        for i in 0..q {
            let row = w.add((r + i) * row_bytes);
            let a = match T {
                Q4K | Q5K | Q6K => rows_dot_k_impl::<T, 1, C>(row, row_bytes, xs, xstride, blocks / 8)[0],
                _ => rows_dot_impl::<T, 1, C>(row, row_bytes, xp, xstride, blocks)[0],
            };
            for (acc, a) in acc.iter_mut().zip(a) {
                acc[i] = a;
            }
        }
        for (c, acc) in acc.iter().enumerate() {
            let mut v = [0f32; 4];
            _mm_storeu_ps(v.as_mut_ptr(), reduce4(acc));
            std::ptr::copy_nonoverlapping(v.as_ptr(), y.add(c * ystride + r), q);
        }
        r += q;
    }
}

/// The lane sums of four accumulators, as the four lanes of one vector.
#[inline(always)]
unsafe fn reduce4(a: &[__m512; 4]) -> __m128 {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d; then [a, b, c, d] partial
    // sums in each 128-bit lane, and the four lanes added.
    let ab = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    let cd = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    let abcd = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(ab, cd), _mm512_shuffle_ps::<0b11_10_11_10>(ab, cd));
    let h = _mm256_add_ps(
        _mm512_castps512_ps256(abcd),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(abcd))),
    );
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
}

/// Whether this CPU runs these kernels.
pub(super) fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The block types' offsets (`w = d·(u − offset)`); Q4_1, Q4_K and Q5_K have minimums instead.
fn offset(t: u8) -> i32 {
    match t {
        Q8_0 => 128,
        Q5_0 => 16,
        Q6K => 32,
        Q4_1 | Q4K | Q5K => 0,
        _ => 8,
    }
}

/// Packs one token's activation row (`blocks` blocks) into `out` (`blocks.div_ceil(GROUP)` groups).
pub(crate) fn pack_groups(t: u8, x: &[Q8Block], out: &mut [XGroup]) {
    let o = offset(t);
    for (xs, g) in x.chunks(GROUP).zip(out.iter_mut()) {
        *g = XGroup::ZERO;
        for (b, xb) in xs.iter().enumerate() {
            for h in 0..2 {
                let l = 2 * b + h;
                for j in 0..4 {
                    let e = 16 * h + 4 * j;
                    g.q[j][l] = i32::from_le_bytes([
                        xb.qs[e] as u8,
                        xb.qs[e + 1] as u8,
                        xb.qs[e + 2] as u8,
                        xb.qs[e + 3] as u8,
                    ]);
                }
                g.init[l] = -o * xb.qs[16 * h..16 * h + 16].iter().map(|&v| v as i32).sum::<i32>();
                g.d[l] = xb.d;
            }
            g.s[2 * b] = xb.d * xb.sum as f32;
        }
    }
}

/// Packs rows `rows` of a matrix of type `T` (`row_bytes` apart, `blocks` blocks each) into `out`,
/// `blocks.div_ceil(GROUP)` groups per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_weight_groups_impl<const T: u8>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<WGroup>,
) {
    let bb = block_bytes(T);
    let groups = blocks.div_ceil(GROUP);
    out.clear();
    out.resize(rows * groups, WGroup::ZERO);
    for r in 0..rows {
        let row = w.add(r * row_bytes);
        for gi in 0..groups {
            let g = &mut out[r * groups + gi];
            let mut u = [_mm256_setzero_si256(); GROUP];
            for i in (GROUP * gi..blocks.min(GROUP * (gi + 1))).step_by(2) {
                let single = i + 1 == blocks;
                let (pair, d, c) = unpack_pair_scaled::<T>(row.add(i * bb), single);
                let k = i % GROUP;
                u[k] = _mm512_castsi512_si256(pair);
                // A lone last block leaves its partner zero (Q8_0's unpacking would make it 128s).
                u[k + 1] = if single { _mm256_setzero_si256() } else { _mm512_extracti64x4_epi64::<1>(pair) };
                for h in 0..2 {
                    g.d[2 * (k + h)..2 * (k + h) + 2].fill(d[h]);
                    g.c[2 * (k + h)..2 * (k + h) + 2].fill(c[h]);
                }
            }
            super::avx2::put_blocks(&u, g);
        }
    }
}

/// Packs rows of K-quant super-blocks like [`pack_weight_groups_impl`], one group per super-block: each
/// 32-element sub-block becomes a block with a float scale (`d·scale`) and, for Q4_K and Q5_K, a float
/// minimum (`−dmin·min`); Q6_K's 16-element scales fill the two lanes of a block separately.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_weight_supers_impl<const T: u8>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    supers: usize,
    out: &mut Vec<WGroup>,
) {
    let bb = block_bytes(T);
    out.clear();
    out.resize(rows * supers, WGroup::ZERO);
    let order: [usize; 8] = if T == Q6K { [0, 1, 2, 3, 4, 5, 6, 7] } else { [0, 2, 1, 3, 4, 6, 5, 7] };
    for r in 0..rows {
        for sb in 0..supers {
            let b = w.add(r * row_bytes + sb * bb);
            let (u, ..) = unpack_super::<T>(b);
            // Each 512-bit vector holds two sub-blocks, `order[2j]` and `order[2j + 1]`.
            let mut blocks = [_mm256_setzero_si256(); 8];
            for (j, u) in u.iter().enumerate() {
                blocks[order[2 * j]] = _mm512_castsi512_si256(*u);
                blocks[order[2 * j + 1]] = _mm512_extracti64x4_epi64::<1>(*u);
            }
            let g = &mut out[r * supers + sb];
            super::avx2::put_blocks(&blocks, g);
            super::avx2::put_super_scales::<T>(b, g);
        }
    }
}

/// Packs rows like [`pack_weight_groups`] in portable code (each 32-element block or K-quant sub-block
/// unpacked by [`super::unsigned_block`]): the reference the SIMD packers are tested against.
#[cfg(test)]
pub(crate) fn pack_weight_groups_portable(
    t: super::BlockType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<WGroup>,
) {
    let groups = blocks.div_ceil(GROUP);
    out.clear();
    out.resize(rows * groups, WGroup::ZERO);
    for r in 0..rows {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for i in 0..blocks {
            let (u, d, c) = super::unsigned_block(t, row, i);
            let words: Vec<u32> = u.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
            out[r * groups + i / GROUP].set_block(i % GROUP, &words, d, c);
        }
    }
}

/// [`pack_weight_groups_impl`] (or, for the K-quants, [`pack_weight_supers_impl`]) for a type code known
/// at run time.
///
/// # Safety
/// The CPU has the AVX-512 tier, and `rows` rows of `row_bytes` bytes (`blocks` blocks) lie at `w`.
pub(crate) unsafe fn pack_weight_groups(
    t: u8,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<WGroup>,
) {
    match t {
        Q4_1 => pack_weight_groups_impl::<Q4_1>(w, row_bytes, rows, blocks, out),
        Q5_0 => pack_weight_groups_impl::<Q5_0>(w, row_bytes, rows, blocks, out),
        Q8_0 => pack_weight_groups_impl::<Q8_0>(w, row_bytes, rows, blocks, out),
        Q4K => pack_weight_supers_impl::<Q4K>(w, row_bytes, rows, blocks / GROUP, out),
        Q5K => pack_weight_supers_impl::<Q5K>(w, row_bytes, rows, blocks / GROUP, out),
        Q6K => pack_weight_supers_impl::<Q6K>(w, row_bytes, rows, blocks / GROUP, out),
        _ => pack_weight_groups_impl::<Q4_0>(w, row_bytes, rows, blocks, out),
    }
}

/// `R × C` dot products of packed weight rows (`w_stride` groups apart) with packed tokens (`x_stride`
/// groups apart), `groups` groups long; `MIN` adds Q4_1's minimums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn tile_groups<const MIN: bool, const R: usize, const C: usize>(
    w: *const WGroup,
    w_stride: usize,
    x: *const XGroup,
    x_stride: usize,
    groups: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for g in 0..groups {
        for (r, acc) in acc.iter_mut().enumerate() {
            let wg = &*w.add(r * w_stride + g);
            let mut u = [_mm512_setzero_si512(); 4];
            for (u, src) in u.iter_mut().zip(&wg.u) {
                *u = _mm512_loadu_si512(src.as_ptr() as *const __m512i);
            }
            let d = _mm512_loadu_ps(wg.d.as_ptr());
            let m = if MIN { _mm512_loadu_ps(wg.c.as_ptr()) } else { _mm512_setzero_ps() };
            for (c, acc) in acc.iter_mut().enumerate() {
                let xg = &*x.add(c * x_stride + g);
                let mut p = _mm512_loadu_si512(xg.init.as_ptr() as *const __m512i);
                for (u, q) in u.iter().zip(&xg.q) {
                    p = _mm512_dpbusd_epi32(p, *u, _mm512_loadu_si512(q.as_ptr() as *const __m512i));
                }
                let scale = _mm512_mul_ps(d, _mm512_loadu_ps(xg.d.as_ptr()));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *acc);
                if MIN {
                    *acc = _mm512_fmadd_ps(m, _mm512_loadu_ps(xg.s.as_ptr()), *acc);
                }
            }
        }
    }
    sums(&acc)
}
