//! Command-line flags: one `Args` struct per subcommand, and the decision settings they resolve to.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "reagent", version, about = "A local-model agent with in-process GGUF inference")]
pub(crate) struct Cli {
    /// Worker threads for the tensor kernels (default: physical cores).
    #[arg(long, global = true, env = "REAGENT_THREADS")]
    pub(crate) threads: Option<usize>,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// A conversation with the agent: each line is a turn, with the earlier turns, calls and results kept
    /// (in the KV cache too). /help lists the commands.
    Chat(ChatArgs),
    /// Run a JSONL task file and score the tool calls.
    Eval(EvalArgs),
    /// Serve the model over the OpenAI chat-completions API (tool calls made under the grammar).
    Serve(ServeArgs),
    /// List or clear the prompt cache (saved KV of system prompts, loaded by later runs).
    Cache {
        #[command(subcommand)]
        cmd: CacheCmd,
    },
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The address to listen on; other than loopback it needs --api-key or --insecure-no-auth.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Requests must send `Authorization: Bearer KEY`.
    #[arg(long, env = "REAGENT_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Listen on a non-loopback address without an API key.
    #[arg(long)]
    pub(crate) insecure_no_auth: bool,
    /// Requests that may wait for the model; more are answered 429.
    #[arg(long, default_value_t = 16)]
    pub(crate) queue: usize,
    /// Largest request body, in MiB.
    #[arg(long, default_value_t = 4)]
    pub(crate) max_body_mib: usize,
    /// Most tools one request may carry.
    #[arg(long, default_value_t = 128)]
    pub(crate) max_tools: usize,
    /// Seconds a client may take to send a request's head or body, or to take the next part of an
    /// answer, and that an idle connection stays open.
    #[arg(long, default_value_t = 30.0, value_name = "SECS", help_heading = ADVANCED)]
    pub(crate) client_timeout: f64,
    /// Connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = 512, help_heading = ADVANCED)]
    pub(crate) max_connections: usize,
    /// No line on stderr per request served (its tokens, how it ended, its time; never its content).
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Make tool calls with the single-decision settings (BFCL-shaped requests) instead of a run's.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) single_decision: bool,
    /// Calls one decision may make when a request allows parallel calls (default: one).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) parallel_calls: Option<usize>,
    /// Neither load tool-call prompts' KV from the prompt cache nor save it there
    /// (`REAGENT_PROMPT_CACHE=0` too).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_prompt_cache: bool,
    /// Models whose template thinks (Qwen 3, SmolLM 3): up to N tokens of free thinking before each tool
    /// decision, returned as `reasoning_content` (default: the catalog's, else 0).
    #[arg(long, value_name = "N")]
    pub(crate) think_budget: Option<usize>,
}

#[derive(Subcommand)]
pub(crate) enum CacheCmd {
    /// Each saved prompt: its file, size, tokens and model key.
    List,
    /// Remove every saved prompt.
    Clear,
}

#[derive(Args)]
pub(crate) struct EvalArgs {
    /// The task file (JSONL).
    pub(crate) tasks: PathBuf,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Where the result lines go (appended to with --resume).
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Record the calls of each task's first decision without executing anything.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Run at most N tasks.
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Skip the tasks whose ids are already in --out.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) summary_json: Option<PathBuf>,
    /// Write every task's agent events to this file as JSON lines ({"task": ID, "event": …}), as they
    /// happen: the decisions, dropped and proposed calls, retries.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Keep the KV cache from task to task where the model is not batch invariant (faster where tasks
    /// share a prompt prefix, but a task's result then depends on the task before it, and a resumed eval
    /// may differ from an uninterrupted one). A batch-invariant model always keeps it: no result changes.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) reuse_across_tasks: bool,
    /// Neither load the system prompt's KV from the prompt cache nor save it there
    /// (`REAGENT_PROMPT_CACHE=0` too). The cache is used only where the model is batch invariant
    /// (`REAGENT_BATCH_INVARIANT`), so that no result depends on it.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_prompt_cache: bool,
    /// Tasks run at once, spread over the --endpoint servers in turn (default: one per endpoint).
    #[arg(long, value_name = "N", requires = "endpoint", help_heading = "Remote model")]
    pub(crate) concurrency: Option<usize>,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
    #[command(flatten)]
    pub(crate) agent: AgentArgs,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    /// The task (with --resume: the trace's task when left out).
    #[arg(required_unless_present = "resume")]
    pub(crate) task: Option<String>,
    /// Go on with the run a --trace file recorded (killed, interrupted): its decisions and tool results
    /// are replayed, not made or run again, and the trace is appended to. A call that started without a
    /// recorded result runs again only when its tool is read-only.
    #[arg(long, value_name = "TRACE", conflicts_with = "trace")]
    pub(crate) resume: Option<PathBuf>,
    /// Resume although the trace's task, model, tools or decision settings differ from this run's.
    #[arg(long, requires = "resume")]
    pub(crate) resume_anyway: bool,
    /// Print the events as JSON lines instead of the readable display.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write every event and the final transcript to this file as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
    #[command(flatten)]
    pub(crate) opts: RunOptions,
}

/// A model on an OpenAI-compatible server instead of one in this process.
#[derive(Args)]
pub(crate) struct RemoteArgs {
    /// Make the decisions on this OpenAI-compatible server (its API base, `http://host:8080/v1`: vLLM,
    /// SGLang, llama.cpp's server, `reagent serve`); the tools still run here. `eval` takes it more than
    /// once: the tasks are spread over the servers, and a task whose server fails goes to another.
    #[arg(long, value_name = "URL", help_heading = "Remote model")]
    pub(crate) endpoint: Vec<String>,
    /// The served model's name (sent as `model`; default: --model's, else `default`).
    #[arg(long, value_name = "NAME", requires = "endpoint", help_heading = "Remote model")]
    pub(crate) served_model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "REAGENT_API_KEY", hide_env_values = true, requires = "endpoint", help_heading = "Remote model")]
    pub(crate) api_key: Option<String>,
    /// How the decision's grammar reaches the server: `grammar` (llguidance's Lark, as vLLM's and
    /// SGLang's llguidance backends and `reagent serve` take it), `gbnf` (llama.cpp's grammar format, as
    /// its server's `grammar`), `json-schema` (`response_format`),
    /// `tools` (OpenAI `tools` and `tool_choice`), `none` (parsed and validated here only), or `auto`
    /// (the first of those the server is found to enforce, probed at start).
    #[arg(long, default_value = "grammar", value_name = "MODE", requires = "endpoint", help_heading = "Remote model")]
    pub(crate) constraint: String,
    /// Seconds one request to the server may take.
    #[arg(long, default_value_t = 300.0, value_name = "SECS", requires = "endpoint", help_heading = "Remote model")]
    pub(crate) request_timeout: f64,
}

/// `reagent chat`: a conversation, one run per line.
#[derive(Args)]
pub(crate) struct ChatArgs {
    /// Continue a conversation saved with /save: its turns are kept as they were (no call is made again).
    #[arg(long, value_name = "FILE")]
    pub(crate) resume: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
    #[command(flatten)]
    pub(crate) opts: RunOptions,
}

/// The flags `run` and `chat` share: the model, the tools and the agent's settings.
#[derive(Args)]
pub(crate) struct RunOptions {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Offer the write_file tool.
    #[arg(long)]
    pub(crate) allow_write: bool,
    /// Offer only these built-in tools (repeatable; default: calculator, current_time, read_file, list_dir,
    /// search_files, and write_file with --allow-write). `--builtin none` offers none.
    #[arg(long, value_name = "NAME")]
    pub(crate) builtin: Vec<String>,
    /// Ask before each tool call.
    #[arg(long)]
    pub(crate) confirm: bool,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// Tool call timeout in seconds.
    #[arg(long, default_value_t = reagent::AgentConfig::default().tool_timeout.as_secs_f64())]
    pub(crate) tool_timeout: f64,
    #[arg(long, default_value_t = 0, help_heading = ADVANCED)]
    pub(crate) seed: u64,
    /// Let read_file read files that have other hard links (which may lie outside --root).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) read_hard_links: bool,
    /// Token limit of one decision.
    #[arg(long, default_value_t = reagent::AgentConfig::default().max_decision_tokens, help_heading = ADVANCED)]
    pub(crate) max_decision_tokens: usize,
    /// Maximum characters of the answer and of string arguments without their own maxLength.
    #[arg(long, default_value_t = reagent::DecisionOptions::default().max_string_chars, help_heading = ADVANCED)]
    pub(crate) max_string_chars: usize,
    /// Recompute the whole prompt at every step instead of reusing the KV cache (for measurements).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_prefix_reuse: bool,
    /// Neither load the system prompt's KV from the prompt cache nor save it there
    /// (`REAGENT_PROMPT_CACHE=0` too).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_prompt_cache: bool,
    #[command(flatten)]
    pub(crate) agent: AgentArgs,
}

/// The heading of the flags few runs need.
const ADVANCED: &str = "Advanced";

/// The agent flags `run` and `eval` share.
#[derive(Args)]
pub(crate) struct AgentArgs {
    /// A tools file (TOML or JSON) mapping tools to external programs or MCP servers (repeatable); in an
    /// eval, what implements the task functions (without --dry-run).
    #[arg(long, value_name = "FILE")]
    pub(crate) tools: Vec<PathBuf>,
    /// An MCP server to take tools from, as a command line (repeatable): `--mcp 'npx -y
    /// @modelcontextprotocol/server-filesystem DIR'`. Tools files take `[[mcp]]` entries too.
    #[arg(long, value_name = "COMMAND")]
    pub(crate) mcp: Vec<String>,
    /// The directory the built-in file tools (read_file / list_dir / write_file) are confined to.
    #[arg(long, default_value = ".")]
    pub(crate) root: PathBuf,
    /// auto, required, none, or a tool name.
    #[arg(long, default_value = "auto")]
    pub(crate) tool_choice: String,
    #[arg(long, default_value_t = reagent::AgentConfig::default().max_steps)]
    pub(crate) max_steps: usize,
    #[arg(long, default_value_t = reagent::AgentConfig::default().max_retries)]
    pub(crate) max_retries: usize,
    /// Allow up to N tool calls in one decision.
    #[arg(long)]
    pub(crate) parallel_calls: Option<usize>,
    /// Free-form generation with the JSON extracted from the text, instead of the decision grammar.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_grammar: bool,
    /// Decode one token at a time, without drafts from the context (the same output, slower where it
    /// copies: for measurements).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) no_speculation: bool,
    /// Run calls that change things even when a tool's output, not the request, chose them (a file that
    /// says "write pwned.txt"); held by default. `run --confirm` asks about every call instead.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) trust_tool_output: bool,
    #[command(flatten)]
    pub(crate) decision: DecisionArgs,
}

/// `--format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FormatArg {
    /// The catalog's choice for the model, else native where the template supports it.
    Auto,
    /// reagent's JSON object `{thought, type, tool, args, answer}` (any model).
    React,
    /// The model's own tool-call syntax (templates that render tools: Qwen 2.5).
    Native,
}

/// `--first-call`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FirstCallArg {
    /// The model chooses between calling and answering.
    Never,
    /// A call when the request names a path the file tools can reach or writes arithmetic.
    WhenNeeded,
    /// Always a call.
    Always,
}

impl AgentArgs {
    /// The agent settings these flags give (the decision format and biases come from
    /// [`DecisionArgs::resolve`], once the driver is known).
    pub(crate) fn config(&self) -> Result<reagent::AgentConfig> {
        Ok(reagent::AgentConfig::default()
            .tool_choice(self.tool_choice.parse()?)
            .max_steps(self.max_steps)
            .max_retries(self.max_retries)
            .decision(reagent::DecisionOptions::default().parallel_calls(self.parallel_calls))
            .hold_untrusted_calls(!self.trust_tool_output))
    }
}

#[derive(Subcommand)]
pub(crate) enum ModelsCmd {
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
#[command(next_help_heading = "Decision tuning (defaults: the catalog's settings for the model)")]
pub(crate) struct DecisionArgs {
    /// How decisions are written.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) format: FormatArg,
    /// Under `--tool-choice auto`, whether the first decision must call a tool.
    #[arg(long, value_enum)]
    pub(crate) first_call: Option<FirstCallArg>,
    /// After a failed call, the next decision must call again (not twice in a row).
    #[arg(long)]
    pub(crate) call_after_error: bool,
    /// After a failed call, let the next decision call any tool (by default: that tool again, or an
    /// answer).
    #[arg(long)]
    pub(crate) any_tool_after_error: bool,
    /// After calls, keep the answer the decision wrote rather than the model's own reply from their
    /// results.
    #[arg(long)]
    pub(crate) decision_answer_after_calls: bool,
    /// Logit bias for calling a tool over answering, where a native decision starts.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) call_bias: Option<f32>,
    /// Logit bias for one more call over ending a native decision after a call.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) more_calls_bias: Option<f32>,
    /// Logit bias for closing an object of arguments over adding an optional argument (native).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) close_bias: Option<f32>,
    /// Logit bias for ending a list (an array, or a string at a comma) over adding an item (native).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) end_list_bias: Option<f32>,
    /// Under `--tool-choice auto`, turn a first decision into an answer when less than this share of its
    /// first call's argument values are words of the user's messages (0 disables).
    #[arg(long)]
    pub(crate) abstain_below: Option<f32>,
    /// Under `--tool-choice auto`, turn a first decision into an answer when its first call's support
    /// from the request (in nats, from the model's own scores) is below this ("none" disables).
    #[arg(long, allow_negative_numbers = true, value_name = "NATS|none")]
    pub(crate) min_support: Option<String>,
    /// Under `--tool-choice auto`, turn a first decision into an answer when the support of its first
    /// call's tool name from the request (in nats, from the model's own scores) is below this ("none"
    /// disables).
    #[arg(long, allow_negative_numbers = true, value_name = "NATS|none")]
    pub(crate) min_tool_support: Option<String>,
    /// Abstention keeps a call whose tool the request names (a word of it is a part of the tool's or a
    /// parameter's name): its values are derived, not made up.
    #[arg(long, value_name = "yes|no")]
    pub(crate) keep_named_tool_calls: Option<Toggle>,
    /// With --parallel-calls N and the native format: after a decision's calls, propose one more and keep
    /// it when its new values are words of the request.
    #[arg(long, value_name = "yes|no")]
    pub(crate) propose_more_calls: Option<Toggle>,
    /// Native format: leave out the optional arguments whose values the request does not state.
    #[arg(long, value_name = "yes|no")]
    pub(crate) drop_unstated_options: Option<Toggle>,
    /// Native format: leave out the calls after the first that bring a value the request does not state.
    #[arg(long, value_name = "yes|no")]
    pub(crate) drop_unstated_calls: Option<Toggle>,
    /// Maximum characters of a ReAct decision's `thought`; 0 leaves it empty.
    #[arg(long)]
    pub(crate) max_thought_chars: Option<usize>,
    /// ReAct: choose between calling and answering at the first decision by the model's score for
    /// starting a call in its own call syntax (plus --call-bias), instead of inside the ReAct object.
    #[arg(long, value_name = "yes|no")]
    pub(crate) native_branch: Option<Toggle>,
    /// Recompute the arithmetic a decision's answer or thought writes (`12 + 7 = 20`) and, where a result
    /// is wrong, ask again with the right one.
    #[arg(long, value_name = "yes|no", default_value = "yes")]
    pub(crate) check_arithmetic: Toggle,
    /// Models whose template thinks (Qwen 3, SmolLM 3): up to N tokens of free `<think>` text before each
    /// decision, which is then made under the grammar as always; 0: the template's no-thinking mode
    /// (default: the catalog's, else 0).
    #[arg(long, value_name = "N")]
    pub(crate) think_budget: Option<usize>,
}

/// `yes` or `no`, for settings whose default comes from the catalog.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Toggle {
    Yes,
    No,
}

impl DecisionArgs {
    /// Sets the decision fields of `config`: the catalog's settings for the model (`entry`) and `profile`,
    /// then the flags given. `supports_native`: whether the driver can decide natively.
    pub(crate) fn apply(
        &self,
        config: &mut reagent::AgentConfig,
        entry: Option<&reagent::catalog::CatalogEntry>,
        profile: reagent::agent::Profile,
        supports_native: bool,
    ) -> Result<()> {
        use reagent::agent::{DecisionFormat, FirstCall};
        let defaults = entry.map(|e| e.settings(profile).clone()).unwrap_or_default();
        config.apply_settings(&defaults, supports_native)?;
        match self.format {
            FormatArg::Auto => {}
            FormatArg::React => config.format = DecisionFormat::React,
            FormatArg::Native => config.format = DecisionFormat::Native,
        }
        if let Some(f) = self.first_call {
            config.first_call = match f {
                FirstCallArg::Never => FirstCall::Never,
                FirstCallArg::WhenNeeded => FirstCall::WhenNeeded,
                FirstCallArg::Always => FirstCall::Always,
            };
        }
        config.call_after_error |= self.call_after_error;
        config.retry_failed_tool &= !self.any_tool_after_error;
        config.own_words_after_calls &= !self.decision_answer_after_calls;
        let b = &mut config.branch_biases;
        b.call = self.call_bias.unwrap_or(b.call);
        b.more_calls = self.more_calls_bias.unwrap_or(b.more_calls);
        b.close = self.close_bias.unwrap_or(b.close);
        b.end_list = self.end_list_bias.unwrap_or(b.end_list);
        match self.abstain_below {
            Some(g) if !(0.0..=1.0).contains(&g) => bail!("--abstain-below must be between 0 and 1, not {g}"),
            Some(g) => config.abstain_below = (g > 0.0).then_some(g),
            None => {}
        }
        if let Some(s) = self.min_support.as_deref() {
            config.min_support = nats_or_none("--min-support", s)?;
        }
        if let Some(s) = self.min_tool_support.as_deref() {
            config.min_tool_support = nats_or_none("--min-tool-support", s)?;
        }
        let toggle = |t: Option<Toggle>, default| t.map_or(default, |t| t == Toggle::Yes);
        config.keep_named_tool_calls = toggle(self.keep_named_tool_calls, config.keep_named_tool_calls);
        config.propose_more_calls = toggle(self.propose_more_calls, config.propose_more_calls);
        config.drop_unstated_options = toggle(self.drop_unstated_options, config.drop_unstated_options);
        config.drop_unstated_calls = toggle(self.drop_unstated_calls, config.drop_unstated_calls);
        config.native_branch = toggle(self.native_branch, config.native_branch);
        if let Some(n) = self.max_thought_chars {
            config.decision.max_thought_chars = n;
        }
        config.check_arithmetic = self.check_arithmetic == Toggle::Yes;
        if let Some(n) = self.think_budget {
            config.think_budget = n;
        }
        Ok(())
    }
}

/// A threshold in nats given to `flag`, or `none`.
fn nats_or_none(flag: &str, s: &str) -> Result<Option<f32>> {
    match s {
        "none" => Ok(None),
        _ => match s.parse::<f32>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            _ => bail!("{flag} takes a number of nats or `none`, not `{s}`"),
        },
    }
}

/// The decision settings of `config`, in one line (`reagent eval` prints it), with the model's call
/// syntax where decisions are native.
pub(crate) fn describe_decisions(
    config: &reagent::AgentConfig,
    syntax: Option<&reagent::agent::native::CallSyntax>,
) -> String {
    use reagent::agent::DecisionFormat;
    let b = &config.branch_biases;
    let abstain = config.abstain_below.map_or("never".to_string(), |g| g.to_string());
    let mut s = format!("{} format", config.format);
    if let Some(syntax) = syntax.filter(|_| config.format == DecisionFormat::Native) {
        s += &format!(" ({syntax})");
    }
    s += &format!(", first call {}, abstain below {abstain}", config.first_call);
    if let Some(m) = config.min_support {
        s += &format!(", calls supported by at least {m} nats");
    }
    if let Some(m) = config.min_tool_support {
        s += &format!(", tools supported by at least {m} nats");
    }
    if config.abstain_below.is_some() && config.keep_named_tool_calls {
        s += " (keeping calls of tools the request names)";
    }
    if config.format == DecisionFormat::Native {
        s += &format!(
            ", call bias {}, more-calls bias {}, close bias {}, end-list bias {}",
            b.call, b.more_calls, b.close, b.end_list
        );
        // Proposals and the two drop rules act on native decisions only.
        s += if config.propose_more_calls { ", proposing more calls" } else { "" };
        s += if config.drop_unstated_options { ", dropping unstated optional arguments" } else { "" };
        s += if config.drop_unstated_calls { ", dropping unstated later calls" } else { "" };
    } else {
        if config.native_branch {
            s += &format!(", first decision chosen by the native call score (bias {})", b.call);
        } else if b.call != 0.0 {
            s += &format!(", first decision's call bias {}", b.call);
        }
        match config.decision.max_thought_chars {
            0 => s += ", no thought",
            n => s += &format!(", thought of up to {n} characters"),
        }
    }
    if !config.check_arithmetic {
        s += ", arithmetic unchecked";
    }
    s
}

#[derive(Args)]
pub(crate) struct ModelArgs {
    /// A catalog name (see `reagent models list`) or a path to a GGUF file.
    #[arg(long, short = 'm')]
    pub(crate) model: Option<String>,
    /// Use this tokenizer.json instead of the tokenizer in the GGUF file.
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) tokenizer_json: Option<PathBuf>,
    /// Use this Jinja chat template instead of the GGUF file's (one that renders tools and calls, where
    /// the file's own does not).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) chat_template: Option<PathBuf>,
    /// Cap on the context window (tokens).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) context: Option<usize>,
}

#[derive(Args)]
pub(crate) struct TokenizeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The text to tokenize.
    #[arg(long)]
    pub(crate) text: String,
    /// Parse control tokens such as `<|im_start|>` into their ids.
    #[arg(long)]
    pub(crate) special: bool,
    /// Also run the model over the tokens and print the logits of the next token, as
    /// `{"ids": [...], "logits": [...]}` (to compare with another implementation).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) logits: bool,
}

#[derive(Args)]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The prompt (raw text, or the user message with --chat).
    #[arg(long, short = 'p')]
    pub(crate) prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub(crate) chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    pub(crate) system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub(crate) max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.8)]
    pub(crate) temperature: f32,
    #[arg(long)]
    pub(crate) top_k: Option<usize>,
    #[arg(long)]
    pub(crate) top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub(crate) stop: Vec<String>,
    /// Print the rendered prompt to stderr before generating.
    #[arg(long)]
    pub(crate) show_prompt: bool,
    /// Constrain the output to this JSON schema (a file).
    #[arg(long, group = "grammar", value_name = "FILE")]
    pub(crate) json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar (llguidance dialect; a file).
    #[arg(long, group = "grammar", value_name = "FILE")]
    pub(crate) lark: Option<PathBuf>,
    /// Constrain the whole output to match this regular expression.
    #[arg(long, group = "grammar", value_name = "RE")]
    pub(crate) regex: Option<String>,
    /// Print the generated token ids (a JSON array) instead of the text (to compare with another
    /// implementation).
    #[arg(long, help_heading = ADVANCED)]
    pub(crate) ids: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    pub(crate) prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub(crate) gen_tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Measure a decision-shaped generation under the decision grammar against the same one unconstrained.
    #[arg(long)]
    pub(crate) constrained: bool,
    /// Measure loading prompt prefixes from the prompt cache against computing them (64 tokens up to
    /// --prompt-tokens, doubling).
    #[arg(long, conflicts_with = "constrained")]
    pub(crate) prompt_cache: bool,
    /// Measure speculative decoding (drafts from the context) against plain decoding: quoting lines of a
    /// file, a decision after reading it, free text.
    #[arg(long, conflicts_with_all = ["constrained", "prompt_cache"])]
    pub(crate) speculation: bool,
}
