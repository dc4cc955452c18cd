//! `reagent chat`: a conversation with the agent. Each line is a user turn run by the same agent loop as
//! `run`, with the earlier turns, their calls and their results kept in the conversation (and in the KV
//! cache: only the new turn is computed). On a terminal: line editing and a history file; otherwise
//! stdin is read as one turn per line, answers on stdout, so a conversation can be scripted.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use reagent::agent::{Agent, AgentEvent, Driver, Profile, Session, StopReason};
use reagent::limits::Cancel;

use super::agent::{one_endpoint, remote_driver, run_config, run_driver, run_tools, unapplied_remotely};
use super::args::ChatArgs;
use super::display;

const HELP: &str = "\
/help          this list
/tools         the tools the agent can call
/undo          drop the last turn
/reset         drop every turn
/save FILE     write the conversation to FILE (continue it with `reagent chat --resume FILE`)
/quit          leave (Ctrl-D too; Ctrl-C stops a turn in progress)";

/// `reagent chat`: reads turns until the input ends or /quit.
pub(super) fn chat(a: ChatArgs, cancel: Cancel) -> Result<ExitCode> {
    let mut config = run_config(&a.opts)?;
    let tools = run_tools(&a.opts)?;
    let (driver, remote): (Box<dyn Driver>, _) = match one_endpoint(&a.remote, "chat")? {
        Some(url) => {
            let (driver, id, constraint) = remote_driver(url, &a.remote, a.opts.model.model.as_deref())?;
            (Box::new(driver) as Box<dyn Driver>, Some((id, constraint)))
        }
        None => (Box::new(run_driver(&a.opts)?.0.with_recent_prefixes(reagent::agent::RECENT_PREFIX_BYTES)), None),
    };
    let entry = driver.catalog_entry();
    a.opts.agent.decision.apply(&mut config, entry.as_ref(), Profile::Run, driver.supports_native())?;
    if let Some((id, constraint)) = remote {
        eprintln!("model: {id}{}", unapplied_remotely(&config, constraint));
    }
    let colour = std::io::stderr().is_terminal();
    // On a terminal an answer in the model's own words shows as it is generated; piped, each answer is
    // one whole line.
    let live = std::io::stdout().is_terminal().then(|| display::LiveAnswer::new(true, colour));
    let paused = live.clone();
    let events = move |e: &AgentEvent| match e {
        // The answer goes to stdout, after the turn (or as it came: below).
        AgentEvent::FinalAnswer { .. } => {}
        e => {
            if let Some(live) = &paused {
                live.pause();
            }
            display::show_event(e, colour)
        }
    };
    let mut builder =
        Agent::builder().boxed_driver(driver).tools(tools).config(config).cancel(cancel.clone()).events(events);
    if let Some(live) = live.clone() {
        builder = builder.answer_text(move |t| live.piece(t));
    }
    if a.opts.confirm {
        builder = builder.interceptor(display::Confirm);
    }
    let agent = builder.build()?;
    let mut session = match &a.resume {
        Some(path) => Session::load(agent, path)?,
        None => Session::new(agent),
    };
    if let Some(path) = &a.resume {
        eprintln!("[{}: {} turns]", path.display(), session.turns().len());
    }
    let mut input = Input::open()?;
    loop {
        let line = match input.next_line()? {
            Some(l) => l,
            None => break,
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            if !command_line(&mut session, command)? {
                break;
            }
            continue;
        }
        cancel.reset();
        let dropped = session.dropped_turns();
        let transcript = cancel.scope(|| session.send(line))?;
        if session.dropped_turns() > dropped {
            eprintln!("[the oldest {} turns were dropped to fit the context]", session.dropped_turns() - dropped);
        }
        // What was shown as it came, if it is the answer that stands.
        let streamed = match (&live, &transcript.final_answer) {
            (Some(live), Some(answer)) => live.finish(answer),
            (Some(live), None) => {
                live.finish("");
                false
            }
            (None, _) => false,
        };
        let mut out = std::io::stdout().lock();
        match (&transcript.final_answer, &transcript.stop_reason) {
            (_, StopReason::Interrupted) => eprintln!("[stopped; the turn is not kept]"),
            (Some(_), _) if streamed => {}
            (Some(answer), _) => writeln!(out, "{answer}")?,
            (None, reason) => writeln!(out, "No answer: {reason}")?,
        }
        out.flush()?;
    }
    input.save_history();
    Ok(ExitCode::SUCCESS)
}

/// Runs a `/command`; false to leave.
fn command_line(session: &mut Session, command: &str) -> Result<bool> {
    let (name, arg) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
    match name {
        "help" => eprintln!("{HELP}"),
        "quit" | "exit" => return Ok(false),
        "tools" => {
            for spec in session.agent().tool_specs() {
                eprintln!("{}: {}", spec.name, spec.description);
            }
        }
        "undo" => match session.undo() {
            Some(turn) => eprintln!("[dropped: {}]", turn.user),
            None => eprintln!("[no turn to drop]"),
        },
        "reset" => {
            session.reset();
            eprintln!("[conversation cleared]");
        }
        "save" if !arg.trim().is_empty() => {
            let path = PathBuf::from(arg.trim());
            match session.save(&path) {
                Ok(()) => eprintln!("[saved {} turns to {}]", session.turns().len(), path.display()),
                Err(e) => eprintln!("error: {}", reagent::error::report(&e)),
            }
        }
        "save" => eprintln!("usage: /save FILE"),
        _ => eprintln!("unknown command /{name}; /help lists them"),
    }
    Ok(true)
}

/// Where turns come from: a line editor on a terminal, else stdin's lines.
enum Input {
    Editor { editor: Box<rustyline::DefaultEditor>, history: Option<PathBuf>, interrupted: bool },
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Result<Self> {
        if !std::io::stdin().is_terminal() {
            return Ok(Self::Lines(std::io::stdin().lock()));
        }
        let mut editor = rustyline::DefaultEditor::new().context("opening the line editor")?;
        let history = dirs::data_dir().map(|d| d.join("reagent").join("chat_history"));
        if let Some(h) = &history {
            // A missing or unreadable history is an empty one.
            let _ = editor.load_history(h);
        }
        eprintln!("[reagent chat: /help for commands, Ctrl-D to leave]");
        Ok(Self::Editor { editor: Box::new(editor), history, interrupted: false })
    }

    /// The next line; `None` at the end of the input (Ctrl-D, or Ctrl-C twice at the prompt).
    fn next_line(&mut self) -> Result<Option<String>> {
        match self {
            Self::Lines(lines) => {
                let mut line = String::new();
                Ok((lines.read_line(&mut line).context("reading stdin")? > 0).then_some(line))
            }
            Self::Editor { editor, interrupted, .. } => loop {
                match editor.readline("> ") {
                    Ok(line) => {
                        *interrupted = false;
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) if !*interrupted => {
                        *interrupted = true;
                        eprintln!("[Ctrl-C again or Ctrl-D to leave]");
                    }
                    Err(rustyline::error::ReadlineError::Interrupted | rustyline::error::ReadlineError::Eof) => {
                        return Ok(None)
                    }
                    Err(e) => return Err(e).context("reading the terminal"),
                }
            },
        }
    }

    fn save_history(&mut self) {
        if let Self::Editor { editor, history: Some(h), .. } = self {
            if let Some(dir) = h.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = editor.save_history(h) {
                eprintln!("warning: the history was not saved to {}: {e}", h.display());
            }
        }
    }
}
