//! An eval spread over several endpoints at once ([`run_eval_spread`]): one thread per worker, each with
//! its own driver (a [`RemoteDriver`](crate::agent::RemoteDriver) to one of the endpoints), taking the
//! next task when it is free. Each result line is written when its task ends, so the file is in the order
//! the tasks ended; `--resume` reads it by id as for one driver. A task whose endpoint fails
//! ([`Error::EndpointDown`], after the driver's own retries) goes back to the queue for another endpoint, and
//! is recorded once, by whichever endpoint finishes it.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};

use super::{run_task, write_line, EvalOptions, EvalTask, TaskResult};
use crate::agent::{Driver, EventLog};
use crate::error::{Error, Result};
use crate::tools::Tool;

/// An endpoint that fails this many tasks in a row is left: its workers stop taking tasks.
const FAILURES_TO_LEAVE: u32 = 3;

/// A driver and the endpoint it sends to (its URL: workers with the same one share it).
pub struct Worker {
    pub endpoint: String,
    pub driver: Box<dyn Driver>,
}

/// What the workers share.
struct State<'o> {
    /// Tasks not yet taken (by index), with the endpoints each has failed on.
    queue: VecDeque<(usize, Vec<usize>)>,
    /// Tasks taken and not yet ended.
    running: usize,
    /// Failures in a row per endpoint, and whether it was left.
    failures: Vec<u32>,
    left: Vec<bool>,
    results: Vec<TaskResult>,
    /// The error that stops the eval (the others finish the task they run and take no more).
    stop: Option<Error>,
    interrupted: bool,
    out: &'o mut (dyn Write + Send),
}

impl State<'_> {
    /// The next task `endpoint` may run, or why it gets none: `Err(true)` to wait for one, `Err(false)` to
    /// stop.
    fn take(&mut self, endpoint: usize) -> std::result::Result<(usize, Vec<usize>), bool> {
        if self.stop.is_some() || self.interrupted || self.left[endpoint] || crate::limits::interrupted() {
            return Err(false);
        }
        if let Some(at) = self.queue.iter().position(|(_, failed)| !failed.contains(&endpoint)) {
            self.running += 1;
            return Ok(self.queue.remove(at).expect("a position in the queue"));
        }
        if self.queue.is_empty() && self.running == 0 {
            return Err(false);
        }
        Err(true)
    }

    /// A task that no endpoint still in use can run, when none is running that could make one fail over:
    /// the eval cannot go on.
    fn stranded(&self, tasks: &[EvalTask], endpoints: &[String]) -> Option<Error> {
        if self.running > 0 {
            return None;
        }
        let (task, failed) =
            self.queue.iter().find(|(_, failed)| (0..endpoints.len()).all(|e| self.left[e] || failed.contains(&e)))?;
        let tried: Vec<&str> = failed.iter().map(|&e| endpoints[e].as_str()).collect();
        Some(Error::EndpointDown {
            endpoint: tried.join(", "),
            problem: format!("task `{}` failed on every endpoint still in use", tasks[*task].id),
        })
    }
}

/// Runs `tasks` (up to `opts.limit`) on `workers` at once, appending one line per task to `out` as each
/// ends and calling `progress(done, total)` after each; `failed_over(endpoint, task, error)` is told each
/// time a task leaves an endpoint that failed it. Returns the results in the order they were written.
pub fn run_eval_spread(
    workers: Vec<Worker>,
    tasks: &[EvalTask],
    tools: &[Arc<dyn Tool>],
    opts: &EvalOptions,
    out: &mut (dyn Write + Send),
    progress: &(dyn Fn(usize, usize) + Sync),
    failed_over: &(dyn Fn(&str, &str, &Error) + Sync),
) -> Result<Vec<TaskResult>> {
    let total = opts.limit.map_or(tasks.len(), |l| l.min(tasks.len()));
    let mut endpoints: Vec<String> = Vec::new();
    let mut workers: Vec<(usize, Box<dyn Driver>)> = workers
        .into_iter()
        .map(|w| {
            let e = endpoints.iter().position(|e| *e == w.endpoint).unwrap_or_else(|| {
                endpoints.push(w.endpoint);
                endpoints.len() - 1
            });
            (e, w.driver)
        })
        .collect();
    if workers.is_empty() {
        return Err(Error::param("workers", "an eval needs at least one"));
    }
    let endpoints = &endpoints[..];
    let left = vec![false; endpoints.len()];
    let state = Mutex::new(State {
        queue: (0..total).map(|i| (i, Vec::new())).collect(),
        running: 0,
        failures: vec![0; endpoints.len()],
        left,
        results: Vec::with_capacity(total),
        stop: None,
        interrupted: false,
        out,
    });
    let changed = Condvar::new();
    std::thread::scope(|scope| {
        for (endpoint, mut driver) in workers.drain(..) {
            let (state, changed) = (&state, &changed);
            scope.spawn(move || {
                loop {
                    let (index, mut failed) = {
                        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                        loop {
                            match s.take(endpoint) {
                                Ok(next) => break next,
                                Err(true) => s = changed.wait(s).unwrap_or_else(|p| p.into_inner()),
                                Err(false) => return,
                            }
                        }
                    };
                    let task = &tasks[index];
                    let ran = run_task(driver, task, tools, opts);
                    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                    s.running -= 1;
                    changed.notify_all();
                    let outcome = match ran {
                        Ok((back, outcome)) => {
                            driver = back;
                            outcome
                        }
                        Err(e) => {
                            // The driver went with the agent that could not be built: this worker stops.
                            s.stop.get_or_insert(e);
                            return;
                        }
                    };
                    match outcome {
                        Ok(Some(result)) => {
                            s.failures[endpoint] = 0;
                            let written = write_line(&mut *s.out, &result)
                                .and_then(|()| opts.events.as_ref().and_then(EventLog::take_error).map_or(Ok(()), Err));
                            match written {
                                Ok(()) => {
                                    s.results.push(result);
                                    progress(s.results.len(), total);
                                }
                                Err(e) => {
                                    s.stop.get_or_insert(e);
                                }
                            }
                        }
                        // Not recorded: a resumed eval runs it again.
                        Ok(None) => s.interrupted = true,
                        Err(e @ Error::EndpointDown { .. }) => {
                            failed_over(&endpoints[endpoint], &task.id, &e);
                            s.failures[endpoint] += 1;
                            if s.failures[endpoint] >= FAILURES_TO_LEAVE {
                                s.left[endpoint] = true;
                            }
                            failed.push(endpoint);
                            s.queue.push_front((index, failed));
                            if let Some(e) = s.stranded(tasks, endpoints) {
                                s.stop.get_or_insert(e);
                            }
                        }
                        Err(e) => {
                            s.stop.get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    let s = state.into_inner().unwrap_or_else(|p| p.into_inner());
    match s.stop {
        Some(e) => Err(e),
        None => Ok(s.results),
    }
}
