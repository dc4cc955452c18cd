//! Decoding: samplers, the generation loop and its statistics, grammar constraints, and the short
//! `Model::generate` / `Model::chat` API over them.

pub mod constraint;
pub mod generate;
mod model_api;
pub mod sampler;
