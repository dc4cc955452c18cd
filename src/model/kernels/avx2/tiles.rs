//! The batched product on 256-bit registers: the tile of several weight rows × several tokens over
//! groups of 8 blocks, and the weight packing it reads (see `super::super::batched`).

use super::*;

/// The batched product's tile (see `avx512::tile_groups`) on 256-bit registers: each group of 8 blocks as
/// two halves of 4 blocks. Without VNNI a byte dot product is `maddubs` (pair sums as i16) and `madd` (to
/// i32); when the weights are at most 31 (`SUM16`: every type but Q6_K's 0..63 and Q8_0's 0..255), the
/// four `maddubs` of a lane add up as i16 without overflow (4 × 2 × 31 × 127 < 2¹⁵) and take one `madd`.
/// Q8_0 needs VNNI (`maddubs` of 255 × 127 pairs would saturate).
///
/// `KS`: the weights are Q4_K or Q5_K super-blocks packed with integer sub-block scales (see [`WGroup`]):
/// the `madd` multiplies the i16 sums by each lane's scale instead of by 1, so the whole group is summed
/// in i32 and takes one conversion and one FMA per tile cell (with the super-block's scale) rather than
/// one per half and a scale per lane.
#[inline(always)]
unsafe fn tile_groups_impl<
    const VNNI: bool,
    const SUM16: bool,
    const MIN: bool,
    const KS: bool,
    const R: usize,
    const C: usize,
>(
    w: *const WGroup,
    w_stride: usize,
    x: *const XGroup,
    x_stride: usize,
    groups: usize,
) -> [[f32; C]; R] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for g in 0..groups {
        let wg: [&WGroup; R] = std::array::from_fn(|r| &*w.add(r * w_stride + g));
        let xg: [&XGroup; C] = std::array::from_fn(|c| &*x.add(c * x_stride + g));
        // With integer scales the group's sums run on across both halves.
        let mut p = [[_mm256_setzero_si256(); C]; R];
        for h in 0..2 {
            let at = 8 * h;
            if !KS {
                p = [[_mm256_setzero_si256(); C]; R];
            }
            // The cells' integer sums as an outer product over the four byte quarters `j`: each step loads
            // one weight vector per row and one activation vector per token, so only the sums stay in
            // registers (loading every row's four and every token's four at once spilled to the stack).
            // (No closures for the loads: they would not inherit the target features.)
            let mut s = [[_mm256_setzero_si256(); C]; R];
            for j in 0..4 {
                let mut u = [_mm256_setzero_si256(); R];
                for (u, wg) in u.iter_mut().zip(&wg) {
                    *u = _mm256_loadu_si256(wg.u[j].as_ptr().add(at) as *const __m256i);
                }
                for (c, xg) in xg.iter().enumerate() {
                    let q = _mm256_loadu_si256(xg.q[j].as_ptr().add(at) as *const __m256i);
                    for (r, u) in u.iter().enumerate() {
                        if VNNI {
                            p[r][c] = _mm256_dpbusd_avx_epi32(p[r][c], *u, q);
                        } else {
                            s[r][c] = _mm256_add_epi16(s[r][c], _mm256_maddubs_epi16(*u, q));
                        }
                    }
                }
                // Pairs of `maddubs` always fit i16 (2 × 2 × 63 × 127 for Q6_K); all four only when SUM16.
                if !VNNI && (j == 3 || (!SUM16 && j == 1)) {
                    for (wg, (p, s)) in wg.iter().zip(p.iter_mut().zip(s.iter_mut())) {
                        let k = if KS { _mm256_loadu_si256(wg.k.as_ptr().add(2 * at) as *const __m256i) } else { ones };
                        for (p, s) in p.iter_mut().zip(s.iter_mut()) {
                            *p = _mm256_add_epi32(*p, _mm256_madd_epi16(*s, k));
                            *s = _mm256_setzero_si256();
                        }
                    }
                }
            }
            for (r, wg) in wg.iter().enumerate() {
                let m = if MIN { _mm256_loadu_ps(wg.c.as_ptr().add(at)) } else { _mm256_setzero_ps() };
                for (c, xg) in xg.iter().enumerate() {
                    if !KS {
                        let d = _mm256_loadu_ps(wg.d.as_ptr().add(at));
                        let start = _mm256_loadu_si256(xg.init.as_ptr().add(at) as *const __m256i);
                        let sums = _mm256_cvtepi32_ps(_mm256_add_epi32(p[r][c], start));
                        let scale = _mm256_mul_ps(d, _mm256_loadu_ps(xg.d.as_ptr().add(at)));
                        acc[r][c] = _mm256_fmadd_ps(sums, scale, acc[r][c]);
                    }
                    if MIN {
                        acc[r][c] = _mm256_fmadd_ps(m, _mm256_loadu_ps(xg.s.as_ptr().add(at)), acc[r][c]);
                    }
                }
            }
        }
        if KS {
            // One scale for the group: the super-block's (every lane of `d`) times the token's.
            for (r, wg) in wg.iter().enumerate() {
                let d = _mm256_loadu_ps(wg.d.as_ptr());
                for (c, xg) in xg.iter().enumerate() {
                    let scale = _mm256_mul_ps(d, _mm256_loadu_ps(xg.d.as_ptr()));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[r][c]), scale, acc[r][c]);
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum(acc[r][c]);
        }
    }
    out
}

/// [`tile_groups_impl`] on AVX2 (`maddubs`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::model::kernels) unsafe fn tile_groups<
    const SUM16: bool,
    const MIN: bool,
    const KS: bool,
    const R: usize,
    const C: usize,
>(
    w: *const WGroup,
    w_stride: usize,
    x: *const XGroup,
    x_stride: usize,
    groups: usize,
) -> [[f32; C]; R] {
    tile_groups_impl::<false, SUM16, MIN, KS, R, C>(w, w_stride, x, x_stride, groups)
}

/// [`tile_groups_impl`] on AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(in crate::model::kernels) unsafe fn tile_groups_vnni<const MIN: bool, const R: usize, const C: usize>(
    w: *const WGroup,
    w_stride: usize,
    x: *const XGroup,
    x_stride: usize,
    groups: usize,
) -> [[f32; C]; R] {
    tile_groups_impl::<true, false, MIN, false, R, C>(w, w_stride, x, x_stride, groups)
}

/// The unsigned bytes of block `i` of a row of type `T` (a 32-element block, or a K-quant's sub-block), as
/// `super::super::unsigned_block` gives them, 32 at a time.
#[inline(always)]
pub(in crate::model::kernels) unsafe fn unsigned_block<const T: u8>(row: *const u8, i: usize) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    match T {
        Q4_0 | Q4_1 | Q5_0 | Q8_0 => {
            let b = row.add(i * block_bytes(T));
            match T {
                Q4_0 => nibbles(b.add(2)),
                Q4_1 => nibbles(b.add(4)),
                Q5_0 => {
                    _mm256_or_si256(nibbles(b.add(6)), fifth_bits(std::ptr::read_unaligned(b.add(2) as *const u32)))
                }
                _ => _mm256_xor_si256(_mm256_loadu_si256(b.add(2) as *const __m256i), _mm256_set1_epi8(-128)),
            }
        }
        Q4K | Q5K => {
            let (b, s) = (row.add(i / 8 * block_bytes(T)), i % 8);
            let qs = if T == Q5K { 48 } else { 16 };
            let v = _mm256_loadu_si256(b.add(qs + 32 * (s / 2)) as *const __m256i);
            let mut u =
                if s % 2 == 1 { _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) } else { _mm256_and_si256(v, m4) };
            if T == Q5K {
                let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
                u = _mm256_or_si256(u, bit_as_16(qh, 1 << s));
            }
            u
        }
        _ => {
            // Q6_K: quarter `s % 4` of half `s / 4`, as in `rows_dot_k_impl`.
            let (b, s) = (row.add(i / 8 * block_bytes(T)), i % 8);
            let (half, quarter) = (s / 4, s % 4);
            let ql = _mm256_loadu_si256(b.add(64 * half + 32 * (quarter % 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i);
            let low =
                if quarter < 2 { _mm256_and_si256(ql, m4) } else { _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) };
            let high = match quarter {
                0 => _mm256_slli_epi16(qh, 4),
                1 => _mm256_slli_epi16(qh, 2),
                2 => qh,
                _ => _mm256_srli_epi16(qh, 2),
            };
            _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)))
        }
    }
}

/// Writes the unsigned bytes of 8 blocks (`u[b]`, 32 each; the caller zeroes those past a row's end) into a group's
/// interleaved lanes (`WGroup::set_block`'s layout: lane `2b + h` of `u[j]` holds word `4h + j` of block
/// `b`) with register shuffles: each block's words reordered to pairs `(j, 4 + j)`, then a 4 × 4 transpose
/// of those 64-bit pairs per 4 blocks.
#[inline(always)]
pub(in crate::model::kernels) unsafe fn put_blocks(u: &[__m256i; 8], g: &mut WGroup) {
    let pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for half in 0..2 {
        let v: [__m256i; 4] = [
            _mm256_permutevar8x32_epi32(u[4 * half], pairs),
            _mm256_permutevar8x32_epi32(u[4 * half + 1], pairs),
            _mm256_permutevar8x32_epi32(u[4 * half + 2], pairs),
            _mm256_permutevar8x32_epi32(u[4 * half + 3], pairs),
        ];
        let (t0, t1) = (_mm256_unpacklo_epi64(v[0], v[1]), _mm256_unpackhi_epi64(v[0], v[1]));
        let (t2, t3) = (_mm256_unpacklo_epi64(v[2], v[3]), _mm256_unpackhi_epi64(v[2], v[3]));
        let out = [
            _mm256_permute2x128_si256::<0x20>(t0, t2),
            _mm256_permute2x128_si256::<0x20>(t1, t3),
            _mm256_permute2x128_si256::<0x31>(t0, t2),
            _mm256_permute2x128_si256::<0x31>(t1, t3),
        ];
        for (j, o) in out.into_iter().enumerate() {
            _mm256_storeu_si256(g.u[j].as_mut_ptr().add(8 * half) as *mut __m256i, o);
        }
    }
}

/// Each of 8 bytes repeated `N` times (`N` = 2 or 4) as 16-bit lanes: 16 lanes for `N = 2` (the first
/// vector), 32 for `N = 4`.
#[inline(always)]
unsafe fn spread_bytes<const N: usize>(v: [u8; 8]) -> [__m256i; 2] {
    const fn picks(n: usize, from: usize) -> [i8; 16] {
        let mut p = [0i8; 16];
        let mut i = 0;
        while i < 16 {
            p[i] = ((i + from) / n) as i8;
            i += 1;
        }
        p
    }
    const P2: [i8; 16] = picks(2, 0);
    const P4: [[i8; 16]; 2] = [picks(4, 0), picks(4, 16)];
    let x = _mm_set_epi64x(0, i64::from_le_bytes(v));
    let (lo, hi) = if N == 2 { (P2, P2) } else { (P4[0], P4[1]) };
    let lo = _mm_shuffle_epi8(x, _mm_loadu_si128(lo.as_ptr() as *const __m128i));
    let hi = _mm_shuffle_epi8(x, _mm_loadu_si128(hi.as_ptr() as *const __m128i));
    [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)]
}

/// Eight unsigned 16-bit lanes as floats.
#[inline(always)]
unsafe fn widen(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(v))
}

/// A K-quant super-block's float scales (and Q4_K/Q5_K's minimums) in a group's lanes: Q6_K's 16-element
/// scales in order (lane `2s + h`), Q4_K/Q5_K's sub-block scale and minimum in both lanes of the
/// sub-block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and `b` is a whole super-block of type `T` (Q4_K, Q5_K or Q6_K).
#[inline(always)]
pub(in crate::model::kernels) unsafe fn put_super_scales<const T: u8>(b: *const u8, g: &mut WGroup) {
    if T == Q6K {
        let d = _mm256_set1_ps(f16(b.add(208)));
        let sc = _mm_loadu_si128(b.add(192) as *const __m128i);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)));
        _mm256_storeu_ps(g.d.as_mut_ptr(), _mm256_mul_ps(d, lo));
        _mm256_storeu_ps(g.d.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
        return;
    }
    let (d, dmin) = (_mm256_set1_ps(f16(b)), _mm256_set1_ps(-f16(b.add(2))));
    let (sc, mn) = super::super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
    let (sc, mn) = (spread_bytes::<2>(sc)[0], spread_bytes::<2>(mn)[0]);
    // (No closure for the halves: it would not inherit the target features.)
    let s = [_mm256_castsi256_si128(sc), _mm256_extracti128_si256::<1>(sc)];
    let m = [_mm256_castsi256_si128(mn), _mm256_extracti128_si256::<1>(mn)];
    for h in 0..2 {
        _mm256_storeu_ps(g.d.as_mut_ptr().add(8 * h), _mm256_mul_ps(d, widen(s[h])));
        _mm256_storeu_ps(g.c.as_mut_ptr().add(8 * h), _mm256_mul_ps(dmin, widen(m[h])));
    }
}

/// Packs rows for the batched product like `super::super::avx512::pack_weight_groups_portable`, unpacking the
/// bytes with AVX2 and interleaving them in registers ([`put_blocks`]); the scales of the 32-element types
/// come from the portable code once per block, the K-quants' once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_weight_groups_impl<const T: u8>(
    t: BlockType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    out: &mut Vec<WGroup>,
) {
    let groups = blocks.div_ceil(8);
    out.clear();
    out.resize(rows * groups, WGroup::ZERO);
    for r in 0..rows {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for gi in 0..groups {
            let g = &mut out[r * groups + gi];
            let n = (blocks - 8 * gi).min(8);
            let mut u = [_mm256_setzero_si256(); 8];
            for (b, u) in u.iter_mut().enumerate().take(n) {
                *u = unsigned_block::<T>(row.as_ptr(), 8 * gi + b);
            }
            put_blocks(&u, g);
            match T {
                Q6K | Q4K | Q5K => put_super_scales::<T>(row.as_ptr().add(gi * block_bytes(T)), g),
                _ => {
                    for b in 0..n {
                        let (d, c) = super::super::block_scales(t, row, 8 * gi + b);
                        g.d[2 * b] = d[0];
                        g.d[2 * b + 1] = d[1];
                        g.c[2 * b] = c;
                        g.c[2 * b + 1] = c;
                    }
                }
            }
        }
    }
}

/// Packs rows of Q4_K or Q5_K super-blocks (type `T`) with integer sub-block scales for [`tile_groups`]'s `KS`
/// (see [`WGroup`]), one group per super-block, the scales decoded once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_weight_supers_int<const T: u8>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    supers: usize,
    out: &mut Vec<WGroup>,
) {
    let bb = block_bytes(T);
    out.clear();
    out.resize(rows * supers, WGroup::ZERO);
    for r in 0..rows {
        let row = w[r * row_bytes..(r + 1) * row_bytes].as_ptr();
        for sb in 0..supers {
            let b = row.add(sb * bb);
            let g = &mut out[r * supers + sb];
            let mut u = [_mm256_setzero_si256(); 8];
            for (s, u) in u.iter_mut().enumerate() {
                *u = unsigned_block::<T>(row, 8 * sb + s);
            }
            put_blocks(&u, g);
            // Each lane's integer scale (twice: both 16-bit halves of the lane), its minimum, and the
            // super-block's scale.
            let (d, dmin) = (f16(b), f16(b.add(2)));
            let (sc, mn) = super::super::q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
            let k = spread_bytes::<4>(sc);
            _mm256_storeu_si256(g.k.as_mut_ptr() as *mut __m256i, k[0]);
            _mm256_storeu_si256(g.k.as_mut_ptr().add(16) as *mut __m256i, k[1]);
            let m = spread_bytes::<2>(mn)[0];
            let neg = _mm256_set1_ps(-dmin);
            _mm256_storeu_ps(g.c.as_mut_ptr(), _mm256_mul_ps(neg, widen(_mm256_castsi256_si128(m))));
            _mm256_storeu_ps(g.c.as_mut_ptr().add(8), _mm256_mul_ps(neg, widen(_mm256_extracti128_si256::<1>(m))));
            _mm256_storeu_ps(g.d.as_mut_ptr(), _mm256_set1_ps(d));
            _mm256_storeu_ps(g.d.as_mut_ptr().add(8), _mm256_set1_ps(d));
        }
    }
}

/// [`pack_weight_groups_impl`] for a type known at run time; with `int_scales`, Q4_K and Q5_K as
/// [`pack_weight_supers_int`] does (for the AVX2 tile's `KS`).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds `rows` rows of `row_bytes` bytes (`blocks` blocks).
pub(in crate::model::kernels) unsafe fn pack_weight_groups(
    t: BlockType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    blocks: usize,
    int_scales: bool,
    out: &mut Vec<WGroup>,
) {
    let supers = blocks / 8;
    match code(t) {
        Q4_0 => pack_weight_groups_impl::<Q4_0>(t, w, row_bytes, rows, blocks, out),
        Q4_1 => pack_weight_groups_impl::<Q4_1>(t, w, row_bytes, rows, blocks, out),
        Q5_0 => pack_weight_groups_impl::<Q5_0>(t, w, row_bytes, rows, blocks, out),
        Q8_0 => pack_weight_groups_impl::<Q8_0>(t, w, row_bytes, rows, blocks, out),
        Q4K if int_scales => pack_weight_supers_int::<Q4K>(w, row_bytes, rows, supers, out),
        Q5K if int_scales => pack_weight_supers_int::<Q5K>(w, row_bytes, rows, supers, out),
        Q4K => pack_weight_groups_impl::<Q4K>(t, w, row_bytes, rows, blocks, out),
        Q5K => pack_weight_groups_impl::<Q5K>(t, w, row_bytes, rows, blocks, out),
        _ => pack_weight_groups_impl::<Q6K>(t, w, row_bytes, rows, blocks, out),
    }
}
