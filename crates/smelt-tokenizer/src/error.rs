use thiserror::Error;

/// Why a tokenizer or chat template could not be built or used.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{0}`")]
    Missing(&'static str),
    #[error("GGUF metadata `{0}` is not {1}")]
    BadField(String, &'static str),
    #[error("token {0:?} is in the vocabulary twice (ids {1} and {2})")]
    DuplicateToken(String, u32, u32),
    #[error("unknown tokenizer model `{0}` (supported: llama, gpt2)")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer `{0}` (tokenizer.ggml.pre)")]
    UnknownPreTokenizer(String),
    #[error("pre-tokenizer regex `{0}` does not compile: {1}")]
    Regex(String, String),
    #[error("no chat template: the GGUF has none and `{0}` has no built-in one")]
    NoTemplate(String),
    #[error("chat template: {0}")]
    Template(String),
}

impl From<minijinja::Error> for TokenizerError {
    fn from(e: minijinja::Error) -> Self {
        // the alternate form carries the template line and the cause chain
        TokenizerError::Template(format!("{e:#}"))
    }
}
