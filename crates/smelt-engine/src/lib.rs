//! The engine: model code written once against a backend trait, the paged KV cache, and the
//! sampler that turns logits into tokens.

pub mod sampler;
