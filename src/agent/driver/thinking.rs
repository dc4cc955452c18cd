//! Thinking before a decision, for models whose template has a thinking section (Qwen 3, SmolLM 3).
//!
//! llama.cpp declines to apply a grammar while such a model thinks. Here the thinking is a bounded span
//! of free text, closed by the model or, once its budget is spent, by the grammar, and the decision follows
//! in the same sequence (the KV cache goes on from the span) under the decision grammar as always. The
//! thinking is returned apart from the decision and never reaches its arguments.

use super::ModelDriver;
use crate::decode::constraint::Grammar;
use crate::decode::generate::{FinishReason, GenerateParams};
use crate::error::{Error, Result};
use crate::text::chat::{THINK_CLOSE, THINK_OPEN};

/// A thinking span: its text, the tokens generated, and the prompt tokens it found in the KV cache and
/// loaded from the prompt cache.
pub(super) struct Thought {
    pub(super) text: String,
    pub(super) tokens: usize,
    pub(super) reused: usize,
    pub(super) loaded: usize,
}

impl ModelDriver {
    /// Free thinking after `prompt`: `<think>`, then at most `budget` tokens of text, then `</think>` (the
    /// model's own, or forced when the budget is spent), constrained by a grammar so that the span is
    /// always closed. Returns the prompt with the thinking and the break after it (the decision follows in
    /// the same sequence, its KV cache reused), and what the span was.
    pub(super) fn think(&mut self, prompt: &[u32], budget: usize) -> Result<(Vec<u32>, Thought)> {
        let bad = |problem: String| Error::param("think budget", problem);
        let Some(engine) = self.engine.clone() else {
            return Err(bad("thinking before a decision needs constrained decoding".into()));
        };
        let tok = self.model.tokenizer().clone();
        let marker = |text: &str| -> Result<u32> {
            match tok.encode(text, true)?.as_slice() {
                [id] => Ok(*id),
                _ => Err(bad(format!("the model's vocabulary has no single `{text}` token"))),
            }
        };
        let open = marker(THINK_OPEN)?;
        marker(THINK_CLOSE)?;
        let mut p = prompt.to_vec();
        p.push(open);
        p.extend(tok.encode("\n", false)?);
        let (reused, loaded) = self.prepare_prefix(&p);
        // The text cannot hold the close marker (a single token, not text), so the span ends only at it.
        let grammar = Grammar::Lark(format!(
            "start: think_text {close}\nthink_text[max_tokens={budget}]: /(?s:.*)/\n",
            close = THINK_CLOSE
        ));
        let mut constraint = engine.constraint(&grammar)?;
        let params = GenerateParams {
            max_tokens: budget.saturating_add(4),
            sampling: self.sampling,
            seed: self.seed,
            speculate: self.speculate,
            // The grammar closes the span when the budget is spent: no steering to close it before.
            close_within: 0,
            ..GenerateParams::default()
        };
        let g = self.generate(&p, reused, &params, Some(&mut constraint))?;
        if g.stop == FinishReason::Interrupted {
            return Err(bad("the thinking was interrupted".into()));
        }
        if !(constraint.is_finished() || g.stop == FinishReason::GrammarComplete) {
            return Err(bad(format!("the thinking did not close ({:?})", g.stop)));
        }
        let text = g.text.strip_suffix(THINK_CLOSE).unwrap_or(&g.text).trim().to_string();
        p.extend(&g.tokens);
        p.extend(tok.encode("\n\n", false)?);
        let thought = Thought { text, tokens: g.tokens.len(), reused: g.stats.cached_tokens.min(prompt.len()), loaded };
        Ok((p, thought))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::agent::decision::{BranchBiases, DecisionFormat};
    use crate::agent::driver::{DecisionRequest, Driver};
    use crate::decode::sampler::Sampling;
    use crate::model::tiny::{write_tiny_gguf, TinySpec};
    use crate::model::Arch;
    use crate::model::LoadOptions;
    use crate::text::chat::ChatMessage;
    use crate::text::Model;

    fn driver(thinking: bool) -> ModelDriver {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let spec = TinySpec { context: 4096, thinking, ..TinySpec::new(Arch::Qwen3) };
        write_tiny_gguf(&path, &spec).unwrap();
        let model = Model::load(&path, &LoadOptions::default()).unwrap();
        ModelDriver::constrained(model, Sampling::Greedy, 0).unwrap()
    }

    fn request<'a>(messages: &'a [ChatMessage], grammar: &'a Grammar, budget: usize) -> DecisionRequest<'a> {
        DecisionRequest {
            messages,
            grammar,
            tools: None,
            format: DecisionFormat::React,
            biases: BranchBiases::default(),
            max_tokens: 64,
            attempt: 0,
            think_budget: budget,
            stop_at_answer: false,
        }
    }

    #[test]
    fn thinking_is_bounded_closed_and_followed_by_a_valid_decision() {
        let mut d = driver(true);
        let tok = d.model().tokenizer().clone();
        let schema = json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 6}},
                            "required": ["answer"], "additionalProperties": false});
        let grammar = Grammar::JsonSchema(schema);
        let messages = [ChatMessage::user("hello world")];
        for (i, budget) in [1, 7, 60].into_iter().enumerate() {
            let out = d.decide(&request(&messages, &grammar, budget)).unwrap();
            // The first prompt was computed; later ones found it in the KV cache.
            assert_eq!(out.stats.reused_tokens == 0, i == 0, "{:?}", out.stats);
            let thinking = out.thinking.clone().expect("a thinking span");
            // At most the budget, and the close marker (the model's own or forced).
            assert!(out.stats.thinking_tokens <= budget + 1, "{budget}: {:?}", out.stats);
            assert!(!thinking.contains(THINK_CLOSE), "{thinking:?}");
            let v: serde_json::Value = serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{e}: {}", out.text));
            assert!(out.complete && v["answer"].is_string() && !out.text.contains(THINK_OPEN), "{}", out.text);
            // The decision went on from the closed span, in the same sequence.
            let prompt = tok.decode(d.last_prompt(), true).unwrap();
            let span = prompt.split_once("<|im_start|>assistant\n").unwrap().1;
            assert!(span.starts_with(&format!("{THINK_OPEN}\n")), "{span:?}");
            assert!(span.ends_with(&format!("{THINK_CLOSE}\n\n")), "{span:?}");
            assert!(span.contains(thinking.as_str()), "{span:?} {thinking:?}");
        }
        // Budget 0: the template's no-thinking mode, and no thinking.
        let out = d.decide(&request(&messages, &grammar, 0)).unwrap();
        assert!(out.thinking.is_none() && out.stats.thinking_tokens == 0);
        let prompt = tok.decode(d.last_prompt(), true).unwrap();
        assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{prompt:?}");
    }

    #[test]
    fn a_think_budget_needs_a_template_that_thinks() {
        let mut d = driver(false);
        let grammar = Grammar::JsonSchema(json!({"type": "object"}));
        let messages = [ChatMessage::user("hello")];
        let err = d.decide(&request(&messages, &grammar, 5)).unwrap_err().to_string();
        assert!(err.contains("think budget") && err.contains("thinking section"), "{err}");
    }

    /// A sampled attempt (a retry of a greedy driver) draws from a seed that starts over with each run
    /// (`Driver::reseed`, called when a run starts): what earlier runs on the same driver drew does not
    /// change it, so an eval's task or a server's request samples the same after any others.
    #[test]
    fn a_retry_samples_the_same_whatever_ran_before() {
        let mut driver = driver(false);
        let grammar = Grammar::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "maxLength": 40}},
            "required": ["answer"],
        }));
        let messages = [ChatMessage::user("Name a colour and an animal.")];
        let req = DecisionRequest { attempt: 1, ..request(&messages, &grammar, 0) };
        let draws: Vec<String> = (0..4).map(|_| driver.decide(&req).unwrap().text).collect();
        // Each draw takes the next seed: they are not all the same text.
        assert!(draws.iter().any(|d| *d != draws[0]), "{draws:?}");
        // Started over, the driver draws the first text again.
        driver.reseed();
        assert_eq!(driver.decide(&req).unwrap().text, draws[0]);
    }
}
