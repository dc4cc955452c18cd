//! The HTTP side: routes, authentication, the body limit, the queue, and the API's response and
//! streaming shapes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{parse_chat, parse_completions, ApiError, ChatRequest};
use super::responses::{self, parse_responses, EventStream, ResponseMeta};
use super::worker::{Completion, Event, Job};
use super::{Metrics, ServeOptions};
use crate::limits::Cancel;
use crate::tools::ToolCall;

pub(super) struct AppState {
    pub jobs: SyncSender<Job>,
    pub metrics: Arc<Metrics>,
    pub opts: ServeOptions,
}

type Shared = Arc<AppState>;

pub(super) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(Arc::new(state))
}

fn error(st: &AppState, e: &ApiError) -> Response {
    st.metrics.responded(e.status);
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

async fn not_found(State(st): State<Shared>) -> Response {
    error(&st, &ApiError::new(404, "invalid_request_error", "no such route"))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics(State(st): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], st.metrics.render()).into_response()
}

async fn models(State(st): State<Shared>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return error(&st, &e);
    }
    Json(json!({"object": "list", "data": [
        {"id": st.opts.model_name, "object": "model", "created": 0, "owned_by": "reagent"}
    ]}))
    .into_response()
}

fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.opts.api_key else { return Ok(()) };
    let given =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if g == key => Ok(()),
        _ => Err(ApiError::new(401, "invalid_request_error", "a valid API key is required (Authorization: Bearer …)")),
    }
}

/// Cancels the request's generation when dropped: the handler's future or the response stream went away
/// with the client.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The body of an authorized request, read within the limit.
async fn authorized_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, Response> {
    authorize(st, headers).map_err(|e| error(st, &e))?;
    let limits = &st.opts.limits;
    match tokio::time::timeout(limits.client_timeout, read_body(body, limits.max_body_bytes)).await {
        Ok(read) => read.map_err(|e| error(st, &e)),
        Err(_) => {
            let s = limits.client_timeout.as_secs_f64();
            Err(error(
                st,
                &ApiError::new(408, "invalid_request_error", format!("the body did not arrive within {s} s")),
            ))
        }
    }
}

/// Queues a checked request for the model: its events, and the guard that cancels it when dropped; or
/// the response that refuses it (returned by the handler at once, so not worth a box).
#[allow(clippy::result_large_err)]
fn submit(st: &AppState, req: ChatRequest) -> Result<(UnboundedReceiver<Event>, CancelOnDrop), Response> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Cancel::new();
    let guard = CancelOnDrop(cancel.clone());
    st.metrics.queued();
    match st.jobs.try_send(Job { req, events: tx, cancel }) {
        Ok(()) => Ok((rx, guard)),
        Err(TrySendError::Full(_)) => {
            st.metrics.dequeued();
            st.metrics.responded(429);
            let e = ApiError::new(429, "rate_limit_error", "the server is busy: too many requests are waiting");
            Err((StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")], Json(e.body())).into_response())
        }
        Err(TrySendError::Disconnected(_)) => {
            st.metrics.dequeued();
            Err(error(st, &ApiError::new(503, "server_error", "the model is no longer running")))
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn chat(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    answer(st, headers, body, false).await
}

/// `POST /v1/completions`: a prompt continued, in the legacy completions API's shapes.
async fn completions(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    answer(st, headers, body, true).await
}

/// A chat request, or (`text`) a completions request.
async fn answer(st: Shared, headers: HeaderMap, body: Body, text: bool) -> Response {
    let bytes = match authorized_body(&st, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let parsed = match text {
        true => parse_completions(&bytes, &st.opts.limits),
        false => parse_chat(&bytes, &st.opts.limits),
    };
    let req = match parsed {
        Ok(r) => r,
        Err(e) => return error(&st, &e),
    };
    let (stream, include_usage) = (req.stream, req.include_usage);
    let (rx, guard) = match submit(&st, req) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let meta = Meta {
        id: format!("{}-{:016x}", if text { "cmpl" } else { "chatcmpl" }, rand::random::<u64>()),
        created: now_secs(),
        model: st.opts.model_name.clone(),
        started: Instant::now(),
        text,
    };
    match stream {
        true => streamed(st, rx, meta, include_usage, guard).await,
        false => whole(st, rx, meta, guard).await,
    }
}

/// `POST /v1/responses`: the same request, read from and answered in the Responses API's shapes.
async fn responses(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let bytes = match authorized_body(&st, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (req, echo) = match parse_responses(&bytes, &st.opts.limits) {
        Ok(r) => r,
        Err(e) => return error(&st, &e),
    };
    let stream = req.stream;
    let (mut rx, guard) = match submit(&st, req) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let started = Instant::now();
    let meta =
        ResponseMeta { id: responses::new_id("resp"), created: now_secs(), model: st.opts.model_name.clone(), echo };
    if !stream {
        let _guard = guard;
        return match completion(&st, &mut rx, started).await {
            Ok(c) => Json(responses::whole(&meta, &c)).into_response(),
            Err(r) => r,
        };
    }
    // As for chat: a request the model refuses still gets its 4xx before the stream begins.
    let first_event = rx.recv().await;
    if let Some(Event::Failed(e)) = &first_event {
        return error(&st, e);
    }
    let mut events = EventStream::new(meta);
    let pending: VecDeque<(String, String)> = events.start().into();
    let state = (st, rx, events, pending, first_event, false, guard);
    let stream = futures_util::stream::unfold(state, move |mut s| async move {
        let (st, rx, events, pending, first, done, _) = &mut s;
        loop {
            if let Some((kind, data)) = pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().event(kind).data(data)), s));
            }
            if *done {
                return None;
            }
            let e = match first.take() {
                Some(e) => Some(e),
                None => rx.recv().await,
            };
            *done = !matches!(e, Some(Event::Delta(_)));
            match e {
                Some(Event::Delta(text)) => pending.extend(events.text(&text)),
                Some(Event::Done(c)) => {
                    st.metrics.served(started.elapsed().as_secs_f64(), &c);
                    st.metrics.responded(200);
                    pending.extend(events.done(&c));
                }
                Some(Event::Failed(e)) => {
                    st.metrics.responded(e.status);
                    pending.push_back(events.failed(&e));
                }
                None => {
                    pending.push_back(events.failed(&ApiError::new(500, "server_error", "the model thread stopped")))
                }
            }
        }
    });
    Sse::new(stream).into_response()
}

/// A body past this many bytes is not even read to its end: the connection is dropped.
const DRAIN_CAP: usize = 64 << 20;

/// The body, at most `limit` bytes. A longer one is read on (and dropped) up to [`DRAIN_CAP`] so that the
/// client, still sending, gets its 400 rather than a reset connection.
async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let (mut bytes, mut total) = (Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad("body", format!("the body could not be read: {e}")))?;
        total += chunk.len();
        if total <= limit {
            bytes.extend_from_slice(&chunk);
        } else if total > DRAIN_CAP {
            break;
        }
    }
    match total <= limit {
        true => Ok(bytes),
        false => Err(ApiError::bad("body", format!("the body is over {limit} bytes"))),
    }
}

/// What every response of a request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    started: Instant,
    /// A completions request's: its chunks carry `text`, not a message's delta.
    text: bool,
}

impl Meta {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        if self.text {
            let text = delta.get("content").and_then(Value::as_str).unwrap_or_default();
            return json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                          "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]});
        }
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "system_fingerprint": null,
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    }
}

fn usage(c: &Completion) -> Value {
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
           "total_tokens": c.prompt_tokens + c.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": c.cached_tokens}})
}

fn tool_calls(calls: &[ToolCall], with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": format!("call_{:012x}", rand::random::<u64>() >> 16), "type": "function",
                               "function": {"name": c.tool, "arguments": c.args.to_string()}});
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// The finished request of a response that is not streamed (its text deltas passed over), counted in the
/// metrics; or the error response.
async fn completion(
    st: &AppState,
    rx: &mut UnboundedReceiver<Event>,
    started: Instant,
) -> Result<Completion, Response> {
    loop {
        match rx.recv().await {
            Some(Event::Delta(_)) => continue,
            Some(Event::Failed(e)) => return Err(error(st, &e)),
            None => return Err(error(st, &ApiError::new(500, "server_error", "the model thread stopped"))),
            Some(Event::Done(c)) => {
                st.metrics.served(started.elapsed().as_secs_f64(), &c);
                st.metrics.responded(200);
                return Ok(c);
            }
        }
    }
}

async fn whole(st: Shared, mut rx: UnboundedReceiver<Event>, meta: Meta, _guard: CancelOnDrop) -> Response {
    let c = match completion(&st, &mut rx, meta.started).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    if meta.text {
        let text = c.content.clone().unwrap_or_default();
        return Json(json!({
            "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": c.finish_reason}],
            "usage": usage(&c),
        }))
        .into_response();
    }
    let mut message = json!({"role": "assistant", "content": c.content, "refusal": null});
    if let Some(r) = &c.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if !c.calls.is_empty() {
        message["tool_calls"] = json!(tool_calls(&c.calls, false));
    }
    Json(json!({
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "system_fingerprint": null,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": c.finish_reason}],
        "usage": usage(&c),
    }))
    .into_response()
}

/// The stream's state: the worker's events, and SSE events made from one not yet sent.
struct Streaming {
    st: Shared,
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    include_usage: bool,
    pending: VecDeque<String>,
    /// The content streamed as it came (a chat generation, an answer in the model's own words), rather
    /// than with the end.
    streamed_text: String,
    done: bool,
    _guard: CancelOnDrop,
}

impl Streaming {
    /// The SSE data of one worker event.
    fn on(&mut self, e: Option<Event>) {
        match e {
            Some(Event::Delta(text)) => {
                self.streamed_text.push_str(&text);
                self.pending.push_back(self.meta.chunk(json!({"content": text}), None).to_string());
            }
            Some(Event::Done(c)) => {
                self.st.metrics.served(self.meta.started.elapsed().as_secs_f64(), &c);
                self.st.metrics.responded(200);
                if let Some(r) = &c.reasoning {
                    self.pending.push_back(self.meta.chunk(json!({"reasoning_content": r}), None).to_string());
                }
                match &c.content {
                    // Sent as it came.
                    Some(text) if text.trim() == self.streamed_text.trim() => {}
                    // Nothing streamed, or a reply streamed and then not used (cut off, an error copied):
                    // the answer that stands, whole, on a line of its own.
                    Some(text) if self.streamed_text.is_empty() => {
                        self.pending.push_back(self.meta.chunk(json!({"content": text}), None).to_string())
                    }
                    Some(text) => self
                        .pending
                        .push_back(self.meta.chunk(json!({"content": format!("\n{text}")}), None).to_string()),
                    None => {}
                }
                if !c.calls.is_empty() {
                    let delta = json!({"tool_calls": tool_calls(&c.calls, true)});
                    self.pending.push_back(self.meta.chunk(delta, None).to_string());
                }
                self.pending.push_back(self.meta.chunk(json!({}), Some(c.finish_reason)).to_string());
                if self.include_usage {
                    let mut u = self.meta.chunk(json!({}), None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&c);
                    self.pending.push_back(u.to_string());
                }
                self.end();
            }
            Some(Event::Failed(e)) => {
                self.st.metrics.responded(e.status);
                self.pending.push_back(e.body().to_string());
                self.end();
            }
            None => {
                self.pending
                    .push_back(ApiError::new(500, "server_error", "the model thread stopped").body().to_string());
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.pending.push_back("[DONE]".into());
        self.done = true;
    }
}

async fn streamed(
    st: Shared,
    mut rx: UnboundedReceiver<Event>,
    meta: Meta,
    include_usage: bool,
    guard: CancelOnDrop,
) -> Response {
    // The status goes out with the first byte: a request the model refuses (a conversation over the
    // context, a schema the grammar engine rejects) still gets its 4xx, not a 200 and an error event.
    let first_event = rx.recv().await;
    if let Some(Event::Failed(e)) = &first_event {
        return error(&st, e);
    }
    // A chat stream opens with the assistant's role; a completion's has none.
    let first = (!meta.text).then(|| meta.chunk(json!({"role": "assistant", "content": ""}), None).to_string());
    let mut state = Streaming {
        st,
        rx,
        meta,
        include_usage,
        pending: first.into_iter().collect(),
        streamed_text: String::new(),
        done: false,
        _guard: guard,
    };
    state.on(first_event);
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), s));
            }
            if s.done {
                return None;
            }
            let e = s.rx.recv().await;
            s.on(e);
        }
    });
    Sse::new(events).into_response()
}
