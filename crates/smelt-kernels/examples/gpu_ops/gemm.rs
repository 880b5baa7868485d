//! The int8 tensor-core GEMMs (`gemm`, every weight type, the split-K reduce, the
//! activation tiles' quantizer): parity against the CPU twin (the GEMV's f64 product) on
//! ragged rows, tokens and lengths with poisoned outputs; perf: each at Llama-3-8B shapes
//! beside the GEMV path it replaces (eight tokens a launch), which is what the token-count
//! crossover is chosen from. `gemm_variants` (only with `-o gemm_variants`) times the
//! GEMM's build-time choices (`gemm::Variant`) against each other and checks they give
//! byte-identical outputs.

use anyhow::Result;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::SeedableRng;
use smelt_kernels::gemm::{self, Args};
use smelt_kernels::gemv::Config;
use smelt_kernels::ops::ArgValue;
use smelt_kernels::{act, catalog, GgmlType, TILE};

use super::harness::{
    launch_values, ptr, random_floats, random_weights, want, worst_over_magnitude, Gpu, Report,
};
use super::timing::time_launches;

/// The int8 GEMMs, their split-K reduce and their activation quantizer.
pub const COVERS: &[&str] = &["gemm_q*", "gemm_iq*", "gemm_reduce", "quantize_q8_tile"];

/// Launches GEMM `f` with `a` (its pointers replaced by the slices'), into the split
/// workspace `ws` then summed into `y` when `a` has more than one split, as the engine
/// does by default ([`Sum::ENGINE`]), so the timings are the engine's.
pub(crate) fn launch(
    gpu: &Gpu,
    f: &CudaFunction,
    a: &Args,
    w: &CudaSlice<u8>,
    x: &CudaSlice<u8>,
    y: &mut CudaSlice<f32>,
    ws: &mut CudaSlice<f32>,
) -> Result<()> {
    launch_as(gpu, f, a, a.launch(), w, x, y, ws)
}

/// [`launch`] with the grid `l` (a GEMM of other block sizes: `gemm::f16::launch`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_as(
    gpu: &Gpu,
    f: &CudaFunction,
    a: &Args,
    l: smelt_kernels::ops::Launch,
    w: &CudaSlice<u8>,
    x: &CudaSlice<u8>,
    y: &mut CudaSlice<f32>,
    ws: &mut CudaSlice<f32>,
) -> Result<()> {
    launch_summed(gpu, f, a, l, (w, x), y, ws, Sum::ENGINE)
}

/// How a split launch's partials reach the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sum {
    /// The last block of each tile sums them (`gemm::fixup`, `SMELT_CUDA_SPLIT_FIXUP=1`).
    Fixup,
    /// The reduce launch after the GEMM (the engine's default).
    Reduce,
}

impl Sum {
    /// The engine's default (`SMELT_CUDA_SPLIT_FIXUP` unset): the fix-up measured slower.
    pub(crate) const ENGINE: Sum = Sum::Reduce;
}

/// The split GEMMs' counters for this GPU (`gemm::fixup::counter_slots`), zeroed once and
/// shared by every launch, as the engine's.
pub(crate) fn counters(gpu: &Gpu) -> Result<&'static CudaSlice<u32>> {
    static COUNTERS: std::sync::OnceLock<CudaSlice<u32>> = std::sync::OnceLock::new();
    if let Some(c) = COUNTERS.get() {
        return Ok(c);
    }
    let c = gpu
        .stream
        .alloc_zeros::<u32>(gemm::fixup::counter_slots(gpu.sms))?;
    Ok(COUNTERS.get_or_init(|| c))
}

/// [`launch_as`] with the partials summed as `sum` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_summed(
    gpu: &Gpu,
    f: &CudaFunction,
    a: &Args,
    l: smelt_kernels::ops::Launch,
    (w, x): (&CudaSlice<u8>, &CudaSlice<u8>),
    y: &mut CudaSlice<f32>,
    ws: &mut CudaSlice<f32>,
    sum: Sum,
) -> Result<()> {
    let out = ptr(gpu, y);
    let mut a = Args {
        w: ptr(gpu, w),
        x: ptr(gpu, x),
        y: if a.workspace_floats() > 0 {
            ptr(gpu, ws)
        } else {
            out
        },
        fixup: None,
        ..*a
    };
    if sum == Sum::Fixup {
        let slots = gemm::fixup::counter_slots(gpu.sms);
        a = a.with_fixup(l.grid, out, ptr(gpu, counters(gpu)?), slots);
    }
    let mut b = gpu.stream.launch_builder(f);
    let values = a.values();
    for v in &values {
        match v {
            ArgValue::Ptr(p) => b.arg(p),
            ArgValue::U32(u) => b.arg(u),
            ArgValue::F32(x) => b.arg(x),
        };
    }
    unsafe { b.launch(super::harness::cfg(l)) }?;
    if let Some((r, l)) = a.reduce(out) {
        launch_values(gpu, gemm::REDUCE, l, &r.values())?;
    }
    Ok(())
}

/// Runs split GEMM `f` (`kernel`, grid `l`) on weights `w` and activations `x` both ways
/// ([`Sum`]) into poisoned outputs and workspaces; with more than one split, a verdict
/// that the fix-up's output is the reduce's to the bit. Returns the fix-up's output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_both_ways(
    gpu: &Gpu,
    rep: &mut Report,
    kernel: &str,
    f: &CudaFunction,
    a: &Args,
    l: smelt_kernels::ops::Launch,
    w: &CudaSlice<u8>,
    x: &CudaSlice<u8>,
) -> Result<Vec<f32>> {
    let n = (a.nrows * a.ntok) as usize;
    let mut got = Vec::new();
    for sum in [Sum::Reduce, Sum::Fixup] {
        let mut y = gpu.stream.clone_htod(&vec![f32::NAN; n])?;
        let mut ws = gpu
            .stream
            .clone_htod(&vec![f32::NAN; a.workspace_floats().max(1)])?;
        launch_summed(gpu, f, a, l, (w, x), &mut y, &mut ws, sum)?;
        got.push(gpu.stream.clone_dtoh(&y)?);
    }
    let fixed = got.pop().unwrap_or_default();
    if a.split_count() > 1 {
        let reduced = &got[0];
        let differ = fixed
            .iter()
            .zip(reduced)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        let shape = format!(
            "{kernel} {}x{} x {}, {} splits",
            a.nrows,
            a.ntiles as usize * TILE,
            a.ntok,
            a.split_count()
        );
        let note = format!("{differ} of {n} outputs differ from gemm + reduce");
        rep.verdict("gemm split fix-up", &shape, differ == 0, &note);
    }
    Ok(fixed)
}

/// A verdict that every split counter is zero again (each launch's last blocks reset
/// theirs), after the cases that used them.
pub(crate) fn check_counters_zero(gpu: &Gpu, rep: &mut Report, what: &str) -> Result<()> {
    let c = gpu.stream.clone_dtoh(counters(gpu)?)?;
    let set = c.iter().filter(|&&v| v != 0).count();
    let note = format!("{set} of {} counters not zero", c.len());
    rep.verdict(
        "gemm split fix-up",
        &format!("{what}: counters reset"),
        set == 0,
        &note,
    );
    Ok(())
}

/// A split workspace for `a` (one float when it needs none).
/// A random GEMM problem on the GPU: `nrows` x `k` weights of `ty` (their ggml bytes, and
/// repacked rows of `row_bytes` on the GPU) and `ntok` rows of activations.
pub(crate) struct Problem {
    pub ggml: Vec<u8>,
    pub row_bytes: usize,
    pub wd: CudaSlice<u8>,
    pub x: Vec<f32>,
    pub xd: CudaSlice<f32>,
}

pub(crate) fn problem(
    gpu: &Gpu,
    rng: &mut StdRng,
    ty: GgmlType,
    (nrows, k, ntok): (usize, usize, usize),
) -> Result<Problem> {
    let ggml = random_weights(rng, ty, nrows, k)?;
    let packed = catalog::repack(ty, &ggml, nrows, k)?;
    let x = random_floats(rng, k * ntok, 2.0);
    Ok(Problem {
        row_bytes: catalog::row_bytes(ty, k)?,
        wd: gpu.stream.clone_htod(&packed)?,
        xd: gpu.stream.clone_htod(&x)?,
        ggml,
        x,
    })
}

pub(crate) fn workspace(gpu: &Gpu, a: &Args) -> Result<CudaSlice<f32>> {
    Ok(gpu.stream.alloc_zeros::<f32>(a.workspace_floats().max(1))?)
}

/// Quantizes `ntok` rows of `k` floats into the GEMM's activation tiles (`gemm::act`).
fn quantize(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    q: &mut CudaSlice<u8>,
    k: usize,
    ntok: usize,
) -> Result<()> {
    let f = gpu.module.load_function(gemm::act::QUANTIZE)?;
    let l = gemm::act::quantize_launch(k, ntok);
    let cfg = LaunchConfig {
        grid_dim: l.grid,
        block_dim: l.block,
        shared_mem_bytes: 0,
    };
    let (len, ntiles) = (k as u32, k.div_ceil(TILE) as u32);
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(x).arg(q).arg(&len).arg(&ntiles);
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Copies of `nrows` random weight rows of `row_bytes`, enough (at least 300 MB, 2..16)
/// that rotating over them keeps L2 from serving a launch.
pub(crate) fn weight_copies(
    gpu: &Gpu,
    nrows: usize,
    row_bytes: usize,
    seed: u32,
) -> Result<Vec<CudaSlice<u8>>> {
    let wbytes = nrows * row_bytes;
    let copies = (300_000_000usize.div_ceil(wbytes)).clamp(2, 16);
    (0..copies)
        .map(|c| gpu.random_bytes(wbytes, seed + c as u32))
        .collect()
}

/// Quantizes `ntok` rows of `k` floats into the tiles the GEMM for `ty` reads
/// (`gemm::act`, or the GEMV's q8_1 for `gemm::reads_q8_1_tiles`).
pub(crate) fn quantize_for(
    gpu: &Gpu,
    ty: GgmlType,
    x: &CudaSlice<f32>,
    q: &mut CudaSlice<u8>,
    k: usize,
    ntok: usize,
) -> Result<()> {
    if gemm::reads_q8_1_tiles(ty) {
        gpu.quantize(x, q, k, ntok)
    } else {
        quantize(gpu, x, q, k, ntok)
    }
}

/// `ntok` rows of `k` random activations (seeded), on the GPU and as the tiles the GEMM
/// for `ty` reads.
pub(crate) fn activations(
    gpu: &Gpu,
    ty: GgmlType,
    k: usize,
    ntok: usize,
    seed: u64,
) -> Result<(CudaSlice<f32>, CudaSlice<u8>)> {
    let x = random_floats(&mut StdRng::seed_from_u64(seed), k * ntok, 1.0);
    let xd = gpu.stream.clone_htod(&x)?;
    let mut q = gpu
        .stream
        .alloc_zeros::<u8>(gemm::activation_row_bytes(ty, k)? * ntok)?;
    quantize_for(gpu, ty, &xd, &mut q, k, ntok)?;
    Ok((xd, q))
}

/// The H100/H200's multiprocessors, for the split count the engine would choose there.
pub(crate) const SMS: usize = 132;

pub(crate) fn args(nrows: usize, ntok: usize, k: usize, row_bytes: usize, splits: usize) -> Args {
    Args {
        w: 0,
        x: 0,
        y: 0,
        nrows: nrows as u32,
        ntok: ntok as u32,
        ntiles: k.div_ceil(TILE) as u32,
        row_bytes: row_bytes as u32,
        splits: splits as u32,
        fixup: None,
    }
}

/// Every GEMM against the CPU twin (one split, and the split count the engine picks), and
/// its activation quantizer byte for byte.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let shapes = [
        (64, 256, 64),
        (1, 256, 1),
        (65, 512, 3),
        (130, 2304, 70),
        (517, 1280, 129),
        (37, 4096, 200),
        (200, 800, 65),
        (96, 4128, 17),
    ];
    for (ty, name) in gemm::TYPES {
        let f = gpu.module.load_function(name)?;
        for &(nrows, k, ntok) in shapes.iter().filter(|s| s.1 % ty.block_size() == 0) {
            if !want(&format!("{nrows}x{k} x {ntok}")) {
                continue;
            }
            let Problem {
                ggml,
                row_bytes,
                wd,
                x,
                xd,
            } = problem(gpu, rng, ty, (nrows, k, ntok))?;
            let qbytes = gemm::activation_row_bytes(ty, k)? * ntok;
            let mut q = gpu.stream.clone_htod(&vec![0xFFu8; qbytes])?;
            quantize_for(gpu, ty, &xd, &mut q, k, ntok)?;
            let qh = gpu.stream.clone_dtoh(&q)?;
            // The quantizer: its twin's bytes exactly.
            let want_q = if gemm::reads_q8_1_tiles(ty) {
                act::quantize_cpu(&x, k)?
            } else {
                gemm::act::quantize_cpu(&x, k)?
            };
            let qdiff = qh.iter().zip(&want_q).filter(|(a, b)| a != b).count();
            let qop = if gemm::reads_q8_1_tiles(ty) {
                "gemm act (quantize_q8_1)"
            } else {
                gemm::act::QUANTIZE
            };
            let note = format!("{qdiff} of {qbytes} bytes differ");
            rep.verdict(qop, &format!("{name} k {k} x {ntok}"), qdiff == 0, &note);
            let (want, mag) = gemm::cpu_with_magnitude(ty, &ggml, nrows, k, &qh, ntok)?;
            // One split, and the split count the engine picks (a K range in slices).
            let ntiles = k.div_ceil(TILE);
            for splits in [1, gemm::splits(nrows, ntiles, None, SMS).max(ntiles.min(3))] {
                let a = args(nrows, ntok, k, row_bytes, splits);
                let got = run_both_ways(gpu, rep, name, &f, &a, a.launch(), &wd, &q)?;
                let case = Case {
                    name,
                    shape: (nrows, k, ntok, splits),
                    bar: 1e-5,
                };
                case.check(rep, &got, &want, &mag);
            }
        }
    }
    check_counters_zero(gpu, rep, "int8 GEMMs")
}

/// One parity case of a GEMM: its kernel, shape (`rows, k, tokens, splits`) and the bar on
/// `|y - ref| / sum |w x|`.
pub(crate) struct Case<'a> {
    pub name: &'a str,
    pub shape: (usize, usize, usize, usize),
    pub bar: f64,
}

impl Case<'_> {
    /// Checks `got` against the twin's `want` (with magnitudes `mag`) as one case of the
    /// report; prints the first bad output past the bar.
    pub(crate) fn check(&self, rep: &mut Report, got: &[f32], want: &[f32], mag: &[f64]) {
        let (nrows, k, ntok, splits) = self.shape;
        let bound = worst_over_magnitude(got, want, mag);
        let shape = format!("{nrows}x{k} x {ntok} tokens, {splits} splits");
        if !rep.case(self.name, &shape, "|y - ref| / sum|w x|", bound, self.bar) {
            let bad = got
                .iter()
                .zip(want)
                .position(|(a, b)| {
                    a.is_nan()
                        || f64::from((a - b).abs()) > 10.0 * self.bar * f64::from(b.abs().max(1.0))
                })
                .unwrap_or(0);
            println!(
                "    output {bad} (token {}, row {}): gpu {} cpu {}",
                bad / nrows,
                bad % nrows,
                got[bad],
                want[bad]
            );
        }
    }
}

/// One timed case of the speed table.
pub struct Row {
    pub name: String,
    pub shape: String,
    pub ntok: usize,
    pub gemm_us: f64,
    pub tops: f64,
    pub gemv_us: f64,
}

/// The GEMMs at Llama-3-8B shapes for 8..2048 tokens, beside the GEMV path (launches of
/// eight tokens) for the token counts where both are candidates.
pub fn speed(gpu: &Gpu) -> Result<Vec<Row>> {
    println!("\n== GEMM speed (int8 tensor cores) vs GEMV launches of 8 tokens ==");
    let mut rows = Vec::new();
    let shapes = [
        (4096, 4096),
        (14336, 4096),
        (4096, 14336),
        (1024, 4096),
        (128256, 4096),
    ];
    for (ty, name) in gemm::TYPES {
        let f = gpu.module.load_function(name)?;
        let gemv8 = gpu.gemv(ty, Config::new(8))?;
        for &(nrows, k) in &shapes {
            if ty != GgmlType::Q4_K && nrows == 128256 {
                continue;
            }
            let row_bytes = catalog::row_bytes(ty, k)?;
            let ws = weight_copies(gpu, nrows, row_bytes, 91)?;
            let copies = ws.len();
            for ntok in [8usize, 16, 32, 64, 128, 512, 2048] {
                if ntok > 512 && (nrows != 14336 || ty != GgmlType::Q4_K) {
                    continue;
                }
                let (xd, q) = activations(gpu, ty, k, ntok, 3)?;
                // The GEMV reads q8_1 tiles of the same values.
                let mut q1 = gpu.stream.alloc_zeros::<u8>(act::row_bytes(k)? * ntok)?;
                gpu.quantize(&xd, &mut q1, k, ntok)?;
                let mut y = gpu.stream.alloc_zeros::<f32>(nrows * ntok)?;
                let a = args(
                    nrows,
                    ntok,
                    k,
                    row_bytes,
                    gemm::splits(nrows, k / TILE, Some(ntok), SMS),
                );
                let mut wsp = workspace(gpu, &a)?;
                let flops = 2.0 * (nrows * k * ntok) as f64;
                let launches = ((2e11 / flops) as usize).clamp(3, 200);
                let ms = time_launches(&gpu.stream, 5, 2, launches, |i| {
                    launch(gpu, &f, &a, &ws[i % copies], &q, &mut y, &mut wsp)
                })?;
                let gemv_us = if ntok <= 64 {
                    let act_row = act::row_bytes(k)?;
                    let ms = time_launches(&gpu.stream, 5, 2, launches, |i| {
                        for t0 in (0..ntok).step_by(8) {
                            let xs = q1.slice(t0 * act_row..(t0 + 8) * act_row);
                            let mut ys = y.slice_mut(t0 * nrows..(t0 + 8) * nrows);
                            let d = (
                                nrows as u32,
                                k.div_ceil(TILE) as u32,
                                row_bytes as u32,
                                0u32,
                            );
                            let cfg = Config::new(8);
                            let lc = LaunchConfig {
                                grid_dim: ((nrows as u32).div_ceil(cfg.rows_per_cta()), 1, 1),
                                block_dim: cfg.block(),
                                shared_mem_bytes: 0,
                            };
                            let mut b = gpu.stream.launch_builder(&gemv8);
                            b.arg(&ws[i % copies])
                                .arg(&xs)
                                .arg(&mut ys)
                                .arg(&d.0)
                                .arg(&d.1)
                                .arg(&d.2)
                                .arg(&d.3);
                            unsafe { b.launch(lc) }?;
                        }
                        Ok(())
                    })?;
                    ms * 1e3
                } else {
                    f64::NAN
                };
                let row = Row {
                    name: name.to_string(),
                    shape: format!("{nrows}x{k}"),
                    ntok,
                    gemm_us: ms * 1e3,
                    tops: flops / (ms * 1e-3) / 1e12,
                    gemv_us,
                };
                println!(
                    "{:10} {:>12} x {:4}: gemm {:9.1} us {:6.1} TOPS | gemv x8 {:9.1} us",
                    row.name, row.shape, row.ntok, row.gemm_us, row.tops, row.gemv_us
                );
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The GEMM variants `-o gemm_variants` times: the build-time choices of
/// [`gemm::Variant`], each against the catalog's [`gemm::VARIANT`].
const VARIANTS: [(&str, gemm::Variant); 2] = [
    ("base", gemm::Variant { ldmatrix: false }),
    ("ldm", gemm::Variant { ldmatrix: true }),
];

/// Builds one GEMM kernel of `ty` as variant `v` into `m` under `name`.
fn build_variant(
    m: &mut smelt_ptx::Module,
    ty: GgmlType,
    name: &str,
    v: gemm::Variant,
) -> Result<()> {
    use smelt_kernels::formats::{Q4K, Q4_0, Q5K, Q6K, Q8_0};
    let r = match ty {
        GgmlType::Q4_K => m.kernel(name, |k| gemm::kernel_variant::<Q4K>(k, v)),
        GgmlType::Q5_K => m.kernel(name, |k| gemm::kernel_variant::<Q5K>(k, v)),
        GgmlType::Q6_K => m.kernel(name, |k| gemm::kernel_variant::<Q6K>(k, v)),
        GgmlType::Q8_0 => m.kernel(name, |k| gemm::kernel_variant::<Q8_0>(k, v)),
        GgmlType::Q4_0 => m.kernel(name, |k| gemm::kernel_variant::<Q4_0>(k, v)),
        other => anyhow::bail!("no variant build for {other:?}"),
    };
    r.map(|_| ()).map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

/// Times every [`VARIANTS`] entry of five formats at Llama-3-8B shapes, and the catalog's
/// variant with half and twice the engine's split count; checks every variant's output is
/// byte-identical to the first's (none of the choices may change a sum). Returns the
/// number of outputs that differ.
pub fn variants(gpu: &Gpu) -> Result<usize> {
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_K,
        GgmlType::Q4_0,
    ];
    let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
    let mut names = Vec::new();
    for ty in types {
        for (vi, (_, v)) in VARIANTS.iter().enumerate() {
            let name = format!("variant_{}_{vi}", gemm::name(ty).unwrap_or("gemm"));
            build_variant(&mut m, ty, &name, *v)?;
            names.push(name);
        }
    }
    let module = gpu
        .stream
        .context()
        .load_module(cudarc::nvrtc::Ptx::from_src(m.to_ptx()))?;
    println!("\n== GEMM variants: microseconds a launch (H100 split counts) ==");
    let mut head = String::from("| kernel | rows x k | tokens |");
    for (n, _) in VARIANTS {
        head += &format!(" {n} |");
    }
    head += " splits/2 | splits*2 |";
    println!("{head}");
    println!("|{}", "---|".repeat(VARIANTS.len() + 5));
    let mut differ = 0;
    for (ti, ty) in types.into_iter().enumerate() {
        for (nrows, k) in [(4096usize, 4096usize), (14336, 4096), (4096, 14336)] {
            let row_bytes = catalog::row_bytes(ty, k)?;
            let ws = weight_copies(gpu, nrows, row_bytes, 191)?;
            let copies = ws.len();
            for ntok in [16usize, 32, 64, 128, 512, 2048] {
                if ntok > 512 && nrows != 14336 {
                    continue;
                }
                let (_, q) = activations(gpu, ty, k, ntok, 5)?;
                let mut y = gpu.stream.alloc_zeros::<f32>(nrows * ntok)?;
                let splits = gemm::splits(nrows, k / TILE, Some(ntok), SMS);
                let flops = 2.0 * (nrows * k * ntok) as f64;
                let launches = ((2e11 / flops) as usize).clamp(3, 200);
                let mut line = format!(
                    "| {} | {nrows}x{k} | {ntok} |",
                    gemm::name(ty).unwrap_or("?")
                );
                let mut first: Option<Vec<f32>> = None;
                let time = |f: &CudaFunction, splits: usize, y: &mut CudaSlice<f32>| {
                    let a = args(nrows, ntok, k, row_bytes, splits);
                    let mut wsp = workspace(gpu, &a)?;
                    let ms = time_launches(&gpu.stream, 5, 2, launches, |i| {
                        launch(gpu, f, &a, &ws[i % copies], &q, y, &mut wsp)
                    })?;
                    // The last launch read copy (launches - 1) % copies: recompute on copy 0
                    // for the comparison.
                    launch(gpu, f, &a, &ws[0], &q, y, &mut wsp)?;
                    anyhow::Ok(ms * 1e3)
                };
                for vi in 0..VARIANTS.len() {
                    let f = module.load_function(&names[ti * VARIANTS.len() + vi])?;
                    let us = time(&f, splits, &mut y)?;
                    line += &format!(" {us:.1} |");
                    if ntok <= 512 {
                        let out = gpu.stream.clone_dtoh(&y)?;
                        match &first {
                            None => first = Some(out),
                            Some(f0) => {
                                if f0.iter().zip(&out).any(|(a, b)| a.to_bits() != b.to_bits()) {
                                    println!("  {} differs from {}", VARIANTS[vi].0, VARIANTS[0].0);
                                    differ += 1;
                                }
                            }
                        }
                    }
                }
                let f = gpu.module.load_function(gemm::name(ty).unwrap_or("?"))?;
                for s in [(splits / 2).max(1), splits * 2] {
                    line += &format!(" {:.1} |", time(&f, s, &mut y)?);
                }
                println!("{line}");
            }
        }
    }
    Ok(differ)
}

/// The GEMMs' speed table (`speed`), into the report's perf lines.
pub fn perf(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let rows = speed(gpu)?;
    rep.perf
        .push("GEMM (int8 tensor cores) vs GEMV launches of 8 tokens:".into());
    rep.perf
        .push("| kernel | rows x k | tokens | GEMM us | TOPS | GEMV x8 us |".into());
    rep.perf.push("|---|---|---|---|---|---|".into());
    for r in &rows {
        rep.perf.push(format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            r.name, r.shape, r.ntok, r.gemm_us, r.tops, r.gemv_us
        ));
    }
    Ok(())
}

/// The build-time variants: byte-identical outputs (a case per variant and shape that
/// differs counts as failed), and their timings into the perf lines.
pub fn check_variants(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let differ = variants(gpu)?;
    let note = format!("{differ} variant outputs differ");
    rep.verdict(
        "gemm_variants",
        "8B shapes, 16..2048 tokens",
        differ == 0,
        &note,
    );
    Ok(())
}
