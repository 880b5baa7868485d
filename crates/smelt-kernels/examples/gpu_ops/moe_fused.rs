//! The fused MoE decode kernels against their CPU twins (`-o moefuse`; `smelt_kernels::
//! moe_fused`): the one-launch router (split-norm input or a plain row, softmax and
//! sigmoid, routers wider than the row's tiles and narrower, a row whose last tile is
//! partly padded) and the combine + residual add + RMS norm + q8_1 kernel (1 to 3 tokens,
//! 2 to 8 experts). Outputs are poisoned first; the router cases share one counter, so a
//! launch that did not reset it fails the next case.
//!
//! Bars: route ids exact, weights within 1e-5 relative (`ex2.approx` against `exp`); the
//! normed row within 1e-6 + 1e-5|r| of the twin's (whose `1/rms` is summed in f64); every
//! q8_1 tile byte equal to the q8_1 twin of the GPU's own f32 row (as `norm_q8`); the
//! residual after the combine exact (the same products and adds as `moe_combine` then
//! `add`), the norm within `norm_q8`'s 1e-6 + 2e-6|r|.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::moe::Gating;
use smelt_kernels::{act, gemv, moe_fused, TILE};

use super::harness::{floats, launch_values, nan, ptr, Check, Gpu, Report};

/// The fused router and the fused combine + norm.
pub const COVERS: &[&str] = &["moe_router_*", "moe_combine_add_rms_norm_q8_1"];

/// Byte strings as floats, for [`Check::add`]'s exact comparison.
fn bytes(b: &[u8]) -> Vec<f32> {
    b.iter().map(|&v| f32::from(v)).collect()
}

pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    check_router(gpu, rng, rep)?;
    check_combine_norm(gpu, rng, rep)
}

fn check_router(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut cr, mut ch, mut cq) = (
        Check::new("moe_router (route)"),
        Check::new("moe_router (normed row)"),
        Check::new("moe_router (q8_1 tiles)"),
    );
    let counter = gpu.stream.clone_htod(&[0u32; 4])?;
    let eps = 1e-6f32;
    // (experts, columns, experts a token, gating, split-norm input)
    let cases = [
        (128, 2048, 8, Gating::Softmax, true),
        (128, 2048, 8, Gating::Softmax, false),
        (64, 576, 4, Gating::Sigmoid, true),
        (8, 4096, 2, Gating::Softmax, true),
        (512, 2048, 10, Gating::Sigmoid, false),
        (60, 160, 4, Gating::Softmax, true),
        (128, 2048, 8, Gating::Softmax, true),
    ];
    for (ne, cols, k, gating, normed) in cases {
        let case = format!(
            "{ne}x{cols} k{k} {} {}",
            if gating == Gating::Softmax {
                "softmax"
            } else {
                "sigmoid"
            },
            if normed { "split-norm" } else { "plain" }
        );
        if !super::harness::want(&case) {
            continue;
        }
        let w = floats(rng, ne * cols, 0.2);
        let x = floats(rng, cols, 3.0);
        let g = floats(rng, cols, 1.5);
        // The producer GEMV's partial sums of x² per 32 rows (f32, as it writes them).
        let parts: Vec<f32> = gemv::residual_norm_partials(&x)
            .iter()
            .map(|&p| p as f32)
            .collect();
        let scale = gemv::rms_input_scale(
            &parts.iter().map(|&p| f64::from(p)).collect::<Vec<_>>(),
            cols,
            eps,
        ) as f32;
        let norm = rng.gen_bool(0.5) || gating == Gating::Softmax;
        let rscale = if rng.gen_bool(0.5) { 1.0 } else { 2.5 };
        let input = moe_fused::RouterInput {
            w: &w,
            x: &x,
            norm: normed.then_some((&g[..], scale)),
            n_expert: ne,
        };
        let (want_route, want_h) = moe_fused::router_cpu(&input, gating, k, norm, rscale);
        let (wd, xd, gd, pd) = (
            gpu.stream.clone_htod(&w)?,
            gpu.stream.clone_htod(&x)?,
            gpu.stream.clone_htod(&g)?,
            gpu.stream.clone_htod(&parts)?,
        );
        let od = gpu.stream.clone_htod(&nan(cols))?;
        let qd = gpu
            .stream
            .clone_htod(&vec![0xA5u8; act::row_bytes(cols)?])?;
        let ld = gpu.stream.clone_htod(&nan(ne))?;
        let rd = gpu.stream.clone_htod(&nan(2 * k))?;
        let a = moe_fused::RouterArgs {
            w: ptr(gpu, &wd),
            x: ptr(gpu, &xd),
            g: ptr(gpu, &gd),
            partials: ptr(gpu, &pd),
            out: ptr(gpu, &od),
            q: ptr(gpu, &qd),
            logits: ptr(gpu, &ld),
            route: ptr(gpu, &rd),
            counter: ptr(gpu, &counter),
            nparts: if normed { parts.len() as u32 } else { 0 },
            cols: cols as u32,
            ntiles: cols.div_ceil(TILE) as u32,
            n_expert: ne as u32,
            k: k as u32,
            norm: norm as u32,
            normed: normed as u32,
            eps,
            scale: rscale,
        };
        launch_values(
            gpu,
            moe_fused::router_name(gating),
            moe_fused::router_launch(ne, cols),
            &a.values(),
        )?;
        cr.add(&case, &gpu.stream.clone_dtoh(&rd)?, &want_route, 1e-7, 1e-5);
        if normed {
            let got_h = gpu.stream.clone_dtoh(&od)?;
            ch.add(&case, &got_h, &want_h, 1e-6, 1e-5);
            cq.add(
                &case,
                &bytes(&gpu.stream.clone_dtoh(&qd)?),
                &bytes(&act::quantize_cpu(&got_h, cols)?),
                0.0,
                0.0,
            );
        }
    }
    let left = gpu.stream.clone_dtoh(&counter)?;
    cr.add("counter reset", &[left[0] as f32], &[0.0], 0.0, 0.0);
    rep.push("moe_router (route)", cr, "ids exact, 1e-7 + 1e-5|r|");
    rep.push("moe_router (normed row)", ch, "1e-6 + 1e-5|r|");
    rep.push("moe_router (q8_1 tiles)", cq, "exact bytes");
    Ok(())
}

fn check_combine_norm(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let name = moe_fused::COMBINE_NORM;
    let (mut cx, mut cf, mut cq) = (
        Check::new(&format!("{name} (x)")),
        Check::new(&format!("{name} (f32)")),
        Check::new(&format!("{name} (q8_1 tiles)")),
    );
    for (rows, n, k) in [
        (1usize, 2048usize, 8usize),
        (1, 576, 4),
        (3, 800, 2),
        (2, 4096, 6),
        // Past the eight experts a thread loads together (Qwen3-Next routes 10), and
        // rows wider than one pass of the block's threads.
        (1, 2048, 10),
        (2, 5120, 1),
    ] {
        let case = format!("{rows}x{n} k{k}");
        if !super::harness::want(&case) {
            continue;
        }
        let x = floats(rng, rows * n, 3.0);
        let y = floats(rng, rows * k * n, 1.0);
        let w = floats(rng, n, 1.5);
        let route: Vec<f32> = (0..rows)
            .flat_map(|_| {
                let ids: Vec<f32> = (0..k).map(|_| rng.gen_range(0..128) as f32).collect();
                let ws: Vec<f32> = (0..k).map(|_| rng.gen_range(0.01f32..1.0)).collect();
                ids.into_iter().chain(ws)
            })
            .collect();
        let eps = 1e-6f32;
        let mut want_x = x.clone();
        let (want, _) = moe_fused::combine_norm_cpu(&mut want_x, &y, &route, k, &w, eps)?;
        let (xd, yd, rd, wd) = (
            gpu.stream.clone_htod(&x)?,
            gpu.stream.clone_htod(&y)?,
            gpu.stream.clone_htod(&route)?,
            gpu.stream.clone_htod(&w)?,
        );
        let od = gpu.stream.clone_htod(&nan(rows * n))?;
        let qd = gpu
            .stream
            .clone_htod(&vec![0xA5u8; rows * act::row_bytes(n)?])?;
        let a = moe_fused::CombineNormArgs {
            x: ptr(gpu, &xd),
            y: ptr(gpu, &yd),
            route: ptr(gpu, &rd),
            w: ptr(gpu, &wd),
            out: ptr(gpu, &od),
            q: ptr(gpu, &qd),
            n: n as u32,
            ntiles: n.div_ceil(TILE) as u32,
            k: k as u32,
            eps,
        };
        launch_values(
            gpu,
            name,
            moe_fused::combine_norm_launch(rows, n),
            &a.values(),
        )?;
        cx.add(&case, &gpu.stream.clone_dtoh(&xd)?, &want_x, 0.0, 0.0);
        let got = gpu.stream.clone_dtoh(&od)?;
        cf.add(&case, &got, &want, 1e-6, 2e-6);
        cq.add(
            &case,
            &bytes(&gpu.stream.clone_dtoh(&qd)?),
            &bytes(&act::quantize_cpu(&got, n)?),
            0.0,
            0.0,
        );
    }
    rep.push(&format!("{name} (x)"), cx, "exact");
    rep.push(&format!("{name} (f32)"), cf, "1e-6 + 2e-6|r|");
    rep.push(&format!("{name} (q8_1 tiles)"), cq, "exact bytes");
    Ok(())
}
