//! The engine as the scheduler sees it: [`Engine`] is the real one; the unit tests drive the
//! scheduler with a scripted fake (panics, errors, a tiny KV cache).

use smelt_engine::{Engine, EngineError, Pooling, SeqId, SeqInput};

/// What the scheduler needs from an engine: [`Engine`] is the real one; the unit tests drive
/// the scheduler with a scripted fake (panics, errors, a tiny KV cache).
pub trait StepEngine {
    fn new_sequence(&mut self) -> SeqId;
    fn free_sequence(&mut self, seq: SeqId);
    fn forward(&mut self, batch: &[SeqInput]) -> Result<Vec<Vec<Vec<f32>>>, EngineError>;
    /// Per input, the greedy token of its last row (`None` where it asked for no logits).
    /// An engine that can choose it where the logits are (the GPU) overrides this.
    fn forward_greedy(&mut self, batch: &[SeqInput]) -> Result<Vec<Option<u32>>, EngineError> {
        Ok(self
            .forward(batch)?
            .iter()
            .map(|rows| rows.last().map(|r| smelt_engine::argmax(r)))
            .collect())
    }
    fn free_blocks(&self) -> usize;
    fn total_blocks(&self) -> usize;
    /// Starts a fresh sequence on cached KV blocks of `tokens`' prefix; the tokens they
    /// hold (none for an engine without a prefix cache).
    fn attach_prefix(&mut self, _seq: SeqId, _tokens: &[u32]) -> usize {
        0
    }
    /// Prompt tokens looked up in the prefix cache and found there, since loading.
    fn prefix_cache_stats(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Whether a row's result depends on whether its chunk holds one token or more. The
    /// CPU engine sums a lone token's attention in ggml's `vec_dot` order and a longer
    /// chunk's in tinyBLAS order, as llama.cpp does; the scheduler then chunks so that
    /// every row goes the way it went the first time (see `scheduler::plan::chunk_len`).
    fn lone_token_rows_differ(&self) -> bool {
        false
    }
    /// Each input's pooled final-norm rows (not normalized); see [`Engine::embed`].
    fn embed(
        &mut self,
        _inputs: &[Vec<u32>],
        _pooling: Pooling,
        _step_tokens: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Err(EngineError::NotSupported(
            "this engine cannot compute embeddings".into(),
        ))
    }
}

impl StepEngine for Engine {
    fn new_sequence(&mut self) -> SeqId {
        Engine::new_sequence(self)
    }

    fn free_sequence(&mut self, seq: SeqId) {
        Engine::free_sequence(self, seq)
    }

    fn forward(&mut self, batch: &[SeqInput]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        Engine::forward(self, batch)
    }

    fn forward_greedy(&mut self, batch: &[SeqInput]) -> Result<Vec<Option<u32>>, EngineError> {
        Engine::forward_greedy(self, batch)
    }

    fn free_blocks(&self) -> usize {
        Engine::free_blocks(self)
    }

    fn total_blocks(&self) -> usize {
        Engine::total_blocks(self)
    }

    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        Engine::attach_prefix(self, seq, tokens)
    }

    fn prefix_cache_stats(&self) -> (u64, u64) {
        Engine::prefix_cache_stats(self)
    }

    fn lone_token_rows_differ(&self) -> bool {
        Engine::lone_token_rows_differ(self)
    }

    fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        pooling: Pooling,
        step_tokens: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Engine::embed(self, inputs, pooling, step_tokens)
    }
}
