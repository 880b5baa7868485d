//! The mixture-of-experts feed-forward block, shared by every architecture that has one
//! (`qwen3moe`, Mixtral-style `llama`, `qwen35moe`), as llama.cpp's `build_moe_ffn`: a router
//! picks each token's experts, every selected expert of the step runs in one grouped matmul
//! per projection (gate and up, or both fused in `ffn_gate_up_exps`; down), and the outputs
//! are summed with the router's weights. A shared expert, where the model has one, adds
//! `sigmoid(x . ffn_gate_inp_shexp) * ffn_shexp(x)`.

use std::sync::Arc;

use smelt_gguf::Gguf;

use super::config::MoeInfo;
use crate::backend::{Backend, Glu, MoeRouting};
use crate::EngineError;

/// One layer's router and experts.
pub struct MoeFfn<B: Backend> {
    /// `ffn_gate_inp`: `[n_expert, n_embd]`.
    router: B::Weight,
    /// `ffn_gate_exps` / `ffn_up_exps`: `n_expert` x `[n_ff_exp, n_embd]`, or both in
    /// `ffn_gate_up_exps` (`n_expert` x `[2 n_ff_exp, n_embd]`, gate rows first).
    gate_up: GateUp<B::Weight>,
    /// `ffn_down_exps`: `n_expert` x `[n_embd, n_ff_exp]`.
    down: B::Weight,
    routing: MoeRouting,
    n_ff: usize,
    shared: Option<Shared<B::Weight>>,
}

enum GateUp<W> {
    Split { gate: W, up: W },
    Fused(W),
}

/// The always-on shared expert and its gate.
struct Shared<W> {
    /// `ffn_gate_inp_shexp`: `[n_embd]` (or `[n_embd, 1]`), one logit per token.
    gate_inp: W,
    gate: W,
    up: W,
    down: W,
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
        let gate_up = if gguf.tensor(&name("ffn_gate_up_exps")).is_some() {
            GateUp::Fused(exps("ffn_gate_up_exps", vec![e, 2 * ff, ne])?)
        } else {
            GateUp::Split {
                gate: exps("ffn_gate_exps", vec![e, ff, ne])?,
                up: exps("ffn_up_exps", vec![e, ff, ne])?,
            }
        };
        let shared = match gguf.tensor(&name("ffn_up_shexp")) {
            None => None,
            Some(t) => {
                let sf = t.shape.get(1).copied().unwrap_or(0);
                if m.n_ff_shared != 0 && sf != m.n_ff_shared as u64 {
                    return Err(EngineError::BadShape {
                        name: name("ffn_up_shexp"),
                        got: t.shape.clone(),
                        want: vec![e, m.n_ff_shared as u64],
                    });
                }
                let mat = |s: &str, want: Vec<u64>| -> Result<B::Weight, EngineError> {
                    let n = name(s);
                    check(&n, want)?;
                    b.load_weight(gguf, &n)
                };
                // convert writes HF's `[1, n_embd]` gate as ggml `[n_embd, 1]`, which
                // llama.cpp reads as `{n_embd}` (trailing ones do not count); synth writes
                // `[n_embd]`.
                let gn = name("ffn_gate_inp_shexp");
                let gate_inp = match gguf.tensor(&gn).map(|t| t.shape.as_slice()) {
                    Some(&[n, 1]) if n == e => b.load_weight(gguf, &gn)?,
                    _ => mat("ffn_gate_inp_shexp", vec![e])?,
                };
                // Gate and up multiply one input: a group (`Backend::matmul_group`).
                let (gn, un) = (name("ffn_gate_shexp"), name("ffn_up_shexp"));
                check(&gn, vec![e, sf])?;
                check(&un, vec![e, sf])?;
                let mut gu = b.load_weight_group(gguf, &[&gn, &un])?;
                let (Some(up), Some(gate)) = (gu.pop(), gu.pop()) else {
                    return Err(EngineError::MissingTensor(gn));
                };
                Some(Shared {
                    gate_inp,
                    gate,
                    up,
                    down: mat("ffn_down_shexp", vec![sf, e])?,
                    n_ff: sf as usize,
                })
            }
        };
        Ok(MoeFfn {
            router: b.load_weight(gguf, &router)?,
            gate_up,
            down: exps("ffn_down_exps", vec![ff, e, ne])?,
            shared,
            routing: MoeRouting {
                gating: m.gating,
                k: m.n_expert_used,
                norm: m.norm_weights,
                scale: m.weights_scale,
            },
            n_ff: m.n_ff_exp,
        })
    }

    /// `out = sum over x's chosen experts of weight * down(silu(gate x) * up x)`.
    pub fn forward(&self, b: &B, x: &B::Tensor, out: &mut B::Tensor) -> Result<(), EngineError> {
        let n = b.shape(x).0;
        let (down, route) = self.experts(b, x)?;
        b.moe_combine(&down, &route, out)?;
        if let Some(s) = &self.shared {
            let mut g = b.alloc(n, s.n_ff);
            let mut u = b.alloc(n, s.n_ff);
            b.matmul_group(&[&s.gate, &s.up], x, &mut [&mut g, &mut u])?;
            b.glu(&mut g, &u, Glu::Silu);
            let mut y = b.alloc(n, b.shape(x).1);
            b.matmul(&s.down, &g, &mut y)?;
            let mut logit = b.alloc(n, 1);
            b.matmul(&s.gate_inp, x, &mut logit)?;
            b.mul_sigmoid(&mut y, &logit)?;
            b.add(out, &y);
        }
        Ok(())
    }

    /// Whether [`MoeFfn::forward_add_norm`] computes what `forward`, the residual add and
    /// the next norm compute: without a shared expert, whose output joins the combine's
    /// before the residual (llama.cpp's order of the adds).
    pub fn joins_residual(&self) -> bool {
        self.shared.is_none()
    }

    /// `res += forward(x)`, then `out = rms_norm(res) * w` (the next layer's norm), through
    /// [`Backend::moe_combine_add_norm`]: one kernel for the three on the CUDA backend at
    /// decode. Only where [`MoeFfn::joins_residual`].
    pub fn forward_add_norm(
        &self,
        b: &B,
        x: &B::Tensor,
        res: &mut B::Tensor,
        w: &B::Weight,
        eps: f32,
        out: &mut B::Tensor,
    ) -> Result<(), EngineError> {
        if !self.joins_residual() {
            return Err(EngineError::BadOptions(
                "forward_add_norm of a MoE block with a shared expert".into(),
            ));
        }
        let (down, route) = self.experts(b, x)?;
        b.moe_combine_add_norm(&down, &route, res, w, eps, out)
    }

    /// The router and the experts: `(down, route)`, each token's `k` experts' outputs
    /// (`[n * k, n_embd]`) and the route they are combined with.
    fn experts(&self, b: &B, x: &B::Tensor) -> Result<(B::Tensor, B::Tensor), EngineError> {
        let n = b.shape(x).0;
        let k = self.routing.k;
        let mut route = b.alloc(n, 2 * k);
        b.moe_router(&self.router, x, &self.routing, &mut route)?;
        let mut up = b.alloc(n * k, self.n_ff);
        let mut gate = b.alloc(n * k, self.n_ff);
        match &self.gate_up {
            GateUp::Split { gate: wg, up: wu } => {
                b.matmul_id_pair([wu, wg], x, &route, [&mut up, &mut gate])?;
            }
            GateUp::Fused(w) => {
                let mut both = b.alloc(n * k, 2 * self.n_ff);
                b.matmul_id(w, x, &route, &mut both)?;
                b.split_gated_q(&both, self.n_ff, &mut gate, &mut up)?;
            }
        }
        b.glu(&mut gate, &up, Glu::Silu);
        let mut down = b.alloc(n * k, b.shape(x).1);
        b.matmul_id(&self.down, &gate, &route, &mut down)?;
        Ok((down, route))
    }
}
