//! The CUDA host runtime of smelt: the driver is loaded at run time (cudarc's dynamic
//! loading), so the same binary runs on machines without one and [`available`] simply says
//! no. A [`Gpu`] is one device: its context, one stream (everything smelt does on a device
//! is ordered on it, which also makes it capturable as a CUDA graph) and the module of every
//! kernel of `smelt-kernels`, generated as PTX for the device's architecture and
//! JIT-compiled by the driver once per machine ([`cache`] keeps the result).
//!
//! - [`visible`]: a one-device process makes only its device visible to the driver, whose
//!   start (`cuInit`) otherwise sets up every GPU of the host.
//! - [`cache`]: compiled kernel modules kept across runs (start-up without the JIT).
//! - [`gpu`]: [`Gpu::open`], kernel lookup, upload/download.
//! - [`options`]: the `SMELT_CUDA_*` settings of a device's module and launches.
//! - [`graph`]: stream capture into a replayable [`Graph`].
//! - [`gemv_bench`]: GEMV bandwidth at real shapes (GPU checks, `smelt bench --kernels`).
//! - [`staged`]: pipelined quantization through reused pinned staging slots and streams.
//! - [`nccl`]: NCCL loaded at run time (tensor parallelism's all-reduce).
//! - [`peer`]: the one-shot all-reduce over peer memory (small messages; NCCL the rest).
//! - [`timing`]: CUDA-event timings of launches and graph replays and the device-copy
//!   bandwidth they are compared with (GPU checks and `smelt bench --kernels`).

pub mod cache;
pub mod error;
pub mod gemv_bench;
pub mod gpu;
pub mod graph;
pub mod nccl;
pub mod options;
pub mod peer;
pub mod quantize;
pub mod staged;
pub mod timing;
mod util;
pub mod visible;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use cudarc;
pub use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
pub use error::CudaError;
pub use gpu::{Gpu, KernelParam};
pub use graph::Graph;
pub use options::GpuOptions;
pub use util::{fill_kernel, fill_with};

/// The runtime's own kernels (benchmark input fill) as one module for `target`: what
/// [`Gpu::open`] loads beside the kernel catalog, exposed so CI can assemble it.
pub fn runtime_module(target: smelt_ptx::Target) -> Result<smelt_ptx::Module, smelt_ptx::PtxError> {
    util::module(target)
}

/// Whether the driver library loads and reports at least one device. Never panics: a
/// missing or broken driver is simply `false`.
pub fn available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// How many CUDA devices the driver reports; [`CudaError::NoDriver`] when there is no driver.
pub fn device_count() -> Result<usize, CudaError> {
    guard(|| {
        let n = cudarc::driver::result::device::get_count()?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// Runs a driver call after checking that the driver library is there, turning a panic of
/// the loader (a driver too old for a symbol, a broken install) into an error.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    // SAFETY: only tries to open the library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    visible::driver_starts();
    match catch_unwind(AssertUnwindSafe(|| {
        cudarc::driver::result::init()?;
        f()
    })) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the driver loader panicked".into());
            Err(CudaError::Init(msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever this machine has, asking never panics, and the two answers agree.
    #[test]
    fn available_never_panics_and_agrees_with_device_count() {
        let avail = available();
        match device_count() {
            Ok(n) => assert_eq!(avail, n > 0),
            Err(e) => {
                assert!(!avail);
                assert!(!e.to_string().is_empty());
            }
        }
    }

    /// Opening a device that does not exist is an error, never a panic.
    #[test]
    fn opening_a_missing_device_is_an_error() {
        let err = Gpu::open(1_000_000).expect_err("device 1000000 cannot exist");
        let msg = err.to_string();
        assert!(
            msg.contains("no CUDA") || msg.contains("CUDA"),
            "unexpected message: {msg}"
        );
    }
}
