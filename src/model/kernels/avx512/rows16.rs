//! The AVX-512 batched product with 16 weight rows in the lanes of a register (as `avx2/rows8.rs` does
//! with 8): each 32-bit lane holds 4 quants of one row, one `vpdpbusd` against 4 activation bytes
//! broadcast to every lane advances 16 rows of one token, and a tile keeps one register of 16 rows per
//! group and token (two groups share each broadcast), stored without horizontal sums. Q4_K and Q6_K
//! multiply each scale group's sums by the rows' integer scales in one `vpmulld`; the 32-element types convert each block's sums and take the rows'
//! block scales in one FMA. A fixed offset (Q6_K's 32, Q4_0's 8, Q5_0's 16, Q8_0's 128 after its signed
//! bytes are made unsigned) starts a group's sums at `−offset·Σ x` of the group's activations; Q4_K's and
//! Q4_1's minimums add `min·d_x·Σ x` per sub-block.

use std::arch::x86_64::*;

use super::super::avx2::{Q4K, Q4_1, Q5K, Q6K, Q8_0};
use super::super::Q8Block;

/// Sixteen rows' super-block (or 8 blocks of a 32-element type), interleaved: `u[s][q]` holds quants
/// `4q .. 4q + 4` of 32-element (sub-)block `s` of row `i` in 32-bit lane `i`, unsigned; `k[j]` the rows'
/// integer scales of scale group `j` (Q4_K: sub-block `j`; Q6_K: 16 elements); `m[s]` the rows' minimum of
/// (sub-)block `s` (Q4_K: `−dmin·min`; Q4_1: `m`); `d` the rows' super-block scales (K-quants) and `db[s]`
/// the rows' block scales (32-element types).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(in crate::model::kernels) struct W16 {
    u: [[[u8; 64]; 8]; 8],
    k: [[i32; 16]; 16],
    m: [[f32; 16]; 8],
    d: [f32; 16],
    db: [[f32; 16]; 8],
}

impl W16 {
    const ZERO: W16 =
        W16 { u: [[[0; 64]; 8]; 8], k: [[0; 16]; 16], m: [[0.0; 16]; 8], d: [0.0; 16], db: [[0.0; 16]; 8] };
}

/// Packs `rows` rows of type `T` (`row_bytes` apart, `blocks` 32-element blocks each) 16 at a time into
/// `out` (`rows.div_ceil(16) · blocks.div_ceil(8)` entries, a group's in order, 8 blocks or a super-block
/// each); rows and blocks past the end are zero.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `w` holds `rows` rows of `row_bytes` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn pack_rows16<const T: u8>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<W16>,
) {
    assert!(w.len() >= rows * row_bytes);
    let supers = blocks.div_ceil(8);
    out.clear();
    out.resize(rows.div_ceil(16) * supers, W16::ZERO);
    for g in 0..rows.div_ceil(16) {
        let n = (rows - 16 * g).min(16);
        for sb in 0..supers {
            let p = &mut out[g * supers + sb];
            // Each row's 8 sub-blocks as 32 unsigned bytes, `sub[s][i]` for row `i`.
            let mut sub = [[_mm256_setzero_si256(); 16]; 8];
            for i in 0..n {
                let row = w.as_ptr().add((16 * g + i) * row_bytes);
                for (s, sub) in sub.iter_mut().enumerate().take(blocks - 8 * sb) {
                    sub[i] = super::super::avx2::unsigned_sub_block::<T>(row, 8 * sb + s);
                }
                let sc = super::super::avx2::lane_scales::<T>(row, sb, blocks);
                p.d[i] = sc.d;
                for j in 0..16 {
                    p.k[j][i] = sc.k[j];
                }
                for s in 0..8 {
                    p.m[s][i] = sc.m[s];
                    p.db[s][i] = sc.db[s];
                }
            }
            for (s, rows16) in sub.into_iter().enumerate() {
                let lo = super::super::avx2::transpose8(rows16[..8].try_into().expect("8 rows"));
                let hi = super::super::avx2::transpose8(rows16[8..].try_into().expect("8 rows"));
                for q in 0..8 {
                    _mm256_storeu_si256(p.u[s][q].as_mut_ptr() as *mut __m256i, lo[q]);
                    _mm256_storeu_si256(p.u[s][q].as_mut_ptr().add(32) as *mut __m256i, hi[q]);
                }
            }
        }
    }
}

/// The products of `G` groups of 16 packed rows (`w[g]`: `blocks.div_ceil(8)` entries of [`W16`] each, type
/// `T`) with `C` tokens' activation rows (`x[c]`, `blocks` blocks; a K-quant's 8 blocks per super-block
/// share one scale; `hs[c]` the sums of each block's two 16-element halves, read for Q6_K only): 16 rows'
/// results per group and token. Each broadcast activation word serves the `G` groups' weight vectors.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; each `w[g]` holds the entries, each `x[c]` `blocks` blocks and for
/// Q6_K each `hs[c]` as many pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn tile_rows16<const T: u8, const G: usize, const C: usize>(
    w: [*const W16; G],
    x: [*const Q8Block; C],
    hs: [*const [i32; 2]; C],
    blocks: usize,
) -> [[[f32; 16]; C]; G] {
    // Q5_K's minimums are not applied here (and it is not routed here).
    assert!(T != Q5K, "no 16-rows tile for Q5_K");
    let k_quant = matches!(T, Q4K | Q6K);
    let offset = match T {
        Q6K => 32,
        Q8_0 => 128,
        super::super::avx2::Q5_0 => 16,
        super::super::avx2::Q4_0 => 8,
        _ => 0,
    };
    let mut f = [[_mm512_setzero_ps(); C]; G];
    let halves = if T == Q6K { 2 } else { 1 };
    for sb in 0..blocks.div_ceil(8) {
        let mut wp = [&*w[0]; G];
        for (wp, w) in wp.iter_mut().zip(&w) {
            *wp = &*w.add(sb);
        }
        let mut isum = [[_mm512_setzero_si512(); C]; G];
        for s in 0..(blocks - 8 * sb).min(8) {
            let bi = 8 * sb + s;
            for h in 0..halves {
                let mut start = [_mm512_setzero_si512(); C];
                if T == Q6K {
                    for (st, hs) in start.iter_mut().zip(&hs) {
                        *st = _mm512_set1_epi32(-offset * (*hs.add(bi))[h]);
                    }
                } else if offset != 0 {
                    for (st, x) in start.iter_mut().zip(&x) {
                        *st = _mm512_set1_epi32(-offset * (*x.add(bi)).sum);
                    }
                }
                let mut acc = [start; G];
                for q in (0..8).skip(4 * h).take(8 / halves) {
                    let mut v = [_mm512_setzero_si512(); G];
                    for (v, wp) in v.iter_mut().zip(&wp) {
                        *v = _mm512_load_si512(wp.u[s][q].as_ptr() as *const __m512i);
                    }
                    for (c, x) in x.iter().enumerate() {
                        let xb = (*x.add(bi)).qs.as_ptr().add(4 * q);
                        let xv = _mm512_set1_epi32(std::ptr::read_unaligned(xb as *const i32));
                        for (acc, v) in acc.iter_mut().zip(&v) {
                            acc[c] = _mm512_dpbusd_epi32(acc[c], *v, xv);
                        }
                    }
                }
                for ((isum, acc), (wp, f)) in isum.iter_mut().zip(&acc).zip(wp.iter().zip(f.iter_mut())) {
                    if k_quant {
                        let k = _mm512_load_si512(wp.k[halves * s + h].as_ptr() as *const __m512i);
                        for (isum, acc) in isum.iter_mut().zip(acc) {
                            *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(*acc, k));
                        }
                    } else {
                        // The block's own scale: the rows' `d` times the token's.
                        let d = _mm512_load_ps(wp.db[s].as_ptr());
                        for (c, (acc, x)) in acc.iter().zip(&x).enumerate() {
                            let dx = _mm512_set1_ps((*x.add(bi)).d);
                            f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), _mm512_mul_ps(d, dx), f[c]);
                        }
                    }
                }
            }
            if T == Q4K || T == Q4_1 {
                for (wp, f) in wp.iter().zip(f.iter_mut()) {
                    let m = _mm512_load_ps(wp.m[s].as_ptr());
                    for (f, x) in f.iter_mut().zip(&x) {
                        let xb = &*x.add(bi);
                        *f = _mm512_fmadd_ps(m, _mm512_set1_ps(xb.d * xb.sum as f32), *f);
                    }
                }
            }
        }
        if k_quant {
            for ((wp, f), isum) in wp.iter().zip(f.iter_mut()).zip(&isum) {
                let d = _mm512_load_ps(wp.d.as_ptr());
                for (c, x) in x.iter().enumerate() {
                    let dx = _mm512_set1_ps((*x.add(8 * sb)).d);
                    f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, dx), f[c]);
                }
            }
        }
    }
    let mut out = [[[0f32; 16]; C]; G];
    for (o, f) in out.iter_mut().zip(f) {
        for (o, f) in o.iter_mut().zip(f) {
            _mm512_storeu_ps(o.as_mut_ptr(), f);
        }
    }
    out
}
