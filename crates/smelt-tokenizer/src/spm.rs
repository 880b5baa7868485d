//! SentencePiece BPE as llama.cpp runs it: start from characters, repeatedly merge the adjacent
//! pair whose concatenation is the highest-scoring token (ties to the leftmost), then emit each
//! symbol's token or, for a character no token spells, its byte tokens.
//!
//! (llama.cpp also keeps a map to re-split a symbol along the merges that built it, but a merged
//! symbol is always a token, so that path never runs and is left out here.)

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    len: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
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
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

/// Tokenizes `text` (spaces already escaped to U+2581) onto `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let n_chars = text.chars().count();
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            prev: i.checked_sub(1),
            next: (i + 1 < n_chars).then_some(i + 1),
            start,
            len: c.len_utf8(),
        });
    }
    let mut s = Session {
        vocab,
        text,
        symbols,
        queue: BinaryHeap::new(),
    };
    for i in 1..s.symbols.len() {
        s.try_add_bigram(Some(i - 1), Some(i));
    }
    while let Some(b) = s.queue.pop() {
        let (l, r) = (s.symbols[b.left], s.symbols[b.right]);
        // skip pairs made stale by an earlier merge
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        s.symbols[b.left].len += r.len;
        s.symbols[b.right].len = 0;
        s.symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            s.symbols[n].prev = Some(b.left);
        }
        s.try_add_bigram(l.prev, Some(b.left));
        s.try_add_bigram(Some(b.left), r.next);
    }
    let mut i = Some(0);
    while let Some(idx) = i {
        s.resegment(idx, out);
        i = s.symbols[idx].next;
    }
}

impl<'a> Session<'a> {
    fn piece(&self, start: usize, len: usize) -> &'a str {
        self.text.get(start..start + len).unwrap_or("")
    }

    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let text = self.piece(l.start, l.len + r.len);
        let Some(id) = self.vocab.id(text) else {
            return;
        };
        self.queue.push(Bigram {
            left,
            right,
            score: self.vocab.scores[id as usize],
            size: text.len(),
        });
    }

    fn resegment(&self, idx: usize, out: &mut Vec<u32>) {
        let sym = self.symbols[idx];
        let text = self.piece(sym.start, sym.len);
        if let Some(id) = self.vocab.id(text) {
            out.push(id);
            return;
        }
        for &b in text.as_bytes() {
            if let Some(id) = self.vocab.byte_token(b).or(self.vocab.unk) {
                out.push(id);
            }
        }
    }
}
