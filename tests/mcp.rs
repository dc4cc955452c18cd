//! Tools from MCP servers: a small server written for these tests (well-behaved, or hanging, crashing,
//! writing garbage) through the library and the scripted driver, and the real npm servers
//! (`@modelcontextprotocol/server-filesystem`, `server-everything`) that `.ci/run` installs; those tests
//! are ignored by default and run with `cargo test --test mcp -- --include-ignored`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reagent::agent::{Agent, AgentConfig, AgentEvent, ScriptedDriver, StopReason};
use reagent::tools::mcp::{tools_of, McpConfig, McpServer};
use reagent::tools::{CallOutcome, Executor, ToolCall, ToolSet};
use serde_json::{json, Value};

fn script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mcp/misbehaving.py").to_string()
}

fn test_server(name: &str, mode: &str, timeout_s: f64) -> McpConfig {
    McpConfig::new(name, "python3").args(vec![script(), mode.into()]).timeout_s(timeout_s)
}

fn executor(server: &McpServer) -> Executor {
    let mut set = ToolSet::default();
    for t in server.tools() {
        set.add(t).unwrap();
    }
    Executor::new(set, Duration::from_secs(20))
}

fn run(ex: &mut Executor, tool: &str, args: Value) -> CallOutcome {
    ex.execute(ToolCall::new(tool, args)).1
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// Pids of the processes whose command line contains `marker`.
fn pids_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).replace('\0', " ").contains(marker) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_server_lists_its_tools_and_answers_calls() {
    let server = McpServer::spawn(&test_server("test", "ok", 10.0)).unwrap();
    let names: Vec<String> = server.tools().iter().map(|t| t.spec().name.clone()).collect();
    assert_eq!(names, ["echo", "shout", "loose", "fail", "slow", "die", "hang"]);
    assert_eq!(server.tools()[0].spec().description, "Returns the message.");
    assert_eq!(server.tools()[0].spec().parameters["required"], json!(["message"]));
    let mut ex = executor(&server);
    assert_eq!(run(&mut ex, "echo", json!({"message": "hi there"})), CallOutcome::Ok { output: "hi there".into() });
    assert_eq!(run(&mut ex, "shout", json!({"text": "quiet"})), CallOutcome::Ok { output: "QUIET".into() });
    // isError: the content is the error message.
    assert_eq!(run(&mut ex, "fail", json!({})), CallOutcome::Error { message: "this tool always fails".into() });
    // Arguments are checked against the server's schema before anything is sent.
    assert!(matches!(run(&mut ex, "echo", json!({"text": "x"})), CallOutcome::InvalidArgs { .. }));
}

#[test]
fn an_allowlist_keeps_only_the_named_tools_and_refuses_unknown_names() {
    let mut c = test_server("test", "ok", 10.0);
    c.tools = Some(vec!["echo".into(), "fail".into()]);
    let server = McpServer::spawn(&c).unwrap();
    let names: Vec<String> = server.tools().iter().map(|t| t.spec().name.clone()).collect();
    assert_eq!(names, ["echo", "fail"]);
    c.tools = Some(vec!["echo".into(), "nope".into()]);
    let err = McpServer::spawn(&c).err().expect("an unknown tool in the allowlist").to_string();
    assert!(err.contains("MCP server `test`") && err.contains("`nope`"), "{err}");
}

#[test]
fn clashing_names_get_the_server_prefix() {
    let a = McpServer::spawn(&test_server("alpha", "ok", 10.0)).unwrap();
    let b = McpServer::spawn(&test_server("beta", "ok", 10.0)).unwrap();
    let mut c = test_server("gamma", "ok", 10.0);
    c.tools = Some(vec!["shout".into()]);
    let c = McpServer::spawn(&c).unwrap();
    let tools = tools_of(&[a, b, c], &["echo"]);
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert!(names.contains(&"alpha.echo") && names.contains(&"beta.echo") && names.contains(&"gamma.shout"));
    assert!(names.contains(&"alpha.fail") && !names.contains(&"echo") && !names.contains(&"fail"));
    let t = tools.iter().find(|t| t.spec().name == "beta.echo").unwrap();
    assert!(t.spec().description.contains("MCP server `beta`"), "{}", t.spec().description);
    // A prefixed tool still reaches its own server under the server's name for it.
    assert_eq!(t.call(&json!({"message": "b"})).unwrap(), json!("b"));
}

#[test]
fn a_server_that_dies_mid_run_gives_error_observations() {
    let server = McpServer::spawn(&test_server("test", "ok", 10.0)).unwrap();
    let mut ex = executor(&server);
    let t0 = Instant::now();
    match run(&mut ex, "die", json!({})) {
        CallOutcome::Error { message } => assert!(message.contains("MCP server `test`"), "{message}"),
        other => panic!("{other:?}"),
    }
    match run(&mut ex, "echo", json!({"message": "again"})) {
        CallOutcome::Error { message } => assert!(message.contains("is gone"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_hanging_call_times_out_and_the_server_stays_usable() {
    let server = McpServer::spawn(&test_server("test", "ok", 1.0)).unwrap();
    let mut ex = executor(&server);
    let t0 = Instant::now();
    match run(&mut ex, "slow", json!({"seconds": 2.5})) {
        CallOutcome::Error { message } => assert!(message.contains("within 1 s"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // This server answers in order: once its sleep is over, the late answer is dropped and the next call
    // gets its own.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(run(&mut ex, "echo", json!({"message": "still here"})), CallOutcome::Ok { output: "still here".into() });
}

#[test]
fn servers_that_do_not_start_are_errors_naming_them() {
    let cases = [
        ("exit", "did not start"),
        ("hang-init", "did not answer initialize within 1 s"),
        ("garbage", "MCP server `broken`"),
        ("bad-list", "MCP server `broken`"),
    ];
    for (mode, expect) in cases {
        let t0 = Instant::now();
        let err = McpServer::spawn(&test_server("broken", mode, 1.0)).err().expect(mode).to_string();
        assert!(err.contains("MCP server `broken`") && err.contains(expect), "{mode}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(8), "{mode}: {:?}", t0.elapsed());
    }
    // Garbage in answer to `initialize` fails at once, not at the end of a long timeout, and says so.
    let t0 = Instant::now();
    let err = McpServer::spawn(&test_server("broken", "garbage", 30.0)).err().expect("garbage").to_string();
    assert!(err.contains("MCP server `broken`") && err.contains("not JSON: this is not JSON-RPC"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "garbage took {:?} to refuse", t0.elapsed());
    let mut c = test_server("missing", "ok", 1.0);
    c.command = "/nonexistent/mcp-server".into();
    let err = McpServer::spawn(&c).err().unwrap().to_string();
    assert!(err.contains("MCP server `missing`") && err.contains("cannot run"), "{err}");
}

#[test]
fn dropping_the_tools_stops_the_server() {
    let marker = format!("{} ok", script());
    let mut c = test_server("test", "ok", 10.0);
    // A marker of its own, so that tests running side by side do not see each other's servers.
    c.env.insert("REAGENT_TEST_MARK".into(), "drop".into());
    c.args.push("drop-test".into());
    let server = McpServer::spawn(&c).unwrap();
    let tools = server.tools();
    drop(server);
    let pids = pids_with(&format!("{marker} drop-test"));
    assert_eq!(pids.len(), 1, "the server runs while its tools are held");
    drop(tools);
    let t0 = Instant::now();
    while pids.iter().any(|&p| alive(p)) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pids.iter().any(|&p| alive(p)), "the server outlived its tools");
}

#[test]
fn command_lines_name_their_servers() {
    let name = |l: &str| McpConfig::from_command_line(l).unwrap().name;
    assert_eq!(name("npx -y @modelcontextprotocol/server-filesystem /tmp"), "filesystem");
    assert_eq!(name("npx -y @modelcontextprotocol/server-everything@2026.8.31"), "everything");
    assert_eq!(name("/opt/bin/mcp-server-git --repository ."), "git");
    assert_eq!(name("python3 'my server.py' --flag"), "my_server");
    assert_eq!(name("uvx mcp-server-fetch"), "fetch");
    let c = McpConfig::from_command_line("node srv.js 'a b' c").unwrap();
    assert_eq!(
        (c.command.as_str(), c.args.as_slice()),
        ("node", &["srv.js".to_string(), "a b".into(), "c".into()][..])
    );
    assert!(McpConfig::from_command_line("").is_err());
    assert!(McpConfig::from_command_line("npx 'unclosed").is_err());
}

/// A server started from a command line is named by what it calls itself (`serverInfo.name` in its answer
/// to `initialize`), not by its script's file name (`node …/dist/index.js` would be `index`); a tools
/// file's name is the user's and stays.
#[test]
fn a_command_line_server_takes_the_name_it_gives_itself() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index.py");
    std::fs::copy(script(), &index).unwrap();
    let config = McpConfig::from_command_line(&format!("python3 {} ok", index.display())).unwrap();
    assert_eq!(config.name, "index");
    let server = McpServer::spawn(&config).unwrap();
    assert_eq!(server.name(), "misbehaving");
    let named = McpServer::spawn(&test_server("mine", "ok", 10.0)).unwrap();
    assert_eq!(named.name(), "mine");
}

#[test]
fn tools_files_declare_servers() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tools.toml");
    let write = |body: String| std::fs::write(&file, body).unwrap();
    write(format!(
        "[[mcp]]\nname = \"t\"\ncommand = \"python3\"\nargs = [{:?}, \"ok\"]\ntools = [\"echo\"]\ntimeout_s = 5\n",
        script()
    ));
    let tools = reagent::tools::load_tools_file(&file).unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].call(&json!({"message": "from a file"})).unwrap(), json!("from a file"));
    for (body, expect) in [
        ("[[mcp]]\nname = \"t\"\ncommand = \"x\"\nport = 3\n", "unknown field `port`"),
        ("[[mcp]]\nname = \"a b\"\ncommand = \"x\"\n", "`name` may use only"),
        ("[[mcp]]\nname = \"t\"\ncommand = \"x\"\ntimeout_s = 1e300\n", "timeout_s"),
        ("[[mcp]]\nname = \"t\"\ncommand = \"x\"\n[[mcp]]\nname = \"t\"\ncommand = \"y\"\n", "two servers"),
        ("[[mcp]]\nname = \"t\"\ncommand = \"/nonexistent/x\"\n", "cannot run"),
        ("[mcpp]\n", "unknown field `mcpp`"),
    ] {
        write(body.to_string());
        let err = reagent::tools::load_tools_file(&file).err().expect(body).to_string();
        assert!(err.contains(expect), "{body}: {err}");
    }
}

type Events = Arc<Mutex<Vec<AgentEvent>>>;

fn scripted_agent(server: &McpServer, script: Vec<String>) -> (Agent, Events) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let agent = Agent::builder()
        .driver(ScriptedDriver::new(script))
        .tools(server.tools())
        // Scripted calls go on to other tools after a failure.
        .config(AgentConfig::default().tool_timeout(Duration::from_secs(20)).retry_failed_tool(false))
        .events(move |e: &AgentEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    (agent, events)
}

fn call(tool: &str, args: Value) -> String {
    json!({"thought": "call", "type": "call_tool", "tool": tool, "args": args}).to_string()
}

fn answer(a: &str) -> String {
    json!({"thought": "done", "type": "final_answer", "answer": a}).to_string()
}

fn observations(events: &Events) -> Vec<String> {
    let ev = events.lock().unwrap();
    ev.iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallCompleted { outcome, .. } => Some(outcome.observation()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_agent_calls_server_tools_and_sees_a_killed_server_as_an_error() {
    let server = McpServer::spawn(&test_server("test", "ok", 10.0)).unwrap();
    let (mut agent, events) = scripted_agent(
        &server,
        vec![
            call("echo", json!({"message": "first"})),
            call("die", json!({})),
            call("echo", json!({"message": "after"})),
            answer("the server died"),
        ],
    );
    let t = agent.run("echo twice").unwrap();
    assert_eq!(t.stop_reason, StopReason::FinalAnswer);
    let obs = observations(&events);
    assert_eq!(obs[0], "first");
    assert!(obs[1].starts_with("Error:") && obs[1].contains("MCP server `test`"), "{}", obs[1]);
    assert!(obs[2].contains("is gone"), "{}", obs[2]);
}

/// The npm servers `.ci/run` installs: `REAGENT_MCP_BIN`, else `.ci/cache/mcp/node_modules/.bin`.
fn npm_server(bin: &str) -> PathBuf {
    let dir = std::env::var_os("REAGENT_MCP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/cache/mcp/node_modules/.bin"));
    let path = dir.join(bin);
    assert!(path.exists(), "{} is missing: run `.ci/install-mcp-servers` (or set REAGENT_MCP_BIN)", path.display());
    path
}

fn npm_config(bin: &str, args: &[&str]) -> McpConfig {
    McpConfig::new(bin.trim_start_matches("mcp-server-"), npm_server(bin).display().to_string())
        .args(args.iter().map(|s| s.to_string()).collect())
}

#[test]
#[ignore = "needs the npm MCP servers (.ci/run installs them): cargo test --test mcp -- --include-ignored"]
fn the_filesystem_server_reads_and_lists_a_confined_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let root = dir.path().canonicalize().unwrap();
    let server = McpServer::spawn(&npm_config("mcp-server-filesystem", &[root.to_str().unwrap()])).unwrap();
    eprintln!("filesystem server started in {:.2} s", server.startup_time().as_secs_f64());
    let file = root.join("notes.txt").display().to_string();
    let outside = "/etc/hostname";
    let (mut agent, events) = scripted_agent(
        &server,
        vec![
            call("read_text_file", json!({"path": file})),
            call("list_directory", json!({"path": root.display().to_string()})),
            call("read_text_file", json!({"path": outside})),
            call("read_text_file", json!({"path": root.join("absent.txt").display().to_string()})),
            answer("3 lines"),
        ],
    );
    let t0 = Instant::now();
    let t = agent.run("How many lines does notes.txt have?").unwrap();
    eprintln!("4 calls in {:.3} s", t0.elapsed().as_secs_f64());
    assert_eq!(t.final_answer.as_deref(), Some("3 lines"));
    let obs = observations(&events);
    assert_eq!(obs[0], "one\ntwo\nthree\n");
    assert!(obs[1].contains("[FILE] notes.txt"), "{}", obs[1]);
    assert!(obs[2].starts_with("Error:") && obs[2].contains("denied"), "{}", obs[2]);
    assert!(obs[3].starts_with("Error:") && obs[3].contains("ENOENT"), "{}", obs[3]);
}

#[test]
#[ignore = "needs the npm MCP servers (.ci/run installs them): cargo test --test mcp -- --include-ignored"]
fn the_everything_server_echoes_adds_and_describes_images() {
    let server = McpServer::spawn(&npm_config("mcp-server-everything", &["stdio"])).unwrap();
    let names: Vec<String> = server.tools().iter().map(|t| t.spec().name.clone()).collect();
    eprintln!("everything server: {names:?} in {:.2} s", server.startup_time().as_secs_f64());
    let mut ex = executor(&server);
    let echo = names.iter().find(|n| n.contains("echo")).expect("an echo tool");
    match run(&mut ex, echo, json!({"message": "hello mcp"})) {
        CallOutcome::Ok { output } => assert!(output.contains("hello mcp"), "{output}"),
        other => panic!("{other:?}"),
    }
    let add = names.iter().find(|n| n.contains("sum") || n.as_str() == "add").expect("an adding tool");
    match run(&mut ex, add, json!({"a": 2, "b": 40})) {
        CallOutcome::Ok { output } => assert!(output.contains("42"), "{output}"),
        other => panic!("{other:?}"),
    }
    if let Some(image) = names.iter().find(|n| n.to_lowercase().contains("image")) {
        match run(&mut ex, image, json!({})) {
            CallOutcome::Ok { output } => assert!(output.contains("[image image/png"), "{output}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
#[ignore = "needs the npm MCP servers (.ci/run installs them) and the default model: cargo test --test mcp -- --include-ignored"]
fn the_default_model_uses_the_filesystem_server_from_the_command_line() {
    // A fixed folder, so that the run's prompts are the same from run to run: a random temporary name in
    // the question changed the decision (seen: `read_text_file` with `tail: 1` for one name).
    let dir = std::env::temp_dir().join("reagent-mcp-cli-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "one\ntwo\nthree\nfour\n").unwrap();
    let server = format!("{} {}", npm_server("mcp-server-filesystem").display(), dir.display());
    let question = "How many lines does notes.txt have?";
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reagent"))
        .env("REAGENT_PROMPT_CACHE", "0")
        .current_dir(&dir)
        // Run outside the source tree, the binary would look in the platform cache: use the tree's.
        .env("REAGENT_MODELS_DIR", reagent::catalog::cache_dir())
        .args(["run", "--builtin", "none", "--json", "--mcp", &server, question])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some_and(|c| c <= 1), "{stderr}");
    assert!(stderr.contains("MCP server `secure-filesystem`: 14 tools"), "{stderr}");
    let events: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let done: Vec<&Value> = events.iter().filter(|e| e["event"] == "tool_call_completed").collect();
    assert!(!done.is_empty(), "no tool call: {events:?}");
    // The first call reads the file through the server (whichever of its read tools the model picks).
    let first = done[0];
    assert!(first["call"]["tool"].as_str().unwrap().starts_with("read"), "{first}");
    assert_eq!(first["outcome"]["output"], "one\ntwo\nthree\nfour\n", "{first}");
}
