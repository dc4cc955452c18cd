//! Drafts for speculative decoding: tokens guessed ahead of the model, run through it in one batched
//! forward pass with the token before them ([`LanguageModel::forward_all`](crate::model::LanguageModel)),
//! and kept only as far as the sampler, drawing from the model's own logits under the grammar, picks the
//! same tokens. The output is the same as without drafts; a right guess saves a pass over the weights.
//!
//! The guesses come from the context itself ("prompt lookup"): agent output copies spans of what it read
//! (a file's line, a number, a name, the request's words), so the tokens that followed the last
//! occurrence of the current few tokens are often the ones that come next.

use serde::Serialize;

/// The length of a generation's first draft (and the shortest after a miss); it doubles while drafts
/// come true, up to [`GenerateParams::speculate`](super::generate::GenerateParams::speculate).
pub const FIRST_DRAFT: usize = 3;

/// The longest and shortest run of last tokens looked up in the context.
pub const MAX_NGRAM: usize = 4;
pub const MIN_NGRAM: usize = 3;

/// The tokens that followed the latest earlier occurrence of the context's last `n` tokens (`n` from
/// [`MAX_NGRAM`] down to [`MIN_NGRAM`], the longest match first), at most `max` of them; empty when
/// nothing matches. `context` is the prompt and the generated tokens, in order.
pub fn lookup(context: &[u32], max: usize) -> &[u32] {
    lookup_match(context, max).0
}

/// [`lookup`], with the length of the run of last tokens that matched (0 for none).
pub fn lookup_match(context: &[u32], max: usize) -> (&[u32], usize) {
    if max == 0 {
        return (&[], 0);
    }
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        let Some(start) = context.len().checked_sub(n) else { continue };
        let tail = &context[start..];
        // The latest occurrence that ends before the tail does, and has a token after it.
        if let Some(i) = (0..start).rev().find(|&i| &context[i..i + n] == tail) {
            let from = i + n;
            return (&context[from..(from + max).min(context.len())], n);
        }
    }
    (&[], 0)
}

/// Whether a match of `n` last tokens is long enough to draft from before any guess came true.
pub fn sure_match(n: usize) -> bool {
    n >= MAX_NGRAM
}

/// How speculation went in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SpeculationStats {
    /// Tokens proposed and run through the model ahead of the sampler.
    pub drafted: usize,
    /// Drafted tokens the sampler picked (each one a forward pass saved).
    pub accepted: usize,
    /// Forward passes of the decode (the prompt's aside).
    pub passes: usize,
}

impl SpeculationStats {
    /// Accepted drafts as a share of the drafted ones.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_latest_match_proposes_what_followed_it() {
        // "5 6 7" occurred twice; the latest occurrence was followed by 8 9.
        let ctx = [5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 3, 5, 6, 7];
        assert_eq!(lookup(&ctx, 8), &[8, 9, 3, 5, 6, 7]);
        assert_eq!(lookup(&ctx, 2), &[8, 9]);
        assert_eq!(lookup(&ctx, 0), &[] as &[u32]);
    }

    #[test]
    fn fewer_than_three_matching_tokens_propose_nothing() {
        assert!(lookup(&[1, 2, 3, 4, 9, 4], 4).is_empty());
        assert!(lookup(&[1, 2, 3, 4, 9, 3, 4], 4).is_empty(), "two tokens are too few to go on");
        assert!(lookup(&[7], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
        assert!(lookup(&[3, 3, 3], 4).is_empty(), "the tail's own tokens are no earlier occurrence");
        // A run of one token repeated proposes more of it.
        assert_eq!(lookup(&[3, 3, 3, 3], 4), &[3]);
    }

    #[test]
    fn the_longer_match_wins_over_a_later_shorter_one() {
        // Last 3 tokens "1 2 3": matched at 0 (followed by 4); "2 3" alone also at 6 (followed by 5).
        let ctx = [1, 2, 3, 4, 0, 0, 2, 3, 5, 0, 1, 2, 3];
        assert_eq!(lookup(&ctx, 1), &[4]);
    }
}
