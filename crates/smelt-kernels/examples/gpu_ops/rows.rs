//! The per-row ops of sampling against their CPU twins: softmax, argmax (one pass and
//! split across blocks), and the sampler (temperature, top-k/top-p, reproducible draws);
//! perf: the attention at Llama-3-8B decode shape and the other ops at 8B shapes.

use anyhow::Result;
use cudarc::driver::PushKernelArg;
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::ops::{attention, elementwise, norm, rope, sample};

use super::attention::{f16_bits, paged, run_attention, Which};
use super::harness::{floats, nan, Check, Gpu, Report};
use super::timing::{time_graph, time_launches};

pub const ROWS: &[&str] = &["softmax_rows", "argmax_rows", "argmax_rows_split"];
pub const SAMPLE: &[&str] = &["sample_rows"];

pub fn check_rows(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut cs, mut ca, mut csplit) = (
        Check::new(sample::SOFTMAX),
        Check::new(sample::ARGMAX),
        Check::new(sample::ARGMAX_SPLIT),
    );
    for (rows, cols) in [
        (1usize, 128256usize),
        (3, 49152),
        (5, 1000),
        (2, 262144),
        (4, 7),
    ] {
        let mut x = floats(rng, rows * cols, 8.0);
        // Ties (first index wins), NaN and -inf that argmax must pass over.
        x[cols / 2] = 100.0;
        x[cols / 2 + 1.min(cols - cols / 2 - 1)] = 100.0;
        // The same maximum in the last part too: the split kernel's parts must keep the
        // first.
        x[cols - 1] = 100.0;
        x[0] = f32::NAN;
        if rows > 1 {
            x[cols..2 * cols].iter_mut().for_each(|v| *v = f32::NAN);
            x[cols + cols - 1] = f32::NEG_INFINITY;
        }
        let xd = gpu.stream.clone_htod(&x)?;
        let c32 = cols as u32;
        let mut od = gpu.stream.clone_htod(&vec![u32::MAX; rows])?;
        launch!(
            gpu,
            sample::ARGMAX,
            sample::launch(rows),
            [&xd, &mut od, &c32]
        );
        // Indices as floats, for the checks.
        let floats_of = |v: &[u32]| v.iter().map(|&i| i as f32).collect::<Vec<f32>>();
        let got = floats_of(&gpu.stream.clone_dtoh(&od)?);
        let want = floats_of(&sample::argmax_cpu(&x, cols));
        ca.add(&format!("{rows}x{cols}"), &got, &want, 0.0, 0.0);
        // The split kernel, twice on the same state: it must come back to zero.
        let mut state = gpu.stream.alloc_zeros::<u64>(rows)?;
        let mut counters = gpu.stream.alloc_zeros::<u32>(rows)?;
        for round in 0..2 {
            let mut od = gpu.stream.clone_htod(&vec![u32::MAX; rows])?;
            launch!(
                gpu,
                sample::ARGMAX_SPLIT,
                sample::split_launch(rows, cols),
                [&xd, &mut od, &c32, &mut state, &mut counters]
            );
            let got = floats_of(&gpu.stream.clone_dtoh(&od)?);
            let case = format!("{rows}x{cols} round {round}");
            csplit.add(&case, &got, &want, 0.0, 0.0);
            let left = gpu
                .stream
                .clone_dtoh(&state)?
                .iter()
                .filter(|&&w| w != 0)
                .count()
                + gpu
                    .stream
                    .clone_dtoh(&counters)?
                    .iter()
                    .filter(|&&w| w != 0)
                    .count();
            csplit.add(&format!("{case} state"), &[left as f32], &[0.0], 0.0, 0.0);
        }

        let y = floats(rng, rows * cols, 8.0);
        let yd = gpu.stream.clone_htod(&y)?;
        let mut sd = gpu.stream.clone_htod(&nan(rows * cols))?;
        launch!(
            gpu,
            sample::SOFTMAX,
            sample::launch(rows),
            [&yd, &mut sd, &c32]
        );
        let mut want = vec![0f32; rows * cols];
        sample::softmax_cpu(&y, cols, &mut want);
        cs.add(
            &format!("{rows}x{cols}"),
            &gpu.stream.clone_dtoh(&sd)?,
            &want,
            1e-9,
            1e-5,
        );
    }
    rep.push(sample::ARGMAX, ca, "exact");
    rep.push(sample::ARGMAX_SPLIT, csplit, "exact, state zero after");
    rep.push(sample::SOFTMAX, cs, "1e-9 + 1e-5|r|");
    Ok(())
}

pub fn check_sample(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let mut c = Check::new(sample::SAMPLE);
    let mut near = 0;
    for (rows, cols) in [
        (8usize, 128256usize),
        (6, 49152),
        (16, 1000),
        (3, 262144),
        (4, 7),
        (5, 300),
    ] {
        let mut x = floats(rng, rows * cols, 6.0);
        for r in 0..rows {
            let row = &mut x[r * cols..(r + 1) * cols];
            match r % 4 {
                // Ties at the top and inside the candidates.
                0 => {
                    row[cols / 3] = 40.0;
                    row[cols / 2] = 40.0;
                    row[cols - 1] = 40.0;
                }
                // A masked vocabulary: mostly -inf, a few numbers, some NaN.
                1 => {
                    row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                    for j in 0..cols.min(20) {
                        row[(j * 7919) % cols] = j as f32 * 0.25;
                    }
                    row[0] = f32::NAN;
                }
                // Many equal values at the threshold: the lowest indices win.
                2 => row.iter_mut().step_by(3).for_each(|v| *v = 9.0),
                _ => {}
            }
        }
        let params: Vec<sample::SampleParams> = (0..rows)
            .map(|r| sample::SampleParams {
                top_k: [1, 5, 40, 64, 0, 100, 2][r % 7],
                top_p: [1.0, 0.9, 0.5, 0.95][r % 4],
                temperature: [0.7, 1.0, 1.5, 0.3][(r / 2) % 4],
                uniform: rng.gen_range(0.0..1.0),
            })
            .collect();
        let words: Vec<u32> = params.iter().flat_map(|p| p.words()).collect();
        let (xd, pd) = (gpu.stream.clone_htod(&x)?, gpu.stream.clone_htod(&words)?);
        let c32 = cols as u32;
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut od = gpu.stream.clone_htod(&vec![u32::MAX; rows])?;
            launch!(
                gpu,
                sample::SAMPLE,
                sample::sample_launch(rows),
                [&xd, &mut od, &pd, &c32]
            );
            runs.push(gpu.stream.clone_dtoh(&od)?);
        }
        let got: Vec<f32> = runs[0].iter().map(|&t| t as f32).collect();
        let mut want = Vec::new();
        for (r, p) in params.iter().enumerate() {
            let (t, margin) = sample::sample_cpu(&x[r * cols..(r + 1) * cols], p);
            // A draw within rounding of a boundary may go either way in f32.
            if runs[0][r] != t && margin < 1e-5 {
                near += 1;
                want.push(got[r]);
            } else {
                want.push(t as f32);
            }
        }
        c.add(&format!("{rows}x{cols}"), &got, &want, 0.0, 0.0);
        // Reproducible: the same inputs draw the same tokens.
        let again: Vec<f32> = runs[1].iter().map(|&t| t as f32).collect();
        c.add(&format!("{rows}x{cols} again"), &again, &got, 0.0, 0.0);
    }
    println!("sample_rows: {near} draws within 1e-5 of a boundary accepted either way");
    rep.push(sample::SAMPLE, c, "same token (reproducible)");
    Ok(())
}

/// The attention at Llama-3-8B decode shape and the other ops at 8B shapes.
pub fn perf(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let lines = speed(gpu, rng)?;
    rep.perf.extend(lines);
    Ok(())
}

fn speed(gpu: &Gpu, rng: &mut StdRng) -> Result<Vec<String>> {
    println!("\n== speed: attention at Llama-3-8B decode shape (32 heads, 8 KV heads, head_dim 128, block 16) ==");
    let mut table = vec![
        "| op | shape | splits | attention us | reduce us | total us | KV GB/s (attention) | KV GB/s (total) | graph: total us | graph: KV GB/s |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let (n_head, n_head_kv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    for (n_seqs, ctx) in [
        (1usize, 512usize),
        (1, 4096),
        (16, 512),
        (16, 4096),
        (64, 1024),
    ] {
        let shape: Vec<(usize, usize)> = (0..n_seqs).map(|_| (ctx - 1, 1)).collect();
        let p = paged(rng, &shape, bs);
        let kv_dim = n_head_kv * hd;
        let cache_len = p.n_blocks * bs * kv_dim;
        let kv_bytes = n_seqs * ctx * kv_dim * 2 * 2;
        // Enough copies of the layer's cache that L2 (50-60 MB) cannot hold them.
        let copies = (400_000_000usize.div_ceil(2 * cache_len * 2)).clamp(2, 32);
        let kcs: Vec<_> = (0..copies)
            .map(|_| gpu.stream.clone_htod(&f16_bits(rng, cache_len)))
            .collect::<Result<_, _>>()?;
        let vcs: Vec<_> = (0..copies)
            .map(|_| gpu.stream.clone_htod(&f16_bits(rng, cache_len)))
            .collect::<Result<_, _>>()?;
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let sd = gpu.stream.clone_htod(&words)?;
        let td = gpu.stream.clone_htod(&p.tables)?;
        let qd = gpu
            .stream
            .clone_htod(&floats(rng, p.rows * n_head * hd, 1.0))?;
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window: 0,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        for n_splits in [
            attention::default_splits(n_seqs, n_head_kv, gpu.sms),
            attention::splits_for_context(n_seqs, n_head_kv, gpu.sms, ctx),
            4,
            16,
            32,
            64,
            128,
        ] {
            let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
            let mut acc = gpu.stream.alloc_zeros::<f32>(al)?;
            let mut ml = gpu.stream.alloc_zeros::<f32>(mll)?;
            let mut out = gpu.stream.alloc_zeros::<f32>(p.rows * n_head * hd)?;
            let mut t = [0f64; 3];
            for (slot, which) in [Which::Main, Which::Reduce, Which::Both]
                .into_iter()
                .enumerate()
            {
                t[slot] = time_launches(&gpu.stream, 7, 5, 100, |i| {
                    run_attention(
                        gpu,
                        &p,
                        &s,
                        n_splits,
                        &qd,
                        &kcs[i % copies],
                        &vcs[i % copies],
                        &sd,
                        &td,
                        &mut acc,
                        &mut ml,
                        &mut out,
                        which,
                        None,
                        32,
                        0,
                    )
                })? * 1e3;
            }
            // The pair as a decode step runs it: replayed from a CUDA graph.
            let tg = time_graph(&gpu.stream, 7, 100, |i| {
                run_attention(
                    gpu,
                    &p,
                    &s,
                    n_splits,
                    &qd,
                    &kcs[i % copies],
                    &vcs[i % copies],
                    &sd,
                    &td,
                    &mut acc,
                    &mut ml,
                    &mut out,
                    Which::Both,
                    None,
                    32,
                    0,
                )
            })? * 1e3;
            let gbs = |us: f64| kv_bytes as f64 / (us * 1e-6) / 1e9;
            let line = format!(
                "| attention_hd128 | {n_seqs} seq x ctx {ctx} | {n_splits} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {tg:.2} | {:.0} |",
                t[0], t[1], t[2], gbs(t[0]), gbs(t[2]), gbs(tg)
            );
            println!("{line}");
            table.push(line);
        }
    }

    println!("\n== speed: other ops at 8B shapes (stream launches, median of 7 x 200) ==");
    table.push(String::new());
    table.push("| op | shape | us | GB/s |".to_string());
    table.push("|---|---|---|---|".to_string());
    let mut other = |name: &str, shape: &str, bytes: usize, us: f64| {
        let line = format!(
            "| {name} | {shape} | {us:.2} | {:.0} |",
            bytes as f64 / (us * 1e-6) / 1e9
        );
        println!("{line}");
        table.push(line);
    };
    for rows in [1usize, 64] {
        let n = 4096;
        let xd = gpu.stream.clone_htod(&floats(rng, rows * n, 1.0))?;
        let wd = gpu.stream.clone_htod(&floats(rng, n, 1.0))?;
        let mut yd = gpu.stream.clone_htod(&floats(rng, rows * n, 1.0))?;
        let mut od = gpu.stream.alloc_zeros::<f32>(rows * n)?;
        let (n32, eps) = (n as u32, 1e-5f32);
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                norm::RMS_NORM,
                norm::launch(rows, n),
                [&xd, &wd, &mut od, &n32, &eps]
            );
            Ok(())
        })? * 1e3;
        other(norm::RMS_NORM, &format!("{rows}x4096"), rows * n * 8, us);
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                norm::ADD_RMS_NORM,
                norm::launch(rows, n),
                [&mut yd, &xd, &wd, &mut od, &n32, &eps]
            );
            Ok(())
        })? * 1e3;
        other(
            norm::ADD_RMS_NORM,
            &format!("{rows}x4096"),
            rows * n * 16,
            us,
        );
        let cols = 4096;
        let mut qd = gpu.stream.clone_htod(&floats(rng, rows * cols, 1.0))?;
        let pd = gpu
            .stream
            .clone_htod(&(0..rows as u32).map(|i| 1000 + i).collect::<Vec<_>>())?;
        let (c32, hd32, nr32, ts, fs, null) = (
            cols as u32,
            128u32,
            128u32,
            rope::theta_scale(500000.0, 128),
            1.0f32,
            0u64,
        );
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                rope::name(rope::RopeStyle::Normal),
                rope::launch(rows, cols, 128, 128),
                [&mut qd, &pd, &null, &c32, &hd32, &nr32, &ts, &fs]
            );
            Ok(())
        })? * 1e3;
        other(
            "rope_normal",
            &format!("{rows}x32x128"),
            rows * cols * 8,
            us,
        );
        let n = rows * 14336;
        let mut gd = gpu.stream.clone_htod(&floats(rng, n, 1.0))?;
        let ud = gpu.stream.clone_htod(&floats(rng, n, 1.0))?;
        let n32 = n as u32;
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                elementwise::glu_name(elementwise::Glu::Silu),
                elementwise::launch(n),
                [&mut gd, &ud, &n32]
            );
            Ok(())
        })? * 1e3;
        other("glu_silu", &format!("{rows}x14336"), n * 12, us);
        let vocab = 128256;
        let ld = gpu.stream.clone_htod(&floats(rng, rows * vocab, 5.0))?;
        let mut ad = gpu.stream.alloc_zeros::<u32>(rows)?;
        let v32 = vocab as u32;
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                sample::ARGMAX,
                sample::launch(rows),
                [&ld, &mut ad, &v32]
            );
            Ok(())
        })? * 1e3;
        other(
            sample::ARGMAX,
            &format!("{rows}x{vocab}"),
            rows * vocab * 4,
            us,
        );
        let words: Vec<u32> = (0..rows)
            .flat_map(|r| {
                sample::SampleParams {
                    top_k: 40,
                    top_p: 0.95,
                    temperature: 0.8,
                    uniform: (r as f32 * 0.37).fract(),
                }
                .words()
            })
            .collect();
        let pd = gpu.stream.clone_htod(&words)?;
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                sample::SAMPLE,
                sample::sample_launch(rows),
                [&ld, &mut ad, &pd, &v32]
            );
            Ok(())
        })? * 1e3;
        other(
            "sample_rows (k 40, p 0.95)",
            &format!("{rows}x{vocab}"),
            rows * vocab * 4,
            us,
        );
        let mut sd = gpu.stream.alloc_zeros::<f32>(rows * vocab)?;
        let us = time_launches(&gpu.stream, 7, 5, 200, |_| {
            launch!(
                gpu,
                sample::SOFTMAX,
                sample::launch(rows),
                [&ld, &mut sd, &v32]
            );
            Ok(())
        })? * 1e3;
        other(
            sample::SOFTMAX,
            &format!("{rows}x{vocab}"),
            rows * vocab * 8,
            us,
        );
    }
    Ok(table)
}
