//! Tools the agent can call: the [`Tool`] trait, three ways to define one (a typed Rust function, a
//! function definition in the common format with a closure, an external program), the built-ins, and
//! the [`Executor`] that validates arguments, runs calls with a timeout and turns every failure into an
//! observation.

mod builtin;
mod executor;
pub mod mcp;
mod program;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use builtin::{builtin_tools, BuiltinOptions};
pub(crate) use builtin::{calculate, existing_path_in};
pub(crate) use executor::ERROR_MARK;
pub use executor::{repeat_note, CallOutcome, Executor, Interceptor, InterceptorAction};

pub use program::{load_tools_file, read_tools_file, timeout_from_secs, ProgramTool, ToolsFileContents, MAX_TIMEOUT_S};

use crate::error::{Error, Result};

/// The most of a tool's output the model is shown by default: program tools' `max_output_bytes` default,
/// and every MCP result.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Kills the process group `pid` leads (a program tool, an MCP server) with SIGKILL. A group that is already
/// gone gives ESRCH, which is fine.
pub(crate) fn kill_process_group(pid: u32) {
    #[cfg(unix)]
    if let Ok(pgid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals the group; no memory is involved.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// One tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolCall {
    pub tool: String,
    pub args: Value,
}

impl ToolCall {
    /// A call of `tool` with `args` (a JSON object).
    pub fn new(tool: impl Into<String>, args: Value) -> Self {
        Self { tool: tool.into(), args }
    }
}

impl From<ToolCall> for crate::text::chat::ChatCall {
    fn from(c: ToolCall) -> Self {
        Self::new(c.tool, c.args)
    }
}

/// A tool's public description: its name, what it does, and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the `args` object.
    pub parameters: Value,
}

impl ToolSpec {
    /// A tool description; the name must be an identifier (letters, digits, `_`, `-`, `.`).
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Result<Self> {
        let spec = Self { name: name.into(), description: description.into(), parameters };
        spec.check()?;
        Ok(spec)
    }

    /// Reads the common function format: `{"type": "function", "function": {name, description,
    /// parameters}}` or the bare inner object.
    pub fn from_function_json(v: &Value) -> Result<Self> {
        let f = if v.get("type").and_then(|t| t.as_str()) == Some("function") { v.get("function") } else { Some(v) };
        let f = f.and_then(|f| f.as_object()).ok_or_else(|| Error::Tool {
            tool: "?".into(),
            reason: "a function definition must be an object with `name` and `parameters`".into(),
        })?;
        let name = f.get("name").and_then(|n| n.as_str()).ok_or_else(|| Error::Tool {
            tool: "?".into(),
            reason: "function definition has no string `name`".into(),
        })?;
        let description = f.get("description").and_then(|d| d.as_str()).unwrap_or("");
        let parameters =
            f.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        Self::new(name, description, parameters)
    }

    fn check(&self) -> Result<()> {
        let err = |reason: String| Err(Error::Tool { tool: self.name.clone(), reason });
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if self.name.is_empty() || !self.name.chars().all(ok_char) {
            return err("tool names may use only letters, digits, `_`, `-` and `.`".into());
        }
        // A decision's `type` says `final_answer`; a tool of that name would be read as the answer.
        if self.name == "final_answer" {
            return err("the name is reserved for the final answer".into());
        }
        match self.parameters.as_object() {
            None => return err("`parameters` must be a JSON schema object".into()),
            Some(p) if p.get("type").is_some_and(|t| t != "object") => {
                return err(format!("`parameters` must describe an object, not {}", p["type"]))
            }
            Some(_) => {}
        }
        jsonschema::validator_for(&self.parameters).map_err(|e| Error::Tool {
            tool: self.name.clone(),
            reason: format!("`parameters` is not a valid JSON schema: {e}"),
        })?;
        if let Some(why) = crate::decode::finite::no_finite_instance(&self.parameters) {
            return err(format!("`parameters`: {why}; no call could be written"));
        }
        Ok(())
    }
}

/// A tool's failure, shown to the model as the observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError(pub String);

impl<E: std::fmt::Display> From<E> for ToolError {
    fn from(e: E) -> Self {
        ToolError(e.to_string())
    }
}

/// Something the agent can call.
pub trait Tool: Send + Sync {
    /// Name, description and argument schema.
    fn spec(&self) -> &ToolSpec;
    /// Runs the tool on arguments that already satisfy the schema. The result is shown to the model
    /// (strings as they are, anything else as JSON).
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError>;
    /// Extra checks beyond the schema (semantic rules); an error is a validation failure the model is
    /// asked to correct.
    fn validate(&self, _args: &Value) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether a call changes nothing and gives the same result when made again while only read-only
    /// tools run in between (a calculation, reading a file). The agent then refuses to go back to a call it
    /// made two or three calls before, and gives the result it had. Default: `false`.
    fn read_only(&self) -> bool {
        false
    }
    /// How many times, and after what wait, a call that failed transiently ([`Tool::retryable`]) is made
    /// again. Default: never.
    fn retry(&self) -> Retry {
        Retry::default()
    }
    /// Whether a call that failed with `error` may be made again: the error says nothing ran (the program
    /// could not be started), or the tool is read-only and timed out. A tool that changes things is never
    /// made again after a timeout: it may have done its work. Default: no.
    fn retryable(&self, _error: &str) -> bool {
        false
    }
    /// The argument schema to decode calls with now, narrowed by live state (a file tool's paths to those
    /// that exist under its root), or `None` for the spec's own. A value that cannot work, an invented
    /// path, then cannot be written. It must accept only arguments the spec accepts. Default: `None`.
    fn live_parameters(&self) -> Option<Value> {
        None
    }
    /// Why `request` itself says this tool is still needed after the calls `done` so far, if it does: it
    /// names a file or folder a file tool can reach that no call has read or listed yet, it writes
    /// arithmetic and the calculator has not run. Under `auto`, the first decision then calls a tool
    /// ([`FirstCall::WhenNeeded`](crate::agent::FirstCall)), and a later answer is sent back once to
    /// call again (a question about two files is not answered from one). Default: `None`.
    fn needed_for(&self, _request: &str, _done: &[Done]) -> Option<Need> {
        None
    }
}

/// What a request still needs a tool for ([`Tool::needed_for`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Need {
    /// Why, as the events say it ("the request names `notes.txt`").
    pub reason: String,
    /// Where the request names it (a byte offset): needs are met in the order the request gives them.
    pub at: usize,
    /// The calls that meet it, as tool specs narrowed to them (`read_file` of that one path); empty: any
    /// call.
    pub calls: Vec<ToolSpec>,
}

impl Need {
    /// A need met by any call (narrow it with [`calls`](Self::calls)); `at`: where the request names it.
    pub fn new(reason: impl Into<String>, at: usize) -> Self {
        Self { reason: reason.into(), at, calls: Vec::new() }
    }

    /// Met only by these calls (tool specs narrowed to them).
    #[must_use]
    pub fn calls(mut self, calls: Vec<ToolSpec>) -> Self {
        self.calls = calls;
        self
    }

    /// A need for any tool that takes a path (a parameter named `path` or `…_path`, `file`, `filename`)
    /// when the request names an absolute path that exists (live state, not a word's shape) and nothing
    /// has run yet: the first call of a tool from outside the built-ins (an MCP server's file tools, which
    /// reach what the built-ins' root does not), met only by such tools.
    pub fn of_path_parameter(spec: &ToolSpec, request: &str, done: &[Done]) -> Option<Need> {
        let props = spec.parameters.get("properties")?.as_object()?;
        let takes_path = props.keys().any(|k| {
            let k = k.to_lowercase();
            k == "path" || k.ends_with("_path") || k == "file" || k == "filename" || k == "paths"
        });
        if !takes_path || !done.is_empty() {
            return None;
        }
        let (at, word) = existing_path_in(request)?;
        Some(Need::new(format!("the request names `{word}`"), at).calls(vec![spec.clone()]))
    }
}

/// The words of a tool's name, lower-cased: split at anything not a letter or digit and where a lower-case
/// letter meets a capital (`ViolationApi_get` → violation, api, get).
pub fn name_words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if (!c.is_alphanumeric() || (prev_lower && c.is_uppercase())) && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if c.is_alphanumeric() {
            cur.extend(c.to_lowercase());
        }
        prev_lower = c.is_lowercase();
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A call that ran and gave a result, with its output: what a run has done so far ([`Tool::needed_for`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Done<'a> {
    pub call: &'a ToolCall,
    pub output: &'a str,
}

impl<'a> Done<'a> {
    pub fn new(call: &'a ToolCall, output: &'a str) -> Self {
        Self { call, output }
    }
}

/// How a tool's transient failures are tried again ([`Tool::retry`]): up to `times` more attempts, the
/// first after `backoff`, each next one after twice the wait before (at most a minute).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct Retry {
    pub times: u32,
    pub backoff: std::time::Duration,
}

impl Retry {
    /// The most attempts a tool may add.
    pub const MAX_TIMES: u32 = 10;

    pub fn new(times: u32, backoff: std::time::Duration) -> Self {
        Self { times: times.min(Self::MAX_TIMES), backoff }
    }

    /// The wait before attempt `n` (1 for the first retry).
    pub fn wait(&self, n: u32) -> std::time::Duration {
        self.backoff.saturating_mul(1 << n.saturating_sub(1).min(16)).min(std::time::Duration::from_secs(60))
    }
}

/// A tool from a function definition and a closure.
pub struct FnTool<F> {
    spec: ToolSpec,
    f: F,
    read_only: bool,
    retry: Retry,
    retryable: Option<fn(&str) -> bool>,
}

impl<F> FnTool<F>
where
    F: Fn(&Value) -> std::result::Result<Value, ToolError> + Send + Sync,
{
    /// From a spec and a closure.
    pub fn new(spec: ToolSpec, f: F) -> Self {
        Self { spec, f, read_only: false, retry: Retry::default(), retryable: None }
    }

    /// Makes a call that fails with an error `transient` accepts again, as `retry` says.
    #[must_use]
    pub fn retry(mut self, retry: Retry, transient: fn(&str) -> bool) -> Self {
        self.retry = retry;
        self.retryable = Some(transient);
        self
    }

    /// Marks the tool [read-only](Tool::read_only).
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// From a definition in the common function format (`{"type":"function","function":{…}}` or the bare
    /// `{name, description, parameters}`).
    pub fn from_function_json(def: &Value, f: F) -> Result<Self> {
        Ok(Self::new(ToolSpec::from_function_json(def)?, f))
    }
}

impl<F> Tool for FnTool<F>
where
    F: Fn(&Value) -> std::result::Result<Value, ToolError> + Send + Sync,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        (self.f)(args)
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn retry(&self) -> Retry {
        self.retry
    }
    fn retryable(&self, error: &str) -> bool {
        self.retryable.is_some_and(|f| f(error))
    }
}

/// A tool with typed arguments: the schema is derived from `A` (serde + schemars) and the arguments are
/// deserialized into `A` before the function runs. The function returns anything serializable (a string
/// is shown as it is, anything else as JSON) or any displayable error, or a [`ToolError`] (shown as the
/// error observation).
///
/// ```
/// use reagent::tools::TypedTool;
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Args {
///     /// Degrees Celsius.
///     celsius: f64,
/// }
/// let tool = TypedTool::new("to_fahrenheit", "Converts Celsius to Fahrenheit.", |a: Args| {
///     if a.celsius < -273.15 {
///         return Err(format!("{} °C is below absolute zero", a.celsius));
///     }
///     Ok(a.celsius * 9.0 / 5.0 + 32.0)
/// })?;
/// # Ok::<(), reagent::Error>(())
/// ```
pub struct TypedTool<A, F, R, E> {
    spec: ToolSpec,
    f: F,
    read_only: bool,
    _types: std::marker::PhantomData<fn(A) -> (R, E)>,
}

impl<A, F, R, E> TypedTool<A, F, R, E>
where
    A: serde::de::DeserializeOwned + schemars::JsonSchema,
    F: Fn(A) -> std::result::Result<R, E> + Send + Sync,
    R: Serialize,
    E: Into<ToolError>,
{
    /// A typed tool named `name`.
    pub fn new(name: &str, description: &str, f: F) -> Result<Self> {
        let mut schema = serde_json::to_value(schemars::schema_for!(A))?;
        if let Some(o) = schema.as_object_mut() {
            o.remove("$schema");
            o.remove("title");
        }
        Ok(Self {
            spec: ToolSpec::new(name, description, schema)?,
            f,
            read_only: false,
            _types: std::marker::PhantomData,
        })
    }

    /// Marks the tool [read-only](Tool::read_only).
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

impl<A, F, R, E> Tool for TypedTool<A, F, R, E>
where
    A: serde::de::DeserializeOwned + schemars::JsonSchema,
    F: Fn(A) -> std::result::Result<R, E> + Send + Sync,
    R: Serialize,
    E: Into<ToolError>,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        let a: A = serde_json::from_value(args.clone()).map_err(|e| ToolError(format!("bad arguments: {e}")))?;
        let r = (self.f)(a).map_err(Into::into)?;
        serde_json::to_value(r).map_err(|e| ToolError(format!("the result cannot be written as JSON: {e}")))
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
}

/// The tools of one agent, by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Vec<Arc<dyn Tool>>,
}

impl ToolSet {
    /// Adds a tool; names must be unique.
    pub fn add(&mut self, tool: Arc<dyn Tool>) -> Result<()> {
        let name = &tool.spec().name;
        if self.get(name).is_some() {
            return Err(Error::Tool { tool: name.clone(), reason: "registered twice".into() });
        }
        self.tools.push(tool);
        Ok(())
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.spec().name == name)
    }

    /// The specs, in registration order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec().clone()).collect()
    }

    /// Tool names, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.spec().name.as_str()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// The text the model sees for a tool result.
pub fn observation_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_parameter_is_needed_for_a_named_path_that_exists() {
        let spec = ToolSpec::new(
            "server.read_text_file",
            "Read a file",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        )
        .unwrap();
        let need = |request: &str| Need::of_path_parameter(&spec, request, &[]);
        // Relative to the working directory (the crate's root under `cargo test`), as a server started
        // from here resolves it, or absolute.
        let found = need("How many lines does Cargo.toml have?").expect("a need");
        assert_eq!((found.reason.as_str(), found.at), ("the request names `Cargo.toml`", 20));
        assert_eq!(found.calls, vec![spec.clone()]);
        let abs = std::env::current_dir().unwrap().join("Cargo.toml");
        assert!(need(&format!("Read {}.", abs.display())).is_some());
        // A file-shaped word naming nothing here forces nothing; nor does one after a call ran.
        assert_eq!(need("What is a package.json file for?"), None);
        let call = ToolCall::new("server.read_text_file", json!({"path": "Cargo.toml"}));
        assert_eq!(Need::of_path_parameter(&spec, "Read Cargo.toml", &[Done::new(&call, "[package]")]), None);
        // A tool without a path parameter is not needed for a path.
        let other = ToolSpec::new("echo", "", json!({"type": "object", "properties": {"message": {}}})).unwrap();
        assert_eq!(Need::of_path_parameter(&other, "Read Cargo.toml", &[]), None);
    }
}
