//! Every tier the CPU has against the scalar code, and the scalar code against dequantize-then-f32.

use super::*;
use candle_core::quantized::GgmlDType;
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
const MATVEC_SHAPES: [(usize, usize); 8] =
    [(1, 32), (7, 64), (33, 800), (300, 1024), (1, 256), (9, 768), (37, 2304), (6, 256)];

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
                let bound: f32 =
                    deq[r * cols..(r + 1) * cols].iter().enumerate().map(|(i, a)| a.abs() * xq[i / QK].d * 0.5).sum();
                assert!((scalar - exact).abs() <= bound + 1e-4, "{ty:?} row {r}: {scalar} vs {exact} (bound {bound})");
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

/// A short batch (`matvec_tokens_on`, 1 to 9 tokens: every count of the AVX-512 kernels' token chunks, also
/// after a first chunk of 4; row runs ending in 1, 2, 3 or 4 rows) gives each token what its own mat-vec on
/// the same tier gives, bit for bit: speculative decoding checks drafts on these and must pick what one
/// token at a time would.
fn check_tokens(tier: Tier) {
    for (rows, cols) in MATVEC_SHAPES {
        for ty in TYPES {
            let t = BlockType::of(ty).unwrap();
            if cols % t.block_elems() != 0 {
                continue;
            }
            let (w, _) = matrix(ty, rows, cols, rows as u64 * 3 + cols as u64);
            for m in [1, 2, 3, 4, 5, 6, 7, 9] {
                let blocks = cols / QK;
                let mut xq = vec![Q8Block::default(); m * blocks];
                for (c, q) in xq.chunks_exact_mut(blocks).enumerate() {
                    quantize_row_q8_for(t, &random(cols, 40 + c as u64), q);
                }
                let mut y = vec![f32::NAN; m * rows];
                matvec_tokens_on(tier, t, &w, rows, &xq, m, &mut y);
                for (c, (q, yc)) in xq.chunks_exact(blocks).zip(y.chunks_exact(rows)).enumerate() {
                    let mut alone = vec![0f32; rows];
                    matvec_on(tier, t, &w, rows, q, &mut alone);
                    for (r, (a, b)) in yc.iter().zip(&alone).enumerate() {
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{tier:?} {ty:?} {rows}x{cols}, {m} tokens: token {c} row {r}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scalar_short_batches_match_one_matvec_per_token() {
    check_tokens(Tier::Scalar);
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
    check_tokens(tier);
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
    for (n, k, m) in [
        (1, 32, 1),
        (7, 96, 5),
        (33, 256, 4),
        (9, 768, 70),
        (64, 512, 131),
        (5, 4864, 40),
        (6, 800, 8),
        (40, 512, 7),
        (17, 256, 13),
        (18, 896, 10),
    ] {
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
        let (mut simd, mut simd2, mut ints, mut portable) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // SAFETY: AVX-512 (and so AVX2) is present (the build machine has it, and the tests run where they are
        // built); `w` holds `n` rows.
        unsafe {
            avx512::pack_weight_groups(avx2::code(t), w.as_ptr(), w.len() / n, n, k / QK, &mut simd);
            avx2::pack_weight_groups(t, &w, w.len() / n, n, k / QK, false, &mut simd2);
            avx2::pack_weight_groups(t, &w, w.len() / n, n, k / QK, true, &mut ints);
        }
        avx512::pack_weight_groups_portable(t, &w, w.len() / n, n, k / QK, &mut portable);
        let min = t.has_minimum();
        for (i, (((a, a2), b), int)) in simd.iter().zip(&simd2).zip(&portable).zip(&ints).enumerate() {
            assert_eq!((a.u, a.d), (b.u, b.d), "{ty:?} group {i}");
            assert_eq!((a2.u, a2.d, a2.c), (b.u, b.d, b.c), "{ty:?} group {i} (AVX2 packer)");
            if min {
                assert_eq!(a.c, b.c, "{ty:?} group {i}");
            }
            if !matches!(t, BlockType::Q4K | BlockType::Q5K) {
                assert_eq!((int.u, int.d, int.c), (b.u, b.d, b.c), "{ty:?} group {i} (AVX2 packer, float scales)");
                continue;
            }
            // Integer sub-block scales: the super-block's scale times each lane's is the portable lane scale,
            // and both 16-bit halves of a lane hold it.
            assert_eq!((int.u, int.c), (b.u, b.c), "{ty:?} group {i} (integer scales)");
            for l in 0..16 {
                assert_eq!(int.d[l] * int.k[2 * l] as f32, b.d[l], "{ty:?} group {i} lane {l}");
                assert_eq!(int.k[2 * l], int.k[2 * l + 1], "{ty:?} group {i} lane {l}");
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
