//! Tool definitions: the common function format, typed tools, external programs from a tools file, and
//! the executor's validation.

mod common;

use std::time::Duration;

use reagent::tools::{load_tools_file, CallOutcome, Executor, FnTool, ToolSet};
use reagent::{ToolCall, ToolSpec};
use serde_json::json;

#[test]
fn function_definitions_in_the_common_format() {
    let wrapped = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let s = ToolSpec::from_function_json(&wrapped).unwrap();
    assert_eq!(s.name, "get_weather");
    let bare = ToolSpec::from_function_json(&wrapped["function"]).unwrap();
    assert_eq!(s, bare);
    for (bad, needle) in [
        (json!({"description": "x"}), "name"),
        (json!({"name": "a b", "parameters": {"type": "object"}}), "letters"),
        (json!({"name": "t", "parameters": {"type": "string"}}), "object"),
        (json!({"name": "t", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}), "valid JSON schema"),
    ] {
        let err = ToolSpec::from_function_json(&bad).unwrap_err().to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

#[test]
fn the_executor_validates_arguments_with_the_schema() {
    let spec = ToolSpec::new(
        "t",
        "",
        json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}),
    )
    .unwrap();
    let mut set = ToolSet::default();
    set.add(std::sync::Arc::new(FnTool::new(spec, |a| Ok(a["n"].clone())))).unwrap();
    let mut ex = Executor::new(set, Duration::from_secs(5));
    let run = |ex: &mut Executor, args| ex.execute(ToolCall::new("t", args)).1;
    assert_eq!(run(&mut ex, json!({"n": 3})), CallOutcome::Ok { output: "3".into() });
    assert!(matches!(run(&mut ex, json!({"n": 0})), CallOutcome::InvalidArgs { .. }));
    assert!(matches!(run(&mut ex, json!({"n": "3"})), CallOutcome::InvalidArgs { .. }));
    assert!(matches!(run(&mut ex, json!({})), CallOutcome::InvalidArgs { .. }));
    let unknown = ex.execute(ToolCall::new("u", json!({}))).1;
    assert!(unknown.observation().contains("no tool `u`") && unknown.observation().contains("t"));
}

fn tools_file(body: &str, ext: &str) -> std::path::PathBuf {
    let path = common::scratch().join(format!("tools-{}.{ext}", body.len()));
    std::fs::write(&path, body).unwrap();
    path
}

#[test]
fn program_tools_get_json_on_stdin_and_fail_cleanly() {
    let path = tools_file(
        r#"
[[tool]]
name = "echo_args"
description = "Echoes its arguments."
command = ["cat"]
parameters = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[[tool]]
name = "fails"
command = ["sh", "-c", "echo broken >&2; exit 3"]
read_only = true

[[tool]]
name = "slow"
command = ["sleep", "5"]
timeout_s = 0.2

[[tool]]
name = "chatty"
command = ["sh", "-c", "yes | head -c 100000"]
max_output_bytes = 10
"#,
        "toml",
    );
    let tools = load_tools_file(&path).unwrap();
    let read_only: Vec<bool> = tools.iter().map(|t| t.read_only()).collect();
    assert_eq!(read_only, [false, true, false, false]);
    let mut set = ToolSet::default();
    for t in tools {
        set.add(t).unwrap();
    }
    let mut ex = Executor::new(set, Duration::from_secs(10));
    let mut run = |tool: &str, args| ex.execute(ToolCall::new(tool, args)).1;
    assert_eq!(run("echo_args", json!({"text": "hi"})), CallOutcome::Ok { output: r#"{"text":"hi"}"#.into() });
    let e = run("fails", json!({})).observation();
    assert!(e.contains("exit status: 3") && e.contains("broken"), "{e}");
    let e = run("slow", json!({})).observation();
    assert!(e.contains("killed after 0.2 s"), "{e}");
    let e = run("chatty", json!({})).observation();
    assert!(e.starts_with("y\ny\ny\ny\ny\n") && e.contains("cut at 10 bytes"), "{e}");
}

#[test]
fn bad_tools_files_name_the_problem() {
    let e = load_tools_file(&tools_file("[[tool]]\nname = \"x\"\ncommand = []\n", "toml")).err().unwrap().to_string();
    assert!(e.contains("`command`"), "{e}");
    let e = load_tools_file(&tools_file("[[tool]]\nname = \"x\"\ncommand = [\"a\"]\ncolor = 1\n", "toml"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("color"), "{e}");
    let json_file = tools_file(r#"{"tools": [{"name": "j", "command": ["true"]}]}"#, "json");
    assert_eq!(load_tools_file(&json_file).unwrap()[0].spec().name, "j");
}

/// A tool's children die with it: a background process that keeps the tool's stdout open does not hold the
/// call (the call ends when the tool does, `timeout_s` bounds everything), and nothing outlives the call.
#[cfg(unix)]
#[test]
fn program_tools_take_their_children_with_them() {
    // A sleep of a duration no other process has: its command line marks what this test started.
    let marker = format!("sleep 300.{}", std::process::id());
    let path = tools_file(
        &format!(
            r#"
[[tool]]
name = "forks"
command = ["sh", "-c", "{marker} & echo hi"]
timeout_s = 20

[[tool]]
name = "hangs"
command = ["sh", "-c", "{marker} & {marker}"]
timeout_s = 0.3

[[tool]]
name = "noisy"
command = ["sh", "-c", "echo first >&2; yes | head -c 20000 >&2; echo last-line >&2; exit 1"]

[[tool]]
name = "stubborn"
command = ["sh", "-c", "trap '' TERM INT HUP; exec >&- 2>&-; {marker}"]
timeout_s = 0.3
"#
        ),
        "toml",
    );
    let mut set = ToolSet::default();
    for t in load_tools_file(&path).unwrap() {
        set.add(t).unwrap();
    }
    let mut ex = Executor::new(set, Duration::from_secs(60));
    let t0 = std::time::Instant::now();
    let out = ex.execute(ToolCall::new("forks", json!({}))).1;
    assert_eq!(out, CallOutcome::Ok { output: "hi\n".into() });
    assert!(t0.elapsed() < Duration::from_secs(10), "the call waited for the background child");
    let e = ex.execute(ToolCall::new("hangs", json!({}))).1.observation();
    assert!(e.contains("killed after 0.3 s"), "{e}");
    // The error carries the end of stderr, where programs say what went wrong.
    let e = ex.execute(ToolCall::new("noisy", json!({}))).1.observation();
    assert!(e.contains("last-line") && !e.contains("first"), "{e}");
    // Ignoring SIGTERM and closing its output does not keep a tool alive past its timeout.
    let t0 = std::time::Instant::now();
    let e = ex.execute(ToolCall::new("stubborn", json!({}))).1.observation();
    assert!(e.contains("killed after 0.3 s") && t0.elapsed() < Duration::from_secs(5), "{e}");
    std::thread::sleep(Duration::from_millis(200));
    #[cfg(target_os = "linux")]
    {
        let left = common::processes_matching(&marker);
        assert!(left.is_empty(), "processes left behind: {left:?}");
    }
}

#[test]
fn absurd_timeouts_and_output_caps_are_refused_with_the_tool_named() {
    for (line, needle) in [
        ("timeout_s = 1e300", "`timeout_s`"),
        ("timeout_s = 0", "`timeout_s`"),
        ("timeout_s = -1", "`timeout_s`"),
        ("max_output_bytes = 1000000000000", "`max_output_bytes`"),
    ] {
        let body = format!("[[tool]]\nname = \"big\"\ncommand = [\"true\"]\n{line}\n");
        let e = load_tools_file(&tools_file(&body, "toml")).err().unwrap().to_string();
        assert!(e.contains(needle) && e.contains("big"), "{line}: {e}");
    }
    assert!(reagent::tools::timeout_from_secs(1e19).is_err());
    assert_eq!(reagent::tools::timeout_from_secs(2.5), Ok(Duration::from_millis(2500)));
}

#[test]
fn a_tool_cannot_take_the_final_answers_name() {
    let e = ToolSpec::new("final_answer", "", json!({"type": "object", "properties": {}})).unwrap_err().to_string();
    assert!(e.contains("final_answer") && e.contains("reserved"), "{e}");
    // Task files and tools files define tools through the same spec.
    let f = json!({"type": "function", "function": {"name": "final_answer", "parameters": {"type": "object"}}});
    assert!(ToolSpec::from_function_json(&f).unwrap_err().to_string().contains("reserved"));
}
