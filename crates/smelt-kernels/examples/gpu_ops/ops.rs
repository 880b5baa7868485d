//! The small ops against their CPU twins (`smelt_kernels::ops`, `fused`): RMS norms (plain,
//! with the residual add, into q8_1 tiles), rope (normal, NeoX, frequency factors, long
//! positions) and the fused rope + KV append, the GLUs (f32 and into q8_1 tiles), the
//! elementwise adds/scales, the embedding lookups and dequantizers of every table type;
//! ragged rows and columns, outputs poisoned with NaN / 0xFFFF first.

use anyhow::Result;
use cudarc::driver::PushKernelArg;
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::ops::{attention, elementwise, embed, kv, norm, rope};
use smelt_kernels::GgmlType;

use super::attention::{f16_bits, paged};
use super::harness::{floats, launch_values, nan, ptr, Check, Gpu, Report};

pub const NORM: &[&str] = &["rms_norm", "add_rms_norm", "rms_norm_pair"];
pub const ROPE: &[&str] = &["rope_normal", "rope_neox"];
pub const ROPE_KV_ROWS: &[&str] = &["rope_kv_rows_*"];
pub const GLU_Q8: &[&str] = &["glu_*_q8_1", "glu_*_f16"];
pub const REDUCE_Q8: &[&str] = &["attention_reduce_q8_1", "attention_reduce_f16"];
pub const NORM_Q8: &[&str] = &[
    "rms_norm_q8_1",
    "add_rms_norm_q8_1",
    "rms_norm_f16",
    "add_rms_norm_f16",
];
pub const ELEMENTWISE: &[&str] = &[
    "glu_silu",
    "glu_gelu",
    "add_f32",
    "scale_f32",
    "add_bias_f32",
];
pub const EMBED: &[&str] = &["embed_*", "dequantize_*"];

pub fn check_norms(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut plain, mut fused, mut resid) = (
        Check::new("rms_norm"),
        Check::new("add_rms_norm (out)"),
        Check::new("add_rms_norm (x += y)"),
    );
    // (rows, cols, chunk): whole rows and per-head chunks, ragged sizes.
    for (rows, cols, n) in [
        (1, 4096, 4096),
        (5, 576, 576),
        (3, 2304, 2304),
        (7, 1000, 1000),
        (4, 4096, 128),
        (9, 576, 64),
        (2, 8192, 8192),
        (1, 33, 33),
    ] {
        let x = floats(rng, rows * cols, 3.0);
        let w = floats(rng, n, 1.5);
        let eps = 1e-6;
        let mut want = vec![0f32; rows * cols];
        norm::rms_norm_cpu(&x, &w, eps, &mut want);
        let (xd, wd) = (gpu.stream.clone_htod(&x)?, gpu.stream.clone_htod(&w)?);
        let mut od = gpu.stream.clone_htod(&nan(rows * cols))?;
        let n32 = n as u32;
        launch!(
            gpu,
            norm::RMS_NORM,
            norm::launch(rows * cols / n, n),
            [&xd, &wd, &mut od, &n32, &eps]
        );
        let case = format!("{rows}x{cols}/{n}");
        plain.add(&case, &gpu.stream.clone_dtoh(&od)?, &want, 1e-6, 2e-6);

        let y = floats(rng, rows * cols, 1.0);
        let mut xw = x.clone();
        norm::add_rms_norm_cpu(&mut xw, &y, &w, eps, &mut want);
        let mut xd = gpu.stream.clone_htod(&x)?;
        let yd = gpu.stream.clone_htod(&y)?;
        let mut od = gpu.stream.clone_htod(&nan(rows * cols))?;
        launch!(
            gpu,
            norm::ADD_RMS_NORM,
            norm::launch(rows * cols / n, n),
            [&mut xd, &yd, &wd, &mut od, &n32, &eps]
        );
        fused.add(&case, &gpu.stream.clone_dtoh(&od)?, &want, 1e-6, 2e-6);
        resid.add(&case, &gpu.stream.clone_dtoh(&xd)?, &xw, 0.0, 0.0);
    }
    rep.push("rms_norm", plain, "1e-6 + 2e-6|r|");
    rep.push("add_rms_norm (out)", fused, "1e-6 + 2e-6|r|");
    rep.push("add_rms_norm (x += y)", resid, "exact");
    check_norm_pair(gpu, rng, rep)
}

/// The Q|K head norms in one launch (`rms_norm_pair`, in place): each part's heads
/// against `rms_norm`'s on the GPU, bit for bit (the same block size gives the same
/// floats), and against the CPU twin; (Q heads, K heads, head size) of Qwen3-30B-A3B,
/// Qwen3-8B, Gemma 3 270M, and a ragged one.
fn check_norm_pair(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut cpu, mut bits) = (
        Check::new("rms_norm_pair"),
        Check::new("rms_norm_pair (vs rms_norm)"),
    );
    for (hq, hk, n) in [
        (32usize, 4usize, 128usize),
        (32, 8, 128),
        (4, 1, 256),
        (3, 2, 80),
    ] {
        let case = format!("{hq}+{hk}x{n}");
        let x = floats(rng, (hq + hk) * n, 3.0);
        let (wq, wk) = (floats(rng, n, 1.5), floats(rng, n, 1.5));
        let mut want = vec![0f32; x.len()];
        norm::rms_norm_cpu(&x[..hq * n], &wq, 1e-6, &mut want[..hq * n]);
        norm::rms_norm_cpu(&x[hq * n..], &wk, 1e-6, &mut want[hq * n..]);
        let eps = 1e-6f32;
        let (wqd, wkd) = (gpu.stream.clone_htod(&wq)?, gpu.stream.clone_htod(&wk)?);
        let xd = gpu.stream.clone_htod(&x)?;
        let n32 = n as u32;
        let a = norm::RmsNormPairArgs {
            x: ptr(gpu, &xd),
            w: ptr(gpu, &wqd),
            w2: ptr(gpu, &wkd),
            // In place, as the engine runs it.
            out: ptr(gpu, &xd),
            n: n32,
            split: hq as u32,
            eps,
        };
        launch_values(
            gpu,
            norm::RMS_NORM_PAIR,
            norm::launch(hq + hk, n),
            &a.values(),
        )?;
        let got = gpu.stream.clone_dtoh(&xd)?;
        cpu.add(&case, &got, &want, 1e-6, 2e-6);
        // The unfused GPU norms, one launch a part, into poisoned outputs.
        let (qd, kd) = (
            gpu.stream.clone_htod(&x[..hq * n])?,
            gpu.stream.clone_htod(&x[hq * n..])?,
        );
        let (mut oq, mut ok) = (
            gpu.stream.clone_htod(&nan(hq * n))?,
            gpu.stream.clone_htod(&nan(hk * n))?,
        );
        launch!(
            gpu,
            norm::RMS_NORM,
            norm::launch(hq, n),
            [&qd, &wqd, &mut oq, &n32, &eps]
        );
        launch!(
            gpu,
            norm::RMS_NORM,
            norm::launch(hk, n),
            [&kd, &wkd, &mut ok, &n32, &eps]
        );
        let mut unfused = gpu.stream.clone_dtoh(&oq)?;
        unfused.extend(gpu.stream.clone_dtoh(&ok)?);
        let b = |v: &[f32]| {
            v.iter()
                .map(|f| u64::from(f.to_bits()))
                .collect::<Vec<u64>>()
        };
        bits.bits(&case, &b(&got), &b(&unfused));
    }
    rep.push("rms_norm_pair", cpu, "1e-6 + 2e-6|r|");
    rep.push("rms_norm_pair (vs rms_norm)", bits, "exact (bits)");
    Ok(())
}

pub fn check_rope(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    for style in [rope::RopeStyle::Normal, rope::RopeStyle::Neox] {
        let mut c = Check::new(rope::name(style));
        // (rows, heads, head_dim, n_rot, freq factors, base, scale)
        for (rows, heads, hd, n_rot, ff, base, fscale) in [
            (1, 32, 128, 128, false, 500000.0f32, 1.0f32),
            (7, 8, 128, 128, true, 500000.0, 1.0),
            (5, 9, 64, 64, false, 10000.0, 1.0),
            (3, 4, 256, 256, false, 1000000.0, 0.125),
            (4, 2, 128, 64, false, 10000.0, 1.0),
            (2, 3, 80, 32, true, 10000.0, 0.5),
        ] {
            let cols = heads * hd;
            let x = floats(rng, rows * cols, 2.0);
            let mut pos: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..8192)).collect();
            pos[0] = 131_000; // a long context: the angle reduction must hold there
            let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + (i % 7) as f32).collect();
            let mut want = x.clone();
            rope::rope_cpu(
                &mut want,
                &pos,
                cols,
                hd,
                n_rot,
                style,
                base,
                fscale,
                ff.then_some(&factors[..]),
            );
            let mut xd = gpu.stream.clone_htod(&x)?;
            let pd = gpu.stream.clone_htod(&pos)?;
            let fd = gpu.stream.clone_htod(&factors)?;
            let fptr: u64 = if ff {
                let (p, _g) = cudarc::driver::DevicePtr::device_ptr(&fd, &gpu.stream);
                p
            } else {
                0
            };
            let (c32, hd32, nr32) = (cols as u32, hd as u32, n_rot as u32);
            let ts = rope::theta_scale(base, n_rot);
            launch!(
                gpu,
                rope::name(style),
                rope::launch(rows, cols, hd, n_rot),
                [&mut xd, &pd, &fptr, &c32, &hd32, &nr32, &ts, &fscale]
            );
            c.add(
                &format!("{rows}x{heads}x{hd} rot {n_rot} ff {ff}"),
                &gpu.stream.clone_dtoh(&xd)?,
                &want,
                1e-5,
                1e-5,
            );
        }
        rep.push(rope::name(style), c, "1e-5 + 1e-5|r|");
    }
    Ok(())
}

/// The fused rope + KV append of a whole step (`rope_kv_rows_*`): ragged sequences (64
/// decode rows; prompts and decodes mixed; more than 1,024 tokens of one sequence, so
/// blocks stride), head sizes 64-256, frequency factors. Q and K against the rope twin and
/// bit for bit against the unfused GPU path (`rope_*` of Q, of K, then `kv_append`), the
/// caches bit for bit against that path, V's against the twin too. The same cases through
/// the variant that RMS-normalizes each Q and K head first (`rope_kv_rows_*_qknorm`), Q, K
/// and the K cache against the twin (`head_norms_cpu`, then `rope_kv_rows_cpu`), V's cache bit for bit.
pub fn check_rope_kv_rows(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let decode: Vec<(usize, usize)> = (0..64).map(|i| (i * 37 % 900, 1)).collect();
    let mixed = [(0, 37), (100, 1), (5, 3), (4000, 1)];
    for style in [rope::RopeStyle::Normal, rope::RopeStyle::Neox] {
        let name = rope::kv_rows_name(style);
        let norm_name = rope::kv_rows_norm_name(style);
        let (mut cx, mut cc) = (
            Check::new(&format!("{name} (Q, K)")),
            Check::new(&format!("{name} (caches)")),
        );
        let mut cn = Check::new(&format!("{norm_name} (Q, K, K cache)"));
        let mut cnv = Check::new(&format!("{norm_name} (V cache)"));
        // (sequences, n_head, n_head_kv, head_dim, block size, freq factors, base, scale)
        for (shape, n_head, n_head_kv, hd, bs, ff, base, fscale) in [
            (&decode[..], 32, 8, 128, 16, false, 500000.0f32, 1.0f32),
            (&mixed[..], 9, 3, 64, 16, true, 10000.0, 1.0),
            (
                &[(131_000, 2), (0, 1100)][..],
                4,
                1,
                256,
                8,
                false,
                1000000.0,
                0.125,
            ),
            (&[(700, 5), (3, 2)][..], 6, 2, 80, 12, true, 10000.0, 0.5),
            (&[(9, 1)][..], 8, 8, 96, 16, false, 10000.0, 1.0),
        ] {
            let (q_dim, kv_dim) = (n_head * hd, n_head_kv * hd);
            let p = paged(rng, shape, bs);
            let positions: Vec<u32> = shape
                .iter()
                .flat_map(|&(start, n)| (start..start + n).map(|x| x as u32))
                .collect();
            let rows = p.rows;
            let cache_len = p.n_blocks * bs * kv_dim;
            let (kc0, vc0) = (f16_bits(rng, cache_len), f16_bits(rng, cache_len));
            let (q, k, v) = (
                floats(rng, rows * q_dim, 2.0),
                floats(rng, rows * kv_dim, 2.0),
                floats(rng, rows * kv_dim, 1.0),
            );
            let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + (i % 7) as f32).collect();
            let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
            let sd = gpu.stream.clone_htod(&words)?;
            let td = gpu.stream.clone_htod(&p.tables)?;
            let pd = gpu.stream.clone_htod(&positions)?;
            let fd = gpu.stream.clone_htod(&factors)?;
            let fptr = if ff { ptr(gpu, &fd) } else { 0 };
            let vd = gpu.stream.clone_htod(&v)?;
            let ts = rope::theta_scale(base, hd);
            // Fused.
            let (qd, kd) = (gpu.stream.clone_htod(&q)?, gpu.stream.clone_htod(&k)?);
            let (kcd, vcd) = (gpu.stream.clone_htod(&kc0)?, gpu.stream.clone_htod(&vc0)?);
            let a = rope::RopeKvRowsArgs {
                q: ptr(gpu, &qd),
                k: ptr(gpu, &kd),
                v: ptr(gpu, &vd),
                pos: ptr(gpu, &pd),
                freq_factors: fptr,
                k_cache: ptr(gpu, &kcd),
                v_cache: ptr(gpu, &vcd),
                seqs: ptr(gpu, &sd),
                block_tables: ptr(gpu, &td),
                n_head: n_head as u32,
                n_head_kv: n_head_kv as u32,
                head_dim: hd as u32,
                block_size: bs as u32,
                theta_scale: ts,
                freq_scale: fscale,
            };
            let l = rope::kv_rows_launch(p.seqs.len(), p.max_tokens, n_head, n_head_kv, hd);
            launch_values(gpu, name, l, &a.values())?;
            // Unfused, on the GPU: rope of Q, rope of K, then kv_append.
            let (qu, ku) = (gpu.stream.clone_htod(&q)?, gpu.stream.clone_htod(&k)?);
            let (kcu, vcu) = (gpu.stream.clone_htod(&kc0)?, gpu.stream.clone_htod(&vc0)?);
            for (x, cols) in [(&qu, q_dim), (&ku, kv_dim)] {
                let r = rope::RopeArgs {
                    x: ptr(gpu, x),
                    pos: ptr(gpu, &pd),
                    freq_factors: fptr,
                    cols: cols as u32,
                    head_dim: hd as u32,
                    n_rot: hd as u32,
                    theta_scale: ts,
                    freq_scale: fscale,
                };
                let l = rope::launch(rows, cols, hd, hd);
                launch_values(gpu, rope::name(style), l, &r.values())?;
            }
            let ka = kv::KvAppendArgs {
                k: ptr(gpu, &ku),
                v: ptr(gpu, &vd),
                k_cache: ptr(gpu, &kcu),
                v_cache: ptr(gpu, &vcu),
                seqs: ptr(gpu, &sd),
                block_tables: ptr(gpu, &td),
                kv_dim: kv_dim as u32,
                block_size: bs as u32,
            };
            let l = kv::launch(p.seqs.len(), p.max_tokens, kv_dim);
            launch_values(gpu, kv::KV_APPEND, l, &ka.values())?;
            // The twin (after the Q and K head norms when given): Q, K and both caches.
            let twin = |norms: Option<(&[f32], &[f32], f32)>| {
                let (mut qw, mut kw, mut kcw, mut vcw) =
                    (q.clone(), k.clone(), kc0.clone(), vc0.clone());
                if let Some(n) = norms {
                    rope::head_norms_cpu(&mut qw, &mut kw, hd, n);
                }
                rope::rope_kv_rows_cpu(
                    &mut qw,
                    &mut kw,
                    &v,
                    &positions,
                    &mut kcw,
                    &mut vcw,
                    &p.seqs,
                    &p.tables,
                    (n_head, n_head_kv, hd, bs),
                    style,
                    (base, fscale),
                    ff.then_some(&factors[..]),
                );
                (qw, kw, kcw, vcw)
            };
            let (qw, kw, _, vcw) = twin(None);
            let case = format!(
                "{} seqs {rows} rows {n_head}/{n_head_kv}x{hd} bs {bs} ff {ff}",
                p.seqs.len()
            );
            let (qg, kg) = (gpu.stream.clone_dtoh(&qd)?, gpu.stream.clone_dtoh(&kd)?);
            cx.add(&format!("Q {case}"), &qg, &qw, 1e-5, 1e-5);
            cx.add(&format!("K {case}"), &kg, &kw, 1e-5, 1e-5);
            cx.add(
                &format!("Q {case} vs rope_*"),
                &qg,
                &gpu.stream.clone_dtoh(&qu)?,
                0.0,
                0.0,
            );
            cx.add(
                &format!("K {case} vs rope_*"),
                &kg,
                &gpu.stream.clone_dtoh(&ku)?,
                0.0,
                0.0,
            );
            let (kcg, vcg) = (gpu.stream.clone_dtoh(&kcd)?, gpu.stream.clone_dtoh(&vcd)?);
            cc.bits(
                &format!("K cache {case} vs unfused"),
                &kcg,
                &gpu.stream.clone_dtoh(&kcu)?,
            );
            cc.bits(
                &format!("V cache {case} vs unfused"),
                &vcg,
                &gpu.stream.clone_dtoh(&vcu)?,
            );
            cc.bits(&format!("V cache {case} vs twin"), &vcg, &vcw);
            // With the Q and K head norms first.
            let (wq, wk): (Vec<f32>, Vec<f32>) = (
                (0..hd).map(|_| rng.gen_range(0.5..1.5)).collect(),
                (0..hd).map(|_| rng.gen_range(0.5..1.5)).collect(),
            );
            let (wqd, wkd) = (gpu.stream.clone_htod(&wq)?, gpu.stream.clone_htod(&wk)?);
            let eps = 1e-6f32;
            let (qn, kn) = (gpu.stream.clone_htod(&q)?, gpu.stream.clone_htod(&k)?);
            let (kcn, vcn) = (gpu.stream.clone_htod(&kc0)?, gpu.stream.clone_htod(&vc0)?);
            let mut values = rope::RopeKvRowsArgs {
                q: ptr(gpu, &qn),
                k: ptr(gpu, &kn),
                k_cache: ptr(gpu, &kcn),
                v_cache: ptr(gpu, &vcn),
                ..a
            }
            .values();
            values.extend(
                rope::HeadNormArgs {
                    q_norm: ptr(gpu, &wqd),
                    k_norm: ptr(gpu, &wkd),
                    eps,
                }
                .values(),
            );
            let l = rope::kv_rows_launch(p.seqs.len(), p.max_tokens, n_head, n_head_kv, hd);
            launch_values(gpu, norm_name, l, &values)?;
            let (qw, kw, kcw, vcw) = twin(Some((&wq, &wk, eps)));
            let halfs = |b: &[u16]| {
                b.iter()
                    .map(|&x| f16::from_bits(x).to_f32())
                    .collect::<Vec<_>>()
            };
            let (qg, kg) = (gpu.stream.clone_dtoh(&qn)?, gpu.stream.clone_dtoh(&kn)?);
            cn.add(&format!("Q {case}"), &qg, &qw, 2e-5, 2e-5);
            cn.add(&format!("K {case}"), &kg, &kw, 2e-5, 2e-5);
            let kcg = halfs(&gpu.stream.clone_dtoh(&kcn)?);
            // f16 rounding of values a few ulps apart: one f16 step.
            cn.add(&format!("K cache {case}"), &kcg, &halfs(&kcw), 1e-3, 1e-3);
            cnv.bits(
                &format!("V cache {case} vs twin"),
                &gpu.stream.clone_dtoh(&vcn)?,
                &vcw,
            );
        }
        rep.push(&format!("{name} (Q, K)"), cx, "1e-5 + 1e-5|r|, = rope_*");
        rep.push(&format!("{name} (caches)"), cc, "exact (bits) vs unfused");
        rep.push(
            &format!("{norm_name} (Q, K, K cache)"),
            cn,
            "2e-5 + 2e-5|r| (K cache 1e-3 + 1e-3|r|)",
        );
        rep.push(
            &format!("{norm_name} (V cache)"),
            cnv,
            "exact (bits) vs twin",
        );
    }
    Ok(())
}

/// The fused norm + q8_1 kernels (`fused::kernel`, what a decode step runs before the
/// GEMVs) and their f16-row twins (`fused::Sink::F16Rows`, before the narrow GEMM): the
/// f32 output against the norm twin (launched with the same block size it is the same
/// floats), the residual `x += y` exactly, the tiles or rows byte for byte against the
/// twin (`fused::sink_cpu`) of the GPU's own f32 output; rows whose last tile is partly
/// padded.
pub fn check_norm_q8(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::fused;
    for (add, sink) in [false, true]
        .into_iter()
        .flat_map(|a| fused::Sink::ALL.map(|s| (a, s)))
    {
        let name = fused::norm_name(add, sink);
        let (mut cf, mut cq, mut cx) = (
            Check::new(&format!("{name} (f32)")),
            Check::new(&format!("{name} ({sink:?})")),
            Check::new(&format!("{name} (x += y)")),
        );
        for (rows, n) in [
            (1usize, 4096usize),
            (5, 576),
            (3, 2304),
            (7, 800),
            (2, 8192),
            (1, 32),
        ] {
            let case = format!("{rows}x{n}");
            if !super::harness::want(&case) {
                continue;
            }
            let x = floats(rng, rows * n, 3.0);
            let y = floats(rng, rows * n, 1.0);
            let w = floats(rng, n, 1.5);
            let eps = 1e-6f32;
            let mut xw = x.clone();
            let (want, _) = fused::cpu(&mut xw, add.then_some(&y[..]), &w, eps)?;
            let mut xd = gpu.stream.clone_htod(&x)?;
            let (yd, wd) = (gpu.stream.clone_htod(&y)?, gpu.stream.clone_htod(&w)?);
            let mut od = gpu.stream.clone_htod(&nan(rows * n))?;
            let mut qd = gpu
                .stream
                .clone_htod(&vec![0xA5u8; rows * sink.row_bytes(n)?])?;
            let (n32, ntiles) = (n as u32, n.div_ceil(smelt_kernels::TILE) as u32);
            if add {
                launch!(
                    gpu,
                    name,
                    fused::launch(rows, n),
                    [&mut xd, &yd, &wd, &mut od, &mut qd, &n32, &ntiles, &eps]
                );
            } else {
                launch!(
                    gpu,
                    name,
                    fused::launch(rows, n),
                    [&mut xd, &wd, &mut od, &mut qd, &n32, &ntiles, &eps]
                );
            }
            let got = gpu.stream.clone_dtoh(&od)?;
            cf.add(&case, &got, &want, 1e-6, 2e-6);
            let want_q: Vec<u16> = fused::sink_cpu(&got, n, sink)?
                .iter()
                .map(|&b| u16::from(b))
                .collect();
            let got_q: Vec<u16> = gpu
                .stream
                .clone_dtoh(&qd)?
                .iter()
                .map(|&b| u16::from(b))
                .collect();
            cq.bits(&case, &got_q, &want_q);
            if add {
                cx.add(&case, &gpu.stream.clone_dtoh(&xd)?, &xw, 0.0, 0.0);
            }
        }
        rep.push(&format!("{name} (f32)"), cf, "1e-6 + 2e-6|r|");
        rep.push(&format!("{name} ({sink:?})"), cq, "exact bytes");
        if add {
            rep.push(&format!("{name} (x += y)"), cx, "exact");
        }
    }
    Ok(())
}

/// The fused GLU + q8_1 kernels and their f16-row twins: the f32 output against the GLU
/// twin (as `glu_*`), the tiles or rows byte for byte against the twin
/// (`fused::sink_cpu`) of the GPU's own f32 output.
pub fn check_glu_q8(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::fused;
    for (a, sink) in [elementwise::Glu::Silu, elementwise::Glu::Gelu]
        .into_iter()
        .flat_map(|a| fused::Sink::ALL.map(|s| (a, s)))
    {
        let name = fused::glu_name(a, sink);
        let (mut cf, mut cq) = (
            Check::new(&format!("{name} (f32)")),
            Check::new(&format!("{name} ({sink:?})")),
        );
        for (rows, k) in [(1usize, 14336usize), (3, 2048), (2, 288), (5, 32)] {
            let mut g = floats(rng, rows * k, 12.0);
            let u = floats(rng, rows * k, 2.0);
            let (mut gd, ud) = (gpu.stream.clone_htod(&g)?, gpu.stream.clone_htod(&u)?);
            let ntiles = k.div_ceil(smelt_kernels::TILE) as u32;
            let mut qd = gpu
                .stream
                .clone_htod(&vec![0xA5u8; rows * sink.row_bytes(k)?])?;
            let k32 = k as u32;
            launch!(
                gpu,
                name,
                fused::glu_q8_launch(rows, k),
                [&mut gd, &ud, &mut qd, &k32, &ntiles]
            );
            let got = gpu.stream.clone_dtoh(&gd)?;
            elementwise::glu_cpu(&mut g, &u, a);
            let rtol = match a {
                elementwise::Glu::Silu => 2e-6,
                elementwise::Glu::Gelu => 2e-3,
            };
            let case = format!("{rows}x{k}");
            cf.add(&case, &got, &g, 1e-6, rtol);
            let bytes = |b: &[u8]| b.iter().map(|&v| f32::from(v)).collect::<Vec<f32>>();
            let got_q = bytes(&gpu.stream.clone_dtoh(&qd)?);
            cq.add(
                &case,
                &got_q,
                &bytes(&fused::sink_cpu(&got, k, sink)?),
                0.0,
                0.0,
            );
        }
        rep.push(&format!("{name} (f32)"), cf, "as glu");
        rep.push(&format!("{name} ({sink:?})"), cq, "exact bytes");
    }
    Ok(())
}

/// The attention combine with what the output projection reads of its output (q8_1 tiles
/// or f16 rows): on the same random partials, the f32 output equal to `attention_reduce`'s,
/// the tiles or rows byte for byte their twin's (`fused::sink_cpu`) of that output.
pub fn check_reduce_q8(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::fused::{sink_cpu, Sink};
    for sink in Sink::ALL {
        let name = attention::reduce_sink_name(sink);
        let (mut cf, mut cq) = (
            Check::new(&format!("{name} (f32)")),
            Check::new(&format!("{name} ({sink:?})")),
        );
        for (rows, n_head, head_dim, splits) in [
            (1usize, 32usize, 128usize, 17usize),
            (3, 4, 256, 5),
            (2, 8, 64, 1),
        ] {
            let n = rows * n_head * splits;
            let acc = floats(rng, n * head_dim, 3.0);
            let ml: Vec<f32> = (0..n)
                .flat_map(|_| [rng.gen_range(-4.0f32..4.0), rng.gen_range(0.5f32..8.0)])
                .collect();
            let (accd, mld) = (gpu.stream.clone_htod(&acc)?, gpu.stream.clone_htod(&ml)?);
            let cols = n_head * head_dim;
            let plain = gpu.stream.clone_htod(&vec![f32::NAN; rows * cols])?;
            let fused = gpu.stream.clone_htod(&vec![f32::NAN; rows * cols])?;
            let qd = gpu
                .stream
                .clone_htod(&vec![0xA5u8; rows * sink.row_bytes(cols)?])?;
            let l = attention::reduce_launch(rows, n_head, head_dim);
            let r = attention::ReduceArgs {
                part_acc: ptr(gpu, &accd),
                part_ml: ptr(gpu, &mld),
                out: ptr(gpu, &plain),
                n_splits: splits as u32,
                head_dim: head_dim as u32,
            };
            launch_values(gpu, attention::REDUCE, l, &r.values())?;
            let rq = attention::ReduceQ8Args {
                part_acc: ptr(gpu, &accd),
                part_ml: ptr(gpu, &mld),
                out: ptr(gpu, &fused),
                q: ptr(gpu, &qd),
                n_splits: splits as u32,
                head_dim: head_dim as u32,
            };
            launch_values(gpu, name, l, &rq.values())?;
            let want = gpu.stream.clone_dtoh(&plain)?;
            let got = gpu.stream.clone_dtoh(&fused)?;
            let case = format!("{rows}x{n_head}x{head_dim}, {splits} splits");
            cf.add(&case, &got, &want, 0.0, 0.0);
            cq.bits(
                &case,
                &gpu.stream.clone_dtoh(&qd)?,
                &sink_cpu(&want, cols, sink)?,
            );
        }
        rep.push(&format!("{name} (f32)"), cf, "= attention_reduce");
        rep.push(&format!("{name} ({sink:?})"), cq, "exact bytes");
    }
    Ok(())
}

pub fn check_elementwise(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    for act in [elementwise::Glu::Silu, elementwise::Glu::Gelu] {
        let mut c = Check::new(elementwise::glu_name(act));
        for n in [1usize, 255, 14336, 3 * 6912 + 5, 1 << 20] {
            let mut g = floats(rng, n, 12.0);
            let u = floats(rng, n, 2.0);
            let (mut gd, ud) = (gpu.stream.clone_htod(&g)?, gpu.stream.clone_htod(&u)?);
            let n32 = n as u32;
            launch!(
                gpu,
                elementwise::glu_name(act),
                elementwise::launch(n),
                [&mut gd, &ud, &n32]
            );
            elementwise::glu_cpu(&mut g, &u, act);
            let (atol, rtol) = match act {
                elementwise::Glu::Silu => (1e-6, 2e-6),
                elementwise::Glu::Gelu => (1e-6, 2e-3),
            };
            c.add(
                &format!("n={n}"),
                &gpu.stream.clone_dtoh(&gd)?,
                &g,
                atol,
                rtol,
            );
        }
        let tol = match act {
            elementwise::Glu::Silu => "1e-6 + 2e-6|r|",
            elementwise::Glu::Gelu => "1e-6 + 2e-3|r| (f16 ulp)",
        };
        rep.push(elementwise::glu_name(act), c, tol);
    }
    check_glu_q8(gpu, rng, rep)?;
    check_reduce_q8(gpu, rng, rep)?;
    let (mut ca, mut cs, mut cb) = (
        Check::new(elementwise::ADD),
        Check::new(elementwise::SCALE),
        Check::new(elementwise::ADD_BIAS),
    );
    for (rows, cols) in [(1usize, 4096usize), (7, 896), (3, 1000), (513, 37)] {
        let n = rows * cols;
        let n32 = n as u32;
        let mut x = floats(rng, n, 5.0);
        let y = floats(rng, n, 5.0);
        let mut xd = gpu.stream.clone_htod(&x)?;
        let yd = gpu.stream.clone_htod(&y)?;
        launch!(
            gpu,
            elementwise::ADD,
            elementwise::launch(n),
            [&mut xd, &yd, &n32]
        );
        elementwise::add_cpu(&mut x, &y);
        ca.add(
            &format!("{rows}x{cols}"),
            &gpu.stream.clone_dtoh(&xd)?,
            &x,
            0.0,
            0.0,
        );
        let s = rng.gen_range(0.1f32..3.0);
        launch!(
            gpu,
            elementwise::SCALE,
            elementwise::launch(n),
            [&mut xd, &n32, &s]
        );
        elementwise::scale_cpu(&mut x, s);
        cs.add(
            &format!("{rows}x{cols}"),
            &gpu.stream.clone_dtoh(&xd)?,
            &x,
            0.0,
            0.0,
        );
        let b = floats(rng, cols, 1.0);
        let bd = gpu.stream.clone_htod(&b)?;
        let c32 = cols as u32;
        launch!(
            gpu,
            elementwise::ADD_BIAS,
            elementwise::launch_bias(rows, cols),
            [&mut xd, &bd, &c32]
        );
        elementwise::add_bias_cpu(&mut x, &b);
        cb.add(
            &format!("{rows}x{cols}"),
            &gpu.stream.clone_dtoh(&xd)?,
            &x,
            0.0,
            0.0,
        );
    }
    rep.push(elementwise::ADD, ca, "exact");
    rep.push(elementwise::SCALE, cs, "exact");
    rep.push(elementwise::ADD_BIAS, cb, "exact");
    Ok(())
}

/// `rows` rows of `cols` values of `ty` in ggml bytes, from random floats.
fn table(rng: &mut impl Rng, ty: GgmlType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let x = floats(rng, rows * cols, 2.0);
    Ok(match ty {
        GgmlType::F32 => bytemuck::cast_slice(&x).to_vec(),
        GgmlType::F16 => x
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::BF16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let rb = embed::row_bytes(ty, cols)?;
            let mut out = vec![0u8; rows * rb];
            for (src, dst) in x.chunks(cols).zip(out.chunks_mut(rb)) {
                smelt_quant::quantize_row(ty, src, dst)?;
            }
            out
        }
    })
}

pub fn check_embed(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    for ty in embed::TYPES {
        let mut c = Check::new(&format!("embed+dequantize {}", ty.name()));
        let cols_options: &[usize] = if ty.block_size() == 256 {
            &[256, 768, 2304]
        } else if ty.block_size() == 32 {
            &[32, 96, 4128]
        } else {
            &[7, 576, 1000]
        };
        for (&cols, rows) in cols_options.iter().zip([129usize, 7, 33]) {
            let t = table(rng, ty, rows, cols)?;
            let rb = embed::row_bytes(ty, cols)?;
            let td = gpu.stream.clone_htod(&t)?;
            // Embedding: ids in range, repeated, and one past the table (NaN row).
            let mut ids: Vec<u32> = (0..11).map(|_| rng.gen_range(0..rows as u32)).collect();
            ids[3] = rows as u32;
            let want = embed::embed_cpu(ty, &t, rows, cols, &ids)?;
            let idd = gpu.stream.clone_htod(&ids)?;
            let mut od = gpu.stream.clone_htod(&nan(ids.len() * cols))?;
            let (c32, rb32, nv32) = (cols as u32, rb as u32, rows as u32);
            launch!(
                gpu,
                &embed::embed_name(ty)?,
                embed::launch(ids.len(), cols),
                [&td, &idd, &mut od, &c32, &rb32, &nv32]
            );
            c.add(
                &format!("embed {rows}x{cols}"),
                &gpu.stream.clone_dtoh(&od)?,
                &want,
                0.0,
                0.0,
            );
            // Dequantize the whole table, to f32 and to f16.
            let want = embed::dequantize_cpu(ty, &t, rows, cols)?;
            let mut od = gpu.stream.clone_htod(&nan(rows * cols))?;
            launch!(
                gpu,
                &embed::dequantize_name(ty, embed::OutType::F32)?,
                embed::launch(rows, cols),
                [&td, &mut od, &c32, &rb32]
            );
            c.add(
                &format!("dequantize f32 {rows}x{cols}"),
                &gpu.stream.clone_dtoh(&od)?,
                &want,
                0.0,
                0.0,
            );
            let want16 = embed::dequantize_f16_cpu(ty, &t, rows, cols)?;
            let mut hd = gpu.stream.clone_htod(&vec![0xFFFFu16; rows * cols])?;
            launch!(
                gpu,
                &embed::dequantize_name(ty, embed::OutType::F16)?,
                embed::launch(rows, cols),
                [&td, &mut hd, &c32, &rb32]
            );
            c.bits(
                &format!("dequantize f16 {rows}x{cols}"),
                &gpu.stream.clone_dtoh(&hd)?,
                &want16,
            );
        }
        rep.push(
            &format!("embed+dequantize {}", ty.name()),
            c,
            "exact (bits)",
        );
    }
    Ok(())
}
