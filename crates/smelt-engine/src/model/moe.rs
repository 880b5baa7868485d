//! The mixture-of-experts feed-forward block, shared by every architecture that has one
//! (`qwen3moe`, Mixtral-style `llama`), as llama.cpp's `build_moe_ffn`: a router picks each
//! token's experts, every selected expert of the step runs in one grouped matmul per
//! projection (gate, up, down), and the outputs are summed with the router's weights.

use std::sync::Arc;

use smelt_gguf::Gguf;

use super::config::MoeInfo;
use crate::backend::{Backend, Glu, MoeRouting};
use crate::EngineError;

/// One layer's router and experts.
pub struct MoeFfn<B: Backend> {
    /// `ffn_gate_inp`: `[n_expert, n_embd]`.
    router: B::Weight,
    /// `ffn_gate_exps` / `ffn_up_exps`: `n_expert` x `[n_ff_exp, n_embd]`.
    gate: B::Weight,
    up: B::Weight,
    /// `ffn_down_exps`: `n_expert` x `[n_embd, n_ff_exp]`.
    down: B::Weight,
    routing: MoeRouting,
    n_expert: usize,
    n_ff: usize,
}

impl<B: Backend> MoeFfn<B> {
    /// Loads layer `il`'s `blk.{il}.ffn_{gate_inp,gate_exps,up_exps,down_exps}.weight`,
    /// checking their shapes against the metadata.
    pub fn load(
        b: &B,
        gguf: &Arc<Gguf>,
        il: usize,
        n_embd: usize,
        m: &MoeInfo,
    ) -> Result<Self, EngineError> {
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        let check = |n: &str, want: Vec<u64>| -> Result<(), EngineError> {
            let t = gguf
                .tensor(n)
                .ok_or_else(|| EngineError::MissingTensor(n.into()))?;
            if t.shape != want {
                return Err(EngineError::BadShape {
                    name: n.into(),
                    got: t.shape.clone(),
                    want,
                });
            }
            Ok(())
        };
        let (e, ff, ne) = (n_embd as u64, m.n_ff_exp as u64, m.n_expert as u64);
        let router = name("ffn_gate_inp");
        check(&router, vec![e, ne])?;
        let exps = |s: &str, want: Vec<u64>| -> Result<B::Weight, EngineError> {
            let n = name(s);
            check(&n, want)?;
            b.load_experts(gguf, &n)
        };
        Ok(MoeFfn {
            router: b.load_weight(gguf, &router)?,
            gate: exps("ffn_gate_exps", vec![e, ff, ne])?,
            up: exps("ffn_up_exps", vec![e, ff, ne])?,
            down: exps("ffn_down_exps", vec![ff, e, ne])?,
            routing: MoeRouting {
                gating: m.gating,
                k: m.n_expert_used,
                norm: m.norm_weights,
                scale: m.weights_scale,
            },
            n_expert: m.n_expert,
            n_ff: m.n_ff_exp,
        })
    }

    /// `out = sum over x's chosen experts of weight * down(silu(gate x) * up x)`.
    pub fn forward(&self, b: &B, x: &B::Tensor, out: &mut B::Tensor) -> Result<(), EngineError> {
        let n = b.shape(x).0;
        let k = self.routing.k;
        let mut logits = b.alloc(n, self.n_expert);
        b.matmul(&self.router, x, &mut logits)?;
        let mut route = b.alloc(n, 2 * k);
        b.moe_route(&logits, &self.routing, &mut route)?;
        let mut up = b.alloc(n * k, self.n_ff);
        let mut gate = b.alloc(n * k, self.n_ff);
        b.matmul_id(&self.up, x, &route, &mut up)?;
        b.matmul_id(&self.gate, x, &route, &mut gate)?;
        b.glu(&mut gate, &up, Glu::Silu);
        let mut down = b.alloc(n * k, b.shape(x).1);
        b.matmul_id(&self.down, &gate, &route, &mut down)?;
        b.moe_combine(&down, &route, out)
    }
}
