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
    pub comm: Comm,
}

impl AllReduce<Cuda> for NcclReduce {
    fn all_reduce(&self, b: &Cuda, x: &mut CudaTensor) -> Result<(), EngineError> {
        b.all_reduce_nccl(&self.comm, x)?;
        Ok(())
    }
}
