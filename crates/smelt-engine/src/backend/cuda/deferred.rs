//! What waits for the next op: the deferred GEMV, add and rope that a following op may
//! fuse with (see the module doc of [`super`]), the cached q8_1 tiles of the last matmul
//! input, and how each is launched or forgotten when the next op cannot take it. Apart
//! from the ops so that the rules of what may wait, and for what, read in one place.

use std::sync::Mutex;

use smelt_cuda::CudaError;

use super::{
    fusion, lock, moe, Cuda, CudaTensor, CudaWeight, GemmInput, PendingGemv, Quantized, SplitNorm,
};

/// The fusion state kept between the ops of a step: the deferred launches a following op
/// may join, and what the last matmuls made of their input for the next ones to reuse.
/// Everything here points into the step's scratch, so a new step forgets it all
/// ([`Cuda::begin_step`]) and a layer forgets what lies in the arena it reuses
/// ([`Cuda::op_begin_layer`]).
pub(super) struct FusionState {
    /// The last matmul input and its q8_1 tiles: Q, K and V (and gate and up) multiply the
    /// same activations, which are quantized once. Any other op forgets it.
    pub(super) quantized: Mutex<Option<Quantized>>,
    /// The same for the GEMMs' inputs: an activation and its int8 tiles (`gemm::act`)
    /// and f16 rows (`gemm::f16`), each made once for every matmul of it.
    pub(super) gemm_quantized: Mutex<Option<GemmInput>>,
    /// `x += y` not launched yet: when the next op is the norm of `x` (the residual stream
    /// then the next block's norm), both run as one fused kernel.
    pub(super) pending_add: Mutex<Option<(CudaTensor, CudaTensor)>>,
    pub(super) pending_gemv: Mutex<Option<PendingGemv>>,
    /// The expert plan of this step's last route (`moe`).
    pub(super) moe_plan: Mutex<moe::PlanCache>,
}

impl Cuda {
    /// Forgets the cached matmul input; a split norm whose output no GEMV wrote yet writes
    /// it now (with the plain norm kernel: the residual is already updated).
    pub(super) fn forget_quantized(&self) -> Result<(), CudaError> {
        *lock(&self.fusion.gemm_quantized) = None;
        let cached = lock(&self.fusion.quantized).take();
        if let Some(Quantized {
            rms:
                Some(
                    n @ SplitNorm {
                        out_pending: true, ..
                    },
                ),
            ..
        }) = cached
        {
            let g = CudaWeight::Vector {
                ptr: n.g,
                len: n.res.cols,
            };
            self.op_rms_norm(&n.res, &g, n.eps, &n.out)?;
        }
        Ok(())
    }

    /// A layer begins (`Backend::begin_layer`): its temporaries come from the layer arena
    /// the layer before last used (`arena::StepScratch`). What still points into that
    /// arena is settled first: a deferred launch that reads or writes it is launched (so
    /// the kernels run before anything new is written there), and a cached input or
    /// expert plan in it is forgotten (its address will name other data). When one of
    /// `live`, which cross layers, lies in it (an output moved into a layer's scratch),
    /// the arena is not reused this time.
    pub(super) fn op_begin_layer(&self, live: &[&CudaTensor]) -> Result<(), CudaError> {
        let Some(i) = lock(&self.scratch).next_layer_arena() else {
            return Ok(());
        };
        let held = |ptrs: &[u64]| {
            let s = lock(&self.scratch);
            ptrs.iter().any(|&p| s.holds(i, p))
        };
        let norm_ptrs = |n: &Option<SplitNorm>| {
            n.map_or(Vec::new(), |n| vec![n.partials, n.res.ptr, n.out.ptr])
        };
        let pending = {
            let mut ptrs = Vec::new();
            if let Some((x, y)) = *lock(&self.fusion.pending_add) {
                ptrs.extend([x.ptr, y.ptr]);
            }
            if let Some(p) = *lock(&self.fusion.pending_gemv) {
                ptrs.extend([p.x.ptr, p.q, p.out]);
                ptrs.extend(norm_ptrs(&p.rms));
            }
            ptrs
        };
        if held(&pending) {
            self.flush()?;
        }
        let cached = *lock(&self.fusion.quantized);
        if let Some(c) = cached {
            let mut ptrs = vec![c.x.ptr, c.q];
            ptrs.extend(norm_ptrs(&c.rms));
            if held(&ptrs) {
                self.forget_quantized()?;
            }
        }
        let gemm = *lock(&self.fusion.gemm_quantized);
        if let Some(g) = gemm {
            let ptrs: Vec<u64> = [Some(g.x.ptr), g.tiles, g.f16]
                .into_iter()
                .flatten()
                .collect();
            if held(&ptrs) {
                *lock(&self.fusion.gemm_quantized) = None;
            }
        }
        let plan = *lock(&self.fusion.moe_plan);
        if let Some((route, _, tiles)) = plan {
            if held(&[route, tiles]) {
                *lock(&self.fusion.moe_plan) = None;
            }
        }
        let reuse = !held(&live.iter().map(|t| t.ptr).collect::<Vec<_>>());
        lock(&self.scratch).begin_layer(reuse);
        Ok(())
    }

    /// Launches whatever is deferred (a GEMV or an add; at most one is at a time).
    pub fn flush(&self) -> Result<(), CudaError> {
        self.flush_gemv()?;
        self.flush_add()
    }

    pub(super) fn flush_gemv(&self) -> Result<(), CudaError> {
        let pending = lock(&self.fusion.pending_gemv).take();
        match pending {
            Some(p) => self.launch_pending_gemv(&p, None),
            None => Ok(()),
        }
    }

    /// Launches the deferred single-token GEMV `p` (with the rope + KV-append epilogue's
    /// parameters `rope`, see [`Cuda::launch_gemv`]).
    pub(super) fn launch_pending_gemv(
        &self,
        p: &PendingGemv,
        rope: Option<&smelt_kernels::gemv::RopeKvArgs>,
    ) -> Result<(), CudaError> {
        self.launch_gemv(
            p.w,
            p.ty,
            p.rows,
            p.cols,
            p.row_bytes,
            p.q,
            p.out,
            1,
            p.rms.as_ref(),
            rope,
        )
    }

    /// Launches the deferred add, if any.
    pub(super) fn flush_add(&self) -> Result<(), CudaError> {
        let pending = lock(&self.fusion.pending_add).take();
        match pending {
            Some((x, y)) => self.op_add(&x, &y),
            None => Ok(()),
        }
    }

    /// Makes the outputs of a fused single-token run (`ws` the run's weights) follow one
    /// another, as the one GEMV writes them: left where they are when they already do
    /// ([`fusion::outputs_follow`]), else views, in order, of one new scratch buffer.
    pub(super) fn place_run_outputs(
        &self,
        ws: &[&CudaWeight],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), CudaError> {
        let widths: Vec<usize> = ws
            .iter()
            .map(|w| w.member().map_or(0, |m| m.rows))
            .collect();
        let at: Vec<(u64, usize)> = outs.iter().map(|o| (o.ptr, o.cap)).collect();
        if fusion::outputs_follow(&at, &widths) {
            return Ok(());
        }
        let total: usize = widths.iter().sum();
        let mut p = self.scratch(total * 4)?;
        for (o, &w) in outs.iter_mut().zip(&widths) {
            **o = CudaTensor {
                ptr: p,
                rows: 1,
                cols: w,
                cap: w,
            };
            p += (w * 4) as u64;
        }
        Ok(())
    }
}
