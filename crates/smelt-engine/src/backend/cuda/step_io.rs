//! A step's way in and out: the pinned step buffer the host fills with token ids,
//! positions, sequence descriptors and block tables (copied to the device in the step, so
//! a captured decode graph re-reads it at every replay), and the copy of the logits back
//! through pinned memory (hashed by `SMELT_CUDA_DIGEST`). Apart from the ops because the
//! engine, not the model, drives it.

use smelt_cuda::cudarc::driver::result as cu;
use smelt_cuda::cudarc::driver::{CudaSlice, PinnedHostSlice};
use smelt_cuda::CudaError;

use super::step::StepLayout;
use super::{lock, Cuda, CudaTensor};
use crate::backend::AttnSeq;
use crate::EngineError;

/// Pinned host memory logits are copied through (a pageable copy is several times slower).
pub(super) struct Staging {
    _buf: PinnedHostSlice<f32>,
    ptr: *mut f32,
    len: usize,
}

unsafe impl Send for Staging {}

/// The step buffer: pinned host words the engine fills, their device copy the kernels read.
pub(super) struct StepBuf {
    layout: StepLayout,
    /// Owner of the memory `host_ptr` points into.
    _host: PinnedHostSlice<u32>,
    host_ptr: *mut u32,
    /// Owner of the memory `dev_ptr` points into.
    _dev: CudaSlice<u32>,
    dev_ptr: u64,
    n_tokens: usize,
    n_seqs: usize,
    max_tokens: usize,
    generation: u64,
    /// The step's recurrent-state addresses as written into the buffer (hybrid models).
    state_addrs: Vec<u64>,
}

unsafe impl Send for StepBuf {}

/// Device addresses of the current step's inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepPtrs {
    pub tokens: u64,
    pub positions: u64,
    pub descs: u64,
    pub block_tables: u64,
    /// Each sequence's recurrent-state address (u64 each, sequence order).
    pub state_addrs: u64,
    pub n_tokens: usize,
    pub n_seqs: usize,
    /// Most new tokens of one sequence in this step (launch shapes of kv_append and
    /// attention; 1 for a decode step).
    pub max_tokens: usize,
}

impl Cuda {
    /// Starts a step: writes its inputs into the pinned step buffer (growing it when they do
    /// not fit) and resets the scratch arena. Enqueues nothing: [`Cuda::upload_step`] does.
    pub fn begin_step(
        &self,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
    ) -> Result<(), EngineError> {
        let blocks: usize = seqs.iter().map(|s| s.blocks.len()).sum();
        let mut step = lock(&self.step);
        let fits = step
            .as_ref()
            .is_some_and(|s| s.layout.fits(tokens.len(), seqs.len(), blocks));
        if !fits {
            let generation = step.as_ref().map_or(0, |s| s.generation + 1);
            // Keep what we had room for, so alternating shapes do not reallocate.
            let (t, s, b) = step.as_ref().map_or((0, 0, 0), |s| {
                (s.layout.cap_tokens, s.layout.cap_seqs, s.layout.cap_blocks)
            });
            let layout =
                StepLayout::with_room(tokens.len().max(t), seqs.len().max(s), blocks.max(b));
            self.gpu.synchronize()?;
            // SAFETY: pinned host memory for plain words; zeroed below before use.
            let mut host = unsafe { self.gpu.context().alloc_pinned::<u32>(layout.words()) }
                .map_err(CudaError::from)?;
            let host_ptr = host.as_mut_ptr().map_err(CudaError::from)?;
            // SAFETY: `host_ptr` is `layout.words()` words of pinned memory.
            unsafe { std::ptr::write_bytes(host_ptr, 0, layout.words()) };
            let dev = self.gpu.zeros::<u32>(layout.words())?;
            let dev_ptr = self.gpu.ptr(&dev);
            *step = Some(StepBuf {
                layout,
                _host: host,
                host_ptr,
                _dev: dev,
                dev_ptr,
                n_tokens: 0,
                n_seqs: 0,
                max_tokens: 0,
                generation,
                state_addrs: Vec::new(),
            });
        }
        let Some(s) = step.as_mut() else {
            return Err(EngineError::BadOptions("no step buffer".into()));
        };
        // SAFETY: `host_ptr` is `layout.words()` words of pinned memory; the previous step
        // finished (the engine downloads its logits) before this one writes.
        let words = unsafe { std::slice::from_raw_parts_mut(s.host_ptr, s.layout.words()) };
        s.layout.fill(words, tokens, positions, seqs)?;
        s.n_tokens = tokens.len();
        s.n_seqs = seqs.len();
        s.max_tokens = seqs.iter().map(|q| q.n_tokens).max().unwrap_or(0);
        s.state_addrs.clear();
        drop(step);
        // Nothing of the last step's scratch is read again: forget what pointed into it.
        *lock(&self.fusion.quantized) = None;
        *lock(&self.fusion.gemm_quantized) = None;
        *lock(&self.fusion.pending_add) = None;
        *lock(&self.fusion.pending_gemv) = None;
        *lock(&self.fusion.moe_plan) = None;
        let mut chunk = Self::new_chunk(&self.gpu);
        lock(&self.scratch).reset(&mut chunk)?;
        Ok(())
    }

    /// Writes each sequence's recurrent-state address (hybrid models: one device block per
    /// sequence holding every delta-net layer's state, see `delta`) into the step buffer,
    /// after [`Cuda::begin_step`] and before [`Cuda::upload_step`]: the delta-net kernels
    /// read them there, so a captured decode graph finds the states of whichever sequences
    /// a replay runs.
    pub fn set_state_addrs(&self, addrs: &[u64]) -> Result<(), EngineError> {
        let mut step = lock(&self.step);
        let Some(s) = step.as_mut() else {
            return Err(EngineError::BadOptions(
                "set_state_addrs before begin_step".into(),
            ));
        };
        if addrs.len() != s.n_seqs {
            return Err(EngineError::BadOptions(format!(
                "{} state addresses for {} sequences",
                addrs.len(),
                s.n_seqs
            )));
        }
        // SAFETY: `host_ptr` is `layout.words()` words of pinned memory; the addresses'
        // section holds `2 * cap_seqs` of them, and `n_seqs <= cap_seqs`.
        let words = unsafe { std::slice::from_raw_parts_mut(s.host_ptr, s.layout.words()) };
        let at = s.layout.state_addrs();
        for (i, &a) in addrs.iter().enumerate() {
            words[at + 2 * i] = a as u32;
            words[at + 2 * i + 1] = (a >> 32) as u32;
        }
        s.state_addrs = addrs.to_vec();
        Ok(())
    }

    /// The state addresses [`Cuda::set_state_addrs`] wrote for this step.
    pub(super) fn state_addrs_host(&self) -> Vec<u64> {
        lock(&self.step)
            .as_ref()
            .map_or(Vec::new(), |s| s.state_addrs.clone())
    }

    /// Enqueues the copy of the step buffer to the device (captured into a decode graph,
    /// it re-reads the host words at every replay).
    pub fn upload_step(&self) -> Result<(), EngineError> {
        let step = lock(&self.step);
        let Some(s) = step.as_ref() else {
            return Err(EngineError::BadOptions(
                "upload_step before begin_step".into(),
            ));
        };
        // SAFETY: pinned source of `words()` words, device destination of the same size.
        let words = unsafe { std::slice::from_raw_parts(s.host_ptr, s.layout.words()) };
        unsafe { cu::memcpy_htod_async(s.dev_ptr, words, self.gpu.stream().cu_stream()) }
            .map_err(CudaError::from)?;
        Ok(())
    }

    /// Changes whenever a buffer whose address a graph holds moves.
    pub fn generation(&self) -> u64 {
        let a = lock(&self.scratch).generation();
        let s = lock(&self.step).as_ref().map_or(0, |s| s.generation);
        a.wrapping_mul(1 << 32).wrapping_add(s)
    }

    /// Device addresses of the step's sections: (tokens, positions, descriptors, block tables).
    pub(super) fn step_ptrs(&self) -> Result<StepPtrs, CudaError> {
        let step = lock(&self.step);
        let s = step
            .as_ref()
            .ok_or_else(|| CudaError::Init("an op ran before the step buffer existed".into()))?;
        let at = |w: usize| s.dev_ptr + 4 * w as u64;
        Ok(StepPtrs {
            tokens: at(s.layout.tokens()),
            positions: at(s.layout.positions()),
            descs: at(s.layout.descs()),
            block_tables: at(s.layout.block_tables()),
            state_addrs: at(s.layout.state_addrs()),
            n_tokens: s.n_tokens,
            n_seqs: s.n_seqs,
            max_tokens: s.max_tokens,
        })
    }

    /// Copies a tensor to the host (waits for the stream).
    pub fn download(&self, x: &CudaTensor) -> Result<Vec<f32>, CudaError> {
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut st = lock(&self.staging);
        if st.as_ref().is_none_or(|s| s.len < n) {
            self.gpu.synchronize()?;
            // SAFETY: pinned host floats, written by the copy below before they are read.
            let mut buf = unsafe { self.gpu.context().alloc_pinned::<f32>(n) }?;
            let ptr = buf.as_mut_ptr()?;
            *st = Some(Staging {
                _buf: buf,
                ptr,
                len: n,
            });
        }
        let Some(s) = st.as_ref() else {
            return Err(CudaError::Init("no staging buffer".into()));
        };
        // SAFETY: `s.ptr` holds at least `n` floats of pinned memory, and `x` is `n` floats
        // of device memory alive until the next step.
        let host = unsafe { std::slice::from_raw_parts_mut(s.ptr, n) };
        unsafe { cu::memcpy_dtoh_async(host, x.ptr, self.gpu.stream().cu_stream()) }?;
        self.gpu.synchronize()?;
        if let Some(d) = &self.diag.digest {
            let mut d = lock(d);
            for v in host.iter() {
                d.0 = (d.0 ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
            }
            d.1 += 1;
        }
        Ok(host.to_vec())
    }
}
