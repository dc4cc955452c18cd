//! Agent events as JSON lines in a file, written as they happen: `reagent run --trace` (one run, its
//! transcript last) and `reagent eval --trace` (every task's events, each line tagged with the task).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::events::{AgentEvent, EventSink, Transcript};
use crate::error::{Error, Result};

/// A JSON-lines event log. Each line is one `write` to an unbuffered file, so an interrupted or killed
/// run leaves whole lines: `{"event": "tool_call_started", …}`, or `{"task": ID, "event": {…}}` through
/// [`for_task`](Self::for_task), and `{"transcript": …}` at the end of a run. Clones write to the same
/// file. The first write error is kept ([`take_error`](Self::take_error)); nothing is written after it.
#[derive(Clone)]
pub struct EventLog {
    path: PathBuf,
    file: Arc<Mutex<(std::fs::File, Option<std::io::Error>)>>,
    task: Option<String>,
}

impl EventLog {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(Self { path: path.to_path_buf(), file: Arc::new(Mutex::new((file, None))), task: None })
    }

    /// A handle on the same file whose event lines name the task they belong to.
    pub fn for_task(&self, id: &str) -> Self {
        Self { task: Some(id.to_string()), ..self.clone() }
    }

    pub fn write_event(&self, event: &AgentEvent) {
        let line = match &self.task {
            Some(task) => serde_json::json!({ "task": task, "event": event }),
            None => serde_json::json!(event),
        };
        self.write_line(&line);
    }

    /// The run's transcript, the last line of a run's log.
    pub fn write_transcript(&self, transcript: &Transcript) {
        self.write_line(&serde_json::json!({ "transcript": transcript }));
    }

    fn write_line(&self, line: &serde_json::Value) {
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (file, error) = &mut *guard;
        if error.is_none() {
            if let Err(e) = file.write_all((line.to_string() + "\n").as_bytes()) {
                *error = Some(e);
            }
        }
    }

    /// The first write error, if one happened (then taken: a later call returns `None`).
    pub fn take_error(&self) -> Option<Error> {
        let error = self.file.lock().unwrap_or_else(|e| e.into_inner()).1.take();
        error.map(|e| Error::io(&self.path, e))
    }

    /// Whether a write failed (the error not yet taken).
    pub fn failed(&self) -> bool {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).1.is_some()
    }
}

impl EventSink for EventLog {
    fn on_event(&mut self, event: &AgentEvent) {
        self.write_event(event);
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog").field("path", &self.path).field("task", &self.task).finish()
    }
}
