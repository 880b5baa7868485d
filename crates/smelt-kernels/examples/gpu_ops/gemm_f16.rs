//! The f16 GEMMs (`gemm::f16`, the batch-wide `f16_small`, the `narrow` ones): the activation
//! conversion byte-exact against its twin, every f16 GEMM against its CPU twin on ragged
//! shapes with poisoned outputs, then its speed beside the int8 GEMM it would replace at
//! Llama-3-8B shapes (with one and two blocks an SM), which is what the engine's choice
//! between them is made from. The narrow GEMM (`gemm::narrow`, the f16 GEMM's weights fed
//! from registers, for batches of 16-64 tokens) is checked against the same twin and timed
//! in the same table; the narrow GEMMs of the other formats in `gemm_narrow`.

use anyhow::Result;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use smelt_kernels::gemm::{self, f16, f16_small, narrow};
use smelt_kernels::{catalog, GgmlType, TILE};

use super::gemm::{
    activations, args, check_counters_zero, launch, launch_as, run_both_ways, weight_copies,
    workspace, Case, SMS,
};
use super::harness::{want, Gpu, Report};
use super::timing::time_launches;

/// The f16 GEMMs (each name starts `gemm_f16`: plain, batch-wide and narrow), the
/// activation conversion among them.
pub const COVERS: &[&str] = &[
    "gemm_f16_act",
    "gemm_f16_q*",
    "gemm_f16s*",
    "gemm_narrow*",
    "gemm_reduce_members*",
];

/// Converts `ntok` rows of `k` floats into the f16 GEMM's rows.
pub(crate) fn convert(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    h: &mut CudaSlice<u8>,
    k: usize,
    ntok: usize,
) -> Result<()> {
    let f = gpu.module.load_function(f16::ACT)?;
    let l = f16::act_launch(k, ntok);
    let cfg = LaunchConfig {
        grid_dim: l.grid,
        block_dim: l.block,
        shared_mem_bytes: 0,
    };
    let (len, ntiles) = (k as u32, k.div_ceil(TILE) as u32);
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(x).arg(h).arg(&len).arg(&ntiles);
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Every f16 GEMM (plain, narrow, batch-wide) against its twin, and the activation
/// conversion byte for byte.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let shapes = [
        (64, 256, 64),
        (1, 256, 1),
        (65, 512, 3),
        (130, 2304, 70),
        (517, 1280, 129),
        (37, 4096, 200),
        (96, 4096, 17),
    ];
    for (ty, name) in f16::TYPES {
        let f = gpu.module.load_function(name)?;
        for &(nrows, k, ntok) in &shapes {
            if !want(&format!("{nrows}x{k} x {ntok}")) {
                continue;
            }
            let super::gemm::Problem {
                ggml,
                row_bytes,
                wd,
                x,
                xd,
            } = super::gemm::problem(gpu, rng, ty, (nrows, k, ntok))?;
            let hbytes = f16::act_row_bytes(k) * ntok;
            let mut h = gpu.stream.clone_htod(&vec![0xFFu8; hbytes])?;
            convert(gpu, &xd, &mut h, k, ntok)?;
            let got_h: Vec<u16> = gpu
                .stream
                .clone_dtoh(&h)?
                .chunks(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            let want_h = f16::act_cpu(&x, k)?;
            let hdiff = got_h.iter().zip(&want_h).filter(|(a, b)| a != b).count();
            let note = format!("{hdiff} of {} halves differ", want_h.len());
            rep.verdict(f16::ACT, &format!("k {k} x {ntok}"), hdiff == 0, &note);
            let (want, mag) = f16::cpu_with_magnitude(ty, &ggml, nrows, k, &want_h, ntok)?;
            let ntiles = k.div_ceil(TILE);
            for splits in [1, f16::splits(nrows, ntiles, None, SMS).max(ntiles.min(3))] {
                let a = args(nrows, ntok, k, row_bytes, splits);
                let got = run_both_ways(gpu, rep, name, &f, &a, f16::launch(&a), &wd, &h)?;
                // f32 sums on the tensor cores against f64 sums of the same products:
                // K * 2^-24 at worst, far less in practice.
                let case = Case {
                    name,
                    shape: (nrows, k, ntok, splits),
                    bar: 1e-4,
                };
                case.check(rep, &got, &want, &mag);
            }
            // The narrow GEMMs of this type read the same weights and rows: every token
            // width on every shape (ragged token blocks included).
            super::gemm_narrow::check_kernels(
                gpu,
                rep,
                ty,
                (nrows, k, ntok),
                row_bytes,
                &wd,
                &h,
                (&want, &mag),
            )?;
            // The batch-wide f16 GEMMs: each shape's kernel on every shape.
            let small_names = f16_small::TYPES
                .iter()
                .find(|(t, _)| *t == ty)
                .map(|(_, n)| *n);
            for (sname, shape) in small_names
                .into_iter()
                .flat_map(|n| n.into_iter().zip([f16_small::N32, f16_small::N64]))
            {
                let sf = gpu.module.load_function(sname)?;
                for splits in [
                    1,
                    f16::splits_for(shape, nrows, ntiles, Some(ntok), SMS).max(ntiles.min(3)),
                ] {
                    let a = args(nrows, ntok, k, row_bytes, splits);
                    let l = f16::launch_for(shape, &a);
                    let got = run_both_ways(gpu, rep, sname, &sf, &a, l, &wd, &h)?;
                    let case = Case {
                        name: sname,
                        shape: (nrows, k, ntok, splits),
                        bar: 1e-4,
                    };
                    case.check(rep, &got, &want, &mag);
                }
            }
        }
    }
    super::gemm_narrow::check(gpu, rng, rep)?;
    super::gemm_narrow::check_members(gpu, rng, rep)?;
    check_counters_zero(gpu, rep, "f16, narrow and batch-wide GEMMs")
}

/// One row of the f16-vs-int8 table: microseconds a launch.
pub struct Row {
    pub ty: GgmlType,
    pub shape: String,
    pub ntok: usize,
    pub int8_us: f64,
    /// The f16 GEMM at one and two blocks an SM.
    pub f16_us: [f64; 2],
    /// The activation preparation of each: int8 tiles, f16 rows.
    pub act_us: [f64; 2],
    /// The narrow GEMM (on the f16 rows), at 128 tokens and fewer, in warps of 32 and of
    /// 16 rows, and 16 with a two-tile ring (`narrow::Layout::ALL`).
    pub narrow_us: Option<[f64; super::gemm_narrow::LAYOUTS]>,
    /// The batch-wide f16 GEMM (`f16_small`), at 128 tokens and fewer.
    pub small_us: Option<f64>,
}

/// The f16 GEMMs beside the int8 ones at Llama-3-8B shapes, 16..2048 tokens.
pub fn speed(gpu: &Gpu) -> Result<Vec<Row>> {
    let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
    let mut names = Vec::new();
    for (ty, name) in f16::TYPES {
        for blocks in [1u32, 2] {
            let n = format!("{name}_b{blocks}");
            let r = match ty {
                GgmlType::Q4_K => m.kernel(&n, |k| {
                    f16::kernel_blocks::<smelt_kernels::formats::Q4K>(k, blocks)
                }),
                GgmlType::Q6_K => m.kernel(&n, |k| {
                    f16::kernel_blocks::<smelt_kernels::formats::Q6K>(k, blocks)
                }),
                GgmlType::Q8_0 => m.kernel(&n, |k| {
                    f16::kernel_blocks::<smelt_kernels::formats::Q8_0>(k, blocks)
                }),
                other => anyhow::bail!("no f16 variant build for {other:?}"),
            };
            r.map_err(|e| anyhow::anyhow!("{n}: {e}"))?;
            names.push(n);
        }
    }
    let module = gpu
        .stream
        .context()
        .load_module(cudarc::nvrtc::Ptx::from_src(m.to_ptx()))?;
    println!("\n== f16 GEMM vs int8 GEMM: microseconds a launch (H100 split counts) ==");
    let mut rows = Vec::new();
    for (ti, (ty, _)) in f16::TYPES.into_iter().enumerate() {
        let int8 = gpu
            .module
            .load_function(gemm::name(ty).expect("an int8 GEMM"))?;
        let variants: Vec<CudaFunction> = (0..2)
            .map(|b| module.load_function(&names[2 * ti + b]))
            .collect::<Result<_, _>>()?;
        for (nrows, k) in [
            (4096usize, 4096usize),
            (14336, 4096),
            (4096, 14336),
            (1024, 4096),
        ] {
            let row_bytes = catalog::row_bytes(ty, k)?;
            let ws = weight_copies(gpu, nrows, row_bytes, 291)?;
            let copies = ws.len();
            for ntok in [16usize, 32, 64, 128, 512, 2048] {
                if ntok > 512 && nrows != 14336 {
                    continue;
                }
                let (xd, q) = activations(gpu, ty, k, ntok, 7)?;
                let mut h = gpu.stream.alloc_zeros::<u8>(f16::act_row_bytes(k) * ntok)?;
                convert(gpu, &xd, &mut h, k, ntok)?;
                let mut y = gpu.stream.alloc_zeros::<f32>(nrows * ntok)?;
                let a = args(
                    nrows,
                    ntok,
                    k,
                    row_bytes,
                    gemm::splits(nrows, k / TILE, Some(ntok), SMS),
                );
                let ah = args(
                    nrows,
                    ntok,
                    k,
                    row_bytes,
                    f16::splits(nrows, k / TILE, Some(ntok), SMS),
                );
                let mut wsp = workspace(gpu, &a)?;
                let mut wsph = workspace(gpu, &ah)?;
                let flops = 2.0 * (nrows * k * ntok) as f64;
                let launches = ((2e11 / flops) as usize).clamp(3, 200);
                let int8_us = time_launches(&gpu.stream, 5, 2, launches, |i| {
                    launch(gpu, &int8, &a, &ws[i % copies], &q, &mut y, &mut wsp)
                })? * 1e3;
                let mut f16_us = [0f64; 2];
                for (v, us) in variants.iter().zip(&mut f16_us) {
                    *us = time_launches(&gpu.stream, 5, 2, launches, |i| {
                        let l = f16::launch(&ah);
                        launch_as(gpu, v, &ah, l, &ws[i % copies], &h, &mut y, &mut wsph)
                    })? * 1e3;
                }
                let narrow_us =
                    match narrow::name(ty, ntok, narrow::Layout::Rows32).filter(|_| ntok <= 128) {
                        Some(_) => Some(super::gemm_narrow::time_layouts(
                            gpu,
                            ty,
                            (nrows, k, ntok),
                            row_bytes,
                            &ws,
                            &h,
                            &mut y,
                            launches,
                        )?),
                        None => None,
                    };
                let small_us = match f16_small::name(ty, ntok).filter(|_| ntok <= 128) {
                    Some(sname) => {
                        let sf = gpu.module.load_function(sname)?;
                        let a_s = args(
                            nrows,
                            ntok,
                            k,
                            row_bytes,
                            f16_small::splits(nrows, k / TILE, ntok, SMS),
                        );
                        let mut wsps = workspace(gpu, &a_s)?;
                        Some(
                            time_launches(&gpu.stream, 5, 2, launches, |i| {
                                let l = f16_small::launch(&a_s);
                                launch_as(gpu, &sf, &a_s, l, &ws[i % copies], &h, &mut y, &mut wsps)
                            })? * 1e3,
                        )
                    }
                    None => None,
                };
                let mut qq = gpu
                    .stream
                    .alloc_zeros::<u8>(gemm::activation_row_bytes(ty, k)? * ntok)?;
                let act_us = [
                    time_launches(&gpu.stream, 5, 2, 20, |_| {
                        super::gemm::quantize_for(gpu, ty, &xd, &mut qq, k, ntok)
                    })? * 1e3,
                    time_launches(&gpu.stream, 5, 2, 20, |_| {
                        convert(gpu, &xd, &mut h, k, ntok)
                    })? * 1e3,
                ];
                let row = Row {
                    ty,
                    shape: format!("{nrows}x{k}"),
                    ntok,
                    int8_us,
                    f16_us,
                    act_us,
                    narrow_us,
                    small_us,
                };
                let bytes = (nrows * row_bytes) as f64;
                let narrow_col = row.narrow_us.map_or("-".to_string(), |[us, r16, pair]| {
                    format!(
                        "{us:8.1} us ({:.0} GB/s), 16-row warps {r16:8.1} us, 2-tile ring {pair:8.1} us",
                        bytes / us / 1e3
                    )
                });
                let small_col = row.small_us.map_or("-".to_string(), |us| {
                    format!("{us:8.1} us ({:.0} GB/s)", bytes / us / 1e3)
                });
                println!(
                    "{:?} {:>11} x {:4}: int8 {:8.1} us | f16 {:8.1} / {:8.1} us (1/2 blocks) | narrow {narrow_col} | batch-wide {small_col} | act {:.1} / {:.1} us",
                    row.ty, row.shape, row.ntok, row.int8_us, row.f16_us[0], row.f16_us[1], row.act_us[0], row.act_us[1]
                );
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The f16-vs-int8 table (`speed`), into the report's perf lines.
pub fn perf(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let rows = speed(gpu)?;
    rep.perf
        .push("f16 GEMM vs int8 GEMM, microseconds a launch:".into());
    rep.perf.push("| type | rows x k | tokens | int8 | f16 (1 block) | f16 (2 blocks) | best f16 / int8 | narrow | narrow / int8 | narrow, 16-row warps (3 / 2-tile ring) | batch-wide f16 | batch-wide / int8 | int8 act | f16 act |".into());
    rep.perf
        .push("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".into());
    for r in &rows {
        let best = r.f16_us[0].min(r.f16_us[1]);
        let (narrow, ratio, r16) =
            r.narrow_us
                .map_or(("-".into(), "-".into(), "-".into()), |[us, r16, pair]| {
                    (
                        format!("{us:.1}"),
                        format!("{:.2}", us / r.int8_us),
                        format!("{r16:.1} / {pair:.1}"),
                    )
                });
        let (small, sratio) = r.small_us.map_or(("-".into(), "-".into()), |us| {
            (format!("{us:.1}"), format!("{:.2}", us / r.int8_us))
        });
        rep.perf.push(format!(
            "| {:?} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {narrow} | {ratio} | {r16} | {small} | {sratio} | {:.1} | {:.1} |",
            r.ty,
            r.shape,
            r.ntok,
            r.int8_us,
            r.f16_us[0],
            r.f16_us[1],
            best / r.int8_us,
            r.act_us[0],
            r.act_us[1]
        ));
    }
    super::gemm_narrow::perf(gpu, rep)
}
