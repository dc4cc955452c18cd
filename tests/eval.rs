//! `reagent eval`: task files, scoring, output lines, resume (also after a kill), on scripted decisions and
//! on the real test model.

mod common;

use std::process::Command;

use reagent::agent::{AgentConfig, EventLog, ScriptedDriver};
use reagent::eval::{
    finished_ids, load_tasks, matches_expected, run_eval, EvalOptions, ExpectedCall, RecordedCall, Summary,
};
use reagent::ToolSpec;
use serde_json::json;

fn suite() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eval_tasks.jsonl")
}

#[test]
fn the_suite_loads_and_covers_every_kind_of_task() {
    let tasks = load_tasks(&suite()).unwrap();
    assert!(tasks.len() >= 60);
    for kind in ["single", "choose", "parallel", "none", "nested", "messages"] {
        assert!(tasks.iter().any(|t| t.id.starts_with(kind)), "{kind}");
    }
    assert!(tasks.iter().all(|t| t.expected.is_some()));
    assert!(tasks.iter().any(|t| t.expected.as_ref().unwrap().len() == 2), "parallel calls");
    assert!(tasks.iter().any(|t| t.expected.as_ref().unwrap().is_empty()), "no call");
}

#[test]
fn bad_task_files_name_the_line() {
    let p = common::scratch().join("bad-tasks.jsonl");
    std::fs::write(&p, "{\"id\":\"a\",\"question\":\"q\"}\n{\"id\":\"b\"}\n").unwrap();
    let e = load_tasks(&p).unwrap_err().to_string();
    assert!(e.contains("bad-tasks.jsonl:2") && e.contains("question"), "{e}");
    std::fs::write(&p, "{\"id\":\"a\",\"question\":\"q\"}\n{\"id\":\"a\",\"question\":\"r\"}\n").unwrap();
    assert!(load_tasks(&p).unwrap_err().to_string().contains("duplicate id `a`"));
    std::fs::write(&p, "{\"id\":\"a\",\"question\":\"q\",\"functions\":[{\"name\":\"bad name\"}]}\n").unwrap();
    assert!(load_tasks(&p).unwrap_err().to_string().contains(":1:"));
}

#[test]
fn scoring_compares_names_and_arguments_numerically_in_any_order() {
    let spec = ToolSpec::new(
        "w",
        "",
        json!({"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","default":"c"},"n":{"type":"number"}}}),
    )
    .unwrap();
    let e = |a| ExpectedCall { name: "w".into(), arguments: a };
    let c = |a| RecordedCall { name: "w".into(), arguments: a };
    let specs = [spec];
    assert!(matches_expected(&[e(json!({"n": 2}))], &[c(json!({"n": 2.0}))], &specs));
    assert!(matches_expected(&[e(json!({"city": "A"}))], &[c(json!({"city": "A", "unit": "c"}))], &specs));
    assert!(!matches_expected(&[e(json!({"city": "A"}))], &[c(json!({"city": "A", "unit": "f"}))], &specs));
    assert!(!matches_expected(&[e(json!({"city": "A"}))], &[c(json!({"city": "B"}))], &specs));
    assert!(matches_expected(
        &[e(json!({"city": "A"})), e(json!({"city": "B"}))],
        &[c(json!({"city": "B"})), c(json!({"city": "A"}))],
        &specs
    ));
    assert!(!matches_expected(&[e(json!({"city": "A"}))], &[], &specs));
    assert!(matches_expected(&[], &[], &specs));
    // The first call fits both expectations (its unit is the default); first-fit pairing would give it to
    // the first one and leave the second call unmatched.
    assert!(matches_expected(
        &[e(json!({"city": "A"})), e(json!({"city": "A", "unit": "c"}))],
        &[c(json!({"city": "A", "unit": "c"})), c(json!({"city": "A"}))],
        &specs
    ));
}

fn call(tool: &str, args: serde_json::Value) -> String {
    json!({"thought": "t", "type": "call_tool", "tool": tool, "args": args}).to_string()
}

#[test]
fn dry_run_records_first_decisions_and_resume_skips_finished_tasks() {
    let tasks = load_tasks(&suite()).unwrap();
    let first: Vec<String> = vec![
        call("get_weather", json!({"city": "Paris"})),
        call("get_weather", json!({"city": "Kyoto", "unit": "fahrenheit"})),
        json!({"thought": "t", "type": "final_answer", "answer": "no"}).to_string(),
    ];
    let trace = common::scratch().join("eval-trace.jsonl");
    let opts = EvalOptions::default()
        .dry_run(true)
        .limit(Some(3))
        .agent(AgentConfig::default())
        .events(Some(EventLog::create(&trace).unwrap()));
    let out_path = common::scratch().join("eval-out.jsonl");
    let mut out = std::fs::File::create(&out_path).unwrap();
    let mut seen = Vec::new();
    let (_, results) =
        run_eval(Box::new(ScriptedDriver::new(first)), &tasks, &[], &opts, &mut out, &mut |n, t| seen.push((n, t)))
            .unwrap();
    assert_eq!(seen, [(1, 3), (2, 3), (3, 3)]);
    assert_eq!(results[0].correct, Some(true));
    assert_eq!(results[1].correct, Some(false), "wrong city");
    assert_eq!(results[2].calls, []);
    assert_eq!(results[2].stop_reason, "final_answer");
    assert_eq!(results[0].stop_reason, "first_decision");
    // The trace has each task's events in order, under its id: one run started and one decision each.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |kind: &str| -> Vec<&str> {
        lines.iter().filter(|l| l["event"]["event"] == kind).map(|l| l["task"].as_str().unwrap()).collect()
    };
    let ids: Vec<&str> = tasks[..3].iter().map(|t| t.id.as_str()).collect();
    assert_eq!(of("run_started"), ids);
    assert_eq!(of("decision_extracted"), ids);
    // The file holds the same lines; a cut-off last line (an interrupted write) is dropped on resume.
    let mut text = std::fs::read_to_string(&out_path).unwrap();
    text.push_str("{\"id\":\"single-04\",\"cal");
    std::fs::write(&out_path, &text).unwrap();
    let done = finished_ids(&out_path).unwrap();
    assert_eq!(done, results);
    assert!(std::fs::read_to_string(&out_path).unwrap().ends_with("}\n"));
    let s = Summary::of(&done);
    assert_eq!((s.tasks, s.scored, s.correct, s.valid_first_try), (3, 3, 1, 3));
}

#[test]
fn eval_on_the_test_model_writes_lines_and_resumes_after_a_kill() {
    let model = common::real_model_path("smollm2-135m");
    let out = common::scratch().join("eval-smol.jsonl");
    let summary = common::scratch().join("eval-smol-summary.json");
    let cmd = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_reagent"));
        c.env("REAGENT_PROMPT_CACHE", "0");
        c.args(["eval", suite().to_str().unwrap(), "--model", model.to_str().unwrap(), "--dry-run"])
            .args(["--out", out.to_str().unwrap(), "--parallel-calls", "2"])
            .args(extra);
        c
    };
    // Start, wait for two finished lines, kill.
    let mut child = cmd(&["--limit", "30"]).stderr(std::process::Stdio::null()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while std::fs::read_to_string(&out).map_or(0, |t| t.lines().count()) < 2 {
        assert!(std::time::Instant::now() < deadline, "no output lines");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = finished_ids(&out).unwrap();
    assert!(before.len() >= 2);
    // `--limit` counts the whole eval: three more than were done.
    let limit = (before.len() + 3).to_string();
    let o = cmd(&["--resume", "--limit", &limit, "--summary-json", summary.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = finished_ids(&out).unwrap();
    assert_eq!(after.len(), before.len() + 3);
    let mut ids: Vec<&str> = after.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), after.len(), "no task twice");
    assert_eq!(&after[..before.len()], &before[..]);
    for r in &after {
        // Every task ends in a valid decision. Not necessarily on the first try: the grammar makes a
        // finished decision valid, but a 135M model can ramble to the 512-token limit inside a 1000-character
        // answer, and that attempt is retried.
        assert!(r.correct.is_some() && r.generated_tokens > 0 && r.seconds > 0.0);
        assert!(matches!(r.stop_reason.as_str(), "first_decision" | "final_answer"), "{r:?}");
    }
    // Under the grammar most decisions are valid at once; retries are the exception.
    let first_try = after.iter().filter(|r| r.valid_first_try).count();
    assert!(2 * first_try > after.len(), "only {first_try} of {} valid on the first try", after.len());
    // The model is batch invariant, so the KV cache goes on from task to task (the shared start of the
    // system prompt is not computed again) without changing a result (see
    // a_resumed_eval_matches_an_uninterrupted_one).
    assert!(after.iter().skip(1).any(|r| r.reused_tokens > 0), "no task reused its predecessor's prefix");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["tasks"], after.len());
}

#[test]
fn a_task_the_settings_cannot_run_gets_a_line_and_the_eval_goes_on() {
    let tasks = load_tasks(&suite()).unwrap();
    // `get_weather` is forced, but `single-07` (a currency task) has no such function.
    let picked: Vec<_> = tasks.iter().filter(|t| t.id == "single-01" || t.id == "single-07").cloned().collect();
    let opts = EvalOptions::default()
        .dry_run(true)
        .limit(None)
        .agent(AgentConfig::default().tool_choice(reagent::ToolChoice::Specific("get_weather".into())));
    let driver = ScriptedDriver::new([call("get_weather", json!({"city": "Paris"}))]);
    let mut out = Vec::new();
    let (_, results) = run_eval(Box::new(driver), &picked, &[], &opts, &mut out, &mut |_, _| {}).unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0].correct, Some(true));
    assert!(results[1].stop_reason.starts_with("invalid_task") && results[1].stop_reason.contains("get_weather"));
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 2);
}

#[test]
fn a_task_without_any_valid_decision_is_wrong_even_when_no_call_was_expected() {
    let tasks: Vec<_> =
        load_tasks(&suite()).unwrap().into_iter().filter(|t| t.id.starts_with("none-")).take(1).collect();
    assert_eq!(tasks[0].expected.as_deref().map(<[_]>::len), Some(0), "a task that expects no call");
    let garbage = vec!["not a decision".to_string(); 20];
    let opts = EvalOptions::default().dry_run(true).limit(None).agent(AgentConfig::default());
    let mut out = Vec::new();
    let (_, results) =
        run_eval(Box::new(ScriptedDriver::new(garbage)), &tasks, &[], &opts, &mut out, &mut |_, _| {}).unwrap();
    assert_eq!(results[0].stop_reason, "retries_exhausted");
    assert_eq!(results[0].steps, 0);
    assert_eq!(results[0].correct, Some(false));
}

/// Categories come from a task's `category` field, else from its id (BFCL's `live_simple_105-62-0` is
/// `live_simple`); the summary gives accuracy per category; a field reagent does not know is reported by
/// name, once, with the line it first appears on, and does not stop the file from loading.
#[test]
fn categories_are_summarised_and_unknown_fields_reported_once() {
    use reagent::eval::unknown_fields;
    let p = common::scratch().join("categories.jsonl");
    let f = r#""functions":[{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}]"#;
    let lines = [
        format!(r#"{{"id":"simple_1","question":"q",{f},"expected":[{{"name":"f","arguments":{{"x":1}}}}]}}"#),
        format!(r#"{{"id":"live_simple_105-62-0","question":"q",{f},"expected":[],"source":"bfcl"}}"#),
        format!(r#"{{"id":"x","category":"mine","question":"q",{f},"expected":[],"source":"bfcl","note":1}}"#),
    ];
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    let tasks = load_tasks(&p).unwrap();
    let cats: Vec<String> = tasks.iter().map(|t| t.category()).collect();
    assert_eq!(cats, ["simple", "live_simple", "mine"]);
    assert_eq!(unknown_fields(&tasks), [("source".to_string(), 2), ("note".to_string(), 3)]);
    let script = vec![call("f", json!({"x": 1})), call("f", json!({"x": 2})), call("f", json!({"x": 3}))];
    let opts = EvalOptions::default().dry_run(true).limit(None).agent(AgentConfig::default());
    let (_, results) =
        run_eval(Box::new(ScriptedDriver::new(script)), &tasks, &[], &opts, &mut Vec::new(), &mut |_, _| {}).unwrap();
    let s = Summary::of(&results);
    let acc = |c: &str| (s.categories[c].tasks, s.categories[c].with_calls, s.categories[c].accuracy);
    assert_eq!(acc("simple"), (1, 1, Some(1.0)));
    assert_eq!(acc("live_simple"), (1, 1, Some(0.0)), "a call where none was expected");
    assert_eq!(acc("mine"), (1, 1, Some(0.0)));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["categories"]["simple"]["accuracy"], 1.0, "in --summary-json too");
}

/// Multi-step tasks: `tools` offers provided tools under their own descriptions, the loop runs them, and
/// `expected_answer` scores the final answer (every text, any case). The agent suite in
/// `tests/data/agent_tasks.jsonl` is made of such tasks over `tests/data/agent_fixture`.
#[test]
fn provided_tools_run_and_final_answers_are_scored() {
    use reagent::tools::{builtin_tools, BuiltinOptions};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agent_fixture");
    let p = common::scratch().join("agent-tasks.jsonl");
    let lines = [
        r#"{"id":"read-1","question":"Who owns the project in project.txt?","tools":["read_file","list_dir"],"expected_answer":"maria lopez"}"#,
        r#"{"id":"read-2","question":"Who owns it?","tools":["read_file"],"expected_answer":["Maria","Falcon"]}"#,
    ];
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    let tasks = load_tasks(&p).unwrap();
    let tools = builtin_tools(&BuiltinOptions::default().root(root)).unwrap();
    let answer = |a: &str| json!({"thought": "t", "type": "final_answer", "answer": a}).to_string();
    let script = vec![
        call("read_file", json!({"path": "project.txt"})),
        answer("The owner is Maria Lopez."),
        answer("Maria Lopez."),
    ];
    let opts = EvalOptions::default().dry_run(false).limit(None).agent(AgentConfig::default());
    let (_, results) =
        run_eval(Box::new(ScriptedDriver::new(script)), &tasks, &tools, &opts, &mut Vec::new(), &mut |_, _| {})
            .unwrap();
    assert_eq!(results[0].calls.len(), 1);
    assert_eq!((results[0].steps, results[0].correct), (2, Some(true)));
    assert_eq!(results[1].correct, Some(false), "the project's name is missing from the answer");

    // A tool the eval does not provide: that task's line says so, and the eval goes on.
    let lines = [
        r#"{"id":"x","question":"q","tools":["teleport"],"expected_answer":"a"}"#,
        r#"{"id":"y","question":"q","tools":["calculator"]}"#,
    ];
    std::fs::write(&p, lines.join("\n")).unwrap();
    let tasks = load_tasks(&p).unwrap();
    let opts = EvalOptions::default().dry_run(true).limit(None).agent(AgentConfig::default());
    let script = vec![call("calculator", json!({"expression": "1+1"}))];
    let (_, results) =
        run_eval(Box::new(ScriptedDriver::new(script)), &tasks, &tools, &opts, &mut Vec::new(), &mut |_, _| {})
            .unwrap();
    assert!(results[0].stop_reason.starts_with("invalid_task") && results[0].stop_reason.contains("teleport"));
    assert_eq!(results[0].correct, Some(false));
    assert_eq!(results[1].calls.len(), 1);
}

#[test]
fn the_agent_suite_loads() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agent_tasks.jsonl");
    let tasks = load_tasks(&p).unwrap();
    assert!(tasks.len() >= 30);
    for kind in ["compute", "read", "read_compute", "search", "recover"] {
        assert!(tasks.iter().filter(|t| t.category() == kind).count() >= 6, "{kind}");
    }
    assert!(tasks.iter().all(|t| t.expected_answer.is_some() && !t.tools.is_empty() && t.unknown.is_empty()));
}

/// Input files are untrusted: a device, a FIFO or a directory is refused by name before it is read (no
/// unbounded growth, no hang), and a byte-order mark at the start of a task file is not an error.
#[cfg(unix)]
#[test]
fn task_and_tools_files_must_be_regular_files() {
    let fifo = common::scratch().join("tasks.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo(3) only creates the file.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    for p in [std::path::Path::new("/dev/zero"), fifo.as_path(), common::scratch()] {
        let e = load_tasks(p).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()) && e.contains("give a file"), "{e}");
        let e = reagent::tools::load_tools_file(p).err().unwrap().to_string();
        assert!(e.contains("give a file"), "{e}");
    }
    let bom = common::scratch().join("bom.jsonl");
    std::fs::write(&bom, "\u{feff}{\"id\":\"a\",\"question\":\"q\"}\n").unwrap();
    assert_eq!(load_tasks(&bom).unwrap()[0].id, "a");
    let latin1 = common::scratch().join("latin1.jsonl");
    std::fs::write(&latin1, b"{\"id\":\"a\",\"question\":\"caf\xe9\"}\n").unwrap();
    assert!(load_tasks(&latin1).unwrap_err().to_string().contains("not UTF-8"));
}

/// A resumed eval gives the tasks it runs the same results as an uninterrupted one, and so does an eval
/// that keeps the KV cache from task to task (issue 14: 8 of 62 tasks differed when the cache was kept,
/// before batch invariance).
#[test]
fn a_resumed_eval_matches_an_uninterrupted_one() {
    let tasks = load_tasks(&suite()).unwrap();
    let tasks = &tasks[..6];
    let model = || {
        let m = reagent::Model::load(common::real_model_path("smollm2-135m"), &Default::default()).unwrap();
        Box::new(reagent::agent::ModelDriver::constrained(m, reagent::Sampling::Greedy, 0).unwrap())
    };
    let opts = EvalOptions::default().dry_run(true);
    let (_, whole) = run_eval(model(), tasks, &[], &opts, &mut Vec::new(), &mut |_, _| {}).unwrap();
    let (_, resumed) = run_eval(model(), &tasks[3..], &[], &opts, &mut Vec::new(), &mut |_, _| {}).unwrap();
    for (a, b) in whole[3..].iter().zip(&resumed) {
        assert_eq!((&a.id, &a.calls, a.generated_tokens), (&b.id, &b.calls, b.generated_tokens));
        // Within a task, prompts share prefixes (the answer's plain chat after the call score's); across
        // tasks nothing: the first resumed task reuses what it did in the whole eval.
        assert_eq!(a.reused_tokens, b.reused_tokens, "{}: a task starts from an empty cache", a.id);
    }
    // Batch invariance: with the KV cache kept from task to task (what `reagent eval` does on an
    // invariant model) every task gives the same result, computed in other batches.
    let kept = opts.clone().reuse_across_tasks(true);
    let (_, reused) = run_eval(model(), tasks, &[], &kept, &mut Vec::new(), &mut |_, _| {}).unwrap();
    assert!(reused.iter().skip(1).any(|r| r.reused_tokens > 0), "no task reused its predecessor's prefix");
    for (a, b) in whole.iter().zip(&reused) {
        let of = |r: &reagent::eval::TaskResult| (r.id.clone(), r.calls.clone(), r.generated_tokens, r.correct);
        assert_eq!(of(a), of(b), "{}: a kept prefix changed the result", a.id);
    }
}
