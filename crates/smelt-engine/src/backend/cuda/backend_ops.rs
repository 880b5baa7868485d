//! The [`Backend`] trait's ops on the CUDA backend: each op checks its shapes, decides
//! what it fuses with (the deferred GEMV, add or rope before it, see [`super::deferred`];
//! a matmul group's runs, see [`super::fusion`]) and launches its kernels (`ops`,
//! `matmul`, `moe`). Apart from the backend's state and memory so that the model-facing
//! surface reads as one list.

use std::sync::Arc;

use smelt_cuda::CudaError;
use smelt_gguf::Gguf;
use smelt_kernels::fused::Sink;

use super::weights::Role;
use super::{fusion, lock, Cuda, CudaKv, CudaTensor, CudaWeight};
use crate::backend::{
    AttnParams, AttnSeq, Backend, DeltaParams, DeltaState, DeltaWeights, Glu, HeadNorms,
    MoeRouting, RopeAt, RopeParams,
};
use crate::EngineError;

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvStore = CudaKv;

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        if let Some(w) = self.load_router(gguf, name)? {
            return Ok(w);
        }
        self.load(gguf, name, Role::Matmul)
    }

    fn load_embedding(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        self.load(gguf, name, Role::Embedding)
    }

    /// The group's members in one weight chunk, one after the other (weights are
    /// bump-allocated in load order: only a chunk boundary could part them), so that
    /// [`fusion::runs`] can give a run of them to one GEMV.
    fn load_weight_group(
        &self,
        gguf: &Arc<Gguf>,
        names: &[&str],
    ) -> Result<Vec<CudaWeight>, EngineError> {
        let mut total = 0;
        for n in names {
            total += self.planned_bytes(gguf, n)?;
        }
        self.weight_room(total)?;
        names.iter().map(|n| self.load_weight(gguf, n)).collect()
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        match w {
            CudaWeight::Matrix { rows, cols, .. }
            | CudaWeight::Embedding { rows, cols, .. }
            | CudaWeight::Experts { rows, cols, .. }
            | CudaWeight::Dense { rows, cols, .. } => (*rows, *cols),
            CudaWeight::Vector { len, .. } => (1, *len),
        }
    }

    fn begin_layer(&self, live: &[&CudaTensor]) {
        self.run_raw(|| self.op_begin_layer(live));
    }

    fn alloc(&self, rows: usize, cols: usize) -> CudaTensor {
        let mut ptr = 0;
        // Touches no memory: neither launches the deferred add nor forgets the cache.
        self.run_raw(|| {
            ptr = self.scratch(rows * cols * 4)?;
            Ok(())
        });
        CudaTensor {
            ptr,
            rows,
            cols,
            cap: rows * cols,
        }
    }

    fn shape(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        let CudaWeight::Embedding { rows, .. } = table else {
            return Err(EngineError::BadMetadata {
                key: "token_embd.weight".into(),
                why: "not loaded as an embedding table".into(),
            });
        };
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= *rows) {
            return Err(EngineError::BadToken {
                token,
                n_vocab: *rows,
            });
        }
        self.run(|| {
            let s = self.step_ptrs()?;
            if s.n_tokens != tokens.len() || out.rows != tokens.len() {
                return Err(CudaError::BadLength {
                    what: "embed tokens (not the step's)",
                    got: tokens.len(),
                    want: s.n_tokens,
                });
            }
            self.op_embed(table, s.tokens, out)
        });
        self.take_error()
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        if let CudaWeight::Dense { .. } = w {
            self.run_raw(|| self.op_dense(w, x, out));
            return self.take_error();
        }
        self.run_raw(|| {
            // A deferred add may read the deferred GEMV's output: that GEMV goes first.
            if lock(&self.fusion.pending_add).is_some() {
                self.flush_gemv()?;
            }
            self.flush_add()?;
            self.matmul_inner(w, x, out, false)
        });
        self.take_error()
    }

    fn matmul_glu(
        &self,
        ws: [&CudaWeight; 2],
        x: &CudaTensor,
        act: Glu,
        gate: &mut CudaTensor,
        up: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        let fused = self.opts.fuse.glu_reduce
            && self.opts.fuse.group_gemm
            && self.opts.fuse.f16_rows
            && x.rows > 1
            && ws.iter().all(|w| !matches!(w, CudaWeight::Dense { .. }))
            && matches!(fusion::gemm_runs(&ws.map(|w| w.member()), 2).as_slice(), [r] if *r == (0..2));
        if fused {
            let mut done = false;
            self.run_raw(|| {
                if lock(&self.fusion.pending_add).is_some() {
                    self.flush_gemv()?;
                }
                self.flush_add()?;
                done = self.matmul_glu_members(ws, x, act, gate)?;
                Ok(())
            });
            self.take_error()?;
            if done {
                return Ok(());
            }
        }
        self.matmul_group(&ws, x, &mut [&mut *gate, &mut *up])?;
        self.glu(gate, up, act);
        Ok(())
    }

    fn matmul_group(
        &self,
        ws: &[&CudaWeight],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), EngineError> {
        if ws.len() != outs.len() {
            return Err(EngineError::BadOptions(format!(
                "matmul_group of {} weights into {} outputs",
                ws.len(),
                outs.len()
            )));
        }
        if ws.iter().any(|w| matches!(w, CudaWeight::Dense { .. })) {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(w, x, out)?;
            }
            return Ok(());
        }
        self.run_raw(|| {
            // A deferred add may read the deferred GEMV's output: that GEMV goes first.
            if lock(&self.fusion.pending_add).is_some() {
                self.flush_gemv()?;
            }
            self.flush_add()?;
            let members: Vec<Option<fusion::Member>> = ws.iter().map(|w| w.member()).collect();
            let many = x.rows > 1 && self.opts.fuse.group_gemm;
            let runs = if many {
                fusion::gemm_runs(&members, smelt_kernels::gemm::members::MAX_MEMBERS)
            } else {
                fusion::runs(&members, x.rows)
            };
            for run in runs {
                if many
                    && run.len() > 1
                    && self.matmul_members(&ws[run.clone()], x, &mut outs[run.clone()])?
                {
                    continue;
                }
                if run.len() > 1 && !many {
                    self.place_run_outputs(&ws[run.clone()], &mut outs[run.clone()])?;
                }
                for i in run.clone() {
                    self.matmul_inner(ws[i], x, outs[i], i > run.start)?;
                }
            }
            Ok(())
        });
        self.take_error()
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) {
        self.run(|| self.op_add_bias(x, bias));
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
        self.run_raw(|| {
            self.forget_quantized()?;
            self.ensure(out, x.rows, x.cols)?;
            if self.split_norm(x, w, eps, out)? {
                return Ok(());
            }
            self.flush_gemv()?;
            let pending = lock(&self.fusion.pending_add).take();
            let fusable = pending
                .as_ref()
                .filter(|(px, y)| px.ptr == x.ptr && self.can_fuse_add_norm(x, y, w, out))
                .map(|&(_, y)| y);
            // A whole-row norm feeds matmuls: write what they read (q8_1 tiles for the GEMV,
            // f16 rows for the narrow GEMM: `fused_sink`) in the same kernel.
            if self.opts.fuse.quantize && self.can_norm_quantize(x, w, out) {
                if pending.is_some() && fusable.is_none() {
                    if let Some((px, y)) = pending {
                        self.op_add(&px, &y)?;
                    }
                }
                let sink = self.fused_sink(x.rows);
                let q = self.scratch(sink.row_bytes(x.cols)? * x.rows)?;
                self.op_norm_q8(x, fusable.as_ref(), w, eps, out, (q, sink))?;
                self.keep_fused_output(out, q, sink);
                return Ok(());
            }
            match pending {
                // The residual add just before this norm of the same rows: one pass.
                Some((px, y)) if px.ptr == x.ptr && self.can_fuse_add_norm(x, &y, w, out) => {
                    self.op_add_rms_norm(x, &y, w, eps, out)
                }
                other => {
                    if let Some((px, y)) = other {
                        self.op_add(&px, &y)?;
                    }
                    self.op_rms_norm(x, w, eps, out)
                }
            }
        });
    }

    fn rms_norm_in_place(&self, x: &mut CudaTensor, w: &CudaWeight, eps: f32) {
        self.run_raw(|| {
            // Its rows may be a deferred GEMV's output (Q|K|V), and an add may be pending.
            self.flush_gemv()?;
            self.flush_add()?;
            self.forget_quantized()?;
            // Each thread of the norm kernel reads back only the values it read itself before
            // writing them, so `out` may be `x`.
            self.op_rms_norm(x, w, eps, x)
        });
    }

    fn head_norms_in_place(
        &self,
        q: &mut CudaTensor,
        wq: &CudaWeight,
        k: &mut CudaTensor,
        wk: &CudaWeight,
        eps: f32,
    ) {
        self.run_raw(|| {
            self.flush_gemv()?;
            self.flush_add()?;
            self.forget_quantized()?;
            if !self.op_head_norms_pair(q, wq, k, wk, eps)? {
                self.op_rms_norm(q, wq, eps, q)?;
                self.op_rms_norm(k, wk, eps, k)?;
            }
            Ok(())
        });
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        self.run(|| self.op_scale(x, s));
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        // Deferred: launched by the next op, fused into it when that is `x`'s norm. A
        // deferred GEMV that writes `y` stays deferred too: with the norm, the two may run
        // as one (`split_norm`); any other op launches the GEMV, then the add.
        self.run_raw(|| {
            let keep = self.opts.fuse.split_norm
                && lock(&self.fusion.pending_add).is_none()
                && matches!(*lock(&self.fusion.pending_gemv), Some(p) if p.out == y.ptr && y.rows == 1);
            if !keep {
                self.flush()?;
            }
            self.forget_quantized()?;
            *lock(&self.fusion.pending_add) = Some((*x, *y));
            Ok(())
        });
    }

    fn glu(&self, gate: &mut CudaTensor, up: &CudaTensor, act: Glu) {
        self.run(|| {
            // The GLU's output feeds the down projection: write what it reads (q8_1 tiles or
            // f16 rows, `fused_sink`) in the same kernel (one launch per layer less).
            if self.opts.fuse.quantize && self.can_glu_quantize(gate, up) {
                let sink = self.fused_sink(gate.rows);
                let q = self.scratch(sink.row_bytes(gate.cols)? * gate.rows)?;
                self.op_glu_q8(gate, up, act, (q, sink))?;
                self.keep_fused_output(gate, q, sink);
                return Ok(());
            }
            self.op_glu(gate, up, act)
        });
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
        freq_factors: Option<&CudaWeight>,
    ) {
        self.run(|| {
            let s = self.step_ptrs()?;
            if s.n_tokens != positions.len() || x.rows != positions.len() {
                return Err(CudaError::BadLength {
                    what: "rope positions (not the step's)",
                    got: positions.len(),
                    want: s.n_tokens,
                });
            }
            let ff = freq_factors.map_or(0, |w| w.ptr());
            self.op_rope(x, s.positions, head_dim, p, ff)
        });
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
        // Every row in order (a decode step's logits row): the tensor itself, no copy, and
        // the deferred add + GEMV before it stay deferred for the norm that follows.
        if rows.iter().copied().eq(0..x.rows) {
            return *x;
        }
        let out = self.alloc(rows.len(), x.cols);
        self.run(|| {
            let row_bytes = x.cols * 4;
            // One copy per run of consecutive rows (one in all for a decode batch).
            let mut i = 0;
            while i < rows.len() {
                let mut j = i + 1;
                while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                    j += 1;
                }
                if rows[j - 1] >= x.rows {
                    return Err(CudaError::BadLength {
                        what: "gathered row",
                        got: rows[j - 1],
                        want: x.rows,
                    });
                }
                self.copy_rows(
                    out.ptr + (i * row_bytes) as u64,
                    x.ptr + (rows[i] * row_bytes) as u64,
                    (j - i) * row_bytes,
                )?;
                i = j;
            }
            Ok(())
        });
        out
    }

    fn to_host(&self, x: &CudaTensor) -> Vec<f32> {
        let mut v = Vec::new();
        self.run(|| {
            v = self.download(x)?;
            Ok(())
        });
        v
    }

    fn argmax_rows(&self, x: &CudaTensor) -> Vec<u32> {
        self.to_host(x)
            .chunks(x.cols.max(1))
            .map(crate::sampler::argmax)
            .collect()
    }

    fn kv_alloc(
        &self,
        n_layer: usize,
        n_blocks: usize,
        block_size: usize,
        kv_dim: usize,
    ) -> CudaKv {
        let mut kv = CudaKv {
            k: Vec::new(),
            v: Vec::new(),
            n_blocks,
            block_size,
            kv_dim,
        };
        self.run(|| {
            let n = n_blocks * block_size * kv_dim;
            for _ in 0..n_layer {
                kv.k.push(self.gpu.zeros::<u16>(n)?);
                kv.v.push(self.gpu.zeros::<u16>(n)?);
            }
            Ok(())
        });
        kv
    }

    fn kv_write(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        seqs: &[AttnSeq<'_>],
    ) {
        self.run(|| {
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() {
                return Err(CudaError::BadLength {
                    what: "kv_write sequences (not the step's)",
                    got: seqs.len(),
                    want: s.n_seqs,
                });
            }
            self.op_kv_write(kv, layer, k, v, &s)
        });
    }

    fn rope_kv_write(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        rope: &RopeAt<'_, CudaWeight>,
        kv: &mut CudaKv,
        layer: usize,
        seqs: &[AttnSeq<'_>],
    ) {
        let fits = can_rope_kv_rows(q, k, v, kv, rope);
        let fused = match q.rows {
            1 => self.opts.fuse.rope_kv,
            _ => self.opts.fuse.rope_kv_rows,
        };
        if q.rows == 0 || !fits || !fused {
            let r = rope;
            self.rope(q, r.positions, r.head_dim, &r.params, r.freq_factors);
            self.rope(k, r.positions, r.head_dim, &r.params, r.freq_factors);
            self.kv_write(kv, layer, k, v, seqs);
            return;
        }
        self.run_raw(|| {
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() || s.n_tokens != rope.positions.len() || s.n_tokens != q.rows
            {
                return Err(CudaError::BadLength {
                    what: "rope_kv_write rows or sequences (not the step's)",
                    got: q.rows,
                    want: s.n_tokens,
                });
            }
            let ff = rope.freq_factors.map_or(0, |w| w.ptr());
            let how = (rope.head_dim, &rope.params, ff);
            // A decode row whose Q|K|V the deferred GEMV computes (one `matmul_group` run,
            // its members' outputs views of the GEMV's): that GEMV's epilogue rotates and
            // appends, no launch of its own.
            if self.rope_kv_in_gemv((q, k, v), how, kv, layer, &s)? {
                return self.forget_quantized();
            }
            self.flush()?;
            self.forget_quantized()?;
            self.op_rope_kv_rows((q, k, v), how, None, kv, layer, &s)
        });
    }

    fn head_norms_rope_kv_write(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        norms: &HeadNorms<'_, CudaWeight>,
        rope: &RopeAt<'_, CudaWeight>,
        kv: &mut CudaKv,
        layer: usize,
        seqs: &[AttnSeq<'_>],
    ) {
        let hd = rope.head_dim;
        let weights = match (norms.q, norms.k) {
            (CudaWeight::Vector { ptr: wq, len: nq }, CudaWeight::Vector { ptr: wk, len: nk })
                if *nq == hd && *nk == hd =>
            {
                Some((*wq, *wk))
            }
            _ => None,
        };
        let fused = match q.rows {
            1 => self.opts.fuse.rope_kv,
            _ => self.opts.fuse.rope_kv_rows,
        };
        let Some((wq, wk)) = weights.filter(|_| {
            fused
                && self.opts.fuse.head_norms_rope
                && q.rows > 0
                && can_rope_kv_rows(q, k, v, kv, rope)
        }) else {
            self.head_norms_in_place(q, norms.q, k, norms.k, norms.eps);
            self.rope_kv_write(q, k, v, rope, kv, layer, seqs);
            return;
        };
        self.run(|| {
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() || s.n_tokens != rope.positions.len() || s.n_tokens != q.rows
            {
                return Err(CudaError::BadLength {
                    what: "head_norms_rope_kv_write rows or sequences (not the step's)",
                    got: q.rows,
                    want: s.n_tokens,
                });
            }
            let ff = rope.freq_factors.map_or(0, |w| w.ptr());
            let how = (hd, &rope.params, ff);
            let norm = smelt_kernels::ops::rope::HeadNormArgs {
                q_norm: wq,
                k_norm: wk,
                eps: norms.eps,
            };
            self.op_rope_kv_rows((q, k, v), how, Some(norm), kv, layer, &s)
        });
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            self.ensure(out, q.rows, p.n_head * p.head_dim)?;
            let s = self.step_ptrs()?;
            if s.n_seqs != seqs.len() {
                return Err(CudaError::BadLength {
                    what: "attention sequences (not the step's)",
                    got: seqs.len(),
                    want: s.n_seqs,
                });
            }
            // The output feeds the output projection: the attention (or its combine)
            // writes what that matmul reads too, q8_1 tiles or f16 rows as the step's size
            // says (`fused_sink`), when the shape allows (one launch per layer less).
            let sink = match self.fused_sink(q.rows) {
                Sink::F16Rows if !self.opts.fuse.attn_f16_rows => Sink::Q8_1,
                sink => sink,
            };
            let tiles = if self.opts.fuse.quantize
                && smelt_kernels::ops::attention::reduce_q8_fits(p.n_head, p.head_dim)
            {
                Some((self.scratch(sink.row_bytes(out.cols)? * out.rows)?, sink))
            } else {
                None
            };
            let min = self.flash_min_tokens(seqs.len());
            let short = seqs.iter().any(|x| x.n_tokens < min);
            self.op_attention(q, kv, layer, &s, p, out, tiles, short)?;
            if let Some((t, sink)) = tiles {
                self.keep_fused_output(out, t, sink);
            }
            Ok(())
        });
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn load_experts(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight, EngineError> {
        self.load_experts_inner(gguf, name)
    }

    fn moe_route(
        &self,
        logits: &CudaTensor,
        p: &MoeRouting,
        route: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run_raw(|| self.op_moe_route(logits, p, route));
        self.take_error()
    }

    fn matmul_id(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run_raw(|| self.op_matmul_id(w, x, route, out, None));
        self.take_error()
    }

    fn matmul_id_pair(
        &self,
        w: [&CudaWeight; 2],
        x: &CudaTensor,
        route: &CudaTensor,
        out: [&mut CudaTensor; 2],
    ) -> Result<(), EngineError> {
        let [o0, o1] = out;
        self.run_raw(|| self.op_matmul_id(w[0], x, route, o0, Some((w[1], o1))));
        self.take_error()
    }

    fn moe_combine(
        &self,
        y: &CudaTensor,
        route: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run(|| self.op_moe_combine(y, route, out));
        self.take_error()
    }

    fn moe_router(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        p: &MoeRouting,
        route: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        let mut fused = false;
        self.run_raw(|| {
            fused = self.op_moe_router(w, x, p, route)?;
            Ok(())
        });
        self.take_error()?;
        if fused {
            return Ok(());
        }
        let mut logits = Backend::alloc(self, x.rows, self.weight_shape(w).0);
        self.matmul(w, x, &mut logits)?;
        self.moe_route(&logits, p, route)
    }

    fn moe_combine_add_norm(
        &self,
        y: &CudaTensor,
        route: &CudaTensor,
        x: &mut CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        let mut fused = false;
        self.run_raw(|| {
            fused = self.op_moe_combine_add_norm(y, route, x, w, eps, out)?;
            Ok(())
        });
        self.take_error()?;
        if fused {
            return Ok(());
        }
        let mut c = Backend::alloc(self, route.rows, y.cols);
        self.moe_combine(y, route, &mut c)?;
        self.add(x, &c);
        self.rms_norm(x, w, eps, out);
        self.take_error()
    }

    fn gather_cols(
        &self,
        x: &CudaTensor,
        cols: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run(|| self.op_gather_cols(x, cols, out));
        self.take_error()
    }

    fn split_gated_q(
        &self,
        x: &CudaTensor,
        head_dim: usize,
        q: &mut CudaTensor,
        gate: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run(|| self.op_split_halves(x, head_dim, q, gate));
        self.take_error()
    }

    fn mul_sigmoid(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<(), EngineError> {
        self.run(|| self.op_mul_sigmoid(x, gate));
        self.take_error()
    }

    fn delta_net(
        &self,
        p: &DeltaParams,
        w: &DeltaWeights<'_, CudaWeight>,
        qkv: &CudaTensor,
        z: &CudaTensor,
        alpha: &CudaTensor,
        beta: &CudaTensor,
        seqs: &[AttnSeq<'_>],
        states: &mut [&mut DeltaState<CudaTensor>],
        out: &mut CudaTensor,
    ) -> Result<(), EngineError> {
        self.run(|| self.op_delta_net(p, w, qkv, z, alpha, beta, seqs, states, out));
        self.take_error()
    }
}

/// Whether a step's rope of `q` and `k` and its KV append of `k` and `v` fit the many-row
/// kernel (`ops::rope::rope_kv_rows_kernel`): every dimension rotated, whole heads, K and V
/// rows of the cache's width, one row of each per token.
fn can_rope_kv_rows(
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    kv: &CudaKv,
    rope: &RopeAt<'_, CudaWeight>,
) -> bool {
    let hd = rope.head_dim;
    hd > 0
        && hd.is_multiple_of(2)
        && hd <= 2048
        && rope.params.n_rot == hd
        && q.cols.is_multiple_of(hd)
        && k.cols == kv.kv_dim
        && v.cols == kv.kv_dim
        && kv.kv_dim.is_multiple_of(hd)
        && k.rows == q.rows
        && v.rows == q.rows
}
