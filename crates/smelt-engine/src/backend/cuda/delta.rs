//! The hybrid models' ops on the CUDA backend (Qwen3.5/3.6, Qwen3-Next: Gated DeltaNet
//! layers beside gated attention, shared experts), launching `smelt_kernels::delta_net`:
//!
//! - the delta-net layer between its projections ([`Cuda::op_delta_net`]): convolution +
//!   SiLU, q/k L2 norms, the delta rule over each sequence's tokens (token by token, or in
//!   chunks of 64 when the step's longest sequence has `delta_chunk_min_tokens`), the gated
//!   output norm;
//! - gathered columns (Qwen3-Next's fused projections), split halves (a gated Q, a fused
//!   expert gate|up) and the sigmoid gate (attention output, shared expert).
//!
//! Each sequence's recurrent state is one block of device memory ([`SeqState`]) holding
//! every delta-net layer's conv window and delta matrices, owned by the engine's sequence
//! and freed with it. The kernels find a sequence's block through the step buffer's state
//! addresses (`Cuda::set_state_addrs`) plus the layer's fixed offset in the block, so a
//! decode step of any sequences is captured once and replayed.

use std::collections::HashMap;

use smelt_cuda::cudarc::driver::CudaSlice;
use smelt_cuda::CudaError;
use smelt_kernels::delta_chunk as dc;
use smelt_kernels::delta_net as dn;

use super::ops::{args, u32_of};
use super::{lock, Cuda, CudaTensor, CudaWeight};
use crate::backend::{AttnSeq, DeltaParams, DeltaState, DeltaWeights};
use crate::model::DeltaInfo;
use crate::EngineError;

/// Column lists of gathers already on the device, by content (a fused projection's
/// columns are the same every step: uploaded once, at the first, eager, step).
pub(super) type ColumnCache = HashMap<Vec<u32>, CudaSlice<u32>>;

/// One sequence's recurrent state on the device: every delta-net layer's conv window
/// (`[kernel - 1][channels]`) then delta matrices (`[n_v_heads * head_dim][head_dim]`),
/// layer after layer, zero at the start.
pub struct SeqState {
    _buf: CudaSlice<f32>,
    /// Its address (the first layer's window).
    pub addr: u64,
    /// Per delta-net layer, tensors into the block (the model's view).
    pub layers: Vec<DeltaState<CudaTensor>>,
}

/// Floats of one delta-net layer's state: (window, matrices).
fn layer_floats(d: &DeltaInfo) -> (usize, usize) {
    (
        (d.conv_kernel - 1) * d.conv_channels(),
        d.n_v_heads * d.head_dim * d.head_dim,
    )
}

/// Bytes of one sequence's state for a model with `d` (all its delta-net layers).
pub fn state_bytes(d: &DeltaInfo) -> usize {
    let (w, m) = layer_floats(d);
    let n = d.recurrent.iter().filter(|&&r| r).count();
    4 * n * (w + m)
}

/// Whether the kernels take this shape; the reason when they do not.
pub fn check_shape(d: &DeltaInfo) -> Result<(), EngineError> {
    if d.conv_kernel != dn::CONV_TAPS {
        return Err(EngineError::NotSupported(format!(
            "a delta-net convolution of {} taps on cuda (the kernel has {})",
            d.conv_kernel,
            dn::CONV_TAPS
        )));
    }
    if !dn::HEAD_DIMS.contains(&d.head_dim) {
        return Err(EngineError::NotSupported(format!(
            "delta-net heads of {} on cuda (the kernels take {:?})",
            d.head_dim,
            dn::HEAD_DIMS
        )));
    }
    if d.n_k_heads == 0 || !d.n_v_heads.is_multiple_of(d.n_k_heads) {
        return Err(EngineError::BadMetadata {
            key: "ssm.time_step_rank".into(),
            why: format!("{} value heads over {} key heads", d.n_v_heads, d.n_k_heads),
        });
    }
    Ok(())
}

impl Cuda {
    /// A fresh (zero) recurrent state for one sequence of a model with `d`.
    pub fn new_seq_state(&self, d: &DeltaInfo) -> Result<SeqState, EngineError> {
        let (w, m) = layer_floats(d);
        let n = d.recurrent.iter().filter(|&&r| r).count();
        let buf = self.gpu.zeros::<f32>((n * (w + m)).max(1))?;
        let addr = self.gpu.ptr(&buf);
        let t = |ptr: u64, rows: usize, cols: usize| CudaTensor {
            ptr,
            rows,
            cols,
            cap: rows * cols,
        };
        let layers = (0..n)
            .map(|i| {
                let at = addr + (4 * i * (w + m)) as u64;
                DeltaState {
                    conv: t(at, d.conv_kernel - 1, d.conv_channels()),
                    ssm: t(at + 4 * w as u64, d.n_v_heads * d.head_dim, d.head_dim),
                }
            })
            .collect();
        Ok(SeqState {
            _buf: buf,
            addr,
            layers,
        })
    }

    /// `out[t][j] = x[t][cols[j]]`.
    pub(super) fn op_gather_cols(
        &self,
        x: &CudaTensor,
        cols: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        if let Some(&c) = cols.iter().find(|&&c| c as usize >= x.cols) {
            return Err(CudaError::BadLength {
                what: "gathered column",
                got: c as usize,
                want: x.cols,
            });
        }
        self.ensure(out, x.rows, cols.len())?;
        let n = x.rows * cols.len();
        if n == 0 {
            return Ok(());
        }
        let mut cache = lock(&self.held.columns);
        if !cache.contains_key(cols) {
            let d = self.gpu.upload(cols)?;
            cache.insert(cols.to_vec(), d);
        }
        let dev = cache
            .get(cols)
            .map(|d| self.gpu.ptr(d))
            .ok_or_else(|| CudaError::Init("column list vanished".into()))?;
        drop(cache);
        self.launch(
            dn::GATHER_COLS,
            dn::flat_launch(n),
            &args(
                &dn::GatherArgs {
                    x: x.ptr,
                    out: out.ptr,
                    cols: dev,
                    n: u32_of(n, "gather outputs")?,
                    n_cols: u32_of(cols.len(), "gathered columns")?,
                    x_cols: u32_of(x.cols, "gather input columns")?,
                }
                .values(),
            ),
        )
    }

    /// Rows of `[first (width), second (width)]` chunks into `a` and `b`.
    pub(super) fn op_split_halves(
        &self,
        x: &CudaTensor,
        width: usize,
        a: &mut CudaTensor,
        b: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        if width == 0 || !x.cols.is_multiple_of(2 * width) {
            return Err(CudaError::BadLength {
                what: "split row (not whole [first, second] chunks)",
                got: x.cols,
                want: 2 * width,
            });
        }
        let half = x.cols / 2;
        self.ensure(a, x.rows, half)?;
        self.ensure(b, x.rows, half)?;
        let n = x.rows * half;
        if n == 0 {
            return Ok(());
        }
        self.launch(
            dn::SPLIT_HALVES,
            dn::flat_launch(n),
            &args(
                &dn::SplitArgs {
                    x: x.ptr,
                    a: a.ptr,
                    b: b.ptr,
                    n: u32_of(n, "split outputs")?,
                    width: u32_of(width, "split width")?,
                }
                .values(),
            ),
        )
    }

    /// `x *= sigmoid(gate)`, a one-column gate scaling its whole row.
    pub(super) fn op_mul_sigmoid(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
    ) -> Result<(), CudaError> {
        let per_row = gate.cols == 1 && x.cols != 1;
        let want = if per_row { x.rows } else { x.rows * x.cols };
        if gate.rows * gate.cols != want {
            return Err(CudaError::BadLength {
                what: "sigmoid gate",
                got: gate.rows * gate.cols,
                want,
            });
        }
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        self.launch(
            dn::MUL_SIGMOID,
            dn::flat_launch(n),
            &args(
                &dn::MulSigmoidArgs {
                    x: x.ptr,
                    g: gate.ptr,
                    n: u32_of(n, "gated outputs")?,
                    cols: u32_of(x.cols.max(1), "gated columns")?,
                    per_row: u32::from(per_row),
                }
                .values(),
            ),
        )
    }

    /// A delta-net layer between its projections (`Backend::delta_net`) over the step's
    /// sequences, whose states `states` are (in order) the blocks at the step buffer's
    /// state addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn op_delta_net(
        &self,
        p: &DeltaParams,
        w: &DeltaWeights<'_, CudaWeight>,
        qkv: &CudaTensor,
        z: &CudaTensor,
        alpha: &CudaTensor,
        beta: &CudaTensor,
        seqs: &[AttnSeq<'_>],
        states: &[&mut DeltaState<CudaTensor>],
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let s = self.step_ptrs()?;
        let addrs = self.state_addrs_host();
        if seqs.len() != s.n_seqs || states.len() != seqs.len() || addrs.len() != seqs.len() {
            return Err(CudaError::BadLength {
                what: "delta-net sequences / states / state addresses (not the step's)",
                got: states.len(),
                want: s.n_seqs,
            });
        }
        let (sd, hk, hv) = (p.head_dim, p.n_k_heads, p.n_v_heads);
        let (kw, vd) = (hk * sd, hv * sd);
        let ch = 2 * kw + vd;
        let n = qkv.rows;
        if qkv.cols != ch || z.cols != vd || alpha.cols != hv || beta.cols != hv {
            return Err(CudaError::BadLength {
                what: "delta-net inputs",
                got: qkv.cols,
                want: ch,
            });
        }
        if z.rows != n || alpha.rows != n || beta.rows != n || s.n_tokens != n {
            return Err(CudaError::BadLength {
                what: "delta-net input rows",
                got: n,
                want: s.n_tokens,
            });
        }
        // Every state is at the same offset in its sequence's block.
        let off = |t: &CudaTensor, base: u64| t.ptr.checked_sub(base);
        let conv_off = off(&states[0].conv, addrs[0]);
        let ssm_off = off(&states[0].ssm, addrs[0]);
        let same = states
            .iter()
            .zip(&addrs)
            .all(|(st, &a)| off(&st.conv, a) == conv_off && off(&st.ssm, a) == ssm_off);
        let (Some(conv_off), Some(ssm_off), true) = (conv_off, ssm_off, same) else {
            return Err(CudaError::Init(
                "delta-net states are not at the step's state addresses".into(),
            ));
        };
        let vec = |w: &CudaWeight, len: usize, what: &'static str| match w {
            CudaWeight::Vector { ptr, len: l } if *l == len => Ok(*ptr),
            _ => Err(CudaError::BadLength {
                what,
                got: 0,
                want: len,
            }),
        };
        let conv_w = vec(w.conv, ch * dn::CONV_TAPS, "ssm_conv1d (f32 [channels][4])")?;
        let dt = vec(w.dt_bias, hv, "ssm_dt.bias")?;
        let a = vec(w.a, hv, "ssm_a")?;
        let norm = vec(w.norm, sd, "ssm_norm")?;
        self.ensure(out, n, vd)?;
        if n == 0 {
            return Ok(());
        }
        let conv = self.scratch(n * ch * 4)?;
        let n_seqs = seqs.len();
        self.launch(
            dn::CONV1D,
            dn::conv1d_launch(ch, n_seqs),
            &args(
                &dn::ConvArgs {
                    x: qkv.ptr,
                    out: conv,
                    w: conv_w,
                    windows: s.state_addrs,
                    seqs: s.descs,
                    ch: u32_of(ch, "conv channels")?,
                    state_off: u32_of(conv_off as usize, "state offset")?,
                }
                .values(),
            ),
        )?;
        self.launch(
            dn::L2_NORM,
            dn::norm_launch(n * 2 * hk),
            &args(
                &dn::L2Args {
                    x: conv,
                    n_chunks: u32_of(n * 2 * hk, "q/k heads")?,
                    width: sd as u32,
                    eps: p.eps,
                    per_row: (2 * hk) as u32,
                    row_stride: ch as u32,
                }
                .values(),
            ),
        )?;
        let longest = seqs.iter().map(|q| q.n_tokens).max().unwrap_or(0);
        if longest >= self.opts.attention.delta_chunk_min_tokens {
            let chunks = longest.div_ceil(dc::CHUNK);
            let scratch = self.scratch(dc::scratch_bytes(n_seqs, n, hv))?;
            let (hk32, hv32) = (hk as u32, hv as u32);
            self.launch(
                dc::prep_name(sd),
                dc::prep_launch(hv, chunks, n_seqs),
                &args(
                    &dc::PrepArgs {
                        q: conv,
                        k: conv + (4 * kw) as u64,
                        alpha: alpha.ptr,
                        beta: beta.ptr,
                        dt_bias: dt,
                        a,
                        scratch,
                        seqs: s.descs,
                        h_k: hk32,
                        h_v: hv32,
                        grouped: u32::from(p.grouped_heads),
                        stride: ch as u32,
                    }
                    .values(),
                ),
            )?;
            self.launch(
                dc::chunk_name(sd),
                dc::chunk_launch(sd, hv, n_seqs),
                &args(
                    &dc::ChunkArgs {
                        q: conv,
                        k: conv + (4 * kw) as u64,
                        v: conv + (8 * kw) as u64,
                        alpha: alpha.ptr,
                        beta: beta.ptr,
                        dt_bias: dt,
                        a,
                        scratch,
                        out: out.ptr,
                        states: s.state_addrs,
                        seqs: s.descs,
                        h_k: hk32,
                        h_v: hv32,
                        grouped: u32::from(p.grouped_heads),
                        stride: ch as u32,
                        state_off: u32_of(ssm_off as usize, "state offset")?,
                    }
                    .values(),
                ),
            )?;
        } else {
            self.launch(
                dn::step_name(sd),
                dn::step_launch(sd, hv, n_seqs),
                &args(
                    &dn::StepArgs {
                        q: conv,
                        k: conv + (4 * kw) as u64,
                        v: conv + (8 * kw) as u64,
                        alpha: alpha.ptr,
                        beta: beta.ptr,
                        dt_bias: dt,
                        a,
                        out: out.ptr,
                        states: s.state_addrs,
                        seqs: s.descs,
                        h_k: hk as u32,
                        h_v: hv as u32,
                        grouped: u32::from(p.grouped_heads),
                        stride: ch as u32,
                        state_off: u32_of(ssm_off as usize, "state offset")?,
                    }
                    .values(),
                ),
            )?;
        }
        self.launch(
            dn::GATED_NORM,
            dn::norm_launch(n * hv),
            &args(
                &dn::GatedNormArgs {
                    o: out.ptr,
                    w: norm,
                    z: z.ptr,
                    n_chunks: u32_of(n * hv, "value heads")?,
                    width: sd as u32,
                    eps: p.eps,
                }
                .values(),
            ),
        )
    }
}
