//! GGUF v2/v3: read through mmap with zero-copy tensor views, and write as a stream.
//!
//! Reading validates the whole header (every length against the bytes present, every
//! tensor's range against the file) at open, so later accessors cannot fail; a bad file is
//! a [`GgufError`] naming the file and the field, never a panic or a huge allocation.

#![deny(unsafe_code)]

mod error;
mod ggml_type;
mod gguf;
mod metadata;
mod read;
mod tensor;
mod value;
mod write;

pub use error::GgufError;
pub use ggml_type::GgmlType;
pub use gguf::Gguf;
pub use metadata::Metadata;
pub use tensor::{TensorInfo, TensorSpec, MAX_DIMS, MAX_NAME_BYTES};
pub use value::{Array, Value};
pub use write::GgufWriter;
