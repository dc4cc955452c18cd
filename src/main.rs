//! `reagent`: a thin command line over the library. Parses flags, calls the library, prints errors with
//! their causes and maps outcomes to exit codes (0 ok, 1 the task ran but did not succeed, 2 usage or
//! I/O errors).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::{ChatMessage, GenerateParams, Grammar, GrammarEngine, LanguageModel, LoadOptions, Model, Sampling};

#[derive(Parser)]
#[command(name = "reagent", version, about = "A local-model agent with in-process GGUF inference")]
struct Cli {
    /// Worker threads for the tensor kernels (default: physical cores).
    #[arg(long, global = true, env = "REAGENT_THREADS")]
    threads: Option<usize>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List, fetch or locate catalog models.
    Models {
        #[command(subcommand)]
        cmd: ModelsCmd,
    },
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Generate text from a prompt, streaming it to stdout (statistics go to stderr).
    Generate(GenerateArgs),
    /// Measure prefill and decode throughput.
    Bench(BenchArgs),
    /// Run an agent task: decisions under the tool grammar, tool calls, observations, a final answer.
    Run(RunArgs),
    /// Run a JSONL task file and score the tool calls.
    Eval(EvalArgs),
}

#[derive(Args)]
struct EvalArgs {
    /// The task file (JSONL).
    tasks: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// Where the result lines go (appended to with --resume).
    #[arg(long)]
    out: PathBuf,
    /// Record the calls of each task's first decision without executing anything.
    #[arg(long)]
    dry_run: bool,
    /// Run at most N tasks.
    #[arg(long)]
    limit: Option<usize>,
    /// Skip the tasks whose ids are already in --out.
    #[arg(long)]
    resume: bool,
    /// auto, required, none, or a tool name.
    #[arg(long, default_value = "auto")]
    tool_choice: String,
    /// Allow up to N tool calls in one decision.
    #[arg(long)]
    parallel_calls: Option<usize>,
    /// Free-form generation with the JSON extracted from the text, instead of the decision grammar.
    #[arg(long)]
    no_grammar: bool,
    #[arg(long, default_value_t = 8)]
    max_steps: usize,
    #[arg(long, default_value_t = 2)]
    max_retries: usize,
    /// Write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    #[command(flatten)]
    decision: DecisionArgs,
    /// Tools file(s) implementing task functions (without --dry-run).
    #[arg(long, value_name = "FILE")]
    tools: Vec<PathBuf>,
    /// Root of the built-in file tools (without --dry-run).
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Under `--tool-choice auto`, the first decision must call a tool, and so must the decision after a
    /// failed call (as in `reagent run` without --allow-direct-answer).
    #[arg(long)]
    first_call: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The task.
    task: String,
    #[command(flatten)]
    model: ModelArgs,
    /// A tools file (TOML or JSON) mapping tools to external programs (repeatable).
    #[arg(long, value_name = "FILE")]
    tools: Vec<PathBuf>,
    /// The directory read_file / list_dir / write_file are confined to.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Offer the write_file tool.
    #[arg(long)]
    allow_write: bool,
    /// Let read_file read files that have other hard links (which may lie outside --root).
    #[arg(long)]
    read_hard_links: bool,
    /// Offer only these built-in tools (repeatable; default: calculator, current_time, read_file, list_dir,
    /// and write_file with --allow-write). `--builtin none` offers none.
    #[arg(long, value_name = "NAME")]
    builtin: Vec<String>,
    /// auto, required, none, or a tool name.
    #[arg(long, default_value = "auto")]
    tool_choice: String,
    #[arg(long, default_value_t = 8)]
    max_steps: usize,
    #[arg(long, default_value_t = 2)]
    max_retries: usize,
    /// Allow up to N tool calls in one decision.
    #[arg(long)]
    parallel_calls: Option<usize>,
    /// Free-form generation with the JSON extracted from the text, instead of the decision grammar.
    #[arg(long)]
    no_grammar: bool,
    /// Ask before each tool call.
    #[arg(long)]
    confirm: bool,
    #[command(flatten)]
    decision: DecisionArgs,
    /// Print the events as JSON lines instead of the readable display.
    #[arg(long)]
    json: bool,
    /// Write every event and the final transcript to this file as JSON lines.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Token limit of one decision.
    #[arg(long, default_value_t = 512)]
    max_decision_tokens: usize,
    /// Maximum characters of a decision's thought (small models ramble).
    #[arg(long, default_value_t = 200)]
    max_thought_chars: usize,
    /// Maximum characters of the answer and of string arguments without their own maxLength.
    #[arg(long, default_value_t = 1000)]
    max_string_chars: usize,
    /// Tool call timeout in seconds.
    #[arg(long, default_value_t = 30.0)]
    tool_timeout: f64,
    /// Let the first decision, and the one after a failed call, answer directly; by default, under `auto`,
    /// they must call a tool (small models otherwise answer from memory what a tool would get right, and
    /// answer with an error instead of fixing the call).
    #[arg(long)]
    allow_direct_answer: bool,
    /// Recompute the whole prompt at every step instead of reusing the KV cache (for measurements).
    #[arg(long)]
    no_prefix_reuse: bool,
}

#[derive(Subcommand)]
enum ModelsCmd {
    /// Name, size, architecture and whether each catalog model is in the local cache.
    List,
    /// Download a catalog model into the local cache (verifying size and sha256).
    Fetch { name: String },
    /// Print the local path of a model, fetching it first when absent.
    Path {
        name: String,
        /// Fail instead of fetching when the model is not present.
        #[arg(long)]
        no_fetch: bool,
    },
}

#[derive(Args)]
struct DecisionArgs {
    /// Decision format: react (reagent's JSON object, any model), native (the model's own tool-call
    /// syntax, for templates that render tools: Qwen 2.5), or auto (the catalog's choice for the model and
    /// for single or multi-step runs, else native where the template supports it).
    #[arg(long, default_value = "auto")]
    format: String,
    /// Logit bias for calling a tool over answering, where a native decision starts (default: the
    /// catalog's value for the model, else 0).
    #[arg(long, allow_negative_numbers = true)]
    call_bias: Option<f32>,
    /// Logit bias for one more call over ending a native decision after a call (default: the catalog's
    /// value for the model, else 0).
    #[arg(long, allow_negative_numbers = true)]
    more_calls_bias: Option<f32>,
    /// Logit bias for closing an object or array of arguments over adding an optional argument or item,
    /// in a native decision (default: the catalog's value for the model, else 0).
    #[arg(long, allow_negative_numbers = true)]
    close_bias: Option<f32>,
    /// Under `--tool-choice auto`, turn a first decision into an answer when less than this share of its
    /// first call's argument values are words of the user's messages: the model called a tool that does
    /// not fit (default: the catalog's value for the model, else never; 0 disables).
    #[arg(long)]
    abstain_below: Option<f32>,
}

/// What [`DecisionArgs::resolve`] settles.
struct DecisionSettings {
    format: reagent::agent::DecisionFormat,
    biases: reagent::agent::BranchBiases,
    abstain_below: Option<f32>,
}

impl DecisionArgs {
    /// The format and biases for `model` (a catalog name or a path), what its driver supports, and whether
    /// the run goes on after the first decision (`reagent run`: the catalog's `run_format` applies).
    fn resolve(&self, model: &ModelArgs, supports_native: bool, multi_step: bool) -> Result<DecisionSettings> {
        use reagent::agent::DecisionFormat;
        let cat = Catalog::builtin();
        let name = model.model.clone().unwrap_or_else(|| cat.default.clone());
        let defaults = cat.get(&name).map(|e| e.decision.clone()).unwrap_or_default();
        let catalog_format = match multi_step {
            true => defaults.run_format.as_deref().or(defaults.format.as_deref()),
            false => defaults.format.as_deref(),
        };
        let format = match (self.format.as_str(), catalog_format) {
            ("auto", Some(f)) => f.parse()?,
            ("auto", None) if supports_native => DecisionFormat::Native,
            ("auto", None) => DecisionFormat::React,
            (f, _) => f.parse()?,
        };
        let format = match format {
            DecisionFormat::Native if !supports_native && self.format == "auto" => DecisionFormat::React,
            f => f,
        };
        let biases = reagent::agent::BranchBiases {
            call: self.call_bias.unwrap_or(defaults.call_bias),
            more_calls: self.more_calls_bias.unwrap_or(defaults.more_calls_bias),
            close: self.close_bias.unwrap_or(defaults.close_bias),
        };
        let abstain_below = match self.abstain_below.or(defaults.abstain_below) {
            Some(g) if !(0.0..=1.0).contains(&g) => bail!("--abstain-below must be between 0 and 1, not {g}"),
            g => g.filter(|&g| g > 0.0),
        };
        Ok(DecisionSettings { format, biases, abstain_below })
    }
}

#[derive(Args)]
struct ModelArgs {
    /// A catalog name (see `reagent models list`) or a path to a GGUF file.
    #[arg(long, short = 'm')]
    model: Option<String>,
    /// Use this tokenizer.json instead of the tokenizer in the GGUF file.
    #[arg(long)]
    tokenizer_json: Option<PathBuf>,
    /// Cap on the context window (tokens).
    #[arg(long)]
    context: Option<usize>,
}

#[derive(Args)]
struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to tokenize.
    #[arg(long)]
    text: String,
    /// Parse control tokens such as `<|im_start|>` into their ids.
    #[arg(long)]
    special: bool,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (raw text, or the user message with --chat).
    #[arg(long, short = 'p')]
    prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Print the rendered prompt to stderr before generating.
    #[arg(long)]
    show_prompt: bool,
    /// Constrain the output to this JSON schema (a file).
    #[arg(long, group = "grammar", value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar (llguidance dialect; a file).
    #[arg(long, group = "grammar", value_name = "FILE")]
    lark: Option<PathBuf>,
    /// Constrain the whole output to match this regular expression.
    #[arg(long, group = "grammar", value_name = "RE")]
    regex: Option<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure a decision-shaped generation under the decision grammar against the same one unconstrained.
    #[arg(long)]
    constrained: bool,
}

/// `println!` that returns the write's error (a closed pipe: a quiet exit 0; a full disk: an `error:` line).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// Ends the process for a failed write to stdout outside a `Result` (an event sink): quietly for a closed
/// pipe, else with the error.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(2);
}

/// Ctrl-C and SIGTERM ask the run to stop cleanly (`reagent::limits::request_interrupt`: generation
/// ends, a tool's process group is killed, the trace gets the transcript, an eval stops before its next
/// task); a second one ends the process at once. Exit code 130 after an interrupt.
fn stop_on_signals() {
    #[cfg(unix)]
    {
        extern "C" fn on_signal(_: libc::c_int) {
            if reagent::limits::interrupted() {
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(130) };
            }
            reagent::limits::request_interrupt();
        }
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only touches an atomic and calls _exit, both async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    }
}

/// The exit code of a command that an interrupt cut short.
const INTERRUPTED_EXIT: u8 = 130;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        if n == 0 {
            eprintln!("error: --threads must be at least 1");
            return ExitCode::from(2);
        }
        // candle sizes its worker pools from these variables on first use; nothing has run yet.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    } else if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Without the variable, candle counts the physical cores by reading /proc/cpuinfo at every f32
        // matmul (twice per layer in a decode step's attention): 5% of a SmolLM2 decode. Count them once.
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn run(cli: Cli) -> Result<ExitCode> {
    let threads = cli.threads.unwrap_or_else(candle_core::utils::get_num_threads);
    match cli.cmd {
        Cmd::Models { cmd } => models(cmd)?,
        Cmd::Tokenize(a) => {
            let model = load(&a.model)?;
            let ids = model.tokenizer().encode(&a.text, a.special)?;
            out!("{}", serde_json::to_string(&ids)?);
        }
        Cmd::Generate(a) => generate(a)?,
        Cmd::Run(a) => {
            stop_on_signals();
            return run_agent(a);
        }
        Cmd::Eval(a) => {
            stop_on_signals();
            eval(a)?;
            if reagent::limits::interrupted() {
                return Ok(ExitCode::from(INTERRUPTED_EXIT));
            }
        }
        Cmd::Bench(a) => {
            let mut model = load(&a.model)?;
            let params =
                reagent::bench::BenchParams { prompt_tokens: a.prompt_tokens, gen_tokens: a.gen_tokens, runs: a.runs };
            if a.constrained {
                let r = reagent::bench::run_constrained(&mut model, &params, threads)?;
                if a.json {
                    out!("{}", serde_json::to_string(&r)?);
                } else {
                    out!("model             {} ({} threads)", r.model, r.threads);
                    out!("unconstrained     {:.1} tok/s ({} tokens)", r.free_decode_tok_s_median, r.free_tokens);
                    out!(
                        "constrained       {:.1} tok/s ({} tokens, {} forced = {:.0}%), ratio {:.2}",
                        r.constrained_decode_tok_s_median,
                        r.constrained_tokens,
                        r.forced_tokens,
                        r.forced_share * 100.0,
                        r.ratio
                    );
                    out!(
                        "mask              mean {:.0} µs, p50 {:.0} µs, p99 {:.0} µs",
                        r.mask_mean_us,
                        r.mask_p50_us,
                        r.mask_p99_us
                    );
                    out!(
                        "grammar setup     engine {:.2} s once per model; 20-tool decision grammar {:.1} ms",
                        r.engine_build_s,
                        r.grammar_20_tools_ms
                    );
                    out!("output            {}", r.sample_output);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let r = reagent::bench::run(&mut model, &params, threads)?;
            if a.json {
                out!("{}", serde_json::to_string(&r)?);
            } else {
                out!("model        {} ({} threads)", r.model, r.threads);
                out!("kernels      {} (decode), {} (prefill)", r.kernels, r.prefill_kernel);
                out!("load         {:.2} s", r.load_s);
                out!("prefill      {:.1} tok/s  ({} tokens, runs {:?})", r.pp_tok_s_median, r.pp_tokens, r.pp_tok_s);
                out!(
                    "decode       {:.1} tok/s  ({} tokens, runs {:?})",
                    r.decode_tok_s_median,
                    r.decode_tokens,
                    r.decode_tok_s
                );
                if let Some(rss) = r.peak_rss_mb {
                    out!("peak RSS     {rss:.0} MiB");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn models(cmd: ModelsCmd) -> Result<()> {
    let cat = Catalog::builtin();
    let opts = FetchOptions::default();
    match cmd {
        ModelsCmd::List => {
            out!("{:<22} {:>9}  {:<7} {:<8} description", "name", "size", "arch", "present");
            for m in &cat.models {
                let present = catalog::locate(m, &opts).is_some();
                let default = if m.name == cat.default { " (default)" } else { "" };
                out!(
                    "{:<22} {:>6} MB  {:<7} {:<8} {}{default}",
                    m.name,
                    m.bytes / 1_000_000,
                    m.arch,
                    if present { "yes" } else { "no" },
                    m.description
                );
            }
            out!("cache: {}", opts.cache_dir.display());
        }
        ModelsCmd::Fetch { name } => {
            let entry = cat.get(&name).ok_or_else(|| reagent::Error::UnknownModel {
                name: name.clone(),
                known: cat.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            })?;
            let path = catalog::fetch_model(entry, &opts)?;
            out!("{}", path.display());
        }
        ModelsCmd::Path { name, no_fetch } => {
            let path = catalog::resolve(&cat, &name, !no_fetch, &opts)?;
            out!("{}", path.display());
        }
    }
    Ok(())
}

fn load(a: &ModelArgs) -> Result<Model> {
    let cat = Catalog::builtin();
    let name = a.model.clone().unwrap_or_else(|| cat.default.clone());
    let path = catalog::resolve(&cat, &name, true, &FetchOptions::default())?;
    let opts =
        LoadOptions { max_context: a.context, tokenizer_json: a.tokenizer_json.clone(), ..LoadOptions::default() };
    Ok(Model::load(&path, &opts)?)
}

fn generate(a: GenerateArgs) -> Result<()> {
    if a.system.is_some() && !a.chat {
        bail!("--system needs --chat");
    }
    let sampling = Sampling::from_params(a.temperature, a.top_k, a.top_p)?;
    let read = |p: &PathBuf| reagent::limits::read_input(p, reagent::limits::MAX_INPUT_BYTES);
    let grammar = if let Some(p) = &a.json_schema {
        let schema = serde_json::from_str(&read(p)?).with_context(|| format!("{}: not valid JSON", p.display()))?;
        Some(Grammar::JsonSchema(schema))
    } else if let Some(p) = &a.lark {
        Some(Grammar::Lark(read(p)?))
    } else {
        a.regex.clone().map(Grammar::Regex)
    };
    let mut model = load(&a.model)?;
    let tok = model.tokenizer().clone();
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::system(s.clone()));
        }
        msgs.push(ChatMessage::user(a.prompt.clone()));
        let text = model.chat_template().render(&msgs, true, None)?;
        if a.show_prompt {
            eprintln!("{text}");
        }
        tok.encode(&text, true)?
    } else {
        let mut ids: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { Vec::new() };
        ids.extend(tok.encode(&a.prompt, false)?);
        ids
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampling,
        seed: a.seed,
        stop_strings: a.stop.clone(),
        ignore_eos: false,
    };
    let stops = model.stop_tokens().to_vec();
    // Compile the grammar before generating anything, so a bad grammar fails fast and cleanly.
    let mut constraint = match &grammar {
        Some(g) => Some(GrammarEngine::new(tok.clone(), model.vocab_size(), &stops)?.constraint(g)?),
        None => None,
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let out = reagent::generate_with(&mut model, &tok, &stops, &prompt, &params, constraint.as_mut(), &mut |t| {
        if write_err.is_none() {
            if let Err(e) = stdout.write_all(t.as_bytes()).and_then(|_| stdout.flush()) {
                write_err = Some(e);
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    writeln!(stdout)?;
    let s = &out.stats;
    eprintln!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s); {} generated in {:.2} s ({:.1} tok/s); stop: {}]",
        s.prompt_tokens,
        s.prefill_time.as_secs_f64(),
        s.prefill_tok_s(),
        s.generated_tokens,
        s.decode_time.as_secs_f64(),
        s.decode_tok_s(),
        serde_json::to_string(&out.stop)?
    );
    if let Some(c) = &constraint {
        let st = c.stats();
        let (mean, p50, p99) = st.mask_summary();
        eprintln!(
            "[grammar: {} forced tokens ({:.0}%), {} sampled; mask mean {:?}, p50 {:?}, p99 {:?}; complete: {}]",
            st.forced_tokens,
            st.forced_share() * 100.0,
            st.sampled_tokens,
            mean,
            p50,
            p99,
            matches!(out.stop, reagent::StopReason::GrammarComplete) || c.is_finished()
        );
    }
    Ok(())
}

/// Asks on the terminal before each call.
struct Confirm;

impl reagent::tools::Interceptor for Confirm {
    fn before(&mut self, call: &mut reagent::ToolCall) -> reagent::tools::InterceptorAction {
        eprint!("run {} {}? [y/N] ", call.tool, call.args);
        let mut line = String::new();
        let yes = std::io::stdin().read_line(&mut line).is_ok() && line.trim().eq_ignore_ascii_case("y");
        if yes {
            reagent::tools::InterceptorAction::Continue
        } else {
            reagent::tools::InterceptorAction::Block("the user declined this call".into())
        }
    }
}

/// The readable display of a run's events (colour on a terminal).
fn show_event(e: &reagent::agent::AgentEvent, colour: bool) {
    use reagent::agent::AgentEvent::*;
    let paint = |code: &str, s: String| if colour { format!("\x1b[{code}m{s}\x1b[0m") } else { s };
    let line = match e {
        RunStarted { tools, driver, .. } => paint("2", format!("[{driver} decisions; tools: {}]", tools.join(", "))),
        StepStarted { .. } => return,
        DecisionExtracted { step, decision, stats } => {
            // Native decisions have no thought: the line then only numbers the step.
            let mut s = match decision.thought() {
                "" => paint("36", format!("{step}.")),
                t => paint("36", format!("{step}. thought: {t}")),
            };
            s.push_str(&paint(
                "2",
                format!(
                    "  [{} tokens, {} forced; prompt {} ({} reused); {:.1} s]",
                    stats.generated_tokens,
                    stats.forced_tokens,
                    stats.prompt_tokens,
                    stats.reused_tokens,
                    stats.seconds
                ),
            ));
            s
        }
        ExtractionFailed { step, attempt, error, .. } => {
            paint("33", format!("{step}. attempt {attempt}: no decision: {error}"))
        }
        ValidationFailed { step, attempt, error, .. } => {
            paint("33", format!("{step}. attempt {attempt}: rejected: {error}"))
        }
        ToolCallStarted { call, .. } => paint("35", format!("   → {} {}", call.tool, call.args)),
        ToolCallCompleted { outcome, seconds, .. } => {
            let obs = outcome.observation();
            let short: String = obs.chars().take(400).collect();
            let more = if short.len() < obs.len() { " …" } else { "" };
            paint("2", format!("   ← {short}{more} ({seconds:.2} s)"))
        }
        ToolCallBlocked { call, reason, .. } => paint("33", format!("   ✗ {} blocked: {reason}", call.tool)),
        CallsDropped { calls, grounding, .. } => {
            let names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
            let share = (grounding * 100.0).round();
            paint("33", format!("   ✗ {} dropped: {share}% of its values are the user's words", names.join(", ")))
        }
        FinalAnswer { answer, .. } => paint("1;32", format!("answer: {answer}")),
        RunFailed { reason } => paint("31", format!("stopped: {reason}")),
    };
    eprintln!("{line}");
}

fn run_agent(a: RunArgs) -> Result<ExitCode> {
    use reagent::agent::{Agent, AgentConfig, AgentEvent, ModelDriver};
    use reagent::tools::{builtin_tools, load_tools_file, BuiltinOptions};
    use std::io::IsTerminal;

    let sampling = Sampling::from_params(a.temperature, None, None)?;
    let tool_choice: reagent::ToolChoice = a.tool_choice.parse()?;
    let tool_timeout =
        reagent::tools::timeout_from_secs(a.tool_timeout).map_err(|e| anyhow::anyhow!("--tool-timeout {e}"))?;
    let mut tools = builtin_tools(&BuiltinOptions {
        root: a.root.clone(),
        allow_write: a.allow_write,
        read_hard_links: a.read_hard_links,
        ..Default::default()
    })?;
    if !a.builtin.is_empty() {
        let known: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
        if let Some(bad) = a.builtin.iter().find(|b| *b != "none" && !known.contains(b)) {
            bail!("--builtin {bad}: no such built-in tool (built-ins: {}, none)", known.join(", "));
        }
        tools.retain(|t| a.builtin.contains(&t.spec().name));
    }
    for f in &a.tools {
        tools.extend(load_tools_file(f)?);
    }
    let mut trace = match &a.trace {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    // The transcript is appended after the run through a second handle on the same file.
    let mut trace_end = match &trace {
        Some(t) => Some(t.get_ref().try_clone().context("opening the trace")?),
        None => None,
    };
    let model = load(&a.model)?;
    let mut driver = if a.no_grammar {
        ModelDriver::free_form(model, sampling, a.seed)
    } else {
        ModelDriver::constrained(model, sampling, a.seed)?
    };
    if a.no_prefix_reuse {
        driver = driver.without_prefix_reuse();
    }
    let DecisionSettings { format, biases: branch_biases, abstain_below } =
        a.decision.resolve(&a.model, reagent::agent::Driver::supports_native(&driver), true)?;
    let config = AgentConfig {
        tool_choice,
        max_steps: a.max_steps,
        max_retries: a.max_retries,
        decision: reagent::DecisionOptions {
            parallel_calls: a.parallel_calls,
            max_thought_chars: a.max_thought_chars,
            max_string_chars: a.max_string_chars,
            ..Default::default()
        },
        max_decision_tokens: a.max_decision_tokens,
        tool_timeout,
        // Small models answer from memory what a tool would get right, so the CLI's first decision calls.
        // The native call bias is calibrated on BFCL, where abstaining is often right; on a question about
        // a file the default model's call margin is -1.4 (it answers "Alibaba Cloud"), so it does not
        // replace this policy yet.
        first_decision_calls: !a.allow_direct_answer,
        call_after_error: !a.allow_direct_answer,
        format,
        branch_biases,
        abstain_below,
        ..AgentConfig::default()
    };
    let (json, colour) = (a.json, std::io::stderr().is_terminal());
    let mut builder = Agent::builder().driver(driver).tools(tools).config(config).events(move |e: &AgentEvent| {
        let line = serde_json::to_string(e).unwrap_or_default();
        // The trace gets every event as it happens, flushed, so an interrupted run keeps what it did.
        if let Some(t) = &mut trace {
            if let Err(err) = writeln!(t, "{line}").and_then(|_| t.flush()) {
                eprintln!("error: writing the trace: {err}");
                std::process::exit(2);
            }
        }
        if json {
            use std::io::Write as _;
            writeln!(std::io::stdout().lock(), "{line}").unwrap_or_else(|e| stdout_failed(e));
        } else {
            show_event(e, colour);
        }
    });
    if a.confirm {
        builder = builder.interceptor(Confirm);
    }
    let mut agent = builder.build()?;
    let transcript = agent.run(&a.task)?;
    drop(agent); // the sink, and with it the trace file, is handed back
    if let Some(t) = &mut trace_end {
        writeln!(t, "{}", serde_json::to_string(&serde_json::json!({ "transcript": transcript }))?)?;
        t.flush()?;
    }
    if !json {
        if let Some(answer) = &transcript.final_answer {
            out!("{answer}");
        }
    }
    Ok(match (&transcript.stop_reason, &transcript.final_answer) {
        (reagent::agent::StopReason::Interrupted, _) => ExitCode::from(INTERRUPTED_EXIT),
        (_, Some(_)) => ExitCode::SUCCESS,
        (_, None) => ExitCode::from(1),
    })
}

fn eval(a: EvalArgs) -> Result<()> {
    use reagent::agent::{AgentConfig, Driver, ModelDriver};
    use reagent::eval::{finished_ids, load_tasks, run_eval, unknown_fields, EvalOptions, Summary};
    use reagent::tools::{builtin_tools, load_tools_file, BuiltinOptions};

    let tool_choice: reagent::ToolChoice = a.tool_choice.parse()?;
    let tasks = load_tasks(&a.tasks)?;
    for (field, line) in unknown_fields(&tasks) {
        eprintln!("warning: {}: unknown task field `{field}` (first on line {line}); ignored", a.tasks.display());
    }
    let mut previous = if a.resume { finished_ids(&a.out)? } else { Vec::new() };
    let done: std::collections::HashSet<String> = previous.iter().map(|r| r.id.clone()).collect();
    let todo: Vec<_> = tasks.into_iter().filter(|t| !done.contains(&t.id)).collect();
    // Loaded in dry runs too: a task's `tools` are offered (not run) under their own descriptions.
    let mut tools = builtin_tools(&BuiltinOptions { root: a.root.clone(), ..Default::default() })?;
    for f in &a.tools {
        tools.extend(load_tools_file(f)?);
    }
    // Writing the results over the tasks would lose the tasks.
    if let (Ok(a_out), Ok(a_in)) = (a.out.canonicalize(), a.tasks.canonicalize()) {
        if a_out == a_in {
            bail!("--out {} is the task file; the results would overwrite the tasks", a.out.display());
        }
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(a.resume)
        .write(true)
        .truncate(!a.resume)
        .open(&a.out)
        .with_context(|| format!("opening {}", a.out.display()))?;
    let mut out = std::io::BufWriter::new(out);
    let model = load(&a.model)?;
    let driver: Box<dyn Driver> = if a.no_grammar {
        Box::new(ModelDriver::free_form(model, Sampling::Greedy, 0))
    } else {
        Box::new(ModelDriver::constrained(model, Sampling::Greedy, 0)?)
    };
    let DecisionSettings { format, biases: branch_biases, abstain_below } =
        a.decision.resolve(&a.model, driver.supports_native(), !a.dry_run)?;
    eprintln!(
        "decisions: {format} format, call bias {}, more-calls bias {}, close bias {}, abstain below {}",
        branch_biases.call,
        branch_biases.more_calls,
        branch_biases.close,
        abstain_below.map_or("never".to_string(), |g| g.to_string())
    );
    let opts = EvalOptions {
        dry_run: a.dry_run,
        limit: a.limit,
        agent: AgentConfig {
            tool_choice,
            max_steps: a.max_steps,
            max_retries: a.max_retries,
            decision: reagent::DecisionOptions { parallel_calls: a.parallel_calls, ..Default::default() },
            format,
            branch_biases,
            abstain_below,
            first_decision_calls: a.first_call,
            call_after_error: a.first_call,
            ..AgentConfig::default()
        },
    };
    let total = opts.limit.map_or(todo.len(), |l| l.min(todo.len()));
    let pb = indicatif::ProgressBar::new(total as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("[{bar:30}] {pos}/{len} tasks, {msg}, ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    if !done.is_empty() {
        eprintln!("resuming: {} tasks already in {}", done.len(), a.out.display());
    }
    let t0 = std::time::Instant::now();
    let (_, results) = run_eval(driver, &todo, &tools, &opts, &mut out, &mut |n, _| {
        pb.set_position(n as u64);
        pb.set_message(format!("{:.1} tasks/min", n as f64 * 60.0 / t0.elapsed().as_secs_f64().max(1e-9)));
    })?;
    pb.finish_and_clear();
    previous.extend(results);
    let s = Summary::of(&previous);
    eprintln!(
        "{} tasks: {} valid on the first try ({:.0}%), {} retries; {} in {:.2} s/task, {:.1} tok/s",
        s.tasks,
        s.valid_first_try,
        100.0 * s.valid_first_try as f64 / s.tasks.max(1) as f64,
        s.retries,
        match s.accuracy {
            Some(acc) => format!("exact match {}/{} ({:.0}%)", s.correct, s.scored, acc * 100.0),
            None => "no expected answers".into(),
        },
        s.mean_seconds,
        s.tok_s
    );
    for (name, c) in &s.categories {
        let acc = c
            .accuracy
            .map_or(String::new(), |x| format!(", exact match {}/{} ({:.0}%)", c.correct, c.scored, x * 100.0));
        eprintln!("  {name}: {} tasks, {} with calls{acc}", c.tasks, c.with_calls);
    }
    if let Some(p) = &a.summary_json {
        std::fs::write(p, serde_json::to_string_pretty(&s)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
