//! SentencePiece-style tokenization as llama.cpp does it for `tokenizer.ggml.model = llama` (Gemma 3):
//! spaces become `▁`, the text is split into UTF-8 characters, and adjacent pieces are merged greedily,
//! always taking the pair whose concatenation is the highest-scoring vocabulary entry (leftmost on ties).
//! Pieces left that are not in the vocabulary fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The vocabulary view the SPM merge loop needs.
pub(crate) struct Spm {
    pub(crate) lookup: HashMap<String, u32>,
    pub(crate) scores: Vec<f32>,
    /// `<0xXX>` token of each byte, when the vocabulary has it.
    pub(crate) byte_tokens: [Option<u32>; 256],
    pub(crate) unk: Option<u32>,
}

#[derive(Clone, Copy)]
struct Symbol {
    prev: isize,
    next: isize,
    start: usize,
    len: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    // Max-heap on score; on equal scores the leftmost pair wins.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm {
    /// Tokenizes one fragment of raw text (no special tokens inside), appending ids to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let text = text.replace(' ', "\u{2581}");
        let mut symbols: Vec<Symbol> = Vec::new();
        for (start, ch) in text.char_indices() {
            let n = symbols.len() as isize;
            symbols.push(Symbol { prev: n - 1, next: n + 1, start, len: ch.len_utf8() });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = -1;
        }
        let mut heap = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_add_bigram(&text, &symbols, i - 1, i, &mut heap);
        }
        while let Some(bigram) = heap.pop() {
            let (l, r) = (bigram.left, bigram.right);
            let (left, right) = (symbols[l], symbols[r]);
            // Skip stale entries: one side has been merged away or grown since this pair was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue;
            }
            symbols[l].len += right.len;
            symbols[r].len = 0;
            symbols[l].next = right.next;
            if right.next >= 0 {
                symbols[right.next as usize].prev = l as isize;
            }
            if symbols[l].prev >= 0 {
                self.try_add_bigram(&text, &symbols, symbols[l].prev as usize, l, &mut heap);
            }
            if symbols[l].next >= 0 {
                self.try_add_bigram(&text, &symbols, l, symbols[l].next as usize, &mut heap);
            }
        }
        let mut i: isize = if symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = symbols[i as usize];
            self.resegment(&text, s.start, s.len, out);
            i = s.next;
        }
    }

    fn try_add_bigram(&self, text: &str, symbols: &[Symbol], l: usize, r: usize, heap: &mut BinaryHeap<Bigram>) {
        let (a, b) = (symbols[l], symbols[r]);
        let piece = &text[a.start..b.start + b.len];
        if let Some(&id) = self.lookup.get(piece) {
            heap.push(Bigram { left: l, right: r, score: self.scores[id as usize], len: piece.len() });
        }
    }

    /// Emits the token for `text[start..start+len]`, or its bytes when it is not a vocabulary entry.
    /// Merged pieces are always vocabulary entries, so only single characters can fall back to bytes.
    fn resegment(&self, text: &str, start: usize, len: usize, out: &mut Vec<u32>) {
        let piece = &text[start..start + len];
        if let Some(&id) = self.lookup.get(piece) {
            out.push(id);
            return;
        }
        for &b in piece.as_bytes() {
            if let Some(id) = self.byte_tokens[b as usize].or(self.unk) {
                out.push(id);
            }
        }
    }
}
