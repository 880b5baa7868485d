//! The Gated DeltaNet block (linear attention) of the Qwen3.5/3.6 and Qwen3-Next hybrids, as
//! llama.cpp's `build_layer_attn_linear`: projections to the convolution's q/k/v channels,
//! the output gate `z` and the gate/update logits, then the backend's `delta_net` op (conv,
//! norms, delta rule, gated norm) over each sequence's recurrent state, then `ssm_out`.
//!
//! Projections come split (`attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`: Qwen3.5 and
//! newer Qwen3-Next files) or fused per key-head group (`ssm_in` = `[q, k, v.., z..]` and
//! `ssm_ba` = `[b.., a..]` for each key head: Qwen3-Next); the fused ones are multiplied once
//! and their columns gathered into the split layout.

use std::sync::Arc;

use smelt_gguf::Gguf;

use super::config::DeltaInfo;
use crate::backend::{AttnSeq, Backend, DeltaParams, DeltaState, DeltaWeights};
use crate::EngineError;

/// One delta-net layer's weights.
pub struct DeltaBlock<B: Backend> {
    /// Which of a sequence's delta-net states is this layer's.
    pub index: usize,
    qkvz: Proj<B::Weight>,
    ba: Proj<B::Weight>,
    conv: B::Weight,
    dt_bias: B::Weight,
    a: B::Weight,
    norm: B::Weight,
    out: B::Weight,
    params: DeltaParams,
}

/// Two outputs of one input: two matrices, or one whose columns are gathered into each.
enum Proj<W> {
    Split(W, W),
    Fused {
        w: W,
        first: Vec<u32>,
        second: Vec<u32>,
    },
}

impl<W> Proj<W> {
    fn forward<B: Backend<Weight = W>>(
        &self,
        b: &B,
        x: &B::Tensor,
        widths: (usize, usize),
    ) -> Result<(B::Tensor, B::Tensor), EngineError> {
        let n = b.shape(x).0;
        let (mut p, mut q) = (b.alloc(n, widths.0), b.alloc(n, widths.1));
        match self {
            Proj::Split(w1, w2) => b.matmul_group(&[w1, w2], x, &mut [&mut p, &mut q])?,
            Proj::Fused { w, first, second } => {
                let mut all = b.alloc(n, first.len() + second.len());
                b.matmul(w, x, &mut all)?;
                b.gather_cols(&all, first, &mut p)?;
                b.gather_cols(&all, second, &mut q)?;
            }
        }
        Ok((p, q))
    }
}

/// Two column lists: the first and second output of a fused projection.
type ColumnPair = (Vec<u32>, Vec<u32>);

/// Columns of Qwen3-Next's fused projections, per key-head group `g` of `r = h_v / h_k`
/// value heads: `ssm_in` holds `[q_g, k_g, v_g (r heads), z_g (r heads)]`, `ssm_ba` holds
/// `[b_g (r), a_g (r)]`. Returns (q, k, v in order; z) and (b; a) column lists.
fn fused_columns(d: &DeltaInfo) -> (ColumnPair, ColumnPair) {
    let (s, hk, r) = (d.head_dim, d.n_k_heads, d.n_v_heads / d.n_k_heads);
    let group = 2 * s + 2 * r * s;
    let span = |g: usize, off: usize, len: usize| g * group + off..g * group + off + len;
    let mut qkv: Vec<u32> = Vec::new();
    for part in 0..3 {
        for g in 0..hk {
            let (off, len) = [(0, s), (s, s), (2 * s, r * s)][part];
            qkv.extend(span(g, off, len).map(|c| c as u32));
        }
    }
    let z: Vec<u32> = (0..hk)
        .flat_map(|g| span(g, 2 * s + r * s, r * s).map(|c| c as u32))
        .collect();
    let beta: Vec<u32> = (0..hk)
        .flat_map(|g| (g * 2 * r..g * 2 * r + r).map(|c| c as u32))
        .collect();
    let alpha: Vec<u32> = (0..hk)
        .flat_map(|g| (g * 2 * r + r..g * 2 * r + 2 * r).map(|c| c as u32))
        .collect();
    ((qkv, z), (beta, alpha))
}

impl<B: Backend> DeltaBlock<B> {
    /// Loads `blk.{il}.attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`, `ssm_conv1d`,
    /// `ssm_dt.bias`, `ssm_a`, `ssm_norm` and `ssm_out` (Qwen3.5's split layout).
    pub fn load(
        b: &B,
        gguf: &Arc<Gguf>,
        il: usize,
        index: usize,
        n_embd: usize,
        d: &DeltaInfo,
        eps: f32,
    ) -> Result<Self, EngineError> {
        let need = |name: String, want: Vec<u64>| -> Result<B::Weight, EngineError> {
            let t = gguf
                .tensor(&name)
                .ok_or_else(|| EngineError::MissingTensor(name.clone()))?;
            if t.shape != want {
                return Err(EngineError::BadShape {
                    name,
                    got: t.shape.clone(),
                    want,
                });
            }
            b.load_weight(gguf, &name)
        };
        // Two matrices of one input, loaded as a group (`Backend::matmul_group`).
        let pair = |a: String, wa: Vec<u64>, c: String, wc: Vec<u64>| {
            for (name, want) in [(&a, wa), (&c, wc)] {
                let t = gguf
                    .tensor(name)
                    .ok_or_else(|| EngineError::MissingTensor(name.clone()))?;
                if t.shape != want {
                    return Err(EngineError::BadShape {
                        name: name.clone(),
                        got: t.shape.clone(),
                        want,
                    });
                }
            }
            let mut ws = b.load_weight_group(gguf, &[&a, &c])?;
            match (ws.pop(), ws.pop()) {
                (Some(second), Some(first)) => Ok(Proj::Split(first, second)),
                _ => Err(EngineError::MissingTensor(a)),
            }
        };
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let (e, ch, vd, hv) = (
            n_embd as u64,
            d.conv_channels() as u64,
            d.value_dim() as u64,
            d.n_v_heads as u64,
        );
        let ((qkv_cols, z_cols), (b_cols, a_cols)) = fused_columns(d);
        let qkvz = if gguf.tensor(&n("ssm_in")).is_some() {
            Proj::Fused {
                w: need(n("ssm_in"), vec![e, ch + vd])?,
                first: qkv_cols,
                second: z_cols,
            }
        } else {
            pair(n("attn_qkv"), vec![e, ch], n("attn_gate"), vec![e, vd])?
        };
        let ba = if gguf.tensor(&n("ssm_ba")).is_some() {
            Proj::Fused {
                w: need(n("ssm_ba"), vec![e, 2 * hv])?,
                first: b_cols,
                second: a_cols,
            }
        } else {
            pair(n("ssm_beta"), vec![e, hv], n("ssm_alpha"), vec![e, hv])?
        };
        Ok(DeltaBlock {
            index,
            qkvz,
            ba,
            conv: need(n("ssm_conv1d"), vec![d.conv_kernel as u64, ch])?,
            dt_bias: need(format!("blk.{il}.ssm_dt.bias"), vec![hv])?,
            a: need(format!("blk.{il}.ssm_a"), vec![hv])?,
            norm: need(n("ssm_norm"), vec![d.head_dim as u64])?,
            out: need(n("ssm_out"), vec![vd, e])?,
            params: DeltaParams {
                conv_kernel: d.conv_kernel,
                head_dim: d.head_dim,
                n_k_heads: d.n_k_heads,
                n_v_heads: d.n_v_heads,
                eps,
                grouped_heads: d.grouped_heads,
            },
        })
    }

    /// A fresh (zero) state for one sequence.
    pub fn new_state(b: &B, d: &DeltaInfo) -> DeltaState<B::Tensor> {
        DeltaState {
            conv: b.alloc(d.conv_kernel - 1, d.conv_channels()),
            ssm: b.alloc(d.n_v_heads * d.head_dim, d.head_dim),
        }
    }

    /// `out = ssm_out(delta_net(x))` for every sequence of the batch.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        seqs: &[AttnSeq<'_>],
        states: &mut [&mut DeltaState<B::Tensor>],
        out: &mut B::Tensor,
    ) -> Result<(), EngineError> {
        let n = b.shape(x).0;
        let p = &self.params;
        let ch = (2 * p.n_k_heads + p.n_v_heads) * p.head_dim;
        let vd = p.n_v_heads * p.head_dim;
        let (qkv, z) = self.qkvz.forward(b, x, (ch, vd))?;
        let (beta, alpha) = self.ba.forward(b, x, (p.n_v_heads, p.n_v_heads))?;
        let w = DeltaWeights {
            conv: &self.conv,
            dt_bias: &self.dt_bias,
            a: &self.a,
            norm: &self.norm,
        };
        let mut o = b.alloc(n, vd);
        b.delta_net(p, &w, &qkv, &z, &alpha, &beta, seqs, states, &mut o)?;
        b.matmul(&self.out, &o, out)
    }
}
