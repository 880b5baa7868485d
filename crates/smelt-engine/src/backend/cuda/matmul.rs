//! The backend's matmul: the tensor-core GEMM for many tokens (`smelt_kernels::gemm`, on
//! its own activation tiles), the GEMV for few, and the single-token GEMV's fusions with
//! its neighbours at decode (the members of a matmul group that [`super::fusion`] runs as
//! one GEMV, the split residual norm around it, rope and KV append in the Q|K|V GEMV's
//! epilogue); at 8-64 tokens the same members as one narrow GEMM launch whose split reduce
//! writes each member apart ([`Cuda::matmul_members`]).

use smelt_cuda::CudaError;
use smelt_gguf::GgmlType;
use smelt_kernels::{act, catalog, gemm, gemv, TILE};

use super::matmul_choice::{choose, Activations, Choice, Family};
use super::ops::{args, u32_of};
use super::{
    lock, Cuda, CudaKv, CudaTensor, CudaWeight, PendingGemv, Quantized, SplitNorm, StepPtrs,
};
use crate::backend::{Glu, RopeParams, RopeStyle};

impl Cuda {
    /// `out = W x`: activations quantized to q8_1 tiles, then the GEMV over at most
    /// [`gemv::MAX_TOKENS`] tokens per launch. With `continues` (the planner's word,
    /// [`super::fusion::runs`], that `W` continues the previous member of its group), a
    /// single-token GEMV joins the deferred one of that member.
    pub(super) fn matmul_inner(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
        continues: bool,
    ) -> Result<(), CudaError> {
        let CudaWeight::Matrix {
            ptr: wp,
            ty,
            rows,
            cols,
            row_bytes,
        } = *w
        else {
            return Err(CudaError::Init(
                "matmul of a weight that is not a matrix".into(),
            ));
        };
        if x.cols != cols {
            return Err(CudaError::BadLength {
                what: "matmul input row",
                got: x.cols,
                want: cols,
            });
        }
        let n = x.rows;
        self.ensure(out, n, rows)?;
        if n == 0 {
            return Ok(());
        }
        // One token of a run the planner fused: join the deferred GEMV of the previous
        // member (the checks are the planner's promises: when one fails, this member runs
        // alone, unfused but correct).
        let joined = continues && {
            let mut pending = lock(&self.fusion.pending_gemv);
            match pending.as_mut() {
                Some(p)
                    if n == 1
                        && p.x == *x
                        && p.ty == ty
                        && p.cols == cols
                        && p.row_bytes == row_bytes
                        && p.w + (p.rows * p.row_bytes) as u64 == wp
                        && p.out + (p.rows * 4) as u64 == out.ptr =>
                {
                    p.rows += rows;
                    true
                }
                _ => false,
            }
        };
        if joined {
            return Ok(());
        }
        self.flush_gemv()?;
        // Many tokens: the tensor-core GEMM the tuning rules pick (`matmul_choice`), on its
        // own activations (a split norm's q8_1 tiles stand for an output not written yet:
        // those stay on the GEMV).
        let split_norm = || matches!(*lock(&self.fusion.quantized), Some(c) if c.x.ptr == x.ptr && c.rms.is_some());
        if let Choice::Gemm { family, name } =
            choose(&self.opts.matmul, ty, rows, cols, n, split_norm)
        {
            let q = match family.activations(ty) {
                Activations::F16Rows => self.gemm_f16_rows(x)?,
                Activations::Q8_1Tiles => self.q8_1_tiles(x)?,
                Activations::GemmTiles => self.gemm_tiles(x)?,
            };
            let ntiles = cols.div_ceil(TILE);
            let mut splits = family.splits(
                ty,
                rows,
                ntiles,
                n,
                self.gpu.sm_count(),
                self.opts.batch_invariant,
            );
            if let (Family::Narrow(..), Some(cap)) = (family, self.opts.matmul.narrow_max_splits) {
                splits = splits.min(cap);
            }
            let mut a = gemm::Args {
                w: wp,
                x: q,
                y: out.ptr,
                nrows: rows as u32,
                ntok: n as u32,
                ntiles: ntiles as u32,
                row_bytes: row_bytes as u32,
                splits: splits as u32,
                fixup: None,
            };
            // Split K: the slices' sums go to a workspace, summed in split order by the
            // last block of each tile (`gemm::fixup`) or else by a reduce launch.
            let l = family.launch(ty, &a);
            if a.workspace_floats() > 0 {
                a.y = self.scratch(a.workspace_floats() * 4)?;
                if let Some(counters) = self.gemm_counters()? {
                    let capacity = gemm::fixup::counter_slots(self.gpu.sm_count());
                    a = a.with_fixup(l.grid, out.ptr, counters, capacity);
                }
            }
            self.launch(name, l, &args(&a.values()))?;
            if let Some((vals, l)) = a.reduce(out.ptr) {
                self.launch(gemm::REDUCE, l, &args(&vals.values()))?;
            }
            self.forget_inputs_in(out);
            return Ok(());
        }
        let act_row = act::row_bytes(cols)?;
        let cached = *lock(&self.fusion.quantized);
        let (q, rms) = match cached {
            Some(c) if c.x.ptr == x.ptr && c.x.rows == x.rows && c.x.cols == x.cols => (c.q, c.rms),
            _ => {
                self.forget_quantized()?;
                let q = self.scratch(act_row * n)?;
                self.quantize_q8_1(x.ptr, q, cols, n)?;
                (q, None)
            }
        };
        // The output is written below: it must not be the cached input.
        let overlaps =
            out.ptr < x.ptr + (x.cap * 4) as u64 && x.ptr < out.ptr + (out.cap * 4) as u64;
        // This GEMV writes a split norm's output; later ones only read the tiles.
        let later = rms.map(|r| SplitNorm {
            out_pending: false,
            ..r
        });
        *lock(&self.fusion.quantized) = if overlaps {
            None
        } else {
            Some(Quantized {
                x: *x,
                q,
                rms: later,
            })
        };
        if n == 1 && !overlaps {
            *lock(&self.fusion.pending_gemv) = Some(PendingGemv {
                w: wp,
                ty,
                rows,
                cols,
                row_bytes,
                x: *x,
                q,
                out: out.ptr,
                rms,
            });
            return Ok(());
        }
        let mut t0 = 0;
        while t0 < n {
            let t = (n - t0).min(gemv::MAX_TOKENS);
            let xq = q + (t0 * act_row) as u64;
            let y = out.ptr + (t0 * rows * 4) as u64;
            self.launch_gemv(wp, ty, rows, cols, row_bytes, xq, y, t, rms.as_ref(), None)?;
            t0 += t;
        }
        Ok(())
    }

    /// `y[t][r] = W[r] . xq[t]` for `t < ntok` (at most [`gemv::MAX_TOKENS`]); with `rms`,
    /// `xq` are a split norm's unscaled tiles (one token) and `y` is scaled by `1 / rms`;
    /// with `rope`, the rows are one token's Q|K|V and `rope` the rope + KV-append
    /// parameters (`Cuda::rope_kv_in_gemv` makes them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_gemv(
        &self,
        w: u64,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        xq: u64,
        y: u64,
        ntok: usize,
        rms: Option<&SplitNorm>,
        rope: Option<&gemv::RopeKvArgs>,
    ) -> Result<(), CudaError> {
        let mut cfg = gemv::Config::new(ntok);
        if ntok == 1 && rows <= self.opts.matmul.gemv_rows.0 {
            cfg.rows_per_warp = 1;
        } else if ntok == 1 && rows >= self.opts.matmul.gemv_rows.1 {
            cfg.rows_per_warp = 4;
        }
        if let Some(r) = rms {
            if ntok != 1 || r.res.cols != cols {
                return Err(CudaError::Init(format!(
                    "split norm tiles of {} values for a GEMV of {ntok} tokens x {cols}",
                    r.res.cols
                )));
            }
            // Four rows a warp where the plain GEMV would take them; the split norm's
            // consumer has no one-row form.
            let rows_per_warp = if cfg.rows_per_warp == 4 { 4 } else { 2 };
            cfg = gemv::Config::rms_input().with_rows(rows_per_warp);
        }
        if rope.is_some() {
            if ntok != 1 {
                return Err(CudaError::Init(format!(
                    "rope + KV append in a GEMV of {ntok} tokens"
                )));
            }
            cfg = gemv::Config {
                rows_per_warp: 2,
                ..cfg
            }
            .with_rope_kv();
        }
        let name = catalog::gemv_config_name(ty, cfg)?;
        let nrows = rows as u32;
        let l = smelt_kernels::ops::Launch::new(
            (nrows.div_ceil(cfg.rows_per_cta()), 1, 1),
            cfg.block(),
        );
        // Parameters in the order `gemv::kernel` documents; `w` holds `rows` rows of
        // `row_bytes`, `xq` `ntok` rows of q8_1 tiles, `y` `ntok x rows` floats.
        let mut values = gemv::GemvArgs {
            w,
            x: xq,
            y,
            nrows,
            ntiles: cols.div_ceil(TILE) as u32,
            row_bytes: row_bytes as u32,
            never: 0,
        }
        .values();
        if let Some(r) = rms {
            values.extend(
                gemv::RmsInputArgs {
                    partials: r.partials,
                    nparts: r.nparts as u32,
                    n: cols as u32,
                    eps: r.eps,
                    res: r.res.ptr,
                    g: r.g,
                    out: if r.out_pending { r.out.ptr } else { 0 },
                }
                .values(),
            );
        }
        if let Some(r) = rope {
            values.extend(r.values());
        }
        let args = args(&values);
        if self.skipped(&format!("gemv{rows}x{cols}")) {
            return Ok(());
        }
        self.launch(&name, l, &args)
    }

    /// The rope of a decode row's `q` and `k` and the KV write of `k` and `v`, done by the
    /// deferred GEMV whose output is that row's `q | k | v` (one `matmul_group` run: its
    /// members' outputs are views of the GEMV's, in order), in its epilogue
    /// (`gemv::Config::rope_kv`). False when the deferred GEMV is not that one, or the rope
    /// not one it does (nothing launched then).
    pub(super) fn rope_kv_in_gemv(
        &self,
        (q, k, v): (&CudaTensor, &CudaTensor, &CudaTensor),
        (hd, p, freq_factors): (usize, &RopeParams, u64),
        kv: &CudaKv,
        layer: usize,
        s: &StepPtrs,
    ) -> Result<bool, CudaError> {
        let Some(g) = *lock(&self.fusion.pending_gemv) else {
            return Ok(false);
        };
        let at = |t: &CudaTensor, floats: usize| t.ptr == g.out + (floats * 4) as u64;
        let fits = self.opts.fuse.gemv_rope_kv
            && p.style == RopeStyle::Normal
            && s.n_seqs == 1
            && s.max_tokens == 1
            && q.rows == 1
            && lock(&self.fusion.pending_add).is_none()
            && g.rows == q.cols + k.cols + v.cols
            && at(q, 0)
            && at(k, q.cols)
            && at(v, q.cols + k.cols);
        if !fits {
            return Ok(false);
        }
        *lock(&self.fusion.pending_gemv) = None;
        let (kc, vc) = self.kv_layer(kv, layer, "rope_kv")?;
        let rope = smelt_kernels::gemv::RopeKvArgs {
            pos: s.positions,
            freq_factors,
            k_cache: kc,
            v_cache: vc,
            seqs: s.descs,
            block_tables: s.block_tables,
            q_rows: u32_of(q.cols, "rope_kv Q rows")?,
            kv_dim: u32_of(kv.kv_dim, "rope_kv kv_dim")?,
            head_dim: u32_of(hd, "rope_kv head_dim")?,
            block_size: u32_of(kv.block_size, "rope_kv block size")?,
            theta_scale: smelt_kernels::ops::rope::theta_scale(p.freq_base, hd),
            freq_scale: p.freq_scale,
        };
        self.launch_pending_gemv(&g, Some(&rope))?;
        Ok(true)
    }

    /// `rms_norm(x += y) -> out` for a decode row whose `y` is the output of the deferred
    /// GEMV: that GEMV runs as the producer half of a split norm (`gemv::Fuse`) and the
    /// tiles it writes wait in the cache for the next matmul. False when the shapes do not
    /// allow it (nothing launched then).
    pub(super) fn split_norm(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &CudaTensor,
    ) -> Result<bool, CudaError> {
        let CudaWeight::Vector { ptr: g, len: n } = *w else {
            return Ok(false);
        };
        let pending_add = *lock(&self.fusion.pending_add);
        let pending_gemv = *lock(&self.fusion.pending_gemv);
        let (Some((px, y)), Some(p)) = (pending_add, pending_gemv) else {
            return Ok(false);
        };
        let apart =
            out.ptr + (out.cap * 4) as u64 <= x.ptr || x.ptr + (x.cap * 4) as u64 <= out.ptr;
        let nparts = n / gemv::NORM_ROWS_PER_CTA as usize;
        let fits = self.opts.fuse.split_norm
            && px.ptr == x.ptr
            && x.rows == 1
            && x.cols == n
            && y.rows == 1
            && y.cols == n
            && p.out == y.ptr
            && p.rows == n
            && p.rms.is_none()
            && n.is_multiple_of(gemv::NORM_ROWS_PER_CTA as usize)
            && nparts <= gemv::MAX_PARTS as usize
            && out.rows == 1
            && out.cols == n
            && apart;
        if !fits {
            return Ok(false);
        }
        *lock(&self.fusion.pending_add) = None;
        *lock(&self.fusion.pending_gemv) = None;
        let q = self.scratch(act::row_bytes(n)?)?;
        let partials = self.scratch(nparts * 4)?;
        let cfg = gemv::Config::residual_norm();
        let l = smelt_kernels::ops::Launch::new(
            ((n as u32).div_ceil(cfg.rows_per_cta()), 1, 1),
            cfg.block(),
        );
        // Parameters in the order `gemv::kernel` documents for `Fuse::ResidualNorm`.
        if !self.skipped(&format!("gemv{n}x{}", p.cols)) {
            self.launch(
                &catalog::gemv_config_name(p.ty, cfg)?,
                l,
                &args(
                    &[
                        gemv::GemvArgs {
                            w: p.w,
                            x: p.q,
                            y: p.out,
                            nrows: n as u32,
                            ntiles: p.cols.div_ceil(TILE) as u32,
                            row_bytes: p.row_bytes as u32,
                            never: 0,
                        }
                        .values(),
                        gemv::ResNormArgs {
                            res: x.ptr,
                            g,
                            q,
                            partials,
                        }
                        .values(),
                    ]
                    .concat(),
                ),
            )?;
        }
        *lock(&self.fusion.quantized) = Some(Quantized {
            x: *out,
            q,
            rms: Some(SplitNorm {
                partials,
                nparts,
                eps,
                res: *x,
                g,
                out: *out,
                out_pending: true,
            }),
        });
        Ok(true)
    }

    /// The q8_1 tiles of `x` (`act`) for a GEMM that reads them: the cached ones when they
    /// are `x`'s (and no split norm's), else quantized now and cached, as the GEMV's.
    fn q8_1_tiles(&self, x: &CudaTensor) -> Result<u64, CudaError> {
        if let Some(c) = *lock(&self.fusion.quantized) {
            if c.x == *x && c.rms.is_none() {
                return Ok(c.q);
            }
        }
        self.forget_quantized()?;
        let q = self.scratch(act::row_bytes(x.cols)? * x.rows)?;
        self.quantize_q8_1(x.ptr, q, x.cols, x.rows)?;
        *lock(&self.fusion.quantized) = Some(Quantized {
            x: *x,
            q,
            rms: None,
        });
        Ok(q)
    }

    /// The GEMM's activation tiles of `x` (`gemm::act`): quantized once for all the matmuls
    /// of the same activations (Q, K and V; gate and up), until another op runs.
    fn gemm_tiles(&self, x: &CudaTensor) -> Result<u64, CudaError> {
        self.gemm_input(
            x,
            |c| &mut c.tiles,
            |this, q| {
                this.launch(
                    gemm::act::QUANTIZE,
                    gemm::act::quantize_launch(x.cols, x.rows),
                    &args(
                        &gemm::act::QuantizeArgs {
                            x: x.ptr,
                            q,
                            k: x.cols as u32,
                            ntiles: x.cols.div_ceil(TILE) as u32,
                        }
                        .values(),
                    ),
                )
            },
            gemm::act::row_bytes(x.cols)?,
        )
    }

    /// `outs[i] = ws[i] x` for a run of a group's members that continue one another in
    /// weight memory ([`super::fusion::gemm_runs`]) as one narrow GEMM launch over all
    /// their rows, and `gemm::members`' reduce writing each member's rows to its own
    /// output. `Ok(false)` (nothing launched) where the GEMM picked for all their rows is
    /// not the narrow one or does not split K (the caller then multiplies member by
    /// member): gate|up at 64 tokens fill the GPU unsplit, and forcing two splits to get
    /// the member reduce cost more than the launch it saved (Llama-3-8B Q4_K, 64
    /// sequences: -4.4%, H100 2026-11-27 22:05 UTC; at 8-32 sequences, where every grouped
    /// launch splits anyway, +5.7-9.0%).
    pub(super) fn matmul_members(
        &self,
        ws: &[&CudaWeight],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<bool, CudaError> {
        if ws.len() != outs.len() {
            return Ok(false);
        }
        let Some((a, rows)) = self.grouped_gemm(ws, x)? else {
            return Ok(false);
        };
        for (out, &r) in outs.iter_mut().zip(&rows) {
            self.ensure(out, x.rows, r)?;
        }
        let members: Vec<(u64, u32)> = outs
            .iter()
            .zip(&rows)
            .map(|(o, &r)| (o.ptr, r as u32))
            .collect();
        let r = gemm::members::ReduceArgs::for_gemm(&a, &members).ok_or_else(|| {
            CudaError::Init("a grouped GEMM launch without its member reduce".into())
        })?;
        self.launch(gemm::members::REDUCE, r.launch(), &args(&r.values()))?;
        for out in outs.iter() {
            self.forget_inputs_in(out);
        }
        Ok(true)
    }

    /// `gate = act(ws[0] x) * (ws[1] x)` as one narrow GEMM launch over gate's and up's
    /// rows and one split reduce that applies the GLU and writes the down projection's f16
    /// rows too (`gemm::members::reduce_glu_kernel`): [`Cuda::matmul_members`] and the GLU
    /// in two launches instead of three. `Ok(false)` (nothing launched) where that path
    /// does not apply: members that do not run as one split launch, rows not whole
    /// 256-value tiles, or a step whose down projection does not read f16 rows.
    pub(super) fn matmul_glu_members(
        &self,
        ws: [&CudaWeight; 2],
        x: &CudaTensor,
        act: Glu,
        gate: &mut CudaTensor,
    ) -> Result<bool, CudaError> {
        let rows = match (ws[0].member(), ws[1].member()) {
            (Some(g), Some(u)) if g.rows == u.rows && g.rows % TILE == 0 => g.rows,
            _ => return Ok(false),
        };
        if self.fused_sink(x.rows) != smelt_kernels::fused::Sink::F16Rows {
            return Ok(false);
        }
        let Some((a, _)) = self.grouped_gemm(&ws, x)? else {
            return Ok(false);
        };
        self.ensure(gate, x.rows, rows)?;
        let h = self.scratch(gemm::f16::act_row_bytes(rows) * x.rows)?;
        let act = super::ops::kernel_glu(act);
        let r = gemm::members::GluReduceArgs {
            part: a.y,
            gate: gate.ptr,
            h,
            rows: rows as u32,
            ntok: a.ntok,
            splits: a.split_count(),
        };
        self.launch(
            gemm::members::reduce_glu_name(act),
            r.launch(),
            &args(&r.values()),
        )?;
        self.forget_inputs_in(gate);
        self.keep_fused_output(gate, h, smelt_kernels::fused::Sink::F16Rows);
        Ok(true)
    }

    /// The narrow GEMM launch of a group's members that follow one another in weight
    /// memory (one type, one width), over all their rows into a split workspace (`a.y`):
    /// the launch's arguments and each member's rows, or `None` (nothing launched) where
    /// the GEMM picked for all their rows is not the narrow one or does not split K.
    fn grouped_gemm(
        &self,
        ws: &[&CudaWeight],
        x: &CudaTensor,
    ) -> Result<Option<(gemm::Args, Vec<usize>)>, CudaError> {
        let Some(first) = ws.first().and_then(|w| w.member()) else {
            return Ok(None);
        };
        let mut rows = Vec::with_capacity(ws.len());
        for w in ws {
            match w.member() {
                Some(m)
                    if m.ty == first.ty
                        && m.cols == first.cols
                        && m.row_bytes == first.row_bytes =>
                {
                    rows.push(m.rows)
                }
                _ => return Ok(None),
            }
        }
        let (ty, cols, n) = (first.ty, first.cols, x.rows);
        let total: usize = rows.iter().sum();
        let ntiles = cols.div_ceil(TILE);
        if x.cols != cols || ntiles < 2 {
            return Ok(None);
        }
        let split_norm = || matches!(*lock(&self.fusion.quantized), Some(c) if c.x.ptr == x.ptr && c.rms.is_some());
        let Choice::Gemm {
            family: family @ Family::Narrow(..),
            name,
        } = choose(&self.opts.matmul, ty, total, cols, n, split_norm)
        else {
            return Ok(None);
        };
        let mut splits = family.splits(ty, total, ntiles, n, self.gpu.sm_count(), false);
        if let Some(cap) = self.opts.matmul.narrow_max_splits {
            splits = splits.min(cap);
        }
        let mut a = gemm::Args {
            w: first.ptr,
            x: 0,
            y: 0,
            nrows: total as u32,
            ntok: n as u32,
            ntiles: ntiles as u32,
            row_bytes: first.row_bytes as u32,
            splits: splits as u32,
            fixup: None,
        };
        if a.split_count() < 2 {
            return Ok(None);
        }
        self.flush_gemv()?;
        a.x = self.gemm_f16_rows(x)?;
        a.y = self.scratch(a.workspace_floats() * 4)?;
        self.launch(name, family.launch(ty, &a), &args(&a.values()))?;
        Ok(Some((a, rows)))
    }

    /// A GEMM output must not be a cached input: forgets the cached forms of any input
    /// whose rows `out` overlaps.
    fn forget_inputs_in(&self, out: &CudaTensor) {
        let overlaps = |c: &CudaTensor| {
            out.ptr < c.ptr + (c.cap * 4) as u64 && c.ptr < out.ptr + (out.cap * 4) as u64
        };
        if lock(&self.fusion.gemm_quantized).is_some_and(|c| overlaps(&c.x)) {
            *lock(&self.fusion.gemm_quantized) = None;
        }
        if lock(&self.fusion.quantized).is_some_and(|c| overlaps(&c.x)) {
            *lock(&self.fusion.quantized) = None;
        }
    }

    /// What a norm or GLU of `n` rows writes for the matmuls after it
    /// ([`super::matmul_choice::fused_sink`]).
    pub(super) fn fused_sink(&self, n: usize) -> smelt_kernels::fused::Sink {
        super::matmul_choice::fused_sink(&self.opts.matmul, self.opts.fuse.f16_rows, n)
    }

    /// Keeps what a fused norm or GLU wrote at `q` for its output `x` (`sink`'s form) for
    /// the matmuls that read `x`: q8_1 tiles for the GEMV, f16 rows for the GEMMs
    /// ([`Cuda::gemm_f16_rows`] finds them instead of converting `x`).
    pub(super) fn keep_fused_output(
        &self,
        x: &CudaTensor,
        q: u64,
        sink: smelt_kernels::fused::Sink,
    ) {
        match sink {
            smelt_kernels::fused::Sink::Q8_1 => {
                *lock(&self.fusion.quantized) = Some(Quantized {
                    x: *x,
                    q,
                    rms: None,
                });
            }
            smelt_kernels::fused::Sink::F16Rows => {
                *lock(&self.fusion.gemm_quantized) = Some(super::GemmInput {
                    x: *x,
                    tiles: None,
                    f16: Some(q),
                });
            }
        }
    }

    /// The f16 GEMM's rows of `x` (`gemm::f16`): converted once for all the matmuls of the
    /// same activations, as [`Cuda::gemm_tiles`].
    pub(super) fn gemm_f16_rows(&self, x: &CudaTensor) -> Result<u64, CudaError> {
        self.gemm_input(
            x,
            |c| &mut c.f16,
            |this, h| this.f16_rows_into(x, h),
            gemm::f16::act_row_bytes(x.cols),
        )
    }

    /// Converts `x` into the f16 GEMM's rows at `h` (`gemm::f16::act_kernel`).
    pub(super) fn f16_rows_into(&self, x: &CudaTensor, h: u64) -> Result<(), CudaError> {
        self.launch(
            gemm::f16::ACT,
            gemm::f16::act_launch(x.cols, x.rows),
            &args(
                &gemm::f16::ActArgs {
                    x: x.ptr,
                    h,
                    k: x.cols as u32,
                    ntiles: x.cols.div_ceil(TILE) as u32,
                }
                .values(),
            ),
        )
    }

    /// The GEMM input `slot` of `x`: the cached one, else `row_bytes` a row of scratch
    /// filled by `make` and cached beside the other forms of the same `x`.
    fn gemm_input(
        &self,
        x: &CudaTensor,
        slot: impl Fn(&mut super::GemmInput) -> &mut Option<u64>,
        make: impl FnOnce(&Self, u64) -> Result<(), CudaError>,
        row_bytes: usize,
    ) -> Result<u64, CudaError> {
        let mut cached = match *lock(&self.fusion.gemm_quantized) {
            Some(c) if c.x == *x => c,
            _ => super::GemmInput {
                x: *x,
                tiles: None,
                f16: None,
            },
        };
        if let Some(q) = *slot(&mut cached) {
            return Ok(q);
        }
        let q = self.scratch(row_bytes * x.rows)?;
        make(self, q)?;
        *slot(&mut cached) = Some(q);
        *lock(&self.fusion.gemm_quantized) = Some(cached);
        Ok(q)
    }

    /// The split GEMMs' counters (`gemm::fixup`), allocated zeroed at the first split
    /// launch; None with the fix-up off (the default; `SMELT_CUDA_SPLIT_FIXUP=1` turns it on).
    fn gemm_counters(&self) -> Result<Option<u64>, CudaError> {
        if !self.opts.fuse.split_fixup {
            return Ok(None);
        }
        let mut c = lock(&self.held.gemm_counters);
        if c.is_none() {
            let n = gemm::fixup::counter_slots(self.gpu.sm_count());
            *c = Some(self.gpu.zeros::<u32>(n)?);
        }
        Ok(c.as_ref().map(|c| self.gpu.ptr(c)))
    }

    /// `q = quantize_q8_1(x)` for `n` rows of `k` floats.
    pub(super) fn quantize_q8_1(
        &self,
        x: u64,
        q: u64,
        k: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let (len, ntiles) = (k as u32, k.div_ceil(TILE) as u32);
        let l = smelt_kernels::ops::Launch::new(
            (ntiles.div_ceil(act::QUANTIZE_WARPS), n as u32, 1),
            (32, act::QUANTIZE_WARPS, 1),
        );
        // Parameters as `act::quantize_kernel` documents; `q` holds n rows of tiles.
        self.launch(
            catalog::QUANTIZE,
            l,
            &args(
                &act::QuantizeArgs {
                    x,
                    q,
                    k: len,
                    ntiles,
                }
                .values(),
            ),
        )
    }
}
