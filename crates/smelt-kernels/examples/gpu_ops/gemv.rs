//! The GEMVs (one to eight tokens, every weight format, the tuning variants) and the
//! activation quantizer they read (`quantize_q8_1`): parity against the f64 CPU twin
//! (`gemv::cpu_with_magnitude`) on ragged shapes with poisoned outputs, and (perf) each
//! GEMV at real shapes, timed over launches that rotate between weight copies so L2
//! cannot serve them, in GB/s of the bytes a launch must move beside a device copy
//! measured in the same run.

use anyhow::Result;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt_kernels::gemv::Config;
use smelt_kernels::{act, catalog, gemv, GgmlType, TILE};

use super::harness::{
    random_floats, random_weights, rel_error, want, worst_over_magnitude, Gpu, Report,
};
use super::timing::{time_graph, time_launches};

/// The plain GEMVs (the fused ones are `gemv_fused`'s).
pub const PLAIN: &[&str] = &["gemv_q*", "gemv_iq*"];

/// The parameters every GEMV takes first (`gemv::kernel`), and its launch shape.
pub struct GemvDims {
    pub nrows: u32,
    pub ntiles: u32,
    pub row_bytes: u32,
    pub never: u32,
    pub launch: LaunchConfig,
}

impl GemvDims {
    pub fn new(cfg: Config, nrows: usize, k: usize, row_bytes: usize) -> Self {
        let nrows = nrows as u32;
        Self {
            nrows,
            ntiles: k.div_ceil(TILE) as u32,
            row_bytes: row_bytes as u32,
            never: 0,
            launch: LaunchConfig {
                grid_dim: (nrows.div_ceil(cfg.rows_per_cta()), 1, 1),
                block_dim: cfg.block(),
                shared_mem_bytes: 0,
            },
        }
    }

    /// Pushes `w, x, y, nrows, ntiles, row_bytes, never`.
    pub fn push<'a>(
        &'a self,
        l: &mut cudarc::driver::LaunchArgs<'a>,
        w: &'a CudaSlice<u8>,
        x: &'a CudaSlice<u8>,
        y: &'a mut CudaSlice<f32>,
    ) {
        l.arg(w)
            .arg(x)
            .arg(y)
            .arg(&self.nrows)
            .arg(&self.ntiles)
            .arg(&self.row_bytes)
            .arg(&self.never);
    }
}

impl Gpu {
    pub fn gemv(&self, ty: GgmlType, cfg: Config) -> Result<CudaFunction> {
        Ok(self
            .module
            .load_function(&catalog::gemv_config_name(ty, cfg)?)?)
    }

    pub fn quantize(
        &self,
        x: &CudaSlice<f32>,
        q: &mut CudaSlice<u8>,
        k: usize,
        ntok: usize,
    ) -> Result<()> {
        let (len, ntiles) = (k as u32, k.div_ceil(TILE) as u32);
        let cfg = LaunchConfig {
            grid_dim: (ntiles.div_ceil(act::QUANTIZE_WARPS), ntok as u32, 1),
            block_dim: (32, act::QUANTIZE_WARPS, 1),
            shared_mem_bytes: 0,
        };
        let f = self.f(catalog::QUANTIZE)?;
        let mut l = self.stream.launch_builder(&f);
        l.arg(x).arg(q).arg(&len).arg(&ntiles);
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    pub fn gemv_launch(
        &self,
        (f, cfg): (&CudaFunction, Config),
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        y: &mut CudaSlice<f32>,
        nrows: usize,
        k: usize,
        row_bytes: usize,
    ) -> Result<()> {
        let d = GemvDims::new(cfg, nrows, k, row_bytes);
        let mut l = self.stream.launch_builder(f);
        d.push(&mut l, w, x, y);
        unsafe { l.launch(d.launch) }?;
        Ok(())
    }

    /// The producer half of the split residual norm (`gemv::Fuse::ResidualNorm`).
    pub fn gemv_resnorm_launch(
        &self,
        ty: GgmlType,
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        y: &mut CudaSlice<f32>,
        (nrows, k, row_bytes): (usize, usize, usize),
        res: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        q: &mut CudaSlice<u8>,
        partials: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let cfg = Config::residual_norm();
        let f = self.gemv(ty, cfg)?;
        let d = GemvDims::new(cfg, nrows, k, row_bytes);
        let mut l = self.stream.launch_builder(&f);
        d.push(&mut l, w, x, y);
        l.arg(res).arg(g).arg(q).arg(partials);
        unsafe { l.launch(d.launch) }?;
        Ok(())
    }

    /// The consumer half (`gemv::Fuse::RmsInput`); `out` None passes a null pointer.
    pub fn gemv_rmsin_launch(
        &self,
        (ty, cfg): (GgmlType, Config),
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        y: &mut CudaSlice<f32>,
        (nrows, k, row_bytes): (usize, usize, usize),
        partials: &CudaSlice<f32>,
        eps: f32,
        res: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        out: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let f = self.gemv(ty, cfg)?;
        let d = GemvDims::new(cfg, nrows, k, row_bytes);
        let (nparts, n) = (partials.len() as u32, k as u32);
        let null = 0u64;
        let mut l = self.stream.launch_builder(&f);
        d.push(&mut l, w, x, y);
        l.arg(partials)
            .arg(&nparts)
            .arg(&n)
            .arg(&eps)
            .arg(res)
            .arg(g);
        match out {
            Some(o) => l.arg(o),
            None => l.arg(&null),
        };
        unsafe { l.launch(d.launch) }?;
        Ok(())
    }
}

/// `quantize_q8_1`: the twin's bytes exactly, into an output poisoned with 0xFF.
pub fn check_quantize(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    for (k, ntok) in [
        (256, 1),
        (768, 3),
        (4096, 2),
        (14336, 1),
        (2048, 8),
        (576, 3),
        (640, 2),
        (32, 1),
        (4128, 5),
    ] {
        let shape = format!("k {k} x {ntok} tokens");
        if !want(&shape) {
            continue;
        }
        let scale = rng.gen_range(0.01..10.0);
        let x = random_floats(rng, k * ntok, scale);
        let want = act::quantize_cpu(&x, k)?;
        let xd = gpu.stream.clone_htod(&x)?;
        let mut q = gpu.stream.clone_htod(&vec![0xFFu8; want.len()])?;
        gpu.quantize(&xd, &mut q, k, ntok)?;
        let got = gpu.stream.clone_dtoh(&q)?;
        let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        let note = format!("{diff} of {} bytes differ", want.len());
        rep.verdict("quantize_q8_1", &shape, diff == 0, &note);
    }
    Ok(())
}

/// Every GEMV (each format, 1..8 tokens, the tuning variants) against the f64 CPU twin:
/// each output within 1e-5 of the sum of the magnitudes of its products (f32 accumulation
/// in another order than the twin), none unwritten.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let configs: Vec<Config> = catalog::configs()
        .into_iter()
        .filter(|c| c.ntok <= 3 || c == &Config::new(c.ntok) || c.act_ahead < c.ntok)
        .collect();
    check_configs(gpu, rng, rep, &catalog::GEMV_TYPES, &configs)
}

/// `gemv_tune`'s check: the one-token layouts of the formats real files mix, against
/// the twin as [`check`] does.
pub fn check_tune(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let types = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0];
    check_configs(gpu, rng, rep, &types, &catalog::one_token_layouts())
}

fn check_configs(
    gpu: &Gpu,
    rng: &mut StdRng,
    rep: &mut Report,
    types: &[GgmlType],
    configs: &[Config],
) -> Result<()> {
    let all_shapes = [
        (1, 256),
        (5, 512),
        (37, 2304),
        (130, 4096),
        (517, 1280),
        (3, 14336),
        (9, 576),
        (70, 640),
        (2, 32),
        (11, 4128),
    ];
    for &ty in types {
        // K-quant rows are whole super-blocks; the 32-weight formats take any multiple of
        // 32 (rows padded to whole tiles on the GPU).
        let shapes: Vec<_> = all_shapes
            .iter()
            .copied()
            .filter(|&(_, k)| k % ty.block_size() == 0)
            .collect();
        let op = format!("gemv {ty:?}");
        for &(nrows, k) in &shapes {
            if !want(&format!("{nrows}x{k}")) {
                continue;
            }
            let ggml = random_weights(rng, ty, nrows, k)?;
            let packed = catalog::repack(ty, &ggml, nrows, k)?;
            let row_bytes = catalog::row_bytes(ty, k)?;
            let wd = gpu.stream.clone_htod(&packed)?;
            for &cfg in configs {
                let ntok = cfg.ntok;
                let x = random_floats(rng, k * ntok, 2.0);
                let xd = gpu.stream.clone_htod(&x)?;
                let mut q = gpu.stream.alloc_zeros::<u8>(act::row_bytes(k)? * ntok)?;
                gpu.quantize(&xd, &mut q, k, ntok)?;
                let qh = gpu.stream.clone_dtoh(&q)?;
                let mut y = gpu.stream.clone_htod(&vec![f32::NAN; nrows * ntok])?;
                gpu.gemv_launch(
                    (&gpu.gemv(ty, cfg)?, cfg),
                    &wd,
                    &q,
                    &mut y,
                    nrows,
                    k,
                    row_bytes,
                )?;
                let got = gpu.stream.clone_dtoh(&y)?;
                let (want, mag) = gemv::cpu_with_magnitude(ty, &ggml, nrows, k, &qh, ntok)?;
                let bound = worst_over_magnitude(&got, &want, &mag);
                let shape = format!("{nrows}x{k} {}", catalog::gemv_config_name(ty, cfg)?);
                if !rep.case(&op, &shape, "|y - ref| / sum|w x|", bound, 1e-5) {
                    println!("    rel L2 err {:.3e}", rel_error(&got, &want));
                    let bad = got
                        .iter()
                        .zip(&want)
                        .position(|(a, b)| a.is_nan() || (a - b).abs() > 1e-4 * b.abs().max(1.0));
                    if let Some(i) = bad {
                        println!("    first bad output {i}: gpu {} cpu {}", got[i], want[i]);
                    }
                }
            }
        }
    }
    Ok(())
}

struct Row {
    name: String,
    shape: String,
    ntok: usize,
    us: f64,
    gbs: f64,
    us_graph: f64,
    gbs_graph: f64,
}

/// The device copy rate (`cuMemcpyDtoD` of 1 GiB, bytes read + written a second).
fn copy_rate(gpu: &Gpu) -> Result<f64> {
    println!("\n== speed ==");
    let copy_bytes = 1usize << 30;
    let src = gpu.random_bytes(copy_bytes, 1)?;
    let mut dst = gpu.stream.alloc_zeros::<u8>(copy_bytes)?;
    let ms = time_launches(&gpu.stream, 7, 10, 5, |_| {
        Ok(gpu.stream.memcpy_dtod(&src, &mut dst)?)
    })?;
    let copy = 2.0 * copy_bytes as f64 / (ms * 1e-3) / 1e9;
    println!("device copy (cuMemcpyDtoD of 1 GiB, read + write): {copy:.0} GB/s");
    Ok(copy)
}

fn speed(gpu: &Gpu) -> Result<(f64, Vec<Row>)> {
    let copy = copy_rate(gpu)?;
    let shapes: &[(usize, usize)] = &[
        (14336, 4096),
        (4096, 14336),
        (4096, 4096),
        (1024, 4096),
        (151936, 2048),
    ];
    let mut cases: Vec<(GgmlType, (usize, usize), Config)> = Vec::new();
    for ty in catalog::GEMV_TYPES {
        for &s in shapes {
            cases.push((ty, s, Config::new(1)));
        }
    }
    // The variants were timed against the defaults on 2026-11-22 (bench/RESULTS.md); the
    // `GPU_OPS_TUNE=1` times them again, here for every format.
    let tune = std::env::var("GPU_OPS_TUNE").is_ok_and(|v| v == "1");
    for ty in catalog::GEMV_TYPES {
        let legacy = ty.block_size() == 32 && ty != GgmlType::Q8_0;
        for cfg in catalog::tuning_configs() {
            let pinned_one_row =
                cfg.ntok == 1 && cfg.rows_per_warp == 1 && cfg.pin_loads && !cfg.no_l1;
            let streamed = cfg.act_ahead < cfg.ntok
                && matches!(ty, GgmlType::Q4_K | GgmlType::Q8_0 | GgmlType::Q6_K);
            if cfg != Config::new(cfg.ntok) && (tune || (legacy && pinned_one_row) || streamed) {
                cases.push((ty, (14336, 4096), cfg));
                cases.push((ty, (4096, 14336), cfg));
            }
        }
    }
    for ntok in [2, 4, 8] {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
        ] {
            cases.push((ty, (14336, 4096), Config::new(ntok)));
            cases.push((ty, (4096, 14336), Config::new(ntok)));
        }
    }
    Ok((copy, time_cases(gpu, copy, cases)?))
}

/// Each case timed over stream launches and graph replays (printed as it goes).
fn time_cases(
    gpu: &Gpu,
    copy: f64,
    cases: Vec<(GgmlType, (usize, usize), Config)>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (ty, (nrows, k), cfg) in cases {
        let ntok = cfg.ntok;
        let row_bytes = catalog::row_bytes(ty, k)?;
        let wbytes = nrows * row_bytes;
        // Enough copies that one pass over them is several times the L2 (50-60 MB).
        let copies = (600_000_000usize.div_ceil(wbytes)).clamp(2, 64);
        let ws: Vec<_> = (0..copies)
            .map(|c| gpu.random_bytes(wbytes, 17 + c as u32))
            .collect::<Result<_>>()?;
        let x = random_floats(&mut StdRng::seed_from_u64(5), k * ntok, 1.0);
        let xd = gpu.stream.clone_htod(&x)?;
        let mut q = gpu.stream.alloc_zeros::<u8>(act::row_bytes(k)? * ntok)?;
        gpu.quantize(&xd, &mut q, k, ntok)?;
        let mut y = gpu.stream.alloc_zeros::<f32>(nrows * ntok)?;
        let f = gpu.gemv(ty, cfg)?;
        let launches = (4_000_000_000usize / wbytes).clamp(50, 2000);
        let mut launch =
            |i: usize| gpu.gemv_launch((&f, cfg), &ws[i % copies], &q, &mut y, nrows, k, row_bytes);
        let ms = time_launches(&gpu.stream, 7, 10, launches, &mut launch)?;
        let ms_graph = time_graph(&gpu.stream, 7, launches, &mut launch)?;
        let bytes = (wbytes + q.len() + 4 * y.len()) as f64;
        let gbs = bytes / (ms * 1e-3) / 1e9;
        let gbs_graph = bytes / (ms_graph * 1e-3) / 1e9;
        let name = catalog::gemv_config_name(ty, cfg)?;
        let shape = format!("{nrows}x{k}");
        println!(
            "{name:20} {shape:>12}: stream {:8.2} us {gbs:5.0} GB/s {:5.1}% | graph {:8.2} us {gbs_graph:5.0} GB/s {:5.1}%  ({copies} copies, {launches} launches x 7)",
            ms * 1e3,
            100.0 * gbs / copy,
            ms_graph * 1e3,
            100.0 * gbs_graph / copy,
        );
        rows.push(Row {
            name,
            shape,
            ntok,
            us: ms * 1e3,
            gbs,
            us_graph: ms_graph * 1e3,
            gbs_graph,
        });
    }
    Ok(rows)
}

/// The single-token decode shapes of Llama-3-8B and Qwen3-32B (Q|K|V, O, gate|up, down).
const DECODE_SHAPES: [(usize, usize); 8] = [
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (10240, 5120),
    (5120, 8192),
    (51200, 5120),
    (5120, 25600),
];

/// `gemv_tune` (explicit): the single-token Q4_K GEMV at the decode shapes of both models
/// in every one-token layout of the catalog (`catalog::one_token_layouts`: one, two or four
/// rows a warp), to choose a card's layouts by measurement.
pub fn tune(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let copy = copy_rate(gpu)?;
    let mut cases = Vec::new();
    for s in DECODE_SHAPES {
        for cfg in catalog::one_token_layouts() {
            cases.push((GgmlType::Q4_K, s, cfg));
        }
    }
    let rows = time_cases(gpu, copy, cases)?;
    rep.perf.push(format!(
        "Q4_K one-token GEMV layouts, CUDA-graph replays, % of the device copy ({copy:.0} GB/s):"
    ));
    let names: Vec<&str> = rows
        .iter()
        .filter(|r| r.shape == rows[0].shape)
        .map(|r| r.name.as_str())
        .collect();
    rep.perf.push(format!("| shape | {} |", names.join(" | ")));
    rep.perf
        .push(format!("|---|{}", "---:|".repeat(names.len())));
    for chunk in rows.chunks(names.len()) {
        let cells: Vec<String> = chunk
            .iter()
            .map(|r| format!("{:.2} us {:.1}%", r.us_graph, 100.0 * r.gbs_graph / copy))
            .collect();
        rep.perf
            .push(format!("| {} | {} |", chunk[0].shape, cells.join(" | ")));
    }
    Ok(())
}

/// Each GEMV's time per launch and GB/s at Llama-3-8B and vocabulary shapes, stream
/// launches and CUDA-graph replays, beside the device copy.
pub fn perf(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (copy, rows) = speed(gpu)?;
    rep.perf.push(format!("GEMV GB/s (bytes a launch must move) vs device copy {copy:.0} GB/s, stream launches and CUDA-graph replays:"));
    rep.perf.push("| kernel | rows x k | tokens | stream us | stream GB/s | % copy | graph us | graph GB/s | % copy |".into());
    rep.perf
        .push("|---|---|---|---|---|---|---|---|---|".into());
    for r in &rows {
        rep.perf.push(format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.1} | {:.2} | {:.0} | {:.1} |",
            r.name,
            r.shape,
            r.ntok,
            r.us,
            r.gbs,
            100.0 * r.gbs / copy,
            r.us_graph,
            r.gbs_graph,
            100.0 * r.gbs_graph / copy
        ));
    }
    Ok(())
}
