//! `reagent serve`: an OpenAI-compatible HTTP endpoint over one loaded model.
//!
//! `POST /v1/chat/completions` (plain chat, streaming, tools under every `tool_choice`, JSON response
//! formats), `GET /v1/models`, `GET /health`, `GET /metrics`. Every tool call is an agent decision made
//! under the grammar built from the request's tool schemas, so it names a given tool and its arguments
//! validate. One thread owns the model; requests wait in a bounded queue (past it: 429 with
//! `Retry-After`); a client that disconnects stops its generation; bodies, tools and messages are capped
//! and every bad request is a 400 naming the field ([`api`]).

pub mod api;
mod conn;
mod http;
mod responses;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::agent::driver::ModelDriver;
use crate::catalog::Profile;
use crate::error::{Error, Result};

pub use api::Limits;

/// How the server runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeOptions {
    pub host: String,
    /// 0: any free port ([`Server::addr`] says which).
    pub port: u16,
    /// Requests must carry `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Allows a non-loopback address without an API key.
    pub insecure_no_auth: bool,
    /// Requests waiting for the model beyond the one being served; more are answered 429.
    pub queue: usize,
    pub limits: Limits,
    /// The decision settings tool calls are made with (the catalog's, for this profile).
    pub profile: Profile,
    /// The model's name in responses and `/v1/models`.
    pub model_name: String,
    /// Calls one decision may make where a request allows parallel calls (`None`: one).
    pub parallel_calls: Option<usize>,
    /// Tokens of thinking before each tool decision, for models whose template thinks (`None`: the
    /// catalog's setting).
    pub think_budget: Option<usize>,
    /// A line on stderr per request served: its tokens (prompt, cached, generated), how it ended and its
    /// time. Never its content.
    pub log_requests: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            insecure_no_auth: false,
            queue: 16,
            limits: Limits::default(),
            profile: Profile::Run,
            model_name: "reagent".into(),
            parallel_calls: None,
            think_budget: None,
            log_requests: false,
        }
    }
}

setters!(ServeOptions {
    host: String,
    port: u16,
    api_key: Option<String>,
    insecure_no_auth: bool,
    queue: usize,
    limits: Limits,
    profile: Profile,
    model_name: String,
    parallel_calls: Option<usize>,
    think_budget: Option<usize>,
    log_requests: bool,
});

/// Counters for `/metrics`.
#[derive(Default)]
pub(crate) struct Metrics {
    /// Responses by status code.
    responses: Mutex<std::collections::BTreeMap<u16, u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    queued: AtomicI64,
    /// Seconds per served request: sum (microseconds) and count.
    micros: AtomicU64,
    served: AtomicU64,
    /// Log each request served ([`ServeOptions::log_requests`]).
    log: bool,
}

impl Metrics {
    pub(crate) fn queued(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
    }
    pub(crate) fn dequeued(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }
    pub(crate) fn responded(&self, status: u16) {
        *self.responses.lock().unwrap_or_else(|e| e.into_inner()).entry(status).or_default() += 1;
    }
    pub(crate) fn served(&self, seconds: f64, c: &worker::Completion) {
        self.micros.fetch_add((seconds * 1e6) as u64, Ordering::SeqCst);
        let n = self.served.fetch_add(1, Ordering::SeqCst) + 1;
        self.prompt_tokens.fetch_add(c.prompt_tokens as u64, Ordering::SeqCst);
        self.completion_tokens.fetch_add(c.completion_tokens as u64, Ordering::SeqCst);
        if self.log {
            eprintln!(
                "request {n}: {} prompt tokens ({} cached), {} generated, {}, {seconds:.2} s",
                c.prompt_tokens, c.cached_tokens, c.completion_tokens, c.finish_reason
            );
        }
    }

    /// The Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("# TYPE reagent_responses_total counter\n");
        for (status, n) in self.responses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            s.push_str(&format!("reagent_responses_total{{status=\"{status}\"}} {n}\n"));
        }
        let g = |o: &AtomicU64| o.load(Ordering::SeqCst);
        s.push_str(&format!(
            "# TYPE reagent_prompt_tokens_total counter\nreagent_prompt_tokens_total {}\n\
             # TYPE reagent_completion_tokens_total counter\nreagent_completion_tokens_total {}\n\
             # TYPE reagent_queue_depth gauge\nreagent_queue_depth {}\n\
             # TYPE reagent_request_seconds summary\nreagent_request_seconds_sum {:.6}\nreagent_request_seconds_count {}\n",
            g(&self.prompt_tokens),
            g(&self.completion_tokens),
            self.queued.load(Ordering::SeqCst).max(0),
            g(&self.micros) as f64 / 1e6,
            g(&self.served),
        ));
        s
    }
}

/// A running server: its address, and a way to stop it.
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds and starts serving on background threads.
    pub fn start(driver: ModelDriver, opts: ServeOptions) -> Result<Self> {
        if opts.think_budget.is_some_and(|n| n > 0) && !crate::agent::Driver::supports_thinking(&driver) {
            return Err(Error::param("think budget", "the model's chat template has no thinking section"));
        }
        let loopback = matches!(opts.host.as_str(), "127.0.0.1" | "::1" | "localhost");
        if !loopback && opts.api_key.is_none() && !opts.insecure_no_auth {
            return Err(Error::param(
                "host",
                format!("`{}` is reachable from other machines: give --api-key, or --insecure-no-auth", opts.host),
            ));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("reagent-http")
            .enable_all()
            .build()
            .map_err(|e| Error::param("server", format!("cannot start the runtime: {e}")))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((opts.host.as_str(), opts.port)))
            .map_err(|e| Error::param("host", format!("cannot listen on {}:{}: {e}", opts.host, opts.port)))?;
        let addr = listener.local_addr().map_err(|e| Error::param("host", e.to_string()))?;
        let metrics = std::sync::Arc::new(Metrics { log: opts.log_requests, ..Metrics::default() });
        let (jobs, queue) = std::sync::mpsc::sync_channel(opts.queue);
        let worker = worker::Worker::new(driver, opts.profile, opts.parallel_calls, opts.think_budget, metrics.clone());
        // Cancelled at shutdown: the generation in progress ends between tokens.
        let stopping = crate::limits::Cancel::new();
        let scope = stopping.clone();
        std::thread::Builder::new()
            .name("reagent-model".into())
            .spawn(move || scope.scope(|| worker.run(queue)))
            .map_err(|e| Error::param("server", format!("cannot start the model thread: {e}")))?;
        let (timeout, max_connections) = (opts.limits.client_timeout, opts.limits.max_connections);
        let app = http::router(http::AppState { jobs, metrics, opts });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("reagent-serve".into())
            .spawn(move || {
                rt.block_on(async move {
                    let stop = async move {
                        let _ = stopped.await;
                        stopping.cancel();
                    };
                    // Open connections get a few seconds to finish; then the runtime drops them.
                    conn::serve(listener, app, timeout, max_connections, stop, std::time::Duration::from_secs(5)).await;
                });
                rt.shutdown_timeout(std::time::Duration::from_millis(100));
            })
            .map_err(|e| Error::param("server", format!("cannot start the server thread: {e}")))?;
        Ok(Self { addr, stop: Some(stop), thread: Some(thread) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until Ctrl-C (or [`crate::limits::interrupted`]'s process-wide flag).
    pub fn wait(mut self) {
        while !crate::limits::interrupted() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        self.shutdown();
    }

    /// Stops accepting connections and lets the open ones finish.
    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}
