//! The harness's shared parts: one CUDA context and stream with a module of just the kernels
//! the selected cases launch (`catalog::module_selected`), the report every case writes its
//! per-shape lines into (one line a case, a summary row per op), the shape filter, the
//! poisoned-buffer and random-input helpers, and the launch helpers the op families share.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::{Context, Result};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use rand::Rng;
use smelt_kernels::ops::{self, Launch};
use smelt_kernels::{catalog, GgmlType};
use smelt_ptx::Target;

pub struct Gpu {
    pub stream: Arc<CudaStream>,
    /// The catalog's kernels (all, or those of the selected ops).
    pub module: Arc<CudaModule>,
    /// The harness's own fill kernels.
    extra: Arc<CudaModule>,
    pub sms: usize,
    pub name: String,
}

pub fn cfg(l: Launch) -> LaunchConfig {
    LaunchConfig {
        grid_dim: l.grid,
        block_dim: l.block,
        shared_mem_bytes: l.shared_bytes,
    }
}

impl Gpu {
    /// Opens device 0 and loads the catalog's kernels whose names pass `keep`, plus the
    /// harness's own fill kernels. With `all`, the whole catalog as the engine builds it,
    /// through the engine's kernel cache (`smelt_cuda::cache`): the engine's backend, which
    /// the MoE cases open, then finds the same PTX compiled in the driver's JIT cache.
    pub fn new(keep: &dyn Fn(&str) -> bool, all: bool) -> Result<Self> {
        let ctx = CudaContext::new(0).context("no CUDA device")?;
        // One stream, so cudarc's per-slice event tracking only costs launch time.
        unsafe { ctx.disable_event_tracking() };
        let (major, _) = ctx.compute_capability()?;
        let target = if major >= 9 {
            Target::Sm90
        } else {
            Target::Sm80
        };
        let mut fills = smelt_ptx::Module::new(target);
        fills.kernel("fill", smelt_cuda::fill_kernel)?;
        fills.kernel("fill_bf16", super::isq::fill_bf16_kernel)?;
        let extra = ctx.load_module(Ptx::from_src(fills.to_ptx()))?;
        let t = Instant::now();
        let name = ctx.name().unwrap_or_default();
        let (module, n, how) = if all {
            let cc = ctx.compute_capability()?;
            let settings = format!("gpu_ops|{target:?}");
            let (m, how) = smelt_cuda::cache::load(&ctx, &name, cc, &settings, || {
                let m = catalog::module(target)
                    .map_err(|e| smelt_cuda::CudaError::Init(e.to_string()))?;
                Ok(m.to_ptx())
            })?;
            (m, catalog::all().len(), format!("{how:?}"))
        } else {
            let m = catalog::module_selected(target, keep)?;
            let n = catalog::all().iter().filter(|(n, _)| keep(n)).count();
            let m = ctx.load_module(Ptx::from_src(m.to_ptx()))?;
            (m, n, "JIT".to_string())
        };
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(132) as usize;
        println!(
            "{name}: {n} kernels for {target}, loaded in {:.1} s ({how}), {sms} SMs",
            t.elapsed().as_secs_f64()
        );
        Ok(Self {
            // A stream of its own: the legacy default stream cannot be captured into a graph.
            stream: ctx.new_stream()?,
            module,
            extra,
            sms,
            name,
        })
    }

    pub fn f(&self, name: &str) -> Result<CudaFunction> {
        if name.starts_with("fill") {
            return Ok(self.extra.load_function(name)?);
        }
        let f = self.module.load_function(name).with_context(|| {
            format!("kernel {name} (not in the module: a case's `covers`/`needs` misses it?)")
        })?;
        smelt_cuda::gpu::allow_dynamic_shared(&f, name)?;
        Ok(f)
    }

    /// `n` bytes of hashed words made on the device (timing inputs: never zeros, and
    /// nothing large crosses PCIe).
    pub fn random_bytes(&self, n: usize, seed: u32) -> Result<CudaSlice<u8>> {
        let words = n.div_ceil(4);
        let mut buf = self.stream.alloc_zeros::<u8>(words * 4)?;
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = words as u32;
        let fill = self.f("fill")?;
        let mut l = self.stream.launch_builder(&fill);
        l.arg(&mut buf).arg(&n).arg(&seed);
        unsafe { l.launch(cfg) }?;
        Ok(buf)
    }
}

/// Launches `$name` with `$launch` dimensions and the given arguments, in order.
macro_rules! launch {
    ($gpu:expr, $name:expr, $launch:expr, [$($arg:expr),* $(,)?]) => {{
        let f = $gpu.f($name)?;
        let mut l = $gpu.stream.launch_builder(&f);
        $( l.arg($arg); )*
        unsafe { l.launch(super::harness::cfg($launch)) }?;
    }};
}

/// The device address of a buffer, for kernels whose arguments are packed from their
/// declared parameters (`ops::kernel_params!`).
pub fn ptr<T>(gpu: &Gpu, s: &cudarc::driver::CudaSlice<T>) -> u64 {
    s.device_ptr(&gpu.stream).0
}

/// Launches `name` with argument values in the order its parameters are declared.
pub fn launch_values(gpu: &Gpu, name: &str, l: Launch, values: &[ops::ArgValue]) -> Result<()> {
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

/// The `-s` filters: a case runs when its shape label contains one of them (all when none).
pub static SHAPES: OnceLock<Vec<String>> = OnceLock::new();

/// Whether the case labelled `shape` is selected by `-s`.
pub fn want(shape: &str) -> bool {
    SHAPES
        .get()
        .is_none_or(|f| f.is_empty() || f.iter().any(|s| shape.contains(s.as_str())))
}

/// Worst errors of one op over its cases, against `|g - r| <= atol + rtol * |r|`;
/// NaN must match NaN, anything else not finite fails (outputs start poisoned, so an
/// unwritten element fails). Each case prints its own line.
pub struct Check {
    pub op: String,
    pub cases: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    pub fails: usize,
    pub first_bad: Option<String>,
}

impl Check {
    pub fn new(op: &str) -> Self {
        Self {
            op: op.to_string(),
            cases: 0,
            max_abs: 0.0,
            max_rel: 0.0,
            fails: 0,
            first_bad: None,
        }
    }

    pub fn add(&mut self, case: &str, got: &[f32], want: &[f32], atol: f64, rtol: f64) {
        if !self::want(case) {
            return;
        }
        self.cases += 1;
        let (mut abs, mut rel) = (0f64, 0f64);
        let mut bad = None;
        if got.len() != want.len() {
            bad = Some(format!(
                "{case}: {} outputs, want {}",
                got.len(),
                want.len()
            ));
        }
        for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
            let (g64, r64) = (f64::from(g), f64::from(r));
            let ok = if r.is_nan() {
                g.is_nan()
            } else if !g.is_finite() {
                false
            } else {
                let d = (g64 - r64).abs();
                abs = abs.max(d);
                rel = rel.max(d / r64.abs().max(1e-30));
                d <= atol + rtol * r64.abs()
            };
            if !ok && bad.is_none() {
                bad = Some(format!("{case}: [{i}] gpu {g} cpu {r}"));
            }
        }
        self.max_abs = self.max_abs.max(abs);
        self.max_rel = self.max_rel.max(rel);
        line(
            &self.op,
            case,
            &format!("abs {abs:9.2e} rel {rel:9.2e}"),
            bad.is_none(),
        );
        if let Some(b) = bad {
            println!("    first failure: {b}");
            self.fails += 1;
            self.first_bad.get_or_insert(b);
        }
    }

    pub fn bits<T: Copy + PartialEq + Into<u64>>(&mut self, case: &str, got: &[T], want: &[T]) {
        if !self::want(case) {
            return;
        }
        self.cases += 1;
        let diff = (0..want.len())
            .filter(|&i| got.get(i) != Some(&want[i]))
            .count();
        line(
            &self.op,
            case,
            &format!("{diff} of {} differ", want.len()),
            diff == 0,
        );
        if let Some(i) = (0..want.len()).find(|&i| got.get(i) != Some(&want[i])) {
            self.fails += 1;
            let b = format!(
                "{case}: [{i}] gpu {:#06x} cpu {:#06x}",
                got.get(i).map_or(0, |&g| g.into()),
                want[i].into()
            );
            println!("    first failure: {b}");
            self.first_bad.get_or_insert(b);
        }
    }
}

/// One case's line: op, shape, its error, PASS or FAIL.
fn line(op: &str, shape: &str, err: &str, ok: bool) {
    println!(
        "  {op:28} {shape:46} {err:28} {}",
        if ok { "PASS" } else { "FAIL" }
    );
}

/// One op's row of the summary table.
pub struct Row {
    /// The registered op whose run reported it (`Case::op`).
    pub group: String,
    pub op: String,
    pub cases: usize,
    pub fails: usize,
    pub worst: f64,
    pub metric: String,
    pub tol: String,
    pub first_bad: Option<String>,
}

/// What a run found: a row per op (in the order they first reported), and the perf lines.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub perf: Vec<String>,
    /// The registered op now running: its rows are filed under it.
    pub group: String,
}

impl Report {
    fn row(&mut self, op: &str, metric: &str, tol: &str) -> &mut Row {
        if let Some(i) = self.rows.iter().position(|r| r.op == op) {
            return &mut self.rows[i];
        }
        self.rows.push(Row {
            group: self.group.clone(),
            op: op.to_string(),
            cases: 0,
            fails: 0,
            worst: 0.0,
            metric: metric.to_string(),
            tol: tol.to_string(),
            first_bad: None,
        });
        self.rows.last_mut().expect("pushed")
    }

    /// Files an op's [`Check`] under `name` with its tolerance rule.
    pub fn push(&mut self, name: &str, c: Check, tol: &str) {
        let metric = format!("max abs (max rel {:.1e})", c.max_rel);
        let r = self.row(name, &metric, tol);
        r.cases += c.cases;
        r.fails += c.fails;
        r.worst = r.worst.max(c.max_abs);
        r.metric = metric;
        if r.first_bad.is_none() {
            r.first_bad = c.first_bad;
        }
    }

    /// One case of a metric-and-bar check: `err` (NaN for any unwritten or non-finite
    /// output) must be at most `bar`. `metric` names the error; prints the case's line and
    /// returns whether it passed. Cases `-s` filters out are not counted.
    pub fn case(&mut self, op: &str, shape: &str, metric: &str, err: f64, bar: f64) -> bool {
        if !want(shape) {
            return true;
        }
        let ok = !err.is_nan() && err <= bar;
        line(op, shape, &format!("{err:9.2e} (bar {bar:.0e})"), ok);
        let r = self.row(op, metric, &format!("{bar:.0e}"));
        r.cases += 1;
        r.worst = if err.is_nan() {
            f64::INFINITY
        } else {
            r.worst.max(err)
        };
        if !ok {
            r.fails += 1;
            r.first_bad
                .get_or_insert(format!("{shape}: {metric} {err:.3e}"));
        }
        ok
    }

    /// A case that passes or fails outright (bytes equal, flags right), with a note.
    pub fn verdict(&mut self, op: &str, shape: &str, ok: bool, note: &str) -> bool {
        if !want(shape) {
            return true;
        }
        line(op, shape, note, ok);
        let r = self.row(op, "exact", "exact");
        r.cases += 1;
        if !ok {
            r.fails += 1;
            r.worst = 1.0;
            r.first_bad.get_or_insert(format!("{shape}: {note}"));
        }
        ok
    }

    /// A check that stopped with an error: a failure of its own.
    pub fn error(&mut self, op: &str, e: &anyhow::Error) {
        println!("  {op:28} ERROR {e:#}");
        let r = self.row(op, "-", "-");
        r.cases += 1;
        r.fails += 1;
        r.first_bad.get_or_insert(format!("error: {e:#}"));
    }

    /// [`Report::case`] with the error named "worst error".
    pub fn add(&mut self, op: &str, case: String, worst: f64, bar: f64) {
        self.case(op, &case, "worst error", worst, bar);
    }

    pub fn failures(&self) -> usize {
        self.rows.iter().filter(|r| r.fails > 0).count()
    }
}

pub fn floats(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

pub fn nan(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

pub fn random_floats(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
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
pub fn random_weights(rng: &mut impl Rng, ty: GgmlType, nrows: usize, k: usize) -> Result<Vec<u8>> {
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
pub fn rel_error(y: &[f32], r: &[f32]) -> f64 {
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

/// The largest `|got - want| / mag` of a matmul's outputs (`mag`: each output's sum of
/// the magnitudes of its products, what float rounding grows with); NaN when any output is
/// NaN (unwritten: the outputs were poisoned).
pub fn worst_over_magnitude(got: &[f32], want: &[f32], mag: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::NAN;
    }
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
pub fn worst_scaled(got: &[f32], want: &[f64], scale: impl Fn(usize) -> f64) -> f64 {
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
