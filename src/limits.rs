//! Bounds on untrusted input and on a run: files the user names are read only when regular and small
//! enough, grammars and schemas (deeply nested ones recurse in their compilers) are compiled on a thread
//! with a large stack, and an interrupt (the CLI's Ctrl-C) ends generation, tool calls and runs cleanly.

use crate::error::{Error, Result};

/// The largest text input file reagent reads (tools files, task files, schemas, grammars): 64 MiB.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Reads a text file the user named, as untrusted input: only a regular file (a FIFO, a device or a
/// directory is refused before it is opened, so nothing blocks or grows without bound), at most `max`
/// bytes, UTF-8; a leading byte-order mark is dropped.
pub fn read_input(path: &std::path::Path, max: u64) -> Result<String> {
    let bad = |problem: String| Error::InputFile { path: path.to_path_buf(), problem };
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() { "a directory" } else { "not a regular file" };
        return Err(bad(format!("{kind}; give a file")));
    }
    if meta.len() > max {
        return Err(bad(format!("{} bytes; inputs are at most {max} bytes", meta.len())));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    use std::io::Read;
    std::fs::File::open(path).and_then(|f| f.take(max + 1).read_to_end(&mut bytes)).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(bad(format!("grew past {max} bytes while being read")));
    }
    let mut text =
        String::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))?;
    if text.starts_with('\u{feff}') {
        text.drain(..3);
    }
    Ok(text)
}

/// Stack size of the threads that compile grammars and schemas: a chain of thousands of rules or `$ref`s
/// recurses that deep. Reserved, not committed: untouched pages cost nothing.
const COMPILE_STACK_BYTES: usize = 512 << 20;

/// Runs `f` (a grammar or schema compilation) on a thread with a large stack, so that a deeply nested
/// input is compiled or refused, never a stack overflow that aborts the process.
pub fn on_big_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let f = std::sync::Mutex::new(Some(f));
    let take = || f.lock().unwrap_or_else(|e| e.into_inner()).take().expect("run once");
    let spawned = std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("reagent-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(s, || take()())
            .ok()?;
        Some(h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    // No thread could be made (a system that will not reserve the stack): compile here.
    spawned.unwrap_or_else(|| take()())
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks everything running in this process to stop at its next check: generation between tokens, a
/// program tool within milliseconds (its process group killed), the agent before its next step, an eval
/// before its next task. Only an atomic store, so it may be called from a signal handler.
pub fn request_interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether an interrupt was requested.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Forgets a handled interrupt (a library user that goes on after one).
pub fn clear_interrupt() {
    INTERRUPTED.store(false, std::sync::atomic::Ordering::SeqCst);
}
