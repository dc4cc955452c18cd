//! The AVX2 batched product (Q4_K, Q6_K, Q4_0, Q4_1, Q5_0) with 8 weight rows in the lanes of a register: each 32-bit
//! lane holds 4 quants of one row, so one `maddubs` against 4 activation bytes broadcast to every lane
//! advances 8 rows of one token at once, the sub-block scales apply per lane with one `madd`, and a tile's
//! sums are already one register per token (8 rows, stored as they are: no horizontal sums). The 2 × 2
//! tiles of [`super::tile_groups`] keep a register per cell and ran out of the 16 registers (their sums
//! spilled). Q6_K's quants are stored signed (`u − 32`): `maddubs` takes their magnitudes and the
//! activations with their signs, so its offset needs no correction term.

use super::*;

/// Eight rows' super-block, interleaved: `u[s][q]` holds quants `4q .. 4q + 4` of 32-element sub-block `s`
/// of row `i` in 32-bit lane `i` (Q6_K: minus 32, signed); `k[j]` the rows' scales of scale group `j`
/// (Q4_K: sub-block `j`'s 6 bits; Q6_K: 16 elements' 8 bits), each twice (both 16-bit halves of the row's
/// lane, for `madd`); `m[s]` the rows' minimum of (sub-)block `s` (Q4_K: `−dmin·min`; Q4_1: `m`); `d` the
/// rows' super-block scales (K-quants), `db[s]` their block scales (Q4_0, Q4_1, Q5_0: 8 blocks an entry).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(in crate::model::kernels) struct W8 {
    u: [[[u8; 32]; 8]; 8],
    k: [[i16; 16]; 16],
    m: [[f32; 8]; 8],
    d: [f32; 8],
    db: [[f32; 8]; 8],
}

impl W8 {
    const ZERO: W8 = W8 { u: [[[0; 32]; 8]; 8], k: [[0; 16]; 16], m: [[0.0; 8]; 8], d: [0.0; 8], db: [[0.0; 8]; 8] };
}

/// The 8 × 8 transpose of 32-bit words: `out[q]` lane `i` = word `q` of `v[i]`.
#[inline(always)]
pub(in crate::model::kernels) unsafe fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    // Pairs of rows interleaved by words, then by 64-bit pairs, then the 128-bit halves swapped into place.
    let a = [
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
        _mm256_unpacklo_epi32(v[4], v[5]),
        _mm256_unpackhi_epi32(v[4], v[5]),
        _mm256_unpacklo_epi32(v[6], v[7]),
        _mm256_unpackhi_epi32(v[6], v[7]),
    ];
    let b = [
        _mm256_unpacklo_epi64(a[0], a[2]),
        _mm256_unpackhi_epi64(a[0], a[2]),
        _mm256_unpacklo_epi64(a[1], a[3]),
        _mm256_unpackhi_epi64(a[1], a[3]),
        _mm256_unpacklo_epi64(a[4], a[6]),
        _mm256_unpackhi_epi64(a[4], a[6]),
        _mm256_unpacklo_epi64(a[5], a[7]),
        _mm256_unpackhi_epi64(a[5], a[7]),
    ];
    // b[j] holds, per 128-bit half h, word (4h + j) of rows 0..4 (b[0..4]) or rows 4..8 (b[4..8]).
    [
        _mm256_permute2x128_si256::<0x20>(b[0], b[4]),
        _mm256_permute2x128_si256::<0x20>(b[1], b[5]),
        _mm256_permute2x128_si256::<0x20>(b[2], b[6]),
        _mm256_permute2x128_si256::<0x20>(b[3], b[7]),
        _mm256_permute2x128_si256::<0x31>(b[0], b[4]),
        _mm256_permute2x128_si256::<0x31>(b[1], b[5]),
        _mm256_permute2x128_si256::<0x31>(b[2], b[6]),
        _mm256_permute2x128_si256::<0x31>(b[3], b[7]),
    ]
}

/// One row's scales for entry `sb` of the lanes tiles (a super-block, or 8 blocks of a 32-element type;
/// `blocks` in the row), as both packers lay them out: `d` the super-block's scale, `k` the integer scale
/// of each scale group (Q4_K/Q5_K: 8 sub-blocks; Q6_K: 16 halves), `m` each (sub-)block's minimum
/// (Q4_K/Q5_K: `−dmin·min`; Q4_1: `m`), `db` each 32-element block's scale. Fields a type has not stay zero.
#[derive(Default)]
pub(in crate::model::kernels) struct LaneScales {
    pub(in crate::model::kernels) d: f32,
    pub(in crate::model::kernels) k: [i32; 16],
    pub(in crate::model::kernels) m: [f32; 8],
    pub(in crate::model::kernels) db: [f32; 8],
}

/// [`LaneScales`] of entry `sb` of the row at `row` (type `T`, `blocks` 32-element blocks).
///
/// # Safety
/// The row holds `blocks` blocks of type `T`.
#[inline(always)]
pub(in crate::model::kernels) unsafe fn lane_scales<const T: u8>(
    row: *const u8,
    sb: usize,
    blocks: usize,
) -> LaneScales {
    let bb = block_bytes(T);
    let mut sc = LaneScales::default();
    match T {
        Q6K => {
            let b = row.add(sb * bb);
            sc.d = f16(b.add(208));
            for (j, k) in sc.k.iter_mut().enumerate() {
                *k = *(b.add(192 + j) as *const i8) as i32;
            }
        }
        Q4K | Q5K => {
            let b = row.add(sb * bb);
            let dmin = f16(b.add(2));
            let (s, mn) = super::super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
            sc.d = f16(b);
            for j in 0..8 {
                sc.k[j] = s[j] as i32;
                sc.m[j] = -dmin * mn[j] as f32;
            }
        }
        _ => {
            for s in 0..(blocks - 8 * sb).min(8) {
                let b = row.add((8 * sb + s) * bb);
                sc.db[s] = f16(b);
                if T == Q4_1 {
                    sc.m[s] = f16(b.add(2));
                }
            }
        }
    }
    sc
}

/// Packs `rows` rows of type `T` (Q4_K, Q6_K, Q4_0, Q4_1 or Q5_0; `row_bytes` apart, `blocks` 32-element
/// blocks each) 8 at a time into `out` (`rows.div_ceil(8) · blocks.div_ceil(8)` entries, a group's in order:
/// a super-block or 8 blocks each); rows and blocks past the end are zero.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds `rows` rows of `row_bytes` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn pack_rows8<const T: u8>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<W8>,
) {
    assert!(w.len() >= rows * row_bytes);
    let supers = blocks.div_ceil(8);
    out.clear();
    out.resize(rows.div_ceil(8) * supers, W8::ZERO);
    for g in 0..rows.div_ceil(8) {
        let n = (rows - 8 * g).min(8);
        for sb in 0..supers {
            let p = &mut out[g * supers + sb];
            // Each row's 8 sub-blocks as 32 bytes, `sub[s][i]` for row `i`.
            let mut sub = [[_mm256_setzero_si256(); 8]; 8];
            for i in 0..n {
                let row = w.as_ptr().add((8 * g + i) * row_bytes);
                for (s, sub) in sub.iter_mut().enumerate().take(blocks - 8 * sb) {
                    let u = super::tiles::unsigned_block::<T>(row, 8 * sb + s);
                    sub[i] = if T == Q6K { _mm256_sub_epi8(u, _mm256_set1_epi8(32)) } else { u };
                }
                // Scale group `j`'s integer scale twice (both 16-bit halves of the row's lane, for `madd`).
                let sc = lane_scales::<T>(row, sb, blocks);
                p.d[i] = sc.d;
                for j in 0..16 {
                    p.k[j][2 * i] = sc.k[j] as i16;
                    p.k[j][2 * i + 1] = sc.k[j] as i16;
                }
                for s in 0..8 {
                    p.m[s][i] = sc.m[s];
                    p.db[s][i] = sc.db[s];
                }
            }
            for (s, rows8) in sub.into_iter().enumerate() {
                for (q, v) in transpose8(rows8).into_iter().enumerate() {
                    _mm256_storeu_si256(p.u[s][q].as_mut_ptr() as *mut __m256i, v);
                }
            }
        }
    }
}

/// The products of 8 packed rows (`blocks.div_ceil(8)` entries of [`W8`], type `T`) with `C` tokens'
/// activation rows (`x[c]`, `blocks` blocks; a K-quant's 8 blocks per super-block share one scale): 8 rows'
/// results per token.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds the entries and each `x[c]` `blocks` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn tile_rows8<const T: u8, const C: usize>(
    w: *const W8,
    x: [*const Q8Block; C],
    blocks: usize,
) -> [[f32; 8]; C] {
    assert!(matches!(T, Q4K | Q6K | Q4_0 | Q4_1 | Q5_0), "no 8-rows tile for type code {T}");
    let k_quant = matches!(T, Q4K | Q6K);
    // Quarters whose `maddubs` pairs add up in i16 before a `madd`: Q4_K, Q4_0 and Q4_1 (at most 15) all 8
    // (8 × 2 × 15 × 128 < 2¹⁵), Q6_K's magnitudes (at most 32) and Q5_0 (at most 31) 4.
    let run = if matches!(T, Q6K | Q5_0) { 4 } else { 8 };
    let offset = match T {
        Q5_0 => 16,
        Q4_0 => 8,
        _ => 0,
    };
    let ones = _mm256_set1_epi16(1);
    let mut f = [_mm256_setzero_ps(); C];
    for sb in 0..blocks.div_ceil(8) {
        let wp = &*w.add(sb);
        let mut isum = [_mm256_setzero_si256(); C];
        for s in 0..(blocks - 8 * sb).min(8) {
            let bi = 8 * sb + s;
            // 32-element types: the block's sums start at −offset·Σ x.
            let mut bsum = [_mm256_setzero_si256(); C];
            if offset != 0 {
                for (b, x) in bsum.iter_mut().zip(&x) {
                    *b = _mm256_set1_epi32(-offset * (*x.add(bi)).sum);
                }
            }
            for h in 0..8 / run {
                let mut a = [_mm256_setzero_si256(); C];
                for q in run * h..run * h + run {
                    let v = _mm256_load_si256(wp.u[s][q].as_ptr() as *const __m256i);
                    let mag = if T == Q6K { _mm256_sign_epi8(v, v) } else { v };
                    for (a, x) in a.iter_mut().zip(&x) {
                        let xb = (*x.add(bi)).qs.as_ptr().add(4 * q);
                        let mut xv = _mm256_set1_epi32(std::ptr::read_unaligned(xb as *const i32));
                        if T == Q6K {
                            xv = _mm256_sign_epi8(xv, v);
                        }
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(mag, xv));
                    }
                }
                if k_quant {
                    // Q4_K: one scale a sub-block; Q6_K: one a 16-element half.
                    let k = _mm256_load_si256(wp.k[if T == Q6K { 2 * s + h } else { s }].as_ptr() as *const __m256i);
                    for (isum, a) in isum.iter_mut().zip(&a) {
                        *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(*a, k));
                    }
                } else {
                    for (b, a) in bsum.iter_mut().zip(&a) {
                        *b = _mm256_add_epi32(*b, _mm256_madd_epi16(*a, ones));
                    }
                }
            }
            if !k_quant {
                let d = _mm256_load_ps(wp.db[s].as_ptr());
                for (c, (b, x)) in bsum.iter().zip(&x).enumerate() {
                    let dx = _mm256_set1_ps((*x.add(bi)).d);
                    f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*b), _mm256_mul_ps(d, dx), f[c]);
                }
            }
            if T == Q4K || T == Q4_1 {
                let m = _mm256_load_ps(wp.m[s].as_ptr());
                for (f, x) in f.iter_mut().zip(&x) {
                    let xb = &*x.add(bi);
                    *f = _mm256_fmadd_ps(m, _mm256_set1_ps(xb.d * xb.sum as f32), *f);
                }
            }
        }
        if k_quant {
            let d = _mm256_load_ps(wp.d.as_ptr());
            for (c, x) in x.iter().enumerate() {
                let dx = _mm256_set1_ps((*x.add(8 * sb)).d);
                f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d, dx), f[c]);
            }
        }
    }
    let mut out = [[0f32; 8]; C];
    for (o, f) in out.iter_mut().zip(f) {
        _mm256_storeu_ps(o.as_mut_ptr(), f);
    }
    out
}
