//! GEMV bandwidth at real shapes against the device copy measured in the same run: the
//! timing part of `smelt-kernels`' GPU check, shared with `smelt bench --kernels`.

use smelt_kernels::gemv::{self, Config, Fuse};
use smelt_kernels::{act, catalog, GgmlType, TILE};

use crate::timing::{copy_bandwidth, time_graph, time_launches};
use crate::{CudaError, CudaSlice, Gpu, LaunchConfig};

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

/// What a fused GEMV (`gemv::Fuse`) reads and writes besides its weights, activations and
/// output: hashed bytes (they do not change the time of integer dot products).
enum Extras {
    None,
    /// res, g, tiles, partials.
    ResidualNorm([CudaSlice<u8>; 4]),
    /// partials, their count, the normed length, res, g.
    RmsInput(CudaSlice<u8>, u32, u32, CudaSlice<u8>, CudaSlice<u8>),
}

impl Extras {
    fn new(gpu: &Gpu, cfg: Config, nrows: usize, k: usize) -> Result<Self, CudaError> {
        Ok(match cfg.fuse {
            Fuse::None => Extras::None,
            Fuse::ResidualNorm => Extras::ResidualNorm([
                gpu.random_bytes(nrows * 4, 10)?,
                gpu.random_bytes(nrows * 4, 11)?,
                gpu.zeros::<u8>(act::row_bytes(nrows)?)?,
                gpu.zeros::<u8>(nrows / 32 * 4)?,
            ]),
            Fuse::RmsInput => Extras::RmsInput(
                gpu.random_bytes(k / 32 * 4, 7)?,
                (k / 32) as u32,
                k as u32,
                gpu.random_bytes(k * 4, 8)?,
                gpu.random_bytes(k * 4, 9)?,
            ),
        })
    }
}

/// Launches GEMV `f` (configuration `cfg`) over `nrows` rows of `k` weights, with what a
/// fused configuration takes besides.
#[allow(clippy::too_many_arguments)]
fn launch_gemv(
    gpu: &Gpu,
    f: &crate::CudaFunction,
    cfg: Config,
    w: &CudaSlice<u8>,
    xq: &CudaSlice<u8>,
    y: &mut CudaSlice<f32>,
    (nrows, k, row_bytes): (usize, usize, usize),
    extras: &mut Extras,
) -> Result<(), CudaError> {
    let (nrows, ntiles, row_bytes) = (nrows as u32, k.div_ceil(TILE) as u32, row_bytes as u32);
    let lc = LaunchConfig {
        grid_dim: (nrows.div_ceil(cfg.rows_per_cta()), 1, 1),
        block_dim: cfg.block(),
        shared_mem_bytes: 0,
    };
    let mut values = gemv::GemvArgs {
        w: gpu.ptr(w),
        x: gpu.ptr(xq),
        y: gpu.ptr(y),
        nrows,
        ntiles,
        row_bytes,
        never: 0,
    }
    .values();
    match extras {
        Extras::None => {}
        Extras::ResidualNorm([res, g, q, parts]) => values.extend(
            gemv::ResNormArgs {
                res: gpu.ptr(res),
                g: gpu.ptr(g),
                q: gpu.ptr(q),
                partials: gpu.ptr(parts),
            }
            .values(),
        ),
        Extras::RmsInput(parts, nparts, n, res, g) => values.extend(
            gemv::RmsInputArgs {
                partials: gpu.ptr(parts),
                nparts: *nparts,
                n: *n,
                eps: 1e-5,
                res: gpu.ptr(res),
                g: gpu.ptr(g),
                out: 0,
            }
            .values(),
        ),
    }
    let mut l = gpu.stream().launch_builder(f);
    crate::gpu::push_args(&mut l, &values);
    gpu.no_timeline(&mut l);
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
    time_config(gpu, ty, nrows, k, Config::new(ntok))
}

/// The fused single-token GEMVs of a Llama-3-8B decode step beside the plain ones they
/// replace, Q4_K, in the same run: the output and down projections with the residual add
/// + norm (`resnorm`), Q|K|V and gate|up with the split norm's input (`rmsin`).
pub fn time_fused(gpu: &Gpu) -> Result<Vec<GemvTiming>, CudaError> {
    let ty = GgmlType::Q4_K;
    [
        (4096, 4096, Config::new(1)),
        (4096, 4096, Config::residual_norm()),
        (4096, 14336, Config::new(1)),
        (4096, 14336, Config::residual_norm()),
        (6144, 4096, Config::new(1)),
        (6144, 4096, Config::rms_input()),
        (28672, 4096, Config::new(1)),
        (28672, 4096, Config::rms_input()),
    ]
    .into_iter()
    .map(|(n, k, cfg)| time_config(gpu, ty, n, k, cfg))
    .collect()
}

/// Times GEMV configuration `cfg` of `ty` at `nrows x k` (see [`time_gemv`]).
pub fn time_config(
    gpu: &Gpu,
    ty: GgmlType,
    nrows: usize,
    k: usize,
    cfg: Config,
) -> Result<GemvTiming, CudaError> {
    let ntok = cfg.ntok;
    let mut extras = Extras::new(gpu, cfg, nrows, k)?;
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
            (nrows, k, row_bytes),
            &mut extras,
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
