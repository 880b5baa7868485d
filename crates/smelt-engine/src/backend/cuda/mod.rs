//! The CUDA backend: weights uploaded once (quantized matrices repacked to the GEMV's row
//! layout, vectors as f32, the embedding table in ggml's layout), activations as f32 rows
//! in a per-step scratch arena, the KV cache as f16 blocks, every op a kernel of
//! `smelt-kernels` launched on the device's one stream.
//!
//! The [`Backend`](crate::backend::Backend) trait's ops cannot fail except `matmul` and `embed`; a driver error in
//! any other op is kept (the first one) and returned by [`Cuda::take_error`], which the
//! engine checks after every step, and later ops launch nothing until then. CUDA errors
//! are sticky anyway: after one, the results of the step are garbage either way.
//!
//! Per-step inputs (token ids, positions, sequence descriptors, block tables) are read by
//! the kernels from the step buffer ([`step`]), never passed as scalars, so a decode step
//! can be captured once and replayed ([`runner`]).
//!
//! Matmuls of one input that the model names as a group (`Backend::matmul_group`: Q|K|V,
//! gate|up) run as one single-token GEMV at decode where [`fusion`]'s planner says so: the
//! loader puts a group's rows one after the other and the op its outputs, so the fusion
//! does not depend on load or allocation order.
//!
//! A few ops are deferred to the next call so that neighbours can run as one launch (at
//! decode a row is one block, and launch latency, not bandwidth, is the cost of the small
//! ops): that GEMV waits for the op that reads its output (the fused rope + KV append,
//! `Backend::rope_kv_write`, done in its epilogue when the GEMV is the row's Q|K|V group;
//! or the residual add and norm split around it), the residual add runs inside the next
//! norm, and a whole-row norm writes the q8_1 tiles its GEMVs read (the matmul finds them
//! in a one-entry cache). Every other op launches what is deferred first, so the order of
//! effects is the model's.
//!
//! The files, by job: this one holds the backend's state (the types every file shares,
//! opening, settings, errors), grouped by job into the state of the files below;
//! `backend_ops` the [`crate::backend::Backend`] ops and their fusion decisions;
//! `deferred` what waits for the next op; [`fusion`] the matmul-group planner; `matmul`,
//! `ops`, `attention`, `moe` and [`delta`] (the hybrid models' delta-net layers and gates,
//! and each sequence's recurrent state) the kernel launches; `held` the device buffers
//! graphs hold; `memory` weight memory, tensor loading and the scratch arena; `step_io`
//! the step buffer and the copy of the logits; `diagnostics` what the measurement
//! settings keep; [`runner`] the engine's step loop with its CUDA graphs; [`options`]
//! every setting.

mod arena;
mod attention;
mod backend_ops;
pub mod comm;
mod deferred;
pub mod delta;
mod diagnostics;
pub mod fusion;
mod held;
pub mod isq;
mod matmul;
mod matmul_choice;
mod memory;
mod moe;
mod ops;
pub mod options;
mod profile;
pub mod runner;
pub mod step;
mod step_io;
mod timeline;
pub mod upload;
pub mod weights;

use std::sync::{Arc, Mutex, MutexGuard};

use smelt_cuda::cudarc::driver::CudaSlice;
use smelt_cuda::{CudaError, Gpu};
use smelt_gguf::GgmlType;

use self::arena::StepScratch;
use self::options::CudaOptions;
use self::step_io::{Staging, StepBuf};
use crate::EngineError;

pub(crate) use self::step_io::StepPtrs;

pub use runner::CudaEngine;

/// An activation matrix in device memory: `rows x cols` f32, row-major, at `ptr` (scratch
/// of the current step). `cap` is how many floats the buffer holds: an op whose output
/// outgrows it (the trait lets outputs change shape, as a `Vec` would) gets a new buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaTensor {
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
    pub cap: usize,
}

/// A weight on the device, at `ptr` in the backend's weight memory (which lives as long as
/// the backend). The members of a group (`load_weight_group`: a layer's Q, K and V; gate
/// and up) are adjacent there, so one GEMV launch can multiply all their rows.
pub enum CudaWeight {
    /// A matmul operand in the GEMV's row layout.
    Matrix {
        ptr: u64,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        row_bytes: usize,
    },
    /// An embedding table in ggml's layout.
    Embedding {
        ptr: u64,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// f32 values.
    Vector { ptr: u64, len: usize },
    /// A mixture-of-experts tensor: `n_expert` matrices in the GEMV's row layout, one after
    /// the other (`rows * row_bytes` bytes each).
    Experts {
        ptr: u64,
        ty: GgmlType,
        n_expert: usize,
        rows: usize,
        cols: usize,
        row_bytes: usize,
    },
    /// An f32 matrix (a router's weights), rows of `cols` floats.
    Dense { ptr: u64, rows: usize, cols: usize },
}

impl CudaWeight {
    /// What the fusion planner needs of a matrix ([`fusion::Member`]); `None` for the
    /// other kinds of weight.
    fn member(&self) -> Option<fusion::Member> {
        match *self {
            CudaWeight::Matrix {
                ptr,
                ty,
                rows,
                cols,
                row_bytes,
            } => Some(fusion::Member {
                ptr,
                ty,
                rows,
                cols,
                row_bytes,
            }),
            _ => None,
        }
    }

    fn ptr(&self) -> u64 {
        match self {
            CudaWeight::Matrix { ptr, .. }
            | CudaWeight::Embedding { ptr, .. }
            | CudaWeight::Vector { ptr, .. }
            | CudaWeight::Experts { ptr, .. }
            | CudaWeight::Dense { ptr, .. } => *ptr,
        }
    }
}

/// A GEMM input and what the GEMMs made of it (`FusionState::gemm_quantized`): scratch
/// addresses of its int8 tiles and of its f16 rows, when made.
#[derive(Clone, Copy, Debug)]
struct GemmInput {
    x: CudaTensor,
    tiles: Option<u64>,
    f16: Option<u64>,
}

/// The q8_1 tiles of a matmul input `x` at `q`, kept so the next matmuls of the same
/// activations reuse them.
#[derive(Clone, Copy, Debug)]
struct Quantized {
    x: CudaTensor,
    q: u64,
    /// The tiles are a split residual norm's (`gemv::Fuse`): unscaled by `1 / rms`.
    rms: Option<SplitNorm>,
}

/// The second half of a residual add + RMS norm that a GEMV (`Fuse::ResidualNorm`) began:
/// what the consumer GEMV (`Fuse::RmsInput`) reads to scale by `1 / rms`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SplitNorm {
    /// One f32 sum of squares per producer block.
    partials: u64,
    nparts: usize,
    eps: f32,
    /// The residual stream (updated by the producer), the norm's weights and output.
    res: CudaTensor,
    g: u64,
    out: CudaTensor,
    /// Whether `out` is still to be written: by the first consumer, or by a plain norm
    /// when an op other than a matmul comes first.
    out_pending: bool,
}

/// A single-token GEMV not launched yet: the next members of its run
/// ([`fusion::runs`]) join it (one launch, more rows in flight), and the ops that read its
/// output may fuse with it (rope + KV append, a split residual norm).
#[derive(Clone, Copy, Debug)]
struct PendingGemv {
    w: u64,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    x: CudaTensor,
    q: u64,
    out: u64,
    rms: Option<SplitNorm>,
}

/// Decode steps of at least this many sequences use the tensor-core attention for every
/// row. H100, 2026-11-26 (bench/RESULTS.md): 64 sequences decoded 6,109 tok/s with it (and the
/// GEMM for every matmul) against 4,938 with the split attention.
pub const FLASH_DECODE_SEQS: usize = 16;

/// Delta-net steps whose longest sequence has at least this many tokens take the chunked
/// kernels (`smelt_kernels::delta_chunk`), shorter ones the token-by-token step. H100,
/// 2026-11-27 (bench/gpu/hybrid.sh run 1, 27B shape, one layer): 64 tokens 81 us token by
/// token against 111 chunked, 512 tokens 642 against 572: even at about 200.
pub const DELTA_CHUNK_MIN_TOKENS: usize = 256;

/// The KV cache: per layer, K and V as f16 `[n_blocks][block_size][kv_dim]`.
pub struct CudaKv {
    pub k: Vec<CudaSlice<u16>>,
    pub v: Vec<CudaSlice<u16>>,
    pub n_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
}

// SAFETY: `host_ptr` points into `host`, which lives as long as this struct; access goes
// through the backend's mutex.

/// The CUDA backend of one device.
pub struct Cuda {
    gpu: Arc<Gpu>,
    scratch: Mutex<StepScratch<CudaSlice<u8>>>,
    step: Mutex<Option<StepBuf>>,
    error: Mutex<Option<CudaError>>,
    /// What an op leaves for the next ones of the step (`deferred`).
    fusion: deferred::FusionState,
    staging: Mutex<Option<Staging>>,
    /// Every setting, read once at open ([`options`]).
    opts: CudaOptions,
    /// Device buffers made once that graphs hold the address of (`held`).
    held: held::HeldBuffers,
    /// Weight memory and what fills it (`memory`).
    store: memory::WeightStore,
    /// Measurement of the kernels and their results (`diagnostics`).
    diag: diagnostics::Diagnostics,
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if let Some(d) = &self.diag.digest {
            let d = lock(d);
            eprintln!("CUDA digest: {:016x} over {} host copies", d.0, d.1);
        }
        if let Some(d) = &self.diag.launch_digest {
            let d = lock(d);
            eprintln!("CUDA launches: {:016x} over {} launches", d.0, d.1);
        }
        if let Some(p) = &self.diag.profile {
            let p = lock(p);
            if p.steps() > 0 {
                eprint!("{}", p.table());
            }
        }
        if let Some(t) = &self.diag.timeline {
            eprint!("{}", lock(t).table());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cuda {
    /// Opens CUDA device `ordinal` (a missing driver or device is an error, never a panic).
    /// With `batch_invariant` (or `SMELT_CUDA_BATCH_INVARIANT=1`, for measurement scripts),
    /// results do not depend on the batch (`EngineOptions::batch_invariant`).
    pub fn open(ordinal: usize, batch_invariant: bool) -> Result<Cuda, EngineError> {
        Self::open_with(ordinal, CudaOptions::from_env(batch_invariant))
    }

    /// Opens CUDA device `ordinal` with settings `opts` (the GPU checks run one op on both
    /// of two kernels a setting chooses between).
    pub fn open_with(ordinal: usize, opts: CudaOptions) -> Result<Cuda, EngineError> {
        let gpu = Gpu::open_with(ordinal, &opts.launch.gpu)?;
        if !opts.debug.skip.is_empty() {
            eprintln!(
                "smelt: SMELT_CUDA_SKIP leaves out kernels starting with {:?}: outputs are wrong, for timing only",
                opts.debug.skip
            );
        }
        let timeline = match gpu.timeline() {
            true => Some(Mutex::new(timeline::Timeline::new(&gpu)?)),
            false => None,
        };
        Ok(Cuda {
            gpu,
            scratch: Mutex::new(StepScratch::new(opts.launch.layer_scratch)),
            step: Mutex::new(None),
            error: Mutex::new(None),
            fusion: deferred::FusionState {
                quantized: Mutex::new(None),
                gemm_quantized: Mutex::new(None),
                pending_add: Mutex::new(None),
                pending_gemv: Mutex::new(None),
                moe_plan: Mutex::new(None),
            },
            staging: Mutex::new(None),
            held: held::HeldBuffers {
                columns: Mutex::new(Default::default()),
                attn_counters: Mutex::new(None),
                moe_counter: Mutex::new(None),
                gemm_counters: Mutex::new(None),
                argmax_state: Mutex::new(None),
            },
            store: memory::WeightStore {
                uploader: Mutex::new(None),
                weights: Mutex::new((Vec::new(), 0, 0)),
                weight_ranges: Mutex::new(Vec::new()),
                isq: Mutex::new(None),
            },
            diag: diagnostics::Diagnostics {
                profile: (opts.debug.profile != options::Profile::Off)
                    .then(|| Mutex::new(profile::Profile::default())),
                timeline,
                launch_digest: opts
                    .debug
                    .digest
                    .then(|| Mutex::new((0xcbf2_9ce4_8422_2325, 0))),
                digest: opts
                    .debug
                    .digest
                    .then(|| Mutex::new((0xcbf2_9ce4_8422_2325, 0))),
            },
            opts,
        })
    }

    /// The settings this backend was opened with.
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Whether kernel `name` is left out by `SMELT_CUDA_SKIP` (timing ablations).
    pub(crate) fn skipped(&self, name: &str) -> bool {
        self.opts
            .debug
            .skip
            .iter()
            .any(|p| p == "all" || name.starts_with(p.as_str()))
    }

    /// Fewest query tokens of a sequence for the tensor-core prompt attention in a step of
    /// `n_seqs` sequences: every sequence in batch-invariant mode, whose attention must not
    /// depend on how a prompt was cut (the prompt kernel walks a query's keys in fixed tiles
    /// from position 0, so a query's result is the same in any chunk; the split kernel's
    /// partition is not), and in steps of at least [`FLASH_DECODE_SEQS`] sequences, where
    /// one block per sequence and head group already fills the GPU.
    pub(crate) fn flash_min_tokens(&self, n_seqs: usize) -> usize {
        if self.opts.batch_invariant || n_seqs >= self.opts.attention.flash_decode_seqs {
            1
        } else {
            smelt_kernels::ops::flash::MIN_TOKENS
        }
    }

    /// Whether prompt steps are profiled too (`SMELT_CUDA_PROFILE=all`).
    pub fn profiling_all_steps(&self) -> bool {
        self.opts.debug.profile == options::Profile::All
    }

    /// Whether decode steps are captured and replayed as CUDA graphs.
    pub fn graphs(&self) -> bool {
        self.opts.launch.graphs
    }

    /// Whether kernels are being timed one by one (graphs are then off).
    pub fn profiling(&self) -> bool {
        self.diag.profile.is_some()
    }

    /// Starts a step of the timeline (`SMELT_CUDA_TIMELINE=1`): decode steps record.
    pub(crate) fn timeline_begin(&self, decode: bool) -> Result<(), CudaError> {
        match &self.diag.timeline {
            Some(t) => lock(t).begin(&self.gpu, decode),
            None => Ok(()),
        }
    }

    /// Ends a step of the timeline: waits for it and adds its stamps up.
    pub(crate) fn timeline_end(&self) -> Result<(), CudaError> {
        match &self.diag.timeline {
            Some(t) => lock(t).end(&self.gpu),
            None => Ok(()),
        }
    }

    /// Starts timing a step's kernels (when profiling).
    pub(crate) fn profile_begin(&self) -> Result<(), CudaError> {
        match &self.diag.profile {
            Some(p) => lock(p).begin(&self.gpu),
            None => Ok(()),
        }
    }

    /// Marks the end of kernel `name`, just launched (when profiling).
    pub(crate) fn profile_mark(&self, name: &str) -> Result<(), CudaError> {
        match &self.diag.profile {
            Some(p) => lock(p).mark(&self.gpu, name),
            None => Ok(()),
        }
    }

    /// Waits for the timed step and adds it up (when profiling).
    pub(crate) fn profile_end(&self) -> Result<(), CudaError> {
        match &self.diag.profile {
            Some(p) => lock(p).end(&self.gpu),
            None => Ok(()),
        }
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The first error an op hit since the last call, if any.
    pub fn take_error(&self) -> Result<(), EngineError> {
        match lock(&self.error).take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    fn failed(&self) -> bool {
        lock(&self.error).is_some()
    }

    /// Runs an op's launches unless an earlier op failed; keeps its error. The deferred add
    /// is launched first and the quantized-input cache forgotten (the op may write anything).
    fn run(&self, f: impl FnOnce() -> Result<(), CudaError>) {
        self.run_raw(|| {
            self.flush()?;
            self.forget_quantized()?;
            f()
        })
    }

    fn run_raw(&self, f: impl FnOnce() -> Result<(), CudaError>) {
        if self.failed() {
            return;
        }
        if let Err(e) = f() {
            let mut err = lock(&self.error);
            if err.is_none() {
                *err = Some(e);
            }
        }
    }
}
