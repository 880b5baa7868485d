//! Special-token partitioning (llama.cpp's `tokenizer_st_partition`): before any merging, the
//! text of control, user-defined and unknown tokens is cut out of the raw text, longest token
//! first, each occurrence becoming that token. Control and unknown tokens are only looked for
//! when the caller asks to parse special tokens; user-defined ones always are. Byte ranges
//! the caller marks as plain (a chat message's content inside a rendered template) never
//! become control or unknown tokens, so text there cannot forge a turn.

use aho_corasick::AhoCorasick;

use crate::vocab::{attr, Vocab};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// A byte range of the raw text still to be tokenized.
    Text(usize, usize),
    Token(u32),
}

/// Finds which special tokens occur in a text at all, so that only those are searched for
/// fragment by fragment (a Gemma vocabulary has thousands of them).
pub(crate) struct SpecialMatcher {
    automaton: Option<AhoCorasick>,
    /// Token id per automaton pattern.
    ids: Vec<u32>,
}

impl SpecialMatcher {
    pub(crate) fn new(vocab: &Vocab) -> SpecialMatcher {
        let ids: Vec<u32> = vocab.special.clone();
        let automaton =
            AhoCorasick::new(ids.iter().map(|&i| vocab.texts[i as usize].as_bytes())).ok();
        SpecialMatcher { automaton, ids }
    }

    /// The fragments of `text`; no control or unknown token is matched where it overlaps one
    /// of the `plain` byte ranges.
    pub(crate) fn partition(
        &self,
        vocab: &Vocab,
        text: &str,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let Some(ac) = &self.automaton else {
            return frags;
        };
        // The patterns are `vocab.special` in its order (longest first), so the sorted
        // pattern indices of the matches visit the present tokens in that order, without a
        // pass over every special token (thousands in Gemma's vocabulary) for each text.
        let mut present: Vec<usize> = ac
            .find_overlapping_iter(text)
            .map(|m| m.pattern().as_usize())
            .collect();
        if present.is_empty() {
            return frags;
        }
        present.sort_unstable();
        present.dedup();
        let bytes = text.as_bytes();
        for id in present.into_iter().map(|p| self.ids[p]) {
            if !parse_special && vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = vocab.texts[id as usize].as_bytes();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                let a = vocab.attr(id);
                let guarded = a & (attr::CONTROL | attr::UNKNOWN) != 0 && !plain.is_empty();
                let mut from = start;
                while let Some(at) = find(&bytes[from..end], needle) {
                    let m = from + at;
                    if guarded
                        && plain
                            .iter()
                            .any(|r| r.start < m + needle.len() && m < r.end)
                    {
                        from = m + 1;
                        continue;
                    }
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = m + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_c_space(bytes[start]) {
                            start += 1;
                        }
                    }
                    from = start;
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r')
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}
