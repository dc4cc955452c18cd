//! # reagent
//!
//! A local-model agent with in-process inference: it loads an open-weights GGUF model (llama, qwen2,
//! qwen3, smollm3, phi3 and gemma3 architectures) with candle, tokenizes exactly like llama.cpp, renders
//! the model's own chat template and generates with a KV cache that can be kept across calls and rolled
//! back.
//!
//! ## Key types
//! - [`Model`]: a GGUF file loaded with its tokenizer, chat template and stop tokens; implements
//!   [`LanguageModel`], the small trait (forward at a position, truncate the cache) everything above the
//!   model layer uses.
//! - [`Tokenizer`]: built from the GGUF metadata; `encode(text, parse_special)`, exact token bytes.
//! - [`ChatTemplate`] and [`ChatMessage`]: the model's Jinja chat template.
//! - [`Model::generate`] from an [`Input`] (text, chat messages or tokens, optionally a grammar) with
//!   [`GenerateParams`] and [`Sampling`]; [`generate`] with a [`Request`] for token-level control (a kept
//!   KV prefix, a [`Constraint`] of your own).
//! - [`catalog`]: model names, the local cache and fetching.
//! - [`GrammarEngine`] / [`Constraint`]: llguidance-constrained decoding ([`generate`]).
//! - [`Agent`] (built with [`Agent::builder`]), [`Tool`], [`TypedTool`], [`ToolSpec`], [`Transcript`],
//!   [`AgentEvent`], [`StopReason`]: the ReAct agent; see [`agent`] for an example. Tools also come from
//!   MCP servers ([`tools::mcp::McpServer`]).
//!
//! `bench`, `eval` and the model's kernel modules are the CLI's and the tests' (hidden from these docs).
//!
//! ## Usage
//! 1. Resolve a model name to a file ([`catalog::resolve`]), fetching it if needed.
//! 2. Load it with [`Model::load`].
//! 3. Generate from a conversation ([`Model::generate`]), streaming text to a callback.
//!
//! Set `RAYON_NUM_THREADS` before the first model call (the `reagent` binary does): without it candle
//! counts the physical cores from `/proc/cpuinfo` at every f32 matmul, twice per layer per decode step.
//!
//! ```no_run
//! use reagent::{catalog, ChatMessage, GenerateParams, LoadOptions, Model};
//!
//! # fn main() -> reagent::Result<()> {
//! let cat = catalog::Catalog::builtin();
//! let path = catalog::resolve(&cat, "smollm2-135m", &catalog::FetchOptions::default())?;
//! let mut model = Model::load(&path, &LoadOptions::default())?;
//! let question = [ChatMessage::user("What is the capital of France?")];
//! let out = model.generate(&question, &GenerateParams::default(), &mut |t| print!("{t}"))?;
//! eprintln!("\n{} tokens at {:.1} tok/s", out.stats.generated_tokens, out.stats.decode_tok_s());
//! # Ok(()) }
//! ```

#[macro_use]
mod setters;

pub mod agent;
#[doc(hidden)]
pub mod bench;
pub mod catalog;
pub mod decode;
pub mod error;
#[doc(hidden)]
pub mod eval;
pub mod gguf;
pub mod limits;
pub mod model;
#[cfg(feature = "serve")]
pub mod serve;
pub mod text;
pub mod tools;

pub use agent::decision::{decision_schema, Decision, DecisionOptions, ToolChoice};
pub use agent::{Agent, AgentConfig, AgentEvent, StopReason, Transcript};
pub use decode::constraint::{Constraint, ConstraintStats, Grammar, GrammarEngine};
pub use decode::generate::{generate, FinishReason, GenerateParams, Generation, GenerationStats, Request};
pub use decode::model_api::{Input, Source};
pub use decode::sampler::{Sampler, Sampling};
pub use error::{Error, Result};
pub use model::{LanguageModel, LoadOptions};
pub use text::chat::{ChatMessage, ChatTemplate, Role};
pub use text::tokenizer::Tokenizer;
pub use text::Model;
pub use tools::{Tool, ToolCall, ToolSpec, TypedTool};
