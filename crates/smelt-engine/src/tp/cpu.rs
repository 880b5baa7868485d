//! Tensor parallelism simulated on the CPU: each rank of a [`ShardPlan`] is a thread with
//! its own model slices and KV cache, and the all-reduce is a sum through shared memory.
//! This is the reference the GPU runner is checked against, and what proves the plan (a
//! sharded forward equals the whole model's) before any GPU runs it. A hybrid model's
//! ranks each keep every sequence's recurrent state for their own delta-net heads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use smelt_gguf::Gguf;

use super::plan::{ShardPlan, TpOptions};
use super::shard::rank_gguf;
use crate::backend::cpu::{Cpu, CpuKv, CpuTensor};
use crate::backend::{AttnSeq, Backend, DeltaState};
use crate::kv_cache::SeqId;
use crate::model::{AllReduce, Model};
use crate::EngineError;

/// An all-reduce between threads: every rank adds its part, all get the sum, added in
/// rank order (so every rank's result is the same bits, as NCCL's is).
pub struct SimComm {
    n: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f32>>>,
    /// Calls of the fused all-reduce + add + norm op, over every rank (what the model asks
    /// for as one op, `AllReduce::all_reduce_add_norm`; a test counts them).
    pub fused_calls: AtomicUsize,
}

impl SimComm {
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(SimComm {
            n,
            barrier: Barrier::new(n),
            slots: Mutex::new(vec![Vec::new(); n]),
            fused_calls: AtomicUsize::new(0),
        })
    }

    /// Sums `data` over the ranks (each rank calls it once per reduction, in the same order).
    pub fn all_reduce(&self, rank: usize, data: &mut [f32]) {
        if self.n == 1 {
            return;
        }
        {
            let mut s = self.slots.lock().expect("sim comm");
            s[rank].clear();
            s[rank].extend_from_slice(data);
        }
        self.barrier.wait();
        {
            let s = self.slots.lock().expect("sim comm");
            for (i, d) in data.iter_mut().enumerate() {
                let mut acc = s[0][i];
                for part in &s[1..] {
                    acc += part[i];
                }
                *d = acc;
            }
        }
        // Nobody overwrites a slot before everyone has read them all.
        self.barrier.wait();
    }
}

/// Writes the `rows x cols` block `part` at column `start` of the `rows x total` `out`.
pub fn place_cols(
    out: &mut [f32],
    part: &[f32],
    rows: usize,
    cols: usize,
    start: usize,
    total: usize,
) -> Result<(), EngineError> {
    if start + cols > total || out.len() < rows * total || part.len() < rows * cols {
        return Err(EngineError::BadOptions(format!(
            "columns {start}..{} of {total} ({rows} rows)",
            start + cols
        )));
    }
    for r in 0..rows {
        out[r * total + start..r * total + start + cols]
            .copy_from_slice(&part[r * cols..(r + 1) * cols]);
    }
    Ok(())
}

/// One rank's handle on a [`SimComm`].
pub struct SimReduce {
    pub comm: Arc<SimComm>,
    pub rank: usize,
}

impl AllReduce<Cpu> for SimReduce {
    fn all_reduce(&self, _b: &Cpu, x: &mut CpuTensor) -> Result<(), EngineError> {
        let n = x.rows * x.cols;
        self.comm.all_reduce(self.rank, &mut x.data[..n]);
        Ok(())
    }

    fn all_reduce_add_norm(
        &self,
        b: &Cpu,
        o: &mut CpuTensor,
        x: &mut CpuTensor,
        w: &<Cpu as Backend>::Weight,
        eps: f32,
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        self.comm.fused_calls.fetch_add(1, Ordering::Relaxed);
        // The three ops, as the trait's default does them (the CPU has no launch to save).
        self.all_reduce(b, o)?;
        b.add(x, o);
        b.rms_norm(x, w, eps, out);
        Ok(())
    }

    fn gather_cols(
        &self,
        b: &Cpu,
        part: &CpuTensor,
        start: usize,
        total: usize,
    ) -> Result<CpuTensor, EngineError> {
        // As the GPU does it: the part in place in a zeroed whole, then the sum (adding
        // zeros changes no bits).
        let mut out = b.alloc(part.rows, total);
        place_cols(
            &mut out.data,
            &part.data,
            part.rows,
            part.cols,
            start,
            total,
        )?;
        self.all_reduce(b, &mut out)?;
        Ok(out)
    }
}

struct Rank {
    model: Model<Cpu>,
    kv: CpuKv,
    reduce: SimReduce,
    /// Each sequence's recurrent state for this rank's delta-net heads.
    states: HashMap<SeqId, Vec<DeltaState<CpuTensor>>>,
}

/// A model split over `n` simulated ranks.
pub struct CpuTp {
    pub plan: ShardPlan,
    ranks: Vec<Rank>,
}

impl CpuTp {
    /// Shards `gguf` for `opts.n_ranks` ranks, each with a KV cache of `n_blocks` blocks.
    pub fn load(
        gguf: &Gguf,
        opts: TpOptions,
        n_blocks: usize,
        block_size: usize,
    ) -> Result<Self, EngineError> {
        let plan = ShardPlan::new(gguf, opts)?;
        let comm = SimComm::new(opts.n_ranks);
        let mut ranks = Vec::with_capacity(opts.n_ranks);
        for r in 0..opts.n_ranks {
            let g = Arc::new(rank_gguf(gguf, &plan, r)?);
            let model = Model::load(&Cpu::GGML, &g)?;
            let i = &model.info;
            let kv = Cpu::GGML.kv_alloc(i.n_layer, n_blocks, block_size, i.n_head_kv * i.head_dim);
            ranks.push(Rank {
                model,
                kv,
                reduce: SimReduce {
                    comm: comm.clone(),
                    rank: r,
                },
                states: HashMap::new(),
            });
        }
        Ok(CpuTp { plan, ranks })
    }

    /// How many times the ranks ran the fused all-reduce + add + norm op, over all ranks.
    pub fn fused_calls(&self) -> usize {
        self.ranks
            .first()
            .map_or(0, |r| r.reduce.comm.fused_calls.load(Ordering::Relaxed))
    }

    /// Each rank's model (its shapes are the rank's).
    pub fn rank_model(&self, r: usize) -> &Model<Cpu> {
        &self.ranks[r].model
    }

    /// One step on every rank at once; returns every rank's logits (all equal: each rank
    /// computes the whole output head from the same all-reduced activations). Sequence `i`
    /// of `seqs` is sequence id `i` (for a hybrid's recurrent state: see
    /// [`CpuTp::forward_seqs`]).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let ids: Vec<SeqId> = (0..seqs.len() as u64).map(SeqId).collect();
        self.forward_seqs(&ids, tokens, positions, seqs, out_rows)
    }

    /// [`CpuTp::forward`] of the sequences `ids` (in `seqs` order): each rank reads and
    /// advances their recurrent states (made at a sequence's first step).
    pub fn forward_seqs(
        &mut self,
        ids: &[SeqId],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        if ids.len() != seqs.len() {
            return Err(EngineError::BadOptions(format!(
                "{} sequence ids for {} sequences",
                ids.len(),
                seqs.len()
            )));
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .map(|r| {
                    s.spawn(move || {
                        let hybrid = r.model.info.delta.is_some();
                        let mut taken: Vec<Vec<DeltaState<CpuTensor>>> = if hybrid {
                            ids.iter()
                                .map(|id| {
                                    r.states
                                        .remove(id)
                                        .unwrap_or_else(|| r.model.new_state(&Cpu::GGML))
                                })
                                .collect()
                        } else {
                            Vec::new()
                        };
                        let mut refs: Vec<&mut Vec<_>> = taken.iter_mut().collect();
                        let red: &dyn AllReduce<Cpu> = &r.reduce;
                        let ran = r
                            .model
                            .forward_tp(
                                &Cpu::GGML,
                                &mut r.kv,
                                &mut refs,
                                tokens,
                                positions,
                                seqs,
                                out_rows,
                                Some(red),
                            )
                            .map(|t| t.data[..t.rows * t.cols].to_vec());
                        drop(refs);
                        if hybrid {
                            r.states.extend(ids.iter().copied().zip(taken));
                        }
                        ran
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread panicked"))
                .collect()
        })
    }

    /// Drops sequence `id`'s recurrent state on every rank.
    pub fn free_state(&mut self, id: SeqId) {
        for r in &mut self.ranks {
            r.states.remove(&id);
        }
    }

    /// Sequences holding a recurrent state on rank `r`.
    pub fn n_states(&self, r: usize) -> usize {
        self.ranks[r].states.len()
    }
}
