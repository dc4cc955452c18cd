//! One decode step (a single token at the end of a 64-token cache) on the CPU: on the real SmolLM2-135M
//! file when it is in the cache (`reagent models fetch smollm2-135m`), and always on a tiny random model.

use candle_core::quantized::GgmlDType;
use criterion::{criterion_group, criterion_main, Criterion};
use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::Arch;
use reagent::{LanguageModel, LoadOptions, Model};

fn step(c: &mut Criterion, name: &str, mut model: Model) {
    let prompt: Vec<u32> = (0..64).map(|i| 100 + i).collect();
    model.forward(&prompt, 0).unwrap();
    c.bench_function(&format!("cpu_decode_step_{name}"), |b| {
        b.iter(|| {
            // Re-run position 64 each time: the cache is truncated back, so every step costs the same.
            model.forward(&[42], 64).unwrap()
        })
    });
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = TinySpec { dim: 256, ffn: 512, layers: 4, weight_type: GgmlDType::Q4_1, ..TinySpec::new(Arch::Llama) };
    write_tiny_gguf(&path, &spec).unwrap();
    step(c, "tiny_llama_q4_1", Model::load(&path, &LoadOptions::default()).unwrap());

    let cat = Catalog::builtin();
    if let Some(p) = cat.get("smollm2-135m").and_then(|e| catalog::locate(e, &FetchOptions::default())) {
        step(c, "smollm2_135m", Model::load(&p, &LoadOptions::default()).unwrap());
    } else {
        eprintln!("smollm2-135m not in the cache; run `reagent models fetch smollm2-135m` to bench it");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
