//! Byte-level BPE as llama.cpp runs it: each pre-tokenized word starts as characters of the
//! GPT-2 byte alphabet; the adjacent pair with the lowest merge rank (ties to the leftmost) is
//! merged until no ranked pair is left; each symbol becomes its token, or its single bytes'
//! tokens when no token spells it.

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
    rank: u32,
    /// The merged text's byte range in the word, to detect pairs made stale by other merges.
    start: usize,
    len_left: usize,
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
    /// Max-heap order: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Merges one word (already in the byte alphabet) and appends its tokens to `out`.
pub(crate) fn tokenize_word(vocab: &Vocab, word: &str, key: &mut String, out: &mut Vec<u32>) {
    if word.is_empty() {
        return;
    }
    if vocab.ignore_merges {
        if let Some(id) = vocab.id(word) {
            out.push(id);
            return;
        }
    }
    let n_chars = word.chars().count();
    let mut symbols: Vec<Symbol> = word
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            prev: i.checked_sub(1),
            next: (i + 1 < n_chars).then_some(i + 1),
            start,
            len: c.len_utf8(),
        })
        .collect();

    let mut queue = BinaryHeap::new();
    let add = |symbols: &[Symbol],
               queue: &mut BinaryHeap<Bigram>,
               key: &mut String,
               l: Option<usize>,
               r: Option<usize>| {
        let (Some(left), Some(right)) = (l, r) else {
            return;
        };
        let (ls, rs) = (symbols[left], symbols[right]);
        let (lt, rt) = (
            &word[ls.start..ls.start + ls.len],
            &word[rs.start..rs.start + rs.len],
        );
        key.clear();
        key.push_str(lt);
        key.push(' ');
        key.push_str(rt);
        if let Some(&rank) = vocab.merges.get(key.as_str()) {
            queue.push(Bigram {
                left,
                right,
                rank,
                start: ls.start,
                len_left: ls.len,
                len: ls.len + rs.len,
            });
        }
    };
    for i in 1..symbols.len() {
        add(&symbols, &mut queue, key, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 {
            continue;
        }
        // llama.cpp compares the pair's current text with the text it was queued with; symbols
        // only grow rightwards from fixed starts, so equal lengths mean equal text
        if l.start != b.start
            || l.len != b.len_left
            || l.len + r.len != b.len
            || r.start != l.start + l.len
        {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        add(&symbols, &mut queue, key, l.prev, Some(b.left));
        add(&symbols, &mut queue, key, Some(b.left), r.next);
    }

    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        i = s.next;
        if s.len == 0 {
            continue;
        }
        let text = &word[s.start..s.start + s.len];
        match vocab.id(text) {
            Some(id) => out.push(id),
            None => {
                // llama.cpp looks each *byte* up as a one-byte string, so only ASCII can hit
                for &b in text.as_bytes() {
                    if let Some(id) = std::str::from_utf8(&[b]).ok().and_then(|s| vocab.id(s)) {
                        out.push(id);
                    }
                }
            }
        }
    }
}
