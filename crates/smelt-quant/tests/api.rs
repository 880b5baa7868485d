//! The byte-level API's contract apart from the numbers: which types it handles, which
//! activation type each pairs with (ggml-cpu's `vec_dot_type` table), and the errors it
//! returns for bad shapes and buffers instead of panicking.

mod common;

use common::{DEQUANTIZABLE, QUANTIZABLE};
use smelt_quant::{
    act_type, can_dequantize, can_quantize, dequantize_row, quantize_row, quantize_tensor, vec_dot,
    GgmlType, QuantError,
};

#[test]
fn supported_types_are_exactly_the_promised_ones() {
    for ty in GgmlType::ALL {
        assert_eq!(
            can_quantize(ty),
            QUANTIZABLE.contains(&ty),
            "can_quantize({})",
            ty.name()
        );
        assert_eq!(
            can_dequantize(ty),
            DEQUANTIZABLE.contains(&ty),
            "can_dequantize({})",
            ty.name()
        );
    }
}

/// ggml-cpu's `type_traits_cpu[..].vec_dot_type` (llama.cpp 0c1e570; `oracle_live.rs`
/// re-reads it from the library). Q8_1 and Q8_K have no vec_dot in ggml; smelt dots them
/// against themselves.
#[test]
fn activation_types_are_ggml_pairings() {
    use GgmlType::*;
    let table = [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q4_1, Q8_1),
        (Q5_0, Q8_0),
        (Q5_1, Q8_1),
        (Q8_0, Q8_0),
        (Q8_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
        (Q8_K, Q8_K),
        (IQ4_NL, Q8_0),
        (IQ4_XS, Q8_K),
    ];
    for (ty, act) in table {
        assert_eq!(act_type(ty), Ok(act), "act_type({})", ty.name());
        assert!(
            can_quantize(act),
            "{} activations must be quantizable",
            act.name()
        );
    }
    assert!(matches!(
        act_type(IQ2_XXS),
        Err(QuantError::Unsupported { .. })
    ));
}

#[test]
fn unsupported_types_are_errors() {
    let src = vec![0.5f32; 256];
    let mut dst = vec![0u8; 4096];
    let mut out = vec![0f32; 256];
    for ty in [
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::IQ2_XXS,
        GgmlType::I8,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ] {
        let row = 256 / ty.block_size() * ty.type_size();
        assert!(
            matches!(
                quantize_row(ty, &src, &mut dst[..row]),
                Err(QuantError::Unsupported { .. })
            ),
            "quantize_row({})",
            ty.name()
        );
        assert!(
            matches!(
                quantize_tensor(ty, &src, 256, Some(1)),
                Err(QuantError::Unsupported { .. })
            ),
            "quantize_tensor({})",
            ty.name()
        );
    }
    for ty in [
        GgmlType::IQ2_XXS,
        GgmlType::TQ1_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ] {
        let row = 256 / ty.block_size() * ty.type_size();
        assert!(
            matches!(
                dequantize_row(ty, &dst[..row], &mut out),
                Err(QuantError::Unsupported { .. })
            ),
            "dequantize_row({})",
            ty.name()
        );
        assert!(
            matches!(
                vec_dot(ty, 256, &dst[..row], &dst[..row]),
                Err(QuantError::Unsupported { .. })
            ),
            "vec_dot({})",
            ty.name()
        );
    }
}

#[test]
fn ragged_rows_are_errors() {
    for ty in DEQUANTIZABLE {
        let block = ty.block_size();
        if block == 1 {
            continue;
        }
        let n = block + 1;
        let src = vec![1f32; n];
        let mut dst = vec![0u8; 2 * ty.type_size()];
        let mut out = vec![0f32; n];
        let ragged = |e: Result<(), QuantError>| matches!(e, Err(QuantError::RaggedRow { n: m, .. }) if m == n);
        if can_quantize(ty) {
            assert!(
                ragged(quantize_row(ty, &src, &mut dst)),
                "quantize_row({})",
                ty.name()
            );
            assert!(
                matches!(
                    quantize_tensor(ty, &src, n, Some(2)),
                    Err(QuantError::RaggedRow { .. })
                ),
                "quantize_tensor({})",
                ty.name()
            );
        }
        assert!(
            ragged(dequantize_row(ty, &dst, &mut out)),
            "dequantize_row({})",
            ty.name()
        );
        assert!(
            matches!(
                vec_dot(ty, n, &dst, &dst),
                Err(QuantError::RaggedRow { .. })
            ),
            "vec_dot({})",
            ty.name()
        );
    }
}

#[test]
fn wrong_buffer_lengths_are_errors() {
    for ty in DEQUANTIZABLE {
        let n = 2 * ty.block_size().max(32);
        let bytes = n / ty.block_size() * ty.type_size();
        let src = vec![0.25f32; n];
        let mut out = vec![0f32; n];
        let bad_len = |e: Result<(), QuantError>, want_got: usize| matches!(e, Err(QuantError::BadLength { got, want, .. }) if got == want_got && want == bytes);
        for wrong in [bytes - 1, bytes + 1, 0] {
            let mut dst = vec![0u8; wrong];
            if can_quantize(ty) {
                assert!(
                    bad_len(quantize_row(ty, &src, &mut dst), wrong),
                    "quantize_row({}, {wrong} bytes)",
                    ty.name()
                );
            }
            assert!(
                bad_len(dequantize_row(ty, &dst, &mut out), wrong),
                "dequantize_row({}, {wrong} bytes)",
                ty.name()
            );
            let good = vec![0u8; bytes];
            let got = vec_dot(ty, n, &dst, &good);
            assert!(
                matches!(got, Err(QuantError::BadLength { got, .. }) if got == wrong),
                "vec_dot({}, x of {wrong} bytes): {got:?}",
                ty.name()
            );
        }
        // The activation row must be the act type's size, not the weight type's.
        let act = act_type(ty).unwrap();
        let act_bytes = n / act.block_size() * act.type_size();
        let x = vec![0u8; bytes];
        let y = vec![0u8; act_bytes + 1];
        assert!(
            matches!(vec_dot(ty, n, &x, &y), Err(QuantError::BadLength { ty: t, .. }) if t == act),
            "vec_dot({}) with a bad activation row",
            ty.name()
        );
    }
}

#[test]
fn bad_tensor_shapes_are_errors() {
    let src = vec![1f32; 100];
    assert!(matches!(
        quantize_tensor(GgmlType::Q8_0, &src, 0, None),
        Err(QuantError::BadShape { .. })
    ));
    assert!(matches!(
        quantize_tensor(GgmlType::Q8_0, &src, 64, None),
        Err(QuantError::BadShape {
            len: 100,
            n_per_row: 64
        })
    ));
    // An empty tensor is zero rows, not an error.
    assert_eq!(
        quantize_tensor(GgmlType::Q8_0, &[], 32, Some(2)),
        Ok(Vec::new())
    );
}
