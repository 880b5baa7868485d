//! The Gated DeltaNet block (linear attention) of the Qwen3.5/3.6 and Qwen3-Next hybrids, as
//! llama.cpp's `build_layer_attn_linear`: projections to the convolution's q/k/v channels,
//! the output gate `z` and the gate/update logits, then the backend's `delta_net` op (conv,
//! norms, delta rule, gated norm) over each sequence's recurrent state, then `ssm_out`.

use std::sync::Arc;

use smelt_gguf::Gguf;

use super::config::DeltaInfo;
use crate::backend::{AttnSeq, Backend, DeltaParams, DeltaState, DeltaWeights};
use crate::EngineError;

/// One delta-net layer's weights.
pub struct DeltaBlock<B: Backend> {
    /// Which of a sequence's delta-net states is this layer's.
    pub index: usize,
    wqkv: B::Weight,
    wgate: B::Weight,
    wbeta: B::Weight,
    walpha: B::Weight,
    conv: B::Weight,
    dt_bias: B::Weight,
    a: B::Weight,
    norm: B::Weight,
    out: B::Weight,
    params: DeltaParams,
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
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let (e, ch, vd, hv) = (
            n_embd as u64,
            d.conv_channels() as u64,
            d.value_dim() as u64,
            d.n_v_heads as u64,
        );
        Ok(DeltaBlock {
            index,
            wqkv: need(n("attn_qkv"), vec![e, ch])?,
            wgate: need(n("attn_gate"), vec![e, vd])?,
            wbeta: need(n("ssm_beta"), vec![e, hv])?,
            walpha: need(n("ssm_alpha"), vec![e, hv])?,
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
        let mut qkv = b.alloc(n, ch);
        let mut z = b.alloc(n, vd);
        let mut beta = b.alloc(n, p.n_v_heads);
        let mut alpha = b.alloc(n, p.n_v_heads);
        b.matmul(&self.wqkv, x, &mut qkv)?;
        b.matmul(&self.wgate, x, &mut z)?;
        b.matmul(&self.wbeta, x, &mut beta)?;
        b.matmul(&self.walpha, x, &mut alpha)?;
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
