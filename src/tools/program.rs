//! Tools backed by external programs, declared in a tools file (TOML or JSON) for CLI users.
//!
//! ```toml
//! [[tool]]
//! name = "word_count"
//! description = "Counts the words of a text."
//! command = ["python3", "wc.py"]     # program and fixed arguments; run directly, no shell
//! timeout_s = 10                      # default 30
//! max_output_bytes = 65536            # default 64 KiB; longer output is cut
//! read_only = true                    # default false: see `Tool::read_only`
//! parameters = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
//! ```
//!
//! The call's arguments are written as JSON to the program's stdin; its stdout is the result. A non-zero
//! exit status is a tool error carrying the end of its stderr; a run past the timeout is killed.
//!
//! The same file may declare MCP servers (`[[mcp]]` entries: `name`, `command`, `args`, `env`, `timeout_s`,
//! `tools`; see [`super::mcp`]).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::{Tool, ToolError, ToolSpec};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgramDef {
    name: String,
    #[serde(default)]
    description: String,
    command: Vec<String>,
    #[serde(default = "default_parameters")]
    parameters: Value,
    #[serde(default = "default_timeout")]
    timeout_s: f64,
    #[serde(default = "default_max_output")]
    max_output_bytes: usize,
    #[serde(default)]
    read_only: bool,
    /// Attempts after a transient failure (the program could not be started; for a read-only tool, a
    /// timeout too), at most 10.
    #[serde(default)]
    retries: u32,
    /// Seconds before the first retry, doubled for each next one.
    #[serde(default = "default_backoff")]
    backoff_s: f64,
}

fn default_backoff() -> f64 {
    1.0
}

fn default_parameters() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}
fn default_timeout() -> f64 {
    30.0
}
fn default_max_output() -> usize {
    super::DEFAULT_MAX_OUTPUT_BYTES
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(rename = "tool", alias = "tools", default)]
    tools: Vec<ProgramDef>,
    #[serde(default)]
    mcp: Vec<super::mcp::McpConfig>,
}

/// A tool that runs an external program.
pub struct ProgramTool {
    spec: ToolSpec,
    command: Vec<String>,
    timeout: Duration,
    max_output: usize,
    read_only: bool,
    retry: super::Retry,
}

impl ProgramTool {
    fn from_def(d: ProgramDef) -> Result<Self> {
        let spec = ToolSpec::new(d.name, d.description, d.parameters)?;
        if d.command.is_empty() || d.command[0].is_empty() {
            return Err(Error::Tool { tool: spec.name, reason: "`command` must name a program".into() });
        }
        let timeout = timeout_from_secs(d.timeout_s)
            .map_err(|e| Error::Tool { tool: spec.name.clone(), reason: format!("`timeout_s`: {e}") })?;
        if d.max_output_bytes > MAX_OUTPUT_LIMIT {
            return Err(Error::Tool {
                tool: spec.name,
                reason: format!("`max_output_bytes` is at most {MAX_OUTPUT_LIMIT} (16 MiB)"),
            });
        }
        if d.retries > super::Retry::MAX_TIMES {
            return Err(Error::Tool {
                tool: spec.name,
                reason: format!("`retries` is at most {}", super::Retry::MAX_TIMES),
            });
        }
        if !(0.0..=60.0).contains(&d.backoff_s) {
            return Err(Error::Tool { tool: spec.name, reason: "`backoff_s` is between 0 and 60".into() });
        }
        let retry = super::Retry::new(d.retries, Duration::from_secs_f64(d.backoff_s));
        Ok(Self { spec, command: d.command, timeout, max_output: d.max_output_bytes, read_only: d.read_only, retry })
    }
}

/// The largest `max_output_bytes` a tools file may ask for.
const MAX_OUTPUT_LIMIT: usize = 16 << 20;

/// The longest tool timeout, in seconds (a day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// A tool timeout from seconds: positive, finite and at most [`MAX_TIMEOUT_S`] (so deadlines never
/// overflow the clock).
pub fn timeout_from_secs(s: f64) -> std::result::Result<Duration, String> {
    match s {
        s if s > 0.0 && s <= MAX_TIMEOUT_S => Ok(Duration::from_secs_f64(s)),
        s => Err(format!("must be a number of seconds above 0 and at most {MAX_TIMEOUT_S}, not {s}")),
    }
}

/// What a tools file declares: program tools, and MCP servers (not started yet).
#[non_exhaustive]
pub struct ToolsFileContents {
    pub tools: Vec<Arc<dyn Tool>>,
    pub mcp: Vec<super::mcp::McpConfig>,
}

/// Reads a tools file (`.toml`, or `.json` with the same fields: `{"tools": [...], "mcp": [...]}`).
pub fn read_tools_file(path: &Path) -> Result<ToolsFileContents> {
    let text = crate::limits::read_input(path, 4 << 20)?;
    let bad = |e: String| Error::Tool { tool: path.display().to_string(), reason: e };
    let file: ToolsFile = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?
    } else {
        toml::from_str(&text).map_err(|e| bad(e.to_string()))?
    };
    let tools: Vec<Arc<dyn Tool>> = file
        .tools
        .into_iter()
        .map(|d| ProgramTool::from_def(d).map(|t| Arc::new(t) as Arc<dyn Tool>))
        .collect::<Result<_>>()?;
    let mcp = super::mcp::configs_from(file.mcp, &path.display().to_string())?;
    if tools.is_empty() && mcp.is_empty() {
        return Err(bad("declares no tools (`[[tool]]`) and no MCP servers (`[[mcp]]`)".into()));
    }
    Ok(ToolsFileContents { tools, mcp })
}

/// Reads a tools file and starts the MCP servers it declares: its program tools, then the servers' tools
/// (named `<server>.<tool>` where they clash with each other or with the program tools).
pub fn load_tools_file(path: &Path) -> Result<Vec<Arc<dyn Tool>>> {
    let ToolsFileContents { mut tools, mcp } = read_tools_file(path)?;
    let servers = mcp.iter().map(super::mcp::McpServer::spawn).collect::<Result<Vec<_>>>()?;
    let names: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
    let taken: Vec<&str> = names.iter().map(String::as_str).collect();
    tools.extend(super::mcp::tools_of(&servers, &taken));
    Ok(tools)
}

impl Tool for ProgramTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn retry(&self) -> super::Retry {
        self.retry
    }

    /// The program could not be started (nothing ran), or a read-only one was killed at its timeout.
    fn retryable(&self, error: &str) -> bool {
        error.starts_with("cannot run `") || (self.read_only && error.starts_with("killed after"))
    }

    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        let mut command = Command::new(&self.command[0]);
        command.args(&self.command[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own process group: the tool and whatever it starts are killed together.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|e| ToolError(format!("cannot run `{}`: {e}", self.command[0])))?;
        let group = ProcessGroup(child.id());
        let input = args.to_string();
        let mut stdin = child.stdin.take().expect("piped");
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
        let cap = self.max_output;
        let mut stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || capped_read(&mut stdout, cap));
        let mut stderr = child.stderr.take().expect("piped");
        let err_reader = std::thread::spawn(move || tail_read(&mut stderr, 4096));
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= deadline || crate::limits::interrupted() => {
                    group.kill();
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(match crate::limits::interrupted() {
                        true => ToolError("interrupted".into()),
                        false => ToolError(format!("killed after {} s", self.timeout.as_secs_f64())),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(ToolError(e.to_string())),
            }
        };
        // Processes the tool left behind (`sleep 600 &`) would hold its pipes open: the call ends with the
        // tool, so they are killed with its group, and the pipes close.
        group.kill();
        let _ = writer.join();
        let (out, cut) = reader.join().unwrap_or_default();
        let err = err_reader.join().unwrap_or_default();
        if !status.success() {
            let tail = String::from_utf8_lossy(&err);
            return Err(ToolError(format!("exited with {status}: {}", tail.trim())));
        }
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if cut {
            text.push_str(&format!("\n[... output cut at {} bytes]", self.max_output));
        }
        Ok(Value::String(text))
    }
}

/// A tool's process group (its id is the tool's pid), killed as a whole.
struct ProcessGroup(u32);

impl ProcessGroup {
    fn kill(&self) {
        super::kill_process_group(self.0);
    }
}

impl Drop for ProcessGroup {
    /// A call that ends any other way (a panic in the executor's thread) still takes the group with it.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `cap` bytes of a stream, draining it all.
fn tail_read(r: &mut impl Read, cap: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() > 2 * cap {
            out.drain(..out.len() - cap);
        }
    }
    if out.len() > cap {
        out.drain(..out.len() - cap);
    }
    out
}

/// Reads up to `cap` bytes, draining (and dropping) the rest so the child never blocks on a full pipe.
fn capped_read(r: &mut impl Read, cap: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let mut cut = false;
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(out.len());
        out.extend_from_slice(&buf[..n.min(room)]);
        cut |= n > room;
    }
    (out, cut)
}
