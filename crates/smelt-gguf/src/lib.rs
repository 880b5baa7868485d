//! GGUF v2/v3: read through mmap with zero-copy tensor views, and write.

mod ggml_type;

pub use ggml_type::GgmlType;
