//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod gbnf;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::Arch;
use reagent::{LoadOptions, Model};

/// A directory that lives as long as the test binary.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir")).path()
}

/// Writes (once per binary) the tiny random-weight model of an architecture and returns its path.
pub fn tiny_path(arch: Arch) -> PathBuf {
    let path = scratch().join(format!("tiny-{}.gguf", arch.as_str()));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        write_tiny_gguf(&path, &TinySpec::new(arch)).expect("write tiny gguf");
    }
    path
}

pub fn tiny_model(arch: Arch) -> Model {
    Model::load(tiny_path(arch), &LoadOptions::default()).expect("load tiny model")
}

pub const ARCHS: [Arch; 6] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::SmolLM3, Arch::Phi3, Arch::Gemma3];

/// The path of a catalog model, fetched into the cache when absent (the test model, `smollm2-135m`).
pub fn real_model_path(name: &str) -> PathBuf {
    // One fetch at a time within a test binary; the cache's atomic rename makes binaries safe too.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let opts = FetchOptions::default().progress(false);
    catalog::resolve(&Catalog::builtin(), name, &opts)
        .unwrap_or_else(|e| panic!("model `{name}` is needed by this test and could not be fetched: {e}"))
}

/// A catalog model beyond the test model that a test needs. Such tests are compiled as ignored, naming
/// the model, unless `REAGENT_TEST_MODELS` names it (or says `all`, as `.ci/run` does) at build time
/// (`build.rs`); then the model is fetched when absent, and a failed fetch fails the test.
pub fn require_model(name: &str) -> PathBuf {
    real_model_path(name)
}

/// A tiny model with a 4096-token context (the tiny vocabulary is mostly single bytes, so agent prompts
/// need room).
pub fn tiny_long_path(arch: Arch) -> PathBuf {
    tiny_written(&format!("tiny-long-{}", arch.as_str()), &TinySpec { context: 4096, ..TinySpec::new(arch) })
}

/// A tiny Qwen 3 model that thinks (`<think>` tokens, Qwen 3's thinking switch in its template), with a
/// 4096-token context.
pub fn tiny_thinking_path() -> PathBuf {
    tiny_written("tiny-thinking", &TinySpec { context: 4096, thinking: true, ..TinySpec::new(Arch::Qwen3) })
}

/// The tiny model of `spec` under `name` in the scratch directory, written once per test binary.
fn tiny_written(name: &str, spec: &TinySpec) -> PathBuf {
    let path = scratch().join(format!("{name}.gguf"));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        write_tiny_gguf(&path, spec).expect("write tiny gguf");
    }
    path
}

/// Command lines (arguments joined by spaces) of the running processes that contain `marker`, read from
/// /proc (no `ps` needed): what a test's tools left behind.
#[cfg(target_os = "linux")]
pub fn processes_matching(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker))
        .collect()
}

/// The requests a [`fake_server`] was sent: each one's head and body, in order.
pub type Requests = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A loopback HTTP server answering its connections, one request each, with `replies` (status, JSON
/// body) in order, then closing; its API base (`http://ADDR/v1`) and the requests it was sent.
pub fn fake_server(replies: Vec<(u16, String)>) -> (String, Requests) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let requests = Requests::default();
    let seen = requests.clone();
    std::thread::spawn(move || {
        for (status, reply) in replies {
            let (mut c, _) = listener.accept().unwrap();
            let mut raw = Vec::new();
            let mut buf = [0u8; 65536];
            // The head, then the body its Content-Length gives.
            loop {
                let n = c.read(&mut buf).unwrap();
                raw.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&raw).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.parse().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        seen.lock().unwrap().push((head.to_string(), body.to_string()));
                        break;
                    }
                }
            }
            let reason = if status == 200 { "OK" } else { "Error" };
            let _ = write!(
                c,
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (url, requests)
}
