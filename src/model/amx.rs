//! Prompt prefill on Intel AMX: `Y = X · Wᵀ` for a prompt-sized batch `X` (`m × k`, f32) and a quantized
//! weight matrix `W` (`n × k`, GGUF block layout), with bf16 inputs and f32 accumulation in the tile unit
//! (`tdpbf16ps`: a 16×32 by 32×16 product per instruction, 16× the multiply-adds of an AVX-512 FMA).
//!
//! How it runs:
//! - `X` is rounded once to bf16, row-major (rows padded with zeros to a multiple of 32).
//! - The columns of `Y` are cut into panels of 32. A worker dequantizes a panel's 32 weight rows with the
//!   SIMD dequantizer and stores them as bf16 pairs in the tile unit's "B" layout (for each 32-deep slice
//!   of `k`: 16 rows of 16 column pairs), into a buffer that stays in its L2 cache.
//! - Each 32×32 block of `Y` is four accumulator tiles (2 row tiles × 2 column tiles): per 32-deep slice
//!   two tiles of `X` and two of the panel are loaded and multiplied, so every tile load feeds two products.
//! - Panels are spread over candle's worker pool; each worker loads the tile configuration itself.
//!
//! Accuracy: bf16 keeps 8 significant bits, so each weight and activation is rounded by at most 2⁻⁹
//! relative — the same order as the 8-bit activation rounding of the decode kernels (half a step of
//! 1/127 of a block's largest value). Sums are f32. `tests/kernel_accuracy.rs` bounds the effect on the
//! logits of every catalogue model against the f32 reference forward.
//!
//! The tile unit must be switched on per process (Linux's `ARCH_REQ_XCOMP_PERM`); [`available`] does that
//! once and says no where the CPU or the kernel cannot, and the caller then keeps the f32 GEMM path.
//! `REAGENT_KERNELS=avx512|vnni|avx2|scalar` also turns it off, to compare paths.

use super::kernels::{self, BlockType, Tier};

/// Columns per panel (two 16-column tiles) and rows per block of `Y` (two 16-row tiles).
pub const PANEL: usize = 32;
const ROWS: usize = 32;
/// Depth of one tile product: 32 bf16 values (16 pairs) per tile row.
const DEPTH: usize = 32;

/// Whether the AMX path can run here: the CPU has AMX-TILE and AMX-BF16, Linux granted the tile state,
/// and `REAGENT_KERNELS` does not cap the kernels below it. Checked once.
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let capped = !matches!(super::kernels::kernel_cap(), Ok(None));
        !capped && Tier::best() != Tier::Scalar && imp::enable()
    })
}

/// Whether [`matmul_t`] takes a `n × k` matrix of type `t`.
pub fn supports(t: BlockType, n: usize, k: usize) -> bool {
    n > 0 && n.is_multiple_of(PANEL) && k.is_multiple_of(t.block_elems()) && k > 0
}

/// `X · Wᵀ` as `m × n` f32, row-major, for `x` of `m × k` and `w` the `n × k` matrix of type `t`. The caller
/// checks [`available`] and [`supports`].
pub fn matmul_t(t: BlockType, w: &[u8], n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    assert!(available(), "AMX is not available");
    assert!(supports(t, n, k), "{n} × {k} {t:?} matrix is not a whole number of panels");
    let row_bytes = t.row_bytes(k);
    assert_eq!(w.len(), n * row_bytes, "weight bytes do not match {n} rows of {k} columns");
    assert!(x.len().is_multiple_of(k));
    let m = x.len() / k;
    let m_pad = m.div_ceil(ROWS) * ROWS;

    // Pairs of bf16 values as `u32`s (low half first), the unit the tile loads work in.
    let mut xb = vec![0u32; m_pad * k / 2];
    to_bf16_pairs(x, &mut xb[..m * k / 2]);
    let mut y: Vec<f32> = Vec::with_capacity(m_pad * n);
    let y_ptr = y.as_mut_ptr() as usize;
    let tier = Tier::best();
    crate::model::pool::pool().for_chunks(n / PANEL, |panels| {
        let mut rowbuf = vec![0f32; k];
        let mut rowbf = vec![0u32; 16 * k / 2];
        let mut panel = vec![0u32; k / DEPTH * 2 * 256];
        // SAFETY: `available` granted the tile state to this process and the CPU has AMX-TILE/BF16.
        unsafe { imp::configure() };
        for p in panels {
            let n0 = p * PANEL;
            let rows = &w[n0 * row_bytes..(n0 + PANEL) * row_bytes];
            pack_panel(tier, t, rows, k, &mut rowbuf, &mut rowbf, &mut panel);
            // SAFETY: the tiles are configured; `xb` holds `m_pad × k` values, `panel` one packed panel, and
            // this work item writes only columns n0..n0+32 of `y`'s `m_pad × n` allocation.
            unsafe { imp::panel_product(xb.as_ptr(), m_pad, k, panel.as_ptr(), (y_ptr as *mut f32).add(n0), n) };
        }
        // SAFETY: as above.
        unsafe { imp::release() };
    });
    // SAFETY: the panels covered every column of every one of the `m_pad` rows.
    unsafe { y.set_len(m_pad * n) };
    y.truncate(m * n);
    y
}

/// Round-to-nearest-even f32 → bf16.
#[inline(always)]
fn bf16(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// `x` (an even number of values) rounded to bf16, as pairs: `out[i]` holds `x[2i]` in its low half and
/// `x[2i+1]` in its high half. AVX-512 BF16 converts 32 values per instruction where the CPU has it (every
/// CPU with AMX-BF16 does); rounding is to nearest even either way.
fn to_bf16_pairs(x: &[f32], out: &mut [u32]) {
    assert_eq!(x.len(), out.len() * 2);
    #[cfg(target_arch = "x86_64")]
    if imp::has_avx512_bf16() {
        let whole = x.len() / 32 * 32;
        // SAFETY: the CPU has AVX-512 F and BF16 (checked); the loop reads `whole` values of `x` and writes
        // `whole / 2` pairs of `out`.
        unsafe { imp::to_bf16_pairs_avx512(&x[..whole], &mut out[..whole / 2]) };
        for (o, p) in out[whole / 2..].iter_mut().zip(x[whole..].chunks_exact(2)) {
            *o = bf16(p[0]) as u32 | (bf16(p[1]) as u32) << 16;
        }
        return;
    }
    for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
        *o = bf16(p[0]) as u32 | (bf16(p[1]) as u32) << 16;
    }
}

/// Dequantizes the 32 rows `w` (each `k` wide) into the tile unit's B layout: for each 32-deep slice `s`
/// and column tile `j`, 16 rows of 16 `u32`s where row `r`, column `c` holds the bf16 pair
/// `(W[16j+c][32s+2r], W[16j+c][32s+2r+1])` (low half first).
///
/// Sixteen weight rows at a time are dequantized and rounded with SIMD into `rowbuf`/`rowbf` (16 × `k`
/// values), then each tile is written whole, line by line, from a 16×16 transpose of their pairs: tile
/// writes scattered one pair at a time over a panel larger than L1 cost more than the products at
/// small batches.
fn pack_panel(tier: Tier, t: BlockType, w: &[u8], k: usize, rowbuf: &mut [f32], rowbf: &mut [u32], panel: &mut [u32]) {
    let row_bytes = t.row_bytes(k);
    let half = k / 2;
    for (j, group) in w.chunks_exact(16 * row_bytes).enumerate() {
        for (row, bf) in group.chunks_exact(row_bytes).zip(rowbf.chunks_exact_mut(half)) {
            kernels::dequantize_row_on(tier, t, row, rowbuf);
            to_bf16_pairs(rowbuf, bf);
        }
        for s in 0..k / DEPTH {
            let tile: &mut [u32; 256] = (&mut panel[(s * 2 + j) * 256..][..256]).try_into().expect("256 values");
            let mut src = [[0u32; 16]; 16];
            for (c, line) in src.iter_mut().enumerate() {
                line.copy_from_slice(&rowbf[c * half + s * 16..][..16]);
            }
            for r in 0..16 {
                for c in 0..16 {
                    tile[r * 16 + c] = src[c][r];
                }
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::arch::asm;

    /// The 64-byte tile configuration (palette 1).
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    pub(super) fn has_avx512_bf16() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16"))
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn to_bf16_pairs_avx512(x: &[f32], out: &mut [u32]) {
        use std::arch::x86_64::*;
        for (xs, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(16)) {
            let lo = _mm512_loadu_ps(xs.as_ptr());
            let hi = _mm512_loadu_ps(xs.as_ptr().add(16));
            let r: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(o.as_mut_ptr() as *mut __m512i, r);
        }
    }

    pub(super) fn enable() -> bool {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        if leaf.edx & (1 << 22) == 0 || leaf.edx & (1 << 24) == 0 {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call asking for permission to use the tile state; no memory is passed.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }

    /// Configures tiles 0–7 as 16 rows × 64 bytes, for this thread.
    pub(super) unsafe fn configure() {
        // Palette 1 has 8 tiles; the entries of the other 8 must be zero or the load faults.
        let mut cfg = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        cfg.colsb[..8].fill(64);
        cfg.rows[..8].fill(16);
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    }

    pub(super) unsafe fn release() {
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Columns `0..32` of `y` (row stride `n` floats) for all `m_pad` rows: `xb` (`m_pad × k` bf16,
    /// row-major) times the packed panel.
    pub(super) unsafe fn panel_product(
        xb: *const u32,
        m_pad: usize,
        k: usize,
        panel: *const u32,
        y: *mut f32,
        n: usize,
    ) {
        let a_stride = k * 2;
        let y_stride = n * 4;
        for m0 in (0..m_pad).step_by(super::ROWS) {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            let a0 = xb.add(m0 * k / 2);
            let a1 = a0.add(16 * k / 2);
            for s in 0..k / super::DEPTH {
                let b0 = panel.add(s * 2 * 256);
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0.add(s * super::DEPTH / 2),
                    a1 = in(reg) a1.add(s * super::DEPTH / 2),
                    b0 = in(reg) b0,
                    b1 = in(reg) b0.add(256),
                    sa = in(reg) a_stride,
                    sb = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
            let c = y.add(m0 * n);
            asm!(
                "tilestored [{c00} + {s}*1], tmm0",
                "tilestored [{c01} + {s}*1], tmm1",
                "tilestored [{c10} + {s}*1], tmm2",
                "tilestored [{c11} + {s}*1], tmm3",
                c00 = in(reg) c,
                c01 = in(reg) c.add(16),
                c10 = in(reg) c.add(16 * n),
                c11 = in(reg) c.add(16 * n + 16),
                s = in(reg) y_stride,
                options(nostack),
            );
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub(super) fn enable() -> bool {
        false
    }
    pub(super) fn has_avx512_bf16() -> bool {
        false
    }
    pub(super) unsafe fn to_bf16_pairs_avx512(_: &[f32], _: &mut [u32]) {}
    pub(super) unsafe fn configure() {}
    pub(super) unsafe fn release() {}
    pub(super) unsafe fn panel_product(_: *const u32, _: usize, _: usize, _: *const u32, _: *mut f32, _: usize) {
        unreachable!("AMX is never available off x86-64 Linux")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3F80);
        assert_eq!(bf16(-2.0), 0xC000);
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even mantissa (1.0).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3F80);
        // Just above halfway rounds up.
        assert_eq!(bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3F81);
    }

    #[test]
    fn bf16_pairs_match_the_scalar_rounding() {
        // 70 values: two 32-value SIMD steps and a scalar tail; magnitudes from 1e-3 to 1e3.
        let x: Vec<f32> = random(70, 3).iter().enumerate().map(|(i, v)| v * 10f32.powi(i as i32 % 7 - 3)).collect();
        let mut out = vec![0u32; 35];
        to_bf16_pairs(&x, &mut out);
        for (i, p) in out.iter().enumerate() {
            assert_eq!(*p & 0xFFFF, bf16(x[2 * i]) as u32, "value {}", 2 * i);
            assert_eq!(*p >> 16, bf16(x[2 * i + 1]) as u32, "value {}", 2 * i + 1);
        }
    }

    /// Every kernel type and awkward row counts (under one tile, one past a block, not a multiple of 16)
    /// against the f32 product of the same dequantized weights; the bound is bf16's rounding of both
    /// inputs, 2 × 2⁻⁸ relative per product, over `k` products of random signs (√k growth) with margin.
    #[test]
    #[cfg_attr(not(reagent_host_amx), ignore = "this CPU lacks AMX-TILE/AMX-BF16")]
    fn amx_product_matches_f32_on_dequantized_weights() {
        assert!(available(), "the CPU has AMX but Linux did not grant the tile state (or REAGENT_KERNELS caps it)");
        let types = [
            (GgmlDType::Q4_0, 96),
            (GgmlDType::Q4_1, 64),
            (GgmlDType::Q5_0, 160),
            (GgmlDType::Q8_0, 32),
            (GgmlDType::Q4K, 512),
            (GgmlDType::Q5K, 256),
            (GgmlDType::Q6K, 256),
        ];
        for (dtype, k) in types {
            let t = BlockType::of(dtype).unwrap();
            for (n, m) in [(32, 1), (64, 17), (96, 33), (32, 70)] {
                let wf = random(n * k, 7 + n as u64);
                let q = QTensor::quantize(&Tensor::from_vec(wf, (n, k), &Device::Cpu).unwrap(), dtype).unwrap();
                let bytes = q.data().unwrap().to_vec();
                let wd = kernels::dequantize_on(Tier::Scalar, t, &bytes, n, k);
                let x = random(m * k, 99 + m as u64);
                let y = matmul_t(t, &bytes, n, k, &x);
                assert_eq!(y.len(), m * n);
                for i in 0..m {
                    for j in 0..n {
                        let xr = &x[i * k..(i + 1) * k];
                        let wr = &wd[j * k..(j + 1) * k];
                        let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                        let scale: f32 = xr.iter().zip(wr).map(|(a, b)| (a * b).powi(2)).sum::<f32>().sqrt();
                        let got = y[i * n + j];
                        assert!(
                            (got - exact).abs() <= 4.0 * 2f32.powi(-8) * scale + 1e-6,
                            "{dtype:?} {n}×{k}, m={m}, y[{i}][{j}] = {got}, f32 gives {exact}"
                        );
                    }
                }
            }
        }
    }
}
