//! The KV of recent conversations, kept in memory so that one coming back is not computed again.
//!
//! A model has one KV cache. When a prompt departs from what the cache holds (a server taking turns
//! between clients, an application running two conversations), the positions past the shared prefix
//! are overwritten. [`RecentPrefixes`] keeps a copy of what is about to be lost, within a byte bound,
//! and gives back the longest prefix of a later prompt that a copy holds.

use crate::model::KvPrefix;

/// Copies of KV caches, most recently used last, within a byte bound.
#[derive(Debug, Default)]
pub struct RecentPrefixes {
    max_bytes: usize,
    entries: Vec<(Vec<u32>, KvPrefix)>,
    /// Bytes a position takes, once a prefix has shown it (to skip copies that could not be kept).
    per_token: Option<usize>,
}

impl RecentPrefixes {
    /// Keeps at most `max_bytes` of keys and values.
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, entries: Vec::new(), per_token: None }
    }

    /// Whether a prefix of `tokens` positions could be kept (before copying it).
    pub fn would_keep(&self, tokens: usize) -> bool {
        self.per_token.is_none_or(|b| tokens.saturating_mul(b) <= self.max_bytes)
    }

    /// Keeps `prefix`, the KV of `tokens`. Entries it extends are dropped; the least recently used go
    /// while the bound is passed. A prefix bigger than the bound is not kept.
    pub fn remember(&mut self, tokens: &[u32], prefix: KvPrefix) {
        let tokens = &tokens[..prefix.len.min(tokens.len())];
        if let Some(b) = prefix.bytes().checked_div(prefix.len) {
            self.per_token = Some(b);
        }
        if prefix.bytes() > self.max_bytes || tokens.is_empty() {
            return;
        }
        // Held already by an entry that extends it: only that entry becomes the most recent.
        if let Some(i) = self.entries.iter().position(|(t, _)| t.starts_with(tokens)) {
            let e = self.entries.remove(i);
            self.entries.push(e);
            return;
        }
        self.entries.retain(|(t, _)| !tokens.starts_with(t));
        self.entries.push((tokens.to_vec(), prefix));
        while self.bytes() > self.max_bytes {
            self.entries.remove(0);
        }
    }

    /// The KV of the longest prefix of `prompt` an entry holds, when it is longer than `more_than`
    /// tokens; the entry becomes the most recently used.
    pub fn recall(&mut self, prompt: &[u32], more_than: usize) -> Option<KvPrefix> {
        let common = |t: &[u32]| t.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let (i, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (i, common(t)))
            .filter(|&(_, n)| n > more_than)
            .max_by_key(|&(_, n)| n)?;
        let entry = self.entries.remove(i);
        let prefix = entry.1.prefix(len);
        self.entries.push(entry);
        Some(prefix)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, p)| p.bytes()).sum()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::KvBlock;

    fn prefix(tokens: &[u32]) -> KvPrefix {
        let vals: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
        KvPrefix {
            len: tokens.len(),
            layers: vec![KvBlock { d: 1, len: tokens.len(), k: vec![vals.clone()], v: vec![vals] }],
        }
    }

    #[test]
    fn the_longest_prefix_comes_back_cut_to_what_matches() {
        let mut r = RecentPrefixes::new(1 << 20);
        r.remember(&[1, 2, 3, 4], prefix(&[1, 2, 3, 4]));
        r.remember(&[1, 2, 7, 8, 9], prefix(&[1, 2, 7, 8, 9]));
        let got = r.recall(&[1, 2, 3, 5], 0).unwrap();
        assert_eq!((got.len, got.layers[0].k[0].clone()), (3, vec![1.0, 2.0, 3.0]));
        assert!(r.recall(&[1, 2, 3, 5], 3).is_none(), "no longer than asked for");
        assert!(r.recall(&[9], 0).is_none());
    }

    #[test]
    fn the_bound_drops_the_least_recently_used_and_extensions_replace() {
        let one = prefix(&[1, 2]).bytes();
        let mut r = RecentPrefixes::new(one * 3);
        r.remember(&[1, 2], prefix(&[1, 2]));
        r.remember(&[1, 2, 3, 4], prefix(&[1, 2, 3, 4]));
        assert_eq!(r.len(), 1, "the extension replaced its prefix");
        r.remember(&[5, 6], prefix(&[5, 6]));
        assert!(r.recall(&[1, 2, 3, 4], 0).is_some()); // [1,2,3,4] now the most recent
        r.remember(&[7, 8], prefix(&[7, 8]));
        assert!(r.bytes() <= one * 3);
        assert!(r.recall(&[5, 6], 0).is_none(), "the least recently used went");
        assert!(r.recall(&[1, 2, 3, 4], 0).is_some());
        r.remember(&[9; 10], prefix(&[9; 10]));
        assert!(r.recall(&[9; 10], 0).is_none(), "bigger than the bound: not kept");
        assert!(!r.would_keep(10) && r.would_keep(2), "known before copying");
        // A prefix an entry already extends is not kept twice.
        let before = r.len();
        r.remember(&[1, 2], prefix(&[1, 2]));
        assert_eq!(r.len(), before);
    }
}
