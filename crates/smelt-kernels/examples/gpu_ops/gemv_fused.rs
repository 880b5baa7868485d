//! The fused single-token GEMVs: the split residual norm (`gemv::Fuse`'s producer
//! `_resnorm` and consumer `_rmsin` halves) and the Q|K|V GEMV with the rope + KV-append
//! epilogue (`_ropekv`), against their CPU twins and against the unfused kernels they
//! replace, on ragged lengths (a last tile partly padded) with poisoned outputs.

use anyhow::Result;
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::gemv::{self as gemv, Config};
use smelt_kernels::{act, catalog, GgmlType};

use super::gemv::GemvDims;
use super::harness::{
    launch_values, ptr, random_floats, random_weights, want, worst_scaled, Gpu, Report,
};

/// The split norm's halves.
pub const SPLIT_NORM: &[&str] = &["gemv_*resnorm*", "gemv_*rmsin*"];
/// The rope + KV-append GEMVs.
pub const ROPE_KV: &[&str] = &["gemv_*ropekv*"];

/// A one-token GEMV's inputs on both sides: random weights (ggml bytes for the CPU twin,
/// the repacked copy on the GPU) and a random activation row quantized on the GPU (the
/// device row, and its bytes on the host for the twin).
struct OneToken {
    ggml: Vec<u8>,
    wd: CudaSlice<u8>,
    xq: CudaSlice<u8>,
    xqh: Vec<u8>,
}

fn one_token(
    gpu: &Gpu,
    rng: &mut impl Rng,
    ty: GgmlType,
    nrows: usize,
    k: usize,
) -> Result<OneToken> {
    let ggml = random_weights(rng, ty, nrows, k)?;
    let wd = gpu
        .stream
        .clone_htod(&catalog::repack(ty, &ggml, nrows, k)?)?;
    let xd = gpu.stream.clone_htod(&random_floats(rng, k, 2.0))?;
    let mut xq = gpu.stream.alloc_zeros::<u8>(act::row_bytes(k)?)?;
    gpu.quantize(&xd, &mut xq, k, 1)?;
    let xqh = gpu.stream.clone_dtoh(&xq)?;
    Ok(OneToken { ggml, wd, xq, xqh })
}

/// The split residual norm (`gemv::Fuse`): a producer GEMV (rows = the residual's length)
/// adds into `res` and writes unscaled q8_1 tiles and partial sums; a consumer GEMV reads
/// them and scales by `1 / rms`, and writes the norm's f32 output. Checked against the
/// twins: `y` and `res` within the GEMV bound, tiles exact bytes (from the GPU's `res`),
/// partial sums to 1e-5, the consumer within the GEMV bound times `1 / rms`, `out` to 1e-6.
pub fn check_split_norm(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let eps = 1e-5f32;
    for ty in catalog::GEMV_TYPES {
        let op = format!("gemv_resnorm {ty:?}");
        // (residual length n, producer k, consumer rows): n = 576 leaves its last tile
        // partly padded; K-quant consumers need n a multiple of 256.
        for (n, k_in, rows2) in [(576, 512, 70), (1024, 256, 33), (4096, 4096, 160)] {
            if n % ty.block_size() != 0 || k_in % ty.block_size() != 0 {
                continue;
            }
            let shape = format!("res {n} k {k_in} -> {rows2} rows");
            if !want(&shape) {
                continue;
            }
            let mut worst = [0f64; 6];
            let OneToken { ggml, wd, xq, xqh } = one_token(gpu, rng, ty, n, k_in)?;
            let res0 = random_floats(rng, n, 8.0);
            let g: Vec<f32> = (0..n).map(|_| rng.gen_range(0.2..2.0)).collect();
            let mut y = gpu.stream.clone_htod(&vec![f32::NAN; n])?;
            let mut res = gpu.stream.clone_htod(&res0)?;
            let gd = gpu.stream.clone_htod(&g)?;
            let mut q = gpu.stream.clone_htod(&vec![0xFFu8; act::row_bytes(n)?])?;
            let mut parts = gpu.stream.clone_htod(&vec![f32::NAN; n / 32])?;
            let rb = catalog::row_bytes(ty, k_in)?;
            gpu.gemv_resnorm_launch(
                ty,
                &wd,
                &xq,
                &mut y,
                (n, k_in, rb),
                &mut res,
                &gd,
                &mut q,
                &mut parts,
            )?;
            let (yw, mag) = gemv::cpu_with_magnitude(ty, &ggml, n, k_in, &xqh, 1)?;
            let yg = gpu.stream.clone_dtoh(&y)?;
            let resg = gpu.stream.clone_dtoh(&res)?;
            let qg = gpu.stream.clone_dtoh(&q)?;
            let pg = gpu.stream.clone_dtoh(&parts)?;
            let yw64: Vec<f64> = yw.iter().map(|&v| f64::from(v)).collect();
            worst[0] = worst[0].max(worst_scaled(&yg, &yw64, |i| mag[i]));
            let rw: Vec<f64> = res0
                .iter()
                .zip(&yw)
                .map(|(&a, &b)| f64::from(a) + f64::from(b))
                .collect();
            worst[1] = worst[1].max(worst_scaled(&resg, &rw, |i| mag[i] + rw[i].abs() * 1e-1));
            let qw = gemv::residual_norm_tiles(&resg, &g)?;
            let qdiff = qg.iter().zip(&qw).filter(|(a, b)| a != b).count();
            worst[2] = worst[2].max(qdiff as f64);
            let pw = gemv::residual_norm_partials(&resg);
            worst[3] = worst[3].max(worst_scaled(&pg, &pw, |i| pw[i]));
            // The consumer, on the producer's outputs.
            let ggml2 = random_weights(rng, ty, rows2, n)?;
            let wd2 = gpu
                .stream
                .clone_htod(&catalog::repack(ty, &ggml2, rows2, n)?)?;
            let rb2 = catalog::row_bytes(ty, n)?;
            let mut y2 = gpu.stream.clone_htod(&vec![f32::NAN; rows2])?;
            let mut out = gpu.stream.clone_htod(&vec![f32::NAN; n])?;
            gpu.gemv_rmsin_launch(
                (ty, Config::rms_input()),
                &wd2,
                &q,
                &mut y2,
                (rows2, n, rb2),
                &parts,
                eps,
                &res,
                &gd,
                Some(&mut out),
            )?;
            let pg64: Vec<f64> = pg.iter().map(|&v| f64::from(v)).collect();
            let inv = gemv::rms_input_scale(&pg64, n, eps);
            let (y2w, mag2) = gemv::cpu_with_magnitude(ty, &ggml2, rows2, n, &qg, 1)?;
            let y2w: Vec<f64> = y2w.iter().map(|&v| f64::from(v) * inv).collect();
            let y2g = gpu.stream.clone_dtoh(&y2)?;
            worst[4] = worst[4].max(worst_scaled(&y2g, &y2w, |i| mag2[i] * inv + y2w[i].abs()));
            let ow: Vec<f64> = resg
                .iter()
                .zip(&g)
                .map(|(&r, &w)| f64::from(r) * inv * f64::from(w))
                .collect();
            let og = gpu.stream.clone_dtoh(&out)?;
            worst[5] = worst[5].max(worst_scaled(&og, &ow, |i| ow[i].abs()));
            // Without an output pointer the GEMV's results are the same bits, and with four
            // rows a warp too (each lane dots the same tiles of a row in the same order).
            for rows_per_warp in [2, 4] {
                let mut y3 = gpu.stream.clone_htod(&vec![f32::NAN; rows2])?;
                gpu.gemv_rmsin_launch(
                    (ty, Config::rms_input().with_rows(rows_per_warp)),
                    &wd2,
                    &q,
                    &mut y3,
                    (rows2, n, rb2),
                    &parts,
                    eps,
                    &res,
                    &gd,
                    None,
                )?;
                if gpu.stream.clone_dtoh(&y3)? != y2g {
                    worst[4] = f64::NAN;
                }
            }
            // Each part against its bar: the worst ratio (tiles: bytes differing).
            let bars = [1e-5, 1e-5, 0.0, 1e-5, 1e-5, 1e-6];
            let ratio = worst.iter().zip(bars).fold(0f64, |a, (&w, b)| {
                let r = match (b == 0.0, w == 0.0) {
                    (true, true) => 0.0,
                    (true, false) => f64::INFINITY,
                    _ => w / b,
                };
                if r.is_nan() || a.is_nan() {
                    f64::NAN
                } else {
                    a.max(r)
                }
            });
            if !rep.case(&op, &shape, "worst error / its bar", ratio, 1.0) {
                println!(
                    "    y {:.1e}, res {:.1e}, tile bytes differing {}, partials {:.1e}, consumer {:.1e}, out {:.1e}",
                    worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]
                );
            }
        }
    }
    Ok(())
}

/// The Q|K|V GEMV with the rope + KV-append epilogue (`gemv::Config::rope_kv`), on plain
/// and on split-norm tiles: `y` and both caches byte for byte equal to the GEMV without it
/// followed by `rope_kv_rows_normal` on its one row (the kernels it replaces, each checked
/// against its twin), caches poisoned, with and without frequency factors; `y` also against
/// its CPU twin (`gemv::cpu`, then `ops::rope::rope_kv_rows_cpu`) within the GEMV bound.
pub fn check_rope_gemv(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::ops::kv::SeqDesc;
    use smelt_kernels::ops::rope::{self, RopeStyle};
    let (bs, n_blocks) = (16usize, 4usize);
    let tables: Vec<u32> = vec![2, 0, 3, 1];
    let tables_d = gpu.stream.clone_htod(&tables)?;
    for ty in catalog::GEMV_TYPES {
        let op = format!("gemv_rope_kv {ty:?}");
        // (n_head, n_head_kv, head_dim, k): GQA and MHA, 64 and 128 values a head.
        for (n_head, n_head_kv, hd, k) in [(4, 2, 64, 512), (2, 2, 128, 256), (8, 2, 128, 1024)] {
            if k % ty.block_size() != 0 {
                continue;
            }
            for (with_ff, with_rms, pos) in
                [(false, false, 37u32), (true, true, 50), (true, false, 5)]
            {
                let shape = format!(
                    "{n_head}/{n_head_kv} heads x{hd} k {k} ff {with_ff} rms {with_rms} pos {pos}"
                );
                if !want(&shape) {
                    continue;
                }
                let mut differ = 0usize;
                let (q_rows, kv_dim) = (n_head * hd, n_head_kv * hd);
                let nrows = q_rows + 2 * kv_dim;
                let OneToken { ggml, wd, xq, xqh } = one_token(gpu, rng, ty, nrows, k)?;
                let ff: Vec<f32> = (0..hd / 2).map(|_| rng.gen_range(1.0..8.0)).collect();
                let ff_d = gpu.stream.clone_htod(&ff)?;
                let ff_ptr = if with_ff {
                    ff_d.device_ptr(&gpu.stream).0
                } else {
                    0u64
                };
                let desc = SeqDesc {
                    row: 0,
                    n_tokens: 1,
                    start_pos: pos,
                    block_table_offset: 0,
                };
                let desc_d = gpu.stream.clone_htod(&desc.words())?;
                let pos_d = gpu.stream.clone_htod(&[pos])?;
                let parts: Vec<f32> = (0..k / 32).map(|_| rng.gen_range(0.5..4.0)).collect();
                let parts_d = gpu.stream.clone_htod(&parts)?;
                let res = gpu.stream.clone_htod(&random_floats(rng, k, 1.0))?;
                let g = gpu.stream.clone_htod(&vec![1.0f32; k])?;
                let (freq_base, freq_scale) = (500000.0f32, 0.25f32);
                let theta = rope::theta_scale(freq_base, hd);
                let cache_len = n_blocks * bs * kv_dim;
                // Both paths: (y, k cache, v cache).
                let mut outs = Vec::new();
                for fused in [false, true] {
                    let mut cfg = if with_rms {
                        Config::rms_input()
                    } else {
                        Config::new(1)
                    };
                    if fused {
                        cfg = cfg.with_rope_kv();
                    }
                    let f = gpu.gemv(ty, cfg)?;
                    let d = GemvDims::new(cfg, nrows, k, catalog::row_bytes(ty, k)?);
                    let mut y = gpu.stream.clone_htod(&vec![f32::NAN; nrows])?;
                    let mut kc = gpu.stream.clone_htod(&vec![0xFFFFu16; cache_len])?;
                    let mut vc = gpu.stream.clone_htod(&vec![0xFFFFu16; cache_len])?;
                    let (nparts, n, eps, null) = ((k / 32) as u32, k as u32, 1e-5f32, 0u64);
                    let (qr, kvd, hdu, bsu) = (q_rows as u32, kv_dim as u32, hd as u32, bs as u32);
                    {
                        let mut l = gpu.stream.launch_builder(&f);
                        d.push(&mut l, &wd, &xq, &mut y);
                        if with_rms {
                            l.arg(&parts_d)
                                .arg(&nparts)
                                .arg(&n)
                                .arg(&eps)
                                .arg(&res)
                                .arg(&g)
                                .arg(&null);
                        }
                        if fused {
                            l.arg(&pos_d)
                                .arg(&ff_ptr)
                                .arg(&mut kc)
                                .arg(&mut vc)
                                .arg(&desc_d)
                                .arg(&tables_d)
                                .arg(&qr)
                                .arg(&kvd)
                                .arg(&hdu)
                                .arg(&bsu)
                                .arg(&theta)
                                .arg(&freq_scale);
                        }
                        unsafe { l.launch(d.launch) }?;
                    }
                    if !fused {
                        let yp = ptr(gpu, &y);
                        let a = rope::RopeKvRowsArgs {
                            q: yp,
                            k: yp + (4 * q_rows) as u64,
                            v: yp + (4 * (q_rows + kv_dim)) as u64,
                            pos: ptr(gpu, &pos_d),
                            freq_factors: ff_ptr,
                            k_cache: ptr(gpu, &kc),
                            v_cache: ptr(gpu, &vc),
                            seqs: ptr(gpu, &desc_d),
                            block_tables: ptr(gpu, &tables_d),
                            n_head: n_head as u32,
                            n_head_kv: n_head_kv as u32,
                            head_dim: hdu,
                            block_size: bsu,
                            theta_scale: theta,
                            freq_scale,
                        };
                        let l = rope::kv_rows_launch(1, 1, n_head, n_head_kv, hd);
                        let name = rope::kv_rows_name(RopeStyle::Normal);
                        launch_values(gpu, name, l, &a.values())?;
                    }
                    outs.push((
                        gpu.stream.clone_dtoh(&y)?,
                        gpu.stream.clone_dtoh(&kc)?,
                        gpu.stream.clone_dtoh(&vc)?,
                    ));
                }
                let (a, b) = (&outs[0], &outs[1]);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                differ += bits(&a.0)
                    .iter()
                    .zip(bits(&b.0))
                    .filter(|(x, y)| **x != *y)
                    .count();
                differ += a.1.iter().zip(&b.1).filter(|(x, y)| x != y).count();
                differ += a.2.iter().zip(&b.2).filter(|(x, y)| x != y).count();
                // The CPU twin of `y`: the GEMV's, scaled as the split norm scales it,
                // then the rope of its Q|K part.
                let (yw, mag) = gemv::cpu_with_magnitude(ty, &ggml, nrows, k, &xqh, 1)?;
                let inv = if with_rms {
                    let p64: Vec<f64> = parts.iter().map(|&v| f64::from(v)).collect();
                    gemv::rms_input_scale(&p64, k, 1e-5)
                } else {
                    1.0
                };
                let mut want: Vec<f32> = yw.iter().map(|&v| (f64::from(v) * inv) as f32).collect();
                let (mut kc_w, mut vc_w) = (vec![0u16; cache_len], vec![0u16; cache_len]);
                let (qk, vpart) = want.split_at_mut(q_rows + kv_dim);
                let (qw, kw) = qk.split_at_mut(q_rows);
                rope::rope_kv_rows_cpu(
                    qw,
                    kw,
                    vpart,
                    &[pos],
                    &mut kc_w,
                    &mut vc_w,
                    &[desc],
                    &tables,
                    (n_head, n_head_kv, hd, bs),
                    RopeStyle::Normal,
                    (freq_base, freq_scale),
                    with_ff.then_some(&ff[..]),
                );
                let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
                let scale = |i: usize| (mag[i].max(mag[i ^ 1])) * inv + want64[i].abs();
                let worst = worst_scaled(&b.0, &want64, scale);
                rep.case(
                    &op,
                    &shape,
                    "|y - ref| / (sum|w x| / rms + |ref|)",
                    worst,
                    1e-5,
                );
                let note = format!("{differ} values differ from GEMV + rope_kv");
                rep.verdict(&format!("{op} = unfused"), &shape, differ == 0, &note);
            }
        }
    }
    Ok(())
}
