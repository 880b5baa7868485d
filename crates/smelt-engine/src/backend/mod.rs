//! The operations model code is written against. Activations, weights and the KV store are
//! associated types, so a model never sees where its numbers live (host memory now, device
//! memory with the CUDA backend).
//!
//! Activation tensors are row-major `[rows, cols]` f32 matrices, one row per token. Ops
//! that work per head (rope, per-head norms, attention) take the head size and treat each
//! row as consecutive heads.

pub mod cpu;
pub mod cuda;

use smelt_gguf::Gguf;
use std::sync::Arc;

use crate::EngineError;

/// How rope pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml's mode 0: Llama).
    Normal,
    /// Halves `(i, i + n_rot/2)` (ggml's NeoX mode: Qwen, Gemma).
    Neox,
}

/// Rotary embedding parameters of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    /// Dimensions rotated at the start of each head; the rest pass through.
    pub n_rot: usize,
    pub freq_base: f32,
    /// Position multiplier (1 / linear scaling factor).
    pub freq_scale: f32,
}

/// A rope as an attention layer applies it: [`Backend::rope`]'s arguments but the tensor.
pub struct RopeAt<'a, W> {
    /// Each row's position.
    pub positions: &'a [u32],
    pub head_dim: usize,
    pub params: RopeParams,
    /// Per-dimension frequency divisors (Llama 3 rope scaling).
    pub freq_factors: Option<&'a W>,
}

/// The RMS norms of each Q and K head an attention layer applies before its rope (Qwen3's
/// and Gemma 3's `attn_q_norm`, `attn_k_norm`: one weight per head dimension).
pub struct HeadNorms<'a, W> {
    pub q: &'a W,
    pub k: &'a W,
    pub eps: f32,
}

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    Gelu,
}

/// How a mixture-of-experts router turns its logits into probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (Qwen3-MoE, Mixtral).
    Softmax,
    /// Sigmoid of each logit.
    Sigmoid,
}

/// A router's choice rule: the `k` most probable experts, their probabilities optionally
/// divided by their sum, then optionally scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    pub gating: Gating,
    /// Experts per token.
    pub k: usize,
    pub norm: bool,
    /// Multiplier of the weights (0 or 1: none, as llama.cpp).
    pub scale: f32,
}

/// One sequence's recurrent state in one Gated DeltaNet layer, owned by the sequence.
pub struct DeltaState<T> {
    /// The last `conv_kernel - 1` inputs of the convolution, `[kernel - 1, channels]`.
    pub conv: T,
    /// The delta-rule matrices, `[n_v_heads * head_dim, head_dim]`.
    pub ssm: T,
}

/// Shape of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaParams {
    pub conv_kernel: usize,
    pub head_dim: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Epsilon of the q/k L2 norms and of the output norm.
    pub eps: f32,
    /// Value head `h` reads key head `h / (n_v_heads / n_k_heads)`, else `h % n_k_heads`.
    pub grouped_heads: bool,
}

/// The small weights of a Gated DeltaNet layer (the projections are plain matmuls).
pub struct DeltaWeights<'a, W> {
    /// `ssm_conv1d`: `[channels, kernel]`.
    pub conv: &'a W,
    /// `ssm_dt.bias`: added to the gate logits, `[n_v_heads]`.
    pub dt_bias: &'a W,
    /// `ssm_a`: `-exp(A_log)`, `[n_v_heads]`.
    pub a: &'a W,
    /// `ssm_norm`: the output norm, `[head_dim]`.
    pub norm: &'a W,
}

/// The error of an op a backend does not implement yet.
pub fn not_supported(backend: &str, op: &str) -> EngineError {
    EngineError::NotSupported(format!(
        "{op} is not yet supported on {backend}; use --device cpu"
    ))
}

/// One sequence's share of a batch in an attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnSeq<'a> {
    /// First row of this sequence's queries in the batch.
    pub row: usize,
    /// Number of new tokens (query rows).
    pub n_tokens: usize,
    /// Position of the first new token (tokens before it are already cached).
    pub start_pos: usize,
    /// The sequence's KV blocks, covering at least `start_pos + n_tokens` positions.
    pub blocks: &'a [u32],
}

/// Attention shape of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplier of `q·k` before the softmax.
    pub scale: f32,
    /// Keys at or past this distance behind the query are masked (sliding window);
    /// `None` attends to the whole prefix.
    pub window: Option<usize>,
}

/// A compute backend. Every op is synchronous from the caller's view.
pub trait Backend: Send + Sync {
    /// Activations: an f32 matrix of `rows` x `cols`.
    type Tensor: Send;
    /// A weight tensor from the model file (matrix or vector).
    type Weight: Send + Sync;
    /// K and V storage of every layer, in blocks of token slots.
    type KvStore: Send;

    /// Makes the named tensor usable as a weight (a matmul operand, norm or bias).
    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<Self::Weight, EngineError>;
    /// Makes the named tensor usable as an embedding table (rows looked up, not multiplied).
    fn load_embedding(&self, gguf: &Arc<Gguf>, name: &str) -> Result<Self::Weight, EngineError> {
        self.load_weight(gguf, name)
    }
    /// Loads matrices that multiply the same input one after the other (a layer's Q, K
    /// and V; gate and up) as a group, for [`Backend::matmul_group`]: a backend may place
    /// them so that one kernel multiplies them all (the CUDA backend puts a group's rows
    /// one after the other in one piece of device memory).
    fn load_weight_group(
        &self,
        gguf: &Arc<Gguf>,
        names: &[&str],
    ) -> Result<Vec<Self::Weight>, EngineError> {
        names.iter().map(|n| self.load_weight(gguf, n)).collect()
    }
    /// `(rows, cols)` of a weight (a vector is one row).
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);

    fn alloc(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A layer of the forward pass begins; `live` are the tensors that cross layers (the
    /// residual stream, the buffers every layer reuses). Whatever else a layer allocated is
    /// dead by the layer after next, so a backend that allocates a step's activations from
    /// an arena may hand that memory out again (the CUDA backend's `arena::StepScratch`).
    fn begin_layer(&self, _live: &[&Self::Tensor]) {}
    fn shape(&self, x: &Self::Tensor) -> (usize, usize);

    /// Rows of the embedding table for `tokens`, dequantized, into `out`.
    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError>;
    /// `out[t] = W x[t]` for every row `t` of `x`.
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError>;
    /// `outs[i][t] = ws[i] x[t]` for every weight of a group loaded by
    /// [`Backend::load_weight_group`] (in its order) and every row `t` of `x`: the fused
    /// op of several matmuls of one input. A backend may run members as one kernel (the
    /// CUDA backend's single-token GEMV, see `backend::cuda::fusion`); the results are
    /// those of the matmuls one by one.
    fn matmul_group(
        &self,
        ws: &[&Self::Weight],
        x: &Self::Tensor,
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), EngineError> {
        if ws.len() != outs.len() {
            return Err(EngineError::BadOptions(format!(
                "matmul_group of {} weights into {} outputs",
                ws.len(),
                outs.len()
            )));
        }
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, out)?;
        }
        Ok(())
    }
    /// Adds a bias vector to every row.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);
    /// RMS norm over chunks of `w`'s length (a whole row, or each head), times `w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32, out: &mut Self::Tensor);
    /// [`Backend::rms_norm`] of `x` into `x` itself (the same values): the per-head Q and K
    /// norms (Qwen3, Gemma 3) leave Q and K in the buffers the Q|K|V matmul wrote, so a
    /// backend can go on treating them as one Q|K row (the CUDA backend's one-launch rope
    /// and KV append). The default norms into a new tensor and moves it into `x`.
    fn rms_norm_in_place(&self, x: &mut Self::Tensor, w: &Self::Weight, eps: f32) {
        let (rows, cols) = self.shape(x);
        let mut out = self.alloc(rows, cols);
        self.rms_norm(x, w, eps, &mut out);
        *x = out;
    }
    /// `gate = act(ws[0] x) * (ws[1] x)`: [`Backend::matmul_group`] of a feed-forward
    /// block's gate|up group, then [`Backend::glu`], the fused op of the block's first half.
    /// `up` is working space (what it holds afterwards is not part of the result): a
    /// backend may apply the GLU inside the matmuls' split reduce and never write it (the
    /// CUDA backend at 8-32 tokens, `fuse.glu_reduce`); this default is the two ops.
    fn matmul_glu(
        &self,
        ws: [&Self::Weight; 2],
        x: &Self::Tensor,
        act: Glu,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        self.matmul_group(&ws, x, &mut [&mut *gate, &mut *up])?;
        self.glu(gate, up, act);
        Ok(())
    }
    /// The Q and K head norms (Qwen3, Gemma 3): [`Backend::rms_norm_in_place`] of `q` with
    /// `wq`, then of `k` with `wk`. One op so that a backend can run both as one kernel
    /// (the CUDA backend at decode, where K's heads follow Q's in the Q|K|V GEMV's output);
    /// this default is the two ops.
    fn head_norms_in_place(
        &self,
        q: &mut Self::Tensor,
        wq: &Self::Weight,
        k: &mut Self::Tensor,
        wk: &Self::Weight,
        eps: f32,
    ) {
        self.rms_norm_in_place(q, wq, eps);
        self.rms_norm_in_place(k, wk, eps);
    }
    fn scale(&self, x: &mut Self::Tensor, s: f32);
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `gate = act(gate) * up`.
    fn glu(&self, gate: &mut Self::Tensor, up: &Self::Tensor, act: Glu);
    /// Rotates each head of each row by its token's position; `freq_factors` divides the
    /// per-dimension frequencies (Llama 3 rope scaling).
    fn rope(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
        freq_factors: Option<&Self::Weight>,
    );
    /// Copies the given rows into a new tensor.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Self::Tensor;
    fn to_host(&self, x: &Self::Tensor) -> Vec<f32>;
    /// Index of the largest value in each row (the first one on ties).
    fn argmax_rows(&self, x: &Self::Tensor) -> Vec<u32>;

    fn kv_alloc(
        &self,
        n_layer: usize,
        n_blocks: usize,
        block_size: usize,
        kv_dim: usize,
    ) -> Self::KvStore;
    /// Stores the new tokens' K and V rows of `layer` into their slots.
    fn kv_write(
        &self,
        kv: &mut Self::KvStore,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        seqs: &[AttnSeq<'_>],
    );
    /// [`Backend::rope`] of `q` and of `k`, then [`Backend::kv_write`] of the rotated `k`
    /// and of `v`: the fused op of an attention layer's new rows. A backend may run it as
    /// one kernel (the CUDA backend for a step of many rows; a decode row's Q|K|V GEMV does
    /// it in its epilogue); this default is the three ops.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        rope: &RopeAt<'_, Self::Weight>,
        kv: &mut Self::KvStore,
        layer: usize,
        seqs: &[AttnSeq<'_>],
    ) {
        let r = rope;
        self.rope(q, r.positions, r.head_dim, &r.params, r.freq_factors);
        self.rope(k, r.positions, r.head_dim, &r.params, r.freq_factors);
        self.kv_write(kv, layer, k, v, seqs);
    }
    /// [`Backend::head_norms_in_place`] of `q` and `k`, then [`Backend::rope_kv_write`]:
    /// the new rows of an attention layer that norms each Q and K head before its rope. A
    /// backend may run it as one kernel (the CUDA backend); this default is the two ops.
    #[allow(clippy::too_many_arguments)]
    fn head_norms_rope_kv_write(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        norms: &HeadNorms<'_, Self::Weight>,
        rope: &RopeAt<'_, Self::Weight>,
        kv: &mut Self::KvStore,
        layer: usize,
        seqs: &[AttnSeq<'_>],
    ) {
        self.head_norms_in_place(q, norms.q, k, norms.k, norms.eps);
        self.rope_kv_write(q, k, v, rope, kv, layer, seqs);
    }
    /// Causal attention of each sequence's queries over its cached keys and values.
    fn attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::KvStore,
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        out: &mut Self::Tensor,
    );

    /// Short name for messages ("cpu", "cuda").
    fn name(&self) -> &'static str {
        "this device"
    }

    /// Makes the named 3D tensor (`[n_expert][rows][cols]`) usable by [`Backend::matmul_id`].
    fn load_experts(&self, gguf: &Arc<Gguf>, name: &str) -> Result<Self::Weight, EngineError> {
        let _ = (gguf, name);
        Err(not_supported(self.name(), "mixture-of-experts weights"))
    }

    /// Routes each row of router `logits` (`[n, n_expert]`) to its experts: `route` becomes
    /// `[n, 2k]`, the chosen expert ids (as f32, most probable first) then their weights.
    fn moe_route(
        &self,
        logits: &Self::Tensor,
        p: &MoeRouting,
        route: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (logits, p, route);
        Err(not_supported(self.name(), "moe_route"))
    }

    /// `out[t*k + i] = W[id(t, i)] x[t or t*k + i]` for every token `t` and chosen expert `i`
    /// of `route`: every selected expert of the step, grouped by expert. `x` has one row per
    /// token (shared by its experts) or one per (token, expert).
    fn matmul_id(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        route: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (w, x, route, out);
        Err(not_supported(self.name(), "matmul_id"))
    }

    /// [`Backend::matmul_id`] of two expert arrays of the same shape on the same input and
    /// route (a MoE layer's gate and up projections): one launch where the backend can.
    fn matmul_id_pair(
        &self,
        w: [&Self::Weight; 2],
        x: &Self::Tensor,
        route: &Self::Tensor,
        out: [&mut Self::Tensor; 2],
    ) -> Result<(), EngineError> {
        let [o0, o1] = out;
        self.matmul_id(w[0], x, route, o0)?;
        self.matmul_id(w[1], x, route, o1)
    }

    /// `out[t] = sum_i weight(t, i) * y[t*k + i]`, products rounded then added in expert
    /// order (llama.cpp's `ggml_mul` then chain of `ggml_add`).
    fn moe_combine(
        &self,
        y: &Self::Tensor,
        route: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (y, route, out);
        Err(not_supported(self.name(), "moe_combine"))
    }

    /// A MoE layer's router: `route = moe_route(w x)` (the router matmul, then
    /// [`Backend::moe_route`]). One op so that a backend can run it as one kernel (the
    /// CUDA backend at one token: with the FFN norm before it too,
    /// `smelt_kernels::moe_fused::router_kernel`); this default is the two ops.
    fn moe_router(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        p: &MoeRouting,
        route: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let mut logits = self.alloc(self.shape(x).0, self.weight_shape(w).0);
        self.matmul(w, x, &mut logits)?;
        self.moe_route(&logits, p, route)
    }

    /// `x += moe_combine(y, route)`, then `out = rms_norm(x) * w`: a MoE layer's output
    /// joining the residual stream, and the next layer's norm (as
    /// [`crate::model::AllReduce::all_reduce_add_norm`] for a row-parallel layer). One op
    /// so that a backend can run it as one kernel (the CUDA backend at one token:
    /// `smelt_kernels::moe_fused::combine_norm_kernel`); this default is the three ops, so
    /// the CPU engine computes what it computed before, bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_add_norm(
        &self,
        y: &Self::Tensor,
        route: &Self::Tensor,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let mut c = self.alloc(self.shape(route).0, self.shape(y).1);
        self.moe_combine(y, route, &mut c)?;
        self.add(x, &c);
        self.rms_norm(x, w, eps, out);
        Ok(())
    }

    /// `out[t][j] = x[t][cols[j]]`: columns picked (and reordered) from each row.
    fn gather_cols(
        &self,
        x: &Self::Tensor,
        cols: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (x, cols, out);
        Err(not_supported(self.name(), "gather_cols"))
    }

    /// Splits rows of interleaved `[q (hd), gate (hd)]` heads into `q` and `gate`.
    fn split_gated_q(
        &self,
        x: &Self::Tensor,
        head_dim: usize,
        q: &mut Self::Tensor,
        gate: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (x, head_dim, q, gate);
        Err(not_supported(self.name(), "gated attention"))
    }

    /// `x *= sigmoid(gate)`.
    fn mul_sigmoid(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<(), EngineError> {
        let _ = (x, gate);
        Err(not_supported(self.name(), "gated attention"))
    }

    /// A Gated DeltaNet layer between its projections, per sequence of `seqs` (with
    /// `states` in the same order, advanced): causal conv1d of `qkv` with the window, SiLU,
    /// q/k L2 norms, gates `g = softplus(alpha + dt_bias) * a` and `beta = sigmoid(beta)`,
    /// the delta rule (token by token for one token, in chunks for a prompt), then
    /// `rms_norm(o) * norm * silu(z)` into `out` (`[rows, n_v_heads * head_dim]`).
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        p: &DeltaParams,
        w: &DeltaWeights<'_, Self::Weight>,
        qkv: &Self::Tensor,
        z: &Self::Tensor,
        alpha: &Self::Tensor,
        beta: &Self::Tensor,
        seqs: &[AttnSeq<'_>],
        states: &mut [&mut DeltaState<Self::Tensor>],
        out: &mut Self::Tensor,
    ) -> Result<(), EngineError> {
        let _ = (p, w, qkv, z, alpha, beta, seqs, states, out);
        Err(not_supported(self.name(), "gated delta-net"))
    }
}
