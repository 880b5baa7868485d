//! GEMV bandwidth at real shapes against the device copy measured in the same run: the
//! timing part of `smelt-kernels`' GPU check, shared with `smelt bench --kernels`.

use smelt_kernels::gemv::Config;
use smelt_kernels::{act, catalog, GgmlType, TILE};

use crate::timing::{copy_bandwidth, time_graph, time_launches};
use crate::{CudaError, CudaSlice, Gpu, LaunchConfig, PushKernelArg};

/// The matrix shapes of Llama-3-8B's decode GEMVs: FFN up/gate, FFN down, attention.
pub const SHAPES: [(usize, usize); 3] = [(14336, 4096), (4096, 14336), (4096, 4096)];

/// One timed GEMV.
#[derive(Clone, Debug)]
pub struct GemvTiming {
    pub ty: GgmlType,
    pub kernel: String,
    pub rows: usize,
    pub k: usize,
    pub ntok: usize,
    /// Microseconds per launch, stream launches.
    pub us_stream: f64,
    /// Microseconds per launch inside a CUDA graph.
    pub us_graph: f64,
    /// Bytes one launch must move (weights, activations, outputs).
    pub bytes: usize,
}

impl GemvTiming {
    /// GB/s of the graph timing.
    pub fn gbs(&self) -> f64 {
        self.bytes as f64 / (self.us_graph * 1e-6) / 1e9
    }
    /// GB/s of the stream timing.
    pub fn gbs_stream(&self) -> f64 {
        self.bytes as f64 / (self.us_stream * 1e-6) / 1e9
    }
}

/// Launches GEMV `f` (configuration `cfg`) over `nrows` rows of `k` weights.
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv(
    gpu: &Gpu,
    f: &crate::CudaFunction,
    cfg: Config,
    w: &CudaSlice<u8>,
    xq: &CudaSlice<u8>,
    y: &mut CudaSlice<f32>,
    nrows: usize,
    k: usize,
    row_bytes: usize,
) -> Result<(), CudaError> {
    let (nrows, ntiles, row_bytes) = (nrows as u32, k.div_ceil(TILE) as u32, row_bytes as u32);
    let lc = LaunchConfig {
        grid_dim: (nrows.div_ceil(cfg.rows_per_cta()), 1, 1),
        block_dim: cfg.block(),
        shared_mem_bytes: 0,
    };
    let never = 0u32;
    let mut l = gpu.stream().launch_builder(f);
    l.arg(w)
        .arg(xq)
        .arg(y)
        .arg(&nrows)
        .arg(&ntiles)
        .arg(&row_bytes)
        .arg(&never);
    // SAFETY: parameters in the order `gemv::kernel` documents, buffers sized by the caller.
    unsafe { l.launch(lc) }?;
    Ok(())
}

/// Device copy bandwidth (GB/s, read + write) over 1 GiB.
pub fn copy_gbs(gpu: &Gpu) -> Result<f64, CudaError> {
    copy_bandwidth(gpu, 1 << 30)
}

/// Times the default GEMV of `ty` for `ntok` tokens at `nrows x k`, rotating over enough
/// weight copies that L2 cannot serve them.
pub fn time_gemv(
    gpu: &Gpu,
    ty: GgmlType,
    nrows: usize,
    k: usize,
    ntok: usize,
) -> Result<GemvTiming, CudaError> {
    let cfg = Config::new(ntok);
    let row_bytes = catalog::row_bytes(ty, k)?;
    let wbytes = nrows * row_bytes;
    let copies = 600_000_000usize.div_ceil(wbytes).clamp(2, 64);
    let ws = (0..copies)
        .map(|c| gpu.random_bytes(wbytes, 17 + c as u32))
        .collect::<Result<Vec<_>, _>>()?;
    let qbytes = act::row_bytes(k)? * ntok;
    // Activations: hashed bytes are valid q8_1 quants; the f16 scales may be anything, which
    // does not change the time of integer dot products.
    let xq = gpu.random_bytes(qbytes, 5)?;
    let mut y = gpu.zeros::<f32>(nrows * ntok)?;
    let name = catalog::gemv_config_name(ty, cfg)?;
    let f = gpu.function(&name)?;
    let launches = (4_000_000_000usize / wbytes).clamp(50, 2000);
    let mut launch = |i: usize| {
        launch_gemv(
            gpu,
            &f,
            cfg,
            &ws[i % copies],
            &xq,
            &mut y,
            nrows,
            k,
            row_bytes,
        )
    };
    let ms = time_launches(gpu, 5, launches, &mut launch)?;
    let ms_graph = time_graph(gpu, 5, launches, &mut launch)?;
    Ok(GemvTiming {
        ty,
        kernel: name,
        rows: nrows,
        k,
        ntok,
        us_stream: ms * 1e3,
        us_graph: ms_graph * 1e3,
        bytes: wbytes + qbytes + 4 * nrows * ntok,
    })
}
