//! Paged KV cache bookkeeping: fixed-size blocks handed out from a free list and
//! per-sequence block tables. The K/V bytes themselves live in the backend (host memory for
//! the CPU, device memory later); this module only decides which slot a position uses.
//!
//! Prefix caching: once a block is full, it is registered under a hash of its tokens chained
//! with the hashes of every block before it (so equal hashes mean equal whole prefixes, at
//! the same positions). A new sequence whose prompt starts with registered blocks takes them
//! ([`BlockTable::attach_prefix`]) and starts computing after them. Blocks are reference
//! counted; a registered block no sequence holds stays cached, and the least recently used
//! of those is reused when the free list runs out. Full blocks are never written again, so
//! sharing needs no copies. The hash is SipHash with per-table random keys: a client cannot
//! craft a collision to read another's cache.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use crate::EngineError;

/// A sequence's handle. Ids are never reused, so a stale id is an error, not someone
/// else's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

#[derive(Debug, Default)]
struct Sequence {
    blocks: Vec<u32>,
    len: usize,
    /// The tokens in its cache, while they are known in order ([`BlockTable::record`]).
    tokens: Vec<u32>,
    /// Chain hashes of its full blocks, in order.
    hashes: Vec<u64>,
    /// A step's tokens were not recorded: its later blocks are never registered.
    untracked: bool,
}

/// Blocks of `block_size` token slots, shared by all sequences.
#[derive(Debug)]
pub struct BlockTable {
    block_size: usize,
    n_blocks: usize,
    /// Free blocks, popped from the end; freed blocks go back at the end so recently
    /// used (cache-warm) blocks are reused first.
    free: Vec<u32>,
    seqs: HashMap<SeqId, Sequence>,
    next_id: u64,
    /// Prefix caching on (off for models whose state is not all in these blocks).
    prefix: bool,
    hasher: RandomState,
    /// Registered full blocks: chain hash -> block.
    cached: HashMap<u64, u32>,
    /// Per block: its chain hash when registered, how many sequences hold it, and its
    /// place in `idle` while none does.
    hash_of: Vec<Option<u64>>,
    refs: Vec<u32>,
    idle_tick: Vec<u64>,
    /// Registered blocks no sequence holds, least recently used first.
    idle: BTreeMap<u64, u32>,
    tick: u64,
    /// Prompt tokens looked up and found in the prefix cache.
    pub prefix_queried: u64,
    pub prefix_hits: u64,
}

impl BlockTable {
    pub fn new(n_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            n_blocks,
            free: (0..n_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            next_id: 0,
            prefix: true,
            hasher: RandomState::new(),
            cached: HashMap::new(),
            hash_of: vec![None; n_blocks],
            refs: vec![0; n_blocks],
            idle_tick: vec![0; n_blocks],
            idle: BTreeMap::new(),
            tick: 0,
            prefix_queried: 0,
            prefix_hits: 0,
        }
    }

    /// Whether prefix caching is on.
    pub fn prefix_cache_on(&self) -> bool {
        self.prefix
    }

    /// Turns prefix caching on or off; off drops what is cached.
    pub fn set_prefix_cache(&mut self, on: bool) {
        self.prefix = on;
        if !on {
            for (_, b) in std::mem::take(&mut self.idle) {
                self.hash_of[b as usize] = None;
                self.free.push(b);
            }
            for (_, b) in std::mem::take(&mut self.cached) {
                self.hash_of[b as usize] = None;
            }
        }
    }

    fn chain(&self, prev: u64, block: &[u32]) -> u64 {
        self.hasher.hash_one((prev, block))
    }

    /// Gives a fresh sequence the registered blocks its `tokens` start with (full blocks
    /// only, and never the last token, whose logits the caller needs), and says how many
    /// tokens they hold: the caller feeds the rest.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let fresh = self.seqs.get(&seq).is_some_and(|s| s.len == 0);
        if !self.prefix || !fresh || tokens.len() < 2 {
            return 0;
        }
        let full = (tokens.len() - 1) / bs;
        let mut prev = 0u64;
        let mut taken = Vec::new();
        for i in 0..full {
            let h = self.chain(prev, &tokens[i * bs..(i + 1) * bs]);
            let Some(&b) = self.cached.get(&h) else {
                break;
            };
            if self.refs[b as usize] == 0 {
                self.idle.remove(&self.idle_tick[b as usize]);
            }
            self.refs[b as usize] += 1;
            taken.push((b, h));
            prev = h;
        }
        let n = taken.len() * bs;
        self.prefix_queried += (full * bs) as u64;
        self.prefix_hits += n as u64;
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.blocks = taken.iter().map(|&(b, _)| b).collect();
            s.hashes = taken.iter().map(|&(_, h)| h).collect();
            s.tokens = tokens[..n].to_vec();
            s.len = n;
        }
        n
    }

    /// Notes the tokens a step wrote for `seq` at `start` and registers the blocks they
    /// filled. A step that was not recorded (or not in order) stops the sequence's
    /// registering: its hashes would no longer match its cache.
    pub fn record(&mut self, seq: SeqId, start: usize, tokens: &[u32]) {
        let bs = self.block_size;
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        if !self.prefix || s.untracked {
            return;
        }
        if s.tokens.len() != start {
            s.untracked = true;
            s.tokens.clear();
            return;
        }
        s.tokens.extend_from_slice(tokens);
        let mut new = Vec::new();
        let mut prev = s.hashes.last().copied().unwrap_or(0);
        for i in s.hashes.len()..s.tokens.len() / bs {
            let h = self
                .hasher
                .hash_one((prev, &s.tokens[i * bs..(i + 1) * bs]));
            new.push((s.blocks[i], h));
            prev = h;
        }
        s.hashes.extend(new.iter().map(|&(_, h)| h));
        for (b, h) in new {
            if self.hash_of[b as usize].is_none() && !self.cached.contains_key(&h) {
                self.cached.insert(h, b);
                self.hash_of[b as usize] = Some(h);
            }
        }
    }

    /// Takes a block for a sequence: from the free list, else the least recently used
    /// idle cached one (forgotten).
    fn take_block(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.idle.pop_first()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.cached.remove(&h);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// A sequence lets go of a block: back to the free list, or kept as an idle cached
    /// block while registered.
    fn release_block(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r = r.saturating_sub(1);
        if *r > 0 {
            return;
        }
        if self.hash_of[b as usize].is_some() {
            self.tick += 1;
            self.idle_tick[b as usize] = self.tick;
            self.idle.insert(self.tick, b);
        } else {
            self.free.push(b);
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks a sequence could take: free ones and idle cached ones.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    pub fn new_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    /// Returns the sequence's blocks to the free list; unknown ids are ignored (freeing
    /// twice is harmless).
    pub fn free_sequence(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            for b in s.blocks.into_iter().rev() {
                self.release_block(b);
            }
        }
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.len)
    }

    pub fn blocks(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// Blocks a sequence needs to grow by `extra` tokens.
    pub fn blocks_needed(&self, seq: SeqId, extra: usize) -> Result<usize, EngineError> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(EngineError::UnknownSequence(seq.0))?;
        let want = (s.len + extra).div_ceil(self.block_size);
        Ok(want.saturating_sub(s.blocks.len()))
    }

    /// Grows every `(seq, extra)` at once, or none of them when the free list is short, so
    /// a refused batch leaves the cache as it was.
    pub fn grow(&mut self, requests: &[(SeqId, usize)]) -> Result<(), EngineError> {
        let mut need = 0;
        for &(seq, extra) in requests {
            need += self.blocks_needed(seq, extra)?;
        }
        if need > self.free_blocks() {
            return Err(EngineError::OutOfKvBlocks {
                need,
                free: self.free_blocks(),
            });
        }
        for &(seq, extra) in requests {
            let n = self.blocks_needed(seq, extra)?;
            let taken: Vec<u32> = (0..n).filter_map(|_| self.take_block()).collect();
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.blocks.extend(taken);
                s.len += extra;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_and_go() {
        let mut t = BlockTable::new(4, 16);
        let a = t.new_sequence();
        let b = t.new_sequence();
        t.grow(&[(a, 17), (b, 16)]).unwrap();
        assert_eq!(t.blocks(a).unwrap().len(), 2);
        assert_eq!(t.blocks(b).unwrap().len(), 1);
        assert_eq!(t.free_blocks(), 1);
        // 15 more tokens fit in a's second block.
        t.grow(&[(a, 15)]).unwrap();
        assert_eq!(t.free_blocks(), 1);
        let err = t.grow(&[(a, 1), (b, 1)]).unwrap_err();
        assert!(matches!(
            err,
            EngineError::OutOfKvBlocks { need: 2, free: 1 }
        ));
        // A refused batch changes nothing.
        assert_eq!(t.seq_len(a), Some(32));
        assert_eq!(t.seq_len(b), Some(16));
        t.free_sequence(a);
        assert_eq!(t.free_blocks(), 3);
        assert!(t.grow(&[(a, 1)]).is_err());
        t.grow(&[(b, 40)]).unwrap();
        assert_eq!(t.free_blocks(), 0);
        t.free_sequence(b);
        t.free_sequence(b);
        assert_eq!(t.free_blocks(), 4);
    }

    /// Grows `seq` by `tokens` and records them, as a step does.
    fn feed(t: &mut BlockTable, seq: SeqId, tokens: &[u32]) {
        let start = t.seq_len(seq).unwrap();
        t.grow(&[(seq, tokens.len())]).unwrap();
        t.record(seq, start, tokens);
    }

    #[test]
    fn prefixes_are_shared_counted_and_evicted() {
        let mut t = BlockTable::new(6, 4);
        let prompt: Vec<u32> = (0..10).collect();
        let a = t.new_sequence();
        assert_eq!(t.attach_prefix(a, &prompt), 0);
        feed(&mut t, a, &prompt);
        // Two full blocks registered; a second sequence with the same start shares them.
        let b = t.new_sequence();
        let mut other = prompt[..8].to_vec();
        other.extend([50, 51, 52]);
        assert_eq!(t.attach_prefix(b, &other), 8);
        assert_eq!(t.blocks(b).unwrap(), &t.blocks(a).unwrap()[..2]);
        assert_eq!(t.seq_len(b), Some(8));
        feed(&mut t, b, &other[8..]);
        assert_eq!(t.free_blocks(), 2);
        // Never the last token: a prompt of exactly 8 reuses one block.
        let c = t.new_sequence();
        assert_eq!(t.attach_prefix(c, &prompt[..8]), 4);
        t.free_sequence(c);
        // A different first block shares nothing (the hash chains).
        let d = t.new_sequence();
        let mut shifted = prompt.clone();
        shifted[0] = 99;
        assert_eq!(t.attach_prefix(d, &shifted), 0);
        t.free_sequence(d);
        // Freed, the shared blocks stay cached while idle ...
        t.free_sequence(a);
        t.free_sequence(b);
        assert_eq!(t.free_blocks(), 6);
        let e = t.new_sequence();
        assert_eq!(t.attach_prefix(e, &prompt), 8);
        t.free_sequence(e);
        // ... until the free list runs out: then the least recently used go.
        let f = t.new_sequence();
        t.grow(&[(f, 24)]).unwrap();
        assert_eq!(t.free_blocks(), 0);
        t.free_sequence(f);
        let g = t.new_sequence();
        assert_eq!(t.attach_prefix(g, &prompt), 0);
        assert_eq!(
            (t.prefix_queried, t.prefix_hits),
            (8 + 8 + 4 + 8 + 8 + 8, 8 + 4 + 8)
        );
        // Off: nothing is attached.
        t.set_prefix_cache(false);
        let h = t.new_sequence();
        feed(&mut t, h, &prompt);
        let i = t.new_sequence();
        assert_eq!(t.attach_prefix(i, &prompt), 0);
    }
}
