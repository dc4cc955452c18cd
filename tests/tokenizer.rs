//! Tokenizer tests: the tiny vocabularies (hermetic), then llama.cpp's own ids for the real files
//! (`tests/data/tokenizer/*.json`), with special tokens parsed and not parsed.

mod common;

use common::{real_model_path, require_model, tiny_model};
use reagent::gguf::GgufFile;
use reagent::model::Arch;
use reagent::Tokenizer;
use serde::Deserialize;

#[test]
fn tiny_bpe_applies_merges_and_round_trips() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let m = tiny_model(arch);
        let t = m.tokenizer();
        let ids = t.encode("hello world", false).unwrap();
        let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
        assert_eq!(texts, ["hello", "\u{120}world"], "{arch:?}");
        for s in ["hello world", "  x\ty\n\nz  ", "café 🤖 中文", "12345", ""] {
            let ids = t.encode(s, false).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), s, "{arch:?} {s:?}");
        }
    }
}

#[test]
fn control_tokens_are_parsed_only_when_asked_and_user_defined_always() {
    let m = tiny_model(Arch::Qwen2);
    let t = m.tokenizer();
    let im_end = t.token_id("<|im_end|>").unwrap();
    let tool_call = t.token_id("<tool_call>").unwrap();
    assert_eq!(t.encode("<|im_end|>", true).unwrap(), [im_end]);
    let as_text = t.encode("<|im_end|>", false).unwrap();
    assert!(!as_text.contains(&im_end) && as_text.len() > 1, "{as_text:?}");
    assert_eq!(t.decode(&as_text, false).unwrap(), "<|im_end|>");
    assert_eq!(t.encode("<tool_call>", false).unwrap(), [tool_call]);
    assert_eq!(t.encode("<tool_call>", true).unwrap(), [tool_call]);
    // Decoding drops control tokens unless asked to show them.
    let ids = t.encode("hello<|im_end|>", true).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "hello");
    assert_eq!(t.decode(&ids, true).unwrap(), "hello<|im_end|>");
}

#[test]
fn the_smollm_pre_tokenizer_splits_digits_without_a_prefix_space() {
    let m = tiny_model(Arch::Llama);
    let t = m.tokenizer();
    // "hello" alone must not become "Ġhello" (candle's fallback bug) and digits are split one by one.
    let ids = t.encode("hello", false).unwrap();
    assert_eq!(t.token_text(ids[0]), Some("hello"));
    assert_eq!(t.encode("123", false).unwrap().len(), 3);
}

#[test]
fn tiny_spm_merges_by_score_and_falls_back_to_bytes() {
    let m = tiny_model(Arch::Gemma3);
    let t = m.tokenizer();
    let ids = t.encode("hello world", false).unwrap();
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["hello", "\u{2581}world"]);
    // 'z' is not a piece: it falls back to its byte token.
    let ids = t.encode("z", false).unwrap();
    assert_eq!(ids.iter().map(|&i| t.token_text(i).unwrap()).collect::<Vec<_>>(), ["<0x7A>"]);
    for s in ["hello world", "zebra 🤖", " lead"] {
        assert_eq!(t.decode(&t.encode(s, false).unwrap(), false).unwrap(), s);
    }
    let sot = t.token_id("<start_of_turn>").unwrap();
    assert_eq!(t.encode("<start_of_turn>", true).unwrap(), [sot]);
    assert_ne!(t.encode("<start_of_turn>", false).unwrap(), [sot]);
}

#[test]
fn out_of_range_ids_are_an_error() {
    let m = tiny_model(Arch::Llama);
    let err = m.tokenizer().decode(&[99_999], false).unwrap_err().to_string();
    assert!(err.contains("99999"), "{err}");
}

// ---- llama.cpp fixtures on the real files ---------------------------------------------------------------

#[derive(Deserialize)]
struct Fixture {
    model_file: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids_special_as_text: Vec<u32>,
    ids_special_parsed: Vec<u32>,
}

fn check_fixture(model_path: &std::path::Path, fixture: &str) {
    let f: Fixture = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/tests/data/tokenizer/{fixture}", env!("CARGO_MANIFEST_DIR"))).unwrap(),
    )
    .unwrap();
    assert_eq!(model_path.file_name().unwrap().to_str().unwrap(), f.model_file);
    let g = GgufFile::open(model_path).unwrap();
    let t = Tokenizer::from_gguf(&g).unwrap();
    let mut failures = Vec::new();
    for c in &f.cases {
        for (special, want) in [(false, &c.ids_special_as_text), (true, &c.ids_special_parsed)] {
            let got = t.encode(&c.text, special).unwrap();
            if &got != want {
                failures.push(format!("{:?} (special={special}):\n  want {want:?}\n  got  {got:?}", c.text));
            }
        }
        // Plain text (no control-token texts) decodes back to itself.
        if !c.text.contains("<|") && !c.text.contains("_of_turn>") {
            let back = t.decode(&c.ids_special_as_text, true).unwrap();
            if back != c.text {
                failures.push(format!("{:?} decodes to {back:?}", c.text));
            }
        }
    }
    assert!(failures.is_empty(), "{}: {} mismatches\n{}", f.model_file, failures.len(), failures.join("\n"));
    assert!(f.cases.len() >= 18);
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_fixture(&real_model_path("smollm2-135m"), "SmolLM2-135M-Instruct.Q4_1.json");
}

/// The bigger files: `.ci/run` requires them (REAGENT_TEST_MODELS=all).
#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn qwen2_matches_llama_cpp() {
    check_fixture(&require_model("qwen2.5-coder-0.5b"), "qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}

#[test]
#[cfg_attr(
    not(reagent_test_gemma),
    ignore = "needs gemma3-270m: build the tests with REAGENT_TEST_MODELS=gemma3-270m (or all)"
)]
fn gemma3_matches_llama_cpp() {
    check_fixture(&require_model("gemma3-270m"), "gemma3-270m-q4_k_m.json");
}
