//! The CUDA backend: weights uploaded once (quantized matrices repacked to the GEMV's row
//! layout, vectors as f32, the embedding table in ggml's layout), activations as f32 rows
//! in a per-step scratch arena, the KV cache as f16 blocks, every op a kernel of
//! `smelt-kernels` launched on the device's one stream.
//!
//! The [`Backend`] trait's ops cannot fail except `matmul` and `embed`; a driver error in
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
//! ops): that GEMV waits for the ops that read its output (rope and KV append in its
//! epilogue, or the residual add and norm split around it), Q's rope takes K's row along,
//! the residual add runs inside the next norm, and a whole-row norm writes the q8_1 tiles
//! its GEMVs read (the matmul finds them in a one-entry cache). Every other op launches
//! what is deferred first, so the order of effects is the model's.

mod arena;
pub mod comm;
pub mod fusion;
pub mod isq;
mod matmul;
mod moe;
mod ops;
pub mod options;
mod profile;
pub mod runner;
pub mod step;
mod timeline;
pub mod upload;
pub mod weights;

use std::sync::{Arc, Mutex, MutexGuard};

use smelt_cuda::cudarc::driver::result as cu;
use smelt_cuda::cudarc::driver::{CudaSlice, PinnedHostSlice};
use smelt_cuda::{CudaError, Gpu};
use smelt_gguf::{GgmlType, Gguf};
use smelt_kernels::{act, catalog};

use self::arena::Arena;
use self::options::CudaOptions;
use self::step::StepLayout;
use self::weights::{Role, WeightPlan};
use super::{AttnParams, AttnSeq, Backend, Glu, MoeRouting, RopeParams, RopeStyle};
use crate::EngineError;

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

/// A GEMM input and what the GEMMs made of it (`Cuda::gemm_quantized`): scratch
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

/// A single-row rope not launched yet: the next rope of the row that follows it in memory
/// with the same parameters (K after Q) joins it, and a KV write of its K part fuses
/// with it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingRope {
    x: CudaTensor,
    positions: u64,
    head_dim: usize,
    p: RopeParams,
    freq_factors: u64,
}

/// Pinned host memory logits are copied through (a pageable copy is several times slower).
struct Staging {
    _buf: PinnedHostSlice<f32>,
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `ptr` points into `_buf`, owned alongside; used under the backend's mutex.
unsafe impl Send for Staging {}

/// Decode steps of at least this many sequences use the tensor-core attention for every
/// row. H100, 2026-11-26 (bench/RESULTS.md): 64 sequences decoded 6,109 tok/s with it (and the
/// GEMM for every matmul) against 4,938 with the split attention.
pub const FLASH_DECODE_SEQS: usize = 16;

/// Weight chunks of this many bytes (a larger tensor gets a chunk of its own).
const WEIGHT_CHUNK: usize = 256 << 20;

/// The KV cache: per layer, K and V as f16 `[n_blocks][block_size][kv_dim]`.
pub struct CudaKv {
    pub k: Vec<CudaSlice<u16>>,
    pub v: Vec<CudaSlice<u16>>,
    pub n_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
}

/// The step buffer: pinned host words the engine fills, their device copy the kernels read.
struct StepBuf {
    layout: StepLayout,
    /// Owner of the memory `host_ptr` points into.
    _host: PinnedHostSlice<u32>,
    host_ptr: *mut u32,
    /// Owner of the memory `dev_ptr` points into.
    _dev: CudaSlice<u32>,
    dev_ptr: u64,
    n_tokens: usize,
    n_seqs: usize,
    max_tokens: usize,
    generation: u64,
}

// SAFETY: `host_ptr` points into `host`, which lives as long as this struct; access goes
// through the backend's mutex.
unsafe impl Send for StepBuf {}

/// The CUDA backend of one device.
pub struct Cuda {
    gpu: Arc<Gpu>,
    scratch: Mutex<Arena<CudaSlice<u8>>>,
    step: Mutex<Option<StepBuf>>,
    error: Mutex<Option<CudaError>>,
    /// The last matmul input and its q8_1 tiles: Q, K and V (and gate and up) multiply the
    /// same activations, which are quantized once. Any other op forgets it.
    quantized: Mutex<Option<Quantized>>,
    /// The same for the GEMMs' inputs: an activation and its int8 tiles (`gemm::act`)
    /// and f16 rows (`gemm::f16`), each made once for every matmul of it.
    gemm_quantized: Mutex<Option<GemmInput>>,
    /// `x += y` not launched yet: when the next op is the norm of `x` (the residual stream
    /// then the next block's norm), both run as one fused kernel.
    pending_add: Mutex<Option<(CudaTensor, CudaTensor)>>,
    pending_gemv: Mutex<Option<PendingGemv>>,
    pending_rope: Mutex<Option<PendingRope>>,
    /// The expert plan of this step's last route (`moe`).
    moe_plan: Mutex<moe::PlanCache>,
    staging: Mutex<Option<Staging>>,
    /// Pinned buffers weights are uploaded through (made at the first upload).
    uploader: Mutex<Option<upload::Uploader>>,
    /// Every setting, read once at open ([`options`]).
    opts: CudaOptions,
    /// The combining attention's counters: zero between launches (each launch leaves them
    /// so), allocated once and never moved (graphs hold the address).
    attn_counters: Mutex<Option<CudaSlice<u32>>>,
    /// The split argmax's per-row words and counters (zero between launches; graphs hold
    /// the address).
    argmax_state: Mutex<Option<CudaSlice<u64>>>,
    /// Weight memory: chunks bump-allocated in load order; (chunks, next free, end).
    weights: Mutex<(Vec<CudaSlice<u8>>, u64, u64)>,
    /// Every weight's place and size in weight memory, in load order (for
    /// [`Cuda::weights_digest`]).
    weight_ranges: Mutex<Vec<(u64, usize)>>,
    /// In-situ quantization into device memory while a model loads ([`isq`]).
    isq: Mutex<Option<isq::IsqLoader>>,
    /// GPU time per kernel of eager decode steps (`SMELT_CUDA_PROFILE=1`).
    profile: Option<Mutex<profile::Profile>>,
    /// Block timestamps of decode steps as their graphs run (`SMELT_CUDA_TIMELINE=1`).
    timeline: Option<Mutex<timeline::Timeline>>,
    /// `SMELT_CUDA_DIGEST=1`: an FNV-1a hash of the bits of everything copied to the host
    /// (logits) and the number of copies, printed when the backend is dropped, so runs
    /// under different launch settings can be shown to compute the same bits (a race
    /// between kernels would change them).
    digest: Option<Mutex<(u64, u64)>>,
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if let Some(d) = &self.digest {
            let d = lock(d);
            eprintln!("CUDA digest: {:016x} over {} host copies", d.0, d.1);
        }
        if let Some(p) = &self.profile {
            let p = lock(p);
            if p.steps() > 0 {
                eprint!("{}", p.table());
            }
        }
        if let Some(t) = &self.timeline {
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
            scratch: Mutex::new(Arena::default()),
            step: Mutex::new(None),
            error: Mutex::new(None),
            quantized: Mutex::new(None),
            gemm_quantized: Mutex::new(None),
            pending_add: Mutex::new(None),
            pending_gemv: Mutex::new(None),
            pending_rope: Mutex::new(None),
            moe_plan: Mutex::new(None),
            staging: Mutex::new(None),
            uploader: Mutex::new(None),
            attn_counters: Mutex::new(None),
            argmax_state: Mutex::new(None),
            weights: Mutex::new((Vec::new(), 0, 0)),
            weight_ranges: Mutex::new(Vec::new()),
            isq: Mutex::new(None),
            profile: (opts.debug.profile != options::Profile::Off)
                .then(|| Mutex::new(profile::Profile::default())),
            timeline,
            digest: opts
                .debug
                .digest
                .then(|| Mutex::new((0xcbf2_9ce4_8422_2325, 0))),
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
        self.profile.is_some()
    }

    /// Starts a step of the timeline (`SMELT_CUDA_TIMELINE=1`): decode steps record.
    pub(crate) fn timeline_begin(&self, decode: bool) -> Result<(), CudaError> {
        match &self.timeline {
            Some(t) => lock(t).begin(&self.gpu, decode),
            None => Ok(()),
        }
    }

    /// Ends a step of the timeline: waits for it and adds its stamps up.
    pub(crate) fn timeline_end(&self) -> Result<(), CudaError> {
        match &self.timeline {
            Some(t) => lock(t).end(&self.gpu),
            None => Ok(()),
        }
    }

    /// Starts timing a step's kernels (when profiling).
    pub(crate) fn profile_begin(&self) -> Result<(), CudaError> {
        match &self.profile {
            Some(p) => lock(p).begin(&self.gpu),
            None => Ok(()),
        }
    }

    /// Marks the end of kernel `name`, just launched (when profiling).
    pub(crate) fn profile_mark(&self, name: &str) -> Result<(), CudaError> {
        match &self.profile {
            Some(p) => lock(p).mark(&self.gpu, name),
            None => Ok(()),
        }
    }

    /// Waits for the timed step and adds it up (when profiling).
    pub(crate) fn profile_end(&self) -> Result<(), CudaError> {
        match &self.profile {
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

    fn new_chunk(gpu: &Gpu) -> impl FnMut(usize) -> Result<(CudaSlice<u8>, u64), CudaError> + '_ {
        move |bytes| {
            let buf = gpu.zeros::<u8>(bytes)?;
            let p = gpu.ptr(&buf);
            Ok((buf, p))
        }
    }

    /// Copies `bytes` into weight memory (adjacent to the previous weight when it fits the
    /// current chunk) and returns its address.
    fn upload_weight(&self, bytes: &[u8]) -> Result<u64, CudaError> {
        let p = self.reserve_weight(bytes.len())?;
        if !bytes.is_empty() && self.opts.launch.plain_upload {
            self.gpu.synchronize()?;
            // SAFETY: `p` has room for `bytes`; a synchronous copy from host memory.
            unsafe { cu::memcpy_htod_sync(p, bytes) }?;
        } else if !bytes.is_empty() {
            let mut up = lock(&self.uploader);
            if up.is_none() {
                *up = Some(upload::Uploader::new(&self.gpu)?);
            }
            if let Some(u) = up.as_mut() {
                // Queued on the stream after the chunk's allocation, before any kernel.
                u.upload(&self.gpu, p, bytes)?;
            }
        }
        Ok(p)
    }

    /// Room for `n` bytes of weight memory (adjacent to the previous weight when it fits
    /// the current chunk; a new chunk is allocated on the device's stream), unwritten.
    fn reserve_weight(&self, n: usize) -> Result<u64, CudaError> {
        let len = n.max(1).div_ceil(arena::ALIGN) * arena::ALIGN;
        self.weight_room(len)?;
        let mut w = lock(&self.weights);
        let p = w.1;
        w.1 += len as u64;
        drop(w);
        lock(&self.weight_ranges).push((p, n));
        Ok(p)
    }

    /// Makes the current weight chunk hold `len` more bytes: a new chunk (on the device's
    /// stream) when it does not.
    fn weight_room(&self, len: usize) -> Result<(), CudaError> {
        let mut w = lock(&self.weights);
        if w.1 + len as u64 > w.2 {
            let size = len.max(WEIGHT_CHUNK);
            // SAFETY: written by the uploads that reserve it (and the tail of a chunk is
            // never read).
            let buf = unsafe { self.gpu.stream().alloc::<u8>(size) }?;
            let base = self.gpu.ptr(&buf);
            w.0.push(buf);
            w.1 = base;
            w.2 = base + size as u64;
        }
        Ok(())
    }

    /// Bytes of weight memory tensor `name` takes as a matmul operand (as `load` will
    /// place it: the ISQ plan's type, the GEMV's row layout, rounded up as reserved).
    fn planned_bytes(&self, gguf: &Gguf, name: &str) -> Result<usize, EngineError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        let ty = self.isq_type(name).unwrap_or(info.ty);
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let bytes = match weights::plan(name, ty, info.shape.len(), rows, cols, Role::Matmul)? {
            WeightPlan::Gemv { row_bytes } | WeightPlan::Embedding { row_bytes } => {
                rows * row_bytes
            }
            WeightPlan::Vector => rows * cols * 4,
        };
        Ok(bytes.max(1).div_ceil(arena::ALIGN) * arena::ALIGN)
    }

    /// A hash of every weight's bytes in weight memory, in load order, and their count and
    /// total size (`SMELT_CUDA_WEIGHT_DIGEST=1` prints it after a load): two loads with the
    /// same digest put the same model on the device (a file's and `--isq`'s).
    pub fn weights_digest(&self) -> Result<(u64, usize, u64), CudaError> {
        self.gpu.synchronize()?;
        let ranges = lock(&self.weight_ranges).clone();
        let mut total = 0u64;
        let mut hashes = Vec::with_capacity(ranges.len());
        for &(p, n) in &ranges {
            let mut host = vec![0u8; n];
            if n > 0 {
                // SAFETY: `p` holds `n` bytes of weight memory; a synchronous copy.
                unsafe { cu::memcpy_dtoh_sync(&mut host, p) }?;
            }
            total += n as u64;
            hashes.push(upload::digest(&host));
        }
        let h = hashes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
            (h ^ x).wrapping_mul(0x0100_0000_01b3)
        });
        Ok((h, ranges.len(), total))
    }

    /// Forgets the cached matmul input; a split norm whose output no GEMV wrote yet writes
    /// it now (with the plain norm kernel: the residual is already updated).
    fn forget_quantized(&self) -> Result<(), CudaError> {
        *lock(&self.gemm_quantized) = None;
        let cached = lock(&self.quantized).take();
        if let Some(Quantized {
            rms:
                Some(
                    n @ SplitNorm {
                        out_pending: true, ..
                    },
                ),
            ..
        }) = cached
        {
            let g = CudaWeight::Vector {
                ptr: n.g,
                len: n.res.cols,
            };
            self.op_rms_norm(&n.res, &g, n.eps, &n.out)?;
        }
        Ok(())
    }

    /// Launches whatever is deferred (a GEMV, an add or a rope; at most one is at a time).
    pub fn flush(&self) -> Result<(), CudaError> {
        self.flush_gemv()?;
        self.flush_rope()?;
        self.flush_add()
    }

    fn flush_rope(&self) -> Result<(), CudaError> {
        let pending = lock(&self.pending_rope).take();
        match pending {
            Some(r) => self.op_rope(&r.x, r.positions, r.head_dim, &r.p, r.freq_factors),
            None => Ok(()),
        }
    }

    fn flush_gemv(&self) -> Result<(), CudaError> {
        let pending = lock(&self.pending_gemv).take();
        match pending {
            Some(p) => self.launch_pending_gemv(&p, None),
            None => Ok(()),
        }
    }

    /// Launches the deferred single-token GEMV `p` (with the rope + KV-append epilogue's
    /// parameters `rope`, see [`Cuda::launch_gemv`]).
    fn launch_pending_gemv(
        &self,
        p: &PendingGemv,
        rope: Option<&smelt_kernels::gemv::RopeKvArgs>,
    ) -> Result<(), CudaError> {
        self.launch_gemv(
            p.w,
            p.ty,
            p.rows,
            p.cols,
            p.row_bytes,
            p.q,
            p.out,
            1,
            p.rms.as_ref(),
            rope,
        )
    }

    /// Launches the deferred add, if any.
    fn flush_add(&self) -> Result<(), CudaError> {
        let pending = lock(&self.pending_add).take();
        match pending {
            Some((x, y)) => self.op_add(&x, &y),
            None => Ok(()),
        }
    }

    /// Makes the outputs of a fused single-token run (`ws` the run's weights) follow one
    /// another, as the one GEMV writes them: left where they are when they already do
    /// ([`fusion::outputs_follow`]), else views, in order, of one new scratch buffer.
    fn place_run_outputs(
        &self,
        ws: &[&CudaWeight],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), CudaError> {
        let widths: Vec<usize> = ws
            .iter()
            .map(|w| w.member().map_or(0, |m| m.rows))
            .collect();
        let at: Vec<(u64, usize)> = outs.iter().map(|o| (o.ptr, o.cap)).collect();
        if fusion::outputs_follow(&at, &widths) {
            return Ok(());
        }
        let total: usize = widths.iter().sum();
        let mut p = self.scratch(total * 4)?;
        for (o, &w) in outs.iter_mut().zip(&widths) {
            **o = CudaTensor {
                ptr: p,
                rows: 1,
                cols: w,
                cap: w,
            };
            p += (w * 4) as u64;
        }
        Ok(())
    }

    /// Gives `t` room for `rows x cols` (a new scratch buffer when it has less) and that shape.
    fn ensure(&self, t: &mut CudaTensor, rows: usize, cols: usize) -> Result<(), CudaError> {
        if rows * cols > t.cap {
            t.ptr = self.scratch(rows * cols * 4)?;
            t.cap = rows * cols;
        }
        t.rows = rows;
        t.cols = cols;
        Ok(())
    }

    /// Scratch bytes for this step (zero-size requests get a valid address too).
    fn scratch(&self, bytes: usize) -> Result<u64, CudaError> {
        let mut chunk = Self::new_chunk(&self.gpu);
        let mut arena = lock(&self.scratch);
        arena.alloc(bytes, &mut chunk)
    }

    /// Starts a step: writes its inputs into the pinned step buffer (growing it when they do
    /// not fit) and resets the scratch arena. Enqueues nothing: [`Cuda::upload_step`] does.
    pub fn begin_step(
        &self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
    ) -> Result<(), EngineError> {
        let blocks: usize = seqs.iter().map(|s| s.blocks.len()).sum();
        let mut step = lock(&self.step);
        let fits = step
            .as_ref()
            .is_some_and(|s| s.layout.fits(tokens.len(), seqs.len(), blocks));
        if !fits {
            let generation = step.as_ref().map_or(0, |s| s.generation + 1);
            // Keep what we had room for, so alternating shapes do not reallocate.
            let (t, s, b) = step.as_ref().map_or((0, 0, 0), |s| {
                (s.layout.cap_tokens, s.layout.cap_seqs, s.layout.cap_blocks)
            });
            let layout =
                StepLayout::with_room(tokens.len().max(t), seqs.len().max(s), blocks.max(b));
            self.gpu.synchronize()?;
            // SAFETY: pinned host memory for plain words; zeroed below before use.
            let mut host = unsafe { self.gpu.context().alloc_pinned::<u32>(layout.words()) }
                .map_err(CudaError::from)?;
            let host_ptr = host.as_mut_ptr().map_err(CudaError::from)?;
            // SAFETY: `host_ptr` is `layout.words()` words of pinned memory.
            unsafe { std::ptr::write_bytes(host_ptr, 0, layout.words()) };
            let dev = self.gpu.zeros::<u32>(layout.words())?;
            let dev_ptr = self.gpu.ptr(&dev);
            *step = Some(StepBuf {
                layout,
                _host: host,
                host_ptr,
                _dev: dev,
                dev_ptr,
                n_tokens: 0,
                n_seqs: 0,
                max_tokens: 0,
                generation,
            });
        }
        let Some(s) = step.as_mut() else {
            return Err(EngineError::BadOptions("no step buffer".into()));
        };
        // SAFETY: `host_ptr` is `layout.words()` words of pinned memory; the previous step
        // finished (the engine downloads its logits) before this one writes.
        let words = unsafe { std::slice::from_raw_parts_mut(s.host_ptr, s.layout.words()) };
        s.layout.fill(words, tokens, positions, seqs)?;
        s.n_tokens = tokens.len();
        s.n_seqs = seqs.len();
        s.max_tokens = seqs.iter().map(|q| q.n_tokens).max().unwrap_or(0);
        drop(step);
        // Nothing of the last step's scratch is read again: forget what pointed into it.
        *lock(&self.quantized) = None;
        *lock(&self.gemm_quantized) = None;
        *lock(&self.pending_add) = None;
        *lock(&self.pending_gemv) = None;
        *lock(&self.pending_rope) = None;
        *lock(&self.moe_plan) = None;
        let mut chunk = Self::new_chunk(&self.gpu);
        lock(&self.scratch).reset(0, &mut chunk)?;
        Ok(())
    }

    /// Enqueues the copy of the step buffer to the device (captured into a decode graph,
    /// it re-reads the host words at every replay).
    pub fn upload_step(&self) -> Result<(), EngineError> {
        let step = lock(&self.step);
        let Some(s) = step.as_ref() else {
            return Err(EngineError::BadOptions(
                "upload_step before begin_step".into(),
            ));
        };
        // SAFETY: pinned source of `words()` words, device destination of the same size.
        let words = unsafe { std::slice::from_raw_parts(s.host_ptr, s.layout.words()) };
        unsafe { cu::memcpy_htod_async(s.dev_ptr, words, self.gpu.stream().cu_stream()) }
            .map_err(CudaError::from)?;
        Ok(())
    }

    /// Changes whenever a buffer whose address a graph holds moves.
    pub fn generation(&self) -> u64 {
        let a = lock(&self.scratch).generation();
        let s = lock(&self.step).as_ref().map_or(0, |s| s.generation);
        a.wrapping_mul(1 << 32).wrapping_add(s)
    }

    /// Device addresses of the step's sections: (tokens, positions, descriptors, block tables).
    fn step_ptrs(&self) -> Result<StepPtrs, CudaError> {
        let step = lock(&self.step);
        let s = step
            .as_ref()
            .ok_or_else(|| CudaError::Init("an op ran before the step buffer existed".into()))?;
        let at = |w: usize| s.dev_ptr + 4 * w as u64;
        Ok(StepPtrs {
            tokens: at(s.layout.tokens()),
            positions: at(s.layout.positions()),
            descs: at(s.layout.descs()),
            block_tables: at(s.layout.block_tables()),
            n_tokens: s.n_tokens,
            n_seqs: s.n_seqs,
            max_tokens: s.max_tokens,
        })
    }

    /// Copies a tensor to the host (waits for the stream).
    pub fn download(&self, x: &CudaTensor) -> Result<Vec<f32>, CudaError> {
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut st = lock(&self.staging);
        if st.as_ref().is_none_or(|s| s.len < n) {
            self.gpu.synchronize()?;
            // SAFETY: pinned host floats, written by the copy below before they are read.
            let mut buf = unsafe { self.gpu.context().alloc_pinned::<f32>(n) }?;
            let ptr = buf.as_mut_ptr()?;
            *st = Some(Staging {
                _buf: buf,
                ptr,
                len: n,
            });
        }
        let Some(s) = st.as_ref() else {
            return Err(CudaError::Init("no staging buffer".into()));
        };
        // SAFETY: `s.ptr` holds at least `n` floats of pinned memory, and `x` is `n` floats
        // of device memory alive until the next step.
        let host = unsafe { std::slice::from_raw_parts_mut(s.ptr, n) };
        unsafe { cu::memcpy_dtoh_async(host, x.ptr, self.gpu.stream().cu_stream()) }?;
        self.gpu.synchronize()?;
        if let Some(d) = &self.digest {
            let mut d = lock(d);
            for v in host.iter() {
                d.0 = (d.0 ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
            }
            d.1 += 1;
        }
        Ok(host.to_vec())
    }

    fn load(&self, gguf: &Arc<Gguf>, name: &str, role: Role) -> Result<CudaWeight, EngineError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        if let Some(w) = self.load_isq(gguf, info, role)? {
            return Ok(w);
        }
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let data = gguf.tensor_data(info);
        self.load_bytes(name, info.ty, info.shape.len(), rows, cols, data, role)
    }

    /// Puts a tensor of `ty` (`n_dims` dimensions, `rows` x `cols`, ggml's bytes `data`)
    /// on the device as `role` needs it.
    #[allow(clippy::too_many_arguments)]
    fn load_bytes(
        &self,
        name: &str,
        ty: GgmlType,
        n_dims: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        role: Role,
    ) -> Result<CudaWeight, EngineError> {
        let w = match weights::plan(name, ty, n_dims, rows, cols, role)? {
            WeightPlan::Vector => {
                let mut v = vec![0f32; rows * cols];
                for (src, dst) in data
                    .chunks(cols / ty.block_size() * ty.type_size())
                    .zip(v.chunks_mut(cols))
                {
                    smelt_quant::dequantize_row(ty, src, dst).map_err(|_| {
                        EngineError::UnsupportedType {
                            name: name.into(),
                            ty,
                        }
                    })?;
                }
                CudaWeight::Vector {
                    ptr: self.upload_weight(bytemuck::cast_slice(&v))?,
                    len: v.len(),
                }
            }
            WeightPlan::Gemv { .. } => {
                let row_bytes = catalog::row_bytes(ty, cols).map_err(CudaError::from)?;
                let packed = upload::repack_parallel(
                    ty,
                    data,
                    rows,
                    cols,
                    row_bytes,
                    self.opts.launch.plain_upload,
                )
                .map_err(|e| EngineError::BadMetadata {
                    key: name.into(),
                    why: format!("repacking for the GPU: {e}"),
                })?;
                CudaWeight::Matrix {
                    ptr: self.upload_weight(&packed)?,
                    ty,
                    rows,
                    cols,
                    row_bytes,
                }
            }
            WeightPlan::Embedding { .. } => CudaWeight::Embedding {
                ptr: self.upload_weight(data)?,
                ty,
                rows,
                cols,
            },
        };
        upload::LOADED_BYTES.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(w)
    }

    fn copy_rows(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges are device scratch of at least `bytes`.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.gpu.stream().cu_stream()) }?;
        self.profile_mark("copy_rows")
    }
}

/// Device addresses of the current step's inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepPtrs {
    pub tokens: u64,
    pub positions: u64,
    pub descs: u64,
    pub block_tables: u64,
    pub n_tokens: usize,
    pub n_seqs: usize,
    /// Most new tokens of one sequence in this step (launch shapes of kv_append and
    /// attention; 1 for a decode step).
    pub max_tokens: usize,
}

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvStore = CudaKv;

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        if let Some(w) = self.load_router(gguf, name)? {
            return Ok(w);
        }
        self.load(gguf, name, Role::Matmul)
    }

    fn load_embedding(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        self.load(gguf, name, Role::Embedding)
    }

    /// The group's members in one weight chunk, one after the other (weights are
    /// bump-allocated in load order: only a chunk boundary could part them), so that
    /// [`fusion::runs`] can give a run of them to one GEMV.
    fn load_weight_group(
        &self,
        gguf: &Arc<Gguf>,
        names: &[&str],
    ) -> Result<Vec<CudaWeight>, EngineError> {
        let mut total = 0;
        for n in names {
            total += self.planned_bytes(gguf, n)?;
        }
        self.weight_room(total)?;
        names.iter().map(|n| self.load_weight(gguf, n)).collect()
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        match w {
            CudaWeight::Matrix { rows, cols, .. }
            | CudaWeight::Embedding { rows, cols, .. }
            | CudaWeight::Experts { rows, cols, .. }
            | CudaWeight::Dense { rows, cols, .. } => (*rows, *cols),
            CudaWeight::Vector { len, .. } => (1, *len),
        }
    }

    fn alloc(&self, rows: usize, cols: usize) -> CudaTensor {
        let mut ptr = 0;
        // Touches no memory: neither launches the deferred add nor forgets the cache.
        self.run_raw(|| {
            ptr = self.scratch(rows * cols * 4)?;
            Ok(())
        });
        CudaTensor {
            ptr,
            rows,
            cols,
            cap: rows * cols,
        }
    }

    fn shape(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        let CudaWeight::Embedding { rows, .. } = table else {
            return Err(EngineError::BadMetadata {
                key: "token_embd.weight".into(),
                why: "not loaded as an embedding table".into(),
            });
        };
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= *rows) {
            return Err(EngineError::BadToken {
                token,
                n_vocab: *rows,
            });
        }
        self.run(|| {
            let s = self.step_ptrs()?;
            if s.n_tokens != tokens.len() || out.rows != tokens.len() {
                return Err(CudaError::BadLength {
                    what: "embed tokens (not the step's)",
                    got: tokens.len(),
                    want: s.n_tokens,
                });
            }
            self.op_embed(table, s.tokens, out)
        });
        self.take_error()
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        if let CudaWeight::Dense { .. } = w {
            self.run_raw(|| self.op_dense(w, x, out));
            return self.take_error();
        }
        self.run_raw(|| {
            self.flush_rope()?;
            // A deferred add may read the deferred GEMV's output: that GEMV goes first.
            if lock(&self.pending_add).is_some() {
                self.flush_gemv()?;
            }
            self.flush_add()?;
            self.matmul_inner(w, x, out, false)
        });
        self.take_error()
    }

    fn matmul_group(
        &self,
        ws: &[&CudaWeight],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), EngineError> {
        if ws.len() != outs.len() {
            return Err(EngineError::BadOptions(format!(
                "matmul_group of {} weights into {} outputs",
                ws.len(),
                outs.len()
            )));
        }
        if ws.iter().any(|w| matches!(w, CudaWeight::Dense { .. })) {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(w, x, out)?;
            }
            return Ok(());
        }
        self.run_raw(|| {
            self.flush_rope()?;
            // A deferred add may read the deferred GEMV's output: that GEMV goes first.
            if lock(&self.pending_add).is_some() {
                self.flush_gemv()?;
            }
            self.flush_add()?;
            let members: Vec<Option<fusion::Member>> = ws.iter().map(|w| w.member()).collect();
            for run in fusion::runs(&members, x.rows) {
                if run.len() > 1 {
                    self.place_run_outputs(&ws[run.clone()], &mut outs[run.clone()])?;
                }
                for i in run.clone() {
                    self.matmul_inner(ws[i], x, outs[i], i > run.start)?;
                }
            }
            Ok(())
        });
        self.take_error()
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) {
        self.run(|| self.op_add_bias(x, bias));
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
        self.run_raw(|| {
            self.flush_rope()?;
            self.forget_quantized()?;
            self.ensure(out, x.rows, x.cols)?;
            if self.split_norm(x, w, eps, out)? {
                return Ok(());
            }
            self.flush_gemv()?;
            let pending = lock(&self.pending_add).take();
            let fusable = pending
                .as_ref()
                .filter(|(px, y)| px.ptr == x.ptr && self.can_fuse_add_norm(x, y, w, out))
                .map(|&(_, y)| y);
            // A whole-row norm feeds matmuls: write its q8_1 tiles in the same kernel.
            if self.opts.fuse.quantize && self.can_norm_quantize(x, w, out) {
                if pending.is_some() && fusable.is_none() {
                    if let Some((px, y)) = pending {
                        self.op_add(&px, &y)?;
                    }
                }
                let q = self.scratch(act::row_bytes(x.cols)? * x.rows)?;
                self.op_norm_q8(x, fusable.as_ref(), w, eps, out, q)?;
                *lock(&self.quantized) = Some(Quantized {
                    x: *out,
                    q,
                    rms: None,
                });
                return Ok(());
            }
            match pending {
                // The residual add just before this norm of the same rows: one pass.
                Some((px, y)) if px.ptr == x.ptr && self.can_fuse_add_norm(x, &y, w, out) => {
                    self.op_add_rms_norm(x, &y, w, eps, out)
                }
                other => {
                    if let Some((px, y)) = other {
                        self.op_add(&px, &y)?;
                    }
                    self.op_rms_norm(x, w, eps, out)
                }
            }
        });
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        self.run(|| self.op_scale(x, s));
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        // Deferred: launched by the next op, fused into it when that is `x`'s norm. A
        // deferred GEMV that writes `y` stays deferred too: with the norm, the two may run
        // as one (`split_norm`); any other op launches the GEMV, then the add.
        self.run_raw(|| {
            let keep = self.opts.fuse.split_norm
                && lock(&self.pending_add).is_none()
                && matches!(*lock(&self.pending_gemv), Some(p) if p.out == y.ptr && y.rows == 1);
            if keep {
                self.flush_rope()?;
                self.flush_add()?;
            } else {
                self.flush()?;
            }
            self.forget_quantized()?;
            *lock(&self.pending_add) = Some((*x, *y));
            Ok(())
        });
    }

    fn glu(&self, gate: &mut CudaTensor, up: &CudaTensor, act: Glu) {
        self.run(|| {
            // The GLU's output feeds the down projection: write its q8_1 tiles in the same
            // kernel (one launch per layer less at decode).
            if self.opts.fuse.quantize && self.can_glu_quantize(gate, up) {
                let q = self.scratch(act::row_bytes(gate.cols)? * gate.rows)?;
                self.op_glu_q8(gate, up, act, q)?;
                *lock(&self.quantized) = Some(Quantized {
                    x: *gate,
                    q,
                    rms: None,
                });
                return Ok(());
            }
            self.op_glu(gate, up, act)
        });
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
        freq_factors: Option<&CudaWeight>,
    ) {
        self.run_raw(|| {
            // A decode row of the deferred Q|K|V GEMV's output stays deferred with it: the
            // GEMV may do this rope (and the KV append after it) in its epilogue.
            let keep_gemv = self.opts.fuse.rope_kv
                && self.opts.fuse.gemv_rope_kv
                && p.style == RopeStyle::Normal
                && x.rows == 1
                && lock(&self.pending_add).is_none()
                && matches!(*lock(&self.pending_gemv), Some(g)
                    if x.ptr >= g.out && x.ptr + (x.cols * 4) as u64 <= g.out + (g.rows * 4) as u64);
            if !keep_gemv {
                self.flush_gemv()?;
                self.flush_add()?;
                self.forget_quantized()?;
            }
            let s = self.step_ptrs()?;
            if s.n_tokens != positions.len() || x.rows != positions.len() {
                return Err(CudaError::BadLength {
                    what: "rope positions (not the step's)",
                    got: positions.len(),
                    want: s.n_tokens,
                });
            }
            let ff = match freq_factors {
                Some(w) => w.ptr(),
                None => 0,
            };
            // One row (a decode step): Q and K, adjacent in memory, rotate in one launch.
            let mut pending = lock(&self.pending_rope);
            if let Some(r) = pending.as_mut() {
                if x.rows == 1
                    && r.x.rows == 1
                    && r.head_dim == head_dim
                    && r.p == *p
                    && r.freq_factors == ff
                    && r.positions == s.positions
                    && r.x.ptr + (r.x.cols * 4) as u64 == x.ptr
                {
                    r.x.cols += x.cols;
                    r.x.cap = r.x.cols;
                    return Ok(());
                }
            }
            let prev = pending.take();
            if x.rows == 1 {
                *pending = Some(PendingRope {
                    x: *x,
                    positions: s.positions,
                    head_dim,
                    p: *p,
                    freq_factors: ff,
                });
            }
            drop(pending);
            if let Some(r) = prev {
                // Its rows may be the deferred GEMV's output: that GEMV first.
                self.flush_gemv()?;
                self.op_rope(&r.x, r.positions, r.head_dim, &r.p, r.freq_factors)?;
            }
            if x.rows != 1 {
                self.op_rope(x, s.positions, head_dim, p, ff)?;
            }
            Ok(())
        });
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
        // Every row in order (a decode step's logits row): the tensor itself, no copy, and
        // the deferred add + GEMV before it stay deferred for the norm that follows.
        if rows.iter().copied().eq(0..x.rows) {
            return *x;
        }
        let out = self.alloc(rows.len(), x.cols);
        self.run(|| {
            let row_bytes = x.cols * 4;
            // One copy per run of consecutive rows (one in all for a decode batch).
            let mut i = 0;
            while i < rows.len() {
                let mut j = i + 1;
                while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                    j += 1;
                }
                if rows[j - 1] >= x.rows {
                    return Err(CudaError::BadLength {
                        what: "gathered row",
                        got: rows[j - 1],
                        want: x.rows,
                    });
                }
                self.copy_rows(
                    out.ptr + (i * row_bytes) as u64,
                    x.ptr + (rows[i] * row_bytes) as u64,
                    (j - i) * row_bytes,
                )?;
                i = j;
            }
            Ok(())
        });
        out
    }

    fn to_host(&self, x: &CudaTensor) -> Vec<f32> {
        let mut v = Vec::new();
        self.run(|| {
            v = self.download(x)?;
            Ok(())
        });
        v
    }

    fn argmax_rows(&self, x: &CudaTensor) -> Vec<u32> {
        self.to_host(x)
            .chunks(x.cols.max(1))
            .map(crate::sampler::argmax)
            .collect()
    }

    fn kv_alloc(
        &self,
        n_layer: usize,
        n_blocks: usize,
        block_size: usize,
        kv_dim: usize,
    ) -> CudaKv {
        let mut kv = CudaKv {
            k: Vec::new(),
            v: Vec::new(),
            n_blocks,
            block_size,
            kv_dim,
        };
        self.run(|| {
            let n = n_blocks * block_size * kv_dim;
            for _ in 0..n_layer {
                kv.k.push(self.gpu.zeros::<u16>(n)?);
                kv.v.push(self.gpu.zeros::<u16>(n)?);
            }
            Ok(())
        });
        kv
    }

    fn kv_write(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        seqs: &[AttnSeq<'_>],
    ) {
        self.run_raw(|| {
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() {
                return Err(CudaError::BadLength {
                    what: "kv_write sequences (not the step's)",
                    got: seqs.len(),
                    want: s.n_seqs,
                });
            }
            if self.rope_kv_in_gemv(kv, layer, k, v, &s)? {
                return self.forget_quantized();
            }
            self.flush_gemv()?;
            self.flush_add()?;
            self.forget_quantized()?;
            // A decode row's deferred rope of Q|K ends with this K: rope and append in one
            // launch.
            let pending = lock(&self.pending_rope).take();
            if let Some(r) = pending {
                if self.opts.fuse.rope_kv && self.can_rope_kv(&r, kv, k, v, &s) {
                    return self.op_rope_kv(&r, kv, layer, v, &s);
                }
                self.op_rope(&r.x, r.positions, r.head_dim, &r.p, r.freq_factors)?;
            }
            self.op_kv_write(kv, layer, k, v, &s)
        });
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            self.ensure(out, q.rows, p.n_head * p.head_dim)?;
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() {
                return Err(CudaError::BadLength {
                    what: "attention sequences (not the step's)",
                    got: seqs.len(),
                    want: s.n_seqs,
                });
            }
            // The output feeds the output projection: the combine writes its q8_1 tiles
            // too when the shape allows (one launch per layer less at decode).
            let tiles = if self.opts.fuse.quantize
                && smelt_kernels::ops::attention::reduce_q8_fits(p.n_head, p.head_dim)
            {
                Some(self.scratch(act::row_bytes(out.cols)? * out.rows)?)
            } else {
                None
            };
            let min = self.flash_min_tokens(seqs.len());
            let short = seqs.iter().any(|x| x.n_tokens < min);
            self.op_attention(q, kv, layer, &s, p, out, tiles, short)?;
            if let Some(t) = tiles {
                *lock(&self.quantized) = Some(Quantized {
                    x: *out,
                    q: t,
                    rms: None,
                });
            }
            Ok(())
        });
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn load_experts(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        self.load_experts_inner(gguf, name)
    }

    fn moe_route(
        &self,
        logits: &CudaTensor,
        p: &MoeRouting,
        route: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run_raw(|| self.op_moe_route(logits, p, route));
        self.take_error()
    }

    fn matmul_id(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run_raw(|| self.op_matmul_id(w, x, route, out, None));
        self.take_error()
    }

    fn matmul_id_pair(
        &self,
        w: [&CudaWeight; 2],
        x: &CudaTensor,
        route: &CudaTensor,
        out: [&mut CudaTensor; 2],
    ) -> Result<(), EngineError> {
        let [o0, o1] = out;
        self.run_raw(|| self.op_matmul_id(w[0], x, route, o0, Some((w[1], o1))));
        self.take_error()
    }

    fn moe_combine(
        &self,
        y: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run(|| self.op_moe_combine(y, route, out));
        self.take_error()
    }
}
