//! Why the engine refused to load a model or run a step.

use smelt_gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (smelt knows llama, qwen2, qwen3, qwen3moe, gemma3)")]
    UnknownArchitecture(String),
    #[error("the GGUF has no general.architecture key")]
    NoArchitecture,
    #[error("missing metadata key {0}")]
    MissingKey(String),
    #[error("bad metadata {key}: {why}")]
    BadMetadata { key: String, why: String },
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    BadShape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("tensor {name} has type {ty}, which smelt cannot use here")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("token id {token} is out of range (vocabulary of {n_vocab})")]
    BadToken { token: u32, n_vocab: usize },
    #[error("unknown or freed sequence {0}")]
    UnknownSequence(u64),
    #[error("sequence {0} appears twice in one batch")]
    DuplicateSequence(u64),
    #[error("out of KV cache blocks: need {need}, {free} free (raise kv_tokens)")]
    OutOfKvBlocks { need: usize, free: usize },
    #[error("sequence would reach {len} tokens, past the model's context of {max}")]
    ContextOverflow { len: usize, max: usize },
    /// A model or op this device cannot run yet (the message says which and what to use).
    #[error("{0}")]
    NotSupported(String),
    #[error("bad engine options: {0}")]
    BadOptions(String),
    #[error("quantization: {0}")]
    Quant(#[from] smelt_quant::QuantError),
    #[error(transparent)]
    Cuda(#[from] smelt_cuda::CudaError),
    /// A step's activations did not fit beside the weights and the KV cache.
    #[error(
        "the GPU ran out of memory in a step of {tokens} tokens over {seqs} sequence(s): a \
         smaller step (smelt serve --step-tokens, smelt bench --ubatch) or fewer sequences at \
         once (--max-batch) needs less"
    )]
    StepOutOfMemory { tokens: usize, seqs: usize },
}

impl EngineError {
    /// `e`, or [`EngineError::StepOutOfMemory`] when it is the driver running out of
    /// memory during a step of `tokens` tokens over `seqs` sequences.
    pub fn in_step(e: EngineError, tokens: usize, seqs: usize) -> EngineError {
        match e {
            EngineError::Cuda(c) if c.is_out_of_memory() => {
                EngineError::StepOutOfMemory { tokens, seqs }
            }
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EngineError;
    use smelt_cuda::cudarc::driver::{sys::CUresult, DriverError};
    use smelt_cuda::CudaError;

    #[test]
    fn a_step_out_of_device_memory_says_what_to_shrink() {
        let oom = EngineError::Cuda(CudaError::Driver(DriverError(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        )));
        let e = EngineError::in_step(oom, 4096, 32);
        assert!(matches!(
            e,
            EngineError::StepOutOfMemory {
                tokens: 4096,
                seqs: 32
            }
        ));
        let msg = e.to_string();
        assert!(msg.contains("4096 tokens over 32 sequence"), "{msg}");
        assert!(
            msg.contains("--ubatch") && msg.contains("--max-batch"),
            "{msg}"
        );
        // Any other error passes through unchanged.
        let other = EngineError::Cuda(CudaError::Driver(DriverError(
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        )));
        assert!(matches!(
            EngineError::in_step(other, 1, 1),
            EngineError::Cuda(_)
        ));
    }
}
