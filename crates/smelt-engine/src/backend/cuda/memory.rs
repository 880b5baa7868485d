//! The backend's device memory: weight memory (chunks bump-allocated in load order; a
//! matmul group kept in one chunk, see [`super::fusion`]), loading a tensor into it as its
//! role needs, and the per-step scratch arena activations live in. Apart from the ops
//! because every op uses it and none of it launches a kernel.

use std::sync::{Arc, Mutex};

use smelt_cuda::cudarc::driver::result as cu;
use smelt_cuda::cudarc::driver::CudaSlice;
use smelt_cuda::{CudaError, Gpu};
use smelt_gguf::{GgmlType, Gguf};
use smelt_kernels::catalog;

use super::weights::{self, Role, WeightPlan};
use super::{arena, isq, lock, upload, Cuda, CudaTensor, CudaWeight};
use crate::EngineError;

/// Weight chunks of this many bytes (a larger tensor gets a chunk of its own).
pub(super) const WEIGHT_CHUNK: usize = 256 << 20;

/// Weight memory and what fills it while a model loads: the chunks weights are placed in,
/// where each went (for the digest), and the upload and in-situ quantization machinery,
/// which a load makes and frees again.
pub(super) struct WeightStore {
    /// Pinned buffers weights are uploaded through (made at the first upload).
    pub(super) uploader: Mutex<Option<upload::Uploader>>,
    /// Weight memory: chunks bump-allocated in load order; (chunks, next free, end).
    pub(super) weights: Mutex<(Vec<CudaSlice<u8>>, u64, u64)>,
    /// Every weight's place and size in weight memory, in load order (for
    /// [`Cuda::weights_digest`]).
    pub(super) weight_ranges: Mutex<Vec<(u64, usize)>>,
    /// In-situ quantization into device memory while a model loads ([`isq`]).
    pub(super) isq: Mutex<Option<isq::IsqLoader>>,
}

impl Cuda {
    pub(super) fn new_chunk(
        gpu: &Gpu,
    ) -> impl FnMut(usize) -> Result<(CudaSlice<u8>, u64), CudaError> + '_ {
        move |bytes| {
            let buf = gpu.zeros::<u8>(bytes)?;
            let p = gpu.ptr(&buf);
            Ok((buf, p))
        }
    }

    /// Copies `bytes` into weight memory (adjacent to the previous weight when it fits the
    /// current chunk) and returns its address.
    pub(super) fn upload_weight(&self, bytes: &[u8]) -> Result<u64, CudaError> {
        let p = self.reserve_weight(bytes.len())?;
        if !bytes.is_empty() && self.opts.launch.plain_upload {
            self.gpu.synchronize()?;
            // SAFETY: `p` has room for `bytes`; a synchronous copy from host memory.
            unsafe { cu::memcpy_htod_sync(p, bytes) }?;
        } else if !bytes.is_empty() {
            let mut up = lock(&self.store.uploader);
            if up.is_none() {
                *up = Some(upload::Uploader::new(&self.gpu)?);
            }
            if let Some(u) = up.as_mut() {
                // Queued on the stream after the chunk's allocation, before any kernel.
                u.upload(&self.gpu, p, bytes)?;
            }
        }
        Ok(p)
    }

    /// [`Cuda::upload_weight`] of `len` bytes that `make` writes into a host buffer the
    /// uploader reuses from weight to weight. A fresh buffer for every matrix is fresh pages,
    /// a fault every 4 KB: on a loader thread (a server's), whose glibc arena does not keep
    /// freed memory, that took 2.8 s of an 8B model's load (bench/gpu/NOTES.md).
    pub(super) fn upload_made<E: From<CudaError>>(
        &self,
        len: usize,
        make: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        let mut buf = lock(&self.store.uploader)
            .as_mut()
            .map(|u| std::mem::take(&mut u.scratch))
            .unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        make(&mut buf[..len])?;
        let p = self.upload_weight(&buf[..len])?;
        if let Some(u) = lock(&self.store.uploader).as_mut() {
            u.scratch = buf;
        }
        Ok(p)
    }

    /// Frees the upload buffers (pinned staging and the repack buffer) once a model is on
    /// the device; a later upload makes them again.
    pub(crate) fn release_upload_buffers(&self) {
        lock(&self.store.uploader).take();
    }

    /// Room for `n` bytes of weight memory (adjacent to the previous weight when it fits
    /// the current chunk; a new chunk is allocated on the device's stream), unwritten.
    pub(super) fn reserve_weight(&self, n: usize) -> Result<u64, CudaError> {
        let len = n.max(1).div_ceil(arena::ALIGN) * arena::ALIGN;
        self.weight_room(len)?;
        let mut w = lock(&self.store.weights);
        let p = w.1;
        w.1 += len as u64;
        drop(w);
        lock(&self.store.weight_ranges).push((p, n));
        Ok(p)
    }

    /// Makes the current weight chunk hold `len` more bytes: a new chunk (on the device's
    /// stream) when it does not.
    pub(super) fn weight_room(&self, len: usize) -> Result<(), CudaError> {
        let mut w = lock(&self.store.weights);
        if w.1 + len as u64 > w.2 {
            let size = len.max(WEIGHT_CHUNK);
            // SAFETY: written by the uploads that reserve it (and the tail of a chunk is
            // never read).
            let buf = unsafe { self.gpu.stream().alloc::<u8>(size) }?;
            let base = self.gpu.ptr(&buf);
            w.0.push(buf);
            w.1 = base;
            w.2 = base + size as u64;
        }
        Ok(())
    }

    /// Bytes of weight memory tensor `name` takes as a matmul operand (as `load` will
    /// place it: the ISQ plan's type, the GEMV's row layout, rounded up as reserved).
    pub(super) fn planned_bytes(&self, gguf: &Gguf, name: &str) -> Result<usize, EngineError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        let ty = self.isq_type(name).unwrap_or(info.ty);
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let bytes = match weights::plan(name, ty, info.shape.len(), rows, cols, Role::Matmul)? {
            WeightPlan::Gemv { row_bytes } | WeightPlan::Embedding { row_bytes } => {
                rows * row_bytes
            }
            WeightPlan::Vector => rows * cols * 4,
        };
        Ok(bytes.max(1).div_ceil(arena::ALIGN) * arena::ALIGN)
    }

    /// A hash of every weight's bytes in weight memory, in load order, and their count and
    /// total size (`SMELT_CUDA_WEIGHT_DIGEST=1` prints it after a load): two loads with the
    /// same digest put the same model on the device (a file's and `--isq`'s).
    pub fn weights_digest(&self) -> Result<(u64, usize, u64), CudaError> {
        self.gpu.synchronize()?;
        let ranges = lock(&self.store.weight_ranges).clone();
        let mut total = 0u64;
        let mut hashes = Vec::with_capacity(ranges.len());
        for &(p, n) in &ranges {
            let mut host = vec![0u8; n];
            if n > 0 {
                // SAFETY: `p` holds `n` bytes of weight memory; a synchronous copy.
                unsafe { cu::memcpy_dtoh_sync(&mut host, p) }?;
            }
            total += n as u64;
            hashes.push(upload::digest(&host));
        }
        let h = hashes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
            (h ^ x).wrapping_mul(0x0100_0000_01b3)
        });
        Ok((h, ranges.len(), total))
    }

    /// Gives `t` room for `rows x cols` (a new scratch buffer when it has less) and that shape.
    pub(super) fn ensure(
        &self,
        t: &mut CudaTensor,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        if rows * cols > t.cap {
            t.ptr = self.scratch(rows * cols * 4)?;
            t.cap = rows * cols;
        }
        t.rows = rows;
        t.cols = cols;
        Ok(())
    }

    /// Scratch bytes for this step (zero-size requests get a valid address too).
    pub(super) fn scratch(&self, bytes: usize) -> Result<u64, CudaError> {
        let mut chunk = Self::new_chunk(&self.gpu);
        let mut arena = lock(&self.scratch);
        arena.alloc(bytes, &mut chunk)
    }

    pub(super) fn load(
        &self,
        gguf: &Arc<Gguf>,
        name: &str,
        role: Role,
    ) -> Result<CudaWeight, EngineError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        if let Some(w) = self.load_isq(gguf, info, role)? {
            return Ok(w);
        }
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let data = gguf.tensor_data(info);
        self.load_bytes(name, info.ty, info.shape.len(), rows, cols, data, role)
    }

    /// Puts a tensor of `ty` (`n_dims` dimensions, `rows` x `cols`, ggml's bytes `data`)
    /// on the device as `role` needs it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_bytes(
        &self,
        name: &str,
        ty: GgmlType,
        n_dims: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        role: Role,
    ) -> Result<CudaWeight, EngineError> {
        let w = match weights::plan(name, ty, n_dims, rows, cols, role)? {
            WeightPlan::Vector => {
                let mut v = vec![0f32; rows * cols];
                for (src, dst) in data
                    .chunks(cols / ty.block_size() * ty.type_size())
                    .zip(v.chunks_mut(cols))
                {
                    smelt_quant::dequantize_row(ty, src, dst).map_err(|_| {
                        EngineError::UnsupportedType {
                            name: name.into(),
                            ty,
                        }
                    })?;
                }
                CudaWeight::Vector {
                    ptr: self.upload_weight(bytemuck::cast_slice(&v))?,
                    len: v.len(),
                }
            }
            WeightPlan::Gemv { .. } => {
                let row_bytes = catalog::row_bytes(ty, cols).map_err(CudaError::from)?;
                let plain = self.opts.launch.plain_upload;
                let ptr = self.upload_made(rows * row_bytes, |out| {
                    upload::repack_parallel(ty, data, rows, cols, row_bytes, plain, out).map_err(
                        |e| EngineError::BadMetadata {
                            key: name.into(),
                            why: format!("repacking for the GPU: {e}"),
                        },
                    )
                })?;
                CudaWeight::Matrix {
                    ptr,
                    ty,
                    rows,
                    cols,
                    row_bytes,
                }
            }
            WeightPlan::Embedding { .. } => CudaWeight::Embedding {
                ptr: self.upload_weight(data)?,
                ty,
                rows,
                cols,
            },
        };
        upload::LOADED_BYTES.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(w)
    }

    pub(super) fn copy_rows(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges are device scratch of at least `bytes`.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.gpu.stream().cu_stream()) }?;
        self.profile_mark("copy_rows")
    }
}
