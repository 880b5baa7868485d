//! GGUF v2/v3: read through mmap with zero-copy tensor views, and write as a stream.
//!
//! Reading validates the whole header (every length against the bytes present, every
//! tensor's range against the file) at open, so later accessors cannot fail; a bad file is
//! a [`GgufError`] naming the file and the field, never a panic or a huge allocation.
//!
//! ```
//! use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};
//!
//! let mut meta = Metadata::new();
//! meta.insert("general.architecture", Value::from("llama"));
//! meta.insert("llama.block_count", Value::U32(2));
//! let spec = TensorSpec { name: "output_norm.weight".into(), ty: GgmlType::F32, shape: vec![4] };
//! let mut w = GgufWriter::new(Vec::new(), &meta, vec![spec])?;
//! w.write_tensor("output_norm.weight", &[0u8; 16])?;
//! let bytes = w.finish()?;
//!
//! let g = Gguf::from_bytes(bytes)?; // or Gguf::open(path), which maps the file
//! assert_eq!(g.metadata().architecture(), Some("llama"));
//! assert_eq!(g.metadata().get_u64("llama.block_count"), Some(2));
//! let t = g.tensor("output_norm.weight").unwrap();
//! assert_eq!((t.row_len(), t.n_rows(), g.tensor_data(t).len()), (4, 1, 16));
//! # Ok::<(), smelt_gguf::GgufError>(())
//! ```
//!
//! Tensor views of a file opened with [`Gguf::open`] are aligned in memory as in the file
//! (`general.alignment`, 32 by default, from a page-aligned map); views of
//! [`Gguf::from_bytes`] inherit the `Vec`'s allocation alignment instead.

#![deny(unsafe_code)]

mod error;
mod ggml_type;
mod gguf;
mod metadata;
mod placed;
mod pread;
mod read;
mod tensor;
mod value;
mod write;

pub use error::GgufError;
pub use ggml_type::GgmlType;
pub use gguf::Gguf;
pub use metadata::Metadata;
pub use placed::GgufPlacedWriter;
pub use pread::pread_parallel;
pub use tensor::{TensorInfo, TensorSpec, MAX_DIMS, MAX_NAME_BYTES};
pub use value::{Array, Value};
pub use write::GgufWriter;

#[cfg(test)]
mod tests {
    /// Loaders share one parsed file across threads.
    #[test]
    fn gguf_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Gguf>();
        check::<super::GgufError>();
    }
}
