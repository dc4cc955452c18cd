//! Decoding: samplers, the generation loop and its statistics, grammar constraints, and the short
//! `Model::generate` API over them.

pub mod constraint;
pub mod finite;
pub mod gbnf;
pub mod generate;
pub mod model_api;
pub mod sampler;
pub mod speculate;
