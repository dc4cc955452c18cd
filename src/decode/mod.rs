//! Decoding: samplers, the generation loop and its statistics.

pub mod constraint;
pub mod generate;
pub mod sampler;
