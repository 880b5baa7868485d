//! In-situ quantization into device memory (issue 20): with a [`DeviceIsq`] plan, a
//! weight the plan converts is read from the source file in chunks of whole rows into
//! pinned staging slots, uploaded, quantized by the GPU kernels (byte-identical to the CPU
//! quantizer) and, for formats whose GEMV layout is not ggml's, repacked on the device
//! into the GEMV's rows (`smelt_kernels::formats::gpu_repack`) straight into the weight's
//! place in weight memory. Nothing goes back to the host but the per-row non-finite flags,
//! so the weights cross the link once, and the model on the device is the one the file
//! `smelt quantize` writes would give (the bench compares the two byte for byte with
//! `SMELT_CUDA_WEIGHT_DIGEST=1`).
//!
//! Chunks rotate over a few slots, each with its own stream: the host reads the next chunk
//! while earlier ones upload and quantize, and it only waits for a slot it is about to
//! reuse. Weights are placed in load order as a file's are (the GEMV fusions depend on
//! adjacent weights). Pairs the GPU does not quantize (a quantized source, a target
//! without a kernel) are quantized on the host as `smelt quantize` does, then uploaded.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use smelt_cuda::cudarc::driver::CudaEvent;
use smelt_cuda::staged::{self, Output, Slot};
use smelt_cuda::CudaError;
use smelt_gguf::{GgmlType, Gguf, TensorInfo};
use smelt_kernels::formats::gpu_repack;
use smelt_kernels::quantize::Input;

use super::weights::{self, Role, WeightPlan};
use super::{lock, upload, Cuda, CudaWeight};
use crate::EngineError;

/// Which tensors to quantize as they load, and to what: the per-tensor plan of `--isq`
/// (llama.cpp's rules, made by the caller), only the tensors whose type changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIsq {
    pub types: BTreeMap<String, GgmlType>,
}

/// Source bytes per chunk (as `smelt_load::pipeline::CHUNK_BYTES`).
const CHUNK: usize = 64 << 20;
/// Most rows per chunk (bounds the flag buffers).
const MAX_ROWS: usize = 1 << 16;
/// Slots in flight: one being read, the others uploading, quantizing, repacking.
const SLOTS: usize = 4;

/// What a device ISQ load did, for the load log and the bench's breakdown.
#[derive(Clone, Copy, Debug, Default)]
pub struct IsqStats {
    /// Tensors quantized on the device, and on the host.
    pub on_device: usize,
    pub on_host: usize,
    pub chunks: usize,
    /// Source bytes read, and bytes written to weight memory.
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Host time spent reading chunks, and waiting for a slot to come free.
    pub reading: Duration,
    pub waiting: Duration,
    /// Host time quantizing the tensors the GPU does not.
    pub host_quantize: Duration,
}

/// The chunk a slot is working on, for error messages.
struct InFlight {
    name: String,
    row0: usize,
}

/// The loader's state while a model loads (dropped by [`Cuda::finish_isq`], which frees the
/// slots' pinned and device memory).
pub(crate) struct IsqLoader {
    plan: Arc<DeviceIsq>,
    slots: Vec<(Slot, Option<InFlight>)>,
    next: usize,
    /// Recorded on the device's stream after weight memory is reserved: the slots' streams
    /// wait for it (a chunk of weight memory is allocated in stream order).
    reserved: CudaEvent,
    file: Option<File>,
    stats: IsqStats,
}

/// Waits for a slot's chunk and checks its flags.
fn settle(slot: &mut Slot, flight: &mut Option<InFlight>) -> Result<(), EngineError> {
    if let Some(f) = flight.take() {
        slot.complete().map_err(|e| EngineError::BadMetadata {
            key: f.name,
            why: format!("quantizing on the GPU (chunk from row {}): {e}", f.row0),
        })?;
    }
    Ok(())
}

/// Reads `buf.len()` bytes at `offset` of `file` with parallel reads of a few MiB
/// ([`smelt_gguf::pread_parallel`], 4 to 16 readers).
fn pread_parallel(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    const PIECE: usize = 4 << 20;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4)
        .clamp(4, 16);
    smelt_gguf::pread_parallel(file, offset, buf, threads, PIECE)
}

/// `rows` rows of `cols` values of `src_ty` quantized to `dst` as smelt's CPU quantizer
/// does (widened to f32 row by row, then `smelt_quant::quantize_tensor`).
fn host_quantize(
    name: &str,
    src_ty: GgmlType,
    data: &[u8],
    cols: usize,
    dst: GgmlType,
) -> Result<Vec<u8>, EngineError> {
    let bad = |why: String| EngineError::BadMetadata {
        key: name.into(),
        why,
    };
    let src_row = src_ty
        .row_bytes(cols as u64)
        .ok_or_else(|| bad(format!("rows of {cols} are not whole {src_ty} blocks")))?
        as usize;
    let mut vals = vec![0f32; data.len() / src_row.max(1) * cols];
    vals.par_chunks_mut(cols.max(1))
        .zip(data.par_chunks(src_row.max(1)))
        .try_for_each(|(d, s)| smelt_quant::dequantize_row(src_ty, s, d))
        .map_err(|e| bad(format!("reading {src_ty}: {e}")))?;
    smelt_quant::quantize_tensor(dst, &vals, cols, None)
        .map_err(|e| bad(format!("quantizing to {dst}: {e}")))
}

impl Cuda {
    /// Quantizes the weights `plan` names as they load, on this device (see the module
    /// docs); call [`Cuda::finish_isq`] once the model is loaded.
    pub fn start_isq(&self, plan: Arc<DeviceIsq>, gguf: &Gguf) -> Result<(), EngineError> {
        let slots = staged::slots_on_device(self.gpu(), SLOTS, CHUNK, CHUNK, MAX_ROWS)?;
        let file = gguf.path().and_then(|p| File::open(p).ok());
        *lock(&self.store.isq) = Some(IsqLoader {
            plan,
            slots: slots.into_iter().map(|s| (s, None)).collect(),
            next: 0,
            reserved: self
                .gpu()
                .context()
                .new_event(None)
                .map_err(CudaError::from)?,
            file,
            stats: IsqStats::default(),
        });
        Ok(())
    }

    /// Waits for every chunk still in flight, checks it, frees the staging slots and says
    /// what the loads did (`None` without [`Cuda::start_isq`]).
    pub fn finish_isq(&self) -> Result<Option<IsqStats>, EngineError> {
        let Some(mut l) = lock(&self.store.isq).take() else {
            return Ok(None);
        };
        let t = Instant::now();
        for (slot, flight) in &mut l.slots {
            settle(slot, flight)?;
        }
        l.stats.waiting += t.elapsed();
        Ok(Some(l.stats))
    }

    /// The type the ISQ plan gives tensor `name`, if it changes it.
    pub(super) fn isq_type(&self, name: &str) -> Option<GgmlType> {
        lock(&self.store.isq)
            .as_ref()
            .and_then(|l| l.plan.types.get(name).copied())
    }

    /// Loads tensor `info` as the ISQ plan says, if it names it (else `None`: the caller
    /// loads the file's bytes).
    pub(super) fn load_isq(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        role: Role,
    ) -> Result<Option<CudaWeight>, EngineError> {
        let mut guard = lock(&self.store.isq);
        let Some(l) = guard.as_mut() else {
            return Ok(None);
        };
        let Some(&dst) = l.plan.types.get(&info.name) else {
            return Ok(None);
        };
        let name = info.name.as_str();
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let n_dims = info.shape.len();
        let plan = weights::plan(name, dst, n_dims, rows, cols, role)?;
        let input =
            Input::from_ggml(info.ty).filter(|_| smelt_cuda::quantize::supports(info.ty, dst));
        let src_row = info.ty.row_bytes(cols as u64).unwrap_or(u64::MAX) as usize;
        let device = match (plan, input) {
            _ if src_row > CHUNK => None,
            (WeightPlan::Gemv { row_bytes }, Some(i)) => Some((
                i,
                row_bytes,
                !gpu_repack::layout(dst)
                    .map_err(CudaError::from)?
                    .is_identity(),
            )),
            (WeightPlan::Embedding { row_bytes }, Some(i)) => Some((i, row_bytes, false)),
            _ => None,
        };
        let Some((input, row_bytes, repack)) = device else {
            let t = Instant::now();
            let bytes = host_quantize(name, info.ty, gguf.tensor_data(info), cols, dst)?;
            l.stats.on_host += 1;
            l.stats.host_quantize += t.elapsed();
            l.stats.read_bytes += info.n_bytes();
            l.stats.written_bytes += bytes.len() as u64;
            drop(guard);
            return self
                .load_bytes(name, dst, n_dims, rows, cols, &bytes, role)
                .map(Some);
        };
        let ptr = self.reserve_weight(rows * row_bytes)?;
        l.reserved
            .record(self.gpu().stream())
            .map_err(CudaError::from)?;
        let per = (CHUNK / src_row.max(1)).clamp(1, MAX_ROWS);
        let base = gguf.data_offset() + info.offset;
        let mut r = 0;
        while r < rows {
            let n = per.min(rows - r);
            let idx = l.next;
            l.next = (idx + 1) % l.slots.len();
            let (slot, flight) = &mut l.slots[idx];
            let t = Instant::now();
            settle(slot, flight)?;
            l.stats.waiting += t.elapsed();
            let t = Instant::now();
            let buf = &mut slot.input()[..n * src_row];
            let at = (r * src_row) as u64;
            match &l.file {
                Some(f) => {
                    pread_parallel(f, base + at, buf).map_err(|e| EngineError::BadMetadata {
                        key: name.into(),
                        why: format!("reading the source file: {e}"),
                    })?
                }
                None => {
                    let data = &gguf.tensor_data(info)[at as usize..at as usize + buf.len()];
                    buf.par_chunks_mut(1 << 20)
                        .zip(data.par_chunks(1 << 20))
                        .for_each(|(d, s)| d.copy_from_slice(s));
                }
            }
            l.stats.reading += t.elapsed();
            slot.stream().wait(&l.reserved).map_err(CudaError::from)?;
            let out = Output::Device {
                dst: ptr + (r * row_bytes) as u64,
                repack,
            };
            // SAFETY: `ptr` was reserved for `rows * row_bytes` bytes of weight memory in this
            // context, written by nothing else; rows `r..r + n` are `n * row_bytes` of them,
            // and the slot's stream waits for the reservation. `finish_isq` waits for every
            // slot before the model runs.
            unsafe { slot.submit_to(dst, input, n, cols, out) }?;
            *flight = Some(InFlight {
                name: name.to_string(),
                row0: r,
            });
            l.stats.chunks += 1;
            upload::LOADED_BYTES.fetch_add((n * src_row) as u64, Ordering::Relaxed);
            r += n;
        }
        l.stats.on_device += 1;
        l.stats.read_bytes += info.n_bytes();
        l.stats.written_bytes += (rows * row_bytes) as u64;
        Ok(Some(match plan {
            WeightPlan::Embedding { .. } => CudaWeight::Embedding {
                ptr,
                ty: dst,
                rows,
                cols,
            },
            _ => CudaWeight::Matrix {
                ptr,
                ty: dst,
                rows,
                cols,
                row_bytes,
            },
        }))
    }
}

impl IsqStats {
    /// One line for the load log.
    pub fn line(&self) -> String {
        format!(
            "{} tensors quantized on the device ({} chunks), {} on the host ({:.2} s); read {:.2} GB, wrote {:.2} GB to weight memory; host reading {:.2} s, waiting for slots {:.2} s",
            self.on_device,
            self.chunks,
            self.on_host,
            self.host_quantize.as_secs_f64(),
            self.read_bytes as f64 / 1e9,
            self.written_bytes as f64 / 1e9,
            self.reading.as_secs_f64(),
            self.waiting.as_secs_f64(),
        )
    }
}
