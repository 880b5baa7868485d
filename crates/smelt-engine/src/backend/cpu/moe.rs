//! Mixture-of-experts ops on the CPU, in ggml's order so a MoE model's logits are
//! llama.cpp's bits: the router (`ggml_soft_max` or `ggml_sigmoid`, `ggml_argsort_top_k`,
//! `ggml_get_rows`, then `ggml_sum_rows` / `ggml_clamp` / `ggml_div` when the model
//! normalises, `ggml_scale` when it scales) and the weighted sum of the experts' outputs
//! (`ggml_mul` by the weights, then one `ggml_add` per expert in the router's order). The
//! expert matmuls themselves are [`super::matmul::matmul_id`].

use rayon::prelude::*;

use super::ggml_math;
use crate::backend::{Gating, MoeRouting};

/// ggml's `ggml_compute_forward_soft_max_f32` of one row (no mask, scale 1) into `y`:
/// the max, then `exp(x - max)` through the vector exp in whole chunks of 16 (each chunk's
/// sum reduced as `_mm512_reduce_add_ps` and added in f64) and libm's for the rest, then
/// every value times `(float)(1 / sum)`.
pub fn soft_max_row(x: &[f32], y: &mut [f32]) {
    let max = x
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let whole = x.len() - x.len() % 16;
    let mut sum = 0f64;
    for (xc, yc) in x[..whole]
        .chunks_exact(16)
        .zip(y[..whole].chunks_exact_mut(16))
    {
        let mut v = [0f32; 16];
        for l in 0..16 {
            v[l] = ggml_math::expf(xc[l] - max);
            yc[l] = v[l];
        }
        sum += ggml_math::reduce16(&v) as f64;
    }
    for (&x, y) in x[whole..].iter().zip(&mut y[whole..]) {
        let v = (x - max).exp();
        sum += v as f64;
        *y = v;
    }
    let inv = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= inv);
}

/// Routes each row of `logits` (`n_expert` wide) into `route` (`2k` wide per row: expert
/// ids as f32, most probable first, then their weights).
pub fn route(logits: &[f32], n_expert: usize, p: &MoeRouting, route: &mut [f32]) {
    let k = p.k;
    route
        .par_chunks_mut(2 * k)
        .zip(logits.par_chunks(n_expert))
        .for_each_init(
            || (vec![0f32; n_expert], Vec::with_capacity(n_expert)),
            |(probs, order), (out, x)| {
                match p.gating {
                    Gating::Softmax => soft_max_row(x, probs),
                    Gating::Sigmoid => {
                        for (p, &x) in probs.iter_mut().zip(x) {
                            *p = 1.0 / (1.0 + (-x).exp());
                        }
                    }
                }
                // ggml_argsort (descending, std::sort); equal probabilities, which ggml
                // orders as its sort happens to, go here by expert index.
                order.clear();
                order.extend(0..n_expert);
                order.sort_by(|&a: &usize, &b: &usize| {
                    probs[b].total_cmp(&probs[a]).then(a.cmp(&b))
                });
                let (ids, w) = out.split_at_mut(k);
                for i in 0..k {
                    ids[i] = order[i] as f32;
                    w[i] = probs[order[i]];
                }
                if p.norm {
                    // ggml_sum_rows (f64 accumulation), clamped to f16's smallest normal.
                    let sum: f64 = w.iter().map(|&v| v as f64).sum();
                    let sum = (sum as f32).clamp(6.103_515_6e-5, f32::INFINITY);
                    w.iter_mut().for_each(|v| *v /= sum);
                }
                if p.scale != 0.0 && p.scale != 1.0 {
                    w.iter_mut().for_each(|v| *v *= p.scale);
                }
            },
        );
}

/// `out[t] = sum_i w(t, i) * y[t*k + i]`: each product rounded, then added in the router's
/// order (`((y0 w0 + y1 w1) + y2 w2) + ...`).
pub fn combine(y: &[f32], route: &[f32], k: usize, out: &mut [f32]) {
    let cols = out.len() / (route.len() / (2 * k)).max(1);
    out.par_chunks_mut(cols)
        .zip(route.par_chunks(2 * k))
        .enumerate()
        .for_each(|(t, (o, r))| {
            let w = &r[k..];
            for (c, o) in o.iter_mut().enumerate() {
                let mut acc = y[(t * k) * cols + c] * w[0];
                for (i, &w) in w.iter().enumerate().skip(1) {
                    acc += y[(t * k + i) * cols + c] * w;
                }
                *o = acc;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The softmax sums to one, keeps the order of its inputs, and its vector chunks and
    /// libm tail agree closely (rows of 20: one chunk of 16 and a tail of 4).
    #[test]
    fn soft_max_is_a_distribution() {
        let x: Vec<f32> = (0..20)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 3.0)
            .collect();
        let mut y = vec![0f32; 20];
        soft_max_row(&x, &mut y);
        let s: f32 = y.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "{s}");
        let m = x.iter().cloned().fold(f32::MIN, f32::max);
        for (&a, &b) in x.iter().zip(&y) {
            let want = (a - m).exp() / x.iter().map(|&v| (v - m).exp()).sum::<f32>();
            assert!((b - want).abs() < 1e-6, "{b} vs {want}");
        }
    }

    /// Top-k picks the largest probabilities in descending order, normalises them to sum
    /// to one when asked, and the combine adds products in that order.
    #[test]
    fn route_and_combine() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 0.3, 1.9];
        let p = MoeRouting {
            gating: Gating::Softmax,
            k: 3,
            norm: true,
            scale: 0.0,
        };
        let mut r = vec![0f32; 6];
        route(&logits, 6, &p, &mut r);
        assert_eq!(&r[..3], &[1.0, 5.0, 3.0]);
        let s: f32 = r[3..].iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(r[3] > r[4] && r[4] > r[5]);
        let y = [1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0];
        let mut out = vec![0f32; 2];
        combine(&y, &r, 3, &mut out);
        let want0 = (1.0 * r[3] + 2.0 * r[4]) + 3.0 * r[5];
        assert_eq!(out[0], want0);
        let sig = MoeRouting {
            gating: Gating::Sigmoid,
            norm: false,
            scale: 2.0,
            ..p
        };
        route(&logits, 6, &sig, &mut r);
        assert_eq!(r[0], 1.0);
        assert!((r[3] - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    }
}
