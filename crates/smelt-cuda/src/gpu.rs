//! One CUDA device: context, stream, and smelt's kernels loaded for its architecture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use smelt_ptx::{GridDep, Target};

use crate::{cache, guard, util, CudaError, GpuOptions};

/// An opened device. Cheap to share (`Arc<Gpu>`); all work goes to its one stream.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Arc<CudaModule>,
    runtime: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    name: String,
    ordinal: usize,
    cc: (i32, i32),
    sm_count: usize,
    target: Target,
    grid_dep: GridDep,
    timeline: bool,
    /// Preferred shared-memory carveouts, in percent, by kernel name prefix (first match):
    /// by default [`smelt_kernels::catalog::CARVEOUT_BYTES`] for every kernel;
    /// `SMELT_CUDA_CARVEOUT` sets them to measure them: `25` for every kernel,
    /// `attention=14/gemv_=0` by prefix, `driver` for the driver's choice per kernel.
    carveout: Vec<(String, i32)>,
    load_time: Duration,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("cc", &self.cc)
            .finish_non_exhaustive()
    }
}

/// One kernel parameter for [`Gpu::launch`].
#[derive(Clone, Copy, Debug)]
pub enum KernelParam {
    /// A device address.
    P(u64),
    U(u32),
    F(f32),
}

/// Pushes a typed kernel's arguments (the `values()` of its `ops::kernel_params!` struct)
/// onto a cudarc launch, in the kernel's order.
pub fn push_args<'a>(
    l: &mut cudarc::driver::LaunchArgs<'a>,
    values: &'a [smelt_kernels::ops::ArgValue],
) {
    use cudarc::driver::PushKernelArg;
    for v in values {
        match v {
            smelt_kernels::ops::ArgValue::Ptr(p) => l.arg(p),
            smelt_kernels::ops::ArgValue::U32(u) => l.arg(u),
            smelt_kernels::ops::ArgValue::F32(f) => l.arg(f),
        };
    }
}

impl From<smelt_kernels::ops::ArgValue> for KernelParam {
    fn from(v: smelt_kernels::ops::ArgValue) -> Self {
        match v {
            smelt_kernels::ops::ArgValue::Ptr(p) => KernelParam::P(p),
            smelt_kernels::ops::ArgValue::U32(u) => KernelParam::U(u),
            smelt_kernels::ops::ArgValue::F32(f) => KernelParam::F(f),
        }
    }
}

/// The programmatic-dependent-launch settings (other kernels, GEMVs) from
/// `SMELT_CUDA_PDL`, to measure them: `0` off; `wait` (every kernel waits at entry, the
/// next launches when one ends); `launch` (and every kernel lets the next launch at entry);
/// `gemv` (only the GEMVs do, so the kernels after them launch early); `small` (only the
/// other kernels do); `chain` (every kernel lets the next launch right after its own
/// wait); `chain-gemv` (GEMVs at entry, the others after their wait); `prefetch`
/// (`launch`, and the GEMVs load their first loop step's weights into registers before
/// they wait); `early` (`chain-gemv`); `early-prefetch` (`early` and the GEMVs' early
/// loads); `hoist` (`gemv` and the GEMVs' early loads: the default,
/// `smelt_kernels::catalog::GRID_DEPS`). Off before sm_90 whatever it says.
fn grid_dep_from(pdl: Option<&str>, target: Target) -> (GridDep, GridDep) {
    let wait = smelt_kernels::catalog::GRID_DEP;
    let launch = GridDep {
        wait: true,
        early_launch: true,
        early_work: false,
        launch_after_wait: false,
    };
    let after = GridDep {
        launch_after_wait: true,
        ..launch
    };
    let early_after = GridDep {
        early_work: true,
        ..after
    };
    let early_launch = GridDep {
        early_work: true,
        ..launch
    };
    let (other, gemv) = match pdl {
        Some("0") => (GridDep::default(), GridDep::default()),
        Some("wait") => (wait, wait),
        Some("launch") => (launch, launch),
        Some("gemv") => (wait, launch),
        Some("small") => (launch, wait),
        Some("chain") => (after, after),
        Some("chain-gemv") => (after, launch),
        Some("prefetch") => (GridDep::ALL, GridDep::ALL),
        Some("early") => (early_after, launch),
        Some("early-prefetch") => (early_after, early_launch),
        Some("hoist") => (wait, early_launch),
        _ => smelt_kernels::catalog::GRID_DEPS,
    };
    (other.for_target(target), gemv.for_target(target))
}

/// A `/`-separated list of kernel-name parts (`none`: empty), or `default` when unset.
fn name_list(v: Option<&str>, default: &[&str]) -> Vec<String> {
    match v {
        Some(v) => v
            .split('/')
            .filter(|p| !p.is_empty() && *p != "none")
            .map(str::to_string)
            .collect(),
        None => default.iter().map(|p| p.to_string()).collect(),
    }
}

/// Lets `f`, kernel `name`, launch with the dynamic shared memory its largest launch
/// takes ([`smelt_kernels::catalog::max_dynamic_shared_bytes`]): over 48 KB the driver
/// refuses a launch it was not told of first.
pub fn allow_dynamic_shared(f: &CudaFunction, name: &str) -> Result<(), CudaError> {
    let bytes = smelt_kernels::catalog::max_dynamic_shared_bytes(name);
    if bytes > 0 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(bytes).unwrap_or(i32::MAX),
        )?;
    }
    Ok(())
}

/// The carveout of [`smelt_kernels::catalog::CARVEOUT_BYTES`] for every kernel, in percent
/// of an SM's `max_shared` bytes (the driver takes the nearest configuration it has:
/// 14% of an H100's 228 KB is its 32 KB one); none when the device reports no size. The
/// tensor-core GEMMs (`gemm_*`, many tokens, never inside a decode step of one sequence)
/// take all of it: each block stages 42 KB, and several blocks per SM hide each other's
/// loads.
fn default_carveout(max_shared: usize) -> Vec<(String, i32)> {
    if max_shared == 0 {
        return Vec::new();
    }
    let bytes = smelt_kernels::catalog::CARVEOUT_BYTES;
    let pct = ((bytes * 100 + max_shared / 2) / max_shared).min(100);
    vec![("gemm_".to_string(), 100), ("*".to_string(), pct as i32)]
}

/// Parses `SMELT_CUDA_CARVEOUT` (see [`Gpu`]'s field): a percent for every kernel, or
/// `prefix=percent` pairs split by `,` or `/` (`*` matches every name); what does not parse
/// is left out.
fn carveouts(spec: &str) -> Vec<(String, i32)> {
    let pct = |v: &str| {
        v.trim()
            .parse::<i32>()
            .ok()
            .filter(|c| (0..=100).contains(c))
    };
    if let Some(c) = pct(spec) {
        return vec![("*".to_string(), c)];
    }
    spec.split([',', '/'])
        .filter_map(|pair| {
            let (prefix, v) = pair.split_once('=')?;
            Some((prefix.trim().to_string(), pct(v)?))
        })
        .collect()
}

/// The PTX target for a compute capability: sm_90 code on Hopper and later, sm_80 code on
/// Ampere and Ada (the driver JIT-compiles PTX forward, never backward).
pub fn target_for(cc: (i32, i32)) -> Result<Target, CudaError> {
    match cc {
        (major, _) if major >= 9 => Ok(Target::Sm90),
        (8, _) => Ok(Target::Sm80),
        (major, minor) => Err(CudaError::Init(format!(
            "compute capability {major}.{minor} is older than 8.0 (Ampere), the oldest smelt's kernels target"
        ))),
    }
}

impl Gpu {
    /// Opens device `ordinal`: its primary context, a stream of its own (the legacy default
    /// stream cannot be captured into a graph), and the kernel module JIT-compiled for it,
    /// with the settings of the environment ([`GpuOptions::from_env`]).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        Self::open_with(ordinal, &GpuOptions::from_env())
    }

    /// [`Gpu::open`] with settings `opts`.
    pub fn open_with(ordinal: usize, opts: &GpuOptions) -> Result<Arc<Gpu>, CudaError> {
        guard(|| {
            crate::visible::check(ordinal)?;
            // The driver's index: `ordinal` itself unless only some devices are visible.
            let ctx = CudaContext::new(crate::visible::driver_ordinal(ordinal)?)?;
            // SAFETY: smelt uses one stream per device, so cudarc's per-buffer events
            // (which order work across streams) are pure launch overhead.
            unsafe { ctx.disable_event_tracking() };
            let cc = ctx.compute_capability()?;
            let target = target_for(cc)?;
            let t = Instant::now();
            let (other, gemv) = grid_dep_from(opts.pdl.as_deref(), target);
            let grid_dep = GridDep {
                wait: other.wait || gemv.wait,
                ..other
            };
            let timeline = opts.timeline;
            // Kernels besides the GEMVs that let their successor launch after their own
            // wait (name prefixes), GEMVs that do no early work (name parts): to measure.
            let after = name_list(
                opts.pdl_after.as_deref(),
                smelt_kernels::catalog::LAUNCH_AFTER_WAIT,
            );
            let late = name_list(
                opts.early_skip.as_deref(),
                smelt_kernels::catalog::NO_EARLY_WORK,
            );
            let after: Vec<&str> = after.iter().map(String::as_str).collect();
            let late: Vec<&str> = late.iter().map(String::as_str).collect();
            let name = ctx.name()?;
            let settings = format!("{target:?}|{other:?}|{gemv:?}|{after:?}|{late:?}|{timeline}");
            let mut generated = std::time::Duration::ZERO;
            let (kernels, how) = cache::load(&ctx, &name, cc, &settings, || {
                let module = smelt_kernels::catalog::module_with(
                    target, other, gemv, &after, &late, timeline,
                )?;
                let ptx = module.to_ptx();
                generated = t.elapsed();
                Ok(ptx)
            })?;
            let runtime = ctx.load_module(Ptx::from_src(util::module(target)?.to_ptx()))?;
            let load_time = t.elapsed();
            if opts.load_log {
                eprintln!(
                    "cuda:{ordinal} kernels: PTX generated in {:.0} ms, ready in {:.0} ms ({})",
                    generated.as_secs_f64() * 1e3,
                    load_time.as_secs_f64() * 1e3,
                    match &how {
                        cache::Loaded::Hit(p) => format!("PTX from {}", p.display()),
                        cache::Loaded::Stored(p) => format!("PTX stored at {}", p.display()),
                        cache::Loaded::Uncached => "PTX not cached".to_string(),
                    }
                );
            }
            let sm_count = ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?;
            let carveout = match &opts.carveout {
                Some(spec) => carveouts(spec),
                None => {
                    let max = ctx.attribute(
                        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                    )?;
                    default_carveout(usize::try_from(max).unwrap_or(0))
                }
            };
            Ok(Arc::new(Gpu {
                name,
                stream: ctx.new_stream()?,
                ctx,
                kernels,
                runtime,
                functions: Mutex::new(HashMap::new()),
                ordinal,
                cc,
                sm_count: usize::try_from(sm_count).unwrap_or(1).max(1),
                target,
                grid_dep,
                timeline,
                carveout,
                load_time,
            }))
        })
    }

    /// The device's name as the driver reports it ("NVIDIA H200").
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Streaming multiprocessors (grids sized to fill the device use it).
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The PTX target the module was generated for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// How the loaded kernels take part in programmatic dependent launch; when they wait,
    /// [`Gpu::launch`] lets each start before the one before it has ended.
    pub fn grid_dep(&self) -> GridDep {
        self.grid_dep
    }

    /// Whether the catalog's kernels take a timeline slot ([`smelt_ptx::timeline::PARAM`])
    /// after their own parameters (`SMELT_CUDA_TIMELINE=1`): every launch of one must pass
    /// it; 0 records nothing ([`Gpu::no_timeline`]).
    pub fn timeline(&self) -> bool {
        self.timeline
    }

    /// Appends "no slot" to a launch of a catalog kernel when [`Gpu::timeline`] is on.
    pub fn no_timeline(&self, l: &mut LaunchArgs<'_>) {
        static NO_SLOT: u64 = 0;
        if self.timeline {
            l.arg(&NO_SLOT);
        }
    }

    /// Launches kernel `f` on the stream with `params` (in the kernel's order). When the
    /// kernels wait for their predecessors ([`Gpu::grid_dep`]), the launch carries
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: its blocks may be scheduled
    /// while the previous kernel runs (hiding launch latency and the block ramp); captured
    /// graphs keep these programmatic edges.
    ///
    /// # Safety
    /// `params` must be the parameters `f` declares, in order and type, and every address
    /// must point to memory of the sizes the kernel reads and writes.
    pub unsafe fn launch(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &[KernelParam],
    ) -> Result<(), CudaError> {
        use cudarc::driver::sys;
        // Each parameter in a slot of its own; the driver reads as many bytes of each as
        // the kernel declares.
        let mut slots: Vec<[u8; 8]> = params
            .iter()
            .map(|p| {
                let mut s = [0u8; 8];
                match *p {
                    KernelParam::P(v) => s.copy_from_slice(&v.to_ne_bytes()),
                    KernelParam::U(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
                    KernelParam::F(v) => s[..4].copy_from_slice(&v.to_ne_bytes()),
                }
                s
            })
            .collect();
        let mut ptrs: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| s.as_mut_ptr().cast::<std::ffi::c_void>())
            .collect();
        // SAFETY: a zeroed attribute is a valid plain-data value; id and value set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let programmatic = self.grid_dep.wait;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if programmatic {
                &mut attr
            } else {
                std::ptr::null_mut()
            },
            numAttrs: u32::from(programmatic),
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: the config, attribute and parameter slots outlive the call (the driver
        // copies the parameters at launch); the caller vouches for the parameters.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        Ok(())
    }

    /// How long generating and JIT-loading the modules took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's one stream: every launch and copy goes here, in order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// A kernel of `smelt_kernels::catalog` (or of the runtime's own module) by name,
    /// looked up once and cached.
    pub fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        let mut cache = self
            .functions
            .lock()
            .map_err(|_| CudaError::Init("kernel cache poisoned".into()))?;
        if let Some(f) = cache.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .kernels
            .load_function(name)
            .or_else(|_| self.runtime.load_function(name))
            .map_err(|_| CudaError::NoKernel(name.to_string()))?;
        let carveout = self
            .carveout
            .iter()
            .find(|(prefix, _)| prefix == "*" || name.starts_with(prefix.as_str()));
        if let Some(&(_, c)) = carveout {
            // One carveout for every kernel: an SM changes its split of L1 and shared
            // memory only when it is idle, so blocks of kernels that prefer different
            // splits cannot share it (they do share it with programmatic dependent launch).
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                c,
            )?;
        }
        allow_dynamic_shared(&f, name)?;
        cache.insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// Copies a device buffer back (waits for the stream).
    pub fn download<T: DeviceRepr>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        Ok(self.stream.clone_dtoh(dev)?)
    }

    /// A zeroed device buffer of `n` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.alloc_zeros::<T>(n)?)
    }

    /// Waits for all work queued on the stream; reports any asynchronous fault.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }

    /// `n` bytes (rounded up to whole words) of a hash of their index and `seed`, written
    /// on the device: benchmark inputs that never cross PCIe.
    pub fn random_bytes(&self, n: usize, seed: u32) -> Result<CudaSlice<u8>, CudaError> {
        let words = n.div_ceil(4);
        let mut buf = self.stream.alloc_zeros::<u8>(words * 4)?;
        let f = self.function(util::FILL)?;
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = u32::try_from(words).map_err(|_| CudaError::BadLength {
            what: "random buffer words",
            got: words,
            want: u32::MAX as usize,
        })?;
        let mut l = self.stream.launch_builder(&f);
        l.arg(&mut buf).arg(&n).arg(&seed);
        // SAFETY: the fill kernel writes exactly `n` words of `buf`.
        unsafe { l.launch(cfg) }?;
        Ok(buf)
    }

    /// The raw device address of a buffer (kernel parameters are plain addresses).
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        let (p, _sync) = buf.device_ptr(&self.stream);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_carveout_is_the_nearest_percent_of_the_kernels_shared_memory() {
        // H100/H200: 228 KB a multiprocessor; A100: 164 KB; Ada: 100 KB.
        assert_eq!(
            default_carveout(228 * 1024),
            vec![("gemm_".to_string(), 100), ("*".to_string(), 14)]
        );
        assert_eq!(
            default_carveout(164 * 1024),
            vec![("gemm_".to_string(), 100), ("*".to_string(), 20)]
        );
        assert_eq!(
            default_carveout(100 * 1024),
            vec![("gemm_".to_string(), 100), ("*".to_string(), 32)]
        );
        assert_eq!(
            default_carveout(16 * 1024),
            vec![("gemm_".to_string(), 100), ("*".to_string(), 100)]
        );
        assert!(default_carveout(0).is_empty());
    }

    #[test]
    fn carveout_settings_parse_as_one_percent_or_prefix_pairs() {
        assert_eq!(carveouts("25"), vec![("*".to_string(), 25)]);
        assert_eq!(
            carveouts("attention=14/gemv_=0,*=50"),
            vec![
                ("attention".to_string(), 14),
                ("gemv_".to_string(), 0),
                ("*".to_string(), 50)
            ]
        );
        assert!(carveouts("driver").is_empty());
        assert!(carveouts("101").is_empty());
        assert_eq!(carveouts("a=7/b=x/c"), vec![("a".to_string(), 7)]);
    }
}
