//! The quantized kernels against the f32 reference forward (`LoadOptions::f32_reference`: every product
//! in f32 on the same dequantized weights) on the catalogue's real files.
//!
//! The intended differences are roundings of the inputs of each product: in decode, activations to 8 bits
//! (per 32 elements, or per 256 for K-quant matrices, as llama.cpp rounds): at most half a step, 1/254 of
//! the block's largest value, per element; in prefill the same 8-bit rounding on the AVX-512 tier (the
//! integer prefill), and on CPUs with AMX weights and activations to bf16 (at most 2⁻⁹ relative, per
//! element; sums stay f32). Through 18–30 layers those roundings compound;
//! measured on a 20-token prompt and 12 decode steps, the logits differ from the reference by at most 2.6%
//! (Qwen 0.5B), 7% (SmolLM2) and 9% (Gemma 3) RMS of their spread (2.1%, 8% and 10% with an f32 prefill;
//! 2.6%, 11% and 10% with the integer prefill). A kernel bug is of another order: giving the 8
//! activation blocks of a K-quant super-block the first block's scale (a real mistake made while writing
//! these kernels) puts Qwen 0.5B's logits 57% off at the first decode step. So: the relative RMS
//! difference must stay under 20%, and wherever the reference's best token leads the runner-up by a clear
//! margin (1.5 logits), the kernels must pick it. Very short contexts are left out: with 6 tokens Gemma 3
//! is chaotic (a near tie at the third step sends the two forwards 50% apart even with the same tokens).

mod common;

use reagent::{LanguageModel, LoadOptions, Model};

/// RMS of `a − b` over the RMS spread of `b` around its mean.
fn relative_rms(a: &[f32], b: &[f32]) -> f32 {
    let mean = b.iter().sum::<f32>() / b.len() as f32;
    let diff: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let spread: f32 = b.iter().map(|y| (y - mean).powi(2)).sum();
    (diff / spread).sqrt()
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0
}

fn margin(v: &[f32]) -> f32 {
    let best = argmax(v);
    let second = v.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, x)| *x).fold(f32::MIN, f32::max);
    v[best] - second
}

/// A batched prefill (AMX bf16 tiles where the CPU has them, the integer prefill on AVX-512, else dequantize +
/// f32 GEMM; the reference always the latter; the last position's head through the mat-vec kernel),
/// then 12 decode steps (the mat-vec kernels) fed with the reference's greedy tokens.
fn compare(path: std::path::PathBuf) {
    let opts = LoadOptions::default().max_context(Some(512));
    let mut quant = Model::load(&path, &opts).unwrap();
    let mut reference = Model::load(&path, &opts.f32_reference(true)).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. In the beginning the universe was created, and";
    let prompt = quant.tokenizer().encode(text, true).unwrap();
    assert!(prompt.len() >= 16, "the prompt must take the batched path");
    let mut worst = 0f32;
    let mut clear = 0;
    let mut q = quant.forward(&prompt, 0).unwrap();
    let mut r = reference.forward(&prompt, 0).unwrap();
    for (step, pos) in (prompt.len()..prompt.len() + 12).enumerate() {
        let rel = relative_rms(&q, &r);
        worst = worst.max(rel);
        assert!(rel < 0.2, "{path:?} step {step}: logits differ by {:.1}% RMS", rel * 100.0);
        if margin(&r) > 1.5 {
            clear += 1;
            assert_eq!(argmax(&q), argmax(&r), "{path:?} step {step}: a clear greedy choice changed");
        }
        let next = argmax(&r) as u32;
        q = quant.forward(&[next], pos).unwrap();
        r = reference.forward(&[next], pos).unwrap();
    }
    eprintln!("{path:?}: worst relative RMS {:.2}%, {clear} clear greedy choices kept", worst * 100.0);
}

#[test]
fn smollm2_q4_1_matches_the_f32_reference() {
    compare(common::real_model_path("smollm2-135m"));
}

#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn qwen_q5_0_q4_k_q6_k_q8_0_match_the_f32_reference() {
    compare(common::require_model("qwen2.5-coder-0.5b"));
}

#[test]
#[cfg_attr(
    not(reagent_test_gemma),
    ignore = "needs gemma3-270m: build the tests with REAGENT_TEST_MODELS=gemma3-270m (or all)"
)]
fn gemma3_matches_the_f32_reference() {
    compare(common::require_model("gemma3-270m"));
}

/// The batched prefill against the same prompt fed one token at a time (the mat-vec kernels): on the
/// integer prefill both round the activations to 8 bits the same way and only summation order differs,
/// but the rounding is a step function, so a last-bit difference upstream can move a value to the next
/// step; measured: 2.2% (Qwen 0.5B) and 4.0% (SmolLM2) RMS (2.7% and 3.2% against an f32 prefill). A
/// kernel bug is of another order (see the header), so the bound is the same 20%.
fn prefill_matches_stepwise(path: std::path::PathBuf) -> f32 {
    let opts = LoadOptions::default().max_context(Some(512));
    let mut batched = Model::load(&path, &opts).unwrap();
    let mut stepwise = Model::load(&path, &opts).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. In the beginning the universe was created, and";
    let prompt = batched.tokenizer().encode(text, true).unwrap();
    let a = batched.forward(&prompt, 0).unwrap();
    let mut b = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        b = stepwise.forward(&[t], pos).unwrap();
    }
    let rel = relative_rms(&a, &b);
    eprintln!("{path:?}: batched vs stepwise {:.3}% RMS ({})", rel * 100.0, reagent::model::prefill_kernel());
    rel
}

#[test]
fn smollm2_batched_prefill_matches_stepwise_decode() {
    let rel = prefill_matches_stepwise(common::real_model_path("smollm2-135m"));
    assert!(rel < 0.2);
}

#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn qwen_batched_prefill_matches_stepwise_decode() {
    assert!(prefill_matches_stepwise(common::require_model("qwen2.5-coder-0.5b")) < 0.2);
}

#[test]
#[cfg_attr(
    not(reagent_test_gemma),
    ignore = "needs gemma3-270m: build the tests with REAGENT_TEST_MODELS=gemma3-270m (or all)"
)]
fn gemma3_batched_prefill_matches_stepwise_decode() {
    assert!(prefill_matches_stepwise(common::require_model("gemma3-270m")) < 0.2);
}
