//! A model on a GPU: the [`Cuda`] backend, the model's weights on it, its KV cache, and
//! the decode-step graphs.
//!
//! A step runs in one of three ways ([`Plan`]): eagerly (op by op), under stream capture
//! (the first time a decode shape repeats: the graph is kept), or as a replay of the graph
//! captured for its shape, after the host has rewritten the pinned step buffer. A replay
//! costs one graph launch instead of hundreds of kernel launches.
//!
//! The KV cache is sized at load ([`KvPlan`]): a fixed number of blocks, or what fits in a
//! fraction of the device's memory once the weights are loaded and one step of the largest
//! size has run (its activations measured, as vLLM's profile run measures them).

use std::collections::HashMap;
use std::sync::Arc;

use smelt_cuda::{CudaError, Graph};
use smelt_gguf::Gguf;

use super::delta::{self, SeqState};
use super::step::{GraphCache, GraphKey, Plan};
use super::{Cuda, CudaKv, CudaTensor};
use crate::backend::{AttnSeq, Backend, DeltaState};
use crate::gpu_memory::{self, GpuMemory};
use crate::kv_cache::SeqId;
use crate::model::{AllReduce, Model};
use crate::EngineError;

/// How big a KV cache [`CudaEngine::load`] allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// The least blocks it must hold (all of it without `fill`).
    pub min_blocks: usize,
    pub block_size: usize,
    /// Fill this fraction of the device's memory, measured after a step of this many tokens.
    pub fill: Option<(GpuMemory, usize)>,
}

/// Graphs kept at once (one per decode batch size in use).
const MAX_GRAPHS: usize = 32;

struct Captured {
    graph: Graph,
    /// The step's result on the device: the logits, or the greedy tokens.
    out: CudaTensor,
}

/// The step's sequences' recurrent states, as the model takes them.
type States<'a, 'b> = &'a mut [&'b mut Vec<DeltaState<CudaTensor>>];

/// What a step hands back to the host.
pub enum StepOut {
    /// The logits of the rows asked for, flat.
    Logits(Vec<f32>),
    /// The greedy token of each row asked for (chosen on the device: the logits never
    /// leave it).
    Tokens(Vec<u32>),
}

/// `logits`, or with `greedy` each row's greedy token (`argmax_rows`, launched on the
/// step's stream, so inside its graph when captured) in a tensor of one word per row.
fn step_result(backend: &Cuda, logits: CudaTensor, greedy: bool) -> Result<CudaTensor, CudaError> {
    if !greedy || logits.rows == 0 {
        return Ok(logits);
    }
    let tokens = backend.alloc(logits.rows, 1);
    backend.op_argmax(&logits, &tokens)?;
    Ok(tokens)
}

/// A model loaded on a GPU.
pub struct CudaEngine {
    backend: Cuda,
    model: Model<Cuda>,
    kv: CudaKv,
    graphs: GraphCache<Captured>,
    use_graphs: bool,
    replays: u64,
    /// On a rank of a tensor-parallel group: the all-reduce after row-parallel matmuls.
    reduce: Option<Box<dyn AllReduce<Cuda>>>,
    /// Each sequence's recurrent state (hybrid models), made at its first step and
    /// dropped with it ([`CudaEngine::free_state`]).
    states: HashMap<SeqId, SeqState>,
}

impl CudaEngine {
    /// Uploads the model in `gguf` to CUDA device `ordinal` with the KV cache `kv` plans.
    /// `batch_invariant`: see `EngineOptions::batch_invariant`.
    pub fn load(
        gguf: &Arc<Gguf>,
        ordinal: usize,
        kv: &KvPlan,
        batch_invariant: bool,
    ) -> Result<CudaEngine, EngineError> {
        Self::load_rank(gguf, ordinal, kv, batch_invariant, None)
    }

    /// [`CudaEngine::load`] with the weights `isq` names quantized on the device as they
    /// load (`gguf` is the source model; see [`super::isq`]).
    pub fn load_isq(
        gguf: &Arc<Gguf>,
        ordinal: usize,
        kv: &KvPlan,
        batch_invariant: bool,
        isq: Option<Arc<super::isq::DeviceIsq>>,
    ) -> Result<CudaEngine, EngineError> {
        Self::load_inner(gguf, ordinal, kv, batch_invariant, None, isq)
    }

    /// [`CudaEngine::load`] for one rank of a tensor-parallel group: `gguf` holds the rank's
    /// slices ([`crate::tp::rank_gguf`]) and `reduce` sums row-parallel outputs over the
    /// ranks (every rank must run the same steps, the measuring step included).
    pub fn load_rank(
        gguf: &Arc<Gguf>,
        ordinal: usize,
        kv: &KvPlan,
        batch_invariant: bool,
        reduce: Option<Box<dyn AllReduce<Cuda>>>,
    ) -> Result<CudaEngine, EngineError> {
        Self::load_inner(gguf, ordinal, kv, batch_invariant, reduce, None)
    }

    fn load_inner(
        gguf: &Arc<Gguf>,
        ordinal: usize,
        kv: &KvPlan,
        batch_invariant: bool,
        reduce: Option<Box<dyn AllReduce<Cuda>>>,
        isq: Option<Arc<super::isq::DeviceIsq>>,
    ) -> Result<CudaEngine, EngineError> {
        let t0 = std::time::Instant::now();
        let backend = Cuda::open(ordinal, batch_invariant)?;
        let log = backend.options().launch.gpu.load_log;
        let opened = t0.elapsed();
        if let Some(plan) = isq {
            backend.start_isq(plan, gguf)?;
        }
        if let Some(d) = &crate::model::ModelInfo::from_gguf(gguf)?.delta {
            delta::check_shape(d)?;
        }
        let model = Model::load(&backend, gguf)?;
        let stats = backend.finish_isq()?;
        backend.take_error()?;
        backend.gpu().synchronize()?;
        backend.release_upload_buffers();
        let loaded = t0.elapsed();
        if log {
            eprintln!(
                "cuda:{ordinal} load: device open + kernels {:.2} s, weights {:.2} s{}",
                opened.as_secs_f64(),
                (loaded - opened).as_secs_f64(),
                stats.map_or(String::new(), |s| format!(" (ISQ: {})", s.line()))
            );
        }
        if backend.options().debug.weight_digest {
            let (h, n, bytes) = backend.weights_digest()?;
            eprintln!("cuda:{ordinal} weights digest: {h:016x} ({n} weights, {bytes} bytes)");
        }
        let i = &model.info;
        let kv_dim = i.n_head_kv * i.head_dim;
        let (n_layer, block_size) = (i.n_layer, kv.block_size);
        // Measuring needs a cache of one step's blocks first.
        let first = match kv.fill {
            // Room for the measuring step's two sequences (see `blocks_that_fit`).
            Some((_, step)) => step.div_ceil(block_size) + 1,
            None => kv.min_blocks,
        };
        let cache = backend.kv_alloc(n_layer, first, block_size, kv_dim);
        backend.take_error()?;
        backend.gpu().synchronize()?;
        let use_graphs = backend.graphs();
        let mut e = CudaEngine {
            backend,
            model,
            kv: cache,
            graphs: GraphCache::new(MAX_GRAPHS),
            // SMELT_CUDA_GRAPHS=0 runs every step eagerly (to compare, or to debug);
            // profiling times eager steps.
            use_graphs,
            replays: 0,
            reduce,
            states: HashMap::new(),
        };
        if let Some((fraction, step)) = kv.fill {
            let n_blocks = e.blocks_that_fit(fraction, step, kv.min_blocks)?;
            e.kv = e.backend.kv_alloc(n_layer, n_blocks, block_size, kv_dim);
            e.backend.take_error()?;
            e.backend.gpu().synchronize()?;
        }
        if log {
            eprintln!(
                "cuda:{ordinal} load: KV cache {:.2} s; engine ready {:.2} s after the device was asked for",
                (t0.elapsed() - loaded).as_secs_f64(),
                t0.elapsed().as_secs_f64()
            );
        }
        Ok(e)
    }

    /// Runs one step of `step` tokens on the small cache `load` made (so the weights, the
    /// kernels and that step's activations are all in memory), frees that cache, and returns
    /// how many blocks fill `fraction` of the device's memory; at least `min_blocks`, else
    /// an error that says what would fit. The step is a mixed one, as a server runs: one
    /// decode-like row beside a prompt chunk of the rest, which takes more scratch than a
    /// prompt chunk alone (the split attention's partials for every row, besides the
    /// prompt kernel).
    fn blocks_that_fit(
        &mut self,
        fraction: GpuMemory,
        step: usize,
        min_blocks: usize,
    ) -> Result<usize, EngineError> {
        let info = &self.model.info;
        let step = step.min(info.n_ctx_train.max(1)).max(1);
        let (block_size, kv_dim) = (self.kv.block_size, self.kv.kv_dim);
        let block_bytes = gpu_memory::block_bytes(info.n_layer, block_size, kv_dim);
        let tokens = vec![0u32; step];
        // Sequence 0: one token in block 0; sequence 1: the other `step - 1` tokens.
        let positions: Vec<u32> = std::iter::once(0).chain(0..step as u32 - 1).collect();
        let blocks: Vec<u32> = (0..self.kv.n_blocks as u32).collect();
        let mut seqs = vec![AttnSeq {
            row: 0,
            n_tokens: 1,
            start_pos: 0,
            blocks: &blocks[..1],
        }];
        let mut out_rows = vec![0];
        if step > 1 {
            seqs.push(AttnSeq {
                row: 1,
                n_tokens: step - 1,
                start_pos: 0,
                blocks: &blocks[1..],
            });
            out_rows.push(step - 1);
        }
        // Eager: a graph captured now would keep the measuring cache's addresses.
        let use_graphs = std::mem::replace(&mut self.use_graphs, false);
        // A hybrid's two sequences get states of their own, dropped after.
        let ids: Vec<SeqId> = (0..seqs.len() as u64)
            .map(|i| SeqId(u64::MAX - i))
            .collect();
        let ran = self.forward_inner(&tokens, &positions, &seqs, &out_rows, true, Some(&ids));
        self.states.clear();
        self.use_graphs = use_graphs;
        ran?;
        // The measuring cache goes before the real one comes.
        self.kv.k.clear();
        self.kv.v.clear();
        self.backend.gpu().synchronize()?;
        let (free, total) = self.backend.gpu().mem_info()?;
        // A hybrid's sequences take recurrent state beside their KV blocks: room is kept
        // for that of `SMELT_CUDA_STATE_SEQS` sequences (default 64).
        let reserve = self.model.info.delta.as_ref().map_or(0, |d| {
            let seqs = std::env::var("SMELT_CUDA_STATE_SEQS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(64);
            seqs * delta::state_bytes(d)
        });
        let used = total.saturating_sub(free) + reserve;
        let n = gpu_memory::kv_blocks(total, used, fraction, block_bytes);
        if n < min_blocks {
            return Err(EngineError::BadOptions(format!(
                "--gpu-memory {fraction} leaves room for {} tokens of KV cache ({:.1} of {:.1} GiB \
                 in use after the weights and a {step}-token step), fewer than the {} needed: \
                 raise --gpu-memory, or ask for fewer tokens (--ctx, --kv-tokens)",
                n * block_size,
                gpu_memory::gib(used),
                gpu_memory::gib(total),
                min_blocks * block_size,
            )));
        }
        Ok(n)
    }

    /// KV blocks the cache holds.
    pub fn kv_blocks(&self) -> usize {
        self.kv.n_blocks
    }

    pub fn model(&self) -> &Model<Cuda> {
        &self.model
    }

    pub fn backend(&self) -> &Cuda {
        &self.backend
    }

    /// The all-reduce of a tensor-parallel rank (`None` alone).
    pub fn reduce(&self) -> Option<&dyn AllReduce<Cuda>> {
        self.reduce.as_deref()
    }

    /// Decode steps served by a graph replay so far.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    fn eager(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        states: States<'_, '_>,
    ) -> Result<CudaTensor, EngineError> {
        self.backend.upload_step()?;
        // Only decode steps (one token per sequence) are timed, unless every step is asked
        // for (`SMELT_CUDA_PROFILE=all`: prompt steps too).
        let timed = self.backend.profiling()
            && (tokens.len() == seqs.len() || self.backend.profiling_all_steps());
        if timed {
            self.backend.profile_begin()?;
        }
        let logits = self.model.forward_tp(
            &self.backend,
            &mut self.kv,
            states,
            tokens,
            positions,
            seqs,
            out_rows,
            self.reduce.as_deref(),
        )?;
        // The last matmul (the logits) may still be deferred.
        self.backend.flush()?;
        if timed {
            self.backend.profile_end()?;
        }
        Ok(logits)
    }

    /// A step that ends at the final norm: the hidden rows of `out_rows`, flat, `n_embd`
    /// each (embeddings). Always eager: embedding steps are prompts, never graph-captured.
    pub fn hidden(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        self.hidden_seqs(None, tokens, positions, seqs, out_rows)
    }

    /// [`CudaEngine::hidden`] of the sequences `ids` (in `seqs` order; a hybrid model
    /// needs them, for their recurrent states).
    pub fn hidden_seqs(
        &mut self,
        ids: Option<&[SeqId]>,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        let (ids, mut taken) = self.take_states(ids, seqs.len())?;
        let addrs: Vec<u64> = taken.iter().map(|s| s.addr).collect();
        let mut refs: Vec<&mut Vec<DeltaState<CudaTensor>>> =
            taken.iter_mut().map(|s| &mut s.layers).collect();
        let ran = self.hidden_with(tokens, positions, seqs, out_rows, &mut refs, &addrs);
        drop(refs);
        self.put_states(ids, taken);
        ran
    }

    fn hidden_with(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        states: States<'_, '_>,
        addrs: &[u64],
    ) -> Result<Vec<f32>, EngineError> {
        self.backend.begin_step(tokens, positions, seqs)?;
        if !addrs.is_empty() {
            self.backend.set_state_addrs(addrs)?;
        }
        self.backend.upload_step()?;
        let h = self.model.hidden_with_state(
            &self.backend,
            &mut self.kv,
            states,
            tokens,
            positions,
            seqs,
            out_rows,
        )?;
        self.backend.flush()?;
        self.backend.take_error()?;
        if out_rows.is_empty() {
            self.backend.gpu().synchronize()?;
            return Ok(Vec::new());
        }
        Ok(self.backend.download(&h)?)
    }

    /// One step: `tokens` of all sequences (concatenated in `seqs` order) at `positions`;
    /// returns the logits of `out_rows`, flat, or with `greedy` their greedy tokens: the
    /// argmax runs in the step (inside its graph), and 4 bytes per row come back instead
    /// of a vocabulary of floats.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        greedy: bool,
    ) -> Result<StepOut, EngineError> {
        self.forward_inner(tokens, positions, seqs, out_rows, greedy, None)
    }

    /// [`CudaEngine::forward`] of the sequences `ids` (in `seqs` order): a hybrid model
    /// reads and advances their recurrent states (made at a sequence's first step, dropped
    /// by [`CudaEngine::free_state`]).
    pub fn forward_seqs(
        &mut self,
        ids: &[SeqId],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        greedy: bool,
    ) -> Result<StepOut, EngineError> {
        self.forward_inner(tokens, positions, seqs, out_rows, greedy, Some(ids))
    }

    /// Drops a sequence's recurrent state (its device memory goes back at once).
    pub fn free_state(&mut self, id: SeqId) {
        self.states.remove(&id);
    }

    /// Sequences holding a recurrent state.
    pub fn n_states(&self) -> usize {
        self.states.len()
    }

    /// The states of `ids` out of the map (fresh ones for new sequences), for a step of
    /// `n_seqs` sequences; none for a model without delta-net layers.
    fn take_states(
        &mut self,
        ids: Option<&[SeqId]>,
        n_seqs: usize,
    ) -> Result<(Vec<SeqId>, Vec<SeqState>), EngineError> {
        let Some(d) = self.model.info.delta.clone() else {
            return Ok((Vec::new(), Vec::new()));
        };
        let Some(ids) = ids.filter(|i| i.len() == n_seqs) else {
            return Err(EngineError::BadOptions(format!(
                "a step of a hybrid model needs the ids of its {n_seqs} sequences (their recurrent states)"
            )));
        };
        let mut taken = Vec::with_capacity(ids.len());
        for id in ids {
            let st = match self.states.remove(id) {
                Some(s) => s,
                None => match self.backend.new_seq_state(&d) {
                    Ok(s) => s,
                    Err(e) => {
                        self.put_states(ids[..taken.len()].to_vec(), taken);
                        return Err(e);
                    }
                },
            };
            taken.push(st);
        }
        Ok((ids.to_vec(), taken))
    }

    fn put_states(&mut self, ids: Vec<SeqId>, taken: Vec<SeqState>) {
        for (id, st) in ids.into_iter().zip(taken) {
            self.states.insert(id, st);
        }
    }

    fn forward_inner(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        greedy: bool,
        ids: Option<&[SeqId]>,
    ) -> Result<StepOut, EngineError> {
        let (ids, mut taken) = self.take_states(ids, seqs.len())?;
        let addrs: Vec<u64> = taken.iter().map(|s| s.addr).collect();
        let mut refs: Vec<&mut Vec<DeltaState<CudaTensor>>> =
            taken.iter_mut().map(|s| &mut s.layers).collect();
        let ran = self.step_with(tokens, positions, seqs, out_rows, greedy, &mut refs, &addrs);
        drop(refs);
        self.put_states(ids, taken);
        ran
    }

    #[allow(clippy::too_many_arguments)]
    fn step_with(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        greedy: bool,
        states: States<'_, '_>,
        addrs: &[u64],
    ) -> Result<StepOut, EngineError> {
        let key = if self.use_graphs {
            GraphKey::decode(seqs, out_rows, greedy)
        } else {
            None
        };
        self.backend.begin_step(tokens, positions, seqs)?;
        if !addrs.is_empty() {
            self.backend.set_state_addrs(addrs)?;
        }
        self.backend.timeline_begin(tokens.len() == seqs.len())?;
        let plan = self.graphs.plan(key.as_ref(), self.backend.generation());
        let out = match (plan, key) {
            (Plan::Replay, Some(key)) => {
                let Some(c) = self.graphs.get(&key) else {
                    return Err(EngineError::BadOptions("graph vanished".into()));
                };
                c.graph.launch()?;
                self.replays += 1;
                c.out
            }
            (Plan::Capture, Some(key)) => {
                let (backend, model, kv) = (&self.backend, &self.model, &mut self.kv);
                let reduce = self.reduce.as_deref();
                let mut logits = None;
                let mut model_err = None;
                let captured = backend.gpu().capture(|| {
                    let r = backend.upload_step().and_then(|()| {
                        let l = model.forward_tp(
                            backend,
                            kv,
                            &mut *states,
                            tokens,
                            positions,
                            seqs,
                            out_rows,
                            reduce,
                        )?;
                        backend.flush()?;
                        Ok(step_result(backend, l, greedy)?)
                    });
                    match r {
                        Ok(l) => logits = Some(l),
                        Err(e) => model_err = Some(e),
                    }
                    // An op's kept error fails the capture too.
                    backend
                        .take_error()
                        .map_err(|e| CudaError::Init(format!("during capture: {e}")))
                });
                if let Some(e) = model_err {
                    return Err(e);
                }
                match (captured, logits) {
                    (Ok(graph), Some(out)) => {
                        graph.launch()?;
                        self.graphs.insert(key, Captured { graph, out });
                        out
                    }
                    (r, _) => {
                        // Nothing ran during the capture: run the step for real, and stop
                        // capturing (a driver that refuses once will refuse again).
                        let why = r.err().map_or("no logits".to_string(), |e| e.to_string());
                        eprintln!(
                            "smelt: CUDA graph capture failed ({why}); running steps eagerly"
                        );
                        self.use_graphs = false;
                        self.graphs.give_up(&key);
                        let l = self.eager(tokens, positions, seqs, out_rows, states)?;
                        step_result(&self.backend, l, greedy)?
                    }
                }
            }
            _ => {
                let l = self.eager(tokens, positions, seqs, out_rows, states)?;
                step_result(&self.backend, l, greedy)?
            }
        };
        self.backend.take_error()?;
        self.backend.timeline_end()?;
        if out_rows.is_empty() {
            self.backend.gpu().synchronize()?;
            return Ok(if greedy {
                StepOut::Tokens(Vec::new())
            } else {
                StepOut::Logits(Vec::new())
            });
        }
        let host = self.backend.download(&out)?;
        Ok(if greedy {
            StepOut::Tokens(host.iter().map(|v| v.to_bits()).collect())
        } else {
            StepOut::Logits(host)
        })
    }
}
