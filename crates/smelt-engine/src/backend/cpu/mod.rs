//! The CPU backend: weights stay in the memory-mapped file, activations are plain `Vec<f32>`
//! matrices, quantized dot products come from `smelt-quant` (AVX2 where the CPU has it), and
//! the work is spread over rayon's current thread pool (the engine installs one with the
//! requested number of threads).
//!
//! This file holds the backend's ops (its `Backend` implementation). Its data types and
//! weight loading are in `tensor.rs`, the element-wise row kernels in `pointwise.rs`, the
//! KV cache and attention in `attention*.rs`.

pub mod act_quant;
mod attention;
mod attention_row;
mod attention_tiled;
pub mod delta_net;
pub mod ggml_dot;
pub mod ggml_math;
pub(crate) mod ggml_simd;
pub mod matmul;
pub mod moe;
mod pointwise;
pub mod spin_pool;
mod tensor;

use std::sync::Arc;

use rayon::prelude::*;
use smelt_gguf::{GgmlType, Gguf};

pub use attention::CpuKv;
#[cfg(target_arch = "x86_64")]
use pointwise::gelu_table;
use pointwise::{gelu_times, rms_scale, rotate_heads, rotate_heads_fma, silu_row_best};
use tensor::load;
pub use tensor::{padded_cols, CpuTensor, CpuWeight, WeightBytes};

use super::{
    AttnParams, AttnSeq, Backend, DeltaParams, DeltaState, DeltaWeights, Glu, MoeRouting,
    RopeParams,
};
use crate::EngineError;

/// The CPU backend (threads come from the caller's rayon pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// Every row summed in its one-token order, whatever the step (`--batch-invariant`):
    /// the K-quant and float matmuls skip ggml's batch orders, the attention takes the
    /// one-query order for prompt rows too, and delta-net prompts the recurrence. Off,
    /// the CPU computes what llama.cpp computes, bit for bit.
    pub batch_invariant: bool,
}

impl Cpu {
    /// The backend with llama.cpp's orders (`batch_invariant` off).
    pub const GGML: Cpu = Cpu {
        batch_invariant: false,
    };
}

impl Backend for Cpu {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvStore = CpuKv;

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CpuWeight, EngineError> {
        load(gguf, name, true)
    }

    fn load_embedding(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CpuWeight, EngineError> {
        load(gguf, name, false)
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        match w {
            CpuWeight::Matrix { rows, cols, .. } | CpuWeight::Experts { rows, cols, .. } => {
                (*rows, *cols)
            }
            CpuWeight::Vector(v) => (1, v.len()),
        }
    }

    fn alloc(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    fn shape(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &self,
        table: &CpuWeight,
        tokens: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        let CpuWeight::Matrix {
            bytes,
            ty,
            rows,
            cols,
            stride,
        } = table
        else {
            return Err(EngineError::BadMetadata {
                key: "token_embd.weight".into(),
                why: "not a matrix".into(),
            });
        };
        let data = bytes.get();
        let rb = ty.type_size() * stride / ty.block_size();
        let used = ty.type_size() * cols / ty.block_size();
        for (&t, o) in tokens.iter().zip(out.data.chunks_mut(*cols)) {
            if t as usize >= *rows {
                return Err(EngineError::BadToken {
                    token: t,
                    n_vocab: *rows,
                });
            }
            let t = t as usize;
            smelt_quant::dequantize_row(*ty, &data[t * rb..t * rb + used], o)?;
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) -> Result<(), EngineError> {
        // A vector weight is a one-row F32 matrix (a shared expert's gate: one logit a row).
        if let CpuWeight::Vector(v) = w {
            out.rows = x.rows;
            out.cols = 1;
            out.data.resize(x.rows, 0.0);
            return matmul::matmul_ordered(
                GgmlType::F32,
                bytemuck::cast_slice(v),
                1,
                v.len(),
                v.len(),
                &x.data[..x.rows * x.cols],
                &mut out.data,
                self.batch_invariant,
            );
        }
        let CpuWeight::Matrix {
            bytes,
            ty,
            rows,
            cols,
            stride,
        } = w
        else {
            return Err(EngineError::BadMetadata {
                key: "matmul".into(),
                why: "weight is a vector".into(),
            });
        };
        debug_assert_eq!(x.cols, *cols);
        out.rows = x.rows;
        out.cols = *rows;
        out.data.resize(x.rows * rows, 0.0);
        matmul::matmul_ordered(
            *ty,
            bytes.get(),
            *rows,
            *cols,
            *stride,
            &x.data,
            &mut out.data,
            self.batch_invariant,
        )
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuWeight) {
        let b = bias.vector();
        for row in x.data.chunks_mut(x.cols) {
            for (a, &b) in row.iter_mut().zip(b) {
                *a += b;
            }
        }
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32, out: &mut CpuTensor) {
        let w = w.vector();
        out.rows = x.rows;
        out.cols = x.cols;
        out.data.resize(x.data.len(), 0.0);
        let n = w.len();
        out.data
            .par_chunks_mut(n)
            .zip(x.data.par_chunks(n))
            .for_each(|(y, x)| {
                let scale = rms_scale(x, eps);
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *y = (x * scale) * w;
                }
            });
    }

    fn rms_norm_in_place(&self, x: &mut CpuTensor, w: &CpuWeight, eps: f32) {
        let w = w.vector();
        x.data.par_chunks_mut(w.len()).for_each(|x| {
            let scale = rms_scale(x, eps);
            for (v, &w) in x.iter_mut().zip(w) {
                *v = (*v * scale) * w;
            }
        });
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) {
        x.data.iter_mut().for_each(|v| *v *= s);
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) {
        x.data.iter_mut().zip(&y.data).for_each(|(a, &b)| *a += b);
    }

    fn glu(&self, gate: &mut CpuTensor, up: &CpuTensor, act: Glu) {
        let cols = gate.cols.max(1);
        // Rows in tasks of about 4096 values; ggml's SiLU takes each row's whole chunks of
        // 16 through its vector exp and the rest through libm's.
        let rows_per_task = 4096usize.div_ceil(cols);
        gate.data
            .par_chunks_mut(rows_per_task * cols)
            .zip(up.data.par_chunks(rows_per_task * cols))
            .for_each(|(g, u)| {
                for (g, u) in g.chunks_mut(cols).zip(u.chunks(cols)) {
                    match act {
                        Glu::Silu => silu_row_best(g, u),
                        Glu::Gelu => {
                            let mut done = 0;
                            #[cfg(target_arch = "x86_64")]
                            if ggml_simd::ok() {
                                // SAFETY: AVX2, FMA and F16C were detected at run time.
                                done = unsafe { ggml_simd::geglu8(g, u, gelu_table()) };
                            }
                            for (g, &u) in g[done..].iter_mut().zip(&u[done..]) {
                                *g = gelu_times(*g, u);
                            }
                        }
                    }
                }
            });
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
        ff: Option<&CpuWeight>,
    ) {
        let ff = ff.map(|w| w.vector());
        let n_rot = p.n_rot.min(head_dim);
        let theta_scale = p.freq_base.powf(-2.0 / n_rot as f32);
        let cols = x.cols;
        x.data
            .par_chunks_mut(cols)
            .zip(positions.par_iter())
            .for_each_init(
                || vec![(0f32, 0f32); n_rot / 2],
                |cs, (row, &pos)| {
                    let mut theta_base = pos as f32;
                    for (i, c) in cs.iter_mut().enumerate() {
                        let extrap = match ff {
                            Some(ff) => theta_base / ff.get(i).copied().unwrap_or(1.0),
                            None => theta_base,
                        };
                        let theta = p.freq_scale * extrap;
                        *c = (theta.cos(), theta.sin());
                        theta_base *= theta_scale;
                    }
                    // ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`, as GCC contracts
                    // them (-ffp-contract=fast): the first product fused, the second rounded.
                    if ggml_math::fma_ok() {
                        // SAFETY: AVX2 and FMA were detected at run time.
                        unsafe { rotate_heads_fma(row, head_dim, cs, p.style, n_rot) }
                    } else {
                        rotate_heads(row, head_dim, cs, p.style, n_rot)
                    }
                },
            );
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[usize]) -> CpuTensor {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        CpuTensor {
            data,
            rows: rows.len(),
            cols: x.cols,
        }
    }

    fn to_host(&self, x: &CpuTensor) -> Vec<f32> {
        x.data.clone()
    }

    fn argmax_rows(&self, x: &CpuTensor) -> Vec<u32> {
        x.data
            .chunks(x.cols.max(1))
            .map(crate::sampler::argmax)
            .collect()
    }

    fn kv_alloc(&self, n_layer: usize, n_blocks: usize, block_size: usize, kv_dim: usize) -> CpuKv {
        CpuKv::new(n_layer, n_blocks, block_size, kv_dim)
    }

    fn kv_write(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        seqs: &[AttnSeq<'_>],
    ) {
        kv.write(layer, &k.data, &v.data, seqs);
    }

    fn attention(
        &self,
        q: &CpuTensor,
        kv: &CpuKv,
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        out: &mut CpuTensor,
    ) {
        out.rows = q.rows;
        out.cols = p.n_head * p.head_dim;
        out.data.resize(out.rows * out.cols, 0.0);
        kv.attend(&q.data, layer, seqs, p, self.batch_invariant, &mut out.data);
    }

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn load_experts(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CpuWeight, EngineError> {
        let index = gguf
            .tensor_index(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        let info = &gguf.tensors()[index];
        if info.shape.len() != 3 {
            return Err(EngineError::BadShape {
                name: name.into(),
                got: info.shape.clone(),
                want: vec![0, 0, 0],
            });
        }
        if !matmul::supported(info.ty) {
            return Err(EngineError::UnsupportedType {
                name: name.into(),
                ty: info.ty,
            });
        }
        Ok(CpuWeight::Experts {
            bytes: WeightBytes::Mapped {
                gguf: gguf.clone(),
                index,
            },
            ty: info.ty,
            n_expert: info.shape[2] as usize,
            rows: info.shape[1] as usize,
            cols: info.shape[0] as usize,
        })
    }

    fn moe_route(
        &self,
        logits: &CpuTensor,
        p: &MoeRouting,
        route: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        if p.k == 0 || p.k > logits.cols {
            return Err(EngineError::BadOptions(format!(
                "{} experts of {} per token",
                p.k, logits.cols
            )));
        }
        route.rows = logits.rows;
        route.cols = 2 * p.k;
        route.data.resize(route.rows * route.cols, 0.0);
        moe::route(&logits.data, logits.cols, p, &mut route.data);
        Ok(())
    }

    fn matmul_id(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        route: &CpuTensor,
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        let CpuWeight::Experts {
            bytes,
            ty,
            n_expert,
            rows,
            cols,
        } = w
        else {
            return Err(EngineError::BadMetadata {
                key: "matmul_id".into(),
                why: "weight is not a stack of experts".into(),
            });
        };
        let k = route.cols / 2;
        let ids: Vec<usize> = route
            .data
            .chunks(route.cols.max(1))
            .flat_map(|r| r[..k].iter().map(|&e| e as usize))
            .collect();
        out.rows = ids.len();
        out.cols = *rows;
        out.data.resize(out.rows * out.cols, 0.0);
        matmul::matmul_id(
            *ty,
            bytes.get(),
            *n_expert,
            *rows,
            *cols,
            &x.data[..x.rows * x.cols],
            &ids,
            k,
            &mut out.data,
            self.batch_invariant,
        )
    }

    fn gather_cols(
        &self,
        x: &CpuTensor,
        cols: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        if let Some(&c) = cols.iter().find(|&&c| c as usize >= x.cols) {
            return Err(EngineError::BadOptions(format!("column {c} of {}", x.cols)));
        }
        out.rows = x.rows;
        out.cols = cols.len();
        out.data.resize(out.rows * out.cols, 0.0);
        for (o, r) in out
            .data
            .chunks_mut(cols.len().max(1))
            .zip(x.data.chunks(x.cols.max(1)))
        {
            for (o, &c) in o.iter_mut().zip(cols) {
                *o = r[c as usize];
            }
        }
        Ok(())
    }

    fn split_gated_q(
        &self,
        x: &CpuTensor,
        head_dim: usize,
        q: &mut CpuTensor,
        gate: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        let half = x.cols / 2;
        for t in [&mut *q, &mut *gate] {
            t.rows = x.rows;
            t.cols = half;
            t.data.resize(x.rows * half, 0.0);
        }
        for (r, (qr, gr)) in x
            .data
            .chunks(x.cols)
            .zip(q.data.chunks_mut(half).zip(gate.data.chunks_mut(half)))
        {
            for (h, pair) in r.chunks(2 * head_dim).enumerate() {
                qr[h * head_dim..(h + 1) * head_dim].copy_from_slice(&pair[..head_dim]);
                gr[h * head_dim..(h + 1) * head_dim].copy_from_slice(&pair[head_dim..]);
            }
        }
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut CpuTensor, gate: &CpuTensor) -> Result<(), EngineError> {
        // ggml_sigmoid then ggml_mul; a one-column gate scales its whole row.
        let sig = |g: f32| 1.0 / (1.0 + (-g).exp());
        if gate.cols == 1 && x.cols != 1 {
            for (r, &g) in x.data.chunks_mut(x.cols.max(1)).zip(&gate.data) {
                let s = sig(g);
                r.iter_mut().for_each(|v| *v *= s);
            }
        } else {
            x.data
                .iter_mut()
                .zip(&gate.data)
                .for_each(|(v, &g)| *v *= sig(g));
        }
        Ok(())
    }

    fn delta_net(
        &self,
        p: &DeltaParams,
        w: &DeltaWeights<'_, CpuWeight>,
        qkv: &CpuTensor,
        z: &CpuTensor,
        alpha: &CpuTensor,
        beta: &CpuTensor,
        seqs: &[AttnSeq<'_>],
        states: &mut [&mut DeltaState<CpuTensor>],
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        let (conv, dt_bias, a, norm) = (
            w.conv.to_f32()?,
            w.dt_bias.to_f32()?,
            w.a.to_f32()?,
            w.norm.to_f32()?,
        );
        let lw = delta_net::LayerWeights {
            conv: &conv,
            dt_bias: &dt_bias,
            a: &a,
            norm: &norm,
        };
        let vd = p.n_v_heads * p.head_dim;
        out.rows = qkv.rows;
        out.cols = vd;
        out.data.resize(out.rows * vd, 0.0);
        if states.len() != seqs.len() {
            return Err(EngineError::BadOptions(format!(
                "{} delta-net states for {} sequences",
                states.len(),
                seqs.len()
            )));
        }
        let rows = |t: &CpuTensor, s: &AttnSeq<'_>| -> std::ops::Range<usize> {
            s.row * t.cols..(s.row + s.n_tokens) * t.cols
        };
        for (s, st) in seqs.iter().zip(states.iter_mut()) {
            let x = delta_net::SeqInputs {
                qkv: &qkv.data[rows(qkv, s)],
                z: &z.data[rows(z, s)],
                alpha: &alpha.data[rows(alpha, s)],
                beta: &beta.data[rows(beta, s)],
            };
            let o = &mut out.data[s.row * vd..(s.row + s.n_tokens) * vd];
            let DeltaState { conv, ssm } = &mut **st;
            let state = (&mut conv.data[..], &mut ssm.data[..]);
            delta_net::layer(p, &lw, &x, state, self.batch_invariant, o);
        }
        Ok(())
    }

    fn moe_combine(
        &self,
        y: &CpuTensor,
        route: &CpuTensor,
        out: &mut CpuTensor,
    ) -> Result<(), EngineError> {
        let k = route.cols / 2;
        out.rows = route.rows;
        out.cols = y.cols;
        out.data.resize(out.rows * out.cols, 0.0);
        moe::combine(&y.data, &route.data, k, &mut out.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::pointwise::silu_row;
    use super::*;
    use crate::backend::RopeStyle;

    #[test]
    fn rms_norm_in_place_gives_the_bits_of_rms_norm() {
        // Three rows of four heads of 8 (per-head norms, as Qwen3's Q and K), awkward values.
        let data: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173 + (i as f32).sin())
            .collect();
        let x = CpuTensor {
            data: data.clone(),
            rows: 3,
            cols: 32,
        };
        let w = CpuWeight::Vector((0..8).map(|i| 0.5 + i as f32 * 0.125).collect());
        let mut out = CpuTensor {
            data: Vec::new(),
            rows: 0,
            cols: 0,
        };
        Cpu::GGML.rms_norm(&x, &w, 1e-6, &mut out);
        let mut y = x;
        Cpu::GGML.rms_norm_in_place(&mut y, &w, 1e-6);
        assert_eq!((y.rows, y.cols), (3, 32));
        assert!(y
            .data
            .iter()
            .zip(&out.data)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(
            y.data.iter().zip(&data).any(|(a, b)| a != b),
            "nothing was normalized"
        );
    }

    #[test]
    fn rope_neox_and_normal_rotate_pairs() {
        let cpu = Cpu::GGML;
        let mut x = CpuTensor {
            data: vec![1.0, 0.0, 0.0, 1.0],
            rows: 1,
            cols: 4,
        };
        let p = RopeParams {
            style: RopeStyle::Normal,
            n_rot: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
        };
        cpu.rope(&mut x, &[0], 4, &p, None);
        assert_eq!(x.data, vec![1.0, 0.0, 0.0, 1.0]);
        cpu.rope(&mut x, &[1], 4, &p, None);
        assert!((x.data[0] - 1f32.cos()).abs() < 1e-6 && (x.data[1] - 1f32.sin()).abs() < 1e-6);
        let mut y = CpuTensor {
            data: vec![1.0, 0.0, 0.0, 0.0],
            rows: 1,
            cols: 4,
        };
        let p = RopeParams {
            style: RopeStyle::Neox,
            ..p
        };
        cpu.rope(&mut y, &[1], 4, &p, None);
        assert!((y.data[0] - 1f32.cos()).abs() < 1e-6 && (y.data[2] - 1f32.sin()).abs() < 1e-6);
    }

    /// The GLU op (vector paths where the CPU has them) equals the scalar lane code bit
    /// for bit, ragged rows and values at ggml's ±10 GELU cut-offs included.
    #[test]
    fn glu_vector_paths_equal_scalar() {
        let cpu = Cpu::GGML;
        let mut s = 0x9e37_79b9u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 30.0
        };
        for cols in [1, 15, 16, 17, 40, 1536] {
            let rows = 3;
            let mut g: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
            for (i, v) in [-10.0, 10.0, -9.999, 9.999, -100.0, 95.0, 0.0, -0.0]
                .into_iter()
                .enumerate()
            {
                if i < g.len() {
                    g[i] = v;
                }
            }
            let u: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
            let up = CpuTensor {
                data: u.clone(),
                rows,
                cols,
            };
            for act in [Glu::Silu, Glu::Gelu] {
                let mut x = CpuTensor {
                    data: g.clone(),
                    rows,
                    cols,
                };
                cpu.glu(&mut x, &up, act);
                let mut want = g.clone();
                for (g, u) in want.chunks_mut(cols).zip(u.chunks(cols)) {
                    match act {
                        Glu::Silu => silu_row(g, u),
                        Glu::Gelu => g
                            .iter_mut()
                            .zip(u)
                            .for_each(|(g, &u)| *g = gelu_times(*g, u)),
                    }
                }
                for (a, b) in x.data.iter().zip(&want) {
                    assert_eq!(a.to_bits(), b.to_bits(), "{act:?} {cols}: {a} vs {b}");
                }
            }
        }
    }
}
