//! The AVX2 batched product for Q4_K and Q6_K with 8 weight rows in the lanes of a register: each 32-bit
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
/// lane, for `madd`); `m[s]` the rows' `−dmin·min` of sub-block `s` (Q4_K); `d` the rows' scales.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(in crate::model::kernels) struct W8 {
    u: [[[u8; 32]; 8]; 8],
    k: [[i16; 16]; 16],
    m: [[f32; 8]; 8],
    d: [f32; 8],
}

impl W8 {
    const ZERO: W8 = W8 { u: [[[0; 32]; 8]; 8], k: [[0; 16]; 16], m: [[0.0; 8]; 8], d: [0.0; 8] };
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

/// Packs `rows` rows of type `T` (Q4_K or Q6_K; `row_bytes` apart, `supers` super-blocks each) 8 at a time
/// into `out` (`rows.div_ceil(8) · supers` entries, a group's super-blocks in order); rows past the end are
/// zero.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds `rows` rows of `row_bytes` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn pack_rows8<const T: u8>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    supers: usize,
    out: &mut Vec<W8>,
) {
    assert!(w.len() >= rows * row_bytes);
    let bb = block_bytes(T);
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
                for (s, sub) in sub.iter_mut().enumerate() {
                    let u = super::tiles::unsigned_block::<T>(row, 8 * sb + s);
                    sub[i] = if T == Q6K { _mm256_sub_epi8(u, _mm256_set1_epi8(32)) } else { u };
                }
                let b = row.add(sb * bb);
                if T == Q6K {
                    p.d[i] = f16(b.add(208));
                    for j in 0..16 {
                        p.k[j][2 * i] = *(b.add(192 + j) as *const i8) as i16;
                        p.k[j][2 * i + 1] = p.k[j][2 * i];
                    }
                } else {
                    let (d, dmin) = (f16(b), f16(b.add(2)));
                    let (sc, mn) = super::super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
                    p.d[i] = d;
                    for s in 0..8 {
                        p.k[s][2 * i] = sc[s] as i16;
                        p.k[s][2 * i + 1] = sc[s] as i16;
                        p.m[s][i] = -dmin * mn[s] as f32;
                    }
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

/// The products of 8 packed rows (`supers` super-blocks of [`W8`], type `T`) with `C` tokens' K-quant
/// activation rows (`x[c]`, 8 blocks per super-block sharing one scale): one register of 8 rows per token.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds `supers` entries and each `x[c]` `8 · supers` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn tile_rows8<const T: u8, const C: usize>(
    w: *const W8,
    x: [*const Q8Block; C],
    supers: usize,
) -> [__m256; C] {
    let mut f = [_mm256_setzero_ps(); C];
    for sb in 0..supers {
        let wp = &*w.add(sb);
        let mut isum = [_mm256_setzero_si256(); C];
        for s in 0..8 {
            // Q4_K: the sub-block's 8 quarters summed in i16 (8 × 2 × 15 × 128 < 2¹⁵), one scale. Q6_K: each
            // 16-element half (4 quarters, 4 × 2 × 32 × 127 < 2¹⁵) with its own scale.
            let halves = if T == Q6K { 2 } else { 1 };
            for h in 0..halves {
                let mut a = [_mm256_setzero_si256(); C];
                for q in (0..8).skip(4 * h).take(8 / halves) {
                    let v = _mm256_load_si256(wp.u[s][q].as_ptr() as *const __m256i);
                    let mag = if T == Q6K { _mm256_sign_epi8(v, v) } else { v };
                    for (a, x) in a.iter_mut().zip(&x) {
                        let xb = (*x.add(8 * sb + s)).qs.as_ptr().add(4 * q);
                        let mut xv = _mm256_set1_epi32(std::ptr::read_unaligned(xb as *const i32));
                        if T == Q6K {
                            xv = _mm256_sign_epi8(xv, v);
                        }
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(mag, xv));
                    }
                }
                let k = _mm256_load_si256(wp.k[halves * s + h].as_ptr() as *const __m256i);
                for (isum, a) in isum.iter_mut().zip(&a) {
                    *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(*a, k));
                }
            }
            if T == Q4K {
                let m = _mm256_load_ps(wp.m[s].as_ptr());
                for (f, x) in f.iter_mut().zip(&x) {
                    let xb = &*x.add(8 * sb + s);
                    *f = _mm256_fmadd_ps(m, _mm256_set1_ps(xb.d * xb.sum as f32), *f);
                }
            }
        }
        let d = _mm256_load_ps(wp.d.as_ptr());
        for (c, x) in x.iter().enumerate() {
            let dx = _mm256_set1_ps((*x.add(8 * sb)).d);
            f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d, dx), f[c]);
        }
    }
    f
}
