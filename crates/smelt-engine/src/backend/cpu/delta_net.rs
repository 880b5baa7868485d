//! Gated DeltaNet on the CPU (the linear-attention layers of Qwen3-Next and Qwen3.5/3.6),
//! in llama.cpp's formulation (`src/models/delta-net-base.cpp`, ggml's `ssm_conv` and
//! `gated_delta_net` ops), written as plain functions over one sequence so the model code,
//! the GPU kernels' parity tests and the chunked/recurrent check share them:
//!
//! - [`conv1d`]: the causal depthwise convolution over the new tokens and the sequence's
//!   window of the last `kernel - 1` inputs, which it then advances;
//! - [`l2_norm`]: the q/k normalisation (`rms_norm(x, eps / n) / sqrt(n)`);
//! - [`delta_rule`]: the recurrence, token by token (decode, and ggml's CPU op for prompts);
//! - [`delta_rule_chunked`]: the same in chunks of [`CHUNK`] tokens (prompts), exact to the
//!   recurrence within float rounding;
//! - [`gated_rms_norm`]: the output norm, `rms_norm(o) * w * silu(z)` per value head.
//!
//! The state of one value head is `S_v x S_v`, stored as ggml stores it: row `j` (a value
//! dimension) holds `S[.][j]` over the key dimensions. Value head `h` reads key/query head
//! `h % h_k` (Qwen3.5: ggml broadcasts by tiling, converters order the heads for it) or
//! `h / (h_v / h_k)` (Qwen3-Next's repeat-interleave), as [`DeltaShape::key_head`] says.

use super::ggml_math;

/// Tokens per chunk of the chunked form (llama.cpp's `CS` for scalar gates).
pub const CHUNK: usize = 64;

/// Heads and head size of one delta-net layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    /// Size of a key/query/value head (`ssm.state_size`).
    pub s: usize,
    /// Key/query heads (`ssm.group_count`).
    pub h_k: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of `h_k`.
    pub h_v: usize,
    /// Value head `h` reads key head `h / (h_v / h_k)` (else `h % h_k`).
    pub grouped: bool,
}

impl DeltaShape {
    /// Floats of one sequence's recurrent state.
    pub fn state_len(&self) -> usize {
        self.h_v * self.s * self.s
    }

    /// The key/query head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.grouped {
            h / (self.h_v / self.h_k)
        } else {
            h % self.h_k
        }
    }
}

/// Causal depthwise convolution (ggml `ssm_conv`) of `n` new rows of `x` (`[n][ch]`) with
/// kernel `w` (`[ch][kernel]`, oldest tap first), the sequence's previous `kernel - 1`
/// inputs in `window` (`[kernel - 1][ch]`, oldest first); writes `out` (`[n][ch]`) and
/// leaves the last `kernel - 1` inputs in `window`.
pub fn conv1d(x: &[f32], window: &mut [f32], w: &[f32], kernel: usize, ch: usize, out: &mut [f32]) {
    let n = x.len() / ch;
    let past = kernel - 1;
    // The window followed by the new rows: what ggml concatenates.
    let mut all = Vec::with_capacity((past + n) * ch);
    all.extend_from_slice(&window[..past * ch]);
    all.extend_from_slice(&x[..n * ch]);
    for t in 0..n {
        for c in 0..ch {
            let mut sum = 0f32;
            for i in 0..kernel {
                sum = all[(t + i) * ch + c].mul_add(w[c * kernel + i], sum);
            }
            out[t * ch + c] = sum;
        }
    }
    window[..past * ch].copy_from_slice(&all[n * ch..(n + past) * ch]);
}

/// `x / sqrt(sum x^2 + eps)` over each `width`-long run of `x`, as llama.cpp writes it:
/// `rms_norm(x, eps / width)` (sum in f64) then times `1 / sqrt(width)`.
pub fn l2_norm(x: &mut [f32], width: usize, eps: f32) {
    let inv = 1.0 / (width as f32).sqrt();
    for r in x.chunks_mut(width) {
        let sum: f64 = r.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / width as f64) as f32;
        let scale = 1.0 / (mean + eps / width as f32).sqrt();
        r.iter_mut().for_each(|v| *v = (*v * scale) * inv);
    }
}

/// `o = rms_norm(o) * w * silu(z)` over each value head (`w.len()` wide).
pub fn gated_rms_norm(o: &mut [f32], w: &[f32], z: &[f32], eps: f32) {
    let n = w.len();
    for (r, z) in o.chunks_mut(n).zip(z.chunks(n)) {
        let sum: f64 = r.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((v, &w), &z) in r.iter_mut().zip(w).zip(z) {
            *v = ((*v * scale) * w) * (z / (1.0 + (-z).exp()));
        }
    }
}

/// The gated delta rule over `n` tokens, one at a time (ggml's `gated_delta_net` CPU op):
/// for each value head, `S *= exp(g)`, `d = (v - S^T k) * beta`, `S += k d^T`,
/// `o = (S^T q) / sqrt(s)`. `q`, `k`: `[n][h_k][s]` (already L2-normed); `v`, `out`:
/// `[n][h_v][s]`; `g`, `beta`: `[n][h_v]`; `state`: `[h_v][s][s]`, advanced.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    sh: DeltaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let (s, hk, hv) = (sh.s, sh.h_k, sh.h_v);
    let n = g.len() / hv;
    let scale = 1.0 / (s as f32).sqrt();
    let mut delta = vec![0f32; s];
    for h in 0..hv {
        let m = &mut state[h * s * s..(h + 1) * s * s];
        let kh = sh.key_head(h);
        for t in 0..n {
            let qd = &q[(t * hk + kh) * s..][..s];
            let kd = &k[(t * hk + kh) * s..][..s];
            let vd = &v[(t * hv + h) * s..][..s];
            let decay = g[t * hv + h].exp();
            let b = beta[t * hv + h];
            m.iter_mut().for_each(|x| *x *= decay);
            for j in 0..s {
                let dot = ggml_math::dot_vec_f32(&m[j * s..(j + 1) * s], kd);
                delta[j] = (vd[j] - dot) * b;
            }
            for j in 0..s {
                let row = &mut m[j * s..(j + 1) * s];
                for (x, &ki) in row.iter_mut().zip(kd) {
                    *x = ki.mul_add(delta[j], *x);
                }
            }
            let o = &mut out[(t * hv + h) * s..][..s];
            for j in 0..s {
                o[j] = ggml_math::dot_vec_f32(&m[j * s..(j + 1) * s], qd) * scale;
            }
        }
    }
}

/// [`delta_rule`] in chunks of [`CHUNK`] tokens (the prompt form): within a chunk the
/// tokens' mutual updates are one triangular solve, and the state is read and written once
/// per chunk. With `G_t` the gates' running sum in the chunk, `kb = k * beta`:
/// `A = (I + tril_strict(kb k^T * e^(G_t - G_s)))^-1`, `u = A (v * beta)`,
/// `w = A (kb * e^G)`, `v' = u - w S`, `o = ((q e^G) S + tril(q k^T e^(G_t - G_s)) v') / sqrt(s)`,
/// `S = e^(G_last) S + (k e^(G_last - G))^T v'`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_chunked(
    sh: DeltaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let (s, hk, hv) = (sh.s, sh.h_k, sh.h_v);
    let n = g.len() / hv;
    let scale = 1.0 / (s as f32).sqrt();
    for h in 0..hv {
        let kh = sh.key_head(h);
        // This head's state as S[i][j] (key i, value j), f32.
        let m = &mut state[h * s * s..(h + 1) * s * s];
        for c0 in (0..n).step_by(CHUNK) {
            let c = CHUNK.min(n - c0);
            let row = |x: &[f32], heads: usize, hh: usize, t: usize| -> Vec<f32> {
                x[((c0 + t) * heads + hh) * s..][..s].to_vec()
            };
            let qs: Vec<Vec<f32>> = (0..c).map(|t| row(q, hk, kh, t)).collect();
            let ks: Vec<Vec<f32>> = (0..c).map(|t| row(k, hk, kh, t)).collect();
            let vs: Vec<Vec<f32>> = (0..c).map(|t| row(v, hv, h, t)).collect();
            let bs: Vec<f32> = (0..c).map(|t| beta[(c0 + t) * hv + h]).collect();
            let mut gc = vec![0f32; c];
            let mut acc = 0f32;
            for t in 0..c {
                acc += g[(c0 + t) * hv + h];
                gc[t] = acc;
            }
            let dot = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
            // L[t][s'] for s' < t, then A = (I + L)^-1 by forward substitution, row by row.
            let mut a = vec![0f32; c * c];
            for t in 0..c {
                a[t * c + t] = 1.0;
                for u in 0..t {
                    let l = dot(&ks[t], &ks[u]) * bs[t] * (gc[t] - gc[u]).exp();
                    // row t of A = e_t - sum_{u<t} L[t][u] * row u of A
                    for x in 0..=u {
                        a[t * c + x] -= l * a[u * c + x];
                    }
                }
            }
            // u = A (v * beta), w = A (k * beta * e^G)
            let mut un = vec![vec![0f32; s]; c];
            let mut wn = vec![vec![0f32; s]; c];
            for t in 0..c {
                for x in 0..=t {
                    let at = a[t * c + x];
                    if at == 0.0 {
                        continue;
                    }
                    let fb = at * bs[x];
                    let fw = fb * gc[x].exp();
                    for i in 0..s {
                        un[t][i] += fb * vs[x][i];
                        wn[t][i] += fw * ks[x][i];
                    }
                }
            }
            // v' = u - w S  (S[i][j] = m[j * s + i])
            let mut vn = un;
            for t in 0..c {
                for j in 0..s {
                    let ws: f32 = (0..s).map(|i| wn[t][i] * m[j * s + i]).sum();
                    vn[t][j] -= ws;
                }
            }
            // Outputs.
            for t in 0..c {
                let o = &mut out[((c0 + t) * hv + h) * s..][..s];
                let eg = gc[t].exp();
                for j in 0..s {
                    let inter: f32 = (0..s).map(|i| qs[t][i] * m[j * s + i]).sum::<f32>() * eg;
                    let mut intra = 0f32;
                    for x in 0..=t {
                        intra += dot(&qs[t], &ks[x]) * (gc[t] - gc[x]).exp() * vn[x][j];
                    }
                    o[j] = (inter + intra) * scale;
                }
            }
            // State to the chunk's end.
            let last = gc[c - 1];
            let el = last.exp();
            for j in 0..s {
                for i in 0..s {
                    let mut add = 0f32;
                    for x in 0..c {
                        add += ks[x][i] * (last - gc[x]).exp() * vn[x][j];
                    }
                    m[j * s + i] = m[j * s + i] * el + add;
                }
            }
        }
    }
}

/// `ggml_vec_silu_f32` over one row: whole chunks of 16 through the vector exp, the rest
/// through libm's.
pub fn silu_row(x: &mut [f32]) {
    let whole = x.len() - x.len() % 16;
    for v in &mut x[..whole] {
        *v = ggml_math::silu(*v);
    }
    for v in &mut x[whole..] {
        *v = *v / (1.0 + (-*v).exp());
    }
}

/// The inputs of one sequence's tokens in one delta-net layer, rows of the batch.
pub struct SeqInputs<'a> {
    /// `[n, channels]`: the q, k, v projection before the convolution.
    pub qkv: &'a [f32],
    /// `[n, n_v_heads * head_dim]`: the output gate.
    pub z: &'a [f32],
    /// `[n, n_v_heads]`: gate and update logits.
    pub alpha: &'a [f32],
    pub beta: &'a [f32],
}

/// The small weights, as f32.
pub struct LayerWeights<'a> {
    pub conv: &'a [f32],
    pub dt_bias: &'a [f32],
    pub a: &'a [f32],
    pub norm: &'a [f32],
}

/// One sequence through a delta-net layer between its projections (see
/// `Backend::delta_net`): `window` and `state` advance, `out` gets `[n, n_v_heads *
/// head_dim]`. One token takes the recurrence, more the chunked form (the recurrence
/// whatever the count with `invariant`: the two agree within rounding only).
pub fn layer(
    p: &crate::backend::DeltaParams,
    w: &LayerWeights<'_>,
    x: &SeqInputs<'_>,
    (window, state): (&mut [f32], &mut [f32]),
    invariant: bool,
    out: &mut [f32],
) {
    let sh = DeltaShape {
        s: p.head_dim,
        h_k: p.n_k_heads,
        h_v: p.n_v_heads,
        grouped: p.grouped_heads,
    };
    let ch = (2 * sh.h_k + sh.h_v) * sh.s;
    let n = x.qkv.len() / ch;
    let mut conv = vec![0f32; n * ch];
    conv1d(x.qkv, window, w.conv, p.conv_kernel, ch, &mut conv);
    conv.chunks_mut(ch).for_each(silu_row);
    let (kw, vw) = (sh.h_k * sh.s, sh.h_v * sh.s);
    let mut q = Vec::with_capacity(n * kw);
    let mut k = Vec::with_capacity(n * kw);
    let mut v = Vec::with_capacity(n * vw);
    for r in conv.chunks(ch) {
        q.extend_from_slice(&r[..kw]);
        k.extend_from_slice(&r[kw..2 * kw]);
        v.extend_from_slice(&r[2 * kw..]);
    }
    l2_norm(&mut q, sh.s, p.eps);
    l2_norm(&mut k, sh.s, p.eps);
    let g: Vec<f32> = x
        .alpha
        .chunks(sh.h_v)
        .flat_map(|r| {
            r.iter().enumerate().map(|(h, &a)| {
                let b = a + w.dt_bias[h];
                let sp = if b > 20.0 { b } else { (1.0 + b.exp()).ln() };
                sp * w.a[h]
            })
        })
        .collect();
    let beta: Vec<f32> = x.beta.iter().map(|&b| 1.0 / (1.0 + (-b).exp())).collect();
    if n == 1 || invariant {
        delta_rule(sh, &q, &k, &v, &g, &beta, state, out);
    } else {
        delta_rule_chunked(sh, &q, &k, &v, &g, &beta, state, out);
    }
    gated_rms_norm(out, w.norm, x.z, p.eps);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: &mut u64, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amp
            })
            .collect()
    }

    /// Inputs as a model makes them: L2-normed q/k, gates <= 0, beta in (0, 1).
    fn inputs(sh: DeltaShape, n: usize, seed: &mut u64) -> [Vec<f32>; 5] {
        let mut q = rand(n * sh.h_k * sh.s, seed, 1.0);
        let mut k = rand(n * sh.h_k * sh.s, seed, 1.0);
        l2_norm(&mut q, sh.s, 1e-6);
        l2_norm(&mut k, sh.s, 1e-6);
        let v = rand(n * sh.h_v * sh.s, seed, 1.0);
        let g: Vec<f32> = rand(n * sh.h_v, seed, 1.0)
            .iter()
            .map(|x| -0.3 * (1.0 + x.exp()).ln())
            .collect();
        let beta: Vec<f32> = rand(n * sh.h_v, seed, 3.0)
            .iter()
            .map(|x| 1.0 / (1.0 + (-x).exp()))
            .collect();
        [q, k, v, g, beta]
    }

    /// The chunked form equals the recurrence within float rounding, across chunk edges
    /// (a ragged last chunk), with more value heads than key heads (both head mappings),
    /// from a non-zero state.
    #[test]
    fn chunked_equals_recurrent() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (n, grouped) in [(1, false), (7, true), (64, false), (65, true), (150, false)] {
            let sh = DeltaShape {
                s: 16,
                h_k: 2,
                h_v: 4,
                grouped,
            };
            let [q, k, v, g, beta] = inputs(sh, n, &mut seed);
            let s0 = rand(sh.state_len(), &mut seed, 0.5);
            let (mut sa, mut sb) = (s0.clone(), s0.clone());
            let mut oa = vec![0f32; n * sh.h_v * sh.s];
            let mut ob = oa.clone();
            delta_rule(sh, &q, &k, &v, &g, &beta, &mut sa, &mut oa);
            delta_rule_chunked(sh, &q, &k, &v, &g, &beta, &mut sb, &mut ob);
            let worst = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs() / (1.0 + x.abs()))
                    .fold(0f32, f32::max)
            };
            assert!(
                worst(&oa, &ob) < 2e-5,
                "{n} tokens: outputs {}",
                worst(&oa, &ob)
            );
            assert!(
                worst(&sa, &sb) < 2e-5,
                "{n} tokens: states {}",
                worst(&sa, &sb)
            );
        }
    }

    /// The convolution over a whole prompt equals it one token at a time, and leaves the
    /// same window.
    #[test]
    fn conv_prompt_equals_steps() {
        let (kernel, ch, n) = (4, 6, 9);
        let mut seed = 99u64;
        let x = rand(n * ch, &mut seed, 1.0);
        let w = rand(ch * kernel, &mut seed, 1.0);
        let w0 = rand((kernel - 1) * ch, &mut seed, 1.0);
        let (mut wa, mut wb) = (w0.clone(), w0.clone());
        let mut all = vec![0f32; n * ch];
        conv1d(&x, &mut wa, &w, kernel, ch, &mut all);
        for t in 0..n {
            let mut one = vec![0f32; ch];
            conv1d(&x[t * ch..(t + 1) * ch], &mut wb, &w, kernel, ch, &mut one);
            assert_eq!(one, all[t * ch..(t + 1) * ch], "token {t}");
        }
        assert_eq!(wa, wb);
        // Token 0 sees the window's three rows then itself.
        let c = 2;
        let want = (0..kernel).fold(0f32, |acc, i| {
            let xi = if i < kernel - 1 { w0[i * ch + c] } else { x[c] };
            xi.mul_add(w[c * kernel + i], acc)
        });
        assert_eq!(all[c], want);
    }

    #[test]
    fn l2_norm_gives_unit_rows() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        l2_norm(&mut x, 4, 1e-6);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
        assert!((x[4] - 0.5).abs() < 1e-6);
    }
}
