//! Speculative decoding: drafts from the context verified in one batched pass give the same tokens as
//! decoding one token at a time, free, under a grammar and sampled; the KV cache holds no rejected draft
//! afterwards; the batched pass's logits are the single steps' logits, bit for bit.

mod common;

use candle_core::quantized::GgmlDType;
use common::{tiny_model, ARCHS};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::{Arch, LanguageModel};
use reagent::{generate, GenerateParams, Generation, Grammar, GrammarEngine, LoadOptions, Model, Request, Sampling};

/// A prompt whose continuation the tiny models fall into a loop on: repeats that the lookup drafts.
const PROMPT: &str = "hello world hello world hello world hello";

fn run(model: &mut Model, grammar: Option<&Grammar>, params: &GenerateParams) -> Generation {
    let tok = model.tokenizer().clone();
    let mut ids: Vec<u32> = tok.bos().into_iter().collect();
    ids.extend(tok.encode(PROMPT, false).unwrap());
    let mut constraint = grammar.map(|g| {
        GrammarEngine::new(tok.clone(), model.vocab_size(), model.stop_tokens()).unwrap().constraint(g).unwrap()
    });
    let stops = model.stop_tokens().to_vec();
    model.truncate(0);
    let request = Request::new(&ids).stop_tokens(&stops).constraint(constraint.as_mut());
    generate(model, &tok, request, params, &mut |_| {}).unwrap()
}

/// Generates with and without drafts; asserts the same output, and returns the drafted run.
fn same_with_and_without(arch: Arch, grammar: Option<&Grammar>, params: GenerateParams) -> Generation {
    let mut model = tiny_model(arch);
    let plain = run(&mut model, grammar, &params.clone().speculate(0));
    let plain_cache = model.cache_len();
    let drafted = run(&mut model, grammar, &params.speculate(8));
    assert_eq!(plain.tokens, drafted.tokens, "{arch:?}: drafts changed the output");
    assert_eq!(plain.text, drafted.text);
    assert_eq!(plain.stop, drafted.stop);
    assert_eq!(model.cache_len(), plain_cache, "{arch:?}: the KV cache is left otherwise than without drafts");
    assert_eq!(plain.stats.speculation.drafted, 0);
    drafted
}

#[test]
fn greedy_output_is_the_same_with_drafts_and_takes_fewer_passes() {
    for arch in ARCHS {
        let params = GenerateParams::default().max_tokens(96).ignore_eos(true);
        let g = same_with_and_without(arch, None, params);
        let s = g.stats.speculation;
        assert!(s.accepted > 0, "{arch:?}: no draft accepted ({s:?}): {:?}", g.text);
        assert_eq!(
            s.passes + s.accepted,
            g.tokens.len() - 1,
            "{arch:?}: every token but the first costs a pass or is a draft"
        );
    }
}

#[test]
fn sampled_output_is_the_same_with_drafts_for_the_same_seed() {
    // A low temperature keeps the tiny model in the loops drafts come from; the sampler still draws.
    let sampling = Sampling::Random { temperature: 0.05, top_k: Some(4), top_p: None };
    let mut accepted = 0;
    for seed in [1, 2, 3] {
        let params = GenerateParams::default().max_tokens(64).ignore_eos(true).sampling(sampling).seed(seed);
        accepted += same_with_and_without(Arch::Qwen2, None, params).stats.speculation.accepted;
    }
    assert!(accepted > 0, "no draft was accepted: the test would not see a wrong one");
}

#[test]
fn constrained_output_is_the_same_with_drafts() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 120}, "n": {"type": "integer"}},
        "required": ["text", "n"]
    });
    let grammars = [Grammar::JsonSchema(schema), Grammar::Regex("(hello|world| )+".into())];
    let mut accepted = 0;
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        for g in &grammars {
            let out = same_with_and_without(arch, Some(g), GenerateParams::default().max_tokens(80));
            accepted += out.stats.speculation.accepted;
        }
    }
    assert!(accepted > 0, "no draft was accepted under any grammar: the test would not see a wrong one");
}

#[test]
fn a_generation_continued_from_a_drafted_cache_matches_one_from_a_plain_cache() {
    let params = GenerateParams::default().max_tokens(40).ignore_eos(true);
    let mut outs = Vec::new();
    for k in [0, 8] {
        let mut model = tiny_model(Arch::Qwen2);
        let first = run(&mut model, None, &params.clone().speculate(k));
        let tok = model.tokenizer().clone();
        let mut ids: Vec<u32> = tok.bos().into_iter().collect();
        ids.extend(tok.encode(PROMPT, false).unwrap());
        ids.extend(&first.tokens);
        ids.extend(tok.encode(" world", false).unwrap());
        let cached = model.cache_len();
        let request = Request::new(&ids).cached(cached);
        let second = generate(&mut model, &tok, request, &params.clone().speculate(k), &mut |_| {}).unwrap();
        outs.push((first.tokens, second.tokens));
    }
    assert_eq!(outs[0], outs[1]);
}

/// The tiny models of every architecture, and a llama on Q4_1 weights (rows the mat-vec takes four at a
/// time on AVX-512).
fn models() -> Vec<(String, Model)> {
    let mut models: Vec<(String, Model)> = ARCHS.iter().map(|&a| (format!("{a:?}"), tiny_model(a))).collect();
    let path = common::scratch().join("tiny-llama-q4_1.gguf");
    let spec = TinySpec { weight_type: GgmlDType::Q4_1, ..TinySpec::new(Arch::Llama) };
    write_tiny_gguf(&path, &spec).unwrap();
    models.push(("Llama Q4_1".into(), Model::load(&path, &LoadOptions::default()).unwrap()));
    models
}

#[test]
fn the_batched_pass_gives_each_position_its_single_step_logits() {
    for (arch, mut model) in models() {
        assert!(model.verify_batch() > 1, "{arch}: every model on the CPU has a batched step");
        let tok = model.tokenizer().clone();
        let ids = tok.encode(PROMPT, false).unwrap();
        let (head, tail) = ids.split_at(4);
        model.forward(head, 0).unwrap();
        let all = model.forward_all(tail, head.len()).unwrap();
        let vocab = model.vocab_size();
        assert_eq!(all.len(), tail.len() * vocab);
        for (i, &t) in tail.iter().enumerate() {
            let one = model.forward(&[t], head.len() + i).unwrap();
            let row = &all[i * vocab..(i + 1) * vocab];
            // Bit for bit: the batch's products reduce as the single step's do, so no near tie can go
            // the other way.
            assert!(one == row, "{arch} position {i}: the batched logits differ from the single step's");
        }
    }
}
