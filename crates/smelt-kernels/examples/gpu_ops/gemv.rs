//! The GPU check of `smelt-kernels`, run on the GPU machine (`bench/gpu/gemv.sh`):
//!
//! 1. parity: every kernel against its CPU twin on fresh random inputs, outputs poisoned
//!    first (0xFF bytes, NaN floats), on several shapes including ragged row counts, and
//!    1..8 tokens;
//! 2. speed: each GEMV at real shapes, timed with CUDA events over many launches that
//!    rotate between several weight copies (so L2 cannot serve them), reported as GB/s of
//!    the bytes a launch must move and as a share of a device-to-device copy measured in
//!    the same run (read + write bytes over time).
//!
//! 3. the tensor-core GEMMs (`--gemm` runs only these): parity against the same twins on
//!    ragged shapes, and speed beside the GEMV path (`common/gemm_check.rs`);
//!    `--gemm-variants` times the GEMM's build-time choices (`gemm::Variant`) against each
//!    other and checks they give byte-identical outputs;
//! 4. the f16 GEMMs (`--gemm-f16` runs only these): the activation conversion byte-exact,
//!    each GEMM against its f16 twin, and its speed beside the int8 GEMM
//!    (`common/gemm_f16_check.rs`).
//!
//! The PTX is generated here and loaded through the driver; no CUDA toolkit is involved.
//! Exit status 1 when any parity check fails.

#[path = "common/gemm_check.rs"]
mod gemm_check;
#[path = "common/gemm_f16_check.rs"]
mod gemm_f16_check;
#[path = "common/timing.rs"]
mod timing;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use rand::{Rng, SeedableRng};
use smelt_kernels::gemv::Config;
use smelt_kernels::{act, catalog, gemv, GgmlType, TILE};
use smelt_ptx::{Kernel, Store, Target, U32};
use timing::{time_graph, time_launches};

/// A small kernel that fills `n` words with a hash of their index, so timing never runs
/// on zeros and nothing large crosses PCIe.
fn fill_kernel(k: &Kernel) {
    let p = k.param_ptr("p");
    let n = k.param_u32("n");
    let seed = k.param_u32("seed");
    k.stride_loop(k.global_id_x(), n, k.grid_size_x(), |k, i| {
        let h = k.mad(k.reg::<U32>(), i, 0x9E37_79B1u32, seed);
        let t = k.shr(k.reg(), h, 15u32);
        k.xor(h, h, t);
        k.mul(h, h, 0x2C1B_3C6Du32);
        let t = k.shr(k.reg(), h, 12u32);
        k.xor(h, h, t);
        k.st(Store::GLOBAL, k.elem_addr(p, i, 4), h);
    });
}

/// The parameters every GEMV takes first (`gemv::kernel`), and its launch shape.
struct GemvDims {
    nrows: u32,
    ntiles: u32,
    row_bytes: u32,
    never: u32,
    launch: LaunchConfig,
}

impl GemvDims {
    fn new(cfg: Config, nrows: usize, k: usize, row_bytes: usize) -> Self {
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
    fn push<'a>(
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

struct Gpu {
    stream: Arc<CudaStream>,
    quantize: CudaFunction,
    fill: CudaFunction,
    module: Arc<cudarc::driver::CudaModule>,
}

impl Gpu {
    fn new() -> Result<Self> {
        let ctx = CudaContext::new(0).context("no CUDA device")?;
        // One stream, so cudarc's per-slice event tracking only costs launch time.
        unsafe { ctx.disable_event_tracking() };
        let mut m = catalog::module(Target::Sm90)?;
        m.kernel("fill", fill_kernel)?;
        let t = Instant::now();
        let module = ctx.load_module(Ptx::from_src(m.to_ptx()))?;
        println!(
            "module: {} kernels, {} KiB of PTX, loaded in {:.0} ms",
            catalog::all().len() + 1,
            m.to_ptx().len() / 1024,
            t.elapsed().as_secs_f64() * 1e3
        );
        Ok(Self {
            // A stream of its own: the legacy default stream cannot be captured into a graph.
            stream: ctx.new_stream()?,
            quantize: module.load_function(catalog::QUANTIZE)?,
            fill: module.load_function("fill")?,
            module,
        })
    }

    fn gemv(&self, ty: GgmlType, cfg: Config) -> Result<CudaFunction> {
        Ok(self
            .module
            .load_function(&catalog::gemv_config_name(ty, cfg)?)?)
    }

    fn quantize(
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
        let mut l = self.stream.launch_builder(&self.quantize);
        l.arg(x).arg(q).arg(&len).arg(&ntiles);
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv_launch(
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
    #[allow(clippy::too_many_arguments)]
    fn gemv_resnorm_launch(
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
    #[allow(clippy::too_many_arguments)]
    fn gemv_rmsin_launch(
        &self,
        ty: GgmlType,
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
        let cfg = Config::rms_input();
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

    fn random_bytes(&self, n: usize, seed: u32) -> Result<CudaSlice<u8>> {
        let words = n.div_ceil(4);
        let mut buf = self.stream.alloc_zeros::<u8>(words * 4)?;
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = words as u32;
        let mut l = self.stream.launch_builder(&self.fill);
        l.arg(&mut buf).arg(&n).arg(&seed);
        unsafe { l.launch(cfg) }?;
        Ok(buf)
    }
}

fn random_floats(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v: f32 = rng.gen_range(-1.0..1.0) * scale;
            // An outlier now and then, as real activations have.
            if i % 97 == 13 {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

/// `nrows` rows of `k` weights of `ty` as ggml bytes: random floats through smelt-quant's
/// quantizer, or, for the formats it cannot produce (IQ4), random blocks with sane f16
/// scales (the first two bytes of every block).
fn random_weights(rng: &mut impl Rng, ty: GgmlType, nrows: usize, k: usize) -> Result<Vec<u8>> {
    let ggml_row = k / ty.block_size() * ty.type_size();
    let mut ggml = vec![0u8; nrows * ggml_row];
    if smelt_quant::can_quantize(ty) {
        let wf = random_floats(rng, nrows * k, 1.0);
        for (src, dst) in wf.chunks_exact(k).zip(ggml.chunks_exact_mut(ggml_row)) {
            smelt_quant::quantize_row(ty, src, dst)?;
        }
    } else {
        rng.fill(&mut ggml[..]);
        for block in ggml.chunks_exact_mut(ty.type_size()) {
            let d = half::f16::from_f32(rng.gen_range(0.001..0.05));
            block[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        }
    }
    Ok(ggml)
}

/// `|y - ref| / |ref|` over the vector (L2), NaN when any output is not finite.
fn rel_error(y: &[f32], r: &[f32]) -> f64 {
    if y.iter().any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let num: f64 = y
        .iter()
        .zip(r)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let den: f64 = r.iter().map(|&b| f64::from(b).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

fn parity(gpu: &Gpu, rng: &mut impl Rng) -> Result<usize> {
    let mut failures = 0;
    println!("\n== parity (fresh random inputs, poisoned outputs) ==");
    // Quantize: exact bytes.
    for (k, ntok) in [
        (256, 1),
        (768, 3),
        (4096, 2),
        (14336, 1),
        (2048, 8),
        (576, 3),
        (640, 2),
        (32, 1),
    ] {
        let scale = rng.gen_range(0.01..10.0);
        let x = random_floats(rng, k * ntok, scale);
        let want = act::quantize_cpu(&x, k)?;
        let xd = gpu.stream.clone_htod(&x)?;
        let mut q = gpu.stream.clone_htod(&vec![0xFFu8; want.len()])?;
        gpu.quantize(&xd, &mut q, k, ntok)?;
        let got = gpu.stream.clone_dtoh(&q)?;
        let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        let ok = diff == 0;
        failures += usize::from(!ok);
        println!(
            "quantize_q8_1 k={k:5} tokens={ntok}: {} ({diff} of {} bytes differ)",
            if ok { "exact" } else { "FAIL" },
            want.len()
        );
    }
    // GEMVs: vs the f64 CPU twin.
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
    for ty in catalog::GEMV_TYPES {
        // K-quant rows are whole super-blocks; the 32-weight formats take any multiple of
        // 32 (rows padded to whole tiles on the GPU).
        let shapes: Vec<_> = all_shapes
            .iter()
            .copied()
            .filter(|&(_, k)| k % ty.block_size() == 0)
            .collect();
        let mut worst = 0f64;
        let mut worst_bound = 0f64;
        let mut cases = 0;
        for &(nrows, k) in &shapes {
            let ggml = random_weights(rng, ty, nrows, k)?;
            let packed = catalog::repack(ty, &ggml, nrows, k)?;
            let row_bytes = catalog::row_bytes(ty, k)?;
            let wd = gpu.stream.clone_htod(&packed)?;
            for cfg in catalog::configs()
                .into_iter()
                .filter(|c| c.ntok <= 3 || c == &Config::new(c.ntok) || c.act_ahead < c.ntok)
            {
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
                let err = rel_error(&got, &want);
                // Each output within 1e-5 of the sum of the magnitudes of its products
                // (f32 accumulation in another order than the f64 twin), none unwritten.
                let bound = worst_over_magnitude(&got, &want, &mag);
                worst_bound = worst_bound.max(if bound.is_nan() { f64::INFINITY } else { bound });
                cases += 1;
                if bound.is_nan() || bound >= 1e-5 {
                    failures += 1;
                    println!("{ty:?} {nrows}x{k} {cfg:?}: FAIL error/magnitude {bound:.3e}, rel L2 err {err:.3e}");
                    let bad = got
                        .iter()
                        .zip(&want)
                        .position(|(a, b)| a.is_nan() || (a - b).abs() > 1e-4 * b.abs().max(1.0));
                    if let Some(i) = bad {
                        println!("  first bad output {i}: gpu {} cpu {}", got[i], want[i]);
                    }
                }
                worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
            }
        }
        println!("gemv {ty:?}: {cases} cases (shapes {shapes:?}, tokens 1..8 and the tuning variants): worst |y - ref| / sum|w x| {worst_bound:.2e}, worst rel L2 err {worst:.2e}");
    }
    Ok(failures)
}

/// The largest `|got - want| / mag` of a matmul's outputs (`mag`: each output's sum of
/// the magnitudes of its products, what float rounding grows with); NaN when any output is
/// NaN (unwritten: the outputs were poisoned).
fn worst_over_magnitude(got: &[f32], want: &[f32], mag: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .zip(mag)
        .map(|((&g, &w), &m)| (f64::from(g) - f64::from(w)).abs() / m.max(1e-30))
        .fold(0f64, |a, e| {
            if e.is_nan() || a.is_nan() {
                f64::NAN
            } else {
                a.max(e)
            }
        })
}

/// The largest `|got - want| / scale` (NaN when any `got` is not finite).
fn worst_scaled(got: &[f32], want: &[f64], scale: impl Fn(usize) -> f64) -> f64 {
    got.iter()
        .zip(want)
        .enumerate()
        .fold(0f64, |a, (i, (&g, &w))| {
            let e = (f64::from(g) - w).abs() / scale(i).max(1e-30);
            if e.is_nan() || a.is_nan() || !g.is_finite() {
                f64::NAN
            } else {
                a.max(e)
            }
        })
}

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
fn parity_split_norm(gpu: &Gpu, rng: &mut impl Rng) -> Result<usize> {
    let mut failures = 0;
    let eps = 1e-5f32;
    for ty in catalog::GEMV_TYPES {
        let mut worst = [0f64; 6];
        let mut cases = 0;
        // (residual length n, producer k, consumer rows): n = 576 leaves its last tile
        // partly padded; K-quant consumers need n a multiple of 256.
        for (n, k_in, rows2) in [(576, 512, 70), (1024, 256, 33), (4096, 4096, 160)] {
            if n % ty.block_size() != 0 || k_in % ty.block_size() != 0 {
                continue;
            }
            cases += 1;
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
                ty,
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
            // Without an output pointer the GEMV's results are the same.
            let mut y3 = gpu.stream.clone_htod(&vec![f32::NAN; rows2])?;
            gpu.gemv_rmsin_launch(
                ty,
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
        let bars = [1e-5, 1e-5, 0.0, 1e-5, 1e-5, 1e-6];
        let ok = worst.iter().zip(bars).all(|(&w, b)| w <= b);
        failures += usize::from(!ok);
        println!(
            "split norm {ty:?}: {cases} shapes: {} (y {:.1e}, res {:.1e}, tile bytes differing {}, partials {:.1e}, consumer {:.1e}, out {:.1e})",
            if ok { "PASS" } else { "FAIL" },
            worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]
        );
    }
    Ok(failures)
}

/// The Q|K|V GEMV with the rope + KV-append epilogue (`gemv::Config::rope_kv`), on plain
/// and on split-norm tiles: `y` and both caches byte for byte equal to the GEMV without it
/// followed by `rope_kv_normal` (the kernels it replaces, each checked against its twin),
/// caches poisoned, with and without frequency factors; `y` also against its CPU twin
/// (`gemv::cpu`, then `ops::rope::rope_kv_cpu`) within the GEMV bound.
fn parity_rope_gemv(gpu: &Gpu, rng: &mut impl Rng) -> Result<usize> {
    use smelt_kernels::ops::kv::SeqDesc;
    use smelt_kernels::ops::rope::{self, RopeStyle};
    let mut failures = 0;
    let rope_kv = gpu.module.load_function(rope::kv_name(RopeStyle::Normal))?;
    let (bs, n_blocks) = (16usize, 4usize);
    let tables: Vec<u32> = vec![2, 0, 3, 1];
    let tables_d = gpu.stream.clone_htod(&tables)?;
    for ty in catalog::GEMV_TYPES {
        let mut differ = 0usize;
        let mut worst = 0f64;
        let mut cases = 0;
        // (n_head, n_head_kv, head_dim, k): GQA and MHA, 64 and 128 values a head.
        for (n_head, n_head_kv, hd, k) in [(4, 2, 64, 512), (2, 2, 128, 256), (8, 2, 128, 1024)] {
            if k % ty.block_size() != 0 {
                continue;
            }
            for (with_ff, with_rms, pos) in
                [(false, false, 37u32), (true, true, 50), (true, false, 5)]
            {
                cases += 1;
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
                        let lr = rope::kv_launch(n_head, n_head_kv, hd);
                        let (nh, nhkv) = (n_head as u32, n_head_kv as u32);
                        let v_view = y.slice(q_rows + kv_dim..);
                        let mut l = gpu.stream.launch_builder(&rope_kv);
                        l.arg(&y)
                            .arg(&pos_d)
                            .arg(&ff_ptr)
                            .arg(&v_view)
                            .arg(&mut kc)
                            .arg(&mut vc)
                            .arg(&desc_d)
                            .arg(&tables_d)
                            .arg(&nh)
                            .arg(&nhkv)
                            .arg(&hdu)
                            .arg(&bsu)
                            .arg(&theta)
                            .arg(&freq_scale);
                        let cfg = LaunchConfig {
                            grid_dim: lr.grid,
                            block_dim: lr.block,
                            shared_mem_bytes: 0,
                        };
                        unsafe { l.launch(cfg) }?;
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
                rope::rope_kv_cpu(
                    qk,
                    vpart,
                    &mut kc_w,
                    &mut vc_w,
                    desc,
                    &tables,
                    n_head,
                    n_head_kv,
                    hd,
                    bs,
                    RopeStyle::Normal,
                    freq_base,
                    freq_scale,
                    with_ff.then_some(&ff[..]),
                );
                let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
                let scale = |i: usize| (mag[i].max(mag[i ^ 1])) * inv + want64[i].abs();
                worst = worst.max(worst_scaled(&b.0, &want64, scale));
            }
        }
        let ok = differ == 0 && worst <= 1e-5;
        failures += usize::from(!ok);
        println!(
            "gemv + rope + kv append {ty:?}: {cases} cases: {} (values differing from the unfused kernels {differ}, y vs twin {worst:.1e})",
            if ok { "PASS" } else { "FAIL" }
        );
    }
    Ok(failures)
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

fn speed(gpu: &Gpu, quick: bool) -> Result<(f64, Vec<Row>)> {
    println!("\n== speed ==");
    let copy_bytes = 1usize << 30;
    let src = gpu.random_bytes(copy_bytes, 1)?;
    let mut dst = gpu.stream.alloc_zeros::<u8>(copy_bytes)?;
    let ms = time_launches(&gpu.stream, 7, 10, 5, |_| {
        Ok(gpu.stream.memcpy_dtod(&src, &mut dst)?)
    })?;
    let copy = 2.0 * copy_bytes as f64 / (ms * 1e-3) / 1e9;
    println!("device copy (cuMemcpyDtoD of 1 GiB, read + write): {copy:.0} GB/s");
    drop((src, dst));

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
    // `--tune` flag times them again, here for every format.
    let tune = std::env::args().any(|a| a == "--tune");
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
    if quick {
        cases.truncate(2);
    }
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
        let x = random_floats(&mut rand::rngs::StdRng::seed_from_u64(5), k * ntok, 1.0);
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
    Ok((copy, rows))
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let gpu = Gpu::new()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    if std::env::args().any(|a| a == "--gemm-variants") {
        let differ = gemm_check::variants(&gpu)?;
        println!("GEMM variant outputs that differ: {differ}");
        if differ > 0 {
            bail!("{differ} GEMM variants changed a result");
        }
        return Ok(());
    }
    if std::env::args().any(|a| a == "--gemm-f16") {
        let failures = gemm_f16_check::parity(&gpu, &mut rng)?;
        let rows = gemm_f16_check::speed(&gpu)?;
        println!("\n== summary: f16 GEMM vs int8 GEMM, microseconds a launch ==");
        println!("| type | rows x k | tokens | int8 | f16 (1 block) | f16 (2 blocks) | best f16 / int8 | narrow | narrow / int8 | batch-wide f16 | batch-wide / int8 | int8 act | f16 act |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &rows {
            let best = r.f16_us[0].min(r.f16_us[1]);
            let (narrow, ratio) = r.narrow_us.map_or(("-".into(), "-".into()), |us| {
                (format!("{us:.1}"), format!("{:.2}", us / r.int8_us))
            });
            let (small, sratio) = r.small_us.map_or(("-".into(), "-".into()), |us| {
                (format!("{us:.1}"), format!("{:.2}", us / r.int8_us))
            });
            println!(
                "| {:?} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {narrow} | {ratio} | {small} | {sratio} | {:.1} | {:.1} |",
                r.ty,
                r.shape,
                r.ntok,
                r.int8_us,
                r.f16_us[0],
                r.f16_us[1],
                best / r.int8_us,
                r.act_us[0],
                r.act_us[1]
            );
        }
        println!("f16 GEMM parity failures: {failures}");
        if failures > 0 {
            bail!("{failures} f16 GEMM parity checks failed");
        }
        return Ok(());
    }
    if std::env::args().any(|a| a == "--gemm") {
        let failures = gemm_check::parity(&gpu, &mut rng)?;
        let rows = gemm_check::speed(&gpu)?;
        println!("\n== summary: GEMM (int8 tensor cores) vs GEMV launches of 8 tokens ==");
        println!("| kernel | rows x k | tokens | GEMM us | TOPS | GEMV x8 us |");
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
                r.name, r.shape, r.ntok, r.gemm_us, r.tops, r.gemv_us
            );
        }
        println!("GEMM parity failures: {failures}");
        if failures > 0 {
            bail!("{failures} GEMM parity checks failed");
        }
        return Ok(());
    }
    let mut failures = parity(&gpu, &mut rng)?;
    failures += gemm_check::parity(&gpu, &mut rng)?;
    failures += gemm_f16_check::parity(&gpu, &mut rng)?;
    failures += parity_split_norm(&gpu, &mut rng)?;
    failures += parity_rope_gemv(&gpu, &mut rng)?;
    if std::env::args().any(|a| a == "--parity-only") {
        println!("parity failures: {failures}");
        if failures > 0 {
            bail!("{failures} parity checks failed");
        }
        return Ok(());
    }
    let (copy, rows) = speed(&gpu, quick)?;
    println!("\n== summary: GEMV GB/s (bytes a launch must move) vs device copy {copy:.0} GB/s, stream launches and CUDA-graph replays ==");
    println!("| kernel | rows x k | tokens | stream us | stream GB/s | % copy | graph us | graph GB/s | % copy |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
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
        );
    }
    println!("parity failures: {failures}");
    if failures > 0 {
        bail!("{failures} parity checks failed");
    }
    Ok(())
}
