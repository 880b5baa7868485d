//! What changes from one step to the next, and when a step can be a graph replay.
//!
//! Kernels read token ids, positions, per-sequence descriptors and block tables from
//! device memory (the GPU contract), so a decode step's launches are the same from one
//! token to the next: only these words change. They are written into one pinned host
//! buffer and copied to the device with one copy at the start of the step; captured into
//! the graph, that copy reads the host buffer again at every replay.

use std::collections::{HashMap, HashSet};

use crate::backend::AttnSeq;
use crate::EngineError;

/// Word offsets of the sections of the step buffer (all u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLayout {
    /// Most tokens (activation rows) of a step.
    pub cap_tokens: usize,
    /// Most sequences of a step.
    pub cap_seqs: usize,
    /// Most block-table entries of a step (all its sequences' tables).
    pub cap_blocks: usize,
}

/// One sequence's descriptor as the kernels read it: `{row, n_tokens, start_pos,
/// block_table_offset}`.
pub const DESC_WORDS: usize = 4;

impl StepLayout {
    /// Room for at least the given counts, rounded up so small growth does not reallocate
    /// (and invalidate graphs) every step.
    pub fn with_room(tokens: usize, seqs: usize, blocks: usize) -> Self {
        let up = |n: usize, min: usize| n.max(min).next_power_of_two();
        Self {
            cap_tokens: up(tokens, 64),
            cap_seqs: up(seqs, 16),
            cap_blocks: up(blocks, 256),
        }
    }

    pub fn tokens(&self) -> usize {
        0
    }
    pub fn positions(&self) -> usize {
        self.cap_tokens
    }
    pub fn descs(&self) -> usize {
        2 * self.cap_tokens
    }
    pub fn block_tables(&self) -> usize {
        self.descs() + DESC_WORDS * self.cap_seqs
    }
    /// Each sequence's recurrent-state address (a u64 in two words, in sequence order;
    /// hybrid models): even, so 8-byte aligned (the capacities are powers of two).
    pub fn state_addrs(&self) -> usize {
        self.block_tables() + self.cap_blocks
    }
    /// Words in all.
    pub fn words(&self) -> usize {
        self.state_addrs() + 2 * self.cap_seqs
    }

    /// Whether a step of this size fits.
    pub fn fits(&self, tokens: usize, seqs: usize, blocks: usize) -> bool {
        tokens <= self.cap_tokens && seqs <= self.cap_seqs && blocks <= self.cap_blocks
    }

    /// Writes a step's inputs into `words` (`self.words()` long). The sequences' block
    /// tables are concatenated in order; each descriptor points at its own.
    pub fn fill(
        &self,
        words: &mut [u32],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
    ) -> Result<(), EngineError> {
        let blocks: usize = seqs.iter().map(|s| s.blocks.len()).sum();
        if words.len() != self.words()
            || tokens.len() != positions.len()
            || !self.fits(tokens.len(), seqs.len(), blocks)
        {
            return Err(EngineError::BadOptions(format!(
                "step of {} tokens, {} positions, {} sequences, {blocks} blocks does not fit {self:?}",
                tokens.len(),
                positions.len(),
                seqs.len()
            )));
        }
        words[..tokens.len()].copy_from_slice(tokens);
        let p = self.positions();
        words[p..p + positions.len()].copy_from_slice(positions);
        let mut bt = 0usize;
        for (i, s) in seqs.iter().enumerate() {
            let d = self.descs() + DESC_WORDS * i;
            let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            words[d] = as_u32(s.row);
            words[d + 1] = as_u32(s.n_tokens);
            words[d + 2] = as_u32(s.start_pos);
            words[d + 3] = as_u32(bt);
            let o = self.block_tables() + bt;
            words[o..o + s.blocks.len()].copy_from_slice(s.blocks);
            bt += s.blocks.len();
        }
        Ok(())
    }
}

/// The shape of a step that a captured graph replays: a decode step (one new token per
/// sequence, rows in sequence order) with the same sequences-count and logits rows. Token
/// ids, positions and block tables may differ: kernels read them from the step buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub n_seqs: usize,
    pub out_rows: Vec<usize>,
    /// The step ends with the greedy tokens of its rows instead of their logits.
    pub greedy: bool,
}

impl GraphKey {
    /// The key of a decode step, or `None` for any other step (prefill chunks run eagerly).
    pub fn decode(seqs: &[AttnSeq<'_>], out_rows: &[usize], greedy: bool) -> Option<GraphKey> {
        let decode = !seqs.is_empty()
            && seqs
                .iter()
                .enumerate()
                .all(|(i, s)| s.n_tokens == 1 && s.row == i);
        decode.then(|| GraphKey {
            n_seqs: seqs.len(),
            out_rows: out_rows.to_vec(),
            greedy,
        })
    }
}

/// What to do with a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Launch kernel by kernel (first sight of a shape, or not a decode step).
    Eager,
    /// Run it under stream capture, keep the graph and replay it.
    Capture,
    /// Replay the graph captured for this shape.
    Replay,
}

/// Captured graphs by shape. A shape is captured the second time it is seen (the first,
/// eager run sizes the scratch and loads the kernels), and all graphs are dropped when the
/// scratch or step buffers move (their addresses are baked into the graphs).
pub struct GraphCache<G> {
    graphs: HashMap<GraphKey, G>,
    seen: HashSet<GraphKey>,
    generation: u64,
    max: usize,
}

impl<G> GraphCache<G> {
    pub fn new(max: usize) -> Self {
        Self {
            graphs: HashMap::new(),
            seen: HashSet::new(),
            generation: 0,
            max: max.max(1),
        }
    }

    /// The plan for a step with `key` while buffers are at `generation`.
    pub fn plan(&mut self, key: Option<&GraphKey>, generation: u64) -> Plan {
        if generation != self.generation {
            self.graphs.clear();
            self.seen.clear();
            self.generation = generation;
        }
        let Some(key) = key else {
            return Plan::Eager;
        };
        if self.graphs.contains_key(key) {
            Plan::Replay
        } else if self.seen.contains(key) {
            Plan::Capture
        } else {
            // Shapes seen once are only a hint: forget them all rather than grow forever.
            if self.seen.len() >= 4 * self.max {
                self.seen.clear();
            }
            self.seen.insert(key.clone());
            Plan::Eager
        }
    }

    pub fn get(&self, key: &GraphKey) -> Option<&G> {
        self.graphs.get(key)
    }

    /// Keeps a captured graph (dropping all when full: shapes come and go with the batch).
    pub fn insert(&mut self, key: GraphKey, g: G) {
        if self.graphs.len() >= self.max {
            self.graphs.clear();
        }
        self.graphs.insert(key, g);
    }

    /// Forgets a shape whose capture failed, so it runs eagerly from now on.
    pub fn give_up(&mut self, key: &GraphKey) {
        self.graphs.remove(key);
    }

    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(row: usize, n_tokens: usize, start_pos: usize, blocks: &[u32]) -> AttnSeq<'_> {
        AttnSeq {
            row,
            n_tokens,
            start_pos,
            blocks,
        }
    }

    #[test]
    fn fill_lays_out_descriptors_and_concatenated_tables() {
        let l = StepLayout::with_room(3, 2, 5);
        let mut w = vec![0xDEADu32; l.words()];
        let (b0, b1) = ([7u32, 8], [3u32, 4, 9]);
        let seqs = [seq(0, 2, 30, &b0), seq(2, 1, 40, &b1)];
        l.fill(&mut w, &[11, 12, 13], &[30, 31, 40], &seqs).unwrap();
        assert_eq!(&w[..3], &[11, 12, 13]);
        assert_eq!(&w[l.positions()..l.positions() + 3], &[30, 31, 40]);
        assert_eq!(&w[l.descs()..l.descs() + 8], &[0, 2, 30, 0, 2, 1, 40, 2]);
        assert_eq!(&w[l.block_tables()..l.block_tables() + 5], &[7, 8, 3, 4, 9]);
        // Sections do not overlap.
        assert!(l.positions() >= 3 && l.descs() >= l.positions() + 3);
        assert!(l.block_tables() >= l.descs() + 8 && l.state_addrs() >= l.block_tables() + 5);
        assert!(l.state_addrs().is_multiple_of(2) && l.words() >= l.state_addrs() + 2 * 2);
    }

    #[test]
    fn fill_refuses_what_does_not_fit() {
        let l = StepLayout::with_room(1, 1, 1);
        let mut w = vec![0u32; l.words()];
        let many = vec![1u32; l.cap_tokens + 1];
        assert!(l.fill(&mut w, &many, &many, &[]).is_err());
        assert!(l.fill(&mut w, &[1, 2], &[1], &[]).is_err());
        let mut short = vec![0u32; 3];
        assert!(l.fill(&mut short, &[1], &[1], &[]).is_err());
        let big = StepLayout::with_room(l.cap_tokens + 1, 1, 1);
        assert!(big.fits(l.cap_tokens + 1, 1, 1) && !l.fits(l.cap_tokens + 1, 1, 1));
    }

    #[test]
    fn only_decode_steps_have_a_graph_key() {
        let b = [0u32];
        let decode = [seq(0, 1, 5, &b), seq(1, 1, 9, &b)];
        let k = GraphKey::decode(&decode, &[0, 1], false).unwrap();
        assert_eq!(k.n_seqs, 2);
        // Positions and blocks do not enter the key.
        let moved = [seq(0, 1, 6, &b), seq(1, 1, 100, &[4, 5])];
        assert_eq!(GraphKey::decode(&moved, &[0, 1], false), Some(k.clone()));
        // Other logits rows, or tokens instead of logits: another graph.
        assert_ne!(GraphKey::decode(&decode, &[1], false), Some(k.clone()));
        assert_ne!(GraphKey::decode(&decode, &[0, 1], true), Some(k));
        // Prefill (several tokens) or an empty step: none.
        assert!(GraphKey::decode(&[seq(0, 3, 0, &b)], &[2], false).is_none());
        assert!(GraphKey::decode(&[], &[], true).is_none());
    }

    #[test]
    fn a_shape_is_captured_on_second_sight_and_replayed_after() {
        let mut c: GraphCache<&str> = GraphCache::new(4);
        let k = GraphKey {
            n_seqs: 1,
            out_rows: vec![0],
            greedy: false,
        };
        assert_eq!(c.plan(None, 0), Plan::Eager);
        assert_eq!(c.plan(Some(&k), 0), Plan::Eager);
        assert_eq!(c.plan(Some(&k), 0), Plan::Capture);
        c.insert(k.clone(), "g");
        assert_eq!(c.plan(Some(&k), 0), Plan::Replay);
        assert_eq!(c.get(&k), Some(&"g"));
        // Buffers moved: everything is forgotten, the shape starts over.
        assert_eq!(c.plan(Some(&k), 1), Plan::Eager);
        assert!(c.is_empty());
        assert_eq!(c.plan(Some(&k), 1), Plan::Capture);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut c: GraphCache<usize> = GraphCache::new(2);
        for n in 1..10 {
            let k = GraphKey {
                n_seqs: n,
                out_rows: (0..n).collect(),
                greedy: false,
            };
            c.insert(k, n);
            assert!(c.len() <= 2);
        }
    }
}
