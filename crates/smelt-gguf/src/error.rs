//! One error type for reading and writing. Every message starts with the file (when there is
//! one) and the field at fault, because "invalid GGUF" alone sends a user hunting through a
//! multi-gigabyte file with a hex editor.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The OS refused to open, map, create or write a file.
    #[error("{}{op}: {source}", FilePrefix(.file))]
    Io {
        file: Option<PathBuf>,
        /// What we were doing: "open", "mmap", "create", "write".
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid GGUF file, or a writer was given something it cannot write.
    #[error("{}{field}: {problem}", FilePrefix(.file))]
    Invalid {
        file: Option<PathBuf>,
        /// Where: `header: version`, `metadata key 'general.alignment' (#3)`,
        /// `tensor 'blk.0.attn_q.weight' (#3)`...
        field: String,
        problem: String,
    },
}

impl GgufError {
    /// The field an `Invalid` error is about.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Io { .. } => None,
        }
    }

    /// The file the error is about, when known.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::Io { file, .. } | Self::Invalid { file, .. } => file.as_deref(),
        }
    }

    pub(crate) fn invalid(
        file: Option<&Path>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            file: file.map(Path::to_path_buf),
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn io(file: Option<&Path>, op: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            file: file.map(Path::to_path_buf),
            op,
            source,
        }
    }
}

/// `"path: "` or nothing, so messages read the same with and without a file.
struct FilePrefix<'a>(&'a Option<PathBuf>);

impl fmt::Display for FilePrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{}: ", p.display()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_file_and_field() {
        let e = GgufError::invalid(Some(Path::new("m.gguf")), "header: version", "v1 is old");
        assert_eq!(e.to_string(), "m.gguf: header: version: v1 is old");
        assert_eq!(e.field(), Some("header: version"));
        let e = GgufError::invalid(None, "tensor 'x' (#0)", "bad");
        assert_eq!(e.to_string(), "tensor 'x' (#0): bad");
        let e = GgufError::io(
            Some(Path::new("out.gguf")),
            "write",
            std::io::Error::other("disk full"),
        );
        assert_eq!(e.to_string(), "out.gguf: write: disk full");
        assert_eq!(e.file(), Some(Path::new("out.gguf")));
    }
}
