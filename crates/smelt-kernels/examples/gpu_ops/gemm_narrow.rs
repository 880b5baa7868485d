//! The narrow GEMMs of the formats that have no other f16 GEMM (Q6_K: Q4_K_M's `attn_v`,
//! `ffn_down` and output head): every kernel against the f16 GEMM's CPU twin on ragged
//! shapes with poisoned outputs, and their speed beside the int8 GEMM they replace at
//! Llama-3-8B shapes. Q4_K's narrow kernels are checked and timed with its f16 GEMMs
//! (`gemm_f16`), whose rows they share.

use anyhow::Result;
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use smelt_kernels::gemm::{self, f16, narrow};
use smelt_kernels::{catalog, GgmlType, TILE};

use super::gemm::{
    activations, args, launch, launch_as, problem, run_both_ways, weight_copies, workspace, Case,
    Problem, SMS,
};
use super::gemm_f16::convert;
use super::harness::{launch_values, nan, ptr, want, Gpu, Report};
use super::timing::time_launches;

/// Narrow-GEMM formats that `gemm_f16` does not already cover.
fn types() -> impl Iterator<Item = GgmlType> {
    narrow::TYPES
        .into_iter()
        .map(|(ty, _)| ty)
        .filter(|ty| f16::name(*ty).is_none())
}

/// Every narrow kernel of `ty` (both layouts, every token width, split and not) on one
/// shape: weights `wd` (`row_bytes` a row), f16 rows `h`, against the twin's `want` and
/// magnitudes `mag`; each split case both ways (fix-up and reduce launch).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_kernels(
    gpu: &Gpu,
    rep: &mut Report,
    ty: GgmlType,
    (nrows, k, ntok): (usize, usize, usize),
    row_bytes: usize,
    wd: &CudaSlice<u8>,
    h: &CudaSlice<u8>,
    (want, mag): (&[f32], &[f64]),
) -> Result<()> {
    let ntiles = k.div_ceil(TILE);
    for (nname, layout, width) in narrow::kernels_of(ty) {
        let nf = gpu.f(nname)?;
        for splits in [
            1,
            narrow::splits(ty, nrows, ntiles, ntok, SMS).max(ntiles.min(3)),
        ] {
            let a = args(nrows, ntok, k, row_bytes, splits);
            let l = narrow::launch_width(ty, &a, layout, width);
            let got = run_both_ways(gpu, rep, nname, &nf, &a, l, wd, h)?;
            let case = Case {
                name: nname,
                shape: (nrows, k, ntok, splits),
                bar: 1e-4,
            };
            case.check(rep, &got, want, mag);
        }
    }
    Ok(())
}

/// Narrow layouts, each a column of the speed tables.
pub(crate) const LAYOUTS: usize = narrow::Layout::ALL.len();

/// Microseconds a launch of `ty`'s narrow kernel for `ntok` tokens in each layout
/// ([`narrow::Layout::ALL`]), `launches` a timing, the weights cycling through the copies
/// `ws` (L2-cold), f16 rows `h`, into `y`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn time_layouts(
    gpu: &Gpu,
    ty: GgmlType,
    (nrows, k, ntok): (usize, usize, usize),
    row_bytes: usize,
    ws: &[CudaSlice<u8>],
    h: &CudaSlice<u8>,
    y: &mut CudaSlice<f32>,
    launches: usize,
) -> Result<[f64; LAYOUTS]> {
    let mut us = [0f64; LAYOUTS];
    for (layout, us) in narrow::Layout::ALL.into_iter().zip(&mut us) {
        let width = narrow::block_tokens(ntok);
        let splits = narrow::splits_for(ty, nrows, k / TILE, ntok, SMS, (width, layout));
        let an = args(nrows, ntok, k, row_bytes, splits);
        let mut wspn = workspace(gpu, &an)?;
        let nname = narrow::name(ty, ntok, layout).expect("every layout");
        let nf = gpu.f(nname)?;
        *us = time_launches(&gpu.stream, 5, 2, launches, |i| {
            let l = narrow::launch(ty, &an, layout);
            launch_as(gpu, &nf, &an, l, &ws[i % ws.len()], h, y, &mut wspn)
        })? * 1e3;
    }
    Ok(us)
}

/// A [`Problem`], its activations as f16 rows on the GPU, the f16 GEMM twin's outputs and
/// their magnitudes.
type F16Problem = (Problem, CudaSlice<u8>, Vec<f32>, Vec<f64>);

/// [`problem`] with its activations as the f16 rows on the GPU, and the f16 GEMM twin's
/// outputs and magnitudes.
fn f16_problem(
    gpu: &Gpu,
    rng: &mut StdRng,
    ty: GgmlType,
    (nrows, k, ntok): (usize, usize, usize),
) -> Result<F16Problem> {
    let p = problem(gpu, rng, ty, (nrows, k, ntok))?;
    let mut h = gpu
        .stream
        .clone_htod(&vec![0xFFu8; f16::act_row_bytes(k) * ntok])?;
    convert(gpu, &p.xd, &mut h, k, ntok)?;
    let want_h = f16::act_cpu(&p.x, k)?;
    let (want, mag) = f16::cpu_with_magnitude(ty, &p.ggml, nrows, k, &want_h, ntok)?;
    Ok((p, h, want, mag))
}

/// Every narrow kernel of those formats (both layouts, every token width, split and not)
/// against the twin.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let shapes = [
        (64, 256, 8),
        (1, 256, 1),
        (65, 512, 3),
        (130, 2304, 33),
        (517, 1280, 17),
        (37, 4096, 64),
        (96, 4096, 16),
    ];
    for ty in types() {
        for (nrows, k, ntok) in shapes {
            if !want(&format!("{nrows}x{k} x {ntok}")) {
                continue;
            }
            let (Problem { row_bytes, wd, .. }, h, want, mag) =
                f16_problem(gpu, rng, ty, (nrows, k, ntok))?;
            check_kernels(
                gpu,
                rep,
                ty,
                (nrows, k, ntok),
                row_bytes,
                &wd,
                &h,
                (&want, &mag),
            )?;
        }
    }
    Ok(())
}

/// A group's members (ragged, as Q|K|V and gate|up) as one narrow launch over all their
/// rows, split at least twice, and `gemm::members`' reduce summing the splits into each
/// member's own poisoned output: each output against its rows of the twin. A gate|up pair
/// of whole tiles also takes the reduce with the GLU (`reduce_glu_kernel`, both
/// activations): its gate output and f16 rows bit for bit the member reduce's outputs
/// through the fused GLU kernel (`fused::glu_kernel` into f16 rows).
pub fn check_members(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::gemm::members;
    let groups: [(&[usize], usize, usize); 5] = [
        (&[256, 64, 64], 512, 16),
        (&[130, 17, 33], 768, 33),
        (&[300, 300], 1024, 8),
        (&[200, 72, 72], 512, 64),
        (&[512, 512], 768, 24),
    ];
    for ty in narrow::TYPES.map(|(t, _)| t) {
        for &(rows, k, ntok) in &groups {
            let nrows: usize = rows.iter().sum();
            if !want(&format!("{nrows}x{k} x {ntok}")) {
                continue;
            }
            let (Problem { row_bytes, wd, .. }, h, want, mag) =
                f16_problem(gpu, rng, ty, (nrows, k, ntok))?;
            let width = narrow::block_tokens(ntok);
            let layout = narrow::default_layout_for(ty, width);
            let ntiles = k / TILE;
            let splits =
                narrow::splits_for(ty, nrows, ntiles, ntok, SMS, (width, layout)).clamp(2, ntiles);
            let a = args(nrows, ntok, k, row_bytes, splits);
            let ws = workspace(gpu, &a)?;
            let a = gemm::Args {
                w: ptr(gpu, &wd),
                x: ptr(gpu, &h),
                y: ptr(gpu, &ws),
                ..a
            };
            let name = narrow::name_for(ty, width, layout).expect("a narrow kernel");
            launch_values(
                gpu,
                name,
                narrow::launch_width(ty, &a, layout, width),
                &a.values(),
            )?;
            let outs = rows
                .iter()
                .map(|&r| Ok(gpu.stream.clone_htod(&nan(ntok * r))?))
                .collect::<Result<Vec<_>>>()?;
            let members: Vec<(u64, u32)> = outs
                .iter()
                .zip(rows)
                .map(|(o, &r)| (ptr(gpu, o), r as u32))
                .collect();
            let r = members::ReduceArgs::for_gemm(&a, &members).expect("a split launch");
            launch_values(gpu, members::REDUCE, r.launch(), &r.values())?;
            // Member by member, token by token: the twin's rows of each.
            let (mut got, mut want_m, mut mag_m) = (Vec::new(), Vec::new(), Vec::new());
            let mut off = 0;
            for (o, &rm) in outs.iter().zip(rows) {
                got.extend(gpu.stream.clone_dtoh(o)?);
                for t in 0..ntok {
                    let at = t * nrows + off;
                    want_m.extend_from_slice(&want[at..at + rm]);
                    mag_m.extend_from_slice(&mag[at..at + rm]);
                }
                off += rm;
            }
            let case = Case {
                name: members::REDUCE,
                shape: (nrows, k, ntok, r.splits as usize),
                bar: 1e-4,
            };
            case.check(rep, &got, &want_m, &mag_m);
            if rows.len() == 2 && rows[0] == rows[1] && rows[0] % TILE == 0 {
                check_glu_reduce(gpu, rep, (&a, &ws, &outs), rows[0], r.splits)?;
            }
        }
    }
    Ok(())
}

/// [`check_members`]' GLU reduce of launch `a` (its workspace at `a.y`, `workspace`) for
/// gate|up rows of `rows` each: bit for bit against the member reduce's outputs `outs`
/// through `fused::glu_kernel`, and against its CPU twin on the same workspace.
fn check_glu_reduce(
    gpu: &Gpu,
    rep: &mut Report,
    (a, workspace, outs): (&gemm::Args, &CudaSlice<f32>, &[CudaSlice<f32>]),
    rows: usize,
    splits: u32,
) -> Result<()> {
    use smelt_kernels::fused::{self, Sink};
    use smelt_kernels::gemm::members;
    use smelt_kernels::ops::elementwise::Glu;
    let ntok = a.ntok as usize;
    let hbytes = f16::act_row_bytes(rows) * ntok;
    for act in [Glu::Silu, Glu::Gelu] {
        let gate = gpu.stream.clone_htod(&nan(ntok * rows))?;
        let h = gpu.stream.clone_htod(&vec![0xA5u8; hbytes])?;
        let g = members::GluReduceArgs {
            part: a.y,
            gate: ptr(gpu, &gate),
            h: ptr(gpu, &h),
            rows: rows as u32,
            ntok: a.ntok,
            splits,
        };
        launch_values(gpu, members::reduce_glu_name(act), g.launch(), &g.values())?;
        // The unfused path on the member reduce's outputs (gate copied: the GLU writes it).
        let gate2 = gpu.stream.clone_htod(&gpu.stream.clone_dtoh(&outs[0])?)?;
        let h2 = gpu.stream.clone_htod(&vec![0x5Au8; hbytes])?;
        let u = fused::GluQ8Args {
            gate: ptr(gpu, &gate2),
            up: ptr(gpu, &outs[1]),
            q: ptr(gpu, &h2),
            k: rows as u32,
            ntiles: (rows / TILE) as u32,
        };
        let l = fused::glu_q8_launch(ntok, rows);
        launch_values(gpu, fused::glu_name(act, Sink::F16Rows), l, &u.values())?;
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        // The group's shape first, as `check_members` names it (so `-s` selects both).
        let k = a.ntiles as usize * TILE;
        let shape = format!(
            "{}x{k} x {ntok}, gate|up, {splits} splits, {act:?}",
            2 * rows
        );
        let (g1, g2) = (
            gpu.stream.clone_dtoh(&gate)?,
            gpu.stream.clone_dtoh(&gate2)?,
        );
        // The twin on the GPU's own workspace (the GPU's exp and division are approximate).
        let part = gpu.stream.clone_dtoh(workspace)?;
        let twin = members::reduce_glu_cpu(&part, rows, ntok, splits as usize, act);
        let worst = g1
            .iter()
            .zip(&twin)
            .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
            .fold(0.0f32, f32::max);
        // GELU's tanh is approximate on the GPU: `check_elementwise`'s bar for it.
        let bar = match act {
            Glu::Silu => 1e-5,
            Glu::Gelu => 2e-3,
        };
        rep.case(
            members::reduce_glu_name(act),
            &format!("{shape} twin"),
            "|gate - twin| / (1 + |twin|)",
            f64::from(worst),
            bar,
        );
        let same = bits(g1) == bits(g2);
        rep.verdict(
            members::reduce_glu_name(act),
            &format!("{shape} gate"),
            same,
            "",
        );
        let same = gpu.stream.clone_dtoh(&h)? == gpu.stream.clone_dtoh(&h2)?;
        rep.verdict(
            members::reduce_glu_name(act),
            &format!("{shape} f16 rows"),
            same,
            "",
        );
    }
    Ok(())
}

/// Microseconds a launch of those formats' narrow kernels (every layout) beside the int8
/// GEMM at Llama-3-8B shapes (`attn_v`, `ffn_down`, the output head) and 8-64 tokens,
/// into the report's perf lines.
pub fn perf(gpu: &Gpu, rep: &mut Report) -> Result<()> {
    rep.perf
        .push("narrow GEMMs of the other formats vs the int8 GEMM, microseconds a launch:".into());
    rep.perf.push(
        "| type | rows x k | tokens | int8 | narrow | narrow, 16-row warps | 16-row warps, 2-tile ring | best / int8 | GB/s |"
            .into(),
    );
    rep.perf
        .push("|---|---|---|---|---|---|---|---|---|".into());
    for ty in types() {
        let int8 = gpu
            .module
            .load_function(gemm::name(ty).expect("an int8 GEMM"))?;
        for (nrows, k) in [(1024usize, 4096usize), (4096, 14336), (128256, 4096)] {
            let row_bytes = catalog::row_bytes(ty, k)?;
            let ws = weight_copies(gpu, nrows, row_bytes, 77)?;
            let copies = ws.len();
            for ntok in [8usize, 16, 32, 64] {
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
                let mut wsp = workspace(gpu, &a)?;
                let launches = 20;
                let int8_us = time_launches(&gpu.stream, 5, 2, launches, |i| {
                    launch(gpu, &int8, &a, &ws[i % copies], &q, &mut y, &mut wsp)
                })? * 1e3;
                let us = time_layouts(
                    gpu,
                    ty,
                    (nrows, k, ntok),
                    row_bytes,
                    &ws,
                    &h,
                    &mut y,
                    launches,
                )?;
                let best = us.into_iter().fold(f64::MAX, f64::min);
                let gbs = (nrows * row_bytes) as f64 / best / 1e3;
                rep.perf.push(format!(
                    "| {ty:?} | {nrows}x{k} | {ntok} | {int8_us:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {gbs:.0} |",
                    us[0],
                    us[1],
                    us[2],
                    best / int8_us
                ));
            }
        }
    }
    Ok(())
}
