//! Why a GPU operation failed.

use cudarc::driver::DriverError;

/// A failure of the CUDA runtime layer.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No NVIDIA driver library (libcuda) could be loaded on this machine.
    #[error("no CUDA driver: libcuda could not be loaded (is the NVIDIA driver installed?)")]
    NoDriver,
    /// The driver loaded but has no device with this ordinal.
    #[error("no CUDA device {ordinal} ({count} device(s) present)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// The driver panicked or aborted initialisation (a broken install).
    #[error("CUDA initialisation failed: {0}")]
    Init(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// A kernel could not be generated.
    #[error(transparent)]
    Ptx(#[from] smelt_ptx::PtxError),
    /// A kernel's host-side helper refused its input.
    #[error(transparent)]
    Kernel(#[from] smelt_kernels::KernelError),
    /// The module has no kernel of this name.
    #[error("no kernel named {0} in the module")]
    NoKernel(String),
    /// A buffer of the wrong size was given.
    #[error("{what}: {got} elements, expected {want}")]
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length needed.
        want: usize,
    },
}

impl CudaError {
    /// Whether the driver ran out of device memory (an allocation failed; the context is
    /// still usable).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            CudaError::Driver(DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
            ))
        )
    }
}
