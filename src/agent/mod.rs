//! The agent: ReAct decisions and (to come) the step loop. Talks to a model only through
//! [`LanguageModel`](crate::LanguageModel).

pub mod decision;
