//! The GPU check of the op kernels (`smelt_kernels::ops`), run on the GPU machine through
//! `bench/gpu/ops.sh`:
//!
//! 1. parity: every kernel against its CPU twin on fresh random inputs, outputs poisoned
//!    first (NaN / 0xFFFF), ragged shapes (rows and columns that are not multiples of the
//!    block sizes, sequences crossing KV block boundaries, several sequences at different
//!    positions, sliding windows, prefill chunks), printing the worst absolute and
//!    relative error per kernel against its tolerance, PASS or FAIL;
//! 2. speed: the attention kernel (+ reduce) at Llama-3-8B decode shape (32 heads, 8 KV
//!    heads, head_dim 128) at contexts 512 and 4096, in GB/s of KV bytes read, rotating
//!    over enough KV copies that L2 cannot serve them; and the other ops at 8B shapes.
//!
//! `--delta` runs only the hybrid models' kernels (`delta_net`: convolution, norms, the
//! delta-rule step, gather/split/sigmoid gate; `common/delta_check.rs`) and times the step
//! kernel at the Qwen3.6-27B shape.
//!
//! `--attention` runs only the attention checks (the split kernels for every head size, the
//! generic kernel, the tensor-core prompt attention) and times the prompt attention against
//! the split kernel at Llama-3-8B shape; `--parity-only` skips every timing.
//!
//! Exit status 1 when any parity check fails. No CUDA toolkit: PTX from `smelt-ptx`,
//! loaded by the driver through cudarc.

#[path = "common/delta_check.rs"]
mod delta_check;
#[path = "common/timing.rs"]
mod timing;

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::f16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use smelt_kernels::ops::{
    self, attention, elementwise, embed, flash, kv, norm, rope, sample, Launch,
};
use smelt_kernels::GgmlType;
use smelt_ptx::{Module, Target};
use timing::{time_graph, time_launches};

struct Gpu {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    sms: usize,
}

fn cfg(l: Launch) -> LaunchConfig {
    LaunchConfig {
        grid_dim: l.grid,
        block_dim: l.block,
        shared_mem_bytes: l.shared_bytes,
    }
}

impl Gpu {
    fn new() -> Result<Self> {
        let ctx = CudaContext::new(0).context("no CUDA device")?;
        unsafe { ctx.disable_event_tracking() };
        let (major, _) = ctx.compute_capability()?;
        let target = if major >= 9 {
            Target::Sm90
        } else {
            Target::Sm80
        };
        let mut m = Module::new(target);
        for (name, build) in ops::catalog()
            .into_iter()
            .chain(smelt_kernels::fused::catalog())
            .chain(smelt_kernels::delta_net::catalog())
        {
            m.kernel(&name, |k| build(k))?;
        }
        let t = std::time::Instant::now();
        let module = ctx.load_module(Ptx::from_src(m.to_ptx()))?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(132) as usize;
        println!(
            "{}: {} op kernels for {target}, {} KiB of PTX, loaded in {:.0} ms, {sms} SMs",
            ctx.name().unwrap_or_default(),
            ops::catalog().len(),
            m.to_ptx().len() / 1024,
            t.elapsed().as_secs_f64() * 1e3
        );
        Ok(Self {
            stream: ctx.new_stream()?,
            module,
            sms,
        })
    }

    fn f(&self, name: &str) -> Result<CudaFunction> {
        self.module
            .load_function(name)
            .with_context(|| format!("kernel {name}"))
    }
}

/// Launches `$name` with `$launch` dimensions and the given arguments, in order.
macro_rules! launch {
    ($gpu:expr, $name:expr, $launch:expr, [$($arg:expr),* $(,)?]) => {{
        let f = $gpu.f($name)?;
        let mut l = $gpu.stream.launch_builder(&f);
        $( l.arg($arg); )*
        unsafe { l.launch(cfg($launch)) }?;
    }};
}

/// The device address of a buffer, for kernels whose arguments are packed from their
/// declared parameters (`ops::kernel_params!`).
fn ptr<T>(gpu: &Gpu, s: &cudarc::driver::CudaSlice<T>) -> u64 {
    s.device_ptr(&gpu.stream).0
}

/// Launches `name` with argument values in the order its parameters are declared.
fn launch_values(gpu: &Gpu, name: &str, l: Launch, values: &[ops::ArgValue]) -> Result<()> {
    let f = gpu.f(name)?;
    let mut b = gpu.stream.launch_builder(&f);
    for v in values {
        match v {
            ops::ArgValue::Ptr(p) => b.arg(p),
            ops::ArgValue::U32(u) => b.arg(u),
            ops::ArgValue::F32(x) => b.arg(x),
        };
    }
    unsafe { b.launch(cfg(l)) }?;
    Ok(())
}

/// Worst errors of one kernel over its cases, against `|g - r| <= atol + rtol * |r|`;
/// NaN must match NaN, anything else not finite fails.
#[derive(Default)]
struct Check {
    cases: usize,
    max_abs: f64,
    max_rel: f64,
    fails: usize,
    first_bad: Option<String>,
}

impl Check {
    fn add(&mut self, case: &str, got: &[f32], want: &[f32], atol: f64, rtol: f64) {
        self.cases += 1;
        let mut bad = got.len() != want.len();
        for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
            let (g64, r64) = (f64::from(g), f64::from(r));
            let ok = if r.is_nan() {
                g.is_nan()
            } else if !g.is_finite() {
                false
            } else {
                let d = (g64 - r64).abs();
                self.max_abs = self.max_abs.max(d);
                self.max_rel = self.max_rel.max(d / r64.abs().max(1e-30));
                d <= atol + rtol * r64.abs()
            };
            if !ok && !bad {
                bad = true;
                self.first_bad
                    .get_or_insert(format!("{case}: [{i}] gpu {g} cpu {r}"));
            }
        }
        if bad {
            self.fails += 1;
        }
    }

    fn bits<T: Copy + PartialEq + Into<u64>>(&mut self, case: &str, got: &[T], want: &[T]) {
        self.cases += 1;
        if let Some(i) = (0..want.len()).find(|&i| got.get(i) != Some(&want[i])) {
            self.fails += 1;
            self.first_bad.get_or_insert(format!(
                "{case}: [{i}] gpu {:#06x} cpu {:#06x}",
                got.get(i).map_or(0, |&g| g.into()),
                want[i].into()
            ));
        }
    }
}

struct Report {
    rows: Vec<(String, Check, String)>,
}

impl Report {
    fn push(&mut self, name: &str, c: Check, tol: &str) {
        println!(
            "{:26} {:3} cases  max abs {:9.2e}  max rel {:9.2e}  tol {:22} {}",
            name,
            c.cases,
            c.max_abs,
            c.max_rel,
            tol,
            if c.fails == 0 { "PASS" } else { "FAIL" }
        );
        if let Some(b) = &c.first_bad {
            println!("    first failure: {b}");
        }
        self.rows.push((name.to_string(), c, tol.to_string()));
    }

    fn failures(&self) -> usize {
        self.rows.iter().filter(|r| r.1.fails > 0).count()
    }
}

fn floats(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

fn nan(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

fn check_norms(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut plain, mut fused, mut resid) = (Check::default(), Check::default(), Check::default());
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
    Ok(())
}

fn check_rope(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    for style in [rope::RopeStyle::Normal, rope::RopeStyle::Neox] {
        let mut c = Check::default();
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

/// The fused rope + KV append of one decode row (`rope_kv_*`): Q|K against the rope twin,
/// the V cache exactly against the twin, and both caches bit for bit against the unfused
/// GPU path (`rope_*` then `kv_append` on the same inputs), which the backend replaces.
fn check_rope_kv(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    for style in [rope::RopeStyle::Normal, rope::RopeStyle::Neox] {
        let (mut cx, mut cc) = (Check::default(), Check::default());
        // (n_head, n_head_kv, head_dim, position, block size, freq factors, base, scale)
        for (n_head, n_head_kv, hd, pos, bs, ff, base, fscale) in [
            (32, 8, 128, 4095, 16, false, 500000.0f32, 1.0f32),
            (9, 3, 64, 37, 16, false, 10000.0, 1.0),
            (8, 8, 128, 0, 32, true, 500000.0, 1.0),
            (4, 1, 256, 131_000, 8, false, 1000000.0, 0.125),
            (6, 2, 80, 700, 12, true, 10000.0, 0.5),
        ] {
            let kv_dim = n_head_kv * hd;
            let cols = (n_head + n_head_kv) * hd;
            let p = paged(rng, &[(pos, 1)], bs);
            let cache_len = p.n_blocks * bs * kv_dim;
            let (kc0, vc0) = (f16_bits(rng, cache_len), f16_bits(rng, cache_len));
            let x = floats(rng, cols, 2.0);
            let v = floats(rng, kv_dim, 1.0);
            let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + (i % 7) as f32).collect();
            let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
            let sd = gpu.stream.clone_htod(&words)?;
            let td = gpu.stream.clone_htod(&p.tables)?;
            let pd = gpu.stream.clone_htod(&[pos as u32])?;
            let fd = gpu.stream.clone_htod(&factors)?;
            let fptr: u64 = if ff {
                let (p, _g) = cudarc::driver::DevicePtr::device_ptr(&fd, &gpu.stream);
                p
            } else {
                0
            };
            let vd = gpu.stream.clone_htod(&v)?;
            let ts = rope::theta_scale(base, hd);
            // Fused.
            let mut xd = gpu.stream.clone_htod(&x)?;
            let mut kcd = gpu.stream.clone_htod(&kc0)?;
            let mut vcd = gpu.stream.clone_htod(&vc0)?;
            let (nh, nkv, hd32, bs32) = (n_head as u32, n_head_kv as u32, hd as u32, bs as u32);
            launch!(
                gpu,
                rope::kv_name(style),
                rope::kv_launch(n_head, n_head_kv, hd),
                [
                    &mut xd, &pd, &fptr, &vd, &mut kcd, &mut vcd, &sd, &td, &nh, &nkv, &hd32,
                    &bs32, &ts, &fscale
                ]
            );
            // Unfused, on the GPU: rope of the row, then kv_append of its K part.
            let mut xu = gpu.stream.clone_htod(&x)?;
            let mut kcu = gpu.stream.clone_htod(&kc0)?;
            let mut vcu = gpu.stream.clone_htod(&vc0)?;
            let (c32, kd32) = (cols as u32, kv_dim as u32);
            launch!(
                gpu,
                rope::name(style),
                rope::launch(1, cols, hd, hd),
                [&mut xu, &pd, &fptr, &c32, &hd32, &hd32, &ts, &fscale]
            );
            let xu_host = gpu.stream.clone_dtoh(&xu)?;
            let ku = gpu.stream.clone_htod(&xu_host[n_head * hd..])?;
            launch!(
                gpu,
                kv::KV_APPEND,
                kv::launch(1, 1, kv_dim),
                [&ku, &vd, &mut kcu, &mut vcu, &sd, &td, &kd32, &bs32]
            );
            // The twin.
            let (mut xw, mut kcw, mut vcw) = (x.clone(), kc0.clone(), vc0.clone());
            rope::rope_kv_cpu(
                &mut xw,
                &v,
                &mut kcw,
                &mut vcw,
                p.seqs[0],
                &p.tables,
                n_head,
                n_head_kv,
                hd,
                bs,
                style,
                base,
                fscale,
                ff.then_some(&factors[..]),
            );
            let case = format!("{n_head}/{n_head_kv}x{hd} pos {pos} bs {bs} ff {ff}");
            let xg = gpu.stream.clone_dtoh(&xd)?;
            cx.add(&case, &xg, &xw, 1e-5, 1e-5);
            cx.add(&format!("{case} vs rope_*"), &xg, &xu_host, 0.0, 0.0);
            let (kg, vg) = (gpu.stream.clone_dtoh(&kcd)?, gpu.stream.clone_dtoh(&vcd)?);
            cc.bits(
                &format!("K {case} vs unfused"),
                &kg,
                &gpu.stream.clone_dtoh(&kcu)?,
            );
            cc.bits(
                &format!("V {case} vs unfused"),
                &vg,
                &gpu.stream.clone_dtoh(&vcu)?,
            );
            cc.bits(&format!("V {case} vs twin"), &vg, &vcw);
            // K against the twin: the roped values may differ in the last f32 bits
            // (hardware sin/cos), so compare as floats.
            let widen =
                |b: &[u16]| -> Vec<f32> { b.iter().map(|&h| f16::from_bits(h).to_f32()).collect() };
            cx.add(
                &format!("K {case} vs twin"),
                &widen(&kg),
                &widen(&kcw),
                2e-3,
                2e-3,
            );
        }
        rep.push(
            &format!("{} (Q|K)", rope::kv_name(style)),
            cx,
            "1e-5 + 1e-5|r|, = rope_*",
        );
        rep.push(
            &format!("{} (caches)", rope::kv_name(style)),
            cc,
            "exact (bits) vs unfused",
        );
    }
    Ok(())
}

/// The fused GLU + q8_1 kernels: the f32 output against the GLU twin (as `glu_*`), the
/// tiles byte for byte against the q8_1 twin of the GPU's own f32 output.
fn check_glu_q8(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::{act, fused};
    for a in [elementwise::Glu::Silu, elementwise::Glu::Gelu] {
        let (mut cf, mut cq) = (Check::default(), Check::default());
        for (rows, k) in [(1usize, 14336usize), (3, 2048), (2, 288), (5, 32)] {
            let mut g = floats(rng, rows * k, 12.0);
            let u = floats(rng, rows * k, 2.0);
            let (mut gd, ud) = (gpu.stream.clone_htod(&g)?, gpu.stream.clone_htod(&u)?);
            let ntiles = k.div_ceil(smelt_kernels::TILE) as u32;
            let mut qd = gpu
                .stream
                .clone_htod(&vec![0xA5u8; rows * act::row_bytes(k)?])?;
            let k32 = k as u32;
            launch!(
                gpu,
                fused::glu_q8_name(a),
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
            let want_q: Vec<f32> = act::quantize_cpu(&got, k)?
                .iter()
                .map(|&b| f32::from(b))
                .collect();
            let got_q: Vec<f32> = gpu
                .stream
                .clone_dtoh(&qd)?
                .iter()
                .map(|&b| f32::from(b))
                .collect();
            cq.add(&case, &got_q, &want_q, 0.0, 0.0);
        }
        let name = fused::glu_q8_name(a);
        rep.push(&format!("{name} (f32)"), cf, "as glu");
        rep.push(&format!("{name} (q8_1 tiles)"), cq, "exact bytes");
    }
    Ok(())
}

/// The attention combine with the q8_1 tiles of its output: on the same random partials,
/// the f32 output equal to `attention_reduce`'s, the tiles byte for byte the q8_1 twin's.
fn check_reduce_q8(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    use smelt_kernels::act;
    let (mut cf, mut cq) = (Check::default(), Check::default());
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
        let mut plain = gpu.stream.clone_htod(&vec![f32::NAN; rows * cols])?;
        let mut fused = gpu.stream.clone_htod(&vec![f32::NAN; rows * cols])?;
        let mut qd = gpu
            .stream
            .clone_htod(&vec![0xA5u8; rows * act::row_bytes(cols)?])?;
        let (ns, hd) = (splits as u32, head_dim as u32);
        let l = attention::reduce_launch(rows, n_head, head_dim);
        launch!(
            gpu,
            attention::REDUCE,
            l,
            [&accd, &mld, &mut plain, &ns, &hd]
        );
        launch!(
            gpu,
            attention::REDUCE_Q8,
            l,
            [&accd, &mld, &mut fused, &mut qd, &ns, &hd]
        );
        let want = gpu.stream.clone_dtoh(&plain)?;
        let got = gpu.stream.clone_dtoh(&fused)?;
        let case = format!("{rows}x{n_head}x{head_dim}, {splits} splits");
        cf.add(&case, &got, &want, 0.0, 0.0);
        let want_q: Vec<f32> = act::quantize_cpu(&want, cols)?
            .iter()
            .map(|&b| f32::from(b))
            .collect();
        let got_q: Vec<f32> = gpu
            .stream
            .clone_dtoh(&qd)?
            .iter()
            .map(|&b| f32::from(b))
            .collect();
        cq.add(&case, &got_q, &want_q, 0.0, 0.0);
    }
    rep.push(
        &format!("{} (f32)", attention::REDUCE_Q8),
        cf,
        "= attention_reduce",
    );
    rep.push(
        &format!("{} (q8_1 tiles)", attention::REDUCE_Q8),
        cq,
        "exact bytes",
    );
    Ok(())
}

fn check_elementwise(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    for act in [elementwise::Glu::Silu, elementwise::Glu::Gelu] {
        let mut c = Check::default();
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
    let (mut ca, mut cs, mut cb) = (Check::default(), Check::default(), Check::default());
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

fn check_embed(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    for ty in embed::TYPES {
        let mut c = Check::default();
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

/// A paged KV layout for a batch: descriptors, block tables (shuffled block ids), and
/// the number of blocks.
struct Paged {
    seqs: Vec<kv::SeqDesc>,
    tables: Vec<u32>,
    n_blocks: usize,
    rows: usize,
    max_tokens: usize,
}

fn paged(rng: &mut impl Rng, shape: &[(usize, usize)], bs: usize) -> Paged {
    let mut seqs = Vec::new();
    let mut need = Vec::new();
    let mut row = 0;
    for &(start, n) in shape {
        need.push((start + n).div_ceil(bs));
        seqs.push(kv::SeqDesc {
            row: row as u32,
            n_tokens: n as u32,
            start_pos: start as u32,
            block_table_offset: 0,
        });
        row += n;
    }
    let n_blocks: usize = need.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = vec![0u32; 2]; // some padding before the first table
    let mut next = 0;
    for (s, &nb) in seqs.iter_mut().zip(&need) {
        s.block_table_offset = tables.len() as u32;
        tables.extend_from_slice(&ids[next..next + nb]);
        next += nb;
    }
    let max_tokens = shape.iter().map(|s| s.1).max().unwrap_or(1);
    Paged {
        seqs,
        tables,
        n_blocks,
        rows: row,
        max_tokens,
    }
}

fn f16_bits(rng: &mut impl Rng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn run_attention(
    gpu: &Gpu,
    p: &Paged,
    shape: &attention::AttnShape,
    n_splits: usize,
    qd: &cudarc::driver::CudaSlice<f32>,
    kcd: &cudarc::driver::CudaSlice<u16>,
    vcd: &cudarc::driver::CudaSlice<u16>,
    sd: &cudarc::driver::CudaSlice<u32>,
    td: &cudarc::driver::CudaSlice<u32>,
    acc: &mut cudarc::driver::CudaSlice<f32>,
    ml: &mut cudarc::driver::CudaSlice<f32>,
    out: &mut cudarc::driver::CudaSlice<f32>,
    what: Which,
    combine: Option<Combine<'_>>,
    stage: u32,
    skip_tokens: u32,
) -> Result<()> {
    let name = match combine {
        Some(_) => attention::combine_name(shape.head_dim),
        None => attention::name(shape.head_dim),
    }
    .context("head_dim")?;
    let qt = attention::q_tiles(p.max_tokens, shape.n_head, shape.n_head_kv) as u32;
    let (ns, hd) = (n_splits as u32, shape.head_dim as u32);
    if what != Which::Reduce {
        let a = attention::Args {
            q: ptr(gpu, qd),
            k_cache: ptr(gpu, kcd),
            v_cache: ptr(gpu, vcd),
            seqs: ptr(gpu, sd),
            block_tables: ptr(gpu, td),
            part_acc: ptr(gpu, acc),
            part_ml: ptr(gpu, ml),
            n_head: shape.n_head as u32,
            n_head_kv: shape.n_head_kv as u32,
            block_size: shape.block_size as u32,
            n_splits: ns,
            q_tiles: qt,
            window: shape.window as u32,
            scale: shape.scale,
            stage_blocks: stage,
            skip_tokens,
        };
        let mut values = a.values();
        // The combining kernel also writes the output, its tiles and its counters.
        if let Some((tiles, counters)) = &combine {
            let c = attention::CombineArgs {
                out: ptr(gpu, out),
                q8: ptr(gpu, &**tiles),
                counters: ptr(gpu, &**counters),
            };
            values.extend(c.values());
        }
        let l = attention::launch(
            p.seqs.len(),
            p.max_tokens,
            shape.n_head,
            shape.n_head_kv,
            n_splits,
        );
        launch_values(gpu, name, l, &values)?;
    }
    if what != Which::Main && combine.is_none() {
        launch!(
            gpu,
            attention::REDUCE,
            attention::reduce_launch(p.rows, shape.n_head, shape.head_dim),
            [&*acc, &*ml, &mut *out, &ns, &hd]
        );
    }
    Ok(())
}

/// The combining attention's q8_1 tiles and counters (`attention::combine_kernel`).
type Combine<'a> = (
    &'a mut cudarc::driver::CudaSlice<u8>,
    &'a mut cudarc::driver::CudaSlice<u32>,
);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Both,
    Main,
    Reduce,
}

/// (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window, splits)
type AttnCase = (
    Vec<(usize, usize)>,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
);

fn check_kv_attention(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut ckv, mut catt) = (Check::default(), Check::default());
    let (mut ccomb, mut ctiles) = (Check::default(), Check::default());
    let (mut ccount, mut crun) = (Check::default(), Check::default());
    let mut cany = Check::default();
    // (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window, splits)
    let cases: Vec<AttnCase> = vec![
        (vec![(0, 1), (37, 1), (300, 1)], 8, 2, 128, 16, 0, 4),
        (vec![(0, 20), (45, 7)], 9, 3, 64, 16, 0, 3),
        (vec![(100, 5), (10, 3)], 4, 1, 256, 32, 50, 8),
        (vec![(5, 1), (61, 9), (0, 13)], 6, 6, 128, 12, 0, 5),
        (vec![(700, 1)], 8, 4, 64, 16, 129, 7),
        (vec![(4095, 1)], 32, 8, 128, 16, 0, 32),
        (vec![(0, 64)], 4, 2, 128, 16, 0, 1),
        // More new tokens than kv_append's grid has z blocks (it strides over them).
        (vec![(3, 1100)], 4, 2, 64, 16, 0, 4),
        (
            vec![(33, 4), (2, 2), (17, 1), (250, 3)],
            16,
            4,
            256,
            8,
            20,
            64,
        ),
        // The other multiples of 16 (lanes that hold no chunk, partial slots, staged rows
        // that are not a power of two of 16-byte pieces); 96, 160, 192 and 224 with whole
        // tiles per row also run the combining kernel.
        (vec![(0, 1), (37, 1), (300, 1)], 8, 2, 80, 16, 0, 4),
        (vec![(0, 20), (45, 7)], 8, 4, 96, 16, 0, 3),
        (vec![(100, 5), (10, 3)], 4, 1, 112, 32, 50, 8),
        (vec![(5, 1), (61, 9), (0, 13)], 6, 2, 144, 12, 0, 5),
        (vec![(700, 1)], 8, 4, 160, 16, 129, 7),
        (vec![(33, 4), (250, 3)], 6, 2, 176, 8, 20, 16),
        (vec![(1000, 1), (3, 1)], 4, 4, 192, 16, 0, 12),
        (vec![(17, 6)], 5, 1, 208, 16, 0, 2),
        (vec![(90, 2)], 8, 8, 224, 16, 33, 6),
        (vec![(0, 40)], 2, 1, 240, 16, 0, 3),
        // No kernel of their own: the generic one only (`attention::any_kernel`).
        (vec![(0, 9), (40, 1)], 4, 2, 72, 16, 0, 1),
        (vec![(3, 5)], 8, 2, 32, 16, 6, 1),
        (vec![(20, 3), (0, 1)], 3, 1, 264, 16, 0, 1),
    ];
    for (shape, n_head, n_head_kv, hd, bs, window, n_splits) in cases {
        let p = paged(rng, &shape, bs);
        let kv_dim = n_head_kv * hd;
        let cache_len = p.n_blocks * bs * kv_dim;
        let mut kc = f16_bits(rng, cache_len);
        let mut vc = f16_bits(rng, cache_len);
        let knew = floats(rng, p.rows * kv_dim, 1.0);
        let vnew = floats(rng, p.rows * kv_dim, 1.0);
        let mut kcd = gpu.stream.clone_htod(&kc)?;
        let mut vcd = gpu.stream.clone_htod(&vc)?;
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let sd = gpu.stream.clone_htod(&words)?;
        let td = gpu.stream.clone_htod(&p.tables)?;
        let (knd, vnd) = (gpu.stream.clone_htod(&knew)?, gpu.stream.clone_htod(&vnew)?);
        let (kd32, bs32) = (kv_dim as u32, bs as u32);
        launch!(
            gpu,
            kv::KV_APPEND,
            kv::launch(p.seqs.len(), p.max_tokens, kv_dim),
            [&knd, &vnd, &mut kcd, &mut vcd, &sd, &td, &kd32, &bs32]
        );
        kv::kv_append_cpu(
            &knew, &vnew, &mut kc, &mut vc, &p.seqs, &p.tables, kv_dim, bs,
        );
        let case = format!("seqs {shape:?} heads {n_head}/{n_head_kv} hd {hd} bs {bs} window {window} splits {n_splits}");
        ckv.bits(&format!("K {case}"), &gpu.stream.clone_dtoh(&kcd)?, &kc);
        ckv.bits(&format!("V {case}"), &gpu.stream.clone_dtoh(&vcd)?, &vc);

        let q = floats(rng, p.rows * n_head * hd, 1.0);
        let qd = gpu.stream.clone_htod(&q)?;
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window,
            scale: 1.0 / (hd as f32).sqrt() * 2.0,
        };
        let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
        // Both kernels (or the combining one) on fresh poisoned partials and output.
        let launch = |combine: Option<Combine<'_>>, stage: u32| -> Result<Vec<f32>> {
            let mut acc = gpu.stream.clone_htod(&nan(al))?;
            let mut ml = gpu.stream.clone_htod(&nan(mll))?;
            let mut out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
                &sd,
                &td,
                &mut acc,
                &mut ml,
                &mut out,
                Which::Both,
                combine,
                stage,
                0,
            )?;
            Ok(gpu.stream.clone_dtoh(&out)?)
        };
        let mut want = vec![0f32; p.rows * n_head * hd];
        attention::attention_cpu(&q, &kc, &vc, &p.seqs, &p.tables, &s, &mut want);
        // The generic kernel takes every head size.
        let out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a = attention::AnyArgs {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            head_dim: hd as u32,
            block_size: bs as u32,
            window: window as u32,
            scale: s.scale,
        };
        let l = attention::any_launch(p.seqs.len(), p.max_tokens, n_head);
        launch_values(gpu, attention::ANY, l, &a.values())?;
        cany.add(&case, &gpu.stream.clone_dtoh(&out)?, &want, 2e-5, 1e-4);
        if attention::name(hd).is_none() {
            continue;
        }
        // Unstaged (every key read from the cache in the loop) and staged.
        catt.add(&case, &launch(None, 0)?, &want, 2e-5, 1e-4);
        catt.add(
            &format!("{case} staged"),
            &launch(None, 32)?,
            &want,
            2e-5,
            1e-4,
        );
        if attention::combine_fits(n_head, hd, n_splits) {
            // Twice on the same inputs: the counters must come back to zero, so the
            // second launch combines as the first did.
            let groups = attention::combine_counters(p.seqs.len(), p.max_tokens, n_head, n_head_kv);
            let mut counters = gpu.stream.alloc_zeros::<u32>(groups)?;
            let mut first: Option<Vec<f32>> = None;
            for round in 0..2 {
                let row_q = smelt_kernels::act::row_bytes(n_head * hd)?;
                let mut qt = gpu.stream.clone_htod(&vec![0xFFu8; p.rows * row_q])?;
                // Round 0 stages as much as fits, round 1 one block per split (the loop
                // then reads shared memory and the cache): the same bits.
                let got = launch(Some((&mut qt, &mut counters)), [32, 1][round])?;
                let c = format!("{case} round {round}");
                ccomb.add(&c, &got, &want, 2e-5, 1e-4);
                let tiles = smelt_kernels::act::quantize_cpu(&got, n_head * hd)?;
                ctiles.bits(&c, &gpu.stream.clone_dtoh(&qt)?, &tiles);
                let left = gpu.stream.clone_dtoh(&counters)?;
                ccount.bits(&c, &left, &vec![0u32; groups]);
                match &first {
                    None => first = Some(got),
                    Some(f) => {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        crun.bits(&c, &bits(&got), &bits(f))
                    }
                }
            }
        }
    }
    rep.push(kv::KV_APPEND, ckv, "exact (bits)");
    rep.push("attention + reduce", catt, "2e-5 + 1e-4|r|");
    rep.push(attention::ANY, cany, "2e-5 + 1e-4|r|");
    rep.push("attention_hd*_combine_q8_1 (f32)", ccomb, "2e-5 + 1e-4|r|");
    rep.push(
        "attention_hd*_combine_q8_1 (tiles)",
        ctiles,
        "exact (q8_1 of its f32)",
    );
    rep.push(
        "attention_hd*_combine_q8_1 (counters)",
        ccount,
        "all zero after",
    );
    rep.push("attention_hd*_combine_q8_1 (rerun)", crun, "same bits");
    Ok(())
}

/// The tensor-core prompt attention (`ops::flash`) for every head size against the
/// attention twin: prompt chunks after cached blocks, several sequences of different
/// lengths in one launch (rows a block leaves empty), grouped-query heads packed into a
/// block's rows, sliding windows, block sizes that are not powers of two.
fn check_prefill(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut c, mut cmix) = (Check::default(), Check::default());
    let mut cserial = Check::default();
    // (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window)
    type Case = (Vec<(usize, usize)>, usize, usize, usize, usize, usize);
    let mut cases: Vec<Case> = vec![
        (vec![(0, 100)], 8, 2, 128, 16, 0),
        (vec![(37, 64), (0, 5), (300, 33)], 8, 2, 64, 16, 0),
        (vec![(200, 70)], 4, 4, 80, 16, 50),
        (vec![(5, 40)], 16, 2, 96, 12, 0),
        (vec![(1000, 48), (7, 1)], 4, 1, 112, 32, 0),
        (vec![(0, 1)], 2, 1, 128, 16, 0),
        // A prompt chunk beside decode rows of a long context (a mixed step).
        (vec![(0, 64), (2000, 1), (90, 1)], 8, 2, 128, 16, 0),
    ];
    for (i, hd) in (144..=256).step_by(16).enumerate() {
        let window = [0, 20, 0, 45][i % 4];
        cases.push((vec![(10 + 17 * i, 37), (0, 20)], 4, 2, hd, 16, window));
    }
    for (shape, n_head, n_head_kv, hd, bs, window) in cases {
        let p = paged(rng, &shape, bs);
        let kv_dim = n_head_kv * hd;
        let cache_len = p.n_blocks * bs * kv_dim;
        let (kc, vc) = (f16_bits(rng, cache_len), f16_bits(rng, cache_len));
        let q = floats(rng, p.rows * n_head * hd, 1.0);
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window,
            scale: 1.0 / (hd as f32).sqrt() * 2.0,
        };
        let mut want = vec![0f32; p.rows * n_head * hd];
        attention::attention_cpu(&q, &kc, &vc, &p.seqs, &p.tables, &s, &mut want);
        let (kcd, vcd) = (gpu.stream.clone_htod(&kc)?, gpu.stream.clone_htod(&vc)?);
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let (sd, td) = (
            gpu.stream.clone_htod(&words)?,
            gpu.stream.clone_htod(&p.tables)?,
        );
        let qd = gpu.stream.clone_htod(&q)?;
        let out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a = flash::Args {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            block_size: bs as u32,
            window: window as u32,
            scale: s.scale,
            min_tokens: 0,
        };
        let name = flash::name(hd).context("prefill head_dim")?;
        let serial = flash::serial_name(hd).context("prefill head_dim")?;
        let l = flash::launch(p.seqs.len(), p.max_tokens, n_head, n_head_kv);
        let case =
            format!("seqs {shape:?} heads {n_head}/{n_head_kv} hd {hd} bs {bs} window {window}");
        launch_values(gpu, name, l, &a.values())?;
        c.add(&case, &gpu.stream.clone_dtoh(&out)?, &want, 6e-4, 1e-3);
        let out2 = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a2 = flash::Args {
            out: ptr(gpu, &out2),
            ..a
        };
        launch_values(gpu, serial, l, &a2.values())?;
        cserial.add(&case, &gpu.stream.clone_dtoh(&out2)?, &want, 6e-4, 1e-3);
        // A mixed step as the CUDA backend runs it: the split kernel and its reduce for
        // the short sequences (all rows), then the prompt kernel over the long ones' rows.
        let min = flash::MIN_TOKENS;
        if shape.iter().any(|x| x.1 < min) && shape.iter().any(|x| x.1 >= min) {
            let n_splits = 4;
            let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
            let mut acc = gpu.stream.clone_htod(&nan(al))?;
            let mut ml = gpu.stream.clone_htod(&nan(mll))?;
            let mut out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
                &sd,
                &td,
                &mut acc,
                &mut ml,
                &mut out,
                Which::Both,
                None,
                32,
                min as u32,
            )?;
            let a = flash::Args {
                out: ptr(gpu, &out),
                min_tokens: min as u32,
                ..a
            };
            launch_values(gpu, name, l, &a.values())?;
            cmix.add(&case, &gpu.stream.clone_dtoh(&out)?, &want, 6e-4, 1e-3);
        }
    }
    rep.push("attention_prefill_hd*", c, "6e-4 + 1e-3|r| (f16 P)");
    rep.push(
        "attention_prefill_serial_hd*",
        cserial,
        "6e-4 + 1e-3|r| (f16 P)",
    );
    rep.push("split (short) + prefill (long)", cmix, "6e-4 + 1e-3|r|");
    Ok(())
}

/// Prompt attention at Llama-3-8B shape: the tensor-core kernel against the split kernel +
/// reduce the engine runs below `flash::MIN_TOKENS`, for a whole prompt and for a chunk
/// after a cached prefix: what the threshold is to be chosen from.
fn prefill_speed(gpu: &Gpu, rng: &mut impl Rng) -> Result<Vec<String>> {
    println!("\n== speed: prompt attention at Llama-3-8B shape (32 heads, 8 KV heads, head_dim 128, block 16) ==");
    let mut table = vec![
        "| prompt attention | tokens | cached | tensor cores us | tensor cores, serial us | split + reduce us | split/tensor |"
            .to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let (n_head, n_head_kv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    for (start, n) in [
        (0usize, 32usize),
        (0, 128),
        (0, 512),
        (3584, 512),
        (0, 2048),
    ] {
        let p = paged(rng, &[(start, n)], bs);
        let cache_len = p.n_blocks * bs * n_head_kv * hd;
        let kcd = gpu.stream.clone_htod(&f16_bits(rng, cache_len))?;
        let vcd = gpu.stream.clone_htod(&f16_bits(rng, cache_len))?;
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let (sd, td) = (
            gpu.stream.clone_htod(&words)?,
            gpu.stream.clone_htod(&p.tables)?,
        );
        let qd = gpu
            .stream
            .clone_htod(&floats(rng, p.rows * n_head * hd, 1.0))?;
        let mut out = gpu.stream.alloc_zeros::<f32>(p.rows * n_head * hd)?;
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window: 0,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let a = flash::Args {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            block_size: bs as u32,
            window: 0,
            scale: s.scale,
            min_tokens: 0,
        };
        let name = flash::name(hd).context("head_dim")?;
        let l = flash::launch(1, n, n_head, n_head_kv);
        let values = a.values();
        let reps = if n >= 2048 { 5 } else { 20 };
        let tc = time_launches(&gpu.stream, 5, 2, reps, |_| {
            launch_values(gpu, name, l, &values)
        })? * 1e3;
        let serial = flash::serial_name(hd).context("head_dim")?;
        let ts = time_launches(&gpu.stream, 5, 2, reps, |_| {
            launch_values(gpu, serial, l, &values)
        })? * 1e3;
        // The split kernel as the engine launches it for one sequence: 16 splits on 132 SMs.
        let n_splits = (gpu.sms / n_head_kv).clamp(4, 64);
        let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
        let mut acc = gpu.stream.alloc_zeros::<f32>(al)?;
        let mut ml = gpu.stream.alloc_zeros::<f32>(mll)?;
        let split = time_launches(&gpu.stream, 5, 2, reps, |_| {
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
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
        let line = format!(
            "| attention_prefill_hd128 | {n} | {start} | {tc:.1} | {ts:.1} | {split:.1} | {:.2} |",
            split / tc
        );
        println!("{line}");
        table.push(line);
    }
    Ok(table)
}

fn check_rows(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut cs, mut ca, mut csplit) = (Check::default(), Check::default(), Check::default());
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

fn check_sample(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let mut c = Check::default();
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

fn speed(gpu: &Gpu, rng: &mut impl Rng) -> Result<Vec<String>> {
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

fn main() -> Result<()> {
    let gpu = Gpu::new()?;
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rep = Report { rows: Vec::new() };
    println!("\n== parity (fresh random inputs, poisoned outputs) ==");
    // A check that errors (a launch refused, say) is a failure of its own; the others
    // still run, so one bad kernel does not hide the rest of the report.
    type CheckFn = fn(&Gpu, &mut StdRng, &mut Report) -> Result<()>;
    let checks: [(&str, CheckFn); 10] = [
        ("norms", check_norms),
        ("rope", check_rope),
        ("rope + kv append", check_rope_kv),
        ("elementwise", check_elementwise),
        ("embed", check_embed),
        ("kv + attention", check_kv_attention),
        ("prompt attention", check_prefill),
        ("argmax + softmax", check_rows),
        ("sample", check_sample),
        ("delta-net", |g, r, rep| delta_check::check(g, r, rep)),
    ];
    // `--attention`: the attention checks and the prompt attention's timings only (about
    // a minute with the build's PTX load).
    let only_attention = std::env::args().any(|a| a == "--attention");
    let attention_checks = ["kv + attention", "prompt attention"];
    let only_delta = std::env::args().any(|a| a == "--delta");
    for (name, check) in checks {
        if only_attention && !attention_checks.contains(&name) {
            continue;
        }
        if only_delta && name != "delta-net" {
            continue;
        }
        if let Err(e) = check(&gpu, &mut rng, &mut rep) {
            println!("{name}: ERROR {e:#}");
            let c = Check {
                fails: 1,
                first_bad: Some(format!("{e:#}")),
                ..Check::default()
            };
            rep.push(&format!("{name} (error)"), c, "-");
        }
    }
    let table = if std::env::args().any(|a| a == "--parity-only") {
        Vec::new()
    } else if only_delta {
        delta_check::speed(&gpu, &mut rng).unwrap_or_else(|e| {
            println!("delta speed: ERROR {e:#}");
            vec![format!("delta speed measurement failed: {e:#}")]
        })
    } else if only_attention {
        prefill_speed(&gpu, &mut rng).unwrap_or_else(|e| {
            println!("prefill speed: ERROR {e:#}");
            vec![format!("prefill speed measurement failed: {e:#}")]
        })
    } else {
        speed(&gpu, &mut rng).unwrap_or_else(|e| {
            println!("speed: ERROR {e:#}");
            vec![format!("speed measurement failed: {e:#}")]
        })
    };
    println!("\n== summary ==");
    println!("| kernel | cases | max abs err | max rel err | tolerance | result |");
    println!("|---|---|---|---|---|---|");
    for (name, c, tol) in &rep.rows {
        println!(
            "| {name} | {} | {:.2e} | {:.2e} | {tol} | {} |",
            c.cases,
            c.max_abs,
            c.max_rel,
            if c.fails == 0 { "PASS" } else { "FAIL" }
        );
    }
    println!();
    for l in &table {
        println!("{l}");
    }
    let failures = rep.failures();
    println!("\nparity failures: {failures}");
    if failures > 0 {
        bail!("{failures} kernels failed parity");
    }
    Ok(())
}
