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

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    Gelu,
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
    /// `(rows, cols)` of a weight (a vector is one row).
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);

    fn alloc(&self, rows: usize, cols: usize) -> Self::Tensor;
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
    /// Adds a bias vector to every row.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);
    /// RMS norm over chunks of `w`'s length (a whole row, or each head), times `w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32, out: &mut Self::Tensor);
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
}
