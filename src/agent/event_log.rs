//! Agent events as JSON lines in a file, written as they happen: `reagent run --trace` (one run, its
//! transcript last) and `reagent eval --trace` (every task's events, each line tagged with the task).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::events::{AgentEvent, EventSink, Transcript};
use crate::error::{Error, Result};
use crate::tools::CallOutcome;

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

    /// The run's header, the first line of a run's log ([`read_trace`]).
    pub fn write_header(&self, header: &TraceHeader) {
        self.write_line(&serde_json::json!({ "trace": header }));
    }

    /// Opens an existing run's log to go on writing it (a resumed run): cut to the `bytes` of its complete
    /// lines ([`RecordedRun::bytes`]), then appended to.
    pub fn append(path: &Path, bytes: u64) -> Result<Self> {
        let file = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| Error::io(path, e))?;
        file.set_len(bytes).map_err(|e| Error::io(path, e))?;
        let mut file = file;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0)).map_err(|e| Error::io(path, e))?;
        Ok(Self { path: path.to_path_buf(), file: Arc::new(Mutex::new((file, None))), task: None })
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

/// What a run's trace says about the run (the first line of `reagent run --trace`): enough to tell
/// whether a resumed run is the same run ([`TraceHeader::differences`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TraceHeader {
    /// The trace format's version.
    pub version: u32,
    pub task: String,
    /// The model file's name, size and (for catalog files) sha256.
    pub model: String,
    /// Each tool's name and a hash of its description and schema.
    pub tools: Vec<String>,
    /// The decision settings, as `reagent eval` describes them.
    pub settings: String,
}

/// The trace format [`TraceHeader::version`] this build writes. It reads this one and version 1, whose
/// `step_completed` records were written whole.
pub const TRACE_VERSION: u32 = 2;

impl TraceHeader {
    pub fn new(task: &str, model: String, tools: &[crate::tools::ToolSpec], settings: String) -> Self {
        let tools = tools
            .iter()
            .map(|t| {
                let mut h = sha2::Sha256::new();
                h.update(t.description.as_bytes());
                h.update(t.parameters.to_string().as_bytes());
                let digest: String = h.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect();
                format!("{}#{digest}", t.name)
            })
            .collect();
        Self { version: TRACE_VERSION, task: task.to_string(), model, tools, settings }
    }

    /// What differs between the run a trace recorded (`self`) and the one about to resume it, one line
    /// each; empty when they are the same run.
    pub fn differences(&self, now: &TraceHeader) -> Vec<String> {
        let mut out = Vec::new();
        if self.version != now.version && !(self.version == 1 && now.version == 2) {
            out.push(format!("trace format {} (this build reads {})", self.version, now.version));
        }
        if self.task != now.task {
            out.push(format!("task: `{}` in the trace, `{}` now", short(&self.task), short(&now.task)));
        }
        if self.model != now.model {
            out.push(format!("model: {} in the trace, {} now", self.model, now.model));
        }
        if self.tools != now.tools {
            let gone: Vec<&str> = self.tools.iter().filter(|t| !now.tools.contains(t)).map(String::as_str).collect();
            let new: Vec<&str> = now.tools.iter().filter(|t| !self.tools.contains(t)).map(String::as_str).collect();
            out.push(format!("tools: only in the trace [{}], only now [{}]", gone.join(", "), new.join(", ")));
        }
        if self.settings != now.settings {
            out.push(format!("decision settings: `{}` in the trace, `{}` now", self.settings, now.settings));
        }
        out
    }
}

fn short(s: &str) -> String {
    let cut: String = s.chars().take(60).collect();
    if cut.len() < s.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// One step of a recorded run, for [`Agent::resume`](super::Agent::resume).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RecordedStep {
    pub decision: super::Decision,
    /// The decision as the model wrote it.
    pub text: String,
    /// The whole step, when it completed (its calls' outcomes known).
    pub record: Option<super::Step>,
    /// For a step the run stopped inside: the calls that started, with their outcomes where they were
    /// recorded.
    pub started: Vec<(crate::tools::ToolCall, Option<crate::tools::CallOutcome>)>,
}

/// What a run's trace holds: its header, the steps it recorded, and whether it ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RecordedRun {
    pub header: Option<TraceHeader>,
    pub steps: Vec<RecordedStep>,
    /// The trace ends with the run's transcript: there is nothing to resume.
    pub finished: bool,
    /// Complete lines read; a torn or unreadable line and everything after it are not used.
    pub lines: usize,
    /// Bytes of the complete lines (where an appended trace continues).
    pub bytes: u64,
}

/// Reads the trace of a run ([`EventLog`] of `reagent run --trace`) up to its last complete event: a torn
/// last line (a killed run's) is left out. A damaged line with complete events after it is an error:
/// resuming from before it would run again what those events recorded.
pub fn read_trace(path: &Path) -> Result<RecordedRun> {
    /// The largest trace read (a run's observations are capped, so a long run's trace stays far below).
    const MAX_TRACE_BYTES: u64 = 1 << 30;
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        let problem = "not a regular file; give a trace file".into();
        return Err(Error::InputFile { path: path.to_path_buf(), problem });
    }
    if meta.len() > MAX_TRACE_BYTES {
        let problem = format!("{} bytes; traces are read up to {MAX_TRACE_BYTES} bytes", meta.len());
        return Err(Error::InputFile { path: path.to_path_buf(), problem });
    }
    // Bytes, not text: a line torn inside a character must not make the whole file unreadable.
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut run = RecordedRun { header: None, steps: Vec::new(), finished: false, lines: 0, bytes: 0 };
    let lines: Vec<&[u8]> = data.split_inclusive(|&b| b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let value = std::str::from_utf8(line)
            .ok()
            .filter(|l| l.ends_with('\n'))
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l.trim_end()).ok());
        let used = match &value {
            Some(v) => take_line(&mut run, v).map_err(|problem| Error::InputFile {
                path: path.to_path_buf(),
                problem: format!("line {}: {problem}; not resumed from an edited trace", i + 1),
            })?,
            None => false,
        };
        if !used {
            let later = lines[i + 1..].iter().any(|l| serde_json::from_slice::<serde_json::Value>(l).is_ok());
            if later {
                let problem = format!("line {} is damaged, and events follow it; not resumed from before it", i + 1);
                return Err(Error::InputFile { path: path.to_path_buf(), problem });
            }
            break;
        }
        run.lines += 1;
        run.bytes += line.len() as u64;
    }
    Ok(run)
}

/// Takes one trace line into `run`; false when it is not a line of a run's trace, an error naming what
/// differs when it contradicts the lines before it (lines out of order, a record of another decision, an
/// output that is not the one its step recorded).
fn take_line(run: &mut RecordedRun, value: &serde_json::Value) -> std::result::Result<bool, String> {
    use super::events::AgentEvent as E;
    if let Some(h) = value.get("trace") {
        let Ok(h) = serde_json::from_value(h.clone()) else { return Ok(false) };
        run.header = Some(h);
        return Ok(true);
    }
    if value.get("transcript").is_some() {
        run.finished = true;
        return Ok(true);
    }
    // The events a resume reads; others say nothing it needs (and may come from a newer build).
    const READ: [&str; 4] = ["decision_extracted", "tool_call_started", "tool_call_completed", "step_completed"];
    let Some(kind) = value.get("event").and_then(|e| e.as_str()) else { return Ok(false) };
    if !READ.contains(&kind) {
        return Ok(true);
    }
    let Ok(event) = serde_json::from_value::<E>(value.clone()) else { return Ok(false) };
    match event {
        E::DecisionExtracted { step, decision, text, .. } => {
            if step != run.steps.len() + 1 {
                return Err(format!("step {step}'s decision follows step {}'s: lines out of order", run.steps.len()));
            }
            run.steps.push(RecordedStep { decision, text, record: None, started: Vec::new() })
        }
        E::ToolCallStarted { call, .. } => {
            if let Some(s) = run.steps.last_mut() {
                s.started.push((call, None));
            }
        }
        E::ToolCallCompleted { call, outcome, .. } => {
            let last = run.steps.last_mut();
            if let Some((_, o)) = last.and_then(|s| s.started.iter_mut().rev().find(|(c, o)| *c == call && o.is_none()))
            {
                *o = Some(outcome);
            }
        }
        E::StepCompleted { step, mut record } => {
            let Some((s, earlier)) = run.steps.split_last_mut() else { return Ok(true) };
            if step != earlier.len() + 1 || record.decision != s.decision {
                return Err(format!(
                    "step {step}'s record is not of the decision before it (step {})",
                    earlier.len() + 1
                ));
            }
            // The outputs the record leaves out: those of the step's completed calls, in order; a refused
            // repeat's, the latest equal call's result. An empty output that no event carried was empty.
            let mut completed = s.started.iter().filter_map(|(c, o)| Some((c, o.as_ref()?)));
            for i in 0..record.calls.len() {
                let (before, rest) = record.calls.split_at_mut(i);
                let rec = &mut rest[0];
                match &mut rec.outcome {
                    CallOutcome::Ok { output } if output.is_empty() => {
                        if let Some((_, CallOutcome::Ok { output: full })) = completed.find(|(c, _)| **c == rec.call) {
                            output.clone_from(full);
                        }
                    }
                    CallOutcome::Repeated { output, .. } if output.is_empty() => {
                        let records = earlier.iter().filter_map(|s| s.record.as_ref()).flat_map(|r| r.calls.iter());
                        let latest = records.chain(before.iter()).rev().find(|c| c.call == rec.call);
                        *output = match latest.map(|c| &c.outcome) {
                            Some(CallOutcome::Repeated { output, .. }) => output.clone(),
                            Some(o) => o.observation(),
                            None => String::new(),
                        };
                    }
                    _ => {}
                }
            }
            // The outputs filled in are the ones the record was written with.
            let raw = value.get("record").and_then(|r| r.get("calls")).and_then(|c| c.as_array());
            for (rec, raw) in record.calls.iter().zip(raw.into_iter().flatten()) {
                let digest = raw.get("outcome").and_then(|o| o.get("output_digest")).and_then(|d| d.as_str());
                // A completed call's, which its own event line carried (a repeat's is rebuilt from earlier lines).
                let CallOutcome::Ok { output } = &rec.outcome else { continue };
                if digest.is_some_and(|d| d != super::events::output_digest(output)) {
                    return Err(format!(
                        "step {step}: the output of `{}` is not the one its record was written with",
                        rec.call.tool
                    ));
                }
            }
            s.record = Some(record);
        }
        _ => {}
    }
    Ok(true)
}
