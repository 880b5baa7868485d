//! Weight uploads at the link's rate: host bytes go to the device through two reused pinned
//! staging buffers, each piece copied in by all cores and sent with an asynchronous copy on
//! the device's stream, so filling one buffer overlaps the other's transfer and nothing
//! waits for the device between weights (a plain copy from pageable memory goes through
//! the driver's own small bounce buffer, and a synchronous one stalls the host each time).
//! Quantized matrices are repacked for the GEMV on all cores first ([`repack_parallel`]).

use rayon::prelude::*;
use smelt_cuda::cudarc::driver::{result as cu, CudaEvent};
use smelt_cuda::staged::Pinned;
use smelt_cuda::{CudaError, Gpu};
use smelt_gguf::GgmlType;

/// Source bytes of weights loaded to any GPU by this process so far: what a progress bar
/// polls while a model loads.
pub static LOADED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`LOADED_BYTES`]'s value.
pub fn loaded_bytes() -> u64 {
    LOADED_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Bytes per staging buffer.
const PIECE: usize = 32 << 20;

/// The two staging buffers and the events that say when each is free again.
pub(crate) struct Uploader {
    bufs: Vec<(Pinned, CudaEvent)>,
    next: usize,
    /// The host buffer repacked matrices land in, reused from weight to weight
    /// ([`super::Cuda::upload_made`]): a fresh one for every matrix is fresh pages, a page
    /// fault every 4 KB written.
    pub(crate) scratch: Vec<u8>,
}

impl Uploader {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        let bufs = (0..2)
            .map(|_| Ok((Pinned::new(gpu, PIECE)?, gpu.context().new_event(None)?)))
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(Self {
            bufs,
            next: 0,
            scratch: Vec::new(),
        })
    }

    /// Queues the copy of `bytes` to device address `dst` on `gpu`'s stream; `bytes` may be
    /// dropped when this returns (they are in the staging buffers by then).
    pub(crate) fn upload(&mut self, gpu: &Gpu, dst: u64, bytes: &[u8]) -> Result<(), CudaError> {
        gpu.context().bind_to_thread()?;
        let stream = gpu.stream();
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            let (buf, done) = &mut self.bufs[self.next];
            self.next = (self.next + 1) % 2;
            // Its previous transfer must be over before it is refilled (an event never
            // recorded counts as done).
            done.synchronize()?;
            let staged = &mut buf.slice_mut()[..piece.len()];
            staged
                .par_chunks_mut(1 << 20)
                .zip(piece.par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s));
            // SAFETY: `dst` has room for `bytes` (the caller's allocation); the staged bytes
            // stay untouched until `done` says this copy is over.
            unsafe {
                cu::memcpy_htod_async(dst + (i * PIECE) as u64, &*staged, stream.cu_stream())
            }?;
            done.record(stream)?;
        }
        Ok(())
    }
}

/// A 64-bit hash of `bytes` (FNV-1a over 8-byte words, then the tail), for
/// [`super::Cuda::weights_digest`]; all cores for large buffers.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    const PIECE: usize = 16 << 20;
    let fnv = |b: &[u8]| {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let words = b.chunks_exact(8);
        let tail = words.remainder();
        for w in words {
            let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
        }
        for &t in tail {
            h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
        }
        h ^ b.len() as u64
    };
    if bytes.len() <= PIECE {
        return fnv(bytes);
    }
    let parts: Vec<u64> = bytes.par_chunks(PIECE).map(fnv).collect();
    parts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`smelt_kernels::catalog::repack`] on all cores into `out` (`rows * row_bytes` bytes,
/// every one written): rows repack on their own, so groups of rows go to rayon's workers
/// and land in one buffer (the same bytes as one call on the whole tensor).
pub(crate) fn repack_parallel(
    ty: GgmlType,
    ggml: &[u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
    plain: bool,
    out: &mut [u8],
) -> Result<(), smelt_kernels::KernelError> {
    use rayon::prelude::*;
    let ggml_row = ggml.len() / rows.max(1);
    if rows < 64 || ggml_row * rows != ggml.len() || plain {
        let packed = smelt_kernels::catalog::repack(ty, ggml, rows, cols)?;
        out.copy_from_slice(&packed);
        return Ok(());
    }
    let group = rows.div_ceil(rayon::current_num_threads() * 4).max(16);
    out.par_chunks_mut(group * row_bytes)
        .zip(ggml.par_chunks(group * ggml_row))
        .try_for_each(|(o, g)| {
            let packed = smelt_kernels::catalog::repack(ty, g, g.len() / ggml_row, cols)?;
            o.copy_from_slice(&packed);
            Ok::<(), smelt_kernels::KernelError>(())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups of rows on many workers give the bytes of one whole-tensor repack, for every
    /// GEMV format (ragged last group included).
    #[test]
    fn parallel_repack_is_the_whole_tensor_repack() {
        let (rows, cols) = (203, 512);
        // Formats smelt can write (IQ4_NL weights come from files only).
        let types: Vec<_> = smelt_kernels::catalog::GEMV_TYPES
            .into_iter()
            .filter(|&t| smelt_quant::can_quantize(t))
            .collect();
        assert!(types.len() >= 8, "{types:?}");
        for ty in types {
            let vals: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 2_654_435_761usize) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let ggml = smelt_quant::quantize_tensor(ty, &vals, cols, Some(1)).expect("quantizes");
            let row_bytes = smelt_kernels::catalog::row_bytes(ty, cols).expect("row bytes");
            let one = smelt_kernels::catalog::repack(ty, &ggml, rows, cols).expect("repack");
            let mut par = vec![0u8; rows * row_bytes];
            repack_parallel(ty, &ggml, rows, cols, row_bytes, false, &mut par).expect("parallel");
            assert!(one == par, "{ty}");
        }
    }
}
