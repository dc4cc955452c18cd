//! The malformed-input corpus: every file under `tests/data/bad/` (written by `make_corpus.py`, listed
//! with what its error must say in `cases.jsonl`) and damaged GGUF files written here from the tiny-model
//! writer go through the release binary. Each must end with exit code 2 and exactly one `error:` line that
//! names the file (and the key, line or tool), no panic, within a time limit and an address-space cap.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Value;
use common::{scratch, tiny_path};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::Arch;

/// Wall-clock limit per case: a hang shows as a failure, not a stuck test.
const TIME_LIMIT: Duration = Duration::from_secs(30);
/// Address-space cap per case (RLIMIT_AS): an allocation bomb aborts against it and fails the case.
const MEMORY_LIMIT: u64 = 6 << 30;

struct Case {
    name: String,
    args: Vec<String>,
    expect: Vec<String>,
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad")
}

/// The cases of `cases.jsonl`, as command lines over the tiny model.
fn file_cases() -> Vec<Case> {
    let tiny = tiny_path(Arch::Qwen2).display().to_string();
    let text = std::fs::read_to_string(data().join("cases.jsonl")).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let c: serde_json::Value = serde_json::from_str(line).unwrap();
        let file = data().join(c["file"].as_str().unwrap());
        let f = file.display().to_string();
        let gen = |flag: &str, value: String| {
            vec!["generate".into(), "--model".into(), tiny.clone(), flag.into(), value, "-p".into(), "x".into()]
        };
        let args: Vec<String> = match c["kind"].as_str().unwrap() {
            "tools" => ["run", "--model", &tiny, "--builtin", "none", "--tools", &f, "x"].map(String::from).into(),
            "schema" => gen("--json-schema", f),
            "lark" => gen("--lark", f),
            "regex" => gen("--regex", std::fs::read_to_string(&file).unwrap()),
            "tasks" => {
                let out = scratch().join(format!("corpus-{}.out", file.file_name().unwrap().to_string_lossy()));
                ["eval", &f, "--model", &tiny, "--dry-run", "--out", out.to_str().unwrap()].map(String::from).into()
            }
            k => panic!("unknown kind {k}"),
        };
        let expect = c["expect"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect();
        out.push(Case { name: c["file"].as_str().unwrap().into(), args, expect });
    }
    out
}

/// A tiny model of `arch` with one metadata entry replaced.
fn with_meta(arch: Arch, key: &str, value: Value) -> TinySpec {
    TinySpec { metadata: vec![(key.into(), value)], ..TinySpec::new(arch) }
}

/// Damaged GGUF files: metadata written wrong by the tiny writer, and bytes of a valid file cut or
/// overwritten. Each is loaded by `generate` (`--chat` for the template cases).
fn gguf_cases() -> Vec<Case> {
    let dir = scratch().join("corpus-gguf");
    std::fs::create_dir_all(&dir).unwrap();
    let s = |x: &str| Value::String(x.into());
    let strings = |xs: &[&str]| Value::Array(xs.iter().map(|x| s(x)).collect());
    let l = Arch::Llama;
    let g = Arch::Gemma3;
    let bomb_loop = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    let bomb_list = "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}";
    let bomb_string =
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    let bomb_repeat = "{{ 'x' * 100000000000 }}";
    // A namespace stored inside itself, then printed or serialised: a recursion without end in one instruction.
    let cycle_print = "{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}";
    let cycle_json = "{% set ns = namespace(a=1) %}{% set ns.a = [ns] %}{{ ns|tojson }}";
    let cycle_pair = "{% set p = namespace() %}{% set q = namespace(p=p) %}{% set p.q = q %}{{ p ~ '' }}";
    let meta: Vec<(&str, TinySpec, &[&str])> = vec![
        ("block_count_string", with_meta(l, "llama.block_count", s("two")), &["llama.block_count"]),
        ("block_count_zero", with_meta(l, "llama.block_count", Value::U32(0)), &["llama.block_count"]),
        ("block_count_huge", with_meta(l, "llama.block_count", Value::U32(1 << 30)), &["llama.block_count"]),
        ("block_count_u64", with_meta(l, "llama.block_count", Value::U64(1 << 62)), &["llama.block_count"]),
        ("block_count_negative", with_meta(l, "llama.block_count", Value::I32(-1)), &["llama.block_count"]),
        ("embedding_zero", with_meta(l, "llama.embedding_length", Value::U32(0)), &["embedding_length"]),
        ("embedding_odd", with_meta(l, "llama.embedding_length", Value::U32(7)), &["embedding_length"]),
        ("embedding_huge", with_meta(l, "llama.embedding_length", Value::U64(1 << 40)), &["embedding_length"]),
        ("heads_zero", with_meta(l, "llama.attention.head_count", Value::U32(0)), &["head_count"]),
        ("kv_heads_zero", with_meta(l, "llama.attention.head_count_kv", Value::U32(0)), &["head_count_kv"]),
        ("kv_heads_not_dividing", with_meta(l, "llama.attention.head_count_kv", Value::U32(3)), &["head_count"]),
        ("kv_heads_above_heads", with_meta(l, "llama.attention.head_count_kv", Value::U32(8)), &["head_count"]),
        ("heads_huge", with_meta(l, "llama.attention.head_count", Value::U32(1 << 31)), &["head_count"]),
        ("context_zero", with_meta(l, "llama.context_length", Value::U32(0)), &["context_length"]),
        ("ffn_wrong", with_meta(l, "llama.feed_forward_length", Value::U32(96)), &["ffn"]),
        ("rope_dims_huge", with_meta(l, "llama.rope.dimension_count", Value::U32(1000)), &["rope.dimension_count"]),
        ("rope_dims_zero", with_meta(l, "llama.rope.dimension_count", Value::U32(0)), &["rope.dimension_count"]),
        ("rope_dims_odd", with_meta(l, "llama.rope.dimension_count", Value::U32(7)), &["rope.dimension_count"]),
        ("rope_base_nan", with_meta(l, "llama.rope.freq_base", Value::F32(f32::NAN)), &["rope.freq_base"]),
        ("rope_base_negative", with_meta(l, "llama.rope.freq_base", Value::F32(-1.0)), &["rope.freq_base"]),
        ("epsilon_nan", with_meta(l, "llama.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN)), &["epsilon"]),
        ("epsilon_negative", with_meta(l, "llama.attention.layer_norm_rms_epsilon", Value::F32(-1.0)), &["epsilon"]),
        ("arch_unknown", with_meta(l, "general.architecture", s("gpt5")), &["gpt5"]),
        ("arch_number", with_meta(l, "general.architecture", Value::U32(3)), &["general.architecture"]),
        ("alignment_zero", with_meta(l, "general.alignment", Value::U32(0)), &["general.alignment"]),
        ("alignment_odd", with_meta(l, "general.alignment", Value::U32(3)), &["general.alignment"]),
        ("alignment_huge", with_meta(l, "general.alignment", Value::U32(1 << 31)), &["general.alignment"]),
        ("alignment_string", with_meta(l, "general.alignment", s("32")), &["general.alignment"]),
        ("tokens_empty", with_meta(l, "tokenizer.ggml.tokens", Value::Array(vec![])), &["tokenizer.ggml.tokens"]),
        (
            "tokens_numbers",
            with_meta(l, "tokenizer.ggml.tokens", Value::Array(vec![Value::U32(1); 300])),
            &["tokenizer.ggml.tokens"],
        ),
        ("tokens_not_array", with_meta(l, "tokenizer.ggml.tokens", s("abc")), &["tokenizer.ggml.tokens"]),
        (
            "token_type_short",
            with_meta(l, "tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1)])),
            &["token_type"],
        ),
        ("token_type_strings", with_meta(l, "tokenizer.ggml.token_type", strings(&["a", "b"])), &["token_type"]),
        (
            "merges_malformed",
            with_meta(l, "tokenizer.ggml.merges", strings(&["nospace", "a b c"])),
            &["tokenizer.ggml.merges"],
        ),
        (
            "merges_unknown_tokens",
            with_meta(l, "tokenizer.ggml.merges", strings(&["\u{1F600} \u{1F601}"])),
            &["tokenizer.ggml.merges"],
        ),
        (
            "merges_numbers",
            with_meta(l, "tokenizer.ggml.merges", Value::Array(vec![Value::U8(1)])),
            &["tokenizer.ggml.merges"],
        ),
        ("bos_out_of_range", with_meta(l, "tokenizer.ggml.bos_token_id", Value::U32(1_000_000_000)), &["bos_token_id"]),
        ("eos_out_of_range", with_meta(l, "tokenizer.ggml.eos_token_id", Value::U32(1_000_000_000)), &["eos_token_id"]),
        ("eos_string", with_meta(l, "tokenizer.ggml.eos_token_id", s("2")), &["eos_token_id"]),
        (
            "tokenizer_model_unknown",
            with_meta(l, "tokenizer.ggml.model", s("wordpiece-9000")),
            &["tokenizer.ggml.model"],
        ),
        ("tokenizer_model_number", with_meta(l, "tokenizer.ggml.model", Value::U32(1)), &["tokenizer.ggml.model"]),
        ("template_loop_bomb", with_meta(l, "tokenizer.chat_template", s(bomb_loop)), &["chat template"]),
        ("template_list_bomb", with_meta(l, "tokenizer.chat_template", s(bomb_list)), &["chat template"]),
        ("template_string_bomb", with_meta(l, "tokenizer.chat_template", s(bomb_string)), &["chat template"]),
        ("template_repeat_bomb", with_meta(l, "tokenizer.chat_template", s(bomb_repeat)), &["chat template"]),
        (
            "template_cycle_print",
            with_meta(l, "tokenizer.chat_template", s(cycle_print)),
            &["chat template", "recurses"],
        ),
        ("template_cycle_json", with_meta(l, "tokenizer.chat_template", s(cycle_json)), &["chat template", "recurses"]),
        ("template_cycle_pair", with_meta(l, "tokenizer.chat_template", s(cycle_pair)), &["chat template", "recurses"]),
        ("template_syntax", with_meta(l, "tokenizer.chat_template", s("{% for %}")), &["chat template"]),
        (
            "template_raises",
            with_meta(l, "tokenizer.chat_template", s("{{ raise_exception('no') }}")),
            &["chat template", "no"],
        ),
        ("template_undefined_call", with_meta(l, "tokenizer.chat_template", s("{{ nothing() }}")), &["chat template"]),
        ("template_number", with_meta(l, "tokenizer.chat_template", Value::U32(1)), &["tokenizer.chat_template"]),
        (
            "gemma_scores_short",
            with_meta(g, "tokenizer.ggml.scores", Value::Array(vec![Value::F32(0.0); 3])),
            &["tokenizer.ggml.scores"],
        ),
        ("gemma_scores_strings", with_meta(g, "tokenizer.ggml.scores", strings(&["a"])), &["tokenizer.ggml.scores"]),
        ("gemma_key_length_zero", with_meta(g, "gemma3.attention.key_length", Value::U32(0)), &["key_length"]),
        ("gemma_window_zero", with_meta(g, "gemma3.attention.sliding_window", Value::U32(0)), &["sliding_window"]),
    ];
    let mut out = Vec::new();
    for (name, spec, expect) in meta {
        let path = dir.join(format!("{name}.gguf"));
        write_tiny_gguf(&path, &spec).unwrap();
        let chat = name.starts_with("template");
        out.push(gguf_case(name, &path, chat, expect));
    }
    // Bytes of a valid file, cut or overwritten (offsets from the GGUF layout: magic, version, tensor
    // count, metadata count, then the first key's length).
    let valid = std::fs::read(tiny_path(Arch::Llama)).unwrap();
    let patch = |at: usize, bytes: &[u8]| {
        let mut v = valid.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let mut bytes: Vec<(String, Vec<u8>, &[&str])> = vec![
        ("empty".into(), Vec::new(), &["GGUF"]),
        ("bad_magic".into(), patch(0, b"GGUX"), &["GGUF"]),
        ("version_zero".into(), patch(4, &0u32.to_le_bytes()), &["version"]),
        ("version_huge".into(), patch(4, &99u32.to_le_bytes()), &["version"]),
        ("tensor_count_huge".into(), patch(8, &u64::MAX.to_le_bytes()), &["GGUF"]),
        ("kv_count_huge".into(), patch(16, &u64::MAX.to_le_bytes()), &["GGUF"]),
        ("kv_count_zero".into(), patch(16, &0u64.to_le_bytes()), &["general.architecture"]),
        ("key_length_huge".into(), patch(24, &u64::MAX.to_le_bytes()), &["GGUF"]),
        ("key_length_past_end".into(), patch(24, &(1u64 << 32).to_le_bytes()), &["GGUF"]),
        ("zeros".into(), vec![0; 4096], &["GGUF"]),
    ];
    for cut in [3, 7, 15, 23, 40, valid.len() / 8, valid.len() / 2, valid.len() - 1] {
        bytes.push((format!("truncated_{cut}"), valid[..cut].to_vec(), &["GGUF"]));
    }
    for (name, data, expect) in bytes {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, data).unwrap();
        out.push(gguf_case(&name, &path, false, expect));
    }
    out.push(gguf_case("a_directory", &dir, false, &["directory"]));
    out
}

fn gguf_case(name: &str, path: &Path, chat: bool, expect: &[&str]) -> Case {
    let mut args = vec!["generate".into(), "--model".into(), path.display().to_string(), "-p".into(), "hi".into()];
    args.extend(["--max-tokens".into(), "2".into()]);
    if chat {
        args.push("--chat".into());
    }
    let file = path.file_name().unwrap().to_string_lossy().to_string();
    let mut expect: Vec<String> = expect.iter().map(|e| e.to_string()).collect();
    expect.insert(0, file);
    Case { name: format!("gguf/{name}"), args, expect }
}

/// Runs one case; `None` when it behaved, else what went wrong.
fn check(case: &Case) -> Option<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reagent"));
    cmd.env("REAGENT_PROMPT_CACHE", "0");
    cmd.args(&case.args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.env("RUST_BACKTRACE", "0").env("REAGENT_THREADS", "1");
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit { rlim_cur: MEMORY_LIMIT, rlim_max: MEMORY_LIMIT };
                libc::setrlimit(libc::RLIMIT_AS, &lim);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Some(format!("still running after {TIME_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    let problem = if stderr.contains("panicked") {
        "panicked".to_string()
    } else if status.code() != Some(2) {
        format!("exit {status}")
    } else if errors.len() != 1 {
        format!("{} error lines", errors.len())
    } else if let Some(missing) = case.expect.iter().find(|e| !errors[0].contains(e.as_str())) {
        format!("error line lacks `{missing}`")
    } else {
        return None;
    };
    let tail: String =
        stderr.lines().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    Some(format!("{problem}: {}", tail.chars().take(400).collect::<String>()))
}

#[test]
fn every_bad_input_is_one_clean_error() {
    let mut cases = file_cases();
    cases.extend(gguf_cases());
    let total = cases.len();
    let failures = std::sync::Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                if let Some(why) = check(case) {
                    failures.lock().unwrap().push(format!("{}: {why}", case.name));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    eprintln!("{total} bad inputs, {} handled badly", failures.len());
    assert!(total >= 150, "the corpus has {total} cases");
    assert!(failures.is_empty(), "{} of {total} bad inputs handled badly:\n{}", failures.len(), failures.join("\n"));
}
