//! GPU kernels written as Rust functions that emit PTX (through `smelt-ptx`), each with a
//! CPU twin that computes the same thing with `smelt-quant`, so a GPU run can check every
//! kernel against the CPU on fresh inputs.
//!
//! What is here so far: the decode-time matrix-vector products (GEMV, 1 to 8 tokens) of
//! quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with
//! activations quantized on the GPU to q8_1. `examples/gpu_ops` (run through
//! `bench/gpu/ops.sh`) checks every kernel against its twin on a GPU (`perf` times them); `tests/ptxas.rs` assembles every kernel for sm_80 and sm_90 in CI.
//!
//! - [`act`]: the activation format (q8_1 blocks, laid out in 256-weight tiles so a
//!   thread's 64 quants are contiguous and 16-byte aligned), its quantize kernel and twin.
//! - [`formats`]: one [`formats::GpuFormat`] per weight type: its GPU row layout (ggml's
//!   own bytes where they are already aligned, a per-row field-by-field repack where not),
//!   how a thread loads its share of a tile and how it dots it with dp4a.
//! - [`gemv`]: the one GEMV kernel, generic over the format, and its CPU twin.
//! - [`gemm`]: the many-token matrix multiply on the tensor cores (int8 `mma.sync`), whose
//!   CPU twin is the GEMV's.
//! - [`allreduce`]: the one-shot all-reduce over peer GPU memory (tensor parallelism's
//!   small messages), with its CPU twin and a CPU model of its flag protocol;
//!   [`allreduce_norm`] the same all-reduce fused with the residual add, RMS norm and
//!   q8_1 quantize that follow it at decode.
//! - [`catalog`]: every kernel this crate emits, for ptxas in CI and for the GPU check.

pub mod act;
pub mod allreduce;
pub mod allreduce_norm;
pub mod catalog;
pub mod delta_chunk;
pub mod delta_net;
pub mod formats;
pub mod fused;
pub mod gemm;
pub mod gemv;
pub mod moe;
pub mod moe_fused;
pub mod moe_route;
pub mod ops;
pub mod quantize;

pub use smelt_quant::GgmlType;

/// Why a kernel's host-side helper refused its input.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The row length does not fit the kernel's tiling.
    #[error("row length {k} is not a multiple of {multiple} ({what})")]
    RaggedRow {
        /// The row length given.
        k: usize,
        /// What it must be a multiple of.
        multiple: usize,
        /// The kernel or layout that needs it.
        what: &'static str,
    },
    /// A buffer has the wrong size for the shape given.
    #[error("{what}: {got} bytes, expected {want}")]
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the shape implies.
        want: usize,
    },
    /// The CPU quantizer or dequantizer refused the data.
    #[error(transparent)]
    Quant(#[from] smelt_quant::QuantError),
    /// The PTX builder refused a kernel.
    #[error(transparent)]
    Ptx(#[from] smelt_ptx::PtxError),
}

/// Weights per tile: the unit every GEMV thread group works on (one K-quant super-block,
/// eight 32-weight blocks of the legacy formats).
pub const TILE: usize = 256;

/// Tiles of a row of `k` weights when the last one may be partial (32-weight formats:
/// rows are padded with zero blocks to whole tiles on the GPU).
pub fn padded_tiles(k: usize, what: &'static str) -> Result<usize, KernelError> {
    if k == 0 || k % 32 != 0 {
        return Err(KernelError::RaggedRow {
            k,
            multiple: 32,
            what,
        });
    }
    Ok(k.div_ceil(TILE))
}

/// Checks that `k` is a whole number of tiles and returns how many.
pub fn tiles(k: usize, what: &'static str) -> Result<usize, KernelError> {
    if k == 0 || k % TILE != 0 {
        return Err(KernelError::RaggedRow {
            k,
            multiple: TILE,
            what,
        });
    }
    Ok(k / TILE)
}
