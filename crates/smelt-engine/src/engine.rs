//! The engine: a model on a backend, its paged KV cache, and a forward step over a batch
//! of sequences at different positions (what a continuous-batching scheduler drives).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use smelt_gguf::Gguf;

use crate::backend::cpu::spin_pool::CpuPool;
use crate::backend::cpu::{Cpu, CpuKv, CpuTensor};
use crate::backend::cuda::runner::{KvPlan, StepOut};
use crate::backend::cuda::CudaEngine;
use crate::backend::{AttnSeq, Backend, DeltaState};
use crate::device::Device;
use crate::gpu_memory::GpuMemory;
use crate::kv_cache::{BlockTable, SeqId};
use crate::model::{Model, ModelInfo};
use crate::EngineError;

/// How to size and run an engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Worker threads; `None` uses every core this process may run on (affinity mask and
    /// cgroup quota). Engines with the same count share one pool of threads.
    pub threads: Option<usize>,
    /// KV cache capacity in tokens, shared by all sequences (with `gpu_memory` on a GPU:
    /// the least it must hold).
    pub kv_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Where to compute (resolve `auto` with [`Device::select`] first).
    pub device: Device,
    /// On a GPU: the KV cache fills this fraction of the device's memory, less what the
    /// weights and one step of `step_tokens` tokens take (see [`crate::gpu_memory`]);
    /// `None`: exactly `kv_tokens`. The CPU ignores it.
    pub gpu_memory: Option<GpuMemory>,
    /// The most tokens one step will carry: the step run to measure activation memory
    /// before the KV cache is sized from `gpu_memory`.
    pub step_tokens: usize,
    /// On a GPU: a sequence's results never depend on the other sequences of its steps or
    /// on how its prompt was cut into chunks (every matmul on the tensor-core GEMM with K
    /// split by the matrix shape alone, every attention on the tiled prompt kernel).
    /// Slower decode of one sequence. On the CPU: every row in its one-token order
    /// ([`crate::backend::cpu::Cpu::batch_invariant`]); without it the CPU computes
    /// llama.cpp's bits, whose K-quant and float matmuls depend on the step's token count
    /// and whose attention rounds a one-token chunk differently (a 17-token SmolLM2 prompt:
    /// first logprob -12.2936 in one chunk, -12.2619 in 16 + 1).
    pub batch_invariant: bool,
    /// On a GPU: quantize these weights on the device as they load (`--isq` of a GGUF
    /// file, unless `SMELT_ISQ_ON_DEVICE=0`: the source's weights never come back to the host;
    /// see [`crate::backend::cuda::isq`]). The CPU ignores it (it is given a quantized model).
    pub device_isq: Option<Arc<crate::backend::cuda::isq::DeviceIsq>>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: None,
            kv_tokens: 4096,
            block_size: 16,
            device: Device::Cpu,
            gpu_memory: None,
            step_tokens: crate::generate::DEFAULT_PREFILL_CHUNK,
            batch_invariant: false,
            device_isq: None,
        }
    }
}

/// Which logits a [`SeqInput`] wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's row (generation).
    Last,
    /// One row per token (perplexity, speculative checks).
    All,
    /// None (a prefill chunk that is not the prompt's last).
    None,
}

/// One sequence's new tokens in a batch; they are appended at the sequence's length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqInput {
    pub seq: SeqId,
    pub tokens: Vec<u32>,
    pub logits: Logits,
}

/// What a step hands back for the rows asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    Logits,
    /// Greedy tokens (chosen on the device where it can).
    Greedy,
    /// The final norm's output (embeddings).
    Hidden,
}

/// A loaded model ready to run.
pub struct Engine {
    gguf: Arc<Gguf>,
    inner: Inner,
    table: BlockTable,
    device: Device,
}

/// The model on its backend.
enum Inner {
    Cpu {
        backend: Cpu,
        model: Box<Model<Cpu>>,
        kv: CpuKv,
        /// Threads shared with every engine of the same thread count (see `spin_pool`).
        pool: Arc<CpuPool>,
        /// Each sequence's recurrent state (hybrid models' delta-net layers), made with the
        /// sequence and dropped with it.
        states: HashMap<SeqId, Vec<DeltaState<CpuTensor>>>,
    },
    Cuda(Box<CudaEngine>),
    /// Tensor parallel: the model split over several devices, one thread each.
    Tp(Box<crate::tp::runner::TpRunner>),
}

impl Engine {
    pub fn load(path: &Path, opts: &EngineOptions) -> Result<Engine, EngineError> {
        Self::from_gguf(Arc::new(Gguf::open(path)?), opts)
    }

    /// Builds an engine over an already opened file (tests, in-memory GGUFs).
    pub fn from_gguf(gguf: Arc<Gguf>, opts: &EngineOptions) -> Result<Engine, EngineError> {
        if opts.block_size == 0 || opts.kv_tokens == 0 {
            return Err(EngineError::BadOptions(
                "kv_tokens and block_size must be positive".into(),
            ));
        }
        let n_blocks = opts.kv_tokens.div_ceil(opts.block_size);
        if let Device::Cuda(ordinal) = opts.device {
            let kv = KvPlan {
                min_blocks: n_blocks,
                block_size: opts.block_size,
                fill: opts.gpu_memory.map(|f| (f, opts.step_tokens.max(1))),
            };
            let cuda = CudaEngine::load_isq(
                &gguf,
                ordinal,
                &kv,
                opts.batch_invariant,
                opts.device_isq.clone(),
            )?;
            let n_blocks = cuda.kv_blocks();
            let mut table = BlockTable::new(n_blocks, opts.block_size);
            // As on the CPU: a hybrid's recurrent state is not in the KV blocks.
            if cuda.model().info.delta.is_some() {
                table.set_prefix_cache(false);
            }
            return Ok(Engine {
                gguf,
                inner: Inner::Cuda(Box::new(cuda)),
                table,
                device: opts.device,
            });
        }
        let pool = CpuPool::shared(opts.threads)
            .map_err(|e| EngineError::BadOptions(format!("thread pool: {e}")))?;
        let backend = Cpu {
            batch_invariant: opts.batch_invariant,
        };
        let model = Model::load(&backend, &gguf)?;
        let i = &model.info;
        let kv = backend.kv_alloc(
            i.n_layer,
            n_blocks,
            opts.block_size,
            i.n_head_kv * i.head_dim,
        );
        let mut table = BlockTable::new(n_blocks, opts.block_size);
        // A hybrid's sequence state is not all in the KV blocks: a cached prefix would skip
        // the recurrent state's updates, so prefix caching is off for it.
        if i.delta.is_some() {
            table.set_prefix_cache(false);
        }
        Ok(Engine {
            gguf,
            inner: Inner::Cpu {
                backend,
                model: Box::new(model),
                kv,
                pool,
                states: HashMap::new(),
            },
            table,
            device: Device::Cpu,
        })
    }

    /// Loads `path` split over `devices` (tensor parallelism: `--tp N`; see [`crate::tp`]).
    /// One device runs the same sharded path with one rank (`--tp 1`).
    pub fn load_tp(
        path: &Path,
        opts: &EngineOptions,
        devices: &[Device],
    ) -> Result<Engine, EngineError> {
        Self::from_gguf_tp(Arc::new(Gguf::open(path)?), opts, devices)
    }

    /// [`Engine::load_tp`] over an already opened file.
    pub fn from_gguf_tp(
        gguf: Arc<Gguf>,
        opts: &EngineOptions,
        devices: &[Device],
    ) -> Result<Engine, EngineError> {
        if opts.block_size == 0 || opts.kv_tokens == 0 {
            return Err(EngineError::BadOptions(
                "kv_tokens and block_size must be positive".into(),
            ));
        }
        if devices.is_empty() {
            return Err(EngineError::BadOptions(
                "--tp needs at least one device".into(),
            ));
        }
        let n_blocks = opts.kv_tokens.div_ceil(opts.block_size);
        let cuda = matches!(devices[0], Device::Cuda(_));
        let kv = KvPlan {
            min_blocks: n_blocks,
            block_size: opts.block_size,
            fill: if cuda {
                opts.gpu_memory.map(|f| (f, opts.step_tokens.max(1)))
            } else {
                None
            },
        };
        let tp = crate::tp::runner::TpRunner::load(&gguf, devices, &kv, opts.batch_invariant)?;
        let n_blocks = tp.kv_blocks();
        let mut table = BlockTable::new(n_blocks, opts.block_size);
        // As on one device: a hybrid's recurrent state is not in the KV blocks.
        if tp.plan.info.delta.is_some() {
            table.set_prefix_cache(false);
        }
        Ok(Engine {
            gguf,
            inner: Inner::Tp(Box::new(tp)),
            table,
            device: devices[0],
        })
    }

    /// [`Engine::tp`], mutable (to time its all-reduce).
    pub fn tp_mut(&mut self) -> Option<&mut crate::tp::runner::TpRunner> {
        match &mut self.inner {
            Inner::Tp(t) => Some(t),
            _ => None,
        }
    }

    /// The tensor-parallel runner, when this engine is one.
    pub fn tp(&self) -> Option<&crate::tp::runner::TpRunner> {
        match &self.inner {
            Inner::Tp(t) => Some(t),
            _ => None,
        }
    }

    pub fn info(&self) -> &ModelInfo {
        match &self.inner {
            Inner::Cpu { model, .. } => &model.info,
            Inner::Cuda(c) => &c.model().info,
            Inner::Tp(t) => &t.plan.info,
        }
    }

    /// The device this engine computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device in words ("cpu", "cuda:0 (NVIDIA H200)").
    pub fn device_name(&self) -> String {
        match &self.inner {
            Inner::Cpu { .. } => "cpu".into(),
            Inner::Cuda(c) => format!("{} ({})", self.device, c.backend().gpu().name()),
            Inner::Tp(t) => t.device_names(),
        }
    }

    /// Whether a row's bits depend on whether its chunk holds one token or more: on the
    /// CPU with llama.cpp's orders (a lone token's attention is summed in ggml's `vec_dot`
    /// order, a longer chunk's in tinyBLAS order), not with `batch_invariant`.
    pub fn lone_token_rows_differ(&self) -> bool {
        match &self.inner {
            Inner::Cpu { backend, .. } => !backend.batch_invariant,
            Inner::Cuda(_) | Inner::Tp(_) => false,
        }
    }

    /// CPU threads this engine computes on (`None` on a GPU).
    pub fn cpu_threads(&self) -> Option<usize> {
        match &self.inner {
            Inner::Cpu { pool, .. } => Some(pool.threads()),
            Inner::Cuda(_) | Inner::Tp(_) => None,
        }
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn new_sequence(&mut self) -> SeqId {
        let id = self.table.new_sequence();
        if let Inner::Cpu {
            backend,
            model,
            states,
            ..
        } = &mut self.inner
        {
            if model.info.delta.is_some() {
                states.insert(id, model.new_state(backend));
            }
        }
        id
    }

    /// Starts a fresh sequence on the cached KV blocks `tokens` begins with (prefix
    /// caching; see [`crate::kv_cache`]); returns how many tokens they hold, which the
    /// caller then does not feed. 0 when caching is off or nothing matches.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        self.table.attach_prefix(seq, tokens)
    }

    /// Prefix caching on or off (on by default). Only models whose whole sequence state is
    /// the paged KV cache can have it: for a model with recurrent layers it stays off.
    pub fn set_prefix_cache(&mut self, on: bool) {
        let hybrid = self.info().delta.is_some();
        self.table.set_prefix_cache(on && !hybrid);
    }

    /// Whether prefix caching is on (never for a model with recurrent layers).
    pub fn prefix_cache_on(&self) -> bool {
        self.table.prefix_cache_on()
    }

    /// Prompt tokens looked up in the prefix cache, and found there, since loading.
    pub fn prefix_cache_stats(&self) -> (u64, u64) {
        (self.table.prefix_queried, self.table.prefix_hits)
    }

    /// Drops a sequence and returns its KV blocks (and its recurrent state) at once.
    pub fn free_sequence(&mut self, seq: SeqId) {
        self.table.free_sequence(seq);
        match &mut self.inner {
            Inner::Cpu { states, .. } => {
                states.remove(&seq);
            }
            Inner::Cuda(c) => c.free_state(seq),
            Inner::Tp(t) => t.free_state(seq),
        }
    }

    /// Tokens cached for `seq` (0 for an unknown sequence).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.table.seq_len(seq).unwrap_or(0)
    }

    /// KV blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.table.free_blocks()
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.table.block_size()
    }

    /// KV blocks in all.
    pub fn total_blocks(&self) -> usize {
        self.table.n_blocks()
    }

    /// Tokens the KV cache holds in all (every sequence's together).
    pub fn kv_tokens(&self) -> usize {
        self.table.n_blocks() * self.table.block_size()
    }

    /// Device memory the KV cache takes, in bytes.
    pub fn kv_bytes(&self) -> usize {
        let i = self.info();
        self.table.n_blocks()
            * crate::gpu_memory::block_bytes(
                i.n_layer,
                self.table.block_size(),
                i.n_head_kv * i.head_dim,
            )
    }

    /// One step over a batch of sequences at different positions. Returns, per input in
    /// order, the logits rows asked for, each `n_vocab` long. A refused batch (unknown
    /// sequence, bad token, KV cache full) leaves every sequence as it was.
    pub fn forward(&mut self, batch: &[SeqInput]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        let n_vocab = self.info().n_vocab;
        let flat = match self.step(batch, Out::Logits)? {
            StepOut::Logits(l) => l,
            StepOut::Tokens(_) => {
                return Err(EngineError::BadOptions("a logits step gave tokens".into()))
            }
        };
        // A single row (one sequence decoding) is handed over as it is.
        let rows: Vec<Vec<f32>> = if flat.len() == n_vocab {
            vec![flat]
        } else {
            flat.chunks(n_vocab.max(1)).map(<[f32]>::to_vec).collect()
        };
        let mut rows = rows.into_iter();
        Ok(batch
            .iter()
            .map(|inp| {
                let k = match inp.logits {
                    Logits::Last => usize::from(!inp.tokens.is_empty()),
                    Logits::All => inp.tokens.len(),
                    Logits::None => 0,
                };
                rows.by_ref().take(k).collect()
            })
            .collect())
    }

    /// [`Engine::forward`] for greedy decoding: per input, the greedy token of its last
    /// row (`Logits::Last`; `None` for `Logits::None`), chosen where the logits are. On
    /// the GPU that is inside the step (in its graph), so 4 bytes per sequence come back
    /// instead of `n_vocab` floats. The choice is [`crate::sampler::argmax`]'s: the first
    /// largest value, NaN never chosen (a row with nothing but NaN and -inf, which no
    /// model gives, may differ). `Logits::All` is refused.
    pub fn forward_greedy(&mut self, batch: &[SeqInput]) -> Result<Vec<Option<u32>>, EngineError> {
        if batch.iter().any(|i| i.logits == Logits::All) {
            return Err(EngineError::BadOptions(
                "greedy steps return one token per sequence: Logits::All is not one".into(),
            ));
        }
        let n_vocab = self.info().n_vocab;
        let tokens = match self.step(batch, Out::Greedy)? {
            StepOut::Tokens(t) => t,
            StepOut::Logits(l) => l
                .chunks(n_vocab.max(1))
                .map(crate::sampler::argmax)
                .collect(),
        };
        let mut tokens = tokens.into_iter();
        Ok(batch
            .iter()
            .map(|inp| match inp.logits {
                Logits::Last if !inp.tokens.is_empty() => tokens.next(),
                _ => None,
            })
            .collect())
    }

    /// Runs a batch; the rows asked for come back as logits, flat, or (with `Out::Greedy`,
    /// on a backend that can) as their greedy tokens, or (`Out::Hidden`) as the final norm's
    /// rows, `n_embd` wide (in `StepOut::Logits`).
    pub(crate) fn step(&mut self, batch: &[SeqInput], out: Out) -> Result<StepOut, EngineError> {
        let greedy = out == Out::Greedy;
        let n_vocab = self.info().n_vocab;
        let mut seen = HashSet::new();
        for inp in batch {
            if !self.table.contains(inp.seq) {
                return Err(EngineError::UnknownSequence(inp.seq.0));
            }
            if !seen.insert(inp.seq) {
                return Err(EngineError::DuplicateSequence(inp.seq.0));
            }
            if let Some(&token) = inp.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::BadToken { token, n_vocab });
            }
        }
        let starts: Vec<usize> = batch.iter().map(|i| self.seq_len(i.seq)).collect();
        let grow: Vec<(SeqId, usize)> = batch.iter().map(|i| (i.seq, i.tokens.len())).collect();
        self.table.grow(&grow)?;

        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut out_rows = Vec::new();
        let mut seqs = Vec::with_capacity(batch.len());
        let mut seq_ids = Vec::with_capacity(batch.len());
        for (inp, &start) in batch.iter().zip(&starts) {
            let row = tokens.len();
            let n = inp.tokens.len();
            tokens.extend_from_slice(&inp.tokens);
            positions.extend((start..start + n).map(|p| p as u32));
            match inp.logits {
                Logits::Last if n > 0 => out_rows.push(row + n - 1),
                Logits::All => out_rows.extend(row..row + n),
                _ => {}
            }
            if n > 0 {
                seq_ids.push(inp.seq);
                seqs.push(AttnSeq {
                    row,
                    n_tokens: n,
                    start_pos: start,
                    blocks: self.table.blocks(inp.seq).unwrap_or(&[]),
                });
            }
        }
        if tokens.is_empty() {
            return Ok(StepOut::Logits(Vec::new()));
        }
        let out = match &mut self.inner {
            Inner::Cpu {
                backend,
                model,
                kv,
                pool,
                states,
            } => {
                let backend = &*backend;
                // The batch's recurrent states, in `seqs` order, out of the map for the step
                // (a failed step leaves them where it stopped).
                let mut taken: Vec<Vec<DeltaState<CpuTensor>>> = if model.info.delta.is_some() {
                    seq_ids
                        .iter()
                        .map(|id| {
                            states
                                .remove(id)
                                .unwrap_or_else(|| model.new_state(backend))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let mut refs: Vec<&mut Vec<DeltaState<CpuTensor>>> = taken.iter_mut().collect();
                let ran = pool.rayon.install(|| {
                    pool.spin.install(|| {
                        if out == Out::Hidden {
                            model.hidden_with_state(
                                backend, kv, &mut refs, &tokens, &positions, &seqs, &out_rows,
                            )
                        } else {
                            model.forward_with_state(
                                backend, kv, &mut refs, &tokens, &positions, &seqs, &out_rows,
                            )
                        }
                    })
                });
                drop(refs);
                for (id, st) in seq_ids.iter().zip(taken) {
                    states.insert(*id, st);
                }
                let logits = ran?;
                StepOut::Logits(if out_rows.is_empty() {
                    Vec::new()
                } else {
                    // Host memory already: moved, not copied (a 1 MB row per Gemma step).
                    let mut data = logits.data;
                    data.truncate(logits.rows * logits.cols);
                    data
                })
            }
            Inner::Cuda(c) if out == Out::Hidden => StepOut::Logits(
                c.hidden_seqs(Some(&seq_ids), &tokens, &positions, &seqs, &out_rows)
                    .map_err(|e| EngineError::in_step(e, tokens.len(), seq_ids.len()))?,
            ),
            Inner::Cuda(c) => c
                .forward_seqs(&seq_ids, &tokens, &positions, &seqs, &out_rows, greedy)
                .map_err(|e| EngineError::in_step(e, tokens.len(), seq_ids.len()))?,
            // The ranks' step has no hidden-rows output yet: their logits are not
            // embeddings, so say so rather than pool them.
            Inner::Tp(_) if out == Out::Hidden => {
                return Err(EngineError::BadOptions(
                    "embeddings are not supported across GPUs (--tp) yet: serve the embedding \
                     model on one GPU"
                        .into(),
                ))
            }
            Inner::Tp(t) => t.step(crate::tp::runner::StepMsg {
                ids: seq_ids,
                tokens,
                positions,
                seqs: seqs
                    .iter()
                    .map(|s| crate::tp::runner::OwnedSeq {
                        row: s.row,
                        n_tokens: s.n_tokens,
                        start_pos: s.start_pos,
                        blocks: s.blocks.to_vec(),
                    })
                    .collect(),
                out_rows,
                greedy,
            })?,
        };
        // The step's K/V are written: their full blocks can serve later prompts.
        for (inp, &start) in batch.iter().zip(&starts) {
            self.table.record(inp.seq, start, &inp.tokens);
        }
        Ok(out)
    }
}
