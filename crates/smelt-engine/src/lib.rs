//! The engine: model code written once against a backend trait, the paged KV cache, and the
//! sampler that turns logits into tokens.
//!
//! ```no_run
//! use smelt_engine::{Engine, EngineOptions, Logits, SeqInput};
//! let mut engine = Engine::load("model.gguf".as_ref(), &EngineOptions::default())?;
//! let seq = engine.new_sequence();
//! let out = engine.forward(&[SeqInput { seq, tokens: vec![1, 2, 3], logits: Logits::Last }])?;
//! let next = smelt_engine::argmax(&out[0][0]);
//! # let _ = next;
//! # Ok::<(), smelt_engine::EngineError>(())
//! ```

pub mod backend;
mod device;
pub mod embed;
mod engine;
mod error;
pub mod generate;
pub mod gpu_memory;
pub mod kv_cache;
pub mod model;
pub mod sampler;
pub mod tp;

pub use device::{Device, Selected};
pub use embed::Pooling;
pub use engine::{Engine, EngineOptions, Logits, SeqInput};
pub use error::EngineError;
pub use gpu_memory::GpuMemory;
pub use kv_cache::SeqId;
pub use model::{Arch, ModelInfo};
pub use sampler::argmax;
