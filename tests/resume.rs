//! Durable runs: a run killed at any event boundary resumes from its trace to the same answer, and each
//! call that changes things runs once, or is reported unknown when the kill fell inside it.

use std::sync::{Arc, Mutex};

use reagent::agent::{read_trace, Agent, EventLog, ScriptedDriver, StopReason, TraceHeader};
use reagent::tools::{FnTool, ToolError};
use reagent::ToolSpec;
use serde_json::{json, Value};

fn call(tool: &str, args: Value) -> String {
    json!({"thought": "", "type": "call_tool", "tool": tool, "args": args}).to_string()
}

fn answer(a: &str) -> String {
    json!({"thought": "", "type": "final_answer", "answer": a}).to_string()
}

const TASK: &str = "Read a, write hello to out.txt, add 1+2, write done to log.txt";

fn script() -> Vec<String> {
    vec![
        call("read", json!({"name": "a"})),
        call("write", json!({"path": "out.txt", "text": "hello"})),
        call("calc", json!({"expression": "1+2"})),
        call("write", json!({"path": "log.txt", "text": "done"})),
        answer("finished"),
    ]
}

fn params() -> Value {
    json!({"type": "object", "properties": {"name": {"type": "string"}, "path": {"type": "string"},
        "text": {"type": "string"}, "expression": {"type": "string"}}})
}

/// An agent over the scripted decisions from `from` on, whose `write` tool counts its runs in `writes`.
fn agent(from: usize, writes: Arc<Mutex<Vec<Value>>>, log: Option<EventLog>) -> Agent {
    let read = FnTool::new(ToolSpec::new("read", "Reads a note.", params()).unwrap(), |_: &Value| {
        Ok::<_, ToolError>(json!("alpha content"))
    })
    .read_only();
    let calc = FnTool::new(ToolSpec::new("calc", "Adds.", params()).unwrap(), |_: &Value| Ok::<_, ToolError>(json!(3)))
        .read_only();
    let write = FnTool::new(ToolSpec::new("write", "Writes a file.", params()).unwrap(), move |a: &Value| {
        writes.lock().unwrap().push(a.clone());
        Ok::<_, ToolError>(json!("written"))
    });
    let mut b = Agent::builder()
        .driver(ScriptedDriver::new(script().split_off(from)))
        .tool(read)
        .tool(calc)
        .tool(write)
        .config(reagent::AgentConfig::default().first_call(reagent::agent::FirstCall::Never));
    if let Some(log) = log {
        b = b.events(log);
    }
    b.build().unwrap()
}

/// Kills at every event boundary (the trace cut after each of its lines, as a SIGKILL leaves it: every
/// line is written whole before the run goes on), and between a call's start and its end.
#[test]
fn a_run_killed_at_any_event_resumes_to_the_same_end_with_each_write_done_once() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.jsonl");
    let writes: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = EventLog::create(&full).unwrap();
    let header = TraceHeader::new(TASK, "model".into(), &[], "settings".into());
    log.write_header(&header);
    let t = agent(0, writes.clone(), Some(log.clone())).run(TASK).unwrap();
    log.write_transcript(&t);
    assert_eq!(t.final_answer.as_deref(), Some("finished"));
    let total = writes.lock().unwrap().len();
    assert_eq!(total, 2);
    let text = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(read_trace(&full).unwrap().finished);

    let mut resumed_runs = 0;
    for k in 1..lines.len() {
        let cut = dir.path().join(format!("cut-{k}.jsonl"));
        std::fs::write(&cut, lines[..k].iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        // What ran before the kill: the writes whose start is in the trace (one started and not finished
        // may or may not have done its work; counted as done).
        let before = lines[..k].iter().filter(|l| l.contains("tool_call_started") && l.contains("\"write\"")).count();
        let recorded = read_trace(&cut).unwrap();
        assert_eq!(recorded.header.as_ref(), Some(&header));
        assert!(!recorded.finished);
        let steps = recorded.steps.len();
        let after: Arc<Mutex<Vec<Value>>> = Arc::default();
        let log = EventLog::append(&cut, recorded.bytes).unwrap();
        let t =
            agent(steps, after.clone(), Some(log)).resume(&[reagent::ChatMessage::user(TASK)], recorded.steps).unwrap();
        assert_eq!(t.stop_reason, StopReason::FinalAnswer, "cut after line {k}");
        assert_eq!(t.final_answer.as_deref(), Some("finished"), "cut after line {k}");
        assert_eq!(t.steps.len(), 5, "cut after line {k}");
        assert_eq!(before + after.lock().unwrap().len(), total, "cut after line {k}: each write once");
        // A write cut inside its call is not run again: its step says its outcome is unknown.
        let inside = lines[k - 1].contains("tool_call_started") && lines[k - 1].contains("\"write\"");
        if inside {
            let unknown = t.steps.iter().flat_map(|s| &s.calls).any(|c| c.outcome.observation().contains("unknown"));
            assert!(unknown, "cut after line {k}");
        }
        // The appended trace reads as one finished run... once the transcript is written.
        resumed_runs += 1;
    }
    assert!(resumed_runs >= 15, "{resumed_runs}");
}

/// A trace with a torn last line (a kill mid-write) or garbage is read up to its last complete event; a
/// header from another task, model or tool set says what differs.
#[test]
fn a_damaged_trace_is_read_to_its_last_complete_event_and_a_foreign_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let writes: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = EventLog::create(&path).unwrap();
    agent(0, writes, Some(log)).run(TASK).unwrap();
    let whole = read_trace(&path).unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"event\": \"tool_call_sta");
    std::fs::write(&path, &text).unwrap();
    let torn = read_trace(&path).unwrap();
    assert_eq!(torn.steps, whole.steps);
    assert_eq!(torn.bytes, whole.bytes);
    // A torn character is a torn line too.
    let mut bytes = std::fs::read_to_string(&path).unwrap().into_bytes();
    let keep = bytes.len() - "{\"event\": \"tool_call_sta".len();
    bytes.truncate(keep);
    bytes.extend_from_slice(&[0xE2, 0x82]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read_trace(&path).unwrap().steps, whole.steps);
    // A damaged line with events after it is refused: resuming before it would redo what they recorded.
    let lines: Vec<&str> = text.lines().collect();
    let mut middle = lines.clone();
    middle[3] = "{damaged";
    std::fs::write(&path, middle.join("\n") + "\n").unwrap();
    let err = read_trace(&path).unwrap_err().to_string();
    assert!(err.contains("line 4 is damaged"), "{err}");
    std::fs::write(&path, "garbage\n").unwrap();
    let garbage = read_trace(&path).unwrap();
    assert!(garbage.steps.is_empty() && garbage.lines == 0);

    let spec = ToolSpec::new("write", "Writes a file.", params()).unwrap();
    let then = TraceHeader::new(TASK, "a.gguf 10 bytes".into(), std::slice::from_ref(&spec), "react".into());
    let other = ToolSpec::new("write", "Writes a file, appending.", params()).unwrap();
    let now = TraceHeader::new("another task", "b.gguf 12 bytes".into(), &[other], "react".into());
    let diff = then.differences(&now);
    assert_eq!(diff.len(), 3, "{diff:?}");
    assert!(diff[0].starts_with("task:") && diff[1].starts_with("model:") && diff[2].starts_with("tools:"), "{diff:?}");
    assert!(then.differences(&then).is_empty());
}

/// A step of two calls, the first held (its value came from a tool's output), the second a write that
/// completed, cut before the step's record: the write is matched to its recorded result by the call, not
/// by its position (the held call never started), and is not run again.
#[test]
fn a_completed_write_after_a_held_call_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.jsonl");
    let task = "Read a, then write out.txt";
    let script = vec![
        call("read", json!({"name": "a"})),
        json!({"thought": "", "type": "call_tools", "calls": [
            {"tool": "write", "args": {"path": "alpha content"}},
            {"tool": "write", "args": {"path": "out.txt"}}
        ]})
        .to_string(),
        answer("done"),
    ];
    let build = |from: usize, writes: Arc<Mutex<Vec<Value>>>, log: EventLog| {
        let read = FnTool::new(ToolSpec::new("read", "Reads a note.", params()).unwrap(), |_: &Value| {
            Ok::<_, ToolError>(json!("alpha content"))
        })
        .read_only();
        let write = FnTool::new(ToolSpec::new("write", "Writes a file.", params()).unwrap(), move |a: &Value| {
            writes.lock().unwrap().push(a.clone());
            Ok::<_, ToolError>(json!("written"))
        });
        let config = reagent::AgentConfig::default()
            .first_call(reagent::agent::FirstCall::Never)
            .decision(reagent::DecisionOptions::default().parallel_calls(Some(2)));
        Agent::builder()
            .driver(ScriptedDriver::new(script.clone().split_off(from)))
            .tool(read)
            .tool(write)
            .config(config)
            .events(log)
            .build()
            .unwrap()
    };
    let writes: Arc<Mutex<Vec<Value>>> = Arc::default();
    let t = build(0, writes.clone(), EventLog::create(&full).unwrap()).run(task).unwrap();
    assert_eq!(t.final_answer.as_deref(), Some("done"));
    assert_eq!(writes.lock().unwrap().as_slice(), [json!({"path": "out.txt"})], "the first write was held");
    let text = std::fs::read_to_string(&full).unwrap();
    let cut_at = text.lines().position(|l| l.contains("tool_call_completed") && l.contains("out.txt")).unwrap();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, text.lines().take(cut_at + 1).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let recorded = read_trace(&cut).unwrap();
    let after: Arc<Mutex<Vec<Value>>> = Arc::default();
    let steps = recorded.steps.len();
    let t = build(steps, after.clone(), EventLog::append(&cut, recorded.bytes).unwrap())
        .resume(&[reagent::ChatMessage::user(task)], recorded.steps)
        .unwrap();
    assert_eq!(t.final_answer.as_deref(), Some("done"));
    assert!(after.lock().unwrap().is_empty(), "ran again: {:?}", after.lock().unwrap());
}

/// A step record written once: its outputs (a completed call's, a refused repeat's) are left out of the
/// `step_completed` event and read back from the trace's other events, whole.
#[test]
fn a_traces_records_get_their_outputs_back_from_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repeat.trace");
    let log = EventLog::create(&path).unwrap();
    let long = "x".repeat(5000) + "END";
    let out = long.clone();
    let read = FnTool::new(ToolSpec::new("read", "Reads a note.", params()).unwrap(), move |_: &Value| {
        Ok::<_, ToolError>(json!(out.clone()))
    })
    .read_only();
    let same = call("read", json!({"name": "a"}));
    let mut agent = Agent::builder()
        .driver(ScriptedDriver::new(vec![same.clone(), same, answer("done")]))
        .tool(read)
        .config(reagent::AgentConfig::default().first_call(reagent::agent::FirstCall::Never).repeat_limit(2))
        .events(log.clone())
        .build()
        .unwrap();
    let t = agent.run("read a twice").unwrap();
    assert!(matches!(t.steps[1].calls[0].outcome, reagent::tools::CallOutcome::Repeated { .. }), "{t:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("END").count(), 1, "the output is in the trace once");
    let recorded = read_trace(&path).unwrap();
    for (i, step) in t.steps.iter().take(2).enumerate() {
        let record = recorded.steps[i].record.as_ref().unwrap();
        assert_eq!(record.calls, step.calls, "step {i}");
        assert_eq!(record.observation.is_some(), step.observation.is_some());
    }
}

/// An edited trace is refused, naming the line and what differs: a tool's output changed in its event
/// line, lines of two steps swapped, a step's record moved under another decision. The trace as written
/// reads back whole.
#[test]
fn an_edited_trace_is_refused_naming_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let log = EventLog::create(&path).unwrap();
    agent(0, Arc::default(), Some(log)).run(TASK).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(read_trace(&path).unwrap().steps.len(), 5);
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let kind = |l: &str| serde_json::from_str::<Value>(l).unwrap()["event"].as_str().unwrap_or("").to_string();
    let refused = |lines: &[String]| {
        let edited = dir.path().join("edited.jsonl");
        std::fs::write(&edited, lines.join("\n") + "\n").unwrap();
        read_trace(&edited).unwrap_err().to_string()
    };

    // The read's output, changed where its event carries it.
    let at = lines.iter().position(|l| kind(l) == "tool_call_completed" && l.contains("alpha content")).unwrap();
    let mut edited = lines.clone();
    edited[at] = edited[at].replace("alpha content", "beta content");
    let err = refused(&edited);
    assert!(err.contains("the output of `read` is not the one its record was written with"), "{err}");

    // The decisions of steps 2 and 3 swapped.
    let decisions: Vec<usize> = (0..lines.len()).filter(|&i| kind(&lines[i]) == "decision_extracted").collect();
    let mut edited = lines.clone();
    edited.swap(decisions[1], decisions[2]);
    let err = refused(&edited);
    assert!(err.contains("out of order"), "{err}");

    // Step 1's record after step 2's decision.
    let records: Vec<usize> = (0..lines.len()).filter(|&i| kind(&lines[i]) == "step_completed").collect();
    let mut edited = lines.clone();
    let first = edited.remove(records[0]);
    edited.insert(decisions[1], first);
    let err = refused(&edited);
    assert!(err.contains("line") && err.contains("record is not of the decision before it"), "{err}");
}
