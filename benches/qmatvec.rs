//! Quantized matrix × vector (decode) and matrix × matrix (prefill) on the CPU, for each quantization type
//! of the catalogue's files, at the shapes of SmolLM2-135M (576 → 1536), Qwen2.5-0.5B (896 → 4864) and
//! Qwen2.5-1.5B (1536 → 8960):
//! reagent's own kernels (`cpu_reagent_matvec`, every tier the CPU supports; `cpu_reagent_tokens`, a short
//! batch in one pass against a mat-vec per token; `cpu_reagent_prefill`, AMX
//! bf16 tiles and the integer prefill of each tier against dequantize + f32 GEMM) and candle's (`cpu_qmatvec`).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use reagent::model::amx;
use reagent::model::kernels::{self, BlockType, Q8Block, Tier};

fn random(shape: (usize, usize), seed: u64) -> Tensor {
    let mut s = seed;
    let n = shape.0 * shape.1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

fn reagent_kernels(c: &mut Criterion) {
    let types = kernels::KERNEL_TYPES;
    // SmolLM2's and Qwen 0.5B's up projections, Qwen 0.5B's down projection (K-quants need k % 256 == 0),
    // Qwen 1.5B's up and down projections (matrices larger than the caches).
    for (k, n) in [(576usize, 1536usize), (896, 4864), (4864, 896), (1536, 8960), (8960, 1536)] {
        let mut g = c.benchmark_group(format!("cpu_reagent_matvec_{k}x{n}"));
        g.throughput(Throughput::Elements((k * n) as u64));
        for ty in types {
            let t = BlockType::of(ty).unwrap();
            if k % t.block_elems() != 0 {
                continue;
            }
            let q = QTensor::quantize(&random((n, k), 1), ty).unwrap();
            let w = q.data().unwrap().into_owned();
            let x = random((1, k), 2).flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut xq = vec![Q8Block::default(); k / kernels::QK];
            kernels::quantize_row_q8_for(t, &x, &mut xq);
            let mut y = vec![0f32; n];
            for tier in Tier::supported() {
                g.bench_function(BenchmarkId::new(format!("{tier:?}"), format!("{ty:?}")), |b| {
                    b.iter(|| kernels::matvec_on(tier, t, &w, n, &xq, &mut y))
                });
            }
        }
        g.finish();
    }
    // Short batches (forced tokens): one pass over the matrix for all the tokens, against one mat-vec per
    // token, at Qwen 1.5B's up projection. Throughput counts multiply-adds. The 7.7 MB matrix stays in a
    // large L3 between the per-token passes, so this measures the work per byte; in a model, where every
    // matrix comes from memory, the per-token passes also read it `m` times.
    let (k, n) = (1536usize, 8960usize);
    for m in [2usize, 4] {
        let mut g = c.benchmark_group(format!("cpu_reagent_tokens_{m}x{k}x{n}"));
        g.throughput(Throughput::Elements((m * k * n) as u64));
        g.sample_size(20);
        for ty in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let t = BlockType::of(ty).unwrap();
            let w = QTensor::quantize(&random((n, k), 6), ty).unwrap().data().unwrap().into_owned();
            let x = random((m, k), 7).flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut xq = vec![Q8Block::default(); m * k / kernels::QK];
            for (xr, q) in x.chunks_exact(k).zip(xq.chunks_exact_mut(k / kernels::QK)) {
                kernels::quantize_row_q8_for(t, xr, q);
            }
            let mut y = vec![0f32; m * n];
            for tier in Tier::supported() {
                g.bench_function(BenchmarkId::new(format!("{tier:?}"), format!("{ty:?}")), |b| {
                    b.iter(|| kernels::matvec_tokens_on(tier, t, &w, n, &xq, m, &mut y))
                });
                g.bench_function(BenchmarkId::new(format!("{tier:?}_per_token"), format!("{ty:?}")), |b| {
                    b.iter(|| {
                        for (q, yc) in xq.chunks_exact(k / kernels::QK).zip(y.chunks_exact_mut(n)) {
                            kernels::matvec_on(tier, t, &w, n, q, yc);
                        }
                    })
                });
            }
        }
        g.finish();
    }

    // Prefill dequantizes each matrix to f32 before the GEMM.
    let (k, n) = (4864usize, 896usize);
    let mut g = c.benchmark_group(format!("cpu_reagent_dequantize_{k}x{n}"));
    g.throughput(Throughput::Elements((k * n) as u64));
    for ty in types {
        let t = BlockType::of(ty).unwrap();
        let w = QTensor::quantize(&random((n, k), 3), ty).unwrap().data().unwrap().into_owned();
        for tier in Tier::supported() {
            g.bench_function(BenchmarkId::new(format!("{tier:?}"), format!("{ty:?}")), |b| {
                b.iter(|| kernels::dequantize_on(tier, t, &w, n, k))
            });
        }
    }
    g.finish();

    // Prefill of a 512-token batch (and a 16-token one): the AMX bf16 path where the CPU has it and the
    // integer prefill on every tier that has one, against dequantizing to f32 and candle's GEMM.
    // Throughput counts multiply-adds.
    for (k, n) in [(896usize, 4864usize), (4864, 896)] {
        for m in [16usize, 512] {
            let mut g = c.benchmark_group(format!("cpu_reagent_prefill_{m}x{k}x{n}"));
            g.throughput(Throughput::Elements((m * k * n) as u64));
            g.sample_size(10);
            let x = random((m, k), 4);
            let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for ty in types {
                let t = BlockType::of(ty).unwrap();
                if k % t.block_elems() != 0 {
                    continue;
                }
                let w = QTensor::quantize(&random((n, k), 5), ty).unwrap().data().unwrap().into_owned();
                if amx::available() && amx::supports(t, n, k) {
                    g.bench_function(BenchmarkId::new("amx_bf16", format!("{ty:?}")), |b| {
                        b.iter(|| amx::matmul_t(t, &w, n, k, &xs))
                    });
                }
                for tier in Tier::supported().into_iter().filter(|&tier| tier != Tier::Scalar) {
                    if tier == Tier::Avx2 && t == BlockType::Q8_0 {
                        continue; // no AVX2 integer kernel for Q8_0: it takes the f32 GEMM
                    }
                    g.bench_function(BenchmarkId::new(format!("int8_{}", tier.name()), format!("{ty:?}")), |b| {
                        b.iter(|| kernels::matmul_on(tier, t, &w, n, k, &xs))
                    });
                }
                g.bench_function(BenchmarkId::new("f32_gemm", format!("{ty:?}")), |b| {
                    b.iter(|| {
                        let wf = Tensor::from_vec(kernels::dequantize(t, &w, n, k), (n, k), &Device::Cpu).unwrap();
                        x.matmul(&wf.t().unwrap()).unwrap()
                    })
                });
            }
            g.finish();
        }
    }
}

fn bench(c: &mut Criterion) {
    let types = kernels::KERNEL_TYPES;
    for (k, n) in [(576usize, 1536usize), (896, 4864)] {
        let mut g = c.benchmark_group(format!("cpu_qmatvec_{k}x{n}"));
        g.throughput(Throughput::Elements((k * n) as u64));
        for ty in types {
            if k % ty.block_size() != 0 {
                continue;
            }
            let w = QMatMul::from_qtensor(QTensor::quantize(&random((n, k), 1), ty).unwrap()).unwrap();
            let x = random((1, k), 2);
            g.bench_with_input(BenchmarkId::new("decode", format!("{ty:?}")), &x, |b, x| {
                b.iter(|| w.forward(x).unwrap())
            });
            let xs = random((64, k), 3);
            g.bench_with_input(BenchmarkId::new("prefill64", format!("{ty:?}")), &xs, |b, x| {
                b.iter(|| w.forward(x).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, reagent_kernels, bench);
criterion_main!(benches);
