//! Glue from the backend's ops to the kernels of `smelt_kernels::ops`: shapes checked,
//! parameters in the order each kernel documents, launch dimensions from the kernel's own
//! helper.

use smelt_cuda::{CudaError, LaunchConfig};
use smelt_kernels::ops::{self, Launch};

use super::{Cuda, CudaKv, CudaTensor, CudaWeight, StepPtrs};
use crate::backend::{Glu, RopeParams, RopeStyle};

/// One kernel parameter.
pub(crate) use smelt_cuda::KernelParam as Arg;

/// Most rows the split argmax takes (its state is allocated once); more use the one-block
/// kernel.
const ARGMAX_ROWS: usize = 4096;

/// The arguments of a kernel declared through `ops::kernel_params!`, in its order, as the
/// launch takes them.
pub(super) fn args(values: &[ops::ArgValue]) -> Vec<Arg> {
    values.iter().copied().map(Arg::from).collect()
}

pub(super) fn u32_of(n: usize, what: &'static str) -> Result<u32, CudaError> {
    u32::try_from(n).map_err(|_| CudaError::BadLength {
        what,
        got: n,
        want: u32::MAX as usize,
    })
}

/// Launch of the norm kernels (one block per chunk, any whole number of warps: the kernels
/// stride by the block size): about four values per thread, up to 1024 threads. The
/// kernels' own helper gives eight per thread; each thread's loads are serial, so at
/// decode (one row, one block) fewer per thread halve the time.
fn norm_launch(n_chunks: usize, n: usize) -> Launch {
    let threads = (n.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
    Launch::new((n_chunks.max(1) as u32, 1, 1), (threads, 1, 1))
}

impl Cuda {
    /// Launches kernel `name` with `args` (in the kernel's documented order): the one
    /// launch site of the backend, so every kernel of a step is a programmatic dependent
    /// launch on sm_90 ([`smelt_cuda::Gpu::launch`]).
    pub(crate) fn launch(&self, name: &str, l: Launch, args: &[Arg]) -> Result<(), CudaError> {
        if self.skipped(name) {
            return Ok(());
        }
        if let Some(d) = &self.diag.launch_digest {
            let mut d = super::lock(d);
            let (g, b) = (l.grid, l.block);
            let shape = [g.0, g.1, g.2, b.0, b.1, b.2, l.shared_bytes];
            let bytes = name
                .bytes()
                .chain(shape.iter().flat_map(|v| v.to_le_bytes()));
            for byte in bytes {
                d.0 = (d.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            d.1 += 1;
        }
        let f = self.gpu.function(name)?;
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_bytes,
        };
        let with_slot;
        let args = match &self.diag.timeline {
            Some(t) => {
                // Named with the grid, so that the shapes of one kernel get rows of their own.
                let (x, y, z) = l.grid;
                let key = format!("{name} {x}x{y}x{z}");
                let slot = super::lock(t).arg(&self.gpu, &key);
                with_slot = args
                    .iter()
                    .copied()
                    .chain([Arg::P(slot)])
                    .collect::<Vec<_>>();
                &with_slot[..]
            }
            None => args,
        };
        // SAFETY: every caller passes the parameters its kernel documents, with buffers of
        // the sizes the shapes imply (checked by the callers); a timeline module's kernels
        // take their slot last (`Gpu::timeline`).
        unsafe { self.gpu.launch(&f, cfg, args) }?;
        self.profile_mark(name)
    }

    pub(super) fn vector(
        &self,
        w: &CudaWeight,
        what: &'static str,
    ) -> Result<(u64, usize), CudaError> {
        match w {
            CudaWeight::Vector { len, .. } => Ok((w.ptr(), *len)),
            _ => Err(CudaError::Init(format!("{what}: expected a vector weight"))),
        }
    }

    /// The Q and K head norms in place as one launch (`ops::norm::rms_norm_pair_kernel`)
    /// where K's heads follow Q's in memory (a decode row of the Q|K|V GEMV's output) and
    /// both norms have one head size: `Ok(false)`, with nothing launched, otherwise. The
    /// same floats as the two `rms_norm` launches (`gpu_ops -o norm` checks the bits).
    pub(crate) fn op_head_norms_pair(
        &self,
        q: &CudaTensor,
        wq: &CudaWeight,
        k: &CudaTensor,
        wk: &CudaWeight,
        eps: f32,
    ) -> Result<bool, CudaError> {
        let (CudaWeight::Vector { ptr: pq, len: n }, CudaWeight::Vector { ptr: pk, len: nk }) =
            (wq, wk)
        else {
            return Ok(false);
        };
        let (n, nk) = (*n, *nk);
        let follows = q.rows == 1 && k.rows == 1 && k.ptr == q.ptr + (q.cols * 4) as u64;
        if !self.opts.fuse.head_norms
            || !follows
            || n == 0
            || n != nk
            || !q.cols.is_multiple_of(n)
            || !k.cols.is_multiple_of(n)
        {
            return Ok(false);
        }
        let (hq, hk) = (q.cols / n, k.cols / n);
        self.launch(
            ops::norm::RMS_NORM_PAIR,
            norm_launch(hq + hk, n),
            &args(
                &ops::norm::RmsNormPairArgs {
                    x: q.ptr,
                    w: *pq,
                    w2: *pk,
                    out: q.ptr,
                    n: n as u32,
                    split: hq as u32,
                    eps,
                }
                .values(),
            ),
        )?;
        Ok(true)
    }

    pub(crate) fn op_rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &CudaTensor,
    ) -> Result<(), CudaError> {
        let (wp, n) = self.vector(w, "rms_norm")?;
        let total = x.rows * x.cols;
        if n == 0 || !total.is_multiple_of(n) {
            return Err(CudaError::BadLength {
                what: "rms_norm row (not a multiple of the weight)",
                got: x.cols,
                want: n,
            });
        }
        self.launch(
            ops::norm::RMS_NORM,
            norm_launch(total / n, n),
            &args(
                &ops::norm::RmsNormArgs {
                    x: x.ptr,
                    w: wp,
                    out: out.ptr,
                    n: n as u32,
                    eps,
                }
                .values(),
            ),
        )
    }

    /// Whether `x += y; out = norm(x) * w` can run fused: a whole-row norm, same shapes, and
    /// `out` apart from both inputs.
    pub(crate) fn can_fuse_add_norm(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        w: &CudaWeight,
        out: &CudaTensor,
    ) -> bool {
        let apart = |a: &CudaTensor, b: &CudaTensor| {
            a.ptr + (a.cap * 4) as u64 <= b.ptr || b.ptr + (b.cap * 4) as u64 <= a.ptr
        };
        matches!(w, CudaWeight::Vector { len, .. } if *len == x.cols)
            && y.rows == x.rows
            && y.cols == x.cols
            && apart(out, x)
            && apart(out, y)
    }

    /// Whether `rms_norm(x) -> out` can also write q8_1 tiles: a whole-row norm of rows
    /// of whole 32-value blocks, `out` apart from `x`.
    pub(crate) fn can_norm_quantize(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        out: &CudaTensor,
    ) -> bool {
        let apart =
            out.ptr + (out.cap * 4) as u64 <= x.ptr || x.ptr + (x.cap * 4) as u64 <= out.ptr;
        matches!(w, CudaWeight::Vector { len, .. } if *len == x.cols)
            && x.cols.is_multiple_of(32)
            && x.rows > 0
            && apart
    }

    /// `[x += y;] out = rms_norm(x) * w; q = quantize_q8_1(out)` (or the f16 rows of `out`,
    /// as `sink` says) in one kernel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_norm_q8(
        &self,
        x: &CudaTensor,
        y: Option<&CudaTensor>,
        w: &CudaWeight,
        eps: f32,
        out: &CudaTensor,
        (q, sink): (u64, smelt_kernels::fused::Sink),
    ) -> Result<(), CudaError> {
        let (wp, n) = self.vector(w, "rms_norm_q8_1")?;
        let ntiles = n.div_ceil(smelt_kernels::TILE) as u32;
        let l = smelt_kernels::fused::launch(x.rows, n);
        match y {
            Some(y) => self.launch(
                smelt_kernels::fused::norm_name(true, sink),
                l,
                &args(
                    &smelt_kernels::fused::AddNormQ8Args {
                        x: x.ptr,
                        y: y.ptr,
                        w: wp,
                        out: out.ptr,
                        q,
                        n: n as u32,
                        ntiles,
                        eps,
                    }
                    .values(),
                ),
            ),
            None => self.launch(
                smelt_kernels::fused::norm_name(false, sink),
                l,
                &args(
                    &smelt_kernels::fused::NormQ8Args {
                        x: x.ptr,
                        w: wp,
                        out: out.ptr,
                        q,
                        n: n as u32,
                        ntiles,
                        eps,
                    }
                    .values(),
                ),
            ),
        }
    }

    pub(crate) fn op_add_rms_norm(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &CudaTensor,
    ) -> Result<(), CudaError> {
        let (wp, n) = self.vector(w, "add_rms_norm")?;
        self.launch(
            ops::norm::ADD_RMS_NORM,
            norm_launch(x.rows, n),
            &args(
                &ops::norm::AddRmsNormArgs {
                    x: x.ptr,
                    y: y.ptr,
                    w: wp,
                    out: out.ptr,
                    n: n as u32,
                    eps,
                }
                .values(),
            ),
        )
    }

    pub(crate) fn op_add_bias(&self, x: &CudaTensor, bias: &CudaWeight) -> Result<(), CudaError> {
        let (bp, n) = self.vector(bias, "add_bias")?;
        if n != x.cols {
            return Err(CudaError::BadLength {
                what: "bias",
                got: n,
                want: x.cols,
            });
        }
        self.launch(
            ops::elementwise::ADD_BIAS,
            ops::elementwise::launch_bias(x.rows, x.cols),
            &args(
                &ops::elementwise::AddBiasArgs {
                    x: x.ptr,
                    bias: bp,
                    cols: u32_of(x.cols, "cols")?,
                }
                .values(),
            ),
        )
    }

    pub(crate) fn op_scale(&self, x: &CudaTensor, s: f32) -> Result<(), CudaError> {
        let n = x.rows * x.cols;
        self.launch(
            ops::elementwise::SCALE,
            ops::elementwise::launch(n),
            &args(
                &ops::elementwise::ScaleArgs {
                    x: x.ptr,
                    n: u32_of(n, "scale length")?,
                    s,
                }
                .values(),
            ),
        )
    }

    pub(crate) fn op_add(&self, x: &CudaTensor, y: &CudaTensor) -> Result<(), CudaError> {
        let n = x.rows * x.cols;
        if y.rows * y.cols != n {
            return Err(CudaError::BadLength {
                what: "add operands",
                got: y.rows * y.cols,
                want: n,
            });
        }
        self.launch(
            ops::elementwise::ADD,
            ops::elementwise::launch(n),
            &args(
                &ops::elementwise::AddArgs {
                    x: x.ptr,
                    y: y.ptr,
                    n: u32_of(n, "add length")?,
                }
                .values(),
            ),
        )
    }

    pub(crate) fn op_glu(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        act: Glu,
    ) -> Result<(), CudaError> {
        let n = gate.rows * gate.cols;
        if up.rows * up.cols != n {
            return Err(CudaError::BadLength {
                what: "glu operands",
                got: up.rows * up.cols,
                want: n,
            });
        }
        let act = kernel_glu(act);
        self.launch(
            ops::elementwise::glu_name(act),
            ops::elementwise::launch(n),
            &args(
                &ops::elementwise::GluArgs {
                    gate: gate.ptr,
                    up: up.ptr,
                    n: u32_of(n, "glu length")?,
                }
                .values(),
            ),
        )
    }

    /// Whether [`Self::op_glu_q8`] can run: same shapes, whole 32-value blocks, 16-byte
    /// aligned rows (the kernel loads and stores eight floats per lane in two vectors).
    pub(crate) fn can_glu_quantize(&self, gate: &CudaTensor, up: &CudaTensor) -> bool {
        gate.rows > 0
            && gate.rows == up.rows
            && gate.cols == up.cols
            && gate.cols.is_multiple_of(32)
            && gate.ptr.is_multiple_of(16)
            && up.ptr.is_multiple_of(16)
    }

    /// `gate = act(gate) * up; q = quantize_q8_1(gate)` (or the f16 rows of `gate`, as
    /// `sink` says) in one kernel (the down projection's input and its tiles).
    pub(crate) fn op_glu_q8(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        act: Glu,
        (q, sink): (u64, smelt_kernels::fused::Sink),
    ) -> Result<(), CudaError> {
        let act = kernel_glu(act);
        let k = gate.cols;
        self.launch(
            smelt_kernels::fused::glu_name(act, sink),
            smelt_kernels::fused::glu_q8_launch(gate.rows, k),
            &args(
                &smelt_kernels::fused::GluQ8Args {
                    gate: gate.ptr,
                    up: up.ptr,
                    q,
                    k: u32_of(k, "glu length")?,
                    ntiles: u32_of(k.div_ceil(smelt_kernels::TILE), "glu tiles")?,
                }
                .values(),
            ),
        )
    }

    pub(crate) fn op_rope(
        &self,
        x: &CudaTensor,
        positions: u64,
        head_dim: usize,
        p: &RopeParams,
        freq_factors: u64,
    ) -> Result<(), CudaError> {
        let n_rot = p.n_rot.min(head_dim);
        if head_dim == 0 || !x.cols.is_multiple_of(head_dim) || !n_rot.is_multiple_of(2) {
            return Err(CudaError::BadLength {
                what: "rope head_dim / n_rot",
                got: x.cols,
                want: head_dim,
            });
        }
        let ff = freq_factors;
        let style = kernel_style(p.style);
        self.launch(
            ops::rope::name(style),
            ops::rope::launch(x.rows, x.cols, head_dim, n_rot),
            &args(
                &ops::rope::RopeArgs {
                    x: x.ptr,
                    pos: positions,
                    freq_factors: ff,
                    cols: x.cols as u32,
                    head_dim: head_dim as u32,
                    n_rot: n_rot as u32,
                    theta_scale: ops::rope::theta_scale(p.freq_base, n_rot),
                    freq_scale: p.freq_scale,
                }
                .values(),
            ),
        )
    }

    /// A step's rope of `q` and `k` (head size, rotation, frequency factors' address or 0)
    /// and the KV append of the rotated `k` and `v`, in one launch for every sequence and
    /// token (see `can_rope_kv_rows` in `backend_ops`); with `norm`, each Q and K head
    /// RMS-normalized first (`ops::rope::rope_kv_rows_norm_kernel`).
    pub(crate) fn op_rope_kv_rows(
        &self,
        (q, k, v): (&CudaTensor, &CudaTensor, &CudaTensor),
        (hd, p, freq_factors): (usize, &RopeParams, u64),
        norm: Option<ops::rope::HeadNormArgs>,
        kv: &CudaKv,
        layer: usize,
        s: &StepPtrs,
    ) -> Result<(), CudaError> {
        let (kc, vc) = self.kv_layer(kv, layer, "rope_kv_rows")?;
        let (n_head, n_head_kv) = (q.cols / hd, kv.kv_dim / hd);
        let style = kernel_style(p.style);
        let mut values = ops::rope::RopeKvRowsArgs {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            pos: s.positions,
            freq_factors,
            k_cache: kc,
            v_cache: vc,
            seqs: s.descs,
            block_tables: s.block_tables,
            n_head: u32_of(n_head, "rope_kv_rows heads")?,
            n_head_kv: u32_of(n_head_kv, "rope_kv_rows kv heads")?,
            head_dim: u32_of(hd, "rope_kv_rows head_dim")?,
            block_size: u32_of(kv.block_size, "rope_kv_rows block size")?,
            theta_scale: ops::rope::theta_scale(p.freq_base, hd),
            freq_scale: p.freq_scale,
        }
        .values();
        let name = match norm {
            Some(n) => {
                values.extend(n.values());
                ops::rope::kv_rows_norm_name(style)
            }
            None => ops::rope::kv_rows_name(style),
        };
        self.launch(
            name,
            ops::rope::kv_rows_launch(s.n_seqs, s.max_tokens, n_head, n_head_kv, hd),
            &args(&values),
        )
    }

    /// The device addresses of layer `layer`'s K and V caches.
    pub(super) fn kv_layer(
        &self,
        kv: &CudaKv,
        layer: usize,
        what: &str,
    ) -> Result<(u64, u64), CudaError> {
        match (kv.k.get(layer), kv.v.get(layer)) {
            (Some(kc), Some(vc)) => Ok((self.gpu.ptr(kc), self.gpu.ptr(vc))),
            _ => Err(CudaError::Init(format!(
                "{what}: no layer {layer} in the cache"
            ))),
        }
    }

    /// The greedy token of each row of `logits` (`argmax_rows`: the first largest value,
    /// NaN never chosen) into `out` (`logits.rows` u32 words, in an f32 tensor's memory).
    pub(crate) fn op_argmax(&self, logits: &CudaTensor, out: &CudaTensor) -> Result<(), CudaError> {
        if out.rows * out.cols < logits.rows {
            return Err(CudaError::BadLength {
                what: "argmax output (one word per row)",
                got: out.rows * out.cols,
                want: logits.rows,
            });
        }
        let cols = u32_of(logits.cols, "argmax row")?;
        if let Some(state) = self.argmax_state(logits.rows)? {
            // Each row split over several blocks; `state` holds a word and a counter per
            // row, zero between launches.
            return self.launch(
                ops::sample::ARGMAX_SPLIT,
                ops::sample::split_launch(logits.rows, logits.cols),
                &args(
                    &ops::sample::ArgmaxSplitArgs {
                        x: logits.ptr,
                        out: out.ptr,
                        cols,
                        best: state,
                        counters: state + (ARGMAX_ROWS * 8) as u64,
                    }
                    .values(),
                ),
            );
        }
        self.launch(
            ops::sample::ARGMAX,
            ops::sample::launch(logits.rows),
            &args(
                &ops::sample::ArgmaxArgs {
                    x: logits.ptr,
                    out: out.ptr,
                    cols,
                }
                .values(),
            ),
        )
    }

    /// The split argmax's per-row words and counters (`ARGMAX_ROWS` of each, allocated
    /// once, zero between launches), or None when it is off or `rows` do not fit.
    fn argmax_state(&self, rows: usize) -> Result<Option<u64>, CudaError> {
        if !self.opts.launch.split_argmax || rows > ARGMAX_ROWS {
            return Ok(None);
        }
        let mut st = super::lock(&self.held.argmax_state);
        if st.is_none() {
            // The words (u64), then the counters (u32, in the same zeroed memory).
            *st = Some(self.gpu.zeros::<u64>(ARGMAX_ROWS * 2)?);
        }
        Ok(st.as_ref().map(|b| self.gpu.ptr(b)))
    }

    pub(crate) fn op_embed(
        &self,
        table: &CudaWeight,
        tokens: u64,
        out: &CudaTensor,
    ) -> Result<(), CudaError> {
        let CudaWeight::Embedding { ty, rows, cols, .. } = table else {
            return Err(CudaError::Init("embed: not an embedding table".into()));
        };
        if out.cols != *cols {
            return Err(CudaError::BadLength {
                what: "embedding row",
                got: out.cols,
                want: *cols,
            });
        }
        let row_bytes = ops::embed::row_bytes(*ty, *cols)?;
        self.launch(
            &ops::embed::embed_name(*ty)?,
            ops::embed::launch(out.rows, *cols),
            &args(
                &ops::embed::EmbedArgs {
                    table: table.ptr(),
                    tokens,
                    out: out.ptr,
                    cols: u32_of(*cols, "embedding cols")?,
                    row_bytes: u32_of(row_bytes, "embedding row bytes")?,
                    n_vocab: u32_of(*rows, "vocabulary")?,
                }
                .values(),
            ),
        )
    }
}

/// The kernels' name for a gated activation.
pub(super) fn kernel_glu(act: Glu) -> ops::elementwise::Glu {
    match act {
        Glu::Silu => ops::elementwise::Glu::Silu,
        Glu::Gelu => ops::elementwise::Glu::Gelu,
    }
}

/// The kernels' name for a rope style.
fn kernel_style(style: RopeStyle) -> ops::rope::RopeStyle {
    match style {
        RopeStyle::Normal => ops::rope::RopeStyle::Normal,
        RopeStyle::Neox => ops::rope::RopeStyle::Neox,
    }
}
