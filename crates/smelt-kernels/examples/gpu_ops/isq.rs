//! The in-situ quantizers (`smelt_kernels::quantize`, issue 6) and the repack kernels
//! (`formats::gpu_repack`, issue 20) against their CPU twins:
//!
//! - quantize: for every type x input dtype, random rows (several distributions and shapes:
//!   1 row, ragged row counts; 4096x14336 only with `-s 4096x14336`) and adversarial rows
//!   (zeros, signed zeros, constants, one huge outlier, tiny and subnormal magnitudes, mixed
//!   signs over a wide range, ties of the first-wins scans, values on rounding ties) must
//!   give the CPU twin's bytes (`smelt_quant::quantize_row`) byte for byte, into outputs
//!   poisoned with 0xFF; rows with NaN/Inf must raise the flag of the CPU's first bad row
//!   and column. Perf: a 4096x14336 bf16 tensor to each type (GB/s of input), and every
//!   matrix of a Qwen3-32B-shaped model from bf16 generated on the GPU to Q6_K, total
//!   seconds (CUDA events around the quantize launches).
//! - repack: every GEMV format's repack kernel (ggml blocks into the GEMV's row layout on
//!   the device) against `catalog::repack` on random bytes, several shapes (ragged rows,
//!   zero blocks), outputs poisoned with 0xAB; perf: a 14336x4096 matrix.

use std::time::Instant;

use anyhow::{bail, Result};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr_free::normal;
use smelt_kernels::formats::gpu_repack;
use smelt_kernels::quantize::{self, Input};
use smelt_kernels::{catalog, GgmlType};
use smelt_ptx::Kernel;

use super::harness::{want, Gpu, Report, SHAPES};

/// Gaussian samples without another dependency (Box-Muller on the workspace's `rand`).
mod rand_distr_free {
    use rand::Rng;
    pub fn normal(rng: &mut impl Rng) -> f32 {
        let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = rng.gen();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// Fills `n` words with pairs of finite bf16 values (random sign and mantissa, exponents
/// giving magnitudes 2^-7 .. 2): benchmark weights made on the device.
pub fn fill_bf16_kernel(k: &Kernel) {
    smelt_cuda::fill_with(k, |k, h| {
        // Per half: keep sign and mantissa, exponent 120 + 3 random bits.
        let keep = k.and(k.reg(), h, 0x807F_807Fu32);
        let e = k.shr(k.reg(), h, 4u32);
        k.and(e, e, 0x0380_0380u32);
        k.or(keep, keep, e);
        k.or(keep, keep, 0x3C00_3C00u32);
        keep
    });
}

/// The quantize kernels of every type and input.
pub const QUANTIZE: &[&str] = &["isq_*"];
/// The repack kernels.
pub const REPACK: &[&str] = &["repack_*"];

impl Gpu {
    /// Queues the quantize kernel of `ty`/`input` over `rows` x `cols`.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        f: &CudaFunction,
        ty: GgmlType,
        src: &CudaSlice<u8>,
        dst: &mut CudaSlice<u8>,
        flags: &mut CudaSlice<u32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let p = quantize::plan(ty, rows, cols)?;
        let cfg = LaunchConfig {
            grid_dim: (p.grid, 1, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.stream.launch_builder(f);
        l.arg(src)
            .arg(dst)
            .arg(flags)
            .arg(&p.blocks)
            .arg(&p.blocks_per_row);
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    fn function(&self, ty: GgmlType, input: Input) -> Result<CudaFunction> {
        Ok(self
            .module
            .load_function(&quantize::kernel_name(ty, input)?)?)
    }

    fn fill_bf16(&self, buf: &mut CudaSlice<u8>, seed: u32) -> Result<()> {
        let n = (buf.len() / 4) as u32;
        let cfg = LaunchConfig {
            grid_dim: (2048, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let fill = self.f("fill_bf16")?;
        let mut l = self.stream.launch_builder(&fill);
        l.arg(buf).arg(&n).arg(&seed);
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}

/// A named test tensor: `rows` x `cols` f32 values.
struct Case {
    name: String,
    rows: usize,
    cols: usize,
    x: Vec<f32>,
}

fn random_cases(rng: &mut impl Rng, big: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut add = |name: &str, rows: usize, cols: usize, f: &mut dyn FnMut(usize) -> f32| {
        v.push(Case {
            name: name.to_string(),
            rows,
            cols,
            x: (0..rows * cols).map(&mut *f).collect(),
        });
    };
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("normal 1x256", 1, 256, &mut |_| normal(&mut r));
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("normal 7x768", 7, 768, &mut |_| 0.02 * normal(&mut r));
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("uniform 33x512", 33, 512, &mut |_| {
        r.gen_range(-1.0f32..1.0)
    });
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    let scales: Vec<f32> = (0..5 * 2048 / 16)
        .map(|_| 10f32.powf(r.gen_range(-6.0f32..3.0)))
        .collect();
    add("block scales 1e-6..1e3 5x2048", 5, 2048, &mut |i| {
        scales[i / 16] * normal(&mut r)
    });
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("outliers 3x4096", 3, 4096, &mut |i| {
        let v = normal(&mut r);
        if i % 97 == 13 {
            v * 40.0
        } else {
            v
        }
    });
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("all positive 2x512", 2, 512, &mut |_| {
        r.gen_range(0.5f32..2.0)
    });
    let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
    add("all negative 2x512", 2, 512, &mut |_| {
        r.gen_range(-3.0f32..-0.1)
    });
    if big {
        let mut r = rand::rngs::StdRng::seed_from_u64(rng.gen());
        add("normal 4096x14336", 4096, 14336, &mut |_| {
            0.02 * normal(&mut r)
        });
    }
    v
}

/// Adversarial rows of 1024 weights, one pattern per row; `big` is the outlier magnitude
/// (kept finite in the input type).
fn adversarial(rng: &mut impl Rng, big: f32) -> Case {
    let cols = 1024;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    rows.push(vec![0.0; cols]);
    rows.push(
        (0..cols)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect(),
    );
    rows.push(
        (0..cols)
            .map(|i| if i % 5 == 1 { -0.0 } else { 0.0 })
            .collect(),
    );
    rows.push(vec![1.0; cols]);
    rows.push(vec![-3.7; cols]);
    rows.push(
        (0..cols)
            .map(|i| if i % 2 == 0 { 0.75 } else { -0.75 })
            .collect(),
    );
    rows.push(
        (0..cols)
            .map(|i| if i == 77 { big } else { 0.01 * normal(rng) })
            .collect(),
    );
    rows.push(
        (0..cols)
            .map(|i| if i % 256 == 200 { -big } else { normal(rng) })
            .collect(),
    );
    // Squares and sums that overflow f32 (x^2 = inf, inf - inf = NaN inside the searches).
    let huge = if big > 1e5 { 1e19 } else { 1e4 };
    rows.push((0..cols).map(|_| huge * normal(rng)).collect());
    let top = if big > 1e5 { 3.0e38 } else { 6.0e4 };
    rows.push(
        (0..cols)
            .map(|i| if i % 64 == 9 { top } else { normal(rng) })
            .collect(),
    );
    rows.push((0..cols).map(|_| 1e-30 * normal(rng)).collect());
    rows.push((0..cols).map(|_| 1e-38 * normal(rng)).collect());
    rows.push((0..cols).map(|_| 3e-41 * normal(rng)).collect());
    rows.push(
        (0..cols)
            .map(|i| {
                let e = (i % 40) as i32 - 20;
                let s = if (i / 3) % 2 == 0 { 1.0 } else { -1.0 };
                s * 2f32.powi(e)
            })
            .collect(),
    );
    // Equal magnitudes of opposite signs: the first-wins scans decide the scale's sign.
    rows.push(
        (0..cols)
            .map(|i| match i % 16 {
                3 => -2.0,
                9 => 2.0,
                _ => 0.1 * normal(rng),
            })
            .collect(),
    );
    rows.push(
        (0..cols)
            .map(|i| match i % 32 {
                5 => 2.0,
                20 => -2.0,
                _ => 0.5,
            })
            .collect(),
    );
    // Values on the grid of quarter steps: many products land exactly on .5 ties.
    rows.push((0..cols).map(|i| ((i % 17) as f32 - 8.0) * 0.25).collect());
    rows.push(
        (0..cols)
            .map(|i| ((i * 7 % 33) as f32 - 16.0) * 0.5)
            .collect(),
    );
    rows.push((0..cols).map(|i| (i % 256) as f32 / 256.0 - 0.5).collect());
    // A group of 16 constants inside random ones; a group that is all one extreme.
    rows.push(
        (0..cols)
            .map(|i| if (i / 16) % 3 == 0 { 0.3 } else { normal(rng) })
            .collect(),
    );
    rows.push(
        (0..cols)
            .map(|i| if (i / 32) % 2 == 0 { 0.0 } else { normal(rng) })
            .collect(),
    );
    let n = rows.len();
    Case {
        name: format!("adversarial {n}x{cols}"),
        rows: n,
        cols,
        x: rows.concat(),
    }
}

pub fn to_input(x: &[f32], input: Input) -> Vec<u8> {
    match input {
        Input::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Input::F16 => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        Input::Bf16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// Quantizes `src` on the GPU into a poisoned buffer; returns the bytes and the flags.
fn run_gpu(
    gpu: &Gpu,
    f: &CudaFunction,
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<u32>)> {
    let p = quantize::plan(ty, rows, cols)?;
    let s = gpu.stream.clone_htod(src)?;
    let mut dst = gpu.stream.clone_htod(&vec![0xFFu8; p.out_bytes])?;
    let mut flags = gpu.stream.alloc_zeros::<u32>(rows)?;
    gpu.launch(f, ty, &s, &mut dst, &mut flags, rows, cols)?;
    Ok((gpu.stream.clone_dtoh(&dst)?, gpu.stream.clone_dtoh(&flags)?))
}

fn first_mismatch(ty: GgmlType, a: &[u8], b: &[u8], cols: usize) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} vs {}", a.len(), b.len()));
    }
    let bs = ty.type_size();
    let per_row = cols / ty.block_size();
    let i = a.iter().zip(b).position(|(x, y)| x != y)?;
    let block = i / bs;
    let n = a
        .chunks(bs)
        .zip(b.chunks(bs))
        .filter(|(x, y)| x != y)
        .count();
    let lo = block * bs;
    Some(format!(
        "{n} blocks differ; first: row {} block {} byte {} (gpu {:02x?} vs cpu {:02x?})",
        block / per_row,
        block % per_row,
        i - lo,
        &a[lo..lo + bs],
        &b[lo..lo + bs]
    ))
}

/// Every quantizer against `smelt_quant::quantize_row`, byte for byte: a case per type,
/// input and tensor.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let big = SHAPES
        .get()
        .is_some_and(|f| f.iter().any(|s| "normal 4096x14336".contains(s.as_str())));
    let cases = random_cases(rng, big);
    for ty in quantize::TYPES {
        for input in Input::ALL {
            let f = gpu.function(ty, input)?;
            let big = if input == Input::F16 { 3.0e4 } else { 1.0e30 };
            let adv = adversarial(rng, big);
            let op = format!("isq {ty} from {}", input.name());
            for case in cases.iter().chain(std::iter::once(&adv)) {
                if case.cols % ty.block_size() != 0 || !want(&case.name) {
                    continue;
                }
                let src = to_input(&case.x, input);
                let want = quantize::quantize_cpu(ty, input, &src, case.cols);
                let (got, flags) = run_gpu(gpu, &f, ty, &src, case.rows, case.cols)?;
                let widened = input.widen(&src);
                let gflags = quantize::check_flags(&flags, |r, c| widened[r * case.cols + c]);
                let note = match want {
                    Ok(want) => {
                        if let Err(e) = gflags {
                            Some(format!("GPU raised {e} on finite input"))
                        } else {
                            first_mismatch(ty, &got, &want, case.cols)
                        }
                    }
                    // Inputs that overflow the input type (f16) are errors on both sides.
                    Err(e) => (gflags.as_ref().err() != Some(&e))
                        .then(|| format!("CPU says {e}, GPU {gflags:?}")),
                };
                let ok = note.is_none();
                rep.verdict(&op, &case.name, ok, note.as_deref().unwrap_or("same bytes"));
            }
            if !want("non-finite 6x512") {
                continue;
            }
            // Non-finite rows: the first bad row and column are reported.
            let (rows, cols) = (6, 512);
            let mut x: Vec<f32> = (0..rows * cols).map(|_| normal(rng)).collect();
            x[2 * cols + 77] = f32::NAN;
            x[2 * cols + 300] = f32::INFINITY;
            x[4 * cols + 5] = f32::NEG_INFINITY;
            let src = to_input(&x, input);
            let want = quantize::quantize_cpu(ty, input, &src, cols);
            let (_, flags) = run_gpu(gpu, &f, ty, &src, rows, cols)?;
            let got = quantize::check_flags(&flags, |r, c| x[r * cols + c]);
            let same = match (&want, &got) {
                (
                    Err(smelt_quant::QuantError::NonFinite {
                        row: r1, col: c1, ..
                    }),
                    Err(smelt_quant::QuantError::NonFinite {
                        row: r2, col: c2, ..
                    }),
                ) => (r1, c1) == (r2, c2),
                _ => false,
            };
            let raised_rows = flags.iter().filter(|&&f| f != 0).count();
            let note = format!("CPU {want:?}, GPU {got:?}, {raised_rows} rows flagged");
            rep.verdict(&op, "non-finite 6x512", same && raised_rows == 2, &note);
        }
    }
    Ok(())
}

/// Milliseconds between two events recorded around `run`.
fn timed(gpu: &Gpu, run: impl FnOnce() -> Result<()>) -> Result<f64> {
    let s = &gpu.stream;
    let a = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    run()?;
    let b = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    Ok(f64::from(a.elapsed_ms(&b)?))
}

/// The matrices of Qwen3-32B (`crates/smelt/src/shapes.rs`, qwen3-32b: 64 layers, n_embd
/// 5120, n_ff 25600, 64 heads and 8 KV heads of 128, vocabulary 151936) as (rows, cols);
/// the vectors (norms) stay f32 and are not quantized.
fn qwen3_32b() -> Vec<(String, usize, usize)> {
    let (e, f, v, q, kv) = (5120, 25600, 151936, 64 * 128, 8 * 128);
    let mut t = vec![
        ("token_embd".to_string(), v, e),
        ("output".to_string(), v, e),
    ];
    for i in 0..64 {
        for (n, rows, cols) in [
            ("attn_q", q, e),
            ("attn_k", kv, e),
            ("attn_v", kv, e),
            ("attn_output", e, q),
            ("ffn_gate", f, e),
            ("ffn_up", f, e),
            ("ffn_down", e, f),
        ] {
            t.push((format!("blk.{i}.{n}"), rows, cols));
        }
    }
    t
}

/// The quantizers' speed (printed as it goes; the model total into the perf lines).
pub fn perf(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    println!("\n== speed: bf16 4096x14336 -> each type (median of 5 launches) ==");
    let (rows, cols) = (4096, 14336);
    let mut src = gpu.stream.alloc_zeros::<u8>(rows * cols * 2)?;
    gpu.fill_bf16(&mut src, 1)?;
    let mut flags = gpu.stream.alloc_zeros::<u32>(rows)?;
    println!("| type | ms | GB/s of bf16 input | Gweights/s |");
    println!("| --- | --- | --- | --- |");
    for ty in quantize::TYPES {
        let f = gpu.function(ty, Input::Bf16)?;
        let p = quantize::plan(ty, rows, cols)?;
        let mut dst = gpu.stream.alloc_zeros::<u8>(p.out_bytes)?;
        gpu.launch(&f, ty, &src, &mut dst, &mut flags, rows, cols)?;
        let mut t = Vec::new();
        for _ in 0..5 {
            t.push(timed(gpu, || {
                gpu.launch(&f, ty, &src, &mut dst, &mut flags, rows, cols)
            })?);
        }
        t.sort_by(f64::total_cmp);
        let ms = t[2];
        println!(
            "| {ty} | {ms:.3} | {:.1} | {:.2} |",
            (rows * cols * 2) as f64 / ms / 1e6,
            (rows * cols) as f64 / ms / 1e6
        );
    }
    let fl = gpu.stream.clone_dtoh(&flags)?;
    if fl.iter().any(|&v| v != 0) {
        bail!("the generated benchmark weights raised a non-finite flag");
    }

    println!("\n== speed: Qwen3-32B-shaped model, bf16 generated on the GPU -> Q6_K ==");
    let tensors = qwen3_32b();
    let largest = tensors.iter().map(|t| t.1 * t.2).max().unwrap_or(0);
    let mut src = gpu.stream.alloc_zeros::<u8>(largest * 2)?;
    let f = gpu.function(GgmlType::Q6_K, Input::Bf16)?;
    let p = quantize::plan(GgmlType::Q6_K, largest / 256, 256)?;
    let mut dst = gpu.stream.alloc_zeros::<u8>(p.out_bytes)?;
    let max_rows = tensors.iter().map(|t| t.1).max().unwrap_or(1);
    let mut flags = gpu.stream.alloc_zeros::<u32>(max_rows)?;
    let (mut ms, mut weights) = (0.0f64, 0usize);
    let wall = Instant::now();
    for (i, (_, rows, cols)) in tensors.iter().enumerate() {
        gpu.fill_bf16(&mut src, i as u32 + 7)?;
        ms += timed(gpu, || {
            gpu.launch(&f, GgmlType::Q6_K, &src, &mut dst, &mut flags, *rows, *cols)
        })?;
        weights += rows * cols;
    }
    gpu.stream.synchronize()?;
    let wall = wall.elapsed().as_secs_f64();
    if gpu.stream.clone_dtoh(&flags)?.iter().any(|&v| v != 0) {
        bail!("the generated model weights raised a non-finite flag");
    }
    println!(
        "{} matrices, {:.2} G weights ({:.1} GB of bf16): quantize {:.3} s (events), {:.1} GB/s; wall incl. data generation {wall:.2} s",
        tensors.len(),
        weights as f64 / 1e9,
        weights as f64 * 2.0 / 1e9,
        ms / 1e3,
        weights as f64 * 2.0 / ms / 1e6,
    );
    println!("MODEL_Q6K_SECONDS {:.4}", ms / 1e3);
    rep.perf.push(format!(
        "isq: Qwen3-32B-shaped model bf16 -> Q6_K on the GPU: {:.3} s ({:.1} GB/s of bf16)",
        ms / 1e3,
        weights as f64 * 2.0 / ms / 1e6
    ));
    println!("MODEL_WEIGHTS {weights}");
    Ok(())
}

/// Each repack kernel against `catalog::repack`: a case per format and shape.
pub fn check_repack(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    for ty in catalog::GEMV_TYPES {
        let f = gpu.module.load_function(&gpu_repack::kernel_name(ty)?)?;
        let padded = gpu_repack::layout(ty)?.tile_padded;
        let shapes: &[(usize, usize)] = if padded {
            &[
                (1, 32),
                (3, 96),
                (7, 288),
                (64, 4096),
                (33, 800),
                (1000, 2080),
            ]
        } else {
            &[(1, 256), (5, 512), (64, 4096), (129, 1280), (1000, 2304)]
        };
        for &(rows, cols) in shapes {
            if !want(&format!("{rows}x{cols}")) {
                continue;
            }
            let n = rows * cols / ty.block_size() * ty.type_size();
            let ggml: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let want = catalog::repack(ty, &ggml, rows, cols)?;
            let src = gpu.stream.clone_htod(&ggml)?;
            let mut dst = gpu.stream.clone_htod(&vec![0xABu8; want.len()])?;
            let (a, launch) = gpu_repack::args(ty, 0, 0, rows, cols)?;
            launch_repack(gpu, &f, &src, &mut dst, &a, launch)?;
            let got = gpu.stream.clone_dtoh(&dst)?;
            let note = match got.iter().zip(&want).position(|(g, w)| g != w) {
                Some(at) => format!("first difference at byte {at}"),
                None if got.len() != want.len() => "lengths differ".to_string(),
                None => "same bytes".to_string(),
            };
            rep.verdict(
                &format!("repack {ty}"),
                &format!("{rows}x{cols}"),
                got == want,
                &note,
            );
        }
    }
    Ok(())
}

/// The repack kernels' speed on a 14336x4096 matrix (an 8B model's FFN projection).
pub fn perf_repack(gpu: &Gpu, _rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    // Speed: a 14336x4096 matrix (an 8B model's FFN projection).
    let (rows, cols) = (14336, 4096);
    for ty in [GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0] {
        let f = gpu.module.load_function(&gpu_repack::kernel_name(ty)?)?;
        let n = rows * cols / ty.block_size() * ty.type_size();
        let src = gpu.stream.alloc_zeros::<u8>(n)?;
        let mut dst = gpu
            .stream
            .alloc_zeros::<u8>(rows * catalog::row_bytes(ty, cols)?)?;
        let (a, launch) = gpu_repack::args(ty, 0, 0, rows, cols)?;
        launch_repack(gpu, &f, &src, &mut dst, &a, launch)?;
        let ctx = gpu.stream.context();
        let (e0, e1) = (
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        );
        e0.record(&gpu.stream)?;
        let reps = 5;
        for _ in 0..reps {
            launch_repack(gpu, &f, &src, &mut dst, &a, launch)?;
        }
        e1.record(&gpu.stream)?;
        e1.synchronize()?;
        let ms = e0.elapsed_ms(&e1)? / reps as f32;
        rep.perf.push(format!(
            "repack {:<7} {rows}x{cols}: {:.3} ms ({:.0} GB/s of output)",
            ty.to_string(),
            ms,
            a.total as f64 / (ms as f64 * 1e-3) / 1e9
        ));
    }
    Ok(())
}

fn launch_repack(
    gpu: &Gpu,
    f: &CudaFunction,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    a: &smelt_kernels::formats::gpu_repack::RepackArgs,
    launch: smelt_kernels::ops::Launch,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: launch.grid,
        block_dim: launch.block,
        shared_mem_bytes: launch.shared_bytes,
    };
    let mut l = gpu.stream.launch_builder(f);
    l.arg(src)
        .arg(dst)
        .arg(&a.total)
        .arg(&a.row_bytes)
        .arg(&a.src_row)
        .arg(&a.blocks)
        .arg(&a.padded_blocks);
    unsafe { l.launch(cfg) }?;
    Ok(())
}
