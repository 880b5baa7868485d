//! A parsed GGUF file that owns its bytes (a memory map, or a buffer in tests) and hands out
//! tensor data as borrowed slices, so loading a model never copies weights it does not need.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::read::{self, Header};
use crate::tensor::TensorInfo;

enum Storage {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mmap(m) => m,
            Self::Bytes(b) => b,
        }
    }
}

/// A parsed GGUF v2/v3 file. Every tensor's data range was checked at open, so
/// [`Gguf::tensor_data`] cannot fail.
pub struct Gguf {
    storage: Storage,
    path: Option<PathBuf>,
    header: Header,
}

impl Gguf {
    /// Maps `path` and parses it. Nothing but the header is read until tensor data is touched.
    ///
    /// The file must not be modified while the `Gguf` is alive (the usual mmap contract:
    /// a truncated file would fault on access, a rewritten one would change under us).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| GgufError::io(Some(path), "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::io(Some(path), "stat", e))?
            .len();
        // An empty map is an error on some systems; an empty file is simply too short.
        let storage = if len == 0 {
            Storage::Bytes(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this value; the contract above
            // (the file is not modified while mapped) is the caller's, as with every mmap
            // loader (llama.cpp included).
            #[allow(unsafe_code)]
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| GgufError::io(Some(path), "mmap", e))?;
            Storage::Mmap(map)
        };
        Self::parse(storage, Some(path.to_path_buf()))
    }

    /// Parses a file held in memory (tests, fuzzing, files fetched over the network).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Bytes(bytes), None)
    }

    fn parse(storage: Storage, path: Option<PathBuf>) -> Result<Self, GgufError> {
        let header = read::parse(storage.bytes(), path.as_deref())?;
        Ok(Self {
            storage,
            path,
            header,
        })
    }

    /// The file this was opened from (`None` for [`Gguf::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// 2 or 3.
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index(name).map(|i| &self.header.tensors[i])
    }

    /// The position of tensor `name` in [`Gguf::tensors`] (from the name index, no scan).
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.header.index.get(name).copied()
    }

    /// The `t.n_bytes()` bytes of a tensor of this file, borrowed from the map.
    ///
    /// A `TensorInfo` that does not come from this file gets an empty slice when its range
    /// falls outside the file (ranges of this file's own tensors were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.storage.bytes();
        let range = self
            .header
            .data_offset
            .checked_add(t.offset)
            .and_then(|start| Some((start, start.checked_add(t.n_bytes())?)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?));
        range.and_then(|r| bytes.get(r)).unwrap_or(&[])
    }

    /// Absolute file offset of the tensor data section (tensor offsets are relative to it).
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("alignment", &self.header.alignment)
            .field("metadata_len", &self.header.metadata.len())
            .field("tensors_len", &self.header.tensors.len())
            .field("data_offset", &self.header.data_offset)
            .finish()
    }
}
