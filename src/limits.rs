//! Bounds on untrusted input and on a run: files the user names are read only when regular and small
//! enough, grammars and schemas (deeply nested ones recurse in their compilers) are compiled on a thread
//! with a large stack, and an interrupt (the CLI's Ctrl-C) ends generation, tool calls and runs cleanly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// The largest text input file reagent reads (tools files, task files, schemas, grammars): 64 MiB.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Reads a text file the user named, as untrusted input: only a regular file (a FIFO, a device or a
/// directory is refused before it is opened, so nothing blocks or grows without bound), at most `max`
/// bytes, UTF-8; a leading byte-order mark is dropped.
pub fn read_input(path: &std::path::Path, max: u64) -> Result<String> {
    let bad = |problem: String| Error::InputFile { path: path.to_path_buf(), problem };
    let mut bytes = Vec::new();
    use std::io::Read;
    open_input(path, max)?.read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
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

/// Opens a file the user named for reading as a stream, with [`read_input`]'s checks: a regular file of
/// at most `max` bytes (the reader stops one byte past `max`, so a file that grows is seen to).
pub fn open_input(path: &std::path::Path, max: u64) -> Result<std::io::BufReader<std::io::Take<std::fs::File>>> {
    let bad = |problem: String| Error::InputFile { path: path.to_path_buf(), problem };
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() { "a directory" } else { "not a regular file" };
        return Err(bad(format!("{kind}; give a file")));
    }
    if meta.len() > max {
        return Err(bad(format!("{} bytes; inputs are at most {max} bytes", meta.len())));
    }
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    Ok(std::io::BufReader::new(file.take(max + 1)))
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

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Asks everything running in this process to stop at its next check: generation between tokens, a
/// program tool within milliseconds (its process group killed), the agent before its next step, an eval
/// before its next task. Only an atomic store, so it may be called from a signal handler. To stop one
/// agent of several, use its [`Cancel`] handle.
pub fn request_interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether this thread's work should stop: an interrupt of the whole process was requested, or a
/// [`Cancel`] handle in whose [scope](Cancel::scope) the thread runs was cancelled.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
        || SCOPES.try_with(|s| s.borrow().iter().any(Cancel::is_cancelled)).unwrap_or(false)
}

/// Forgets a handled process-wide interrupt (a library user that goes on after one).
pub fn clear_interrupt() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}

thread_local! {
    /// The handles whose scopes this thread is in, innermost last.
    static SCOPES: std::cell::RefCell<Vec<Cancel>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Stops one piece of work from another thread: an agent's run ([`Agent::cancel_handle`]), a generation,
/// an eval. Clones share one flag; cancelling is an atomic store (safe from a signal handler). Work
/// checks it where it checks for an interrupt ([`interrupted`]): between tokens, between steps, while a
/// tool runs (tool threads inherit the scopes of the thread that started them).
///
/// [`Agent::cancel_handle`]: crate::agent::Agent::cancel_handle
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the work under this handle to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Forgets a cancellation, so the handle can be used for the next piece of work.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Runs `f` on this thread with this handle in scope: [`interrupted`] is true in it once the handle is
    /// cancelled. Scopes nest (work stops when any enclosing handle is cancelled).
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                SCOPES.with(|s| s.borrow_mut().pop());
            }
        }
        SCOPES.with(|s| s.borrow_mut().push(self.clone()));
        let _leave = Leave;
        f()
    }
}

/// The handles in scope on this thread, to carry into a thread it starts ([`in_scopes`]).
pub(crate) fn current_scopes() -> Vec<Cancel> {
    SCOPES.with(|s| s.borrow().clone())
}

/// Runs `f` within `scopes` (from [`current_scopes`] on the starting thread).
pub(crate) fn in_scopes<R>(scopes: &[Cancel], f: impl FnOnce() -> R) -> R {
    match scopes.split_first() {
        None => f(),
        Some((first, rest)) => first.scope(|| in_scopes(rest, f)),
    }
}

/// A global allocator (the system's) that can hold one thread to a memory budget, for untrusted work that
/// fuel does not bound: a chat template that doubles a list sixty times asks for 200 GB in a handful of
/// instructions. The `reagent` binary installs it; a program embedding reagent may too:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: reagent::limits::BudgetAllocator = reagent::limits::BudgetAllocator;
/// ```
///
/// Without it, [`with_memory_budget`] runs its work unbounded.
pub struct BudgetAllocator;

/// A thread's budget: bytes it holds, the cap, the stack it may use, and where to say which was exceeded.
#[derive(Clone, Copy)]
struct Budget {
    used: usize,
    cap: usize,
    /// An address near the top of the thread's stack, and how far below it an allocation may be made.
    stack_top: usize,
    stack_cap: usize,
    exceeded: *const std::sync::atomic::AtomicU8,
}

/// What a budgeted thread went over ([`with_memory_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// Live heap memory past the cap.
    Memory,
    /// Stack deeper than [`BUDGET_STACK_BYTES`] at an allocation: a recursion without end, such as a chat
    /// template printing a namespace stored inside itself (`{% set ns.a = ns %}{{ ns }}`), which no fuel
    /// counts because it runs inside one instruction.
    Stack,
}

/// Stack a budgeted thread may use, checked at each of its allocations (its thread reserves twice this).
pub const BUDGET_STACK_BYTES: usize = 64 << 20;

const NOT_EXCEEDED: u8 = 0;

thread_local! {
    static BUDGET: std::cell::Cell<Option<Budget>> = const { std::cell::Cell::new(None) };
}

static BUDGET_ALLOCATOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// SAFETY: every call is passed to `System` unchanged; the budget only adds bookkeeping in a thread-local
// `Cell` (no allocation) and, past the cap, parks the thread for good instead of allocating.
unsafe impl std::alloc::GlobalAlloc for BudgetAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        refund(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            refund(layout.size() - new_size);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

fn charge(bytes: usize) {
    // Read first: a store on every allocation would bounce the line between cores.
    if !BUDGET_ALLOCATOR.load(std::sync::atomic::Ordering::Relaxed) {
        BUDGET_ALLOCATOR.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let Ok(Some(mut b)) = BUDGET.try_with(|c| c.get()) else { return };
    b.used = b.used.saturating_add(bytes);
    let here = std::ptr::addr_of!(b) as usize;
    let over = if b.used > b.cap {
        Some(Exceeded::Memory)
    } else if b.stack_top.abs_diff(here) > b.stack_cap {
        Some(Exceeded::Stack)
    } else {
        None
    };
    if let Some(over) = over {
        // Over budget: say so and stop this thread for good, before the allocation is attempted. Its
        // caller has stopped waiting for it; what it holds (at most the caps) stays allocated.
        // SAFETY: the flag outlives the thread (the thread owns an `Arc` of it; see with_memory_budget).
        unsafe { (*b.exceeded).store(over as u8 + 1, std::sync::atomic::Ordering::SeqCst) };
        loop {
            std::thread::park();
        }
    }
    let _ = BUDGET.try_with(|c| c.set(Some(b)));
}

fn refund(bytes: usize) {
    let _ = BUDGET.try_with(|c| {
        if let Some(mut b) = c.get() {
            b.used = b.used.saturating_sub(bytes);
            c.set(Some(b));
        }
    });
}

/// Runs `f` holding it to `cap` bytes of live heap memory and [`BUDGET_STACK_BYTES`] of stack when
/// [`BudgetAllocator`] is the global allocator (on a thread of its own; an error says which `f` went over,
/// the thread then left parked), else just runs it.
pub fn with_memory_budget<T: Send + 'static>(
    cap: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, Exceeded> {
    use std::sync::atomic::{AtomicU8, Ordering};
    if !BUDGET_ALLOCATOR.load(Ordering::Relaxed) {
        return Ok(f());
    }
    let exceeded = std::sync::Arc::new(AtomicU8::new(NOT_EXCEEDED));
    let flag = exceeded.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // A big stack too: a template engine recursing to its own depth limit needs more than the default
    // 2 MiB of a spawned thread (a fuzzed chat template overflowed it and aborted the process). Half of it
    // is the stack budget, so a recursion without end is stopped at an allocation well before the end.
    let spawned =
        std::thread::Builder::new().name("reagent-budget".into()).stack_size(2 * BUDGET_STACK_BYTES).spawn(move || {
            let top = 0u8;
            let budget = Budget {
                used: 0,
                cap,
                stack_top: std::ptr::addr_of!(top) as usize,
                stack_cap: BUDGET_STACK_BYTES,
                exceeded: std::sync::Arc::as_ptr(&flag),
            };
            BUDGET.with(|c| c.set(Some(budget)));
            let out = f();
            BUDGET.with(|c| c.set(None));
            let _ = tx.send(out);
            drop(flag);
        });
    if spawned.is_err() {
        return Err(Exceeded::Memory);
    }
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Ok(out) => return Ok(out),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if exceeded.load(Ordering::SeqCst) == NOT_EXCEEDED => {
                continue
            }
            Err(_) if exceeded.load(Ordering::SeqCst) == Exceeded::Stack as u8 + 1 => return Err(Exceeded::Stack),
            Err(_) => return Err(Exceeded::Memory),
        }
    }
}
