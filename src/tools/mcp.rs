//! Tools from Model Context Protocol servers: each server runs as a child process speaking JSON-RPC on
//! its stdio (the official SDK's client, `rmcp`), its `tools/list` becomes [`ToolSpec`]s, and a call is a
//! `tools/call` whose content is the observation.
//!
//! ```no_run
//! use reagent::tools::mcp::{McpConfig, McpServer};
//!
//! # fn main() -> reagent::Result<()> {
//! let config = McpConfig::from_command_line("npx -y @modelcontextprotocol/server-filesystem /tmp/notes")?;
//! let server = McpServer::spawn(&config)?; // `filesystem`: started, initialized, tools listed
//! let tools = server.tools();              // for `Agent::builder().tools(…)`
//! # Ok(()) }
//! ```
//!
//! A server lives as long as its tools: the last one dropped closes the connection and kills the server's
//! process group. A server that does not start, or does not answer `initialize` and `tools/list` within
//! its timeout, is an error naming it; one that dies, hangs or fails mid-run gives error observations.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::ServiceExt;

use super::{Tool, ToolError, ToolSpec};
use crate::error::{Error, Result};

/// How to start one MCP server (an `[[mcp]]` entry of a tools file, or `--mcp 'COMMAND ARG…'`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct McpConfig {
    /// The server's name: in messages, and as the prefix of its tools' names where they clash.
    pub name: String,
    /// The program (looked up on `PATH`).
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables added to reagent's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds for start-up (initialize and the tool list) and for each call.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Offer only these tools of the server (all when absent).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Attempts after a read-only tool's call timed out, at most 10.
    #[serde(default)]
    pub retries: u32,
    /// Seconds before the first retry, doubled for each next one.
    #[serde(default = "default_backoff_s")]
    pub backoff_s: f64,
    /// Take the name the server gives itself (`serverInfo.name` in its answer to `initialize`,
    /// sanitised) instead of `name`, which then names it only until it answers: `--mcp` servers, whose
    /// command line says little (`node …/dist/index.js`). A tools file's names are the user's.
    #[serde(skip)]
    pub name_from_server: bool,
}

fn default_backoff_s() -> f64 {
    1.0
}

fn default_timeout_s() -> f64 {
    30.0
}

setters!(McpConfig {
    args: Vec<String>,
    env: BTreeMap<String, String>,
    timeout_s: f64,
    tools: Option<Vec<String>>,
    retries: u32,
    backoff_s: f64,
});

impl McpConfig {
    /// A server `name` started as `command` (no arguments, reagent's environment, a 30 s timeout, all its
    /// tools); the setters add the rest.
    pub fn new(name: impl Into<String>, command: impl Into<String>) -> Self {
        McpConfig {
            name: name.into(),
            command: command.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            timeout_s: default_timeout_s(),
            tools: None,
            retries: 0,
            backoff_s: default_backoff_s(),
            name_from_server: false,
        }
    }

    /// From a command line as a shell would split it (`npx -y @modelcontextprotocol/server-everything`);
    /// the name is the server package's or program's, without `server-`/`mcp-server-` (`everything`).
    pub fn from_command_line(line: &str) -> Result<McpConfig> {
        let bad = |reason: String| Error::Tool { tool: format!("--mcp '{line}'"), reason };
        let words = shell_words::split(line).map_err(|e| bad(format!("cannot split the command: {e}")))?;
        let (command, args) = words.split_first().ok_or_else(|| bad("no command".into()))?;
        let mut config = McpConfig::new(server_name(command, args), command.clone()).args(args.to_vec());
        config.name_from_server = true;
        Ok(config)
    }

    fn timeout(&self) -> Result<Duration> {
        super::timeout_from_secs(self.timeout_s).map_err(|e| Error::Tool {
            tool: format!("MCP server `{}`", self.name),
            reason: format!("`timeout_s` {e}"),
        })
    }
}

/// The name a server gets from its command line: for a launcher (`npx`, `uvx`, `node`, `python3`…) the
/// first argument that is not a flag, else the program; its last path part, without a scope, extension
/// or `server-` prefix, reduced to letters, digits, `_` and `-`.
fn server_name(command: &str, args: &[String]) -> String {
    let launchers = ["npx", "uvx", "node", "python", "python3", "deno", "bunx", "pipx", "uv"];
    let base = |s: &str| s.rsplit(['/', '\\']).next().unwrap_or(s).to_string();
    let mut word = base(command);
    if launchers.contains(&word.as_str()) {
        if let Some(a) = args.iter().find(|a| !a.starts_with('-') && a.as_str() != "run") {
            word = base(a);
        }
    }
    let word = word.split('@').find(|s| !s.is_empty()).unwrap_or("").to_string(); // pkg@1.2 → pkg
    let word = word
        .rsplit_once('.')
        .filter(|(_, ext)| ["js", "py", "mjs", "ts"].contains(ext))
        .map_or(word.as_str(), |(w, _)| w);
    let name = sanitised(word);
    if name.is_empty() {
        "mcp".into()
    } else {
        name
    }
}

/// A server's name as reagent uses it: without an `mcp-`/`server-` prefix or a `-server`/`-mcp` suffix,
/// reduced to letters, digits, `_` and `-`, at most 40 characters (`secure-filesystem-server` →
/// `secure-filesystem`); empty when nothing is left.
fn sanitised(word: &str) -> String {
    let word = word.trim();
    let word = ["mcp-server-", "server-", "mcp-"].iter().fold(word, |w, p| w.strip_prefix(p).unwrap_or(w));
    let word = ["-mcp-server", "-server", "-mcp"].iter().fold(word, |w, p| w.strip_suffix(p).unwrap_or(w));
    word.chars().take(40).map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// A running MCP server and the tools it listed.
pub struct McpServer {
    conn: Arc<Connection>,
    /// Each tool with whether the server says it is read-only (`annotations.readOnlyHint`).
    tools: Vec<(ToolSpec, bool)>,
    skipped: Vec<(String, String)>,
    startup: Duration,
}

impl McpServer {
    /// Starts the server, initializes the session and lists its tools, within the configured timeout.
    pub fn spawn(config: &McpConfig) -> Result<McpServer> {
        let t0 = Instant::now();
        let timeout = config.timeout()?;
        let who = format!("MCP server `{}`", config.name);
        let fail = |reason: String| Error::Tool { tool: who.clone(), reason };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("reagent-mcp")
            .enable_all()
            .build()
            .map_err(|e| fail(format!("cannot start its runtime: {e}")))?;
        let mut command = tokio::process::Command::new(&config.command);
        command.args(&config.args).envs(&config.env).kill_on_drop(true);
        // Its own process group: the server and whatever it starts are killed together.
        #[cfg(unix)]
        command.process_group(0);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = {
            let _in_runtime = runtime.enter();
            command.spawn().map_err(|e| fail(format!("cannot run `{}`: {e}", config.command)))?
        };
        let pid = child.id();
        if let Some(p) = pid {
            live_groups().push(p);
        }
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = child.stderr.take() {
            runtime.spawn(keep_tail(stderr, stderr_tail.clone()));
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(fail("its standard input and output could not be piped".into()));
        };
        let garbage = Arc::new(Mutex::new(None));
        let transport = (screened(stdout, &runtime, garbage.clone()), stdin);
        if config.retries > super::Retry::MAX_TIMES || !(0.0..=60.0).contains(&config.backoff_s) {
            return Err(fail(format!(
                "`retries` is at most {} and `backoff_s` between 0 and 60",
                super::Retry::MAX_TIMES
            )));
        }
        let retry = super::Retry::new(config.retries, Duration::from_secs_f64(config.backoff_s));
        let mut conn = Connection {
            name: config.name.clone(),
            runtime,
            service: None,
            _child: Some(child),
            pid,
            stderr_tail,
            timeout,
            retry,
        };
        let service = match conn.wait(().serve(transport), timeout) {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let why = match garbage.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    Some(line) => {
                        format!("did not start: it answered `initialize` with a line that is not JSON: {line}")
                    }
                    None => format!("did not start: {e}"),
                };
                return Err(fail(conn.with_stderr(why)));
            }
            Err(w) => return Err(fail(conn.with_stderr(w.describe("initialize", timeout)))),
        };
        let peer = service.peer().clone();
        if config.name_from_server {
            let own = service.peer_info().map(|i| sanitised(&i.server_info.name)).unwrap_or_default();
            if own.chars().any(|c| c.is_ascii_alphanumeric()) {
                conn.name = own;
            }
        }
        conn.service = Some(service);
        let listed = match conn.wait(peer.list_all_tools(), timeout) {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(fail(conn.with_stderr(format!("tools/list failed: {e}")))),
            Err(w) => return Err(fail(conn.with_stderr(w.describe("tools/list", timeout)))),
        };
        if let Some(allow) = &config.tools {
            let missing: Vec<&String> = allow.iter().filter(|a| !listed.iter().any(|t| t.name == a.as_str())).collect();
            if !missing.is_empty() {
                let have: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
                return Err(fail(format!(
                    "`tools` names {} it does not have (it has: {})",
                    missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
                    have.join(", ")
                )));
            }
        }
        let (mut tools, mut skipped) = (Vec::new(), Vec::new());
        for t in listed {
            if config.tools.as_ref().is_some_and(|allow| !allow.iter().any(|a| a == t.name.as_ref())) {
                continue;
            }
            let mut schema = (*t.input_schema).clone();
            schema.remove("$schema");
            let description = t.description.as_deref().or(t.title.as_deref()).unwrap_or("").to_string();
            match ToolSpec::new(t.name.to_string(), description, Value::Object(schema)) {
                Ok(spec) => {
                    let read_only = t.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true);
                    tools.push((spec, read_only));
                }
                Err(e) => skipped.push((t.name.to_string(), e.to_string())),
            }
        }
        Ok(McpServer { conn: Arc::new(conn), tools, skipped, startup: t0.elapsed() })
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.conn.name
    }

    /// Names the server `name` (two servers that give themselves one name). Only before its tools are
    /// handed out ([`Self::tools`], [`tools_of`]), which carry the name they were made with; false after.
    pub fn rename(&mut self, name: impl Into<String>) -> bool {
        match Arc::get_mut(&mut self.conn) {
            Some(c) => {
                c.name = name.into();
                true
            }
            None => false,
        }
    }

    /// How long start-up took (process start, initialize, tools/list).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The tools it listed that cannot be offered (a name or schema reagent refuses), with the reason.
    pub fn skipped(&self) -> &[(String, String)] {
        &self.skipped
    }

    /// Its tools under their own names.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        tools_of(std::slice::from_ref(self), &[])
    }
}

/// The tools of several servers, named so that none clashes: a tool whose name is in `taken` (the other
/// tools of the run) or is listed by more than one server is named `<server>.<tool>`, and its description
/// says which server it comes from.
pub fn tools_of(servers: &[McpServer], taken: &[&str]) -> Vec<Arc<dyn Tool>> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (t, _) in servers.iter().flat_map(|s| &s.tools) {
        *count.entry(t.name.as_str()).or_default() += 1;
    }
    let mut out: Vec<Arc<dyn Tool>> = Vec::new();
    for s in servers {
        for (t, read_only) in &s.tools {
            let mut spec = t.clone();
            if count[t.name.as_str()] > 1 || taken.contains(&t.name.as_str()) {
                spec.name = format!("{}.{}", s.name(), t.name);
                spec.description = format!("{} (tool `{}` of MCP server `{}`)", t.description, t.name, s.name());
            }
            out.push(Arc::new(McpTool { conn: s.conn.clone(), remote: t.name.clone(), spec, read_only: *read_only }));
        }
    }
    out
}

/// One tool of a server.
struct McpTool {
    conn: Arc<Connection>,
    /// The name the server knows it by.
    remote: String,
    spec: ToolSpec,
    read_only: bool,
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn retry(&self) -> super::Retry {
        self.conn.retry
    }

    /// A read-only tool's call that timed out.
    fn retryable(&self, error: &str) -> bool {
        self.read_only && error.contains("did not answer")
    }

    fn needed_for(&self, request: &str, done: &[super::Done]) -> Option<super::Need> {
        super::Need::of_path_parameter(&self.spec, request, done)
    }

    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        let conn = &self.conn;
        let Some(service) = &conn.service else { return Err(ToolError("the server is not running".into())) };
        let params = CallToolRequestParams::new(self.remote.clone())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        let who = format!("MCP server `{}`", conn.name);
        match conn.wait(service.peer().call_tool(params), conn.timeout) {
            Ok(Ok(result)) => {
                let text = content_text(&result.content, result.structured_content.as_ref());
                match result.is_error {
                    Some(true) => Err(ToolError(text)),
                    _ => Ok(Value::String(text)),
                }
            }
            Ok(Err(ServiceError::TransportClosed)) | Ok(Err(ServiceError::TransportSend(_))) => {
                Err(ToolError(conn.with_stderr(format!("{who} is gone (it exited or closed its output)"))))
            }
            Ok(Err(ServiceError::McpError(e))) => Err(ToolError(format!("{who}: {}", e.message))),
            Ok(Err(e)) => Err(ToolError(format!("{who}: {e}"))),
            Err(w) => Err(ToolError(format!("{who} {}", w.describe("the call", conn.timeout)))),
        }
    }
}

/// A call result's content as the observation: text parts as they are, one per line; images, audio and
/// resources described; the structured content as JSON when there is nothing else.
fn content_text(content: &[rmcp::model::Content], structured: Option<&Value>) -> String {
    let mut parts = Vec::new();
    for c in content {
        let v = serde_json::to_value(c).unwrap_or(Value::Null);
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        let part = match field("type") {
            "text" => field("text").to_string(),
            "image" | "audio" => {
                format!("[{} {}, {} bytes base64]", field("type"), field("mimeType"), field("data").len())
            }
            "resource" => match v.get("resource") {
                Some(r) => match r.get("text").and_then(Value::as_str) {
                    Some(t) => t.to_string(),
                    None => format!("[resource {}]", r.get("uri").and_then(Value::as_str).unwrap_or("?")),
                },
                None => "[resource]".into(),
            },
            "resource_link" => format!("[resource link {} {}]", field("name"), field("uri")),
            other => format!("[{other} content]"),
        };
        parts.push(part);
    }
    let text = match (parts.is_empty(), structured) {
        (true, Some(s)) => s.to_string(),
        _ => parts.join("\n"),
    };
    // A server returning 50 MB of text would otherwise be one 50 MB observation (and event, and prompt).
    cap_output(text, super::DEFAULT_MAX_OUTPUT_BYTES)
}

/// `text` cut at `max` bytes (on a character boundary), saying so.
fn cap_output(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&format!("\n[... cut: the result has {total} bytes, {cut} shown]"));
    text
}

/// Keeps the last 4 KiB of the server's stderr, for error messages.
/// The server's output as the session reads it, screened until its first line: a first line that is not
/// JSON (a server that writes a banner or garbage where JSON-RPC belongs) ends the session at once, the
/// line kept in `garbage` for the error, instead of the client waiting out its timeout for an answer that
/// will not come. After a first JSON line, everything is passed on as it comes.
fn screened(
    stdout: tokio::process::ChildStdout,
    runtime: &tokio::runtime::Runtime,
    garbage: Arc<Mutex<Option<String>>>,
) -> tokio::io::DuplexStream {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    /// The longest first line read whole; a longer one is not an `initialize` answer worth waiting for.
    const FIRST_LINE_MAX: u64 = 1 << 20;
    let (mut tx, rx) = tokio::io::duplex(64 * 1024);
    runtime.spawn(async move {
        let mut out = tokio::io::BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut out).take(FIRST_LINE_MAX).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            if serde_json::from_str::<Value>(text).is_err() {
                let shown: String = text.chars().take(200).collect();
                *garbage.lock().unwrap_or_else(|p| p.into_inner()) = Some(shown);
                return; // `tx` dropped: the session reads its end
            }
            if tx.write_all(&line).await.is_err() {
                return;
            }
            break;
        }
        let _ = tokio::io::copy(&mut out, &mut tx).await;
    });
    rx
}

async fn keep_tail(mut stderr: tokio::process::ChildStderr, tail: Arc<Mutex<String>>) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        t.push_str(&String::from_utf8_lossy(&buf[..n]));
        if t.len() > 4096 {
            let mut cut = t.len() - 4096;
            while !t.is_char_boundary(cut) {
                cut += 1;
            }
            t.drain(..cut);
        }
    }
}

/// Why [`Connection::wait`] stopped waiting.
enum Waited {
    Timeout,
    Interrupted,
}

impl Waited {
    fn describe(&self, what: &str, timeout: Duration) -> String {
        match self {
            Waited::Timeout => format!("did not answer {what} within {} s", timeout.as_secs_f64()),
            Waited::Interrupted => "interrupted".into(),
        }
    }
}

/// The client side of one server: its runtime, session and process.
struct Connection {
    name: String,
    runtime: tokio::runtime::Runtime,
    service: Option<RunningService<RoleClient, ()>>,
    /// The server's process, held so that it is killed when the connection goes (`kill_on_drop`), after
    /// its group (see `Drop`).
    _child: Option<tokio::process::Child>,
    pid: Option<u32>,
    stderr_tail: Arc<Mutex<String>>,
    timeout: Duration,
    retry: super::Retry,
}

impl Connection {
    /// Runs `fut` to its end, the timeout or an interrupt ([`crate::limits::interrupted`]).
    fn wait<F: Future>(&self, fut: F, timeout: Duration) -> std::result::Result<F::Output, Waited> {
        self.runtime.block_on(async {
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(fut, deadline);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    out = &mut fut => return Ok(out),
                    _ = &mut deadline => return Err(Waited::Timeout),
                    _ = tick.tick() => if crate::limits::interrupted() { return Err(Waited::Interrupted) },
                }
            }
        })
    }

    /// `message` with the end of the server's stderr, when it wrote any.
    fn with_stderr(&self, message: String) -> String {
        // Give the stderr reader a moment to catch what a dying server wrote last.
        std::thread::sleep(Duration::from_millis(20));
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        let tail = tail.trim();
        if tail.is_empty() {
            return message;
        }
        let lines: Vec<&str> = tail.lines().collect();
        format!("{message}; its stderr ends: {}", lines[lines.len().saturating_sub(5)..].join(" | "))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Close the session (the server sees its stdin end), give it a moment, then kill its group.
        if let Some(mut service) = self.service.take() {
            if tokio::runtime::Handle::try_current().is_err() {
                let _ = self.runtime.block_on(service.close_with_timeout(Duration::from_secs(1)));
            }
        }
        if let Some(pid) = self.pid {
            super::kill_process_group(pid);
            live_groups().retain(|&p| p != pid);
        }
    }
}

/// The process groups of the servers started and not yet shut down.
fn live_groups() -> std::sync::MutexGuard<'static, Vec<u32>> {
    static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills every MCP server still running (their process groups), for a program about to exit while a
/// tool call it gave up on still holds a server (a call past the agent's tool timeout runs on, on its
/// own thread, until the server's own timeout).
pub fn kill_all() {
    for pid in std::mem::take(&mut *live_groups()) {
        super::kill_process_group(pid);
    }
}

/// The `[[mcp]]` entries of a tools file, checked.
pub(crate) fn configs_from(entries: Vec<McpConfig>, file: &str) -> Result<Vec<McpConfig>> {
    let mut seen: Vec<String> = Vec::new();
    for e in &entries {
        let bad = |reason: String| Err(Error::Tool { tool: format!("{file}: [[mcp]] `{}`", e.name), reason });
        if e.name.is_empty() || !e.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-')) {
            return bad("`name` may use only letters, digits, `_` and `-`".into());
        }
        if e.command.is_empty() {
            return bad("`command` must name a program".into());
        }
        if seen.contains(&e.name) {
            return bad("two servers have this name".into());
        }
        e.timeout()?;
        seen.push(e.name.clone());
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_results_are_cut_on_a_character_boundary() {
        assert_eq!(cap_output("short".into(), 10), "short");
        let cut = cap_output("ééé".into(), 3);
        assert_eq!(cut, "é\n[... cut: the result has 6 bytes, 2 shown]");
    }
}
