//! Text in and out of the model: the tokenizer built from GGUF metadata, chat-template rendering, the
//! chat-format and stop-token policy, and [`Model`], a network joined to all of them.

pub mod chat;
mod model;
mod spm;
pub mod tokenizer;

pub use model::{template_of_file, Model};
