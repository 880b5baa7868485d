//! The CPU half of every registered op at one tiny ragged shape: its inputs built by the
//! same helpers its GPU check uses and its CPU twins run on them, so CI (no GPU) sees a
//! case whose construction or twin breaks (`tests/gpu_ops_registry.rs` runs each op's
//! [`run`]). Each returns how many reference values it computed; an op with no entry here
//! is an error, so a new registered op needs one.

use anyhow::{bail, ensure, Result};
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::delta_net as dn;
use smelt_kernels::gemm::{self, f16 as gemm_f16, grouped};
use smelt_kernels::ops::{attention, elementwise, embed, kv, norm, rope, sample};
use smelt_kernels::quantize::{self, Input};
use smelt_kernels::{act, catalog, fused, gemv, GgmlType};

use super::attention::{f16_bits, paged};
use super::harness::{floats, random_floats, random_weights};

/// Every value finite: a twin that returns NaN or infinity for finite inputs is broken.
fn finite(v: &[f32]) -> Result<usize> {
    ensure!(
        v.iter().all(|x| x.is_finite()),
        "a twin returned a non-finite value"
    );
    Ok(v.len())
}

/// A GEMV/GEMM twin on a 3 x 256 Q4_K/Q8_0 weight and two q8_1 token rows.
fn matmul(rng: &mut StdRng, gemm_twin: bool) -> Result<usize> {
    let mut n = 0;
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let (rows, k, ntok) = (3, 256, 2);
        let ggml = random_weights(rng, ty, rows, k)?;
        let packed = catalog::repack(ty, &ggml, rows, k)?;
        ensure!(packed.len() == rows * catalog::row_bytes(ty, k)?);
        let x = random_floats(rng, k * ntok, 2.0);
        let (want, mag) = if gemm_twin {
            let q = if gemm::reads_q8_1_tiles(ty) {
                act::quantize_cpu(&x, k)?
            } else {
                gemm::act::quantize_cpu(&x, k)?
            };
            gemm::cpu_with_magnitude(ty, &ggml, rows, k, &q, ntok)?
        } else {
            gemv::cpu_with_magnitude(ty, &ggml, rows, k, &act::quantize_cpu(&x, k)?, ntok)?
        };
        ensure!(want.len() == rows * ntok && mag.iter().all(|m| *m >= 0.0));
        n += finite(&want)?;
    }
    Ok(n)
}

/// The CPU half of op `op` (a `Case::op`) at a tiny shape.
pub fn run(op: &str, rng: &mut StdRng) -> Result<usize> {
    match op {
        "quantize_q8_1" => {
            let x = random_floats(rng, 3 * 288, 4.0);
            let q = act::quantize_cpu(&x, 288)?;
            ensure!(q.len() == 3 * act::row_bytes(288)?);
            Ok(q.len())
        }
        "gemv" | "gemv_tune" | "gemv_resnorm" => matmul(rng, false),
        "gemm" | "gemm_variants" => matmul(rng, true),
        "gemv_rope_kv" | "rope_kv_rows" => {
            let (n_head, n_head_kv, hd, bs) = (4, 2, 64, 16);
            let (q_rows, kv_dim) = (n_head * hd, n_head_kv * hd);
            let (mut q, mut k) = (floats(rng, 2 * q_rows, 1.0), floats(rng, 2 * kv_dim, 1.0));
            let v = floats(rng, 2 * kv_dim, 1.0);
            let tables = vec![2u32, 0, 3, 1];
            let (mut kc, mut vc) = (vec![0u16; 4 * bs * kv_dim], vec![0u16; 4 * bs * kv_dim]);
            let desc = kv::SeqDesc {
                row: 0,
                n_tokens: 2,
                start_pos: 37,
                block_table_offset: 0,
            };
            rope::rope_kv_rows_cpu(
                &mut q,
                &mut k,
                &v,
                &[37, 38],
                &mut kc,
                &mut vc,
                &[desc],
                &tables,
                (n_head, n_head_kv, hd, bs),
                rope::RopeStyle::Normal,
                (500000.0, 1.0),
                None,
            );
            finite(&[q, k].concat())
        }
        "gemm_f16" => {
            let (ty, rows, k, ntok) = (GgmlType::Q4_K, 5, 512, 3);
            let ggml = random_weights(rng, ty, rows, k)?;
            let x = random_floats(rng, k * ntok, 2.0);
            let h = gemm_f16::act_cpu(&x, k)?;
            let (want, _) = gemm_f16::cpu_with_magnitude(ty, &ggml, rows, k, &h, ntok)?;
            finite(&want)
        }
        "norm" | "norm_q8" => {
            let (rows, n) = (3, 800);
            let (x, y, w) = (
                floats(rng, rows * n, 3.0),
                floats(rng, rows * n, 1.0),
                floats(rng, n, 1.5),
            );
            let mut out = vec![0f32; rows * n];
            norm::rms_norm_cpu(&x, &w, 1e-6, &mut out);
            let mut xw = x.clone();
            let (o2, q) = fused::cpu(&mut xw, Some(&y), &w, 1e-6)?;
            ensure!(q.len() == rows * fused::q_row_bytes(n)?);
            Ok(finite(&out)? + finite(&o2)?)
        }
        "rope" => {
            let (rows, heads, hd) = (2, 3, 80);
            let mut x = floats(rng, rows * heads * hd, 2.0);
            let pos = vec![131_000u32, 5];
            let ff: Vec<f32> = (0..16).map(|i| 1.0 + (i % 7) as f32).collect();
            rope::rope_cpu(
                &mut x,
                &pos,
                heads * hd,
                hd,
                32,
                rope::RopeStyle::Neox,
                10000.0,
                0.5,
                Some(&ff),
            );
            finite(&x)
        }
        "glu_q8" | "elementwise" => {
            let (mut g, u) = (floats(rng, 2 * 288, 12.0), floats(rng, 2 * 288, 2.0));
            elementwise::glu_cpu(&mut g, &u, elementwise::Glu::Gelu);
            let q = act::quantize_cpu(&g, 288)?;
            let mut x = floats(rng, 33, 1.0);
            elementwise::add_cpu(&mut x, &floats(rng, 33, 1.0));
            elementwise::scale_cpu(&mut x, 0.5);
            Ok(finite(&g)? + q.len() + finite(&x)?)
        }
        "attention_reduce_q8" | "attention" | "attention_prompt" => {
            // Two sequences crossing block boundaries (block size 5), GQA, a window.
            let (n_head, n_head_kv, hd, bs) = (4, 2, 80, 5);
            let p = paged(rng, &[(7, 1), (3, 4)], bs);
            let kv_dim = n_head_kv * hd;
            let cache = p.n_blocks * bs * kv_dim;
            let (mut kc, mut vc) = (f16_bits(rng, cache), f16_bits(rng, cache));
            let (knew, vnew) = (
                floats(rng, p.rows * kv_dim, 1.0),
                floats(rng, p.rows * kv_dim, 1.0),
            );
            kv::kv_append_cpu(
                &knew, &vnew, &mut kc, &mut vc, &p.seqs, &p.tables, kv_dim, bs,
            );
            let q = floats(rng, p.rows * n_head * hd, 1.0);
            let s = attention::AttnShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                block_size: bs,
                window: 4,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let mut out = vec![f32::NAN; p.rows * n_head * hd];
            attention::attention_cpu(&q, &kc, &vc, &p.seqs, &p.tables, &s, &mut out);
            let tiles = act::quantize_cpu(&out, n_head * hd)?;
            Ok(finite(&out)? + tiles.len())
        }
        "embed" => {
            let (ty, rows, cols) = (GgmlType::Q4_0, 7, 96);
            let x = floats(rng, rows * cols, 2.0);
            let rb = embed::row_bytes(ty, cols)?;
            let mut t = vec![0u8; rows * rb];
            for (src, dst) in x.chunks(cols).zip(t.chunks_mut(rb)) {
                smelt_quant::quantize_row(ty, src, dst)?;
            }
            let e = embed::embed_cpu(ty, &t, rows, cols, &[6, 0, 3])?;
            let d = embed::dequantize_cpu(ty, &t, rows, cols)?;
            Ok(finite(&e)? + finite(&d)?)
        }
        "argmax_softmax" | "sample" => {
            let (rows, cols) = (3, 1000);
            let x = floats(rng, rows * cols, 8.0);
            let ids = sample::argmax_cpu(&x, cols);
            let mut sm = vec![0f32; rows * cols];
            sample::softmax_cpu(&x, cols, &mut sm);
            let p = sample::SampleParams {
                top_k: 40,
                top_p: 0.9,
                temperature: 0.7,
                uniform: rng.gen(),
            };
            let (t, _) = sample::sample_cpu(&x[..cols], &p);
            ensure!(ids.iter().all(|&i| (i as usize) < cols) && (t as usize) < cols);
            finite(&sm)
        }
        "delta" => {
            let (s, hk, hv) = (64, 1, 2);
            let ch = 40;
            let mut win = floats(rng, (dn::CONV_TAPS - 1) * ch, 1.0);
            let conv = dn::conv1d_cpu(
                &floats(rng, 3 * ch, 1.0),
                &mut win,
                &floats(rng, dn::CONV_TAPS * ch, 1.0),
                ch,
            );
            let mut qk = floats(rng, 2 * hk * s, 1.0);
            dn::l2_norm_cpu(&mut qk, s, 1e-6);
            let mut state = vec![0f32; hv * s * s];
            let o = dn::step_cpu(
                s,
                hk,
                false,
                &qk[..s],
                &qk[s..],
                &floats(rng, hv * s, 1.0),
                &floats(rng, hv, 1.0),
                &floats(rng, hv, 1.0),
                &floats(rng, hv, 1.0),
                &[-0.5; 2],
                &mut state,
            );
            let mut g = o.clone();
            dn::gated_norm_cpu(
                &mut g,
                &floats(rng, s, 1.0),
                &floats(rng, hv * s, 1.0),
                1e-6,
            );
            let cols = dn::gather_cols_cpu(&g, s, &[3, 0, 63]);
            let (a, b) = dn::split_halves_cpu(&g, 32);
            let mut m = a.clone();
            dn::mul_sigmoid_cpu(&mut m, &b, 32, false);
            Ok(finite(&conv)?
                + finite(&o)?
                + finite(&g)?
                + cols.len()
                + finite(&m)?
                + finite(&state)?)
        }
        "isq_quantize" => {
            let mut n = 0;
            for input in Input::ALL {
                let x = floats(rng, 3 * 256, 1.0);
                let src = super::isq::to_input(&x, input);
                for ty in quantize::TYPES {
                    n += quantize::quantize_cpu(ty, input, &src, 256)?.len();
                }
            }
            Ok(n)
        }
        "repack" => {
            let mut n = 0;
            for ty in catalog::GEMV_TYPES {
                let cols = if ty.block_size() == 32 { 96 } else { 512 };
                let bytes = 3 * cols / ty.block_size() * ty.type_size();
                let ggml: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
                n += catalog::repack(ty, &ggml, 3, cols)?.len();
            }
            Ok(n)
        }
        "moe" => {
            // The grouped GEMM's twin: two experts of 3 x 256 Q4_K, three slots.
            let (ty, ne, rows, k) = (GgmlType::Q4_K, 2, 3, 256);
            let ggml = random_weights(rng, ty, ne * rows, k)?;
            let x = random_floats(rng, 3 * k, 1.0);
            let xh = gemm_f16::act_cpu(&x, k)?;
            let (want, _) =
                grouped::cpu_with_magnitude(ty, &ggml, ne, rows, k, &xh, &[1, 0, 1], 1)?;
            finite(&want)
        }
        "moefuse" => {
            // The fused router on a split-norm row (a partly padded tile), then the
            // combine + add + norm on its route.
            use smelt_kernels::moe::Gating;
            use smelt_kernels::moe_fused;
            let (ne, cols, k) = (12, 160, 3);
            let (w, x, g) = (
                floats(rng, ne * cols, 0.2),
                floats(rng, cols, 3.0),
                floats(rng, cols, 1.5),
            );
            let parts = gemv::residual_norm_partials(&x);
            let scale = gemv::rms_input_scale(&parts, cols, 1e-6) as f32;
            let input = moe_fused::RouterInput {
                w: &w,
                x: &x,
                norm: Some((&g, scale)),
                n_expert: ne,
            };
            let (route, h) = moe_fused::router_cpu(&input, Gating::Softmax, k, true, 1.0);
            ensure!(route.len() == 2 * k && route[..k].iter().all(|&i| i < ne as f32));
            let y = floats(rng, k * cols, 1.0);
            let mut xr = x.clone();
            let (out, q) = moe_fused::combine_norm_cpu(&mut xr, &y, &route, k, &g, 1e-6)?;
            ensure!(q.len() == act::row_bytes(cols)?);
            Ok(finite(&route)? + finite(&h)? + finite(&out)?)
        }
        _ => bail!("no tiny CPU case for op {op} (add one to examples/gpu_ops/tiny.rs)"),
    }
}
