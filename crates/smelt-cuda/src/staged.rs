//! Pipelined GPU quantization: a few staging slots, each with pinned host input and output
//! buffers, device buffers and a stream of its own, so one chunk's upload, another's kernel
//! and a third's download run at once while the host reads the next chunk into a free slot.
//! Slots are reused for the whole model: memory is `slots x (input + output)` on both
//! sides, whatever the model's size.
//!
//! A slot goes `input` (the host fills its pinned input) -> [`Slot::submit`] (queues the
//! upload, the kernel and the download of its output and row flags, returns at once) ->
//! [`Slot::complete`] (waits for its event, checks the flags, lends the output) -> reused.
//! Bytes equal [`crate::quantize::quantize_host`]'s: the same kernel on the same rows.
//!
//! A loader that keeps the weights on the device submits with [`Output::Device`] instead:
//! the blocks stay there (written where the loader says, or repacked there into the GEMV's
//! row layout by `smelt_kernels::formats::gpu_repack`'s kernel), and only the row flags come
//! back, so the weights cross the link once.

use std::sync::Arc;

use cudarc::driver::{result, CudaEvent, CudaSlice, CudaStream, LaunchConfig};
use smelt_kernels::quantize::{self, Input};
use smelt_kernels::{GgmlType, KernelError};

use crate::{CudaError, Gpu};

/// Page-locked host memory from the driver (copies from it are truly asynchronous and run
/// at the link's full rate).
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value; the slot that holds it is used by one thread at
// a time, and device copies touching it are waited for before the slot moves on.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` zeroed bytes (at least one is allocated).
    pub fn new(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        gpu.context().bind_to_thread()?;
        // SAFETY: a fresh allocation of `len` bytes (at least one), freed in Drop, zeroed
        // here so every byte is initialised before any slice of it exists.
        let ptr = unsafe {
            let p = result::malloc_host(len.max(1), 0)?.cast::<u8>();
            std::ptr::write_bytes(p, 0, len.max(1));
            p
        };
        Ok(Self { ptr, len })
    }

    pub fn slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes allocated by `new`, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `slice`, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host, freed once.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

/// What a submitted slot is computing.
#[derive(Clone, Copy, Debug)]
struct Pending {
    input: Input,
    rows: usize,
    cols: usize,
    out_bytes: usize,
    to_host: bool,
}

/// Where a submitted chunk's blocks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Downloaded into the slot's pinned output, which [`Slot::complete`] lends.
    Host,
    /// Left on the device at address `dst`: ggml's blocks as they are, or with `repack`
    /// the GEMV's row layout (`smelt_kernels::catalog::row_bytes` per row).
    Device { dst: u64, repack: bool },
}

/// One staging slot (see the module docs).
pub struct Slot {
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    done: CudaEvent,
    host_in: Pinned,
    host_out: Pinned,
    host_flags: Pinned,
    dev_in: CudaSlice<u8>,
    dev_out: CudaSlice<u8>,
    dev_flags: CudaSlice<u32>,
    pending: Option<Pending>,
    /// Output bytes of the chunk [`Slot::complete`] last lent (0 for `Output::Device`).
    done_out: usize,
}

/// `n` slots on `gpu` for chunks of up to `max_in` source bytes, `max_out` output bytes and
/// `max_rows` rows.
pub fn slots(
    gpu: &Arc<Gpu>,
    n: usize,
    max_in: usize,
    max_out: usize,
    max_rows: usize,
) -> Result<Vec<Slot>, CudaError> {
    slots_with(gpu, n, max_in, max_out, max_rows, true)
}

/// [`slots`] for [`Output::Device`] submissions only: no pinned output buffers.
pub fn slots_on_device(
    gpu: &Arc<Gpu>,
    n: usize,
    max_in: usize,
    max_out: usize,
    max_rows: usize,
) -> Result<Vec<Slot>, CudaError> {
    slots_with(gpu, n, max_in, max_out, max_rows, false)
}

fn slots_with(
    gpu: &Arc<Gpu>,
    n: usize,
    max_in: usize,
    max_out: usize,
    max_rows: usize,
    host_out: bool,
) -> Result<Vec<Slot>, CudaError> {
    (0..n)
        .map(|_| make_slot(gpu, max_in, max_out, max_rows, host_out))
        .collect()
}

/// One slot of [`slots`], made on its own (a pipeline makes its first slot, starts, and
/// makes the rest meanwhile: pinning a slot's buffers takes tens of milliseconds).
pub fn slot(
    gpu: &Arc<Gpu>,
    max_in: usize,
    max_out: usize,
    max_rows: usize,
) -> Result<Slot, CudaError> {
    make_slot(gpu, max_in, max_out, max_rows, true)
}

fn make_slot(
    gpu: &Arc<Gpu>,
    max_in: usize,
    max_out: usize,
    max_rows: usize,
    host_out: bool,
) -> Result<Slot, CudaError> {
    let ctx = gpu.context();
    ctx.bind_to_thread()?;
    let stream = ctx.new_stream()?;
    let s = Slot {
        gpu: gpu.clone(),
        done: ctx.new_event(None)?,
        host_in: Pinned::new(gpu, max_in)?,
        host_out: Pinned::new(gpu, if host_out { max_out } else { 1 })?,
        host_flags: Pinned::new(gpu, max_rows.max(1) * 4)?,
        dev_in: stream.alloc_zeros::<u8>(max_in.max(1))?,
        dev_out: stream.alloc_zeros::<u8>(max_out.max(1))?,
        dev_flags: stream.alloc_zeros::<u32>(max_rows.max(1))?,
        stream,
        pending: None,
        done_out: 0,
    };
    s.stream.synchronize()?;
    Ok(s)
}

impl Drop for Slot {
    /// Frees run on whatever thread drops the slot (a pipeline frees them on its reader,
    /// off the writer's path): the device's context is made current there first, so the
    /// driver's frees of the pinned buffers find it.
    fn drop(&mut self) {
        let _ = self.gpu.context().bind_to_thread();
    }
}

impl Slot {
    /// The pinned input the host fills before [`Slot::submit`].
    pub fn input(&mut self) -> &mut [u8] {
        self.host_in.slice_mut()
    }

    /// The slot's stream (to order its work after another stream's, `CudaStream::wait`).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Queues the quantization of `rows` x `cols` elements of `input` (the first bytes of
    /// [`Slot::input`]) to `ty`: upload, kernel, download, on the slot's stream.
    pub fn submit(
        &mut self,
        ty: GgmlType,
        input: Input,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: `Output::Host` writes only the slot's own buffers.
        unsafe { self.submit_to(ty, input, rows, cols, Output::Host) }
    }

    /// [`Slot::submit`] with the blocks sent to `out`; with [`Output::Device`] only the row
    /// flags come back and [`Slot::complete`] lends no bytes.
    ///
    /// # Safety
    /// With [`Output::Device`], `dst` must be device memory of this slot's context with
    /// room for the chunk's output (`rows` ggml rows of `ty`, or `rows` GPU rows with
    /// `repack`), not used by other work until this slot's [`Slot::complete`] returns
    /// (or later work is ordered after the slot's stream).
    pub unsafe fn submit_to(
        &mut self,
        ty: GgmlType,
        input: Input,
        rows: usize,
        cols: usize,
        out: Output,
    ) -> Result<(), CudaError> {
        let p = quantize::plan(ty, rows, cols)?;
        let src_bytes = rows * cols * input.bytes();
        let fits = |what, got: usize, want: usize| {
            if got < want {
                Err(CudaError::BadLength { what, got, want })
            } else {
                Ok(())
            }
        };
        fits("staged input bytes", self.host_in.len, src_bytes)?;
        if out == Output::Host {
            fits("staged output bytes", self.host_out.len, p.out_bytes)?;
        }
        fits("staged row flags", self.dev_flags.len(), rows)?;
        let gpu = &self.gpu;
        gpu.context().bind_to_thread()?;
        let cu = self.stream.cu_stream();
        let staged_out = gpu.ptr(&self.dev_out);
        let (src, flags) = (gpu.ptr(&self.dev_in), gpu.ptr(&self.dev_flags));
        // Where the quantize kernel writes: the slot's output buffer unless the blocks go
        // straight to their place on the device.
        let dst = match out {
            Output::Device { dst, repack: false } => dst,
            _ => {
                fits(
                    "staged device output bytes",
                    self.dev_out.len(),
                    p.out_bytes,
                )?;
                staged_out
            }
        };
        // SAFETY: every range was checked against its buffer above; the pinned buffers stay
        // untouched by the host until `complete` has waited for this stream's event.
        unsafe {
            result::memcpy_htod_async(src, &self.host_in.slice()[..src_bytes], cu)?;
            result::memset_d8_async(flags, 0, rows * 4, cu)?;
        }
        let f = gpu.function(&quantize::kernel_name(ty, input)?)?;
        let cfg = LaunchConfig {
            grid_dim: (p.grid, 1, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: 0,
        };
        let values = quantize::QuantizeArgs {
            src,
            dst,
            flags,
            blocks: p.blocks,
            blocks_per_row: p.blocks_per_row,
        }
        .values();
        let mut l = self.stream.launch_builder(&f);
        crate::gpu::push_args(&mut l, &values);
        gpu.no_timeline(&mut l);
        // SAFETY: the kernel reads `src_bytes` of the input and writes `out_bytes` of the
        // output and `rows` flags, all within the slot's buffers (checked above), or for
        // `Output::Device` without repack, at the caller's `dst` (the caller's contract).
        unsafe { l.launch(cfg) }?;
        if let Output::Device { dst, repack: true } = out {
            crate::quantize::repack_on(gpu, &self.stream, ty, staged_out, dst, rows, cols)?;
        }
        // SAFETY: as above; the host buffers are not read before the event.
        unsafe {
            if out == Output::Host {
                result::memcpy_dtoh_async(&mut self.host_out.slice_mut()[..p.out_bytes], dst, cu)?;
            }
            result::memcpy_dtoh_async(&mut self.host_flags.slice_mut()[..rows * 4], flags, cu)?;
        }
        self.done.record(&self.stream)?;
        self.pending = Some(Pending {
            input,
            rows,
            cols,
            out_bytes: p.out_bytes,
            to_host: out == Output::Host,
        });
        Ok(())
    }

    /// Waits for the submitted chunk and lends its output bytes; a non-finite input value
    /// is an error naming its row and column within the chunk.
    pub fn complete(&mut self) -> Result<&[u8], CudaError> {
        let Some(p) = self.pending.take() else {
            return Err(CudaError::Init("complete without submit".into()));
        };
        self.done_out = 0;
        self.gpu.context().bind_to_thread()?;
        self.done.synchronize()?;
        let flags: Vec<u32> = self.host_flags.slice()[..p.rows * 4]
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let src = &self.host_in.slice()[..p.rows * p.cols * p.input.bytes()];
        quantize::check_flags(&flags, |r, c| {
            let at = (r * p.cols + c) * p.input.bytes();
            p.input
                .widen(&src[at..at + p.input.bytes()])
                .first()
                .copied()
                .unwrap_or(f32::NAN)
        })
        .map_err(|e| CudaError::Kernel(KernelError::Quant(e)))?;
        if !p.to_host {
            return Ok(&[]);
        }
        self.done_out = p.out_bytes;
        Ok(&self.host_out.slice()[..p.out_bytes])
    }

    /// What [`Slot::complete`] last lent, again (a writer thread writes it after the
    /// completing thread has moved on); empty before any.
    pub fn output(&self) -> &[u8] {
        &self.host_out.slice()[..self.done_out]
    }

    /// The pinned input, read-only (a chunk copied as it is goes out from here).
    pub fn input_bytes(&self) -> &[u8] {
        self.host_in.slice()
    }

    /// Whether a submitted chunk awaits [`Slot::complete`].
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}
