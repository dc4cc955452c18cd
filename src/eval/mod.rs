//! `reagent eval`: runs a JSONL task file through the agent and scores the tool calls.
//!
//! A task is `{"id", "question"}` or `{"id", "messages": [{role, content}…]}`, with `"functions"` in the
//! common function format and optionally `"expected": [{"name", "arguments"}]`. With `dry_run` the functions
//! have no implementations: the first decision's calls are recorded and the task ends there (a first
//! `final_answer` means "no call"). Otherwise the whole loop runs, the functions bound to the built-in or
//! file tools of the same name.
//!
//! A task may also name `tools`: tools the eval provides (the built-ins, tools files), offered under their
//! own descriptions, and give `expected_answer`: texts its final answer must contain (case-insensitive),
//! for multi-step tasks scored on their outcome.
//!
//! A task may name its `category` (else its id without trailing numbers is used); the summary counts and
//! scores per category. Fields reagent does not know are kept and reported once by name, not refused.
//!
//! One result line is written (and flushed) per task as soon as it ends, so an interrupted eval keeps
//! every finished task and `resume` skips them. The model stays loaded across tasks, and because the
//! driver keeps its KV cache, tasks with the same function set reuse the prefilled system prompt.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::{Agent, AgentConfig, DecisionFormat, Driver, EventLog, StopReason, ToolChoice, Transcript};
use crate::error::{Error, Result};
use crate::text::chat::ChatMessage;
use crate::tools::{FnTool, Tool, ToolError, ToolSpec};

mod spread;
pub use spread::{run_eval_spread, Worker};

/// One expected call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpectedCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// One task of a task file. Fields reagent does not know are kept by name in `unknown` (reported once per
/// name by [`unknown_fields`]) rather than refused: task files are shared between tools.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct EvalTask {
    pub id: String,
    /// The task's category, for per-category accuracy (default: see [`EvalTask::category`]).
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub question: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub functions: Vec<Value>,
    #[serde(default)]
    pub expected: Option<Vec<ExpectedCall>>,
    /// Tools the eval provides (by name), offered besides `functions`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Texts the final answer must contain, compared without case (a string or a list).
    #[serde(default, deserialize_with = "one_or_many")]
    pub expected_answer: Option<Vec<String>>,
    /// The names of the line's fields that reagent does not know.
    #[serde(skip)]
    pub unknown: Vec<String>,
    /// The line of the task file (1-based).
    #[serde(skip)]
    pub line: usize,
}

impl EvalTask {
    /// The `category` field, else the id without a trailing `_N` or `-N` (`parallel_12` → `parallel`),
    /// else the whole id.
    pub fn category(&self) -> String {
        if let Some(c) = &self.category {
            return c.clone();
        }
        // BFCL's live ids carry two numbers (`live_simple_105-62`).
        let mut head = self.id.as_str();
        while let Some((h, n)) = head.rsplit_once(['_', '-']) {
            if h.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                break;
            }
            head = h;
        }
        head.to_string()
    }
}

/// The unknown fields of `tasks`, each once, with the first line it appears on.
pub fn unknown_fields(tasks: &[EvalTask]) -> Vec<(String, usize)> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for t in tasks {
        for k in &t.unknown {
            seen.entry(k).or_insert(t.line);
        }
    }
    let mut v: Vec<(String, usize)> = seen.into_iter().map(|(k, l)| (k.to_string(), l)).collect();
    v.sort_by_key(|(_, l)| *l);
    v
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(Some(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    }))
}

/// Whether `answer` contains every text of `expected`, ignoring case.
pub fn answer_matches(expected: &[String], answer: Option<&str>) -> bool {
    let Some(answer) = answer.map(str::to_lowercase) else { return false };
    expected.iter().all(|e| answer.contains(&e.to_lowercase()))
}

/// Reads a task file; errors name the line.
pub fn load_tasks(path: &Path) -> Result<Vec<EvalTask>> {
    // Read line by line: memory stays near the file's size plus one line, where the whole text and its
    // parsed tasks together were twice the file.
    let max = crate::limits::MAX_INPUT_BYTES;
    let mut input = crate::limits::open_input(path, max)?;
    let mut tasks = Vec::new();
    let mut ids = HashSet::new();
    let (mut buf, mut read) = (String::new(), 0u64);
    for i in 0.. {
        buf.clear();
        let n = std::io::BufRead::read_line(&mut input, &mut buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                Error::TaskLine { path: path.to_path_buf(), line: i + 1, problem: "not UTF-8 text".into() }
            }
            _ => Error::io(path, e),
        })?;
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > max {
            let problem = format!("grew past {max} bytes while being read");
            return Err(Error::InputFile { path: path.to_path_buf(), problem });
        }
        let line = if i == 0 { buf.trim_start_matches('\u{feff}') } else { buf.as_str() };
        if line.trim().is_empty() {
            continue;
        }
        let bad = |problem: String| Error::TaskLine { path: path.to_path_buf(), line: i + 1, problem };
        let mut t: EvalTask = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        t.line = i + 1;
        // The field names alone, in a second pass (serde's `flatten` would buffer a copy of the whole line).
        const KNOWN: [&str; 8] =
            ["id", "category", "question", "messages", "functions", "expected", "tools", "expected_answer"];
        let fields: BTreeMap<String, serde::de::IgnoredAny> =
            serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        t.unknown = fields.into_keys().filter(|k| !KNOWN.contains(&k.as_str())).collect();
        if t.question.is_some() == t.messages.is_some() {
            return Err(bad("a task needs exactly one of `question` and `messages`".into()));
        }
        let mut names = HashSet::new();
        for f in &t.functions {
            let spec = ToolSpec::from_function_json(f).map_err(|e| bad(e.to_string()))?;
            if !names.insert(spec.name.clone()) {
                return Err(bad(format!("function `{}` is defined twice", spec.name)));
            }
        }
        if t.messages.as_ref().is_some_and(|m| !m.iter().any(|m| m.role == crate::text::chat::Role::User)) {
            return Err(bad("`messages` has no user turn".into()));
        }
        if let Some(dup) = t.tools.iter().find(|n| names.contains(*n)) {
            return Err(bad(format!("`{dup}` is both a function and a provided tool")));
        }
        if !ids.insert(t.id.clone()) {
            return Err(bad(format!("duplicate id `{}`", t.id)));
        }
        tasks.push(t);
        if buf.capacity() > 1 << 20 {
            buf = String::new(); // not kept at the size of one huge line
        }
    }
    Ok(tasks)
}

/// How to run an eval.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EvalOptions {
    /// Record the first decision's calls only; functions are not executed.
    pub dry_run: bool,
    /// Run at most this many tasks (after skipping finished ones).
    pub limit: Option<usize>,
    /// Agent settings (tool choice, parallel calls, steps, retries…).
    pub agent: AgentConfig,
    /// Keep the KV cache from one task to the next (faster where tasks share a prompt prefix). Off by
    /// default: a prefix computed in an earlier task's batches differs from a fresh one in its last bits,
    /// enough to flip near ties, so a task's result would depend on the task before it, and a resumed
    /// eval would not match an uninterrupted one.
    pub reuse_across_tasks: bool,
    /// Where each task's agent events go, as they happen (`reagent eval --trace`).
    pub events: Option<EventLog>,
}

setters!(EvalOptions {
    dry_run: bool,
    limit: Option<usize>,
    agent: AgentConfig,
    reuse_across_tasks: bool,
    events: Option<EventLog>,
});

/// One call as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    pub name: String,
    pub arguments: Value,
}

/// One output line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskResult {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    pub calls: Vec<RecordedCall>,
    pub final_answer: Option<String>,
    pub stop_reason: String,
    pub steps: usize,
    pub retries: usize,
    /// The first decision was valid at the first attempt.
    pub valid_first_try: bool,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
    /// Exact match with `expected`, when the task has one.
    pub correct: Option<bool>,
    /// The first decision's margin at its call/answer branch (see [`crate::agent::BranchBiases`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_margin: Option<f32>,
    /// The first decision's margins of ending the turn after each call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_margins: Vec<f32>,
    /// The support from the request of the first call the model made (see
    /// [`AgentConfig::min_support`](crate::agent::AgentConfig::min_support)), kept or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub support: Option<f32>,
    /// Its values' scores ([`Step::support_values`](crate::agent::Step::support_values)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub support_values: Vec<crate::agent::ValueScore>,
    /// Its tool name's score ([`Step::tool_support`](crate::agent::Step::tool_support)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_support: Option<crate::agent::ValueScore>,
    /// The grounding of the first call the model made (see [`crate::agent::grounding`]), kept or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grounding: Option<f32>,
}

/// Totals of one category.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CategorySummary {
    pub tasks: usize,
    /// Tasks whose recorded calls are not empty.
    pub with_calls: usize,
    pub scored: usize,
    pub correct: usize,
    pub accuracy: Option<f64>,
}

/// Totals of an eval.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct Summary {
    pub tasks: usize,
    pub valid_first_try: usize,
    pub retries: usize,
    pub scored: usize,
    pub correct: usize,
    pub accuracy: Option<f64>,
    pub mean_seconds: f64,
    pub generated_tokens: usize,
    pub tok_s: f64,
    /// Per category (see [`EvalTask::category`]), when the results name categories.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub categories: BTreeMap<String, CategorySummary>,
}

impl Summary {
    /// Totals over result lines (for example a whole output file after a resume).
    pub fn of(results: &[TaskResult]) -> Self {
        let n = results.len();
        let secs: f64 = results.iter().map(|r| r.seconds).sum();
        let generated: usize = results.iter().map(|r| r.generated_tokens).sum();
        let scored = results.iter().filter(|r| r.correct.is_some()).count();
        let correct = results.iter().filter(|r| r.correct == Some(true)).count();
        Self {
            tasks: n,
            valid_first_try: results.iter().filter(|r| r.valid_first_try).count(),
            retries: results.iter().map(|r| r.retries).sum(),
            scored,
            correct,
            accuracy: (scored > 0).then(|| correct as f64 / scored as f64),
            mean_seconds: if n > 0 { secs / n as f64 } else { 0.0 },
            generated_tokens: generated,
            tok_s: if secs > 0.0 { generated as f64 / secs } else { 0.0 },
            categories: categories(results),
        }
    }
}

fn categories(results: &[TaskResult]) -> BTreeMap<String, CategorySummary> {
    let mut m: BTreeMap<String, CategorySummary> = BTreeMap::new();
    for r in results {
        let Some(c) = &r.category else { continue };
        let s = m.entry(c.clone()).or_default();
        s.tasks += 1;
        s.with_calls += usize::from(!r.calls.is_empty());
        s.scored += usize::from(r.correct.is_some());
        s.correct += usize::from(r.correct == Some(true));
    }
    for s in m.values_mut() {
        s.accuracy = (s.scored > 0).then(|| s.correct as f64 / s.scored as f64);
    }
    m
}

/// Whether `calls` are exactly the expected ones: the same names with the same arguments, in any order.
/// Numbers compare numerically (`2` = `2.0`); an argument the task did not expect is allowed only when it
/// equals the schema's `default`.
pub fn matches_expected(expected: &[ExpectedCall], calls: &[RecordedCall], functions: &[ToolSpec]) -> bool {
    if expected.len() != calls.len() {
        return false;
    }
    // A call may fit more than one expected call (an argument left at its default fits an expectation that
    // names it and one that does not), so pair them by search rather than first fit; lists are short.
    let fits: Vec<Vec<bool>> = expected
        .iter()
        .map(|e| {
            let schema = functions.iter().find(|f| f.name == e.name).map(|f| &f.parameters);
            calls.iter().map(|c| c.name == e.name && args_match(&e.arguments, &c.arguments, schema)).collect()
        })
        .collect();
    fn assign(fits: &[Vec<bool>], i: usize, used: &mut [bool]) -> bool {
        if i == fits.len() {
            return true;
        }
        for j in 0..used.len() {
            if fits[i][j] && !used[j] {
                used[j] = true;
                if assign(fits, i + 1, used) {
                    return true;
                }
                used[j] = false;
            }
        }
        false
    }
    assign(&fits, 0, &mut vec![false; calls.len()])
}

fn args_match(expected: &Value, got: &Value, schema: Option<&Value>) -> bool {
    // An expected call without `arguments` means no arguments.
    let empty = Value::Object(Default::default());
    let expected = if expected.is_null() { &empty } else { expected };
    let (Some(e), Some(g)) = (expected.as_object(), got.as_object()) else { return json_eq(expected, got) };
    let default = |k: &str| schema.and_then(|s| s["properties"][k].get("default"));
    e.iter().all(|(k, v)| g.get(k).is_some_and(|x| json_eq(v, x)))
        && g.iter().all(|(k, v)| e.contains_key(k) || default(k).is_some_and(|d| json_eq(d, v)))
}

fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Reads the ids already in an output file and cuts a last line left incomplete by an interruption.
pub fn finished_ids(out: &Path) -> Result<Vec<TaskResult>> {
    let Ok(mut text) = std::fs::read_to_string(out) else { return Ok(Vec::new()) };
    if !text.is_empty() && !text.ends_with('\n') {
        let keep = text.rfind('\n').map_or(0, |i| i + 1);
        text.truncate(keep);
        std::fs::write(out, &text).map_err(|e| Error::io(out, e))?;
    }
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Runs `tasks` on `driver`, appending one line per task to `out` (flushed each time) and calling
/// `progress(done, total)` after each. `tools` implement functions by name when not in dry-run mode.
/// Returns the driver (to reuse its model) and the results of this call.
pub fn run_eval(
    mut driver: Box<dyn Driver>,
    tasks: &[EvalTask],
    tools: &[Arc<dyn Tool>],
    opts: &EvalOptions,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Box<dyn Driver>, Vec<TaskResult>)> {
    let total = opts.limit.map_or(tasks.len(), |l| l.min(tasks.len()));
    let mut results = Vec::with_capacity(total);
    for task in &tasks[..total] {
        if crate::limits::interrupted() {
            break;
        }
        let (back, result) = run_task(driver, task, tools, opts)?;
        driver = back;
        // An interrupted task is not recorded: a resumed eval runs it again.
        let Some(result) = result? else { break };
        write_line(out, &result)?;
        if let Some(e) = opts.events.as_ref().and_then(EventLog::take_error) {
            return Err(e);
        }
        results.push(result);
        progress(results.len(), total);
    }
    Ok((driver, results))
}

/// What one task gave: its result, `None` when it was interrupted (not recorded), or the error that
/// stopped it.
type TaskOutcome = Result<Option<TaskResult>>;

/// Runs one task on `driver` and hands the driver back with the task's outcome; an error outside the
/// outcome lost the driver.
fn run_task(
    mut driver: Box<dyn Driver>,
    task: &EvalTask,
    tools: &[Arc<dyn Tool>],
    opts: &EvalOptions,
) -> Result<(Box<dyn Driver>, TaskOutcome)> {
    let (specs, bound) = task_tools(task, tools, opts.dry_run);
    let config = task_config(opts, specs.as_ref().is_ok_and(|s| s.is_empty()));
    let t0 = Instant::now();
    // A task the settings cannot run (a tool the eval does not provide, `--tool-choice NAME` and a task
    // without NAME) gets a result line saying so, and the eval goes on; checked before the driver, which
    // holds the loaded model, is handed over.
    let specs = match specs.and_then(|specs| runnable(specs, &config)) {
        Err(e) => return Ok((driver, Ok(Some(invalid_task_result(task, &e))))),
        Ok(specs) => specs,
    };
    if !opts.reuse_across_tasks {
        driver.forget();
    }
    let mut builder = Agent::builder().boxed_driver(driver).tools(bound).config(config);
    if let Some(log) = &opts.events {
        builder = builder.events(log.for_task(&task.id));
    }
    let mut agent = builder.build()?;
    let messages = match (&task.messages, &task.question) {
        (Some(m), _) => m.clone(),
        (None, Some(q)) => vec![ChatMessage::user(q.clone())],
        (None, None) => unreachable!("checked by load_tasks"),
    };
    let transcript = agent.run_conversation(&messages);
    let driver = agent.into_driver();
    let outcome = transcript.and_then(|t| match t.stop_reason {
        StopReason::Interrupted => Ok(None),
        // Not the task's result: the eval stops (or tries another server), and a resumed one runs it.
        StopReason::EndpointDown { endpoint, problem } => Err(Error::EndpointDown { endpoint, problem }),
        _ => task_result(task, &t, &specs, opts.dry_run, t0.elapsed().as_secs_f64()).map(Some),
    });
    Ok((driver, outcome))
}

/// A task's tool specs, or why the task cannot be run.
type TaskSpecs = std::result::Result<Vec<ToolSpec>, String>;

/// The task's tool specs (its own functions, then the named tools the eval provides) and the tools bound to
/// them; the specs are an error when a named tool is not provided.
fn task_tools(task: &EvalTask, tools: &[Arc<dyn Tool>], dry_run: bool) -> (TaskSpecs, Vec<Arc<dyn Tool>>) {
    let specs = match task.functions.iter().map(ToolSpec::from_function_json).collect::<Result<Vec<_>>>() {
        Ok(specs) => specs,
        Err(e) => return (Err(e.to_string()), Vec::new()),
    };
    let mut bound: Vec<Arc<dyn Tool>> = specs.iter().map(|s| bind(s, tools, dry_run)).collect();
    let mut specs = Ok(specs);
    for name in &task.tools {
        match (tools.iter().find(|t| &t.spec().name == name), &mut specs) {
            (Some(tool), Ok(specs)) => {
                specs.push(tool.spec().clone());
                bound.push(bind(tool.spec(), tools, dry_run));
            }
            (None, _) => specs = Err(format!("no tool `{name}` is provided (built-ins: --root; others: --tools)")),
            (Some(_), Err(_)) => {}
        }
    }
    (specs, bound)
}

/// The agent settings for one task: one decision in a dry run, and no tool choice without tools.
fn task_config(opts: &EvalOptions, no_tools: bool) -> AgentConfig {
    let mut config = opts.agent.clone();
    if opts.dry_run {
        config.max_steps = 1;
        // Only whether the first decision calls, and what, is recorded: a native answer's text is not
        // needed past its first tokens (its first token already made the choice).
        config.decision.max_answer_tokens = config.decision.max_answer_tokens.min(16);
        // Nor is its arithmetic checked: the answer is cut.
        config.check_arithmetic = false;
    }
    if no_tools && config.tool_choice == ToolChoice::Auto {
        config.tool_choice = ToolChoice::None;
    }
    config
}

/// `specs` when building the agent would compile them: the decision schema and its validator, or the
/// native grammar.
fn runnable(specs: Vec<ToolSpec>, config: &AgentConfig) -> std::result::Result<Vec<ToolSpec>, String> {
    let (choice, opts) = (&config.tool_choice, &config.decision);
    let checked =
        crate::agent::decision::decision_schema(&specs, choice, opts).and_then(|schema| match config.format {
            DecisionFormat::React => crate::agent::decision::DecisionValidator::new(&schema).map(|_| ()),
            DecisionFormat::Native => {
                // The tools' schemas are what is checked: any syntax's grammar holds the same.
                let syntax = crate::agent::native::CallSyntax::hermes();
                crate::agent::native::native_grammar(&specs, choice, opts, &syntax).map(|_| ())
            }
        });
    checked.map(|_| specs).map_err(|e| e.to_string())
}

/// The result line of a task that could not be run.
fn invalid_task_result(task: &EvalTask, error: &str) -> TaskResult {
    TaskResult {
        id: task.id.clone(),
        category: Some(task.category()),
        calls: Vec::new(),
        final_answer: None,
        stop_reason: format!("invalid_task: {error}"),
        steps: 0,
        retries: 0,
        valid_first_try: false,
        prompt_tokens: 0,
        reused_tokens: 0,
        generated_tokens: 0,
        seconds: 0.0,
        correct: (task.expected.is_some() || task.expected_answer.is_some()).then_some(false),
        call_margin: None,
        stop_margins: Vec::new(),
        support: None,
        support_values: Vec::new(),
        tool_support: None,
        grounding: None,
    }
}

/// The result line of a task that ran: its calls (a dry run's first decision's, else those executed),
/// scored against what the task expects.
fn task_result(task: &EvalTask, t: &Transcript, specs: &[ToolSpec], dry_run: bool, seconds: f64) -> Result<TaskResult> {
    let calls: Vec<RecordedCall> = if dry_run {
        let first_calls = t.steps.first().map(|s| s.decision.calls()).unwrap_or_default();
        first_calls.into_iter().map(|c| RecordedCall { name: c.tool, arguments: c.args }).collect()
    } else {
        t.steps
            .iter()
            .flat_map(|s| &s.calls)
            .map(|c| RecordedCall { name: c.call.tool.clone(), arguments: c.call.args.clone() })
            .collect()
    };
    let stop_reason = match (&t.stop_reason, dry_run) {
        (StopReason::MaxSteps { .. }, true) => "first_decision".to_string(),
        (s, _) => serde_json::to_value(s)?["kind"].as_str().unwrap_or("unknown").to_string(),
    };
    let first_margins = t.steps.first().map(|s| s.stats.branch_margins.clone()).unwrap_or_default();
    // No valid decision at all is a failure, not a correct "no call".
    let decided = !t.steps.is_empty();
    let calls_right = task.expected.as_ref().map(|e| decided && matches_expected(e, &calls, specs));
    let answer_right = task.expected_answer.as_ref().map(|e| answer_matches(e, t.final_answer.as_deref()));
    let correct = match (calls_right, answer_right) {
        (Some(a), Some(b)) => Some(a && b),
        (a, b) => a.or(b),
    };
    Ok(TaskResult {
        id: task.id.clone(),
        category: Some(task.category()),
        calls,
        final_answer: t.final_answer.clone(),
        stop_reason,
        steps: t.steps.len(),
        retries: t.stats.retries,
        valid_first_try: t.steps.first().is_some_and(|s| s.retries == 0),
        prompt_tokens: t.stats.prompt_tokens,
        reused_tokens: t.stats.reused_tokens,
        generated_tokens: t.stats.generated_tokens,
        seconds,
        correct,
        call_margin: first_margins.iter().find(|m| m.label == "call").map(|m| m.margin),
        stop_margins: first_margins.iter().filter(|m| m.label == "stop").map(|m| m.margin).collect(),
        grounding: t.steps.first().and_then(|s| s.grounding),
        support: t.steps.first().and_then(|s| s.support),
        support_values: t.steps.first().map(|s| s.support_values.clone()).unwrap_or_default(),
        tool_support: t.steps.first().and_then(|s| s.tool_support.clone()),
    })
}

/// Writes one result line and flushes it, so a kill never loses a finished task.
fn write_line(out: &mut dyn Write, result: &TaskResult) -> Result<()> {
    let mut line = serde_json::to_string(result)?;
    line.push('\n');
    out.write_all(line.as_bytes()).and_then(|_| out.flush()).map_err(|e| Error::io("eval output", e))
}

/// A task function as a tool: in dry-run mode a stub (never executed: the run stops after the first
/// decision), otherwise the built-in or file tool of the same name, or a stub that reports it has none.
fn bind(spec: &ToolSpec, tools: &[Arc<dyn Tool>], dry_run: bool) -> Arc<dyn Tool> {
    if !dry_run {
        if let Some(t) = tools.iter().find(|t| t.spec().name == spec.name) {
            return Arc::new(Rebound { spec: spec.clone(), inner: t.clone() });
        }
    }
    let name = spec.name.clone();
    Arc::new(FnTool::new(spec.clone(), move |_| {
        Err(ToolError(format!("`{name}` has no implementation in this evaluation")))
    }))
}

/// A tool implementation under the task's own description of it.
struct Rebound {
    spec: ToolSpec,
    inner: Arc<dyn Tool>,
}

impl Tool for Rebound {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        self.inner.call(args)
    }
    fn validate(&self, args: &Value) -> std::result::Result<(), String> {
        self.inner.validate(args)
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn live_parameters(&self) -> Option<Value> {
        // Under the task's description of the tool only where it names the same parameters.
        let names =
            |schema: &Value| schema.get("properties")?.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        let live = self.inner.live_parameters()?;
        (names(&live) == names(&self.spec.parameters)).then_some(live)
    }
    fn needed_for(&self, request: &str, done: &[crate::tools::Done]) -> Option<crate::tools::Need> {
        self.inner.needed_for(request, done)
    }
    fn retry(&self) -> crate::tools::Retry {
        self.inner.retry()
    }
    fn retryable(&self, error: &str) -> bool {
        self.inner.retryable(error)
    }
}
