//! How each tensor of the model file goes to the GPU (decided on the host, before any
//! upload, so an unusable file fails before it fills device memory).

use smelt_gguf::GgmlType;
use smelt_kernels::catalog;

use crate::EngineError;

/// What a tensor becomes on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightPlan {
    /// A matmul operand: rows repacked from ggml's bytes into the GEMV's row layout.
    Gemv {
        /// Bytes of one row in the GPU layout.
        row_bytes: usize,
    },
    /// An embedding table: ggml's own bytes, rows looked up by the `embed` kernel.
    Embedding {
        /// Bytes of one ggml row.
        row_bytes: usize,
    },
    /// A vector (norm weight, bias, rope factors): dequantized to f32 once.
    Vector,
}

/// What the model uses the tensor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Matmul,
    Embedding,
}

/// Table types the `embed` kernel reads in ggml's layout.
pub const EMBED_TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Decides how tensor `name` of type `ty`, `rows` x `cols` (a vector is `n_dims <= 1`),
/// goes to the GPU; a type without a GPU kernel for its role is an error naming both.
pub fn plan(
    name: &str,
    ty: GgmlType,
    n_dims: usize,
    rows: usize,
    cols: usize,
    role: Role,
) -> Result<WeightPlan, EngineError> {
    let unsupported = || EngineError::UnsupportedType {
        name: format!("{name} (no CUDA kernel for this type in role {role:?})"),
        ty,
    };
    // The delta-net convolution's taps (`[channels][kernel]`) are read as floats by its
    // kernel, never multiplied as a matrix.
    if n_dims <= 1 || name.ends_with("ssm_conv1d.weight") {
        return Ok(WeightPlan::Vector);
    }
    if rows == 0 || cols == 0 {
        return Err(EngineError::BadShape {
            name: name.into(),
            got: vec![cols as u64, rows as u64],
            want: vec![],
        });
    }
    match role {
        Role::Matmul => {
            if !catalog::GEMV_TYPES.contains(&ty) {
                return Err(unsupported());
            }
            let row_bytes = catalog::row_bytes(ty, cols).map_err(|e| EngineError::BadMetadata {
                key: name.into(),
                why: format!("cannot lay out {ty} rows of {cols} for the GPU GEMV: {e}"),
            })?;
            Ok(WeightPlan::Gemv { row_bytes })
        }
        Role::Embedding => {
            if !EMBED_TYPES.contains(&ty) || !cols.is_multiple_of(ty.block_size()) {
                return Err(unsupported());
            }
            Ok(WeightPlan::Embedding {
                row_bytes: cols / ty.block_size() * ty.type_size(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_matrices_are_repacked_for_the_gemv() {
        for ty in catalog::GEMV_TYPES {
            let p = plan("blk.0.ffn_up.weight", ty, 2, 1536, 4096, Role::Matmul).unwrap();
            let WeightPlan::Gemv { row_bytes } = p else {
                panic!("{ty}: {p:?}")
            };
            assert_eq!(row_bytes, catalog::row_bytes(ty, 4096).unwrap());
            // At least ggml's bytes (the GPU layout only adds alignment).
            assert!(row_bytes >= 4096 / ty.block_size() * ty.type_size(), "{ty}");
        }
    }

    #[test]
    fn legacy_rows_of_whole_blocks_but_partial_tiles_are_fine() {
        // Gemma 3 270M: rows of 640 (two and a half tiles) in Q5_0 and Q8_0.
        for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1] {
            assert!(matches!(
                plan("blk.0.attn_q.weight", ty, 2, 1024, 640, Role::Matmul),
                Ok(WeightPlan::Gemv { .. })
            ));
        }
        // A K-quant row must be whole super-blocks.
        assert!(plan("x", GgmlType::Q4_K, 2, 8, 640, Role::Matmul).is_err());
    }

    #[test]
    fn a_type_without_a_kernel_names_the_tensor_and_type() {
        let e = plan("output.weight", GgmlType::F16, 2, 10, 256, Role::Matmul)
            .unwrap_err()
            .to_string();
        assert!(e.contains("output.weight") && e.contains("f16"), "{e}");
        let e = plan(
            "token_embd.weight",
            GgmlType::Q2_K,
            2,
            10,
            256,
            Role::Embedding,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("token_embd.weight") && e.contains("q2_K"), "{e}");
    }

    #[test]
    fn embeddings_stay_in_ggml_layout_and_vectors_become_f32() {
        assert_eq!(
            plan(
                "token_embd.weight",
                GgmlType::Q8_0,
                2,
                49152,
                576,
                Role::Embedding
            )
            .unwrap(),
            WeightPlan::Embedding {
                row_bytes: 576 / 32 * 34
            }
        );
        assert_eq!(
            plan(
                "blk.0.attn_norm.weight",
                GgmlType::F32,
                1,
                1,
                576,
                Role::Matmul
            )
            .unwrap(),
            WeightPlan::Vector
        );
    }
}
