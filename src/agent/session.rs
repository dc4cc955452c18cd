//! A conversation with an agent ([`Session`]): each user turn is one run, with every earlier turn, its
//! decisions and its observations in the conversation, so a follow-up can use what an earlier turn read.
//! The run's prompt starts as the previous one did, so only the new turn is computed.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Agent, StopReason, Transcript};
use crate::error::{Error, Result};
use crate::text::chat::{ChatMessage, Role};

/// The version of the session file [`Session::save`] writes.
pub const SESSION_VERSION: u32 = 1;

/// The largest session file read.
const MAX_SESSION_BYTES: u64 = 256 << 20;

/// One turn of a conversation: what the person wrote and what the run added to the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionTurn {
    /// The person's message.
    pub user: String,
    /// The turn as the conversation keeps it: the user message, then each decision and observation.
    pub messages: Vec<ChatMessage>,
    /// The answer the turn ended with, if any.
    pub answer: Option<String>,
}

/// The first line of a session file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionHeader {
    reagent_session: u32,
    turns: usize,
}

/// A conversation with an [`Agent`]: [`send`](Self::send) runs one user turn with the earlier ones in
/// view. The agent's KV cache holds the conversation between turns; [`undo`](Self::undo) and
/// [`reset`](Self::reset) drop turns (the next prompt then shares less with the cache, which keeps only
/// the part they share).
pub struct Session {
    agent: Agent,
    turns: Vec<SessionTurn>,
    dropped: usize,
}

impl Session {
    /// A conversation with no turns yet.
    pub fn new(agent: Agent) -> Self {
        Self { agent, turns: Vec::new(), dropped: 0 }
    }

    /// Runs `text` as the next user turn and keeps it, unless the run was interrupted (the conversation is
    /// then as it was before). Where the conversation does not fit the context, the run shortens the
    /// oldest observations first (kept so in the turns); where it still does not fit, the oldest turns are
    /// dropped ([`dropped_turns`](Self::dropped_turns)) until it does or none is left.
    pub fn send(&mut self, text: &str) -> Result<Transcript> {
        let mut removed = Vec::new();
        loop {
            let mut conversation = self.conversation();
            let before = conversation.len();
            conversation.push(ChatMessage::user(text));
            let (transcript, kept) = self.agent.run_kept(&conversation)?;
            let overflow = matches!(transcript.stop_reason, StopReason::ContextOverflow { .. });
            if overflow && transcript.steps.is_empty() {
                if !self.turns.is_empty() {
                    removed.push(self.turns.remove(0));
                    continue;
                }
                // The turn does not fit even alone: the conversation stays as it was.
                self.turns = removed;
                return Ok(transcript);
            }
            if transcript.stop_reason == StopReason::Interrupted {
                self.turns.splice(0..0, removed);
                return Ok(transcript);
            }
            self.dropped += removed.len();
            // Earlier turns as the run left them: observations it shortened to fit stay short.
            if kept.len() >= before {
                let mut at = 0;
                for turn in &mut self.turns {
                    let n = turn.messages.len();
                    turn.messages.clone_from_slice(&kept[at..at + n]);
                    at += n;
                }
            }
            let messages = kept.get(before..).map(<[ChatMessage]>::to_vec).unwrap_or_default();
            let answer = transcript.final_answer.clone();
            self.turns.push(SessionTurn { user: text.to_string(), messages, answer });
            return Ok(transcript);
        }
    }

    /// The oldest turns dropped so far to fit the context.
    pub fn dropped_turns(&self) -> usize {
        self.dropped
    }

    /// Drops the last turn; it is returned.
    pub fn undo(&mut self) -> Option<SessionTurn> {
        self.turns.pop()
    }

    /// Drops every turn.
    pub fn reset(&mut self) {
        self.turns.clear();
        self.dropped = 0;
    }

    /// The turns so far.
    pub fn turns(&self) -> &[SessionTurn] {
        &self.turns
    }

    /// The conversation so far, as the next run gets it (before its user turn).
    pub fn conversation(&self) -> Vec<ChatMessage> {
        self.turns.iter().flat_map(|t| t.messages.iter().cloned()).collect()
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The agent, to change its settings or tools between turns.
    pub fn agent_mut(&mut self) -> &mut Agent {
        &mut self.agent
    }

    /// Writes the conversation to `path` as JSON lines: a header with the format's version, then one line
    /// per turn. Written to a temporary file beside it and renamed into place, so a failed save leaves an
    /// earlier file whole.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            let header = SessionHeader { reagent_session: SESSION_VERSION, turns: self.turns.len() };
            writeln!(f, "{}", serde_json::to_string(&header)?)?;
            for t in &self.turns {
                writeln!(f, "{}", serde_json::to_string(t)?)?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(path, e)
        })
    }

    /// A conversation saved by [`save`](Self::save), continued with `agent`: no call is made again (the
    /// turns' observations are kept as they were).
    pub fn load(agent: Agent, path: &Path) -> Result<Self> {
        Ok(Self { agent, turns: read_session(path)?, dropped: 0 })
    }
}

/// The turns of a session file, checked: the header's version and turn count, each turn a user message
/// first.
pub fn read_session(path: &Path) -> Result<Vec<SessionTurn>> {
    let bad = |problem: String| Error::InputFile { path: path.to_path_buf(), problem };
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(bad("not a regular file; give a file written by /save".into()));
    }
    if meta.len() > MAX_SESSION_BYTES {
        return Err(bad(format!("{} bytes; sessions are read up to {MAX_SESSION_BYTES} bytes", meta.len())));
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let first = lines.next().transpose().map_err(|e| Error::io(path, e))?.unwrap_or_default();
    let header: SessionHeader = serde_json::from_str(&first)
        .map_err(|_| bad("not a session (its first line is not a `reagent_session` header)".into()))?;
    if header.reagent_session != SESSION_VERSION {
        return Err(bad(format!("session format {} (this build reads {SESSION_VERSION})", header.reagent_session)));
    }
    let mut turns = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let turn: SessionTurn =
            serde_json::from_str(&line).map_err(|e| bad(format!("line {}: not a turn: {e}", i + 2)))?;
        if turn.messages.first().is_none_or(|m| m.role != Role::User || m.content != turn.user) {
            return Err(bad(format!("line {}: the turn does not start with its user message", i + 2)));
        }
        if turn.messages.iter().any(|m| m.role == Role::System) {
            return Err(bad(format!("line {}: a turn holds a system message", i + 2)));
        }
        turns.push(turn);
    }
    if turns.len() != header.turns {
        return Err(bad(format!("{} turns where the header says {} (cut short?)", turns.len(), header.turns)));
    }
    Ok(turns)
}
