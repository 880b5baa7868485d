//! Paged KV cache bookkeeping: fixed-size blocks handed out from a free list and
//! per-sequence block tables. The K/V bytes themselves live in the backend (host memory for
//! the CPU, device memory later); this module only decides which slot a position uses.

use std::collections::HashMap;

use crate::EngineError;

/// A sequence's handle. Ids are never reused, so a stale id is an error, not someone
/// else's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

#[derive(Debug, Default)]
struct Sequence {
    blocks: Vec<u32>,
    len: usize,
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
}

impl BlockTable {
    pub fn new(n_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            n_blocks,
            free: (0..n_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            next_id: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
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
            self.free.extend(s.blocks.into_iter().rev());
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
        if need > self.free.len() {
            return Err(EngineError::OutOfKvBlocks {
                need,
                free: self.free.len(),
            });
        }
        for &(seq, extra) in requests {
            let n = self.blocks_needed(seq, extra)?;
            let at = self.free.len() - n;
            let taken: Vec<u32> = self.free.drain(at..).rev().collect();
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
}
