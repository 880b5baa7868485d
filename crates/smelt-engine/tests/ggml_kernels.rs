//! The CPU backend's matmul against ggml's own kernels (libggml-cpu of llama-cpp-python
//! 0.3.36, called through ctypes by `tests/oracle/ggml_dot.py`): the quantized activations
//! byte for byte and every output bit for bit, for the weight formats of the test models.

mod common;

use rand::{Rng, SeedableRng};
use smelt_engine::backend::cpu::matmul::matmul;
use smelt_quant::GgmlType;

/// Our activation quantization of one row to `act` (ggml's `vec_dot_type`), as bytes.
fn quantize_act(act: GgmlType, x: &[f32]) -> Vec<u8> {
    use smelt_engine::backend::cpu::act_quant::quantize_act as q;
    use smelt_quant::{kquants::BlockQ8K, legacy::*};
    fn go<A: smelt_quant::Block + smelt_quant::Quantize>(x: &[f32]) -> Vec<u8> {
        let mut b = vec![<A as bytemuck::Zeroable>::zeroed(); x.len() / A::WEIGHTS];
        q::<A>(x, &mut b);
        bytemuck::cast_slice(&b).to_vec()
    }
    match act {
        GgmlType::Q8_0 => go::<BlockQ8_0>(x),
        GgmlType::Q8_1 => go::<BlockQ8_1>(x),
        GgmlType::Q8_K => go::<BlockQ8K>(x),
        _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Random weights in `ty` and activations with a spread of magnitudes (and a few exact
/// zeros), through both our matmul and ggml's vec_dot.
fn check(ty: GgmlType, cols: usize, rows: usize, n_tok: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rb = ty.type_size() * cols / ty.block_size();
    let mut w = vec![0u8; rows * rb];
    for r in 0..rows {
        let scale = rng.gen_range(0.01f32..2.0);
        let wf: Vec<f32> = (0..cols).map(|_| rng.gen_range(-scale..scale)).collect();
        smelt_quant::quantize_row(ty, &wf, &mut w[r * rb..(r + 1) * rb]).unwrap();
    }
    let x: Vec<f32> = (0..n_tok * cols)
        .map(|i| {
            let mag = [0.01f32, 1.0, 30.0][(i / 97) % 3];
            if i % 211 == 0 {
                0.0
            } else {
                rng.gen_range(-mag..mag)
            }
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("w.bin"), &w).unwrap();
    std::fs::write(dir.path().join("x.bin"), bytes).unwrap();
    common::run_oracle(
        "ggml_dot.py",
        &[
            &(ty as u32).to_string(),
            &cols.to_string(),
            &rows.to_string(),
            dir.path().to_str().unwrap(),
        ],
    );
    let want: Vec<f32> = std::fs::read(dir.path().join("out.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), n_tok * rows);
    let act = smelt_quant::act_type(ty).unwrap();
    let ab = act.type_size() * cols / act.block_size();
    let xq_want = std::fs::read(dir.path().join("xq.bin")).unwrap();
    for t in 0..n_tok {
        let ours = quantize_act(act, &x[t * cols..(t + 1) * cols]);
        assert!(
            ours == xq_want[t * ab..(t + 1) * ab],
            "{ty}: token {t}'s {act} activations differ from ggml's"
        );
    }
    // One token at a time (decode) and all at once (the batched path).
    let mut all = vec![0f32; n_tok * rows];
    matmul(ty, &w, rows, cols, cols, &x, &mut all).unwrap();
    let mut one = vec![0f32; rows];
    let mut bad = Vec::new();
    for t in 0..n_tok {
        matmul(
            ty,
            &w,
            rows,
            cols,
            cols,
            &x[t * cols..(t + 1) * cols],
            &mut one,
        )
        .unwrap();
        for r in 0..rows {
            let g = want[t * rows + r];
            if one[r].to_bits() != g.to_bits() || all[t * rows + r].to_bits() != g.to_bits() {
                bad.push((t, r, one[r], all[t * rows + r], g));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{ty} {cols}x{rows}: {} of {} outputs differ from ggml (token, row, ours 1-token, ours batched, ggml): {:?}",
        bad.len(),
        n_tok * rows,
        &bad[..bad.len().min(8)]
    );
}

#[test]
fn q4_1_matches_ggml_bit_for_bit() {
    check(GgmlType::Q4_1, 576, 24, 3, 1);
    check(GgmlType::Q4_1, 1536, 16, 2, 2);
}

#[test]
fn q8_0_matches_ggml_bit_for_bit() {
    check(GgmlType::Q8_0, 576, 24, 3, 3);
    check(GgmlType::Q8_0, 640, 16, 2, 4);
}

#[test]
fn q5_0_matches_ggml_bit_for_bit() {
    check(GgmlType::Q5_0, 640, 24, 1, 5);
}

#[test]
fn q6_k_matches_ggml_bit_for_bit() {
    check(GgmlType::Q6_K, 2048, 24, 1, 6);
}
