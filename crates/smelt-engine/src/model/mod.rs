//! The transformer, written once against [`Backend`]: the Llama family (Llama, Qwen2,
//! Qwen3) and Gemma 3 differ only in which optional tensors a layer has and in a few
//! hyperparameters, so one forward pass covers them all, following llama.cpp's graphs
//! (`llm_build_llama`, `llm_build_qwen2`, `llm_build_qwen3`, `llm_build_gemma3_iswa`).
//! Qwen3-MoE (`qwen3moe`) is Qwen3's attention over the shared mixture-of-experts block
//! ([`moe`]); a `llama` file with `expert_count` (Mixtral) takes the same block. Qwen3.5
//! (`qwen35`) mixes Gated DeltaNet layers ([`delta`], a recurrent state per sequence) with
//! gated attention layers (a sigmoid gate per head on the attention output).

pub mod config;
pub mod delta;
pub mod moe;

use std::sync::Arc;

use smelt_gguf::Gguf;

use crate::backend::{
    AttnParams, AttnSeq, Backend, DeltaState, Glu, HeadNorms, RopeAt, RopeParams,
};
use crate::EngineError;
pub use config::{Arch, DeltaInfo, ModelInfo, MoeInfo};
use delta::DeltaBlock;
use moe::MoeFfn;

/// A layer's token mixer.
enum Mixer<B: Backend> {
    Attn(Attn<B>),
    Delta(DeltaBlock<B>),
}

/// Self-attention weights.
struct Attn<B: Backend> {
    /// With `attn_gate`, rows of `[q, gate]` per head.
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    bq: Option<B::Weight>,
    bk: Option<B::Weight>,
    bv: Option<B::Weight>,
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
}

/// A layer's feed-forward block.
enum Ffn<B: Backend> {
    /// `down(act(gate x) * up x)`.
    Dense {
        gate: B::Weight,
        up: B::Weight,
        down: B::Weight,
    },
    /// Routed experts.
    Moe(MoeFfn<B>),
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    mixer: Mixer<B>,
    post_attn_norm: Option<B::Weight>,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
    post_ffn_norm: Option<B::Weight>,
}

/// What a forward pass ends with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Head {
    /// The output matrix: one row of vocabulary logits per row asked for.
    Logits,
    /// The final norm's output (the hidden state embeddings are pooled from).
    Hidden,
}

/// The sum over the ranks of a tensor-parallel group, in place: every rank passes its
/// partial tensor and gets the same total back.
pub trait AllReduce<B: Backend>: Send + Sync {
    fn all_reduce(&self, b: &B, x: &mut B::Tensor) -> Result<(), EngineError>;

    /// `o` summed over the ranks (as [`Self::all_reduce`]), then `x += o` and
    /// `out = rms_norm(x) * w`: a row-parallel layer's output joining the residual stream,
    /// and the next block's norm. One op, so that a backend can run it as one kernel (the
    /// CUDA backend's peer all-reduce fused with the add, the norm and the next matmul's
    /// q8_1 input, `smelt_kernels::allreduce_norm`); this default is the three ops. `o`
    /// holds the sum afterwards, as after `all_reduce`.
    fn all_reduce_add_norm(
        &self,
        b: &B,
        o: &mut B::Tensor,
        x: &mut B::Tensor,
        w: &B::Weight,
        eps: f32,
        out: &mut B::Tensor,
    ) -> Result<(), EngineError> {
        self.all_reduce(b, o)?;
        b.add(x, o);
        b.rms_norm(x, w, eps, out);
        Ok(())
    }

    /// The columns of every rank put side by side: `part` holds this rank's columns
    /// `start..start + part.cols` of a `total`-column tensor (the same rows on every rank);
    /// every rank gets the whole tensor (a vocabulary-parallel head's logits).
    fn gather_cols(
        &self,
        b: &B,
        part: &B::Tensor,
        start: usize,
        total: usize,
    ) -> Result<B::Tensor, EngineError>;
}

/// A model's weights on a backend.
pub struct Model<B: Backend> {
    pub info: ModelInfo,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    output: B::Weight,
    /// A tensor-parallel rank's slice of a vocabulary-parallel head: the first vocabulary
    /// row `output` holds and how many (`None`: the whole vocabulary).
    vocab_slice: Option<(usize, usize)>,
    rope_freqs: Option<B::Weight>,
    layers: Vec<Layer<B>>,
}

/// Scratch activations of one forward pass, reused by every layer.
struct Scratch<T> {
    h: T,
    q: T,
    k: T,
    v: T,
    att: T,
    o: T,
    gate: T,
    up: T,
    tmp: T,
}

impl<T> Scratch<T> {
    /// The residual stream `x` and every buffer: [`Backend::begin_layer`]'s list of what
    /// crosses layers.
    fn live<'a>(&'a self, x: &'a T) -> [&'a T; 10] {
        let s = self;
        [
            x, &s.h, &s.q, &s.k, &s.v, &s.att, &s.o, &s.gate, &s.up, &s.tmp,
        ]
    }
}

impl<B: Backend> Model<B> {
    pub fn load(b: &B, gguf: &Arc<Gguf>) -> Result<Self, EngineError> {
        let info = ModelInfo::from_gguf(gguf)?;
        let (e, hd, nh, nkv, ff) = (
            info.n_embd,
            info.head_dim,
            info.n_head,
            info.n_head_kv,
            info.n_ff,
        );
        let need = |name: &str, shape: (usize, usize)| -> Result<B::Weight, EngineError> {
            let w = b.load_weight(gguf, name)?;
            let got = b.weight_shape(&w);
            if got != shape {
                return Err(EngineError::BadShape {
                    name: name.into(),
                    got: vec![got.1 as u64, got.0 as u64],
                    want: vec![shape.1 as u64, shape.0 as u64],
                });
            }
            Ok(w)
        };
        // Matrices that multiply the same input, loaded as one group (`Backend::matmul_group`).
        let need_group = |parts: &[(&str, (usize, usize))]| -> Result<Vec<B::Weight>, EngineError> {
            let names: Vec<&str> = parts.iter().map(|p| p.0).collect();
            let ws = b.load_weight_group(gguf, &names)?;
            for (w, &(name, shape)) in ws.iter().zip(parts) {
                let got = b.weight_shape(w);
                if got != shape {
                    return Err(EngineError::BadShape {
                        name: name.into(),
                        got: vec![got.1 as u64, got.0 as u64],
                        want: vec![shape.1 as u64, shape.0 as u64],
                    });
                }
            }
            Ok(ws)
        };
        let opt = |name: &str, shape: (usize, usize)| -> Result<Option<B::Weight>, EngineError> {
            if gguf.tensor(name).is_some() {
                need(name, shape).map(Some)
            } else {
                Ok(None)
            }
        };
        let gemma = info.arch == Arch::Gemma3;
        let qk_norm = matches!(
            info.arch,
            Arch::Qwen3
                | Arch::Qwen3Moe
                | Arch::Qwen35
                | Arch::Qwen35Moe
                | Arch::Qwen3Next
                | Arch::Gemma3
        );
        let q_rows = if info.attn_gate { 2 * nh * hd } else { nh * hd };
        let mut layers = Vec::with_capacity(info.n_layer);
        let mut n_delta = 0;
        for il in 0..info.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let bias = |s: &str| format!("blk.{il}.{s}.bias");
            let req_if =
                |yes: bool, name: String, shape| -> Result<Option<B::Weight>, EngineError> {
                    if yes {
                        need(&name, shape).map(Some)
                    } else {
                        opt(&name, shape)
                    }
                };
            let recurrent = info.delta.as_ref().filter(|d| d.recurrent[il]);
            let mixer = match recurrent {
                Some(d) => {
                    n_delta += 1;
                    Mixer::Delta(DeltaBlock::load(
                        b,
                        gguf,
                        il,
                        n_delta - 1,
                        e,
                        d,
                        info.rms_eps,
                    )?)
                }
                None => {
                    let (q, k, v) = (n("attn_q"), n("attn_k"), n("attn_v"));
                    let (kv_shape, q_shape) = ((nkv * hd, e), (q_rows, e));
                    // Q, K and V multiply one input: one group, except a gated Q (its
                    // output is split per head before use, so it goes alone).
                    let mut qkv = if info.attn_gate {
                        let wq = need(&q, q_shape)?;
                        let mut kv = need_group(&[(&k, kv_shape), (&v, kv_shape)])?;
                        kv.insert(0, wq);
                        kv
                    } else {
                        need_group(&[(&q, q_shape), (&k, kv_shape), (&v, kv_shape)])?
                    };
                    let (wv, wk, wq) = (qkv.pop(), qkv.pop(), qkv.pop());
                    let (Some(wq), Some(wk), Some(wv)) = (wq, wk, wv) else {
                        return Err(EngineError::MissingTensor(q));
                    };
                    Mixer::Attn(Attn {
                        wq,
                        wk,
                        wv,
                        wo: need(&n("attn_output"), (e, nh * hd))?,
                        bq: req_if(info.arch == Arch::Qwen2, bias("attn_q"), (1, nh * hd))?,
                        bk: req_if(info.arch == Arch::Qwen2, bias("attn_k"), (1, nkv * hd))?,
                        bv: req_if(info.arch == Arch::Qwen2, bias("attn_v"), (1, nkv * hd))?,
                        q_norm: req_if(qk_norm, n("attn_q_norm"), (1, hd))?,
                        k_norm: req_if(qk_norm, n("attn_k_norm"), (1, hd))?,
                    })
                }
            };
            // Qwen3.5 names its pre-FFN norm `post_attention_norm`; Gemma's is a sandwich
            // norm on the attention output.
            let hybrid = info.delta.is_some();
            let ffn_norm_name = if hybrid {
                "post_attention_norm"
            } else {
                "ffn_norm"
            };
            layers.push(Layer {
                attn_norm: need(&n("attn_norm"), (1, e))?,
                mixer,
                post_attn_norm: if hybrid {
                    None
                } else {
                    req_if(gemma, n("post_attention_norm"), (1, e))?
                },
                ffn_norm: need(&n(ffn_norm_name), (1, e))?,
                ffn: match &info.moe {
                    Some(m) => Ffn::Moe(MoeFfn::load(b, gguf, il, e, m)?),
                    None => {
                        let (gate, up) = (n("ffn_gate"), n("ffn_up"));
                        let mut gu = need_group(&[(&gate, (ff, e)), (&up, (ff, e))])?;
                        let (Some(up), Some(gate)) = (gu.pop(), gu.pop()) else {
                            return Err(EngineError::MissingTensor(gate));
                        };
                        Ffn::Dense {
                            gate,
                            up,
                            down: need(&n("ffn_down"), (e, ff))?,
                        }
                    }
                },
                post_ffn_norm: req_if(gemma, n("post_ffw_norm"), (1, e))?,
            });
        }
        let tok_embd = b.load_embedding(gguf, "token_embd.weight")?;
        if b.weight_shape(&tok_embd) != (info.n_vocab, e) {
            return Err(EngineError::BadShape {
                name: "token_embd.weight".into(),
                got: {
                    let (r, c) = b.weight_shape(&tok_embd);
                    vec![c as u64, r as u64]
                },
                want: vec![e as u64, info.n_vocab as u64],
            });
        }
        // A rank of a vocabulary-parallel head holds some rows of it (crate::tp::plan).
        let md = gguf.metadata();
        let vocab_slice = match (
            md.get_u64(crate::tp::plan::VOCAB_START_KEY),
            md.get_u64(crate::tp::plan::VOCAB_ROWS_KEY),
        ) {
            (Some(s), Some(n)) if (s + n) as usize <= info.n_vocab && n > 0 => {
                Some((s as usize, n as usize))
            }
            (None, None) => None,
            (s, n) => {
                return Err(EngineError::BadOptions(format!(
                    "vocabulary slice {s:?} + {n:?} rows of {}",
                    info.n_vocab
                )))
            }
        };
        let head_rows = vocab_slice.map_or(info.n_vocab, |(_, n)| n);
        // Tied embeddings: llama.cpp falls back to token_embd when output.weight is absent.
        let output = match opt("output.weight", (head_rows, e))? {
            Some(w) => w,
            None => need("token_embd.weight", (info.n_vocab, e))?,
        };
        Ok(Model {
            tok_embd,
            output_norm: need("output_norm.weight", (1, e))?,
            output,
            vocab_slice,
            rope_freqs: opt("rope_freqs.weight", (1, info.n_rot / 2))?,
            layers,
            info,
        })
    }

    /// Runs `tokens` (all sequences' new tokens, concatenated in `seqs` order) through the
    /// model, writing their K/V into `kv`, and returns the logits of `out_rows`.
    pub fn forward(
        &self,
        b: &B,
        kv: &mut B::KvStore,
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<B::Tensor, EngineError> {
        self.forward_with_state(b, kv, &mut [], tokens, positions, seqs, out_rows)
    }

    /// A fresh recurrent state for one sequence: one per delta-net layer (empty for models
    /// without them).
    pub fn new_state(&self, b: &B) -> Vec<DeltaState<B::Tensor>> {
        let Some(d) = &self.info.delta else {
            return Vec::new();
        };
        self.layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Delta(_)))
            .map(|_| DeltaBlock::new_state(b, d))
            .collect()
    }

    /// [`Model::forward`] with each sequence's recurrent state (`states`, in `seqs`
    /// order), which delta-net layers read and advance.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_state(
        &self,
        b: &B,
        kv: &mut B::KvStore,
        states: &mut [&mut Vec<DeltaState<B::Tensor>>],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<B::Tensor, EngineError> {
        self.forward_tp(b, kv, states, tokens, positions, seqs, out_rows, None)
    }

    /// [`Model::forward_with_state`] that stops before the output matrix: the rows of
    /// `out_rows` after the final norm, `n_embd` wide. These are llama.cpp's embeddings of a
    /// decoder model (`t_embd`, the `result_norm` tensor), which `/v1/embeddings` pools.
    #[allow(clippy::too_many_arguments)]
    pub fn hidden_with_state(
        &self,
        b: &B,
        kv: &mut B::KvStore,
        states: &mut [&mut Vec<DeltaState<B::Tensor>>],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
    ) -> Result<B::Tensor, EngineError> {
        self.run(
            b,
            kv,
            states,
            tokens,
            positions,
            seqs,
            out_rows,
            Head::Hidden,
            None,
        )
    }

    /// [`Model::forward_with_state`] on one rank of a tensor-parallel group (this model
    /// holds the rank's slices, see [`crate::tp`]): `reduce` sums each row-parallel
    /// output (attention or delta-net output, FFN down) over the ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_tp(
        &self,
        b: &B,
        kv: &mut B::KvStore,
        states: &mut [&mut Vec<DeltaState<B::Tensor>>],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        reduce: Option<&dyn AllReduce<B>>,
    ) -> Result<B::Tensor, EngineError> {
        self.run(
            b,
            kv,
            states,
            tokens,
            positions,
            seqs,
            out_rows,
            Head::Logits,
            reduce,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        b: &B,
        kv: &mut B::KvStore,
        states: &mut [&mut Vec<DeltaState<B::Tensor>>],
        tokens: &[u32],
        positions: &[u32],
        seqs: &[AttnSeq<'_>],
        out_rows: &[usize],
        head: Head,
        reduce: Option<&dyn AllReduce<B>>,
    ) -> Result<B::Tensor, EngineError> {
        let out_cols = match head {
            Head::Logits => self.info.n_vocab,
            Head::Hidden => self.info.n_embd,
        };
        if self.info.delta.is_some() && states.len() != seqs.len() {
            return Err(EngineError::BadOptions(format!(
                "{} recurrent states for {} sequences",
                states.len(),
                seqs.len()
            )));
        }
        let i = &self.info;
        let n = tokens.len();
        let (qd, kvd) = (i.n_head * i.head_dim, i.n_head_kv * i.head_dim);
        let mut x = b.alloc(n, i.n_embd);
        b.embed(&self.tok_embd, tokens, &mut x)?;
        if let Some(s) = i.embd_scale {
            b.scale(&mut x, s);
        }
        let mut s = Scratch {
            h: b.alloc(n, i.n_embd),
            q: b.alloc(n, qd),
            k: b.alloc(n, kvd),
            v: b.alloc(n, kvd),
            att: b.alloc(n, qd),
            o: b.alloc(n, i.n_embd),
            gate: b.alloc(n, i.n_ff),
            up: b.alloc(n, i.n_ff),
            tmp: b.alloc(n, qd.max(i.n_embd)),
        };
        let glu = if i.arch == Arch::Gemma3 {
            Glu::Gelu
        } else {
            Glu::Silu
        };
        let mut gathered = false;
        // `s.h` already holds this layer's attention norm of `x` (the previous layer's
        // all-reduce computed it, `AllReduce::all_reduce_add_norm`).
        let mut normed = false;
        for (il, l) in self.layers.iter().enumerate() {
            b.begin_layer(&s.live(&x));
            if !std::mem::take(&mut normed) {
                b.rms_norm(&x, &l.attn_norm, i.rms_eps, &mut s.h);
            }
            let last = il + 1 == self.layers.len();
            match &l.mixer {
                Mixer::Delta(d) => {
                    let mut st: Vec<&mut DeltaState<B::Tensor>> =
                        states.iter_mut().map(|v| &mut v[d.index]).collect();
                    d.forward(b, &s.h, seqs, &mut st, &mut s.o)?;
                }
                Mixer::Attn(a) => {
                    let gate = if i.attn_gate {
                        let mut full = b.alloc(n, 2 * qd);
                        b.matmul(&a.wq, &s.h, &mut full)?;
                        let mut g = b.alloc(n, qd);
                        b.split_gated_q(&full, i.head_dim, &mut s.q, &mut g)?;
                        b.matmul_group(&[&a.wk, &a.wv], &s.h, &mut [&mut s.k, &mut s.v])?;
                        Some(g)
                    } else {
                        b.matmul_group(
                            &[&a.wq, &a.wk, &a.wv],
                            &s.h,
                            &mut [&mut s.q, &mut s.k, &mut s.v],
                        )?;
                        None
                    };
                    if let Some(bq) = &a.bq {
                        b.add_bias(&mut s.q, bq);
                    }
                    if let Some(bk) = &a.bk {
                        b.add_bias(&mut s.k, bk);
                    }
                    if let Some(bv) = &a.bv {
                        b.add_bias(&mut s.v, bv);
                    }
                    let (freq_base, freq_scale) = i.rope_for_layer(il);
                    let rope = RopeAt {
                        positions,
                        head_dim: i.head_dim,
                        params: RopeParams {
                            style: i.rope_style,
                            n_rot: i.n_rot,
                            freq_base,
                            freq_scale,
                        },
                        freq_factors: self.rope_freqs.as_ref(),
                    };
                    match (&a.q_norm, &a.k_norm) {
                        (Some(q), Some(k)) => {
                            let norms = HeadNorms {
                                q,
                                k,
                                eps: i.rms_eps,
                            };
                            b.head_norms_rope_kv_write(
                                &mut s.q, &mut s.k, &s.v, &norms, &rope, kv, il, seqs,
                            );
                        }
                        (q_norm, k_norm) => {
                            if let Some(w) = q_norm {
                                b.rms_norm_in_place(&mut s.q, w, i.rms_eps);
                            }
                            if let Some(w) = k_norm {
                                b.rms_norm_in_place(&mut s.k, w, i.rms_eps);
                            }
                            b.rope_kv_write(&mut s.q, &mut s.k, &s.v, &rope, kv, il, seqs);
                        }
                    }
                    if i.q_scale != 1.0 {
                        b.scale(&mut s.q, i.q_scale);
                    }
                    let p = AttnParams {
                        n_head: i.n_head,
                        n_head_kv: i.n_head_kv,
                        head_dim: i.head_dim,
                        scale: i.kq_scale,
                        window: i.window_for_layer(il),
                    };
                    b.attention(&s.q, kv, il, seqs, &p, &mut s.att);
                    if let Some(g) = &gate {
                        b.mul_sigmoid(&mut s.att, g)?;
                    }
                    b.matmul(&a.wo, &s.att, &mut s.o)?;
                }
            }
            // As llama.cpp (ggml_get_rows on inp_out_ids), the last layer keeps only the rows
            // whose logits are wanted after its attention: the FFN multiplies fewer rows, and
            // its batch-size-dependent kernels see the batch llama.cpp's see.
            let gather = last && !out_rows.iter().copied().eq(0..n);
            // The all-reduce, the residual add and the FFN's norm as one op where nothing
            // comes between them.
            let fuse_attn = reduce.is_some() && !gather && l.post_attn_norm.is_none();
            match reduce {
                Some(r) if fuse_attn => {
                    r.all_reduce_add_norm(b, &mut s.o, &mut x, &l.ffn_norm, i.rms_eps, &mut s.h)?
                }
                Some(r) => r.all_reduce(b, &mut s.o)?,
                None => {}
            }
            if !fuse_attn {
                if gather {
                    if out_rows.is_empty() {
                        return Ok(b.alloc(0, out_cols));
                    }
                    s.o = b.gather_rows(&s.o, out_rows);
                    x = b.gather_rows(&x, out_rows);
                    gathered = true;
                }
                if let Some(w) = &l.post_attn_norm {
                    b.rms_norm(&s.o, w, i.rms_eps, &mut s.tmp);
                    std::mem::swap(&mut s.o, &mut s.tmp);
                }
                b.add(&mut x, &s.o);
                b.rms_norm(&x, &l.ffn_norm, i.rms_eps, &mut s.h);
            }
            match &l.ffn {
                Ffn::Dense { gate, up, down } => {
                    b.matmul_glu([gate, up], &s.h, glu, &mut s.gate, &mut s.up)?;
                    b.matmul(down, &s.gate, &mut s.o)?;
                }
                Ffn::Moe(moe) => {
                    // The combine, the residual add and the next layer's norm as one op
                    // where nothing comes between them (`Backend::moe_combine_add_norm`).
                    let next = self.layers.get(il + 1).map(|n| &n.attn_norm);
                    match next {
                        Some(w)
                            if reduce.is_none()
                                && l.post_ffn_norm.is_none()
                                && moe.joins_residual() =>
                        {
                            moe.forward_add_norm(b, &s.h, &mut x, w, i.rms_eps, &mut s.tmp)?;
                            std::mem::swap(&mut s.h, &mut s.tmp);
                            normed = true;
                            continue;
                        }
                        _ => moe.forward(b, &s.h, &mut s.o)?,
                    }
                }
            }
            // The same with the next layer's attention norm.
            let next_norm = self.layers.get(il + 1).map(|n| &n.attn_norm);
            match (reduce, next_norm) {
                (Some(r), Some(w)) if l.post_ffn_norm.is_none() => {
                    r.all_reduce_add_norm(b, &mut s.o, &mut x, w, i.rms_eps, &mut s.h)?;
                    normed = true;
                    continue;
                }
                (Some(r), _) => r.all_reduce(b, &mut s.o)?,
                (None, _) => {}
            }
            if let Some(w) = &l.post_ffn_norm {
                b.rms_norm(&s.o, w, i.rms_eps, &mut s.tmp);
                std::mem::swap(&mut s.o, &mut s.tmp);
            }
            b.add(&mut x, &s.o);
        }
        if out_rows.is_empty() {
            return Ok(b.alloc(0, out_cols));
        }
        let last = if gathered {
            x
        } else {
            b.gather_rows(&x, out_rows)
        };
        let mut normed = b.alloc(out_rows.len(), i.n_embd);
        b.rms_norm(&last, &self.output_norm, i.rms_eps, &mut normed);
        if head == Head::Hidden {
            return Ok(normed);
        }
        let Some((start, rows)) = self.vocab_slice else {
            let mut logits = b.alloc(out_rows.len(), i.n_vocab);
            b.matmul(&self.output, &normed, &mut logits)?;
            return Ok(logits);
        };
        // A vocabulary-parallel head: this rank's slice, then every rank's side by side.
        let Some(r) = reduce else {
            return Err(EngineError::BadOptions(
                "a vocabulary-parallel head's slice run without its group".into(),
            ));
        };
        let mut part = b.alloc(out_rows.len(), rows);
        b.matmul(&self.output, &normed, &mut part)?;
        r.gather_cols(b, &part, start, i.n_vocab)
    }
}
