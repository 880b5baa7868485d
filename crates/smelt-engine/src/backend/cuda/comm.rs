//! The CUDA backend's side of tensor parallelism: an all-reduce on the device's stream,
//! after whatever the backend still defers (a deferred GEMV may be the very producer of the
//! tensor), and forgetting the cached q8_1 tiles (their input changes under them). Small
//! messages (a decode step's) run on the one-shot peer-memory kernel
//! (`smelt_cuda::peer`), the rest on NCCL, split by size (`CudaOptions::peer_max_bytes`).
//! A vocabulary-parallel head's logits are gathered through the same all-reduce: each
//! rank's columns placed in a zeroed whole (a memset and a 2D copy, both captured in the
//! step's graph like a kernel), then summed (adding zeros changes no bits).
//!
//! At decode the all-reduce, the residual add, the next norm and its q8_1 tiles run as one
//! kernel where the peer path takes the message (`AllReduce::all_reduce_add_norm`,
//! `smelt_kernels::allreduce_norm`; `CudaOptions::tp.fuse_norm`): the rows the norm writes
//! and their tiles are left in the matmul input cache, as the plain norm leaves them.

use std::sync::{Arc, OnceLock};

use smelt_cuda::nccl::Comm;
use smelt_cuda::peer::PeerReduce;
use smelt_cuda::CudaError;

use super::ops::args;
use super::{lock, Cuda, CudaTensor, CudaWeight, Quantized};
use crate::backend::Backend;
use crate::model::AllReduce;
use crate::EngineError;

impl Cuda {
    /// Sums `x` over the ranks of `comm` in place, on this device's stream (captured into the
    /// step's graph like every other launch).
    pub fn all_reduce_nccl(&self, comm: &Comm, x: &CudaTensor) -> Result<(), CudaError> {
        self.flush()?;
        self.forget_quantized()?;
        let n = x.rows * x.cols;
        if n == 0 || comm.n_ranks == 1 {
            return Ok(());
        }
        // SAFETY: `x` is this step's scratch on this device, `n` floats long.
        unsafe { comm.all_reduce_f32(x.ptr, n, self.gpu.stream().cu_stream()) }
    }
}

/// One rank's all-reduce: the peer kernel for small messages once the group has started
/// it, NCCL for the others (and for all of them when peer access is missing).
pub struct NcclReduce {
    comm: Comm,
    /// Set once every rank has started its part of the peer group (`TpRunner::load`); empty
    /// until then and wherever peer access is missing.
    peer: Arc<OnceLock<PeerReduce>>,
    /// `SMELT_TP_SKIP_ALLREDUCE=1`: every all-reduce is left out (each rank keeps its
    /// partial sums, so outputs are wrong): a timing ablation that shows a step's time
    /// without communication, as `SMELT_CUDA_SKIP` does for kernels.
    skip: bool,
}

impl NcclReduce {
    /// `skip`: [`super::options::TpOptions::skip_all_reduce`].
    pub fn new(comm: Comm, peer: Arc<OnceLock<PeerReduce>>, skip: bool) -> Self {
        if skip && comm.rank == 0 {
            eprintln!(
                "smelt: SMELT_TP_SKIP_ALLREDUCE=1 leaves out every all-reduce: outputs are \
                 wrong, for timing only"
            );
        }
        NcclReduce { comm, peer, skip }
    }
}

impl Cuda {
    /// Sums `x` over the group with the peer kernel when it takes the message (size within
    /// `max_bytes`, aligned, whole vectors); `false` when it does not (NCCL's turn). Every
    /// rank decides the same: the inputs are the same shapes on every rank.
    fn all_reduce_peer(&self, p: &PeerReduce, x: &CudaTensor) -> Result<bool, CudaError> {
        let n = x.rows * x.cols;
        if n * 4 > self.opts.peer_max_bytes(p.n_ranks) || !p.can_take(n, x.ptr) {
            return Ok(false);
        }
        self.flush()?;
        self.forget_quantized()?;
        let a = p.args(x.ptr, n);
        self.launch(
            p.kernel_name(),
            smelt_kernels::allreduce::launch(),
            &args(&a.values()),
        )?;
        Ok(true)
    }
}

/// Most rows the fused all-reduce + add + norm + q8_1 kernel takes. Its GPU check (4x H200,
/// bench/RESULTS.md 2026-11-27 10:24 UTC) was exact against the twin at 1 and 4 rows and
/// wrong at 32 (on 2 and 4 GPUs), and slower than the two launches it replaces at every
/// size (7.1 against 6.9 us at one 4096-float row on 2 GPUs, 8.6 against 7.4 on 4).
const FUSE_MAX_ROWS: usize = 4;

impl Cuda {
    /// `o` summed over the group, `x += o`, `out = rms_norm(x) * w` and `out`'s q8_1 tiles,
    /// in one launch of the fused kernel where it takes the rows (the peer path on, the
    /// message within its size, rows of whole q8_1 blocks, at most one per block); `false`
    /// (nothing launched) otherwise. Every rank decides the same: the shapes are the same.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_add_norm_peer(
        &self,
        p: &PeerReduce,
        o: &CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<bool, CudaError> {
        let CudaWeight::Vector { ptr: wp, len: n } = *w else {
            return Ok(false);
        };
        let rows = o.rows;
        let apart = |a: &CudaTensor, b: &CudaTensor| {
            a.ptr + (a.cap * 4) as u64 <= b.ptr || b.ptr + (b.cap * 4) as u64 <= a.ptr
        };
        let fits = self.opts.tp.fuse_norm
            && rows <= FUSE_MAX_ROWS
            && self.opts.fuse.quantize
            && o.cols == n
            && x.cols == n
            && x.rows == rows
            && rows * n * 4 <= self.opts.peer_max_bytes(p.n_ranks)
            && p.can_take_rows(rows, n, o.ptr)
            && x.ptr.is_multiple_of(16)
            && apart(o, x);
        if !fits {
            return Ok(false);
        }
        self.flush()?;
        self.forget_quantized()?;
        self.ensure(out, rows, n)?;
        if !apart(out, x) || !apart(out, o) {
            // The caller's output shares memory with an input: a buffer of its own.
            out.ptr = self.scratch(rows * n * 4)?;
            out.cap = rows * n;
        }
        let q = self.scratch(smelt_kernels::act::row_bytes(n)? * rows)?;
        let a = p.norm_args(o.ptr, x.ptr, wp, out.ptr, q, rows, n, eps);
        self.launch(
            p.norm_kernel_name(),
            smelt_kernels::allreduce_norm::launch(n),
            &args(&a.values()),
        )?;
        *lock(&self.fusion.quantized) = Some(Quantized {
            x: *out,
            q,
            rms: None,
        });
        Ok(true)
    }
}

impl Cuda {
    /// A zeroed `rows x total` tensor holding `part` at column `start` (on the stream).
    fn place_cols(
        &self,
        part: &CudaTensor,
        start: usize,
        total: usize,
    ) -> Result<CudaTensor, CudaError> {
        use smelt_cuda::cudarc::driver::sys;
        if start + part.cols > total {
            return Err(CudaError::Init(format!(
                "gather of columns {start}..{} of {total}",
                start + part.cols
            )));
        }
        // The part may still be a deferred GEMV's output.
        self.flush()?;
        self.forget_quantized()?;
        let rows = part.rows;
        let ptr = self.scratch(rows * total * 4)?;
        let out = CudaTensor {
            ptr,
            rows,
            cols: total,
            cap: rows * total,
        };
        if rows == 0 {
            return Ok(out);
        }
        let stream = self.gpu.stream().cu_stream();
        // SAFETY: `out` is this step's scratch of `rows * total` floats, `part` holds
        // `rows * part.cols` floats, both on this device; the copy stays inside both.
        unsafe {
            sys::cuMemsetD32Async(ptr, 0, rows * total, stream).result()?;
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: part.ptr,
                srcArray: std::ptr::null_mut(),
                srcPitch: part.cols * 4,
                dstXInBytes: start * 4,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: ptr,
                dstArray: std::ptr::null_mut(),
                dstPitch: total * 4,
                WidthInBytes: part.cols * 4,
                Height: rows,
            };
            sys::cuMemcpy2DAsync_v2(&copy, stream).result()?;
        }
        Ok(out)
    }
}

impl AllReduce<Cuda> for NcclReduce {
    fn gather_cols(
        &self,
        b: &Cuda,
        part: &CudaTensor,
        start: usize,
        total: usize,
    ) -> Result<CudaTensor, EngineError> {
        let mut out = b.place_cols(part, start, total)?;
        self.all_reduce(b, &mut out)?;
        Ok(out)
    }

    fn all_reduce(&self, b: &Cuda, x: &mut CudaTensor) -> Result<(), EngineError> {
        if self.skip {
            // The same flush as a real one, so the kernels around it are the same.
            b.flush()?;
            b.forget_quantized()?;
            return Ok(());
        }
        if let Some(p) = self.peer.get() {
            if b.all_reduce_peer(p, x)? {
                return Ok(());
            }
        }
        b.all_reduce_nccl(&self.comm, x)?;
        Ok(())
    }

    fn all_reduce_add_norm(
        &self,
        b: &Cuda,
        o: &mut CudaTensor,
        x: &mut CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        if !self.skip {
            if let Some(p) = self.peer.get() {
                if b.all_reduce_add_norm_peer(p, o, x, w, eps, out)? {
                    return Ok(());
                }
            }
        }
        self.all_reduce(b, o)?;
        b.add(x, o);
        b.rms_norm(x, w, eps, out);
        Ok(())
    }
}
