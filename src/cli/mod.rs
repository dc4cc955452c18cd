//! The `reagent` command line: flags ([`args`]), the commands ([`commands`], [`agent`]) and what they
//! print ([`display`]). Errors are printed with their causes; outcomes map to exit codes (0 ok, 1 the
//! task ran but did not succeed, 2 usage or I/O errors, 130 interrupted).

use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::Result;
use clap::Parser;

use reagent::catalog::{self, Catalog, FetchOptions};
use reagent::limits::Cancel;
use reagent::{LoadOptions, Model};

/// `println!` that returns the write's error (a closed pipe: a quiet exit 0; a full disk: an `error:` line).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod agent;
mod args;
mod chat;
mod commands;
mod display;

use args::{Cli, Cmd, ModelArgs};

/// The exit code of a command that an interrupt cut short.
const INTERRUPTED_EXIT: u8 = 130;

/// Parses the flags, sizes the worker pools, runs the command and turns its outcome into an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if n == 0 || n > cores {
            eprintln!("error: --threads {n}: this machine runs 1 to {cores} threads at once");
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
    let outcome = run(cli);
    // A tool call abandoned at its timeout may still hold an MCP server: none outlives the command.
    reagent::tools::mcp::kill_all();
    match outcome {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // One line, whatever the causes' own formatting (TOML and grammar errors quote source lines).
            eprintln!("error: {}", reagent::error::report(&*e));
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
        Cmd::Models { cmd } => commands::models(cmd)?,
        Cmd::Tokenize(a) => commands::tokenize(a)?,
        Cmd::Generate(a) => return commands::generate(a),
        Cmd::Bench(a) => commands::bench(a, threads)?,
        Cmd::Cache { cmd } => commands::cache(cmd)?,
        Cmd::Serve(a) => commands::serve(a)?,
        Cmd::Run(a) => return stop_on_signals().scope(|| agent::run_agent(a)),
        Cmd::Chat(a) => return chat::chat(a, stop_on_signals()),
        Cmd::Eval(a) => {
            let cancel = stop_on_signals();
            cancel.scope(|| agent::eval(a))?;
            if cancel.is_cancelled() {
                return Ok(ExitCode::from(INTERRUPTED_EXIT));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the prompt cache may be used: not when `REAGENT_PROMPT_CACHE=0`.
fn prompt_cache_on() -> bool {
    std::env::var("REAGENT_PROMPT_CACHE").map_or(true, |v| v != "0")
}

/// Loads the model the flags name (the catalog default when none), fetching a catalog model when absent.
fn load(a: &ModelArgs) -> Result<Model> {
    let cat = Catalog::builtin();
    let name = a.model.clone().unwrap_or_else(|| cat.default.clone());
    let path = catalog::resolve(&cat, &name, &FetchOptions::default())?;
    let opts = LoadOptions::default()
        .max_context(a.context)
        .tokenizer_json(a.tokenizer_json.clone())
        .chat_template(a.chat_template.clone());
    Ok(Model::load(&path, &opts)?)
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

/// Ctrl-C and SIGTERM cancel the returned handle (run the command in its scope): generation ends, a
/// tool's process group is killed, the trace gets the transcript, an eval stops before its next task. A
/// second one ends the process at once. Exit code 130 after an interrupt.
fn stop_on_signals() -> Cancel {
    static CANCEL: OnceLock<Cancel> = OnceLock::new();
    let cancel = CANCEL.get_or_init(Cancel::new).clone();
    #[cfg(unix)]
    {
        extern "C" fn on_signal(_: libc::c_int) {
            let Some(cancel) = CANCEL.get() else { return };
            if cancel.is_cancelled() {
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(130) };
            }
            cancel.cancel();
        }
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only reads an initialized OnceLock, touches an atomic and calls _exit, all
        // async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    }
    cancel
}
