//! The CPU backend's data: the activation matrix ([`CpuTensor`]), the weights
//! ([`CpuWeight`], a matrix's bytes left in the mapped file or copied with padded rows), and
//! how a weight is loaded from the GGUF. The ops over them are in [`super`].

use std::sync::Arc;

use smelt_gguf::{GgmlType, Gguf};

use super::matmul;
use crate::EngineError;

/// A row-major f32 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// A weight: matrices stay in the mapped file unless they need padding; vectors (norms,
/// biases) are converted to f32 once.
pub enum CpuWeight {
    Matrix {
        bytes: WeightBytes,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        /// Weights per stored row: `cols` rounded up so legacy formats have whole groups of
        /// eight blocks (see [`padded_cols`]).
        stride: usize,
    },
    Vector(Vec<f32>),
    /// `n_expert` matrices of `rows` x `cols` back to back (a MoE layer's `*_exps`).
    Experts {
        bytes: WeightBytes,
        ty: GgmlType,
        n_expert: usize,
        rows: usize,
        cols: usize,
    },
}

/// Where a matrix's bytes live.
pub enum WeightBytes {
    Mapped {
        gguf: Arc<Gguf>,
        index: usize,
    },
    /// A padded copy, in u64 words so every block type is aligned.
    Owned {
        words: Vec<u64>,
        len: usize,
    },
}

impl WeightBytes {
    pub(super) fn get(&self) -> &[u8] {
        match self {
            WeightBytes::Mapped { gguf, index } => gguf.tensor_data(&gguf.tensors()[*index]),
            WeightBytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// Row length a matmul weight is stored with. smelt-quant's AVX2 dots for some legacy
/// formats (and IQ4_NL) take eight blocks per step and finish a ragged tail block by
/// block on a much slower path; zero blocks added to both operands contribute exactly +0
/// to the same partial sums, so padding to whole groups gives identical results at full
/// speed. The formats with a ggml-order dot ([`ggml_dot`]) go block by block and need none.
///
/// [`ggml_dot`]: super::ggml_dot
pub fn padded_cols(ty: GgmlType, cols: usize) -> usize {
    use GgmlType::*;
    let group = 8 * ty.block_size();
    match ty {
        Q4_0 | Q5_1 | IQ4_NL => cols.div_ceil(group) * group,
        _ => cols,
    }
}

impl CpuWeight {
    /// Every value as f32 (a vector as it is, a matrix dequantized row by row).
    pub(super) fn to_f32(&self) -> Result<Vec<f32>, EngineError> {
        match self {
            CpuWeight::Vector(v) => Ok(v.clone()),
            CpuWeight::Matrix {
                bytes,
                ty,
                rows,
                cols,
                stride,
            } => {
                let rb = ty.type_size() * stride / ty.block_size();
                let used = ty.type_size() * cols / ty.block_size();
                let mut out = vec![0f32; rows * cols];
                for (r, o) in out.chunks_mut(*cols).enumerate() {
                    smelt_quant::dequantize_row(*ty, &bytes.get()[r * rb..r * rb + used], o)?;
                }
                Ok(out)
            }
            CpuWeight::Experts { .. } => Err(EngineError::BadOptions(
                "a stack of experts is not a small weight".into(),
            )),
        }
    }

    pub(super) fn vector(&self) -> &[f32] {
        match self {
            CpuWeight::Vector(v) => v,
            CpuWeight::Matrix { .. } | CpuWeight::Experts { .. } => &[],
        }
    }
}

pub(super) fn load(gguf: &Arc<Gguf>, name: &str, pad: bool) -> Result<CpuWeight, EngineError> {
    let index = gguf
        .tensor_index(name)
        .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
    let info = &gguf.tensors()[index];
    let cols = info.row_len() as usize;
    let rows = info.n_rows() as usize;
    let unsupported = || EngineError::UnsupportedType {
        name: name.into(),
        ty: info.ty,
    };
    if info.shape.len() <= 1 {
        let mut v = vec![0f32; cols];
        smelt_quant::dequantize_row(info.ty, gguf.tensor_data(info), &mut v)
            .map_err(|_| unsupported())?;
        return Ok(CpuWeight::Vector(v));
    }
    if !matmul::supported(info.ty) {
        return Err(unsupported());
    }
    let ty = info.ty;
    let stride = if pad { padded_cols(ty, cols) } else { cols };
    let bytes = if stride == cols {
        WeightBytes::Mapped {
            gguf: gguf.clone(),
            index,
        }
    } else {
        let (rb, pb) = (
            ty.type_size() * cols / ty.block_size(),
            ty.type_size() * stride / ty.block_size(),
        );
        let len = rows * pb;
        let mut words = vec![0u64; len.div_ceil(8)];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let src = gguf.tensor_data(info);
        for (d, s) in dst.chunks_mut(pb).zip(src.chunks(rb)) {
            d[..rb].copy_from_slice(s);
        }
        WeightBytes::Owned { words, len }
    };
    Ok(CpuWeight::Matrix {
        bytes,
        ty,
        rows,
        cols,
        stride,
    })
}
