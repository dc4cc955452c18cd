//! The agent on models served over HTTP: an eval spread over several `reagent serve` replicas (the same
//! results as one; every task once when a replica dies mid-run), from the library and the CLI.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::tiny_long_path;
use reagent::agent::{AgentConfig, Driver, ModelDriver, RemoteConstraint, RemoteDriver, ToolChoice};
use reagent::eval::{load_tasks, run_eval_spread, EvalOptions, EvalTask, TaskResult, Worker};
use reagent::model::Arch;
use reagent::serve::{ServeOptions, Server};
use reagent::{LoadOptions, Model, Sampling};

fn replica() -> Server {
    let model = Model::load(tiny_long_path(Arch::Qwen2), &LoadOptions::default()).unwrap();
    let driver = ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap();
    Server::start(driver, ServeOptions::default().host("127.0.0.1".into()).port(0)).unwrap()
}

fn url(s: &Server) -> String {
    format!("http://{}/v1", s.addr())
}

/// A loopback URL nothing listens on.
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}/v1", l.local_addr().unwrap())
}

fn tasks(n: usize) -> Vec<EvalTask> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eval_tasks.jsonl");
    load_tasks(&path).unwrap().into_iter().take(n).collect()
}

/// `concurrency` workers over `endpoints` in turn, retrying quickly.
fn workers(endpoints: &[String], concurrency: usize) -> Vec<Worker> {
    (0..concurrency)
        .map(|i| {
            let endpoint = i % endpoints.len();
            let driver =
                RemoteDriver::new(&endpoints[endpoint], "tiny", RemoteConstraint::Grammar, Duration::from_secs(60))
                    .unwrap()
                    .retries(1, Duration::from_millis(50));
            Worker { endpoint: endpoints[endpoint].clone(), driver: Box::new(driver) as Box<dyn Driver> }
        })
        .collect()
}

fn dry_run() -> EvalOptions {
    EvalOptions::default().dry_run(true).agent(AgentConfig::default().tool_choice(ToolChoice::Required))
}

/// What a result says: its calls and answer, by task.
fn outcomes(results: &[TaskResult]) -> BTreeMap<String, String> {
    results.iter().map(|r| (r.id.clone(), format!("{:?} {:?} {}", r.calls, r.final_answer, r.stop_reason))).collect()
}

#[test]
fn an_eval_spread_over_two_replicas_gives_the_results_of_one() {
    let (a, b) = (replica(), replica());
    let tasks = tasks(10);
    let run = |endpoints: &[String], concurrency: usize| {
        let mut out = Vec::new();
        let results = run_eval_spread(
            workers(endpoints, concurrency),
            &tasks,
            &[],
            &dry_run(),
            &mut out,
            &|_, _| {},
            &|endpoint, task, e| panic!("{endpoint} failed {task}: {e}"),
        )
        .unwrap();
        let lines = String::from_utf8(out).unwrap();
        assert_eq!(lines.lines().count(), tasks.len(), "one line per task");
        results
    };
    let one = run(&[url(&a)], 1);
    let two = run(&[url(&a), url(&b)], 4);
    assert_eq!(one.len(), tasks.len());
    assert_eq!(outcomes(&two), outcomes(&one));
    // Not a run in which nothing was decided.
    assert!(one.iter().any(|r| !r.calls.is_empty()), "{:?}", outcomes(&one));
}

#[test]
fn a_replica_that_dies_mid_eval_leaves_every_task_done_once() {
    let a = replica();
    let mut b = Some(replica());
    let endpoints = [url(&a), url(b.as_ref().unwrap())];
    let tasks = tasks(30);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let failed_over = Arc::new(Mutex::new(Vec::new()));
    let seen = failed_over.clone();
    let (eval_tasks, eval_endpoints) = (tasks.clone(), endpoints.clone());
    let eval = std::thread::spawn(move || {
        let done_tx = Mutex::new(done_tx);
        let mut out = Vec::new();
        let results = run_eval_spread(
            workers(&eval_endpoints, 4),
            &eval_tasks,
            &[],
            &dry_run(),
            &mut out,
            &|n, _| {
                let _ = done_tx.lock().unwrap().send(n);
            },
            &|endpoint, task, _| seen.lock().unwrap().push((endpoint.to_string(), task.to_string())),
        );
        (results, String::from_utf8(out).unwrap())
    });
    // Replica b goes once two tasks are done.
    while done_rx.recv_timeout(Duration::from_secs(120)).unwrap() < 2 {}
    b.take().unwrap().shutdown();
    let (results, lines) = eval.join().unwrap();
    let results = results.unwrap();
    let mut ids: Vec<String> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
    want.sort();
    assert_eq!(ids, want, "every task exactly once");
    assert_eq!(results.len(), tasks.len());
    let failed_over = failed_over.lock().unwrap();
    assert!(!failed_over.is_empty(), "the dead replica's tasks went to the other");
    assert!(failed_over.iter().all(|(e, _)| *e == endpoints[1]), "{failed_over:?}");
}

#[test]
fn an_eval_no_endpoint_can_serve_stops_naming_the_task() {
    let endpoints = [dead_url(), dead_url()];
    let mut out = Vec::new();
    let e = run_eval_spread(workers(&endpoints, 2), &tasks(3), &[], &dry_run(), &mut out, &|_, _| {}, &|_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("failed on every endpoint"), "{e}");
    assert!(out.is_empty());
}

/// The CLI: `reagent eval --endpoint A --endpoint DEAD --concurrency 3` does every task (on A), says which
/// endpoint failed, and the results file holds each task once.
#[test]
fn the_cli_spreads_an_eval_and_fails_over() {
    let a = replica();
    let dir = common::scratch().join("remote-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let task_file = dir.join("tasks.jsonl");
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eval_tasks.jsonl"))
            .unwrap();
    std::fs::write(&task_file, text.lines().take(6).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let out_file = dir.join("out.jsonl");
    let dead = dead_url();
    let out = Command::new(env!("CARGO_BIN_EXE_reagent"))
        .args(["eval", task_file.to_str().unwrap(), "--dry-run", "--out", out_file.to_str().unwrap()])
        .args(["--endpoint", &url(&a), "--endpoint", &dead, "--concurrency", "3", "--served-model", "tiny"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("warning: {dead} failed task")), "{stderr}");
    assert!(stderr.contains("3 tasks at once"), "{stderr}");
    let results = std::fs::read_to_string(&out_file).unwrap();
    let mut ids: Vec<&str> = results.lines().map(|l| l.split('"').nth(3).unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6, "{results}");
    assert_eq!(results.lines().count(), 6);
    // One endpoint is what `run` and `chat` take.
    let out = Command::new(env!("CARGO_BIN_EXE_reagent"))
        .args(["run", "hi", "--endpoint", &url(&a), "--endpoint", &dead])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`run` takes one"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `reagent serve` logs a line per request on stderr, with its figures and never its content; `--quiet`
/// logs none.
#[test]
fn the_server_logs_each_request_without_its_content() {
    use std::io::{BufRead, Read, Write};
    let model = tiny_long_path(Arch::Qwen2);
    for quiet in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_reagent"));
        cmd.args(["serve", "--model", model.to_str().unwrap(), "--port", "0"]);
        if quiet {
            cmd.arg("--quiet");
        }
        let mut server = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let mut stderr = std::io::BufReader::new(server.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        let addr = first.split("http://").nth(1).and_then(|r| r.split('/').next()).expect(&first).to_string();
        let body = r#"{"messages": [{"role": "user", "content": "zebra-7431"}], "max_tokens": 4}"#;
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            c,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        server.kill().unwrap();
        server.wait().unwrap();
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).unwrap();
        assert!(!rest.contains("zebra"), "{rest}");
        match quiet {
            // The random-weight model may end on its own before `max_tokens` on another CPU's kernels.
            false => assert!(
                rest.contains("request 1: ")
                    && (rest.contains(" generated, length, ") || rest.contains(" generated, stop, ")),
                "{rest}"
            ),
            true => assert!(!rest.contains("request 1"), "{rest}"),
        }
    }
}

/// llama-cpp-python's server refuses `response_format: json_schema` (with a 500), naming the types it
/// takes: the schema is sent again at once as a `json_object` with its `schema`, and so from then on.
#[test]
fn a_server_that_takes_schemas_only_as_json_objects_gets_them_so() {
    use reagent::agent::Agent;
    let refusal = r#"{"error": {"message": "Input should be 'text' or 'json_object'"}}"#.to_string();
    let decision = reply(r#"{"thought": "", "type": "final_answer", "answer": "five"}"#);
    let (url, requests) = common::fake_server(vec![
        (500, refusal),
        (200, decision.clone()),
        (200, reply("Five.")),
        (200, decision),
        (200, reply("Five.")),
    ]);
    // The refusal comes as a 500: it is not tried again (the replies would run out of step).
    let remote = RemoteDriver::new(&url, "m", RemoteConstraint::JsonSchema, Duration::from_secs(10))
        .unwrap()
        .retries(2, Duration::from_millis(1));
    let mut agent = Agent::builder().driver(remote).build().unwrap();
    for _ in 0..2 {
        let t = agent.run("What is 2 plus 3?").unwrap();
        assert_eq!(t.final_answer.as_deref(), Some("Five."), "{:?}", t.stop_reason);
    }
    let bodies = bodies(&requests);
    let formats: Vec<&str> = bodies.iter().map(|b| b["response_format"]["type"].as_str().unwrap_or("none")).collect();
    assert_eq!(formats, ["json_schema", "json_object", "none", "json_object", "none"]);
    assert_eq!(bodies[1]["response_format"]["schema"]["type"], "object", "{}", bodies[1]);
}

/// A decision's reply with the tokens' log-probabilities as OpenAI-compatible servers return them: the
/// text up to the `type` value, its first token (`lead`, with `alternatives`), then the rest.
fn with_logprobs(lead: (&str, f64), alternatives: &[(&str, f64)], rest: &str) -> String {
    let before = r#"{"thought":"","type":""#;
    let top: Vec<serde_json::Value> =
        alternatives.iter().map(|(t, l)| serde_json::json!({"token": t, "logprob": l})).collect();
    let content = [
        serde_json::json!({"token": before, "logprob": -0.1, "top_logprobs": []}),
        serde_json::json!({"token": lead.0, "logprob": lead.1, "top_logprobs": top}),
        serde_json::json!({"token": rest, "logprob": -0.1, "top_logprobs": []}),
    ];
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "logprobs": {"content": content},
        "message": {"role": "assistant", "content": format!("{before}{}{rest}", lead.0)}}]})
    .to_string()
}

/// A reply in words, `text`.
fn reply(text: &str) -> String {
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
        .to_string()
}

/// A reply that calls `name` with `arguments` (JSON text), as OpenAI's API writes calls.
fn calling(name: &str, arguments: &str) -> String {
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": name, "arguments": arguments}}]}}]})
    .to_string()
}

/// A tool `calc` that takes an `expression` (and gives its length).
fn calc() -> impl reagent::Tool {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Args {
        /// An expression.
        expression: String,
    }
    reagent::tools::TypedTool::new("calc", "Evaluates an expression.", |a: Args| {
        Ok::<_, reagent::tools::ToolError>(a.expression.len())
    })
    .unwrap()
}

/// The agent with one tool against the fake server at `url`, at call bias `bias`.
fn biased_agent(url: &str, bias: f32) -> reagent::agent::Agent {
    let remote = RemoteDriver::new(url, "m", RemoteConstraint::JsonSchema, Duration::from_secs(10))
        .unwrap()
        .retries(0, Duration::from_millis(1));
    let mut config = AgentConfig::default();
    config.branch_biases.call = bias;
    // The answer after a call is the decision's: each scripted reply here is one decision.
    config.own_words_after_calls = false;
    reagent::agent::Agent::builder().driver(remote).tool(calc()).config(config).build().unwrap()
}

fn bodies(requests: &common::Requests) -> Vec<serde_json::Value> {
    requests.lock().unwrap().iter().map(|(_, body)| serde_json::from_str(body).unwrap()).collect()
}

/// The alternatives of a decision's `type` value, for the call bias applied from the server's
/// log-probabilities: the other side is there (`final` at -4.12 against `call` at -0.02: a margin of 4.1).
const LISTED: &[(&str, f64)] = &[("call", -0.02), ("final", -4.12), ("observation", -5.69)];
const CALL_REST: &str = r#"_tool","tool":"calc","args":{"expression":"2+3"}}"#;

/// The server's call stands where the margin with the bias is above 0 (4.1 - 3); where the bias turns it
/// (4.1 - 5), the decision is asked again narrowed to the answer, and the margin is the step's.
#[test]
fn the_call_bias_applies_to_a_remote_decision_from_the_servers_log_probabilities() {
    let call = with_logprobs(("call", -0.02), LISTED, CALL_REST);
    let (url, requests) = common::fake_server(vec![
        (200, call.clone()),
        (200, reply(r#"{"thought":"","type":"final_answer","answer":"3"}"#)),
        (200, call),
        (200, reply(r#"{"thought":"","type":"final_answer","answer":"Paris"}"#)),
        (200, reply("The capital of France is Paris.")),
    ]);
    let t = biased_agent(&url, -3.0).run("What is 2+3?").unwrap();
    assert_eq!(t.steps[0].decision.calls().len(), 1, "{:?}", t.steps[0].decision);
    assert_eq!(t.final_answer.as_deref(), Some("3"));
    let t = biased_agent(&url, -5.0).run("What is the capital of France?").unwrap();
    assert_eq!(t.final_answer.as_deref(), Some("The capital of France is Paris."), "{:?}", t.stop_reason);
    let margins = &t.steps[0].stats.branch_margins;
    assert!(margins.len() == 1 && (margins[0].margin - 4.1).abs() < 1e-4, "{margins:?}");
    let b = bodies(&requests);
    // The first decision of each run asks for the log-probabilities; a later one, at bias 0, does not.
    assert_eq!((b[0]["logprobs"].as_bool(), b[0]["top_logprobs"].as_u64()), (Some(true), Some(20)));
    assert!(b[1].get("logprobs").is_none(), "{}", b[1]);
    assert_eq!(b[2]["logprobs"].as_bool(), Some(true));
    // The turned decision: only the answer's alternative is left in the schema.
    let schema = |i: usize| b[i]["response_format"]["json_schema"]["schema"].clone();
    let types = |s: serde_json::Value| -> Vec<String> {
        s["anyOf"].as_array().unwrap().iter().map(|a| a["properties"]["type"]["const"].to_string()).collect()
    };
    assert_eq!(types(schema(2)), ["\"call_tool\"", "\"final_answer\""]);
    assert_eq!(types(schema(3)), ["\"final_answer\""]);
    assert_eq!(b.len(), 5);
}

/// A call bias calibrated on the model's native call score (`native_branch`) is not a ReAct margin's: a
/// remote decision, which that score cannot choose, is the server's own choice, asked for without
/// log-probabilities (before, the bias was applied to the ReAct `type` and turned the call).
#[test]
fn a_native_call_score_bias_leaves_a_remote_decision_to_the_server() {
    let (url, requests) = common::fake_server(vec![
        (200, with_logprobs(("call", -0.02), LISTED, CALL_REST)),
        (200, reply(r#"{"thought":"","type":"final_answer","answer":"5"}"#)),
    ]);
    let remote = RemoteDriver::new(&url, "m", RemoteConstraint::JsonSchema, Duration::from_secs(10))
        .unwrap()
        .retries(0, Duration::from_millis(1));
    let mut config = AgentConfig::default();
    config.branch_biases.call = -5.0;
    config.native_branch = true;
    config.own_words_after_calls = false;
    let mut agent = reagent::agent::Agent::builder().driver(remote).tool(calc()).config(config).build().unwrap();
    let t = agent.run("What is 2+3?").unwrap();
    assert_eq!(t.steps[0].decision.calls().len(), 1, "{:?}", t.steps[0].decision);
    assert_eq!(t.final_answer.as_deref(), Some("5"));
    let b = bodies(&requests);
    assert!(b.iter().all(|b| b.get("logprobs").is_none()), "{b:?}");
    assert_eq!(b.len(), 2);
}

/// Where the other side is not among the alternatives, the least of them bounds it: a choice the bound
/// settles costs no request; otherwise the narrowed decision is asked for, and its own log-probability
/// gives the margin (here 6.98: the call stands at bias -6.5 after the measure, and the narrowed
/// decision is not used).
#[test]
fn the_other_side_below_the_listed_alternatives_is_bounded_then_measured() {
    let unlisted: Vec<(String, f64)> = (0..20).map(|i| (format!("w{i}"), -0.5 - 0.25 * i as f64)).collect();
    let unlisted: Vec<(&str, f64)> = unlisted.iter().map(|(t, l)| (t.as_str(), *l)).collect();
    // The twentieth is at -5.25: the answer is below it, so the margin is above 5.23.
    let call = with_logprobs(("call", -0.02), &unlisted, CALL_REST);
    let answer_measured = with_logprobs(("final", -7.0), &[], r#"_answer","answer":"5"}"#);
    let (url, requests) = common::fake_server(vec![
        (200, call.clone()),
        (200, reply(r#"{"thought":"","type":"final_answer","answer":"3"}"#)),
        (200, call),
        (200, answer_measured),
        (200, reply(r#"{"thought":"","type":"final_answer","answer":"3"}"#)),
    ]);
    let t = biased_agent(&url, -5.0).run("What is 2+3?").unwrap();
    assert_eq!(t.steps[0].decision.calls().len(), 1);
    assert!(t.steps[0].stats.branch_margins.is_empty(), "a bound is not a margin");
    let t = biased_agent(&url, -6.5).run("What is 2+3?").unwrap();
    assert_eq!(t.steps[0].decision.calls().len(), 1, "{:?}", t.steps[0].decision);
    let margins = &t.steps[0].stats.branch_margins;
    assert!(margins.len() == 1 && (margins[0].margin - 6.98).abs() < 1e-4, "{margins:?}");
    assert_eq!(t.final_answer.as_deref(), Some("3"));
    let b = bodies(&requests);
    assert_eq!(b.len(), 5);
    assert_eq!(b[3]["response_format"]["json_schema"]["schema"]["anyOf"].as_array().unwrap().len(), 1);
    assert_eq!(b[3]["logprobs"].as_bool(), Some(true));
}

/// `--constraint tools`: the decision's tools go as OpenAI `tools` with `tool_choice`, and the reply's
/// `tool_calls` come back as the decision (a fake server: the request's fields checked); against a
/// `reagent serve` replica, a required call comes back as a call of the tool with arguments that validate.
#[test]
fn the_tools_mode_sends_functions_and_takes_the_calls_back() {
    let calls = calling("calc", r#"{"expression": "2+3"}"#);
    let (fake, requests) = common::fake_server(vec![(200, calls), (200, reply("5"))]);
    let driver = |url: &str| {
        RemoteDriver::new(url, "m", RemoteConstraint::Tools, Duration::from_secs(60))
            .unwrap()
            .retries(0, Duration::from_millis(1))
    };
    let mut agent = reagent::agent::Agent::builder().driver(driver(&fake)).tool(calc()).build().unwrap();
    let t = agent.run("What is 2+3?").unwrap();
    assert_eq!(t.steps[0].decision.calls()[0].args, serde_json::json!({"expression": "2+3"}));
    assert_eq!(t.final_answer.as_deref(), Some("5"), "{:?}", t.stop_reason);
    let b = bodies(&requests);
    assert_eq!(b[0]["tools"][0]["function"]["name"], "calc");
    assert_eq!(b[0]["tool_choice"], "auto");
    assert!(b[0].get("response_format").is_none() && b[0].get("structured_outputs").is_none());

    let mut server = replica();
    let config = AgentConfig::default().tool_choice(ToolChoice::Required);
    let mut agent = reagent::agent::Agent::builder()
        .driver(driver(&url(&server)))
        .tool(calc())
        .config(config)
        .max_steps(1)
        .build()
        .unwrap();
    let t = agent.run("What is 2+3?").unwrap();
    let first = &t.steps[0];
    assert_eq!(first.retries, 0, "{:?}", t.stop_reason);
    let calls = first.decision.calls();
    assert_eq!(calls.len(), 1, "{:?}", first.decision);
    assert_eq!(calls[0].tool, "calc");
    assert!(calls[0].args["expression"].is_string(), "{:?}", calls[0].args);
    server.shutdown();
}

/// `probe` finds the strongest constraint a server enforces: a `reagent serve` replica holds a reply to a
/// grammar; a server that refuses `json_schema` naming `json_object` (with a 500, as llama-cpp-python) and
/// holds that form gets `json-schema` sent so; one that ignores Lark grammars and schemas but holds GBNF
/// gets `gbnf`; one that ignores all of these but calls a named function gets `tools`; one that does none
/// of these, `none`.
#[test]
fn probing_finds_the_constraint_a_server_enforces() {
    let mut server = replica();
    let mut d = RemoteDriver::new(&url(&server), "tiny", RemoteConstraint::None, Duration::from_secs(60)).unwrap();
    assert_eq!(d.probe().unwrap(), RemoteConstraint::Grammar);
    server.shutdown();

    let refusal = r#"{"error": {"message": "Input should be 'text' or 'json_object'"}}"#.to_string();
    let called = calling("reagent_probe", "{}");
    let (fake, requests) = common::fake_server(vec![
        // Held to a schema in the json_object form.
        (200, reply("reagent")),
        (500, refusal),
        (200, reply(r#"{"probe": "reagent-probe"}"#)),
        // Grammars ignored, schemas refused or ignored, GBNF held.
        (200, reply("hello")),
        (400, r#"{"error": {"message": "unknown response_format"}}"#.into()),
        (200, reply(r#"{"probe": "hello"}"#)),
        (200, reply("reagent-probe")),
        // Grammars of both kinds ignored, schemas refused or ignored, a named function called.
        (200, reply("hello")),
        (400, r#"{"error": {"message": "unknown response_format"}}"#.into()),
        (200, reply(r#"{"probe": "hello"}"#)),
        (200, reply("hello")),
        (200, called),
        // Nothing held.
        (200, reply("hello")),
        (200, reply("hello")),
        (200, reply("hello")),
        (200, reply("hello")),
        (200, reply("hello")),
    ]);
    let driver = || {
        RemoteDriver::new(&fake, "m", RemoteConstraint::Grammar, Duration::from_secs(10))
            .unwrap()
            .retries(2, Duration::from_millis(1))
    };
    let mut d = driver();
    assert_eq!(d.probe().unwrap(), RemoteConstraint::JsonSchema);
    let schema = reagent::decode::constraint::Grammar::JsonSchema(serde_json::json!({"type": "object"}));
    let body = d.body(&[reagent::text::chat::ChatMessage::user("u")], Some(&schema), 8).unwrap();
    assert_eq!(body["response_format"]["type"], "json_object", "the form the server took");
    let mut d = driver();
    assert_eq!(d.probe().unwrap(), RemoteConstraint::Gbnf);
    let body = d.body(&[reagent::text::chat::ChatMessage::user("u")], Some(&schema), 8).unwrap();
    assert!(body["grammar"].as_str().is_some_and(|g| g.starts_with("root ::= ")), "{body}");
    assert_eq!(driver().probe().unwrap(), RemoteConstraint::Tools);
    assert_eq!(driver().probe().unwrap(), RemoteConstraint::None);
    let b = bodies(&requests);
    assert_eq!(b.len(), 17);
    assert_eq!(b[0]["structured_outputs"]["grammar"], "start: \"reagent-probe\"");
    assert_eq!(b[6]["grammar"], "root ::= \"reagent-probe\"");
    assert_eq!(b[11]["tool_choice"]["function"]["name"], "reagent_probe");
}
