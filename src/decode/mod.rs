//! Decoding: samplers, the generation loop and its statistics.

pub mod generate;
pub mod sampler;
