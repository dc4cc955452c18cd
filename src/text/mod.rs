//! Text in and out of the model: the tokenizer built from GGUF metadata and chat-template rendering.

pub mod chat;
mod spm;
pub mod tokenizer;
