//! The op kernels' CPU twins against the engine's CPU backend, the numerics they stand
//! for: equal where the twin follows the backend's float operations (norms, rope, GELU,
//! bias), within the backend's own approximations elsewhere (SiLU's vector exp; attention,
//! whose backend rounds the probabilities to f16 and sums in ggml's lane order, against
//! the twin's exact f64 softmax). The GPU check (`examples/gpu_ops`) compares the
//! kernels with the twins, so this ties the GPU kernels to the CPU backend.

use rand::{Rng, SeedableRng};
use smelt_engine::backend::cpu::{Cpu, CpuTensor, CpuWeight};
use smelt_engine::backend::{AttnParams, AttnSeq, Backend, Glu, RopeParams, RopeStyle};
use smelt_kernels::ops::{attention, elementwise, kv, norm, rope, sample};

fn floats(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

fn tensor(data: Vec<f32>, cols: usize) -> CpuTensor {
    CpuTensor {
        rows: data.len() / cols,
        cols,
        data,
    }
}

#[test]
fn norms_rope_bias_and_gelu_equal_the_backend() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let cpu = Cpu::GGML;
    // RMS norm over rows and over heads.
    for (rows, cols, n) in [(3, 576, 576), (4, 512, 64)] {
        let x = floats(&mut rng, rows * cols, 3.0);
        let w = floats(&mut rng, n, 1.0);
        let mut out = cpu.alloc(rows, cols);
        cpu.rms_norm(
            &tensor(x.clone(), cols),
            &CpuWeight::Vector(w.clone()),
            1e-5,
            &mut out,
        );
        let mut twin = vec![0f32; rows * cols];
        norm::rms_norm_cpu(&x, &w, 1e-5, &mut twin);
        assert_eq!(twin, out.data);
    }
    // Rope, both styles, partial rotation and frequency factors.
    for (style, kstyle) in [
        (RopeStyle::Normal, rope::RopeStyle::Normal),
        (RopeStyle::Neox, rope::RopeStyle::Neox),
    ] {
        for (hd, n_rot, ff) in [(64usize, 64usize, false), (128, 64, true)] {
            let (rows, heads) = (5, 3);
            let cols = heads * hd;
            let x = floats(&mut rng, rows * cols, 2.0);
            let pos: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..5000)).collect();
            let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + (i % 5) as f32).collect();
            let p = RopeParams {
                style,
                n_rot,
                freq_base: 10000.0,
                freq_scale: 0.5,
            };
            let mut t = tensor(x.clone(), cols);
            let ffw = CpuWeight::Vector(factors.clone());
            cpu.rope(&mut t, &pos, hd, &p, ff.then_some(&ffw));
            let mut twin = x.clone();
            rope::rope_cpu(
                &mut twin,
                &pos,
                cols,
                hd,
                n_rot,
                kstyle,
                10000.0,
                0.5,
                ff.then_some(&factors[..]),
            );
            assert_eq!(twin, t.data, "{style:?} hd {hd} rot {n_rot} ff {ff}");
        }
    }
    // Bias, add, scale.
    let x = floats(&mut rng, 6 * 40, 2.0);
    let b = floats(&mut rng, 40, 1.0);
    let mut t = tensor(x.clone(), 40);
    cpu.add_bias(&mut t, &CpuWeight::Vector(b.clone()));
    let mut twin = x.clone();
    elementwise::add_bias_cpu(&mut twin, &b);
    assert_eq!(twin, t.data);
    // GELU (the backend's f16 table) times up.
    let g = floats(&mut rng, 4096, 12.0);
    let u = floats(&mut rng, 4096, 2.0);
    let mut t = tensor(g.clone(), 512);
    cpu.glu(&mut t, &tensor(u.clone(), 512), Glu::Gelu);
    let mut twin = g.clone();
    elementwise::glu_cpu(&mut twin, &u, elementwise::Glu::Gelu);
    assert_eq!(twin, t.data);
}

#[test]
fn silu_argmax_and_attention_agree_with_the_backend() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let cpu = Cpu::GGML;
    // SiLU: the backend's vector exp differs from libm's in the last bits.
    let g = floats(&mut rng, 4096, 12.0);
    let u = floats(&mut rng, 4096, 2.0);
    let mut t = tensor(g.clone(), 4096);
    cpu.glu(&mut t, &tensor(u.clone(), 4096), Glu::Silu);
    let mut twin = g.clone();
    elementwise::glu_cpu(&mut twin, &u, elementwise::Glu::Silu);
    for (a, b) in twin.iter().zip(&t.data) {
        assert!((a - b).abs() <= 1e-6 + 1e-6 * b.abs(), "{a} vs {b}");
    }
    // Argmax on rows without NaN (with NaN the backend's first-element rule differs, see
    // `sample::argmax_cpu`).
    let x = floats(&mut rng, 3 * 1000, 5.0);
    let want: Vec<u32> = x.chunks(1000).map(smelt_engine::argmax).collect();
    assert_eq!(sample::argmax_cpu(&x, 1000), want);

    // Paged KV write and attention: two sequences at different positions, GQA, a window,
    // head sizes with and without a GPU kernel layout of whole warps (80, 112, 144).
    let (n_head, n_head_kv, bs) = (8usize, 2usize, 16usize);
    for (hd, window) in [64usize, 80, 112, 144, 256]
        .into_iter()
        .flat_map(|hd| [(hd, 0usize), (hd, 24)])
    {
        let kv_dim = n_head_kv * hd;
        let shape = [(0usize, 20usize), (45, 3)];
        let mut tables: Vec<u32> = Vec::new();
        let mut descs = Vec::new();
        let mut row = 0;
        let mut next_block = 0u32;
        for &(start, n) in &shape {
            let nb = (start + n).div_ceil(bs);
            descs.push(kv::SeqDesc {
                row: row as u32,
                n_tokens: n as u32,
                start_pos: start as u32,
                block_table_offset: tables.len() as u32,
            });
            // Blocks in reverse order, so the table matters.
            tables.extend((0..nb as u32).rev().map(|b| b + next_block));
            next_block += nb as u32;
            row += n;
        }
        let n_blocks = next_block as usize;
        let rows = row;
        // Fill the cache up to each sequence's start with earlier tokens, then the new ones.
        let mut kc = vec![0u16; n_blocks * bs * kv_dim];
        let mut vc = kc.clone();
        let mut cpu_kv = cpu.kv_alloc(1, n_blocks, bs, kv_dim);
        let mut history = Vec::new();
        for d in &descs {
            if d.start_pos > 0 {
                history.push(kv::SeqDesc {
                    row: 0,
                    n_tokens: d.start_pos,
                    start_pos: 0,
                    block_table_offset: d.block_table_offset,
                });
            }
        }
        for step in [history, descs.clone()] {
            let n_rows: usize = step.iter().map(|d| d.n_tokens as usize).sum();
            let mut at = 0;
            let step: Vec<kv::SeqDesc> = step
                .into_iter()
                .map(|mut d| {
                    d.row = at;
                    at += d.n_tokens;
                    d
                })
                .collect();
            let k = floats(&mut rng, n_rows * kv_dim, 1.0);
            let v = floats(&mut rng, n_rows * kv_dim, 1.0);
            kv::kv_append_cpu(&k, &v, &mut kc, &mut vc, &step, &tables, kv_dim, bs);
            let seqs: Vec<AttnSeq> = step
                .iter()
                .map(|d| AttnSeq {
                    row: d.row as usize,
                    n_tokens: d.n_tokens as usize,
                    start_pos: d.start_pos as usize,
                    blocks: &tables[d.block_table_offset as usize..],
                })
                .collect();
            cpu.kv_write(
                &mut cpu_kv,
                0,
                &tensor(k, kv_dim),
                &tensor(v, kv_dim),
                &seqs,
            );
        }
        let q = floats(&mut rng, rows * n_head * hd, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let seqs: Vec<AttnSeq> = descs
            .iter()
            .map(|d| AttnSeq {
                row: d.row as usize,
                n_tokens: d.n_tokens as usize,
                start_pos: d.start_pos as usize,
                blocks: &tables[d.block_table_offset as usize..],
            })
            .collect();
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale,
            window: (window > 0).then_some(window),
        };
        let mut out = cpu.alloc(rows, n_head * hd);
        cpu.attention(
            &tensor(q.clone(), n_head * hd),
            &cpu_kv,
            0,
            &seqs,
            &p,
            &mut out,
        );
        let shape = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window,
            scale,
        };
        let mut twin = vec![0f32; rows * n_head * hd];
        attention::attention_cpu(&q, &kc, &vc, &descs, &tables, &shape, &mut twin);
        let worst = twin
            .iter()
            .zip(&out.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // The backend rounds each probability to f16 (relative 2^-11) before weighting V.
        assert!(
            worst < 2e-3,
            "head_dim {hd} window {window}: max |twin - backend| {worst}"
        );
    }
}

/// The MoE twins (`moe::route_cpu`, `combine_cpu`) against the engine's CPU backend
/// (ggml's order): the same experts, weights within the vector exp's rounding, and the
/// combine bit for bit. `bench/gpu/moe.sh` checks the kernels against the backend too.
#[test]
fn moe_twins_match_the_backend() {
    use smelt_engine::backend::cpu::moe as backend_moe;
    use smelt_engine::backend::{Gating, MoeRouting};
    use smelt_kernels::moe;
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    for (ne, k, n, gating, norm, scale) in [
        (128, 8, 5, Gating::Softmax, true, 0.0),
        (20, 4, 3, Gating::Sigmoid, false, 2.5),
        (8, 2, 7, Gating::Softmax, false, 1.0),
    ] {
        let logits = floats(&mut rng, n * ne, 4.0);
        let p = MoeRouting {
            gating,
            k,
            norm,
            scale,
        };
        let mut want = vec![0f32; n * 2 * k];
        backend_moe::route(&logits, ne, &p, &mut want);
        let g = match gating {
            Gating::Softmax => moe::Gating::Softmax,
            Gating::Sigmoid => moe::Gating::Sigmoid,
        };
        let s = if scale == 0.0 { 1.0 } else { scale };
        let got = moe::route_cpu(&logits, ne, g, k, norm, s);
        for (a, b) in got.chunks(2 * k).zip(want.chunks(2 * k)) {
            assert_eq!(a[..k], b[..k], "{ne} experts, k {k}");
            for (x, y) in a[k..].iter().zip(&b[k..]) {
                assert!((x - y).abs() <= 1e-6 * y.abs().max(1e-3), "{x} vs {y}");
            }
        }
        let cols = 24;
        let y = floats(&mut rng, n * k * cols, 2.0);
        let mut out = vec![0f32; n * cols];
        backend_moe::combine(&y, &want, k, &mut out);
        assert_eq!(moe::combine_cpu(&y, &want, k, cols), out);
    }
}

/// Whether `a` is `b` within `tol` relative to `1 + |b|`, element by element.
fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// The delta-net twins (`delta_net::*_cpu`) against the engine's CPU functions: the
/// convolution bit for bit before the SiLU, the norms and one step of the delta rule
/// within float rounding (the twins sum in other orders).
#[test]
fn delta_net_twins_match_the_backend() {
    use smelt_engine::backend::cpu::delta_net as backend;
    use smelt_kernels::delta_net as twin;
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    // Convolution of 5 rows, 24 channels.
    let ch = 24;
    let x = floats(&mut rng, 5 * ch, 1.0);
    let w = floats(&mut rng, ch * twin::CONV_TAPS, 1.0);
    let w0 = floats(&mut rng, 3 * ch, 1.0);
    let (mut wa, mut wb) = (w0.clone(), w0.clone());
    let got = twin::conv1d_cpu(&x, &mut wa, &w, ch);
    let mut want = vec![0f32; x.len()];
    backend::conv1d(&x, &mut wb, &w, twin::CONV_TAPS, ch, &mut want);
    want.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp()));
    assert_eq!(wa, wb);
    assert!(close(&got, &want, 1e-6));
    // Norms.
    let mut a = floats(&mut rng, 4 * 64, 2.0);
    let mut b = a.clone();
    twin::l2_norm_cpu(&mut a, 64, 1e-6);
    backend::l2_norm(&mut b, 64, 1e-6);
    assert!(close(&a, &b, 1e-6));
    let (o, z, g) = (
        floats(&mut rng, 3 * 64, 2.0),
        floats(&mut rng, 3 * 64, 2.0),
        floats(&mut rng, 64, 1.0),
    );
    let (mut a, mut b) = (o.clone(), o);
    twin::gated_norm_cpu(&mut a, &g, &z, 1e-6);
    backend::gated_rms_norm(&mut b, &g, &z, 1e-6);
    assert!(close(&a, &b, 1e-6));
    // One step of the rule: 4 value heads over 2 key heads, both mappings.
    for grouped in [false, true] {
        let s = 64;
        let (hk, hv) = (2, 4);
        let mut q = floats(&mut rng, hk * s, 1.0);
        let mut k = floats(&mut rng, hk * s, 1.0);
        backend::l2_norm(&mut q, s, 1e-6);
        backend::l2_norm(&mut k, s, 1e-6);
        let v = floats(&mut rng, hv * s, 1.0);
        let (alpha, beta) = (floats(&mut rng, hv, 2.0), floats(&mut rng, hv, 3.0));
        let (dt, aa) = (floats(&mut rng, hv, 1.0), vec![-0.5f32; hv]);
        let s0 = floats(&mut rng, hv * s * s, 0.5);
        let (mut sa, mut sb) = (s0.clone(), s0);
        let got = twin::step_cpu(s, hk, grouped, &q, &k, &v, &alpha, &beta, &dt, &aa, &mut sa);
        let gates: Vec<f32> = (0..hv)
            .map(|h| {
                let x = alpha[h] + dt[h];
                let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
                sp * aa[h]
            })
            .collect();
        let b: Vec<f32> = beta.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
        let sh = backend::DeltaShape {
            s,
            h_k: hk,
            h_v: hv,
            grouped,
        };
        let mut want = vec![0f32; hv * s];
        backend::delta_rule(sh, &q, &k, &v, &gates, &b, &mut sb, &mut want);
        assert!(close(&got, &want, 1e-5), "grouped {grouped}");
        assert!(close(&sa, &sb, 1e-5), "grouped {grouped}");
    }
}

/// The chunked kernels' twin (`delta_chunk::chunked_cpu`) against the engine's chunked
/// form (`delta_rule_chunked`, what the CPU backend runs for prompts) over 70 tokens (a
/// whole chunk and a ragged one), 4 value heads over 2 key heads, both mappings, from a
/// non-zero state: the same outputs and state within float rounding.
#[test]
fn chunked_delta_twin_matches_the_backend() {
    use smelt_engine::backend::cpu::delta_net as backend;
    use smelt_kernels::delta_chunk as twin;
    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    for grouped in [false, true] {
        let (s, hk, hv, n) = (64, 2, 4, 70);
        let mut q = floats(&mut rng, n * hk * s, 1.0);
        let mut k = floats(&mut rng, n * hk * s, 1.0);
        backend::l2_norm(&mut q, s, 1e-6);
        backend::l2_norm(&mut k, s, 1e-6);
        let v = floats(&mut rng, n * hv * s, 1.0);
        let (alpha, beta) = (floats(&mut rng, n * hv, 2.0), floats(&mut rng, n * hv, 3.0));
        let (dt, aa) = (floats(&mut rng, hv, 1.0), vec![-0.5f32; hv]);
        let s0 = floats(&mut rng, hv * s * s, 0.5);
        let (mut sa, mut sb) = (s0.clone(), s0);
        let got = twin::chunked_cpu(s, hk, grouped, &q, &k, &v, &alpha, &beta, &dt, &aa, &mut sa);
        let gates: Vec<f32> = alpha
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let x = a + dt[i % hv];
                let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
                sp * aa[i % hv]
            })
            .collect();
        let b: Vec<f32> = beta.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
        let sh = backend::DeltaShape {
            s,
            h_k: hk,
            h_v: hv,
            grouped,
        };
        let mut want = vec![0f32; n * hv * s];
        backend::delta_rule_chunked(sh, &q, &k, &v, &gates, &b, &mut sb, &mut want);
        assert!(close(&got, &want, 1e-5), "grouped {grouped}");
        assert!(close(&sa, &sb, 1e-5), "grouped {grouped}");
    }
}
