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
    check_mode(ty, cols, rows, n_tok, seed, false)
}

/// `repack`: ggml's answer comes from a mul_mat graph with the weight in the CPU_REPACK
/// buffer (all `n_tok` tokens at once, as a prefill), not from `vec_dot` per token.
fn check_mode(ty: GgmlType, cols: usize, rows: usize, n_tok: usize, seed: u64, repack: bool) {
    check_graph(
        ty,
        cols,
        rows,
        n_tok,
        seed,
        if repack { Some("repack") } else { None },
    )
}

/// `graph`: ggml's answer comes from a real mul_mat graph over all `n_tok` tokens at once
/// (a prefill), with the weight in plain memory (`"plain"`) or the CPU_REPACK buffer
/// (`"repack"`), instead of `vec_dot` per token.
fn check_graph(
    ty: GgmlType,
    cols: usize,
    rows: usize,
    n_tok: usize,
    seed: u64,
    graph: Option<&str>,
) {
    let repack = graph.is_some();
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
    let (ty_id, cols_s, rows_s) = ((ty as u32).to_string(), cols.to_string(), rows.to_string());
    let mut args = vec![
        ty_id.as_str(),
        cols_s.as_str(),
        rows_s.as_str(),
        dir.path().to_str().unwrap(),
    ];
    if let Some(g) = graph {
        args.push(g);
    }
    common::recorded("ggml_dot.py", &args, smelt_oracle::Keep::Small);
    let want: Vec<f32> = std::fs::read(dir.path().join("out.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), n_tok * rows);
    let act = smelt_quant::act_type(ty).unwrap();
    let ab = act.type_size() * cols / act.block_size();
    let xq_want = std::fs::read(dir.path().join("xq.bin")).unwrap_or_default();
    for t in 0..if repack { 0 } else { n_tok } {
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
            // A repacked batch is one call: its tokens are only comparable as a batch.
            let one_ok = repack || one[r].to_bits() == g.to_bits();
            if !one_ok || all[t * rows + r].to_bits() != g.to_bits() {
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

/// Q4_K as llama.cpp runs it on x86: repacked, gemm for each group of four tokens and gemv
/// for the rest (7 tokens: one group and three singles), and gemv alone for one token.
#[test]
fn q4_k_matches_ggml_repacked_gemm_and_gemv() {
    check_mode(GgmlType::Q4_K, 1024, 32, 7, 7, true);
    check_mode(GgmlType::Q4_K, 2048, 16, 1, 8, true);
    check_mode(GgmlType::Q4_K, 256, 8, 4, 9, true);
}

/// A prefill through ggml's own mul_mat (tinyBLAS takes Q8_0/Q5_0 batches; K-quants go
/// through vec_dot row by row).
#[test]
fn batches_match_ggml_mul_mat() {
    check_graph(GgmlType::Q6_K, 2048, 16, 14, 10, Some("plain"));
    check_graph(GgmlType::Q5_0, 640, 16, 14, 11, Some("plain"));
    check_graph(GgmlType::Q8_0, 640, 16, 9, 12, Some("plain"));
    check_graph(GgmlType::Q4_1, 576, 16, 9, 13, Some("plain"));
}
