//! The CUDA backend's side of tensor parallelism: an NCCL all-reduce on the device's stream,
//! after whatever the backend still defers (a deferred GEMV may be the very producer of the
//! tensor), and forgetting the cached q8_1 tiles (their input changes under them).

use smelt_cuda::nccl::Comm;
use smelt_cuda::CudaError;

use super::{Cuda, CudaTensor};
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

/// One rank's all-reduce through NCCL.
pub struct NcclReduce {
    comm: Comm,
    /// `SMELT_TP_SKIP_ALLREDUCE=1`: every all-reduce is left out (each rank keeps its
    /// partial sums, so outputs are wrong): a timing ablation that shows a step's time
    /// without communication, as `SMELT_CUDA_SKIP` does for kernels.
    skip: bool,
}

impl NcclReduce {
    pub fn new(comm: Comm) -> Self {
        let skip = std::env::var("SMELT_TP_SKIP_ALLREDUCE").is_ok_and(|v| v == "1");
        if skip && comm.rank == 0 {
            eprintln!(
                "smelt: SMELT_TP_SKIP_ALLREDUCE=1 leaves out every all-reduce: outputs are \
                 wrong, for timing only"
            );
        }
        NcclReduce { comm, skip }
    }
}

impl AllReduce<Cuda> for NcclReduce {
    fn all_reduce(&self, b: &Cuda, x: &mut CudaTensor) -> Result<(), EngineError> {
        if self.skip {
            // The same flush as a real one, so the kernels around it are the same.
            b.flush()?;
            b.forget_quantized()?;
            return Ok(());
        }
        b.all_reduce_nccl(&self.comm, x)?;
        Ok(())
    }
}
