//! The CUDA backend's mixture-of-experts ops (`smelt_kernels::moe`): expert tensors
//! uploaded as one array of per-expert GEMV matrices, the router's F32 weights as an f32
//! matrix, and the router, plan, grouped GEMV (or, for steps with enough tokens an expert,
//! the grouped tensor-core GEMM, `gemm::grouped`) and combine launched with the step's
//! shapes only. The expert ids stay on the device (`route`, then the plan's tiles), so a
//! decode step of a MoE model needs no host round trip and is captured as a graph like any
//! other.
//!
//! The plan of a route is made once per step and route (the gate, up and down projections
//! of a layer share it) and forgotten with the step's scratch.

use std::sync::Arc;

use smelt_cuda::CudaError;
use smelt_gguf::{GgmlType, Gguf};
use smelt_kernels::{act, catalog, gemm, moe, moe_fused, TILE};

use super::ops::args;
use super::{lock, Cuda, CudaTensor, CudaWeight, Quantized};
use crate::backend::{Backend, Gating, MoeRouting};
use crate::EngineError;

/// The plan made for a route this step: (route address, tokens per tile, tiles address).
pub(super) type PlanCache = Option<(u64, usize, u64)>;

impl Cuda {
    /// Uploads the 3-D expert tensor `name` (`[n_expert][rows][cols]`) as `n_expert`
    /// matrices in the GEMV's row layout, one after the other.
    pub(super) fn load_experts_inner(
        &self,
        gguf: &Arc<Gguf>,
        name: &str,
    ) -> Result<CudaWeight, EngineError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        let [cols, rows, n_expert] = info.shape[..] else {
            return Err(EngineError::BadShape {
                name: name.into(),
                got: info.shape.clone(),
                want: vec![0, 0, 0],
            });
        };
        let (cols, rows, n_expert) = (cols as usize, rows as usize, n_expert as usize);
        if n_expert > moe::MAX_EXPERTS {
            return Err(EngineError::NotSupported(format!(
                "{name}: {n_expert} experts; the CUDA router takes at most {}",
                moe::MAX_EXPERTS
            )));
        }
        if !catalog::GEMV_TYPES.contains(&info.ty) {
            return Err(EngineError::UnsupportedType {
                name: format!("{name} (no CUDA expert GEMV for this type)"),
                ty: info.ty,
            });
        }
        let data = gguf.tensor_data(info);
        let packed = catalog::repack(info.ty, data, rows * n_expert, cols).map_err(|e| {
            EngineError::BadMetadata {
                key: name.into(),
                why: format!("repacking experts for the GPU: {e}"),
            }
        })?;
        let row_bytes = catalog::row_bytes(info.ty, cols).map_err(CudaError::from)?;
        if u32::try_from(rows * row_bytes).is_err() {
            return Err(EngineError::NotSupported(format!(
                "{name}: an expert of {} bytes (at most 4 GiB each)",
                rows * row_bytes
            )));
        }
        Ok(CudaWeight::Experts {
            ptr: self.upload_weight(&packed)?,
            ty: info.ty,
            n_expert,
            rows,
            cols,
            row_bytes,
        })
    }

    /// A router's float weights (`ffn_gate_inp`, which llama.cpp never quantizes; the
    /// shared expert's gate `ffn_gate_inp_shexp` too) as an f32 matrix for [`moe::dense_f32_kernel`]; `None` for any other tensor.
    pub(super) fn load_router(
        &self,
        gguf: &Arc<Gguf>,
        name: &str,
    ) -> Result<Option<CudaWeight>, EngineError> {
        let Some(info) = gguf.tensor(name) else {
            return Ok(None);
        };
        let float = matches!(info.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        // The shared expert's gate (`ffn_gate_inp_shexp`, one logit per token) is a
        // one-row router.
        let router = name.ends_with("ffn_gate_inp.weight") && info.shape.len() == 2;
        let shared_gate = name.ends_with("ffn_gate_inp_shexp.weight") && info.shape.len() <= 2;
        if !(router || shared_gate) || !float {
            return Ok(None);
        }
        let (rows, cols) = (info.n_rows() as usize, info.row_len() as usize);
        let mut v = vec![0f32; rows * cols];
        let data = gguf.tensor_data(info);
        let row = cols * info.ty.type_size() / info.ty.block_size();
        for (src, dst) in data.chunks(row.max(1)).zip(v.chunks_mut(cols.max(1))) {
            smelt_quant::dequantize_row(info.ty, src, dst).map_err(|_| {
                EngineError::UnsupportedType {
                    name: name.into(),
                    ty: info.ty,
                }
            })?;
        }
        Ok(Some(CudaWeight::Dense {
            ptr: self.upload_weight(bytemuck::cast_slice(&v))?,
            rows,
            cols,
        }))
    }

    /// A split residual norm's output not written yet is written now (the MoE kernels read
    /// activations as floats, or quantize them themselves); other cached tiles stay.
    ///
    /// At a decode step the router comes first: the norm then writes its floats and the
    /// q8_1 tiles of them in one kernel (`fused::RMS_NORM_Q8`, the tiles `quantize_q8_1`
    /// would write), which stay cached for the expert GEMV of the same input, so a MoE
    /// layer launches no separate quantize (it did: a plain norm, then a quantize in the
    /// expert GEMV).
    fn settle_split_norm(&self) -> Result<(), CudaError> {
        let cached = *lock(&self.fusion.quantized);
        let Some(Quantized { rms: Some(n), .. }) = cached else {
            return Ok(());
        };
        let g = CudaWeight::Vector {
            ptr: n.g,
            len: n.res.cols,
        };
        if n.out_pending && self.opts.fuse.quantize && self.can_norm_quantize(&n.res, &g, &n.out) {
            *lock(&self.fusion.gemm_quantized) = None;
            let q = self.scratch(act::row_bytes(n.out.cols)? * n.out.rows)?;
            self.op_norm_q8(
                &n.res,
                None,
                &g,
                n.eps,
                &n.out,
                (q, smelt_kernels::fused::Sink::Q8_1),
            )?;
            *lock(&self.fusion.quantized) = Some(Quantized {
                x: n.out,
                q,
                rms: None,
            });
            return Ok(());
        }
        self.forget_quantized()
    }

    /// `out = W x` for an f32 matrix (the router).
    pub(super) fn op_dense(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let CudaWeight::Dense { ptr, rows, cols } = *w else {
            return Err(CudaError::Init(
                "dense matmul of a weight that is not f32".into(),
            ));
        };
        if x.cols != cols {
            return Err(CudaError::BadLength {
                what: "router input row",
                got: x.cols,
                want: cols,
            });
        }
        self.flush()?;
        self.settle_split_norm()?;
        self.ensure(out, x.rows, rows)?;
        if x.rows == 0 {
            return Ok(());
        }
        self.launch(
            moe::DENSE_F32,
            moe::dense_launch(rows, x.rows),
            &args(
                &moe::DenseArgs {
                    w: ptr,
                    x: x.ptr,
                    y: out.ptr,
                    nrows: rows as u32,
                    cols: cols as u32,
                }
                .values(),
            ),
        )
    }

    /// The router: `route` becomes `[n, 2k]` (ids as f32, then weights).
    pub(super) fn op_moe_route(
        &self,
        logits: &CudaTensor,
        p: &MoeRouting,
        route: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let (n, ne) = (logits.rows, logits.cols);
        if ne > moe::MAX_EXPERTS || p.k == 0 || p.k > ne.min(moe::MAX_K) {
            return Err(CudaError::Init(format!(
                "routing {} of {ne} experts (the kernel takes 1..={} of at most {})",
                p.k,
                ne.min(moe::MAX_K),
                moe::MAX_EXPERTS
            )));
        }
        self.flush()?;
        self.settle_split_norm()?;
        self.ensure(route, n, 2 * p.k)?;
        if n == 0 {
            return Ok(());
        }
        let gating = match p.gating {
            Gating::Softmax => moe::Gating::Softmax,
            Gating::Sigmoid => moe::Gating::Sigmoid,
        };
        let scale = if p.scale == 0.0 { 1.0 } else { p.scale };
        self.launch(
            moe::route_name(gating),
            moe::route_launch(n),
            &args(
                &moe::RouteArgs {
                    logits: logits.ptr,
                    route: route.ptr,
                    n: n as u32,
                    n_expert: ne as u32,
                    k: p.k as u32,
                    norm: p.norm as u32,
                    scale,
                }
                .values(),
            ),
        )
    }

    /// The tiles of `route` for `tile_tokens` tokens per tile: made by the plan kernel once
    /// per route and step.
    fn moe_plan(
        &self,
        route: &CudaTensor,
        n_expert: usize,
        tile_tokens: usize,
    ) -> Result<u64, CudaError> {
        if let Some((r, t, tiles)) = *lock(&self.fusion.moe_plan) {
            if r == route.ptr && t == tile_tokens {
                return Ok(tiles);
            }
        }
        let k = route.cols / 2;
        let n_slots = route.rows * k;
        let max = moe::max_tiles(n_slots, n_expert, tile_tokens);
        let tiles = self.scratch(max * moe::tile_words(tile_tokens) * 4)?;
        self.launch(
            moe::PLAN,
            moe::plan_launch(),
            &args(
                &moe::PlanArgs {
                    route: route.ptr,
                    tiles,
                    n_slots: n_slots as u32,
                    k: k as u32,
                    n_expert: n_expert as u32,
                    tile_tokens: tile_tokens as u32,
                    max_tiles: max as u32,
                }
                .values(),
            ),
        )?;
        *lock(&self.fusion.moe_plan) = Some((route.ptr, tile_tokens, tiles));
        Ok(tiles)
    }

    /// `out[t*k + i] = W[id(t, i)] x[t or t*k + i]`: every selected expert of the step in
    /// one grouped GEMV launch; with `pair`, a second expert array of the same shape into
    /// its own output in the same launch (gate and up).
    pub(super) fn op_matmul_id(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
        pair: Option<(&CudaWeight, &mut CudaTensor)>,
    ) -> Result<(), CudaError> {
        let e = ExpertArray::of(w)?;
        let ExpertArray {
            ptr,
            ty,
            n_expert,
            rows,
            cols,
            row_bytes,
        } = e;
        let (n, k) = (route.rows, route.cols / 2);
        if x.cols != cols {
            return Err(CudaError::BadLength {
                what: "expert matmul input row",
                got: x.cols,
                want: cols,
            });
        }
        let x_div = if x.rows == n {
            k
        } else if x.rows == n * k {
            1
        } else {
            return Err(CudaError::BadLength {
                what: "expert matmul input rows (one per token or per slot)",
                got: x.rows,
                want: n,
            });
        };
        let (w2, mut pair_out) = match pair {
            None => (ptr, None),
            Some((w2, o2)) => match ExpertArray::of(w2) {
                Ok(e2) if e2.shape() == e.shape() => (e2.ptr, Some(o2)),
                _ => {
                    return Err(CudaError::Init(
                        "paired expert matmul of arrays of different shapes".into(),
                    ))
                }
            },
        };
        self.flush()?;
        self.settle_split_norm()?;
        self.ensure(out, n * k, rows)?;
        if let Some(o2) = pair_out.as_deref_mut() {
            self.ensure(o2, n * k, rows)?;
        }
        if n == 0 {
            return Ok(());
        }
        let n_slots = n * k;
        let y2 = pair_out.as_ref().map_or(out.ptr, |o| o.ptr);
        // Enough tokens an expert: the grouped tensor-core GEMM on f16 rows of `x`, over
        // the plan's 128-slot tiles; else the grouped GEMV on q8_1 tiles.
        let grouped = gemm::grouped::name(ty).filter(|_| {
            gemm::grouped::preferred(n_slots, n_expert, self.opts.matmul.moe_gemm_min_per_expert)
        });
        if let Some(name) = grouped {
            let h = self.gemm_f16_rows(x)?;
            let t = gemm::grouped::TILE_TOKENS;
            let tiles = self.moe_plan(route, n_expert, t)?;
            self.launch(
                name,
                gemm::grouped::launch(
                    rows,
                    moe::max_tiles(n_slots, n_expert, t),
                    pair_out.is_some(),
                ),
                &args(
                    &gemm::grouped::GroupedArgs {
                        w: ptr,
                        x: h,
                        y: out.ptr,
                        tiles,
                        nrows: rows as u32,
                        ntiles: cols.div_ceil(TILE) as u32,
                        row_bytes: row_bytes as u32,
                        expert_bytes: (rows * row_bytes) as u32,
                        x_div: x_div as u32,
                        w2,
                        y2,
                    }
                    .values(),
                ),
            )?;
        } else {
            self.op_gemv_id(e, w2, x, route, [out.ptr, y2], pair_out.is_some(), x_div)?;
        }
        // The output must not stand for a cached input.
        let overlaps = |c: &CudaTensor| {
            out.ptr < c.ptr + (c.cap * 4) as u64 && c.ptr < out.ptr + (out.cap * 4) as u64
        };
        let overlaps2 = |c: &CudaTensor| {
            pair_out.as_ref().is_some_and(|o| {
                o.ptr < c.ptr + (c.cap * 4) as u64 && c.ptr < o.ptr + (o.cap * 4) as u64
            })
        };
        if lock(&self.fusion.quantized).is_some_and(|c| overlaps(&c.x) || overlaps2(&c.x)) {
            *lock(&self.fusion.quantized) = None;
        }
        if lock(&self.fusion.gemm_quantized).is_some_and(|c| overlaps(&c.x) || overlaps2(&c.x)) {
            *lock(&self.fusion.gemm_quantized) = None;
        }
        Ok(())
    }

    /// The grouped GEMV of [`Cuda::op_matmul_id`]: `e` into `y[0]`, and with `pair` the
    /// array at `w2` (of `e`'s shape) into `y[1]`.
    #[allow(clippy::too_many_arguments)]
    fn op_gemv_id(
        &self,
        e: ExpertArray,
        w2: u64,
        x: &CudaTensor,
        route: &CudaTensor,
        [y, y2]: [u64; 2],
        pair: bool,
        x_div: usize,
    ) -> Result<(), CudaError> {
        let ExpertArray {
            ptr,
            ty,
            n_expert,
            rows,
            cols,
            row_bytes,
        } = e;
        let (n, k) = (route.rows, route.cols / 2);
        let cached = *lock(&self.fusion.quantized);
        let q = match cached {
            Some(c) if c.x == *x && c.rms.is_none() => c.q,
            _ => {
                let q = self.scratch(act::row_bytes(cols)? * x.rows)?;
                self.quantize_q8_1(x.ptr, q, cols, x.rows)?;
                *lock(&self.fusion.quantized) = Some(Quantized {
                    x: *x,
                    q,
                    rms: None,
                });
                q
            }
        };
        let t = moe::tile_tokens(n * k, n_expert);
        // One token per tile reads the route itself: no plan.
        let tiles = if t == 1 {
            route.ptr
        } else {
            self.moe_plan(route, n_expert, t)?
        };
        let max = moe::max_tiles(n * k, n_expert, t);
        let ntiles = cols.div_ceil(TILE);
        let lanes = match self.opts.matmul.moe_gemv_lanes {
            Some(l) => l.max(moe::row_lanes(ntiles, t)),
            None => moe::row_lanes(ntiles, t),
        };
        let name = moe::gemv_id(ty, t, lanes)?;
        self.launch(
            &name,
            moe::gemv_id_launch(rows, max, t, pair, lanes),
            &args(
                &moe::GemvIdArgs {
                    w: ptr,
                    x: q,
                    y,
                    tiles,
                    nrows: rows as u32,
                    ntiles: ntiles as u32,
                    row_bytes: row_bytes as u32,
                    expert_bytes: (rows * row_bytes) as u32,
                    x_div: x_div as u32,
                    k: k as u32,
                    w2,
                    y2,
                }
                .values(),
            ),
        )
    }

    /// `out[t] = sum_i weight(t, i) * y[t*k + i]`.
    pub(super) fn op_moe_combine(
        &self,
        y: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let (n, k) = (route.rows, route.cols / 2);
        if y.rows != n * k {
            return Err(CudaError::BadLength {
                what: "expert outputs (one row per slot)",
                got: y.rows,
                want: n * k,
            });
        }
        self.ensure(out, n, y.cols)?;
        if n == 0 || y.cols == 0 {
            return Ok(());
        }
        let total = n * y.cols;
        self.launch(
            moe::COMBINE,
            moe::combine_launch(total),
            &args(
                &moe::CombineArgs {
                    y: y.ptr,
                    route: route.ptr,
                    out: out.ptr,
                    cols: y.cols as u32,
                    k: k as u32,
                    n: total as u32,
                }
                .values(),
            ),
        )
    }
}

impl Cuda {
    /// The fused router (`moe_fused::router_kernel`) for one token: `Ok(false)`, with
    /// nothing launched, where it does not apply (more tokens, a router that is not an f32
    /// matrix, a shape the kernel does not take, `fuse.moe` off); the caller then runs the
    /// router matmul and `op_moe_route`. When `x` is the output of a split residual norm
    /// not written yet (the decode step's FFN norm: `gemv::Fuse`), the kernel normalises
    /// the row itself, writes it and its q8_1 tiles (cached for the expert GEMV, as
    /// `settle_split_norm` would), so the norm, the matmul and the routing are one launch.
    pub(super) fn op_moe_router(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        p: &MoeRouting,
        route: &mut CudaTensor,
    ) -> Result<bool, CudaError> {
        let CudaWeight::Dense {
            ptr,
            rows: ne,
            cols,
        } = *w
        else {
            return Ok(false);
        };
        if !self.opts.fuse.moe
            || x.rows != 1
            || x.cols != cols
            || !moe_fused::router_fits(ne, cols, p.k, None)
        {
            return Ok(false);
        }
        self.flush()?;
        let cached = *lock(&self.fusion.quantized);
        let split = match cached {
            Some(Quantized { rms: Some(n), .. })
                if n.out_pending
                    && n.out.ptr == x.ptr
                    && n.res.rows == 1
                    && n.res.cols == cols
                    && self.opts.fuse.quantize
                    && moe_fused::router_fits(ne, cols, p.k, Some(n.nparts))
                    && self.can_norm_quantize(
                        &n.res,
                        &CudaWeight::Vector {
                            ptr: n.g,
                            len: cols,
                        },
                        &n.out,
                    ) =>
            {
                Some(n)
            }
            _ => None,
        };
        if split.is_none() {
            self.settle_split_norm()?;
        }
        self.ensure(route, 1, 2 * p.k)?;
        let logits = self.scratch(ne * 4)?;
        let counter = self.moe_counter()?;
        let (normed, xp, g, partials, nparts, eps, out, q) = match split {
            Some(n) => {
                *lock(&self.fusion.gemm_quantized) = None;
                let q = self.scratch(act::row_bytes(cols)?)?;
                (1, n.res.ptr, n.g, n.partials, n.nparts, n.eps, n.out.ptr, q)
            }
            // A plain row: `g`, `partials`, `out` and `q` are neither read nor written.
            None => (0, x.ptr, x.ptr, x.ptr, 0, 0.0, x.ptr, x.ptr),
        };
        let gating = match p.gating {
            Gating::Softmax => moe::Gating::Softmax,
            Gating::Sigmoid => moe::Gating::Sigmoid,
        };
        self.launch(
            moe_fused::router_name(gating),
            moe_fused::router_launch(ne, cols),
            &args(
                &moe_fused::RouterArgs {
                    w: ptr,
                    x: xp,
                    g,
                    partials,
                    out,
                    q,
                    logits,
                    route: route.ptr,
                    counter,
                    nparts: nparts as u32,
                    cols: cols as u32,
                    ntiles: cols.div_ceil(TILE) as u32,
                    n_expert: ne as u32,
                    k: p.k as u32,
                    norm: p.norm as u32,
                    normed,
                    eps,
                    scale: if p.scale == 0.0 { 1.0 } else { p.scale },
                }
                .values(),
            ),
        )?;
        if let Some(n) = split {
            *lock(&self.fusion.quantized) = Some(Quantized {
                x: n.out,
                q,
                rms: None,
            });
        }
        Ok(true)
    }

    /// The fused router's counter: one u32, zero between launches (the last block resets
    /// it), allocated once (graphs hold the address).
    fn moe_counter(&self) -> Result<u64, CudaError> {
        let mut c = lock(&self.held.moe_counter);
        if c.is_none() {
            *c = Some(self.gpu.zeros::<u32>(4)?);
        }
        Ok(c.as_ref().map_or(0, |c| self.gpu.ptr(c)))
    }

    /// `x += combine(y, route)`, `out = rms_norm(x) * w` and its q8_1 tiles (cached for
    /// the next layer's Q|K|V GEMV) in one kernel (`moe_fused::combine_norm_kernel`) for
    /// one token: `Ok(false)`, with nothing launched, where it does not apply; the caller
    /// then runs the combine, the add and the norm.
    pub(super) fn op_moe_combine_add_norm(
        &self,
        y: &CudaTensor,
        route: &CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<bool, CudaError> {
        let (n, k) = (route.rows, route.cols / 2);
        let apart = |a: &CudaTensor, b: &CudaTensor| {
            a.ptr + (a.cap * 4) as u64 <= b.ptr || b.ptr + (b.cap * 4) as u64 <= a.ptr
        };
        if !(self.opts.fuse.moe && self.opts.fuse.quantize)
            || n != 1
            || k == 0
            || x.rows != n
            || y.rows != n * k
            || y.cols != x.cols
        {
            return Ok(false);
        }
        self.ensure(out, x.rows, x.cols)?;
        if !self.can_norm_quantize(x, w, out) || !apart(out, y) {
            return Ok(false);
        }
        let (wp, len) = self.vector(w, moe_fused::COMBINE_NORM)?;
        self.flush()?;
        self.forget_quantized()?;
        let q = self.scratch(act::row_bytes(len)? * n)?;
        self.launch(
            moe_fused::COMBINE_NORM,
            moe_fused::combine_norm_launch(n, len),
            &args(
                &moe_fused::CombineNormArgs {
                    x: x.ptr,
                    y: y.ptr,
                    route: route.ptr,
                    w: wp,
                    out: out.ptr,
                    q,
                    n: len as u32,
                    ntiles: len.div_ceil(TILE) as u32,
                    k: k as u32,
                    eps,
                }
                .values(),
            ),
        )?;
        *lock(&self.fusion.quantized) = Some(Quantized {
            x: *out,
            q,
            rms: None,
        });
        Ok(true)
    }
}

impl Cuda {
    /// A scratch tensor of this step holding `data` (`rows x cols`): inputs of the GPU
    /// checks (`smelt-kernels/examples/gpu_ops/moe.rs`, `gpu_ops -o moe`).
    pub fn upload(
        &self,
        data: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<CudaTensor, EngineError> {
        if data.len() != rows * cols {
            return Err(CudaError::BadLength {
                what: "uploaded tensor",
                got: data.len(),
                want: rows * cols,
            }
            .into());
        }
        let t = Backend::alloc(self, rows, cols);
        self.take_error()?;
        self.run(|| {
            self.gpu.synchronize()?;
            if !data.is_empty() {
                // SAFETY: `t` is `rows * cols` floats of device scratch; a synchronous copy.
                unsafe { smelt_cuda::cudarc::driver::result::memcpy_htod_sync(t.ptr, data) }?;
            }
            Ok(())
        });
        self.take_error()?;
        Ok(t)
    }
}

/// An expert array's fields ([`CudaWeight::Experts`]), taken once by the op that checks the
/// weight and passed to the launch it picks.
#[derive(Clone, Copy)]
struct ExpertArray {
    ptr: u64,
    ty: GgmlType,
    n_expert: usize,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl ExpertArray {
    fn of(w: &CudaWeight) -> Result<ExpertArray, CudaError> {
        match *w {
            CudaWeight::Experts {
                ptr,
                ty,
                n_expert,
                rows,
                cols,
                row_bytes,
            } => Ok(ExpertArray {
                ptr,
                ty,
                n_expert,
                rows,
                cols,
                row_bytes,
            }),
            _ => Err(CudaError::Init(
                "matmul_id of a weight that is not an expert array".into(),
            )),
        }
    }

    /// Everything but the address.
    fn shape(&self) -> (GgmlType, usize, usize, usize, usize) {
        (self.ty, self.n_expert, self.rows, self.cols, self.row_bytes)
    }
}
