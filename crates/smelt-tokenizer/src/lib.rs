//! Tokenizers and chat templates from GGUF metadata, giving the same token ids as llama.cpp.
//!
//! Two vocabulary kinds cover the models smelt runs: SentencePiece BPE with scores
//! (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma) and GPT-2 byte-level BPE with
//! merges and a pre-tokenizer chosen by `tokenizer.ggml.pre` (Llama 3, Qwen2, SmolLM...). The
//! algorithms follow llama.cpp's `llama-vocab.cpp` step for step, quirks included, because
//! token ids are what a model's output depends on; the crate's tests compare every id with
//! llama.cpp itself.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use smelt_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
//! let gguf = smelt_gguf::Gguf::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(gguf.metadata())?;
//! let chat = ChatTemplate::from_gguf(gguf.metadata(), &tok)?;
//! let prompt = chat.render(&[ChatMessage::new("user", "Hi!")], true)?;
//! let ids = tok.encode(&prompt, true, true);
//! assert_eq!(tok.decode(&ids[ids.len() - 1..]).len(), tok.token_bytes(ids[ids.len() - 1]).len());
//! # Ok(()) }
//! ```

mod bpe;
mod chat;
mod error;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod time;
mod tokenizer;
mod unicode;
mod vocab;

pub use chat::{BuiltinTemplate, ChatMessage, ChatTemplate, Marked};
pub use error::TokenizerError;
pub use pretokenize::pre_tokenizer_key;
pub use stream::DecodeStream;
pub use tokenizer::Tokenizer;
pub use vocab::VocabKind;
