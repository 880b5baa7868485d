//! Tensor records and the shape rules ggml enforces on them, shared by reader and writer so
//! that every file we write is one we (and llama.cpp) would read.

use crate::GgmlType;

/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// ggml's `GGML_MAX_NAME` includes the NUL, so names may have at most 63 bytes.
pub const MAX_NAME_BYTES: usize = 63;

/// A tensor as the file describes it.
///
/// `shape` is in ggml's `ne` order: `shape[0]` is the row length (the contiguous dimension).
/// An empty shape is a scalar, as in ggml (every missing dimension is 1). `offset` is
/// relative to the start of the data section.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
    pub offset: u64,
}

/// A tensor to be written: the info without the offset, which the writer lays out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

impl TensorInfo {
    /// Product of the dimensions (saturating; tensors from a parsed file never saturate).
    pub fn n_elements(&self) -> u64 {
        n_elements(&self.shape).unwrap_or(u64::MAX)
    }

    /// Bytes of data (saturating; tensors from a parsed file never saturate).
    pub fn n_bytes(&self) -> u64 {
        n_bytes(self.ty, &self.shape).unwrap_or(u64::MAX)
    }

    /// Elements per row: `shape[0]`.
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Rows: the product of every dimension after the first.
    pub fn n_rows(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

impl TensorSpec {
    /// Bytes of data this tensor needs (saturating).
    pub fn n_bytes(&self) -> u64 {
        n_bytes(self.ty, &self.shape).unwrap_or(u64::MAX)
    }
}

/// Product of the dimensions; a zero dimension wins over an overflowing product, as in ggml.
fn n_elements(shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

fn n_bytes(ty: GgmlType, shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let row_len = shape.first().copied().unwrap_or(1);
    let rows = shape
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    ty.row_bytes(row_len)?.checked_mul(rows)
}

/// Checks a tensor's name, shape and type the way ggml's loader does, returning its byte
/// size. The error is the problem alone; callers add the file and field.
pub(crate) fn validate(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64, String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "name is {} bytes; ggml allows at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if shape.len() > MAX_DIMS {
        return Err(format!(
            "{} dimensions; ggml allows at most {MAX_DIMS}",
            shape.len()
        ));
    }
    if let Some((i, &d)) = shape
        .iter()
        .enumerate()
        .find(|&(_, &d)| d > i64::MAX as u64)
    {
        return Err(format!(
            "dimension {i} is {d}, which is negative as ggml's int64"
        ));
    }
    let elements = n_elements(shape)
        .filter(|&n| n < i64::MAX as u64)
        .ok_or_else(|| format!("shape {shape:?} has more than 2^63-1 elements"))?;
    let row_len = shape.first().copied().unwrap_or(1);
    if !row_len.is_multiple_of(ty.block_size() as u64) {
        return Err(format!(
            "row length {row_len} (shape {shape:?}) is not a multiple of {ty}'s block size {}",
            ty.block_size()
        ));
    }
    let bytes = n_bytes(ty, shape)
        .ok_or_else(|| format!("{elements} elements of {ty} take more than 2^64 bytes"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: GgmlType, shape: &[u64]) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            ty,
            shape: shape.to_vec(),
            offset: 0,
        }
    }

    #[test]
    fn sizes_follow_ggml() {
        let t = info(GgmlType::Q4_K, &[512, 3, 2]);
        assert_eq!(t.n_elements(), 3072);
        assert_eq!(t.row_len(), 512);
        assert_eq!(t.n_rows(), 6);
        assert_eq!(t.n_bytes(), 2 * 144 * 6);
        let scalar = info(GgmlType::F32, &[]);
        assert_eq!((scalar.n_elements(), scalar.n_bytes()), (1, 4));
        assert_eq!((scalar.row_len(), scalar.n_rows()), (1, 1));
        let empty = info(GgmlType::F16, &[u64::MAX / 2, 0]);
        assert_eq!((empty.n_elements(), empty.n_bytes()), (0, 0));
    }

    #[test]
    fn validation_matches_ggml_rules() {
        assert_eq!(validate("a", GgmlType::Q8_0, &[64, 2]), Ok(136));
        assert_eq!(validate("a", GgmlType::F32, &[]), Ok(4));
        assert!(validate("a", GgmlType::F32, &[1, 1, 1, 1, 1])
            .unwrap_err()
            .contains("5 dimensions"));
        assert!(validate("a", GgmlType::Q4_0, &[33])
            .unwrap_err()
            .contains("block size 32"));
        assert!(validate("a", GgmlType::F32, &[1 << 40, 1 << 40])
            .unwrap_err()
            .contains("elements"));
        assert!(validate("a", GgmlType::F32, &[u64::MAX])
            .unwrap_err()
            .contains("negative"));
        assert!(validate(&"n".repeat(64), GgmlType::F32, &[1])
            .unwrap_err()
            .contains("64 bytes"));
        // 2^62 f64 elements fit i64 but not u64 bytes.
        assert!(validate("a", GgmlType::F64, &[1 << 62])
            .unwrap_err()
            .contains("bytes"));
        assert_eq!(validate("a", GgmlType::F32, &[1 << 62, 0]), Ok(0));
    }
}
