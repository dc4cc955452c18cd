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
    /// The tokenizer described by the file (or tokenizer.json) cannot be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },

    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),

    // ---- grammars ------------------------------------------------------------------------------------
    /// A grammar, schema or regex that cannot be compiled, or a constrained generation that broke.
    #[error("grammar: {0}")]
    Grammar(String),

    /// A tool definition or tool set is invalid.
    #[error("tool `{tool}`: {reason}")]
    Tool { tool: String, reason: String },

    // ---- catalog and fetching -----------------------------------------------------------------------
    /// `--model NAME` is neither an existing file nor a catalog entry.
    #[error("unknown model `{name}`: not a file and not in the catalog (known: {known})")]
    UnknownModel { name: String, known: String },

    /// The catalog file is malformed.
    #[error("model catalog: {0}")]
    Catalog(String),

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

    /// Invalid user-supplied generation or benchmark parameters.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

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
}
