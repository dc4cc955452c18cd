//! The agent commands: `run` (one task, its events shown as they happen) and `eval` (a task file scored).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use reagent::agent::{
    Agent, AgentConfig, AgentEvent, Driver, EventLog, ModelDriver, Profile, RemoteConstraint, StopReason,
};
use reagent::eval::{finished_ids, load_tasks, run_eval, unknown_fields, EvalOptions, Summary};
use reagent::model::prompt_cache::PromptCache;
use reagent::tools::mcp::{tools_of as mcp_tools_of, McpConfig, McpServer};
use reagent::tools::{builtin_tools, read_tools_file, BuiltinOptions, Tool};
use reagent::Sampling;

use super::args::{EvalArgs, RemoteArgs, RunArgs, RunOptions};
use super::{display, load, stdout_failed, INTERRUPTED_EXIT};

/// `reagent run`: one task; events go to stderr (or stdout as JSON lines), the answer to stdout.
pub(super) fn run_agent(a: RunArgs) -> Result<ExitCode> {
    let mut config = run_config(&a.opts)?;
    let tools = run_tools(&a.opts)?;
    // One process at a time resumes a trace, and none while the run that writes it goes on: two would run
    // the same recorded calls. The lock is held until the run ends.
    let _trace_lock = match (&a.resume, &a.trace) {
        (Some(path), _) => Some(lock_trace(path, false, "another run is resuming this trace, or still writing it")?),
        (None, Some(path)) => Some(lock_trace(path, true, "another run is writing or resuming this trace")?),
        (None, None) => None,
    };
    let recorded = a.resume.as_deref().map(reagent::agent::read_trace).transpose()?;
    let task = match (&a.task, &recorded) {
        (Some(t), _) => t.clone(),
        (None, Some(r)) => r.header.as_ref().map(|h| h.task.clone()).unwrap_or_default(),
        (None, None) => unreachable!("clap requires a task without --resume"),
    };
    if let (Some(r), Some(path)) = (&recorded, &a.resume) {
        if r.header.is_none() {
            bail!(
                "{}: not the trace of a run (its first line is not a `trace` header from `reagent run --trace`)",
                path.display()
            );
        }
        if r.finished {
            bail!("{}: the run it recorded ended (its transcript is there); nothing to resume", path.display());
        }
    }
    let trace = match (&a.resume, &recorded) {
        (Some(path), Some(r)) => Some(EventLog::append(path, r.bytes)?),
        _ => a.trace.as_deref().map(EventLog::create).transpose()?,
    };
    let (driver, model_id, constraint) = match one_endpoint(&a.remote, "run")? {
        Some(url) => {
            let (d, id, c) = remote_driver(url, &a.remote, a.opts.model.model.as_deref())?;
            (Box::new(d) as Box<dyn Driver>, id, Some(c))
        }
        None => {
            let (d, id) = run_driver(&a.opts)?;
            (Box::new(d) as Box<dyn Driver>, id, None)
        }
    };
    let entry = driver.catalog_entry();
    a.opts.agent.decision.apply(&mut config, entry.as_ref(), Profile::Run, driver.supports_native())?;
    if let Some(c) = constraint {
        eprintln!("model: {model_id}{}", unapplied_remotely(&config, c));
    }
    let specs: Vec<reagent::ToolSpec> = tools.iter().map(|t| t.spec().clone()).collect();
    let header = reagent::agent::TraceHeader::new(
        &task,
        model_id,
        &specs,
        super::args::describe_decisions(&config, driver.call_syntax().as_ref()),
    );
    if let (Some(r), Some(path)) = (&recorded, &a.resume) {
        let differences = r.header.as_ref().map(|h| h.differences(&header)).unwrap_or_default();
        if !differences.is_empty() && !a.resume_anyway {
            bail!(
                "{}: another run than this one ({}); --resume-anyway resumes it anyway",
                path.display(),
                differences.join("; ")
            );
        }
    }
    if let (Some(t), None) = (&trace, &recorded) {
        t.write_header(&header);
    }
    let (json, colour) = (a.json, std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let events = trace.clone();
    // The answer in the model's own words is shown as it is generated (not in --json, whose events come
    // whole).
    let live = display::LiveAnswer::new(false, colour);
    let shown = live.clone();
    let mut builder =
        Agent::builder().boxed_driver(driver).tools(tools).config(config).events(move |e: &AgentEvent| {
            // The trace gets every event as it happens, so an interrupted run keeps what it did; a run that
            // cannot keep its trace stops.
            if let Some(t) = &events {
                t.write_event(e);
                if let Some(err) = t.take_error() {
                    eprintln!("error: writing the trace: {err}");
                    std::process::exit(2);
                }
            }
            match (json, e) {
                (true, e) => writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(e).unwrap_or_default())
                    .unwrap_or_else(|e| stdout_failed(e)),
                (false, AgentEvent::FinalAnswer { answer, .. }) if shown.finish(answer) => {}
                (false, e) => {
                    shown.pause();
                    display::show_event(e, colour)
                }
            }
        });
    if !json {
        builder = builder.answer_text(move |t| live.piece(t));
    }
    if a.opts.confirm {
        // The person decides about every call, those a tool's output chose included (run_config).
        builder = builder.interceptor(display::Confirm);
    }
    let mut agent = builder.build()?;
    let transcript = match recorded {
        Some(r) => agent.resume(&[reagent::ChatMessage::user(task.clone())], r.steps)?,
        None => agent.run(&task)?,
    };
    drop(agent);
    if let Some(t) = &trace {
        t.write_transcript(&transcript);
        t.take_error().map_or(Ok(()), Err)?;
    }
    if !json {
        match &transcript.final_answer {
            Some(answer) => out!("{answer}"),
            // A run that failed says so, where the answer would be.
            None if transcript.stop_reason != StopReason::Interrupted => out!("No answer: {}", transcript.stop_reason),
            None => {}
        }
    }
    Ok(match (&transcript.stop_reason, &transcript.final_answer) {
        (StopReason::Interrupted, _) => ExitCode::from(INTERRUPTED_EXIT),
        (_, Some(_)) => ExitCode::SUCCESS,
        (_, None) => ExitCode::from(1),
    })
}

/// The one `--endpoint` of a command that takes at most one.
pub(super) fn one_endpoint<'a>(r: &'a RemoteArgs, command: &str) -> Result<Option<&'a str>> {
    match r.endpoint.as_slice() {
        [] => Ok(None),
        [url] => Ok(Some(url)),
        [..] => bail!("--endpoint: `{command}` takes one (`eval` spreads its tasks over several)"),
    }
}

/// What the decision settings ask for that needs the model's scores: the call bias comes from the
/// server's log-probabilities (under a constraint, which `--constraint none` sends none of); the support,
/// which needs the scores of a given text, is not applied. `; …`, or nothing.
pub(super) fn unapplied_remotely(config: &AgentConfig, constraint: RemoteConstraint) -> String {
    let (bias, mut said, mut unapplied) = (config.branch_biases.call, String::new(), Vec::new());
    match constraint {
        _ if bias == 0.0 => {}
        RemoteConstraint::Grammar | RemoteConstraint::Gbnf | RemoteConstraint::JsonSchema => {
            said = format!("; call bias {bias} from the server's log-probabilities (not applied where it returns none)")
        }
        _ => unapplied.push(format!("call bias {bias}")),
    }
    if let Some(s) = config.min_support {
        unapplied.push(format!("min support {s}"));
    }
    if let Some(s) = config.min_tool_support {
        unapplied.push(format!("min tool support {s}"));
    }
    if !unapplied.is_empty() {
        said.push_str(&format!("; not applied remotely: {}", unapplied.join(", ")));
    }
    said
}

/// The driver of a model served at `url` (`model`: --model, naming the served model unless
/// --served-model does), its description for a trace header, and the constraint it sends (probed under
/// `--constraint auto`).
pub(super) fn remote_driver(
    url: &str,
    r: &RemoteArgs,
    model: Option<&str>,
) -> Result<(reagent::agent::RemoteDriver, String, RemoteConstraint)> {
    if !(r.request_timeout > 0.0 && r.request_timeout <= 86_400.0) {
        bail!("--request-timeout: give a number of seconds above 0, at most a day");
    }
    let name = r.served_model.as_deref().or(model).unwrap_or("default").to_string();
    let probe = r.constraint == "auto";
    let constraint: RemoteConstraint = if probe { RemoteConstraint::Grammar } else { r.constraint.parse()? };
    let timeout = std::time::Duration::from_secs_f64(r.request_timeout);
    // A catalog name in --model: its run settings apply (but for those that need the model's scores).
    let entry = model.and_then(|m| reagent::catalog::Catalog::builtin().get(m).cloned());
    let mut driver = reagent::agent::RemoteDriver::new(url, name.clone(), constraint, timeout)?
        .api_key(r.api_key.clone())
        .catalog_entry(entry);
    // The model's file here (a catalog name in the cache, or a path): its template makes native decisions
    // possible under a grammar. Not fetched for this.
    let here = model.and_then(|m| {
        let opts = reagent::catalog::FetchOptions::default().download(false);
        reagent::catalog::resolve(&reagent::catalog::Catalog::builtin(), m, &opts).ok()
    });
    if let Some(path) = here {
        driver = driver.with_template(&path)?;
    }
    let how = match probe {
        true => format!("{}, probed", driver.probe()?),
        false => constraint.to_string(),
    };
    let id = format!("{name} at {} ({how})", url.trim_end_matches('/'));
    let constraint = driver.constraint();
    Ok((driver, id, constraint))
}

/// The model's driver for `run` and `chat`, and the model's description for a trace header.
pub(super) fn run_driver(o: &RunOptions) -> Result<(ModelDriver, String)> {
    let sampling = Sampling::from_params(o.temperature, None, None)?;
    let model = load(&o.model)?;
    let model_id = {
        let info = model.info();
        let name =
            info.path.file_name().map_or_else(|| info.path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let sha = model.catalog_entry().map(|e| format!(", sha256 {}", e.sha256)).unwrap_or_default();
        format!("{name} ({} bytes{sha})", info.file_bytes)
    };
    let mut driver = match o.agent.no_grammar {
        true => ModelDriver::free_form(model, sampling, o.seed),
        false => ModelDriver::constrained(model, sampling, o.seed)?,
    };
    if o.no_prefix_reuse {
        driver = driver.without_prefix_reuse();
    }
    if o.agent.no_speculation {
        driver = driver.without_speculation();
    }
    if !o.no_prompt_cache && super::prompt_cache_on() {
        driver = driver.with_prompt_cache(PromptCache::default_dir());
    }
    Ok((driver, model_id))
}

/// The tools `run` offers: the built-ins `--builtin` selects, then those of each tools file.
pub(super) fn run_tools(a: &RunOptions) -> Result<Vec<Arc<dyn Tool>>> {
    let mut tools = builtin_tools(
        &BuiltinOptions::default()
            .root(a.agent.root.clone())
            .allow_write(a.allow_write)
            .read_hard_links(a.read_hard_links),
    )?;
    if !a.builtin.is_empty() {
        let known: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
        if let Some(bad) = a.builtin.iter().find(|b| *b != "none" && !known.contains(b)) {
            bail!("--builtin {bad}: no such built-in tool (built-ins: {}, none)", known.join(", "));
        }
        tools.retain(|t| a.builtin.contains(&t.spec().name));
    }
    add_file_and_mcp_tools(&mut tools, &a.agent.tools, &a.agent.mcp)?;
    Ok(tools)
}

/// Adds the tools of `files` and starts the MCP servers they and `--mcp` name (once for the whole run
/// or eval), adding theirs: an MCP tool whose name is taken is offered as `<server>.<tool>`.
fn add_file_and_mcp_tools(tools: &mut Vec<Arc<dyn Tool>>, files: &[PathBuf], mcp: &[String]) -> Result<()> {
    let mut configs = Vec::new();
    for f in files {
        let contents = read_tools_file(f)?;
        tools.extend(contents.tools);
        configs.extend(contents.mcp);
    }
    for line in mcp {
        configs.push(McpConfig::from_command_line(line)?);
    }
    let mut servers = Vec::new();
    for c in &configs {
        let mut server = McpServer::spawn(c)?;
        // Servers that share a name (two of one package, or named alike by what they call themselves):
        // the later ones get a number.
        let base = server.name().to_string();
        for n in 2.. {
            if !servers.iter().any(|o: &McpServer| o.name() == server.name()) {
                break;
            }
            server.rename(format!("{base}{n}"));
        }
        eprintln!(
            "MCP server `{}`: {} tools, started in {:.2} s",
            server.name(),
            server.tools().len(),
            server.startup_time().as_secs_f64()
        );
        for (tool, why) in server.skipped() {
            eprintln!("warning: MCP server `{}`: tool `{tool}` left out: {why}", server.name());
        }
        servers.push(server);
    }
    let names: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
    let taken: Vec<&str> = names.iter().map(String::as_str).collect();
    tools.extend(mcp_tools_of(&servers, &taken));
    Ok(())
}

/// The agent configuration of `run`'s flags but the decision settings, which depend on the model.
pub(super) fn run_config(a: &RunOptions) -> Result<AgentConfig> {
    let tool_timeout =
        reagent::tools::timeout_from_secs(a.tool_timeout).map_err(|e| anyhow::anyhow!("--tool-timeout {e}"))?;
    let base = a.agent.config()?;
    let decision = base.decision.clone().max_string_chars(a.max_string_chars);
    let held = base.hold_untrusted_calls && !a.confirm;
    Ok(base
        .decision(decision)
        .max_decision_tokens(a.max_decision_tokens)
        .tool_timeout(tool_timeout)
        .hold_untrusted_calls(held))
}

/// `reagent eval`: each task's result line appended to `--out`, the summary printed (and written as JSON).
pub(super) fn eval(a: EvalArgs) -> Result<()> {
    let mut opts = eval_options(&a)?;
    let tasks = load_tasks(&a.tasks)?;
    for (field, line) in unknown_fields(&tasks) {
        eprintln!("warning: {}: unknown task field `{field}` (first on line {line}); ignored", a.tasks.display());
    }
    // Taken (and locked) before anything is read from it: a second eval on the same file is refused.
    let mut out = open_results(&a.out, &a.tasks, a.resume)?;
    let mut previous = if a.resume { finished_ids(&a.out)? } else { Vec::new() };
    let done: std::collections::HashSet<String> = previous.iter().map(|r| r.id.clone()).collect();
    let todo: Vec<_> = tasks.into_iter().filter(|t| !done.contains(&t.id)).collect();
    // `--limit` counts the whole eval, the tasks of the run being resumed included, so a resumed eval
    // ends where an uninterrupted one would.
    opts.limit = opts.limit.map(|l| l.saturating_sub(done.len()));
    // Loaded in dry runs too: a task's `tools` are offered (not run) under their own descriptions.
    let mut tools = builtin_tools(&BuiltinOptions::default().root(a.agent.root.clone()))?;
    add_file_and_mcp_tools(&mut tools, &a.agent.tools, &a.agent.mcp)?;
    if !done.is_empty() {
        eprintln!("resuming: {} tasks already in {}", done.len(), a.out.display());
    }
    let profile = if a.dry_run { Profile::SingleDecision } else { Profile::Run };
    if !a.remote.endpoint.is_empty() {
        return eval_remote(&a, opts, &todo, &tools, out, previous, profile);
    }
    let model = load(&a.model)?;
    // With batch invariance a prefix loaded or kept gives the same bits as one computed with the task:
    // the prompt cache and the KV cache across tasks change no result, only the time.
    let invariant = model.info().batch_invariant;
    let mut driver = match a.agent.no_grammar {
        true => ModelDriver::free_form(model, Sampling::Greedy, 0),
        false => ModelDriver::constrained(model, Sampling::Greedy, 0)?,
    };
    opts.reuse_across_tasks |= invariant;
    if invariant && !a.no_prompt_cache && super::prompt_cache_on() {
        driver = driver.with_prompt_cache(PromptCache::default_dir());
    }
    if a.agent.no_speculation {
        driver = driver.without_speculation();
    }
    let driver: Box<dyn Driver> = Box::new(driver);
    let entry = driver.catalog_entry();
    a.agent.decision.apply(&mut opts.agent, entry.as_ref(), profile, driver.supports_native())?;
    eprintln!("decisions: {}", super::args::describe_decisions(&opts.agent, driver.call_syntax().as_ref()));
    let progress = EvalProgress::new(&opts, todo.len());
    let (_, results) = run_eval(driver, &todo, &tools, &opts, &mut out, &mut |n, _| progress.done(n))?;
    progress.bar.finish_and_clear();
    previous.extend(results);
    eval_end(&a, &previous)
}

/// `reagent eval --endpoint URL…`: the tasks spread over the servers, `--concurrency` at once.
fn eval_remote(
    a: &EvalArgs,
    mut opts: EvalOptions,
    todo: &[reagent::eval::EvalTask],
    tools: &[Arc<dyn Tool>],
    mut out: BufWriter<File>,
    mut previous: Vec<reagent::eval::TaskResult>,
    profile: Profile,
) -> Result<()> {
    let endpoints = &a.remote.endpoint;
    let concurrency = a.concurrency.unwrap_or(endpoints.len());
    if !(1..=256).contains(&concurrency) {
        bail!("--concurrency: give 1 to 256 tasks at once");
    }
    let mut workers = Vec::with_capacity(concurrency);
    let mut first: Option<(String, RemoteConstraint)> = None;
    // One driver per endpoint (probed once under `--constraint auto`), cloned for each of its workers; an
    // endpoint that cannot be probed is left out, as one that fails mid-eval is.
    let mut drivers: Vec<Option<Option<reagent::agent::RemoteDriver>>> = vec![None; endpoints.len()];
    for i in 0..concurrency {
        let k = i % endpoints.len();
        let endpoint = &endpoints[k];
        if drivers[k].is_none() {
            drivers[k] = Some(match remote_driver(endpoint, &a.remote, a.model.model.as_deref()) {
                Ok((driver, id, constraint)) => {
                    if first.is_none() {
                        let entry = Driver::catalog_entry(&driver);
                        a.agent.decision.apply(&mut opts.agent, entry.as_ref(), profile, driver.supports_native())?;
                        let decisions = super::args::describe_decisions(&opts.agent, driver.call_syntax().as_ref());
                        eprintln!("decisions: {decisions}");
                        first = Some((id, constraint));
                    }
                    Some(driver)
                }
                Err(e) if matches!(e.downcast_ref::<reagent::Error>(), Some(reagent::Error::EndpointDown { .. })) => {
                    eprintln!("warning: {e}; the eval goes on without it");
                    None
                }
                Err(e) => return Err(e),
            });
        }
        if let Some(Some(driver)) = &drivers[k] {
            workers.push(reagent::eval::Worker { endpoint: endpoint.clone(), driver: Box::new(driver.clone()) });
        }
    }
    let Some((model_id, constraint)) = first else { bail!("no endpoint could be probed") };
    let more = match endpoints.len() {
        1 => String::new(),
        n => format!(" and {} more endpoints", n - 1),
    };
    eprintln!(
        "model: {model_id}{more}, {} tasks at once{}",
        workers.len(),
        unapplied_remotely(&opts.agent, constraint)
    );
    let progress = EvalProgress::new(&opts, todo.len());
    let failed_over = |endpoint: &str, task: &str, e: &reagent::Error| {
        progress
            .bar
            .suspend(|| eprintln!("warning: {endpoint} failed task `{task}` ({e}); it goes to another endpoint"))
    };
    let done = |n, _| progress.done(n);
    let results = reagent::eval::run_eval_spread(workers, todo, tools, &opts, &mut out, &done, &failed_over);
    progress.bar.finish_and_clear();
    previous.extend(results?);
    eval_end(a, &previous)
}

/// An eval's progress bar: tasks done of those it will run, and tasks per minute.
struct EvalProgress {
    bar: indicatif::ProgressBar,
    started: Instant,
}

impl EvalProgress {
    /// For `todo` tasks to run, or `opts.limit` of them.
    fn new(opts: &EvalOptions, todo: usize) -> Self {
        let bar = indicatif::ProgressBar::new(opts.limit.map_or(todo, |l| l.min(todo)) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("[{bar:30}] {pos}/{len} tasks, {msg}, ETA {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        Self { bar, started: Instant::now() }
    }

    fn done(&self, n: usize) {
        self.bar.set_position(n as u64);
        let per_minute = n as f64 * 60.0 / self.started.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!("{per_minute:.1} tasks/min"));
    }
}

/// The summary of every task in the results file, printed and written where --summary-json says.
fn eval_end(a: &EvalArgs, results: &[reagent::eval::TaskResult]) -> Result<()> {
    let s = Summary::of(results);
    display::eval_summary(&s);
    if let Some(p) = &a.summary_json {
        std::fs::write(p, serde_json::to_string_pretty(&s)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The result file: appended to when resuming, else truncated; never the task file itself.
fn open_results(out: &PathBuf, tasks: &Path, resume: bool) -> Result<BufWriter<File>> {
    if let (Ok(o), Ok(t)) = (out.canonicalize(), tasks.canonicalize()) {
        if o == t {
            bail!("--out {} is the task file; the results would overwrite the tasks", out.display());
        }
    }
    // Not truncated before the lock is held: that would clobber another eval's results.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .with_context(|| format!("opening {}", out.display()))?;
    lock_exclusive(&file, "another eval is writing this file").with_context(|| format!("--out {}", out.display()))?;
    if !resume {
        file.set_len(0).with_context(|| format!("emptying {}", out.display()))?;
    }
    Ok(BufWriter::new(file))
}

/// An exclusive advisory lock on `file`, held until it is closed; refused at once when another process
/// holds one (two evals appending to one file would interleave their lines).
fn lock_exclusive(file: &File, held: &str) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock(2) on a descriptor this File owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                bail!("{held}");
            }
            return Err(e.into());
        }
    }
    #[cfg(not(unix))]
    let _ = file;
    Ok(())
}

/// The trace at `path` (made, empty, when `create` and absent), opened and locked before it is read or
/// written ([`lock_exclusive`]; `held`: the error where another process holds it).
fn lock_trace(path: &Path, create: bool, held: &str) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(create)
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    lock_exclusive(&file, held).with_context(|| format!("{}", path.display()))?;
    Ok(file)
}

/// The eval options of `eval`'s flags but the decision settings, which depend on the model.
fn eval_options(a: &EvalArgs) -> Result<EvalOptions> {
    Ok(EvalOptions::default()
        .dry_run(a.dry_run)
        .limit(a.limit)
        .reuse_across_tasks(a.reuse_across_tasks)
        .events(a.trace.as_deref().map(EventLog::create).transpose()?)
        .agent(a.agent.config()?))
}
