//! Hermetic model tests on tiny random-weight GGUF files written by the tests: loading each architecture,
//! the forward pass, KV-cache truncation, deterministic generation and clear errors for bad files.

mod common;

use common::{scratch, tiny_model, tiny_path, ARCHS};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::Arch;
use reagent::{generate, ChatMessage, FinishReason, GenerateParams, LanguageModel, LoadOptions, Model, Sampling};

#[test]
fn every_architecture_loads_and_gives_finite_logits() {
    for arch in ARCHS {
        let mut m = tiny_model(arch);
        assert_eq!(m.info().arch, arch);
        let vocab = m.tokenizer().vocab_size();
        assert_eq!(m.vocab_size(), vocab, "{arch:?}");
        let ids = m.tokenizer().encode("hello world", false).unwrap();
        let logits = m.forward(&ids, 0).unwrap();
        assert_eq!(logits.len(), vocab, "{arch:?}");
        assert!(logits.iter().all(|x| x.is_finite()), "{arch:?}");
        assert_eq!(m.cache_len(), ids.len());
        // Not all equal: the weights do something.
        let (lo, hi) = logits.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(hi - lo > 1e-3, "{arch:?}: flat logits");
    }
}

/// A decode step reads every matrix and norm once and one row of the embedding, so `bench`'s bandwidth
/// counts the embedding only where the output layer is the embedding (llama's tiny file ties them, qwen2's
/// has its own `output.weight`). Counted by hand for the tiny files (64 wide, 2 layers, Q8_0 matrices:
/// 34 bytes per 32 weights; f32 norms and biases).
#[test]
fn decode_bytes_count_each_matrix_once_and_the_embedding_when_tied() {
    let q8 = |rows: u64, cols: u64| rows * cols / 32 * 34;
    // Norms, q/o 64×64, k/v 32×64, gate/up 128×64, down 64×128 per layer; the final norm.
    let layer = 2 * 64 * 4 + 2 * q8(64, 64) + 2 * q8(32, 64) + 3 * q8(128, 64);
    let blocks = 2 * layer + 64 * 4;
    let llama = tiny_model(Arch::Llama);
    let vocab = llama.vocab_size() as u64;
    assert_eq!(llama.info().decode_bytes_per_token, blocks + q8(vocab, 64));
    // Qwen2: q/k/v biases (64 + 32 + 32 f32 a layer) and the output matrix instead of the embedding.
    let qwen = tiny_model(Arch::Qwen2);
    assert_eq!(qwen.info().decode_bytes_per_token, blocks + 2 * 128 * 4 + q8(qwen.vocab_size() as u64, 64));
}

#[test]
fn truncating_the_cache_and_rerunning_matches_a_fresh_run_bit_for_bit() {
    for arch in ARCHS {
        let mut a = tiny_model(arch);
        let prefix: Vec<u32> = (10..30).collect();
        a.forward(&prefix, 0).unwrap();
        // Go down a branch, then roll it back.
        a.forward(&[40, 41, 42], prefix.len()).unwrap();
        a.forward(&[43], prefix.len() + 3).unwrap();
        a.truncate(prefix.len());
        assert_eq!(a.cache_len(), prefix.len());
        let after_rollback_batch = a.forward(&[50, 51], prefix.len()).unwrap();
        let after_rollback_step = a.forward(&[52], prefix.len() + 2).unwrap();

        let mut b = tiny_model(arch);
        b.forward(&prefix, 0).unwrap();
        let fresh_batch = b.forward(&[50, 51], prefix.len()).unwrap();
        let fresh_step = b.forward(&[52], prefix.len() + 2).unwrap();
        assert!(bits_equal(&after_rollback_batch, &fresh_batch), "{arch:?}: batch logits differ");
        assert!(bits_equal(&after_rollback_step, &fresh_step), "{arch:?}: step logits differ");
    }
}

#[test]
fn forward_at_an_earlier_position_drops_the_rest_of_the_cache() {
    let mut m = tiny_model(Arch::Qwen2);
    let first = m.forward(&[5, 6, 7], 0).unwrap();
    m.forward(&[8, 9], 3).unwrap();
    // Re-running from position 0 must equal the first call: positions 0.. are replaced, not appended.
    let again = m.forward(&[5, 6, 7], 0).unwrap();
    assert!(bits_equal(&first, &again));
    assert_eq!(m.cache_len(), 3);
}

#[test]
fn weights_copied_to_huge_pages_give_the_same_logits_as_the_files_map() {
    // Whether the kernel grants huge pages is its choice (`info().huge_pages` says); the copy must read the
    // same bytes either way.
    for arch in ARCHS {
        let ids: Vec<u32> = (20..40).collect();
        let load = |huge_pages| Model::load(tiny_path(arch), &LoadOptions::default().huge_pages(huge_pages));
        let (mut copied, mut mapped) = (load(true).unwrap(), load(false).unwrap());
        assert!(!mapped.info().huge_pages);
        assert_eq!(copied.forward(&ids, 0).unwrap(), mapped.forward(&ids, 0).unwrap(), "{arch:?}");
        assert_eq!(copied.forward(&[7], ids.len()).unwrap(), mapped.forward(&[7], ids.len()).unwrap(), "{arch:?}");
    }
}

#[test]
fn incremental_decode_matches_one_shot_prefill() {
    // Feeding tokens one at a time must agree with one batched forward. They are not bit-equal: the
    // kernels round activations to 8 bits (error ~1/256 of each block's largest value, compounded over
    // the layers) in a different order per path, and the AMX path rounds weights to bf16. 3% of the logit
    // range bounds that; a wrong mask, rope position or cache slot gives errors of its order. 3 tokens run
    // as a short batch (one pass over each matrix for all of them), 40 through the batched product.
    for (arch, n) in ARCHS.into_iter().flat_map(|a| [(a, 3u32), (a, 40)]) {
        let ids: Vec<u32> = (20..20 + n).collect();
        let mut a = tiny_model(arch);
        let batch = a.forward(&ids, 0).unwrap();
        let mut b = tiny_model(arch);
        let mut step = Vec::new();
        for (i, &t) in ids.iter().enumerate() {
            step = b.forward(&[t], i).unwrap();
        }
        let max_diff = batch.iter().zip(&step).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        let (lo, hi) = batch.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(max_diff < 0.03 * (hi - lo), "{arch:?} {n} tokens: max |diff| {max_diff}, range {}", hi - lo);
    }
}

#[test]
fn bad_positions_and_tokens_are_errors_not_panics() {
    let mut m = tiny_model(Arch::Llama);
    let err = m.forward(&[1], 5).unwrap_err().to_string();
    assert!(err.contains("position 5") && err.contains("holds only 0"), "{err}");
    let err = m.forward(&[], 0).unwrap_err().to_string();
    assert!(err.contains("no tokens"), "{err}");
    let err = m.forward(&[1_000_000], 0).unwrap_err().to_string();
    assert!(err.contains("1000000") && err.contains("outside the vocabulary"), "{err}");
    let too_long: Vec<u32> = vec![3; m.context_length() + 1];
    let err = m.forward(&too_long, 0).unwrap_err().to_string();
    assert!(err.contains("context overflow"), "{err}");
}

#[test]
fn an_empty_prompt_is_refused_by_name() {
    let mut m = tiny_model(Arch::Qwen2);
    let tok = m.tokenizer().clone();
    let params = GenerateParams::default().max_tokens(4);
    let err = generate(&mut m, &tok, reagent::Request::new(&[]), &params, &mut |_| {}).unwrap_err();
    assert!(matches!(err, reagent::Error::EmptyPrompt), "{err}");
}

#[test]
fn greedy_generation_is_deterministic_and_seeded_sampling_reproducible() {
    for arch in ARCHS {
        let mut m = tiny_model(arch);
        let tok = m.tokenizer().clone();
        let prompt = tok.encode("hello world", false).unwrap();
        let params = GenerateParams::default().max_tokens(12).ignore_eos(true);
        let a = generate(&mut m, &tok, reagent::Request::new(&prompt), &params, &mut |_| {}).unwrap();
        let b = generate(&mut m, &tok, reagent::Request::new(&prompt), &params, &mut |_| {}).unwrap();
        assert_eq!(a.tokens, b.tokens, "{arch:?}");
        assert_eq!(a.tokens.len(), 12);
        assert_eq!(a.stop, FinishReason::MaxTokens);

        let mut sampled = |seed| {
            let p = params.clone().sampling(Sampling::Random { temperature: 1.0, top_k: None, top_p: None }).seed(seed);
            generate(&mut m, &tok, reagent::Request::new(&prompt), &p, &mut |_| {}).unwrap().tokens
        };
        let (x, y) = (sampled(3), sampled(3));
        assert_eq!(x, y, "{arch:?}");
    }
}

#[test]
fn streamed_text_equals_the_returned_text_and_stop_strings_cut_it() {
    let mut m = tiny_model(Arch::Llama);
    let tok = m.tokenizer().clone();
    let prompt = tok.encode("hello", false).unwrap();
    let params = GenerateParams::default().max_tokens(30).ignore_eos(true);
    let mut streamed = String::new();
    let full = generate(&mut m, &tok, reagent::Request::new(&prompt), &params, &mut |t| streamed.push_str(t)).unwrap();
    assert_eq!(streamed, full.text);
    // Stop on a piece of the text generated above: the result ends right before it.
    let chars: Vec<char> = full.text.chars().collect();
    if chars.len() >= 6 {
        let stop: String = chars[3..5].iter().collect();
        let cut = full.text.find(&stop).unwrap();
        let p = params.clone().stop_strings(vec![stop.clone()]);
        let mut streamed = String::new();
        let g = generate(&mut m, &tok, reagent::Request::new(&prompt), &p, &mut |t| streamed.push_str(t)).unwrap();
        assert_eq!(g.text, full.text[..cut]);
        assert_eq!(streamed, g.text);
        assert_eq!(g.stop, FinishReason::StopString { stop });
    }
}

#[test]
fn stop_tokens_end_generation() {
    let mut m = tiny_model(Arch::Qwen2);
    let tok = m.tokenizer().clone();
    let prompt = tok.encode("hello", false).unwrap();
    let params = GenerateParams::default().max_tokens(5).ignore_eos(true);
    let free = generate(&mut m, &tok, reagent::Request::new(&prompt), &params, &mut |_| {}).unwrap();
    // Declaring the first greedy token a stop token ends generation before it.
    let first = free.tokens[0];
    let g = generate(
        &mut m,
        &tok,
        reagent::Request::new(&prompt).stop_tokens(&[first]),
        &params.ignore_eos(false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(g.stop, FinishReason::StopToken { token: first });
    assert!(g.tokens.is_empty());
}

#[test]
fn chat_templates_render_with_stop_tokens_from_metadata() {
    let m = tiny_model(Arch::Qwen2);
    let text =
        m.chat_template().render(&[ChatMessage::system("Be brief."), ChatMessage::user("hi")], true, None).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let im_end = m.tokenizer().token_id("<|im_end|>").unwrap();
    assert!(m.stop_tokens().contains(&im_end));

    // gemma3 files without a template get Gemma's turn format; <end_of_turn> stops.
    let g = tiny_model(Arch::Gemma3);
    let text =
        g.chat_template().render(&[ChatMessage::system("Be brief."), ChatMessage::user("hi")], true, None).unwrap();
    assert_eq!(text, "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n");
    let eot = g.tokenizer().token_id("<end_of_turn>").unwrap();
    assert!(g.stop_tokens().contains(&eot));
    let ids = g.tokenizer().encode(&text, true).unwrap();
    assert_eq!(ids[0], g.tokenizer().bos().unwrap());
}

/// A chat template comes inside the model file, so it is untrusted: a loop bomb runs out of fuel and is
/// an error; a real template with a hundred tools renders well within the same budget.
#[test]
fn template_loop_bombs_are_errors() {
    let m = tiny_model(Arch::Qwen2);
    let bomb = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
    let t = reagent::ChatTemplate::new(bomb, m.tokenizer()).unwrap();
    let err = t.render(&[ChatMessage::user("hi")], true, None).unwrap_err().to_string();
    assert!(err.contains("fuel"), "{err}");

    // The shape of Qwen 2.5's: the tools as JSON lines in the system turn, then the messages.
    let qwen = "<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n\
                {% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
                {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let t = reagent::ChatTemplate::new(qwen, m.tokenizer()).unwrap();
    let tools: Vec<serde_json::Value> = (0..100)
        .map(|i| {
            serde_json::json!({"type": "function", "function": {"name": format!("tool_{i}"), "description": "d",
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}})
        })
        .collect();
    let text = t.render(&[ChatMessage::user("hi")], true, Some(&serde_json::Value::Array(tools))).unwrap();
    assert!(text.contains("tool_99"));
}

// ---- bad files ----------------------------------------------------------------------------------------

fn load_err(path: &std::path::Path) -> String {
    match Model::load(path, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_truncated_file_names_the_file_and_the_cut_tensor() {
    let bytes = std::fs::read(tiny_path(Arch::Llama)).unwrap();
    let path = scratch().join("truncated.gguf");
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let err = load_err(&path);
    assert!(err.contains("truncated.gguf") && err.contains("truncated") && err.contains("tensor `"), "{err}");
    // Cut inside the header too.
    std::fs::write(&path, &bytes[..100]).unwrap();
    let err = load_err(&path);
    assert!(err.contains("truncated.gguf") && err.contains("not a valid GGUF"), "{err}");
}

#[test]
fn wrong_magic_and_empty_files_are_rejected() {
    let path = scratch().join("magic.gguf");
    std::fs::write(&path, b"GGML\x03\x00\x00\x00rest of the file").unwrap();
    let err = load_err(&path);
    assert!(err.contains("magic.gguf") && err.contains("bad magic"), "{err}");
    std::fs::write(&path, b"").unwrap();
    let err = load_err(&path);
    assert!(err.contains("magic.gguf") && err.contains("0 bytes"), "{err}");
    let err = load_err(&scratch().join("does-not-exist.gguf"));
    assert!(err.contains("does-not-exist.gguf"), "{err}");
}

/// Rewrites one metadata string of the tiny llama file in place (same length keeps offsets valid).
fn patched(from: &str, to: &str, name: &str) -> std::path::PathBuf {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(tiny_path(Arch::Llama)).unwrap();
    let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("string present");
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
    let path = scratch().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn unknown_architecture_is_named() {
    // "general.architecture" = "llama" → "llamb"; the arch-prefixed keys still say llama.
    let path = patched("\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0mamba", "arch.gguf");
    let err = load_err(&path);
    assert!(err.contains("arch.gguf") && err.contains("unsupported architecture `mamba`"), "{err}");
}

#[test]
fn missing_metadata_is_named() {
    let path = patched("llama.block_count", "llama.block_cnt__", "meta.gguf");
    let err = load_err(&path);
    assert!(err.contains("meta.gguf") && err.contains("llama.block_count") && err.contains("missing"), "{err}");
}

#[test]
fn missing_tensor_is_named() {
    let path = patched("blk.1.ffn_up.weight", "blk.1.ffn_uq.weight", "tensor.gguf");
    let err = load_err(&path);
    assert!(err.contains("tensor.gguf") && err.contains("blk.1.ffn_up.weight") && err.contains("missing"), "{err}");
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// RMS of `a − b` over the RMS spread of `b` around its mean.
fn relative_rms(a: &[f32], b: &[f32]) -> f32 {
    let mean = b.iter().sum::<f32>() / b.len() as f32;
    let diff: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let spread: f32 = b.iter().map(|y| (y - mean).powi(2)).sum();
    (diff / spread).sqrt()
}

/// Every weight type reagent's kernels handle, in a whole forward pass: a 256-wide llama whose layers are
/// all of one type (the K-quants need rows of 256), a 40-token prefill (the batched path: AMX where the
/// CPU has it, else the integer tiles or f32 GEMM), 8 decode steps (the mat-vec kernels) and a 3-token
/// batch (the short-batch mat-vec), against the f32 reference on the
/// same weights. Measured: at most about 1% relative RMS; a misplaced bit or scale in one type's kernel
/// (say Q5_K's fifth bit read from the wrong position) puts that type's logits tens of percent off.
#[test]
fn every_kernel_type_matches_the_f32_reference_in_a_forward_pass() {
    for ty in reagent::model::kernels::KERNEL_TYPES {
        let spec = TinySpec { dim: 256, ffn: 512, weight_type: ty, ..TinySpec::new(Arch::Llama) };
        let path = scratch().join(format!("tiny-256-{ty:?}.gguf"));
        write_tiny_gguf(&path, &spec).unwrap();
        let mut quant = Model::load(&path, &LoadOptions::default()).unwrap();
        let mut reference = Model::load(&path, &LoadOptions::default().f32_reference(true)).unwrap();
        let prompt: Vec<u32> = (20..60).collect();
        let mut q = quant.forward(&prompt, 0).unwrap();
        let mut r = reference.forward(&prompt, 0).unwrap();
        let mut worst = 0f32;
        for pos in prompt.len()..prompt.len() + 8 {
            let rel = relative_rms(&q, &r);
            worst = worst.max(rel);
            assert!(rel < 0.05, "{ty:?} at position {pos}: logits {:.1}% RMS off the f32 reference", rel * 100.0);
            let next = (pos % 50 + 20) as u32;
            q = quant.forward(&[next], pos).unwrap();
            r = reference.forward(&[next], pos).unwrap();
        }
        // A short batch (forced tokens): one pass over each matrix for all three.
        let at = prompt.len() + 8;
        let (q, r) = (quant.forward(&[21, 22, 23], at).unwrap(), reference.forward(&[21, 22, 23], at).unwrap());
        let rel = relative_rms(&q, &r);
        worst = worst.max(rel);
        assert!(rel < 0.05, "{ty:?}, a 3-token batch: logits {:.1}% RMS off the f32 reference", rel * 100.0);
        eprintln!("{ty:?}: worst relative RMS {:.2}%", worst * 100.0);
    }
}

/// Crafted metadata that used to panic or abort (an SPM score list shorter than the vocabulary, a zero
/// alignment that candle divides by, a block count sized like an attack) is a one-line error naming the
/// file and the key.
#[test]
fn crafted_metadata_is_an_error_not_a_crash() {
    use candle_core::quantized::gguf_file::Value;

    let cases: [(Arch, &str, Value, &str); 6] = [
        (Arch::Gemma3, "tokenizer.ggml.scores", Value::Array(vec![Value::F32(0.0); 3]), "3 entries"),
        // Rotary scaling that is not implemented is refused, not ignored (positions would be wrong).
        (Arch::Llama, "llama.rope.scaling.type", Value::String("yarn".into()), "`yarn` scaling is not supported"),
        (Arch::Qwen3, "qwen3.rope.scaling.type", Value::String("llama3".into()), "qwen3.rope.scaling.type"),
        (Arch::Llama, "general.alignment", Value::U32(0), "general.alignment"),
        (Arch::Llama, "llama.block_count", Value::U32(u32::MAX), "llama.block_count"),
        (Arch::Llama, "llama.block_count", Value::U64(1 << 40), "llama.block_count"),
    ];
    for (i, (arch, key, value, needle)) in cases.into_iter().enumerate() {
        let path = scratch().join(format!("crafted-{i}.gguf"));
        let spec = TinySpec { metadata: vec![(key.to_string(), value)], ..TinySpec::new(arch) };
        write_tiny_gguf(&path, &spec).unwrap();
        let err = load_err(&path);
        assert!(err.contains(&format!("crafted-{i}.gguf")) && err.contains(needle), "{key}: {err}");
    }
}

/// SmolLM3's fourth layers attend without rotary positions: with the same weights as a llama file its
/// logits differ, and its host decode step agrees with its batched pass (both skip the rotation there).
#[test]
fn smollm3_skips_rotary_positions_in_every_fourth_layer() {
    let write = |arch: Arch| {
        let path = scratch().join(format!("four-layers-{}.gguf", arch.as_str()));
        write_tiny_gguf(&path, &TinySpec { layers: 4, ..TinySpec::new(arch) }).unwrap();
        Model::load(&path, &LoadOptions::default()).unwrap()
    };
    let ids: Vec<u32> = (20..44).collect();
    let (mut smol, mut llama) = (write(Arch::SmolLM3), write(Arch::Llama));
    let a = smol.forward(&ids, 0).unwrap();
    assert!(!bits_equal(&a, &llama.forward(&ids, 0).unwrap()), "the fourth layer is rotated");
    let mut stepped = write(Arch::SmolLM3);
    let mut last = Vec::new();
    for (i, &t) in ids.iter().enumerate() {
        last = stepped.forward(&[t], i).unwrap();
    }
    let max_diff = a.iter().zip(&last).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    assert!(max_diff < 0.03 * (hi - lo), "step against batch: {max_diff} of {}", hi - lo);
}
