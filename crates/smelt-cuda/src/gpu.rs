//! One CUDA device: context, stream, and smelt's kernels loaded for its architecture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use smelt_ptx::Target;

use crate::{guard, util, CudaError};

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
    /// stream cannot be captured into a graph), and the kernel module JIT-compiled for it.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        guard(|| {
            let count = usize::try_from(cudarc::driver::result::device::get_count()?).unwrap_or(0);
            if ordinal >= count {
                return Err(CudaError::NoDevice { ordinal, count });
            }
            let ctx = CudaContext::new(ordinal)?;
            // SAFETY: smelt uses one stream per device, so cudarc's per-buffer events
            // (which order work across streams) are pure launch overhead.
            unsafe { ctx.disable_event_tracking() };
            let cc = ctx.compute_capability()?;
            let target = target_for(cc)?;
            let t = Instant::now();
            let kernels = ctx.load_module(Ptx::from_src(
                smelt_kernels::catalog::module(target)?.to_ptx(),
            ))?;
            let runtime = ctx.load_module(Ptx::from_src(util::module(target)?.to_ptx()))?;
            let load_time = t.elapsed();
            let sm_count = ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?;
            Ok(Arc::new(Gpu {
                name: ctx.name()?,
                stream: ctx.new_stream()?,
                ctx,
                kernels,
                runtime,
                functions: Mutex::new(HashMap::new()),
                ordinal,
                cc,
                sm_count: usize::try_from(sm_count).unwrap_or(1).max(1),
                target,
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
