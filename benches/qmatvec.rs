//! Quantized matrix × vector (decode) and matrix × matrix (prefill) on the CPU, for each quantization type
//! of the catalogue's files, at the shapes of SmolLM2-135M (576 → 1536) and Qwen2.5-0.5B (896 → 4864).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

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

fn bench(c: &mut Criterion) {
    let types = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];
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

criterion_group!(benches, bench);
criterion_main!(benches);
