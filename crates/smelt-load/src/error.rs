//! Why a model source could not be turned into a GGUF: each error names the file (or the
//! tensor, or the config key) and what was wrong with it.

use std::path::PathBuf;

use smelt_gguf::GgufError;

/// Why a [`crate::TensorQuantizer`] failed: smelt-quant's error on the CPU, a device's on a
/// GPU (boxed so this crate needs no GPU runtime).
pub type QuantizeError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: neither a GGUF file nor a Hugging Face model folder")]
    NotAModel { path: PathBuf },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is missing: a Hugging Face model folder needs {what}")]
    Missing { path: PathBuf, what: &'static str },
    #[error("{path}: {why}")]
    BadFile { path: PathBuf, why: String },
    #[error("config.json: {why}")]
    BadConfig { why: String },
    #[error(
        "architecture {name:?} is not supported from a Hugging Face folder (supported: \
         LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
         Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM, \
         Qwen3_5ForConditionalGeneration, Qwen3_5MoeForCausalLM, \
         Qwen3_5MoeForConditionalGeneration)"
    )]
    UnknownArchitecture { name: String },
    #[error("tensor {name}: dtype {dtype} is not supported (F32, F16 and BF16 are)")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("tensor {name}: shape {got:?}, but config.json implies {want:?}")]
    ShapeMismatch {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("tensor {name}: {why}")]
    BadTensor { name: String, why: String },
    #[error("tokenizer: {why}")]
    Tokenizer { why: String },
    #[error("--isq: {why}")]
    Plan { why: String },
    #[error("tensor {name} ({from} -> {to}): {source}")]
    Quantize {
        name: String,
        from: smelt_gguf::GgmlType,
        to: smelt_gguf::GgmlType,
        #[source]
        source: QuantizeError,
    },
}

impl LoadError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn bad_file(path: impl Into<PathBuf>, why: impl Into<String>) -> Self {
        Self::BadFile {
            path: path.into(),
            why: why.into(),
        }
    }
}
