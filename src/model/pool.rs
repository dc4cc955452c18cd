//! The worker pool of the CPU kernels: a few microseconds per parallel call, and polite under contention.
//!
//! candle's barrier pool (which the kernels used before) waits for its workers by spinning without end:
//! when another process shares the cores and a worker is preempted, the caller spins through its whole
//! time slice, and decode fell from ~72 to ~3 tokens/s. Here every wait spins briefly, then yields the
//! core, then (an idle worker) parks; work is claimed in chunks from a shared cursor, so a preempted
//! worker delays only the chunk it holds while the others, the caller included, take the rest.
//!
//! One call runs at a time (a lock); a call from inside a worker runs inline.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;

/// Spins of a waiting thread before it starts yielding its core.
const SPINS: u32 = 2_000;
/// Yields of an idle worker before it parks.
const YIELDS: u32 = 200;

thread_local! {
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// The job being run: `f` over chunks `0..chunks` of `chunk` items each (the last one shorter), on
/// `items` items. Written under the call lock before the job's generation is published.
struct Job {
    f: *const (),
    call: unsafe fn(*const (), Range<usize>),
    items: usize,
    chunk: usize,
}

struct Shared {
    /// `generation << 32 | next chunk index`: workers claim chunks by compare-and-swap, so a claim can only
    /// succeed for the generation it saw.
    cursor: AtomicU64,
    /// The job's chunk count, by generation parity (read only by a thread that saw that generation).
    chunks: [AtomicUsize; 2],
    /// Threads inside a job (claiming or running a chunk); the caller returns once all chunks are claimed
    /// and this is zero.
    active: AtomicUsize,
    job: Mutex<()>,
    desc: std::cell::UnsafeCell<Job>,
    /// The first panic of a chunk run by a worker, re-raised on the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    workers: OnceLock<Box<[Thread]>>,
}

// SAFETY: `desc` is written only by the caller holding `job` while no worker can claim a chunk (the new
// generation is not yet published and the previous job's `active` count has drained), and read only by a
// thread that claimed a chunk of the current generation.
unsafe impl Sync for Shared {}

/// The kernels' pool: `n - 1` workers for `n` threads (the caller is the n-th).
pub(crate) struct Pool {
    shared: &'static Shared,
    n_workers: usize,
}

/// The pool, sized like candle's (`CANDLE_NUM_THREADS`, else `RAYON_NUM_THREADS`, else the cores).
pub(crate) fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("CANDLE_NUM_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(candle_core::utils::get_num_threads);
        Pool::new(threads.max(1))
    })
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            cursor: AtomicU64::new(0),
            chunks: [AtomicUsize::new(0), AtomicUsize::new(0)],
            active: AtomicUsize::new(0),
            job: Mutex::new(()),
            desc: std::cell::UnsafeCell::new(Job { f: std::ptr::null(), call: noop, items: 0, chunk: 1 }),
            panic: Mutex::new(None),
            workers: OnceLock::new(),
        }));
        let n_workers = threads - 1;
        let mut handles = Vec::with_capacity(n_workers);
        for i in 0..n_workers {
            let spawned = std::thread::Builder::new().name(format!("reagent-kernel-{i}")).spawn(move || work(shared));
            match spawned {
                Ok(h) => handles.push(h.thread().clone()),
                Err(_) => break, // fewer workers: the caller does more
            }
        }
        let n_workers = handles.len();
        let _ = shared.workers.set(handles.into_boxed_slice());
        Pool { shared, n_workers }
    }

    /// Threads a call uses (the workers and the caller).
    pub(crate) fn threads(&self) -> usize {
        self.n_workers + 1
    }

    /// Runs `f` over `0..items` in chunks, on the workers and the calling thread; returns when every chunk
    /// has run. A panic in `f` (a kernel's shape assertion) is raised again on the caller.
    pub(crate) fn for_chunks<F: Fn(Range<usize>) + Sync>(&self, items: usize, f: F) {
        if items == 0 {
            return;
        }
        if self.n_workers == 0 || IN_POOL.with(Cell::get) {
            return f(0..items);
        }
        // ~8 claims per thread: little contention on the cursor, a small tail.
        let chunk = items.div_ceil(self.threads() * 8).max(1);
        let chunks = items.div_ceil(chunk);
        let s = self.shared;
        let _lock = s.job.lock().unwrap_or_else(|p| p.into_inner());
        // The previous job's stragglers (threads that looked after its last chunk was claimed) are gone
        // before its description is overwritten.
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        unsafe fn call<F: Fn(Range<usize>)>(f: *const (), r: Range<usize>) {
            // SAFETY: `f` points to the caller's `F`, alive until the call returns (see below).
            unsafe { (*(f as *const F))(r) }
        }
        // SAFETY: under the lock with no thread active, nobody reads `desc` (see `Shared`).
        unsafe { *s.desc.get() = Job { f: &f as *const F as *const (), call: call::<F>, items, chunk } };
        let generation = (s.cursor.load(Ordering::SeqCst) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        s.chunks[(generation & 1) as usize].store(chunks, Ordering::SeqCst);
        s.cursor.store(generation << 32, Ordering::SeqCst);
        for w in s.workers.get().expect("set at start").iter() {
            w.unpark();
        }
        IN_POOL.with(|c| c.set(true));
        run_chunks(s, generation);
        IN_POOL.with(|c| c.set(false));
        // Every chunk is claimed; wait for the ones still running. `f` stays alive until then.
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        if let Some(p) = s.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
            std::panic::resume_unwind(p);
        }
    }
}

unsafe fn noop(_: *const (), _: Range<usize>) {}

/// Claims and runs chunks of `generation` until none is left (or a newer job replaced it).
fn run_chunks(s: &Shared, generation: u64) {
    s.active.fetch_add(1, Ordering::SeqCst);
    let chunks = s.chunks[(generation & 1) as usize].load(Ordering::SeqCst) as u64;
    let mut cur = s.cursor.load(Ordering::SeqCst);
    loop {
        if cur >> 32 != generation || cur & 0xFFFF_FFFF >= chunks {
            break;
        }
        match s.cursor.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => {
                let i = (cur & 0xFFFF_FFFF) as usize;
                // SAFETY: a chunk of this generation is claimed, so its caller waits (on `active`) until
                // it has run: the description and `f` are this job's and alive.
                let job = unsafe { &*s.desc.get() };
                let start = i * job.chunk;
                let range = start..job.items.min(start + job.chunk);
                // SAFETY: as above.
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (job.call)(job.f, range) }));
                if let Err(p) = ran {
                    s.panic.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(p);
                }
                cur = s.cursor.load(Ordering::SeqCst);
            }
            Err(now) => cur = now,
        }
    }
    s.active.fetch_sub(1, Ordering::SeqCst);
}

/// A worker: waits for a new generation (spinning, then yielding, then parked), helps with it, again.
fn work(s: &'static Shared) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        let mut waited = 0u32;
        let generation = loop {
            let g = s.cursor.load(Ordering::SeqCst) >> 32;
            if g != seen {
                break g;
            }
            waited += 1;
            if waited < SPINS {
                std::hint::spin_loop();
            } else if waited < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::park();
                waited = 0;
            }
        };
        seen = generation;
        run_chunks(s, generation);
    }
}

/// Spins, then yields the core, until `done`.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_for_any_size() {
        let p = Pool::new(3);
        for items in [1, 2, 3, 7, 24, 25, 1000, 4097] {
            for _round in 0..50 {
                let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
                p.for_chunks(items, |r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{items} items");
            }
        }
    }

    #[test]
    fn a_call_from_inside_a_chunk_runs_inline() {
        let p = Pool::new(2);
        let total = AtomicUsize::new(0);
        p.for_chunks(16, |r| {
            for _ in r {
                pool().for_chunks(4, |inner| {
                    total.fetch_add(inner.len(), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn a_panic_in_a_chunk_reaches_the_caller_and_the_pool_goes_on() {
        let p = Pool::new(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.for_chunks(64, |r| assert!(!r.contains(&40), "chunk with item 40"));
        }));
        assert!(caught.is_err());
        let n = AtomicUsize::new(0);
        p.for_chunks(64, |r| {
            n.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 64);
    }
}
