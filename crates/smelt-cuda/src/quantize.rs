//! In-situ quantization on a GPU: f32/f16/bf16 tensors to ggml block formats with the
//! kernels of `smelt_kernels::quantize`, whose bytes equal `smelt_quant`'s (and ggml's).
//!
//! [`quantize_device`] queues one launch on buffers already on the device (what a loader
//! that quantizes while it uploads uses); [`quantize_host`] takes host bytes, returns host
//! bytes, and reuses its device buffers across calls through a [`Quantizer`], so a
//! whole model goes through with memory for one source tensor and its output at a time.
//! Non-finite input is an error naming the first bad row and column, as on the CPU.

use cudarc::driver::{CudaSlice, LaunchConfig};
use smelt_kernels::formats::gpu_repack;
use smelt_kernels::quantize::{self, Input};
use smelt_kernels::{GgmlType, KernelError};

use crate::{CudaError, Gpu};

/// Queues the quantization of `rows` rows of `cols` elements of `input` in `src` into
/// `dst` (at least the plan's output bytes), raising per-row flags in `flags` (at least
/// `rows` words, zeroed by the caller; see `smelt_kernels::quantize::check_flags`).
#[allow(clippy::too_many_arguments)]
pub fn quantize_device(
    gpu: &Gpu,
    ty: GgmlType,
    input: Input,
    src: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
    dst: &mut CudaSlice<u8>,
    flags: &mut CudaSlice<u32>,
) -> Result<(), CudaError> {
    let p = quantize::plan(ty, rows, cols)?;
    let need_src = rows * cols * input.bytes();
    if src.len() < need_src {
        return Err(CudaError::BadLength {
            what: "quantize source bytes",
            got: src.len(),
            want: need_src,
        });
    }
    if dst.len() < p.out_bytes {
        return Err(CudaError::BadLength {
            what: "quantize output bytes",
            got: dst.len(),
            want: p.out_bytes,
        });
    }
    if flags.len() < rows {
        return Err(CudaError::BadLength {
            what: "quantize row flags",
            got: flags.len(),
            want: rows,
        });
    }
    let f = gpu.function(&quantize::kernel_name(ty, input)?)?;
    let cfg = LaunchConfig {
        grid_dim: (p.grid, 1, 1),
        block_dim: (p.block, 1, 1),
        shared_mem_bytes: 0,
    };
    let values = quantize::QuantizeArgs {
        src: gpu.ptr(src),
        dst: gpu.ptr(dst),
        flags: gpu.ptr(flags),
        blocks: p.blocks,
        blocks_per_row: p.blocks_per_row,
    }
    .values();
    let mut l = gpu.stream().launch_builder(&f);
    crate::gpu::push_args(&mut l, &values);
    gpu.no_timeline(&mut l);
    // SAFETY: the kernel reads `blocks * weights` elements of `src` and writes
    // `out_bytes` of `dst` and `rows` words of `flags`, all checked above.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Queues on `stream` the repack of `rows` rows of `cols` weights of `ty` from ggml's blocks
/// at device address `src` into the GEMV's row layout at `dst`
/// (`smelt_kernels::formats::gpu_repack`; every byte of the `rows * row_bytes` output is
/// written, padding as zeros). The caller owns both ranges: `src` holds the rows' ggml
/// bytes and `dst` has room for their GPU rows, both in `gpu`'s context.
pub fn repack_on(
    gpu: &Gpu,
    stream: &cudarc::driver::CudaStream,
    ty: GgmlType,
    src: u64,
    dst: u64,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    let (args, launch) = gpu_repack::args(ty, src, dst, rows, cols)?;
    let f = gpu.function(&gpu_repack::kernel_name(ty)?)?;
    let cfg = LaunchConfig {
        grid_dim: launch.grid,
        block_dim: launch.block,
        shared_mem_bytes: launch.shared_bytes,
    };
    let values = args.values();
    let mut l = stream.launch_builder(&f);
    crate::gpu::push_args(&mut l, &values);
    gpu.no_timeline(&mut l);
    // SAFETY: the kernel reads the rows' ggml bytes at `src` and writes `args.total` bytes
    // at `dst`, ranges the caller vouches for (see the doc comment).
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// [`repack_on`] between two buffers on the device's stream, their sizes checked: the GPU
/// side of the repack parity check (the CPU twin is `smelt_kernels::catalog::repack`).
pub fn repack_device(
    gpu: &Gpu,
    ty: GgmlType,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let need_src = rows * ty.row_bytes(cols as u64).unwrap_or(u64::MAX) as usize;
    let need_dst = rows * smelt_kernels::catalog::row_bytes(ty, cols)?;
    if src.len() < need_src {
        return Err(CudaError::BadLength {
            what: "repack source bytes",
            got: src.len(),
            want: need_src,
        });
    }
    if dst.len() < need_dst {
        return Err(CudaError::BadLength {
            what: "repack output bytes",
            got: dst.len(),
            want: need_dst,
        });
    }
    let (s, d) = (gpu.ptr(src), gpu.ptr(dst));
    repack_on(gpu, gpu.stream(), ty, s, d, rows, cols)
}

/// Device buffers kept between tensors, grown as needed.
pub struct Quantizer<'g> {
    gpu: &'g Gpu,
    src: Option<CudaSlice<u8>>,
    dst: Option<CudaSlice<u8>>,
    flags: Option<CudaSlice<u32>>,
}

/// A buffer of at least `n` elements: `slot`'s if large enough, else a new one.
fn ensure<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    slot: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<(), CudaError> {
    if slot.as_ref().is_none_or(|b| b.len() < n) {
        *slot = None; // free the old one first: peak memory is one buffer, not two
        *slot = Some(gpu.zeros::<T>(n.max(1))?);
    }
    Ok(())
}

impl<'g> Quantizer<'g> {
    /// A quantizer on `gpu` with no buffers yet.
    pub fn new(gpu: &'g Gpu) -> Self {
        Self {
            gpu,
            src: None,
            dst: None,
            flags: None,
        }
    }

    /// Quantizes host bytes (`rows` x `cols` of `input`) to `ty` on the GPU.
    pub fn quantize(
        &mut self,
        ty: GgmlType,
        input: Input,
        src: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Vec<u8>, CudaError> {
        let p = quantize::plan(ty, rows, cols)?;
        let want = rows * cols * input.bytes();
        if src.len() != want {
            return Err(CudaError::BadLength {
                what: "quantize source bytes",
                got: src.len(),
                want,
            });
        }
        let gpu = self.gpu;
        ensure(gpu, &mut self.src, src.len())?;
        ensure(gpu, &mut self.dst, p.out_bytes)?;
        ensure(gpu, &mut self.flags, rows)?;
        let (Some(s), Some(d), Some(fl)) = (&mut self.src, &mut self.dst, &mut self.flags) else {
            return Err(CudaError::Init("quantize buffers missing".into()));
        };
        let mut s_view = s.slice_mut(..src.len());
        gpu.stream().memcpy_htod(src, &mut s_view)?;
        let mut fl_view = fl.slice_mut(..rows);
        gpu.stream().memset_zeros(&mut fl_view)?;
        quantize_device(gpu, ty, input, s, rows, cols, d, fl)?;
        let flags = gpu.stream().clone_dtoh(&fl.slice(..rows))?;
        quantize::check_flags(&flags, |r, c| {
            let at = (r * cols + c) * input.bytes();
            input
                .widen(&src[at..at + input.bytes()])
                .first()
                .copied()
                .unwrap_or(f32::NAN)
        })
        .map_err(|e| CudaError::Kernel(KernelError::Quant(e)))?;
        Ok(gpu.stream().clone_dtoh(&d.slice(..p.out_bytes))?)
    }
}

/// Quantizes host bytes once (see [`Quantizer`] to reuse buffers across tensors).
pub fn quantize_host(
    gpu: &Gpu,
    ty: GgmlType,
    input: Input,
    src: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<u8>, CudaError> {
    Quantizer::new(gpu).quantize(ty, input, src, rows, cols)
}

/// Whether the GPU can quantize a tensor of `src` type to `dst` (otherwise callers use
/// the CPU path).
pub fn supports(src: GgmlType, dst: GgmlType) -> bool {
    Input::from_ggml(src).is_some() && quantize::TYPES.contains(&dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_pairs() {
        assert!(supports(GgmlType::BF16, GgmlType::Q6_K));
        assert!(supports(GgmlType::F32, GgmlType::Q8_0));
        assert!(!supports(GgmlType::Q4_0, GgmlType::Q6_K));
        assert!(!supports(GgmlType::F16, GgmlType::F32));
        assert!(!supports(GgmlType::F16, GgmlType::IQ4_NL));
    }
}
