//! Coverage-free fuzzing on stable Rust: each target mutates seed inputs (valid files and the malformed
//! corpus) for a time budget and feeds them to a parser in-process; a panic fails the target and the input
//! is saved under `target/fuzz-crashes/` for replay. Allocation bombs abort the process, which fails the
//! run as loudly. `fuzz/run.sh SECONDS` runs every target for SECONDS each; a plain `cargo test` gives each
//! target `REAGENT_FUZZ_SECONDS` (default 1).
//!
//! Targets: GGUF header and metadata (`GgufFile::open`), tokenizer construction and encoding from the
//! fuzzed metadata, model loading, decision extraction from free text, tools files, task files, and chat
//! templates rendered under their fuel and memory limits.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{scratch, tiny_path};
use reagent::model::Arch;

// Templates render under reagent's memory budget, as in the binary.
#[global_allocator]
static ALLOC: reagent::limits::BudgetAllocator = reagent::limits::BudgetAllocator;

/// A small, fast, seeded generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Integers that make parsers take unusual paths: zero, one, all ones, the edges of the integer types.
const INTERESTING: [u64; 10] = [0, 1, 2, 0x7F, 0xFF, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 40, u64::MAX];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&seeds[rng.below(seeds.len())]);
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = rng.next() as u8;
            }
            2 if len >= 8 => {
                // An interesting integer, little-endian, at a 4- or 8-byte aligned offset (GGUF counts).
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let width = if rng.below(2) == 0 { 4 } else { 8 };
                let i = rng.below(len - width + 1) & !3;
                out[i..i + width].copy_from_slice(&v[..width]);
            }
            3 if len > 0 => out.truncate(rng.below(len)),
            4 if len > 0 => {
                let (a, n) = (rng.below(len), rng.below(64));
                out.drain(a..(a + n).min(len));
            }
            5 if len > 0 => {
                let (a, n) = (rng.below(len), 1 + rng.below(64));
                let chunk: Vec<u8> = out[a..(a + n).min(len)].to_vec();
                let at = rng.below(len);
                out.splice(at..at, chunk);
            }
            6 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let (a, n) = (rng.below(other.len()), 1 + rng.below(256));
                    let at = rng.below(len + 1);
                    out.splice(at..at, other[a..(a + n).min(other.len())].iter().copied());
                }
            }
            _ => {
                let at = rng.below(len + 1);
                let text =
                    [&b"{"[..], b"}", b"[", b"]", b"\"", b"\\", b"{%", b"%}", b"{{", b"}}", b"\n", b"\0", b"\xff"];
                out.splice(at..at, text[rng.below(text.len())].iter().copied());
            }
        }
    }
}

fn budget() -> Duration {
    let s = std::env::var("REAGENT_FUZZ_SECONDS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(1.0);
    Duration::from_secs_f64(s)
}

fn data(sub: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad").join(sub);
    std::fs::read_dir(dir).map_or(Vec::new(), |d| d.flatten().filter_map(|e| std::fs::read(e.path()).ok()).collect())
}

fn crash_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Keeps the input a target is running when the process aborts (a stack overflow, an allocation failure:
/// no unwinding, so no panic to catch): a SIGABRT handler writes each armed target's current input to a
/// file opened beforehand, `target/fuzz-crashes/TARGET-PID-aborted` (the process id: two runs of a target
/// at once keep their own), which a run that ends normally removes.
#[cfg(unix)]
mod abort_capture {
    use std::os::fd::IntoRawFd;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::Relaxed};

    struct Slot {
        fd: AtomicI32,
        input: AtomicPtr<u8>,
        len: AtomicUsize,
    }

    const SLOTS: usize = 16;
    static TABLE: [Slot; SLOTS] = [const {
        Slot { fd: AtomicI32::new(-1), input: AtomicPtr::new(std::ptr::null_mut()), len: AtomicUsize::new(0) }
    }; SLOTS];
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static INSTALL: std::sync::Once = std::sync::Once::new();

    extern "C" fn on_abort(_: libc::c_int) {
        // Only async-signal-safe calls: write(2), signal(2), raise(3).
        for slot in &TABLE {
            let fd = slot.fd.load(Relaxed);
            let (input, len) = (slot.input.load(Relaxed), slot.len.load(Relaxed));
            if fd >= 0 && !input.is_null() {
                // SAFETY: the slot's input is the live buffer its target set before running it.
                unsafe { libc::write(fd, input as *const libc::c_void, len) };
            }
        }
        let note = b"fuzz: aborted; the inputs being run are in target/fuzz-crashes/*-aborted\n";
        // SAFETY: plain system calls on valid arguments; the default action then ends the process.
        unsafe {
            libc::write(2, note.as_ptr() as *const libc::c_void, note.len());
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::raise(libc::SIGABRT);
        }
    }

    /// One target's slot; dropping it (a run that did not abort) removes the file.
    pub struct Armed {
        slot: usize,
        path: PathBuf,
    }

    pub fn arm(path: PathBuf) -> Armed {
        INSTALL.call_once(|| {
            // SAFETY: installs a handler that only makes async-signal-safe calls.
            unsafe { libc::signal(libc::SIGABRT, on_abort as *const () as libc::sighandler_t) };
        });
        let slot = NEXT.fetch_add(1, Relaxed);
        assert!(slot < SLOTS, "more fuzz targets than abort slots");
        let fd = std::fs::File::create(&path).unwrap().into_raw_fd();
        TABLE[slot].fd.store(fd, Relaxed);
        Armed { slot, path }
    }

    impl Armed {
        /// The input about to run (it must stay alive until the next call or the drop).
        pub fn set(&self, input: &[u8]) {
            TABLE[self.slot].len.store(input.len(), Relaxed);
            TABLE[self.slot].input.store(input.as_ptr() as *mut u8, Relaxed);
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            let fd = TABLE[self.slot].fd.swap(-1, Relaxed);
            TABLE[self.slot].input.store(std::ptr::null_mut(), Relaxed);
            // SAFETY: the descriptor was opened by `arm` and is closed once.
            unsafe { libc::close(fd) };
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Runs `exec` on mutated seeds for the time budget; panics name the target and where the input was saved,
/// and an abort leaves the input in `target/fuzz-crashes/TARGET-PID-aborted` (unix).
fn fuzz(target: &str, seeds: Vec<Vec<u8>>, exec: impl Fn(&[u8])) {
    assert!(!seeds.is_empty(), "{target}: no seeds");
    let seed = std::env::var("REAGENT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_u64);
    let mut rng = Rng(seed ^ target.len() as u64 ^ 0x9E37_79B9_7F4A_7C15);
    let (t0, limit) = (Instant::now(), budget());
    let mut input = Vec::new();
    let mut execs = 0u64;
    #[cfg(unix)]
    let armed = abort_capture::arm(crash_dir().join(format!("{target}-{}-aborted", std::process::id())));
    std::panic::set_hook(Box::new(|_| {}));
    while t0.elapsed() < limit {
        mutate(&mut rng, &seeds, &mut input);
        #[cfg(unix)]
        armed.set(&input);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exec(&input))).is_err() {
            let _ = std::panic::take_hook();
            let path = crash_dir().join(format!("{target}-{execs}"));
            std::fs::write(&path, &input).unwrap();
            panic!("{target}: panic on input {} (after {execs} executions)", path.display());
        }
        execs += 1;
    }
    let _ = std::panic::take_hook();
    eprintln!("{target}: {execs} executions in {:.1} s, no panic", t0.elapsed().as_secs_f64());
}

/// A scratch file per target (the parsers take paths).
fn file_of(target: &str, ext: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(format!("fuzz-{target}.{ext}"));
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> =
        [Arch::Llama, Arch::Qwen2, Arch::Gemma3].into_iter().map(|a| std::fs::read(tiny_path(a)).unwrap()).collect();
    // Headers only (the metadata is where the parsing is): mutations land there more often.
    let heads: Vec<Vec<u8>> = seeds.iter().map(|s| s[..s.len().min(16 << 10)].to_vec()).collect();
    seeds.extend(heads);
    seeds
}

#[test]
fn fuzz_gguf_header_and_metadata() {
    fuzz("gguf", gguf_seeds(), |b| {
        let p = file_of("gguf", "gguf", b);
        if let Ok(g) = reagent::gguf::GgufFile::open(&p) {
            for key in ["general.architecture", "general.alignment", "llama.block_count", "tokenizer.ggml.tokens"] {
                let _ = g.get(key);
                let _ = g.u64(key);
                let _ = g.str(key);
                let _ = g.str_array(key);
            }
        }
    });
}

#[test]
fn fuzz_tokenizer_from_metadata() {
    fuzz("tokenizer", gguf_seeds(), |b| {
        let p = file_of("tokenizer", "gguf", b);
        if let Ok(g) = reagent::gguf::GgufFile::open(&p) {
            if let Ok(t) = reagent::Tokenizer::from_gguf(&g) {
                let _ = t.encode("Hello world <|im_end|> 123 ünï", true);
                let _ = t.encode("<s>\n\t  x", false);
                let _ = t.decode(&[0, 1, 2, 3, 1000, u32::MAX], true);
            }
        }
    });
}

#[test]
fn fuzz_model_load() {
    fuzz("model", gguf_seeds(), |b| {
        let p = file_of("model", "gguf", b);
        if let Ok(mut m) = reagent::Model::load(&p, &reagent::LoadOptions::default()) {
            let _ = m.chat_template().render(&[reagent::ChatMessage::user("hi")], true, None);
            let _ = reagent::LanguageModel::forward(&mut m, &[0, 1], 0);
        }
    });
}

#[test]
fn fuzz_decision_extraction() {
    let mut seeds: Vec<Vec<u8>> = vec![
        br#"{"thought":"t","type":"call_tool","tool":"calc","args":{"expression":"1+2"}}"#.to_vec(),
        br#"Sure! ```json\n{"type":"final_answer","answer":"4"}\n``` done"#.to_vec(),
        b"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": null}]}}\n</tool_call>".to_vec(),
    ];
    seeds.extend(data("tasks"));
    fuzz("decision", seeds, |b| {
        let _ = reagent::agent::driver::extract_json(&String::from_utf8_lossy(b));
    });
}

#[test]
fn fuzz_tools_files() {
    let mut seeds = data("tools");
    seeds.push(b"[[tool]]\nname = \"t\"\ncommand = [\"true\"]\nparameters = { type = \"object\", properties = { a = { type = \"string\" } } }\n".to_vec());
    fuzz("tools", seeds, |b| {
        let ext = if b.first() == Some(&b'{') { "json" } else { "toml" };
        let _ = reagent::tools::read_tools_file(&file_of("tools", ext, b));
    });
}

#[test]
fn fuzz_task_files() {
    let mut seeds = data("tasks");
    seeds.push(std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eval_tasks.jsonl")).unwrap());
    fuzz("tasks", seeds, |b| {
        let _ = reagent::eval::load_tasks(&file_of("tasks", "jsonl", b));
    });
}

#[test]
fn fuzz_chat_templates() {
    let model = common::tiny_model(Arch::Qwen2);
    let tok = model.tokenizer().clone();
    let seeds: Vec<Vec<u8>> = vec![
        model.chat_template().source().as_bytes().to_vec(),
        b"{% for m in messages %}{{ m.role }}: {{ m.content | tojson }}{% endfor %}{% if tools %}{{ tools }}{% endif %}".to_vec(),
        b"{% set ns = namespace(l=[1]) %}{% for i in range(8) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}".to_vec(),
        // Calls rendered (the call syntax's probe reads them), a generation block.
        b"{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}{% for m in messages %}{% generation %}{{ m.content }}\
{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\
</tool_call>{% endfor %}{% endgeneration %}{% endfor %}"
            .to_vec(),
    ];
    let call = reagent::text::chat::ChatCall::new("f", serde_json::json!({"a": "<|im_end|>"}));
    let messages = [
        reagent::ChatMessage::system("s"),
        reagent::ChatMessage::user("u"),
        reagent::ChatMessage::assistant("a"),
        reagent::ChatMessage::calls(vec![call]),
    ];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    fuzz("template", seeds, |b| {
        if let Ok(t) = reagent::ChatTemplate::new(&String::from_utf8_lossy(b), &tok) {
            let _ = t.render(&messages, true, Some(&tools));
            let _ = t.render_tokens(&tok, &messages, true, Some(&tools));
            let _ = reagent::agent::native::CallSyntax::of(&t, &tok);
        }
    });
}

/// The abort capture itself: a child process (this test binary, running the ignored test below) arms a
/// target, sets an input and aborts; the input must be in the file, and the process killed by SIGABRT.
#[cfg(unix)]
#[test]
fn an_abort_leaves_the_input_being_run_in_a_file() {
    use std::os::unix::process::ExitStatusExt;
    let path = crash_dir().join("abort-capture-check-aborted");
    let _ = std::fs::remove_file(&path);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "abort_capture_child", "--ignored", "--nocapture"])
        .env("REAGENT_FUZZ_ABORT_CHILD", "1")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
    assert_eq!(std::fs::read(&path).unwrap(), b"the input that aborted");
    std::fs::remove_file(&path).unwrap();
}

#[cfg(unix)]
#[test]
#[ignore = "run by an_abort_leaves_the_input_being_run_in_a_file in a child process: it aborts"]
fn abort_capture_child() {
    if std::env::var("REAGENT_FUZZ_ABORT_CHILD").is_err() {
        return;
    }
    let armed = abort_capture::arm(crash_dir().join("abort-capture-check-aborted"));
    let input = b"the input that aborted".to_vec();
    armed.set(&input);
    std::process::abort();
}
