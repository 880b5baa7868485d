//! Attention over the paged KV cache, with llama.cpp's (non flash-attention) precision:
//! K and V are stored as f16, the query is rounded to f16 before `q·k` (ggml converts the
//! f32 operand of an f16 matmul), the softmax runs in f32 with an f64 sum, and the
//! probabilities are rounded to f16 before they weight V.

use half::f16;
use rayon::prelude::*;
use smelt_quant::fp::{f16_to_f32, f32_to_f16};

use crate::backend::{AttnParams, AttnSeq};

/// K and V of every layer: `[layer][slot * kv_dim + d]`, a slot being
/// `block * block_size + offset`.
pub struct CpuKv {
    pub(crate) block_size: usize,
    pub(crate) kv_dim: usize,
    pub(crate) k: Vec<Vec<f16>>,
    pub(crate) v: Vec<Vec<f16>>,
}

impl CpuKv {
    pub fn new(n_layer: usize, n_blocks: usize, block_size: usize, kv_dim: usize) -> Self {
        let n = n_blocks * block_size * kv_dim;
        Self {
            block_size,
            kv_dim,
            k: (0..n_layer).map(|_| vec![f16::ZERO; n]).collect(),
            v: (0..n_layer).map(|_| vec![f16::ZERO; n]).collect(),
        }
    }

    fn slot(&self, blocks: &[u32], pos: usize) -> usize {
        blocks[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], seqs: &[AttnSeq<'_>]) {
        let d = self.kv_dim;
        for s in seqs {
            for i in 0..s.n_tokens {
                let slot = self.slot(s.blocks, s.start_pos + i);
                let row = s.row + i;
                for (dst, &src) in self.k[layer][slot * d..(slot + 1) * d]
                    .iter_mut()
                    .zip(&k[row * d..(row + 1) * d])
                {
                    *dst = f32_to_f16(src);
                }
                for (dst, &src) in self.v[layer][slot * d..(slot + 1) * d]
                    .iter_mut()
                    .zip(&v[row * d..(row + 1) * d])
                {
                    *dst = f32_to_f16(src);
                }
            }
        }
    }

    pub fn attend(
        &self,
        q: &[f32],
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        out: &mut [f32],
    ) {
        let hd = p.head_dim;
        let group = p.n_head / p.n_head_kv.max(1);
        // Each sequence's keys and values, widened to f32 once per layer and laid out
        // `[kv_head][position][d]`: every key is read by every query of the batch (and by
        // `group` heads), so converting it once is far cheaper than at each use.
        let widened: Vec<(Vec<f32>, Vec<f32>, usize)> =
            seqs.par_iter().map(|s| self.widen(layer, s, p)).collect();
        // Which sequence each batch row belongs to.
        let mut owner = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            if owner.len() < s.row + s.n_tokens {
                owner.resize(s.row + s.n_tokens, usize::MAX);
            }
            owner[s.row..s.row + s.n_tokens].fill(si);
        }
        out.par_chunks_mut(hd).enumerate().for_each_init(
            || (vec![0f32; hd], Vec::<f32>::new()),
            |(q16, scores), (i, o)| {
                let (row, h) = (i / p.n_head, i % p.n_head);
                let Some(&si) = owner.get(row) else { return };
                let (Some(s), Some((kf, vf, first))) = (seqs.get(si), widened.get(si)) else {
                    return;
                };
                let pos = s.start_pos + row - s.row;
                let n_pos = s.start_pos + s.n_tokens - first;
                let lo = match p.window {
                    Some(w) => (pos + 1).saturating_sub(w),
                    None => 0,
                } - first;
                let hi = pos - first;
                let kvh = h / group;
                let (kf, vf) = (&kf[kvh * n_pos * hd..], &vf[kvh * n_pos * hd..]);
                let qrow = &q[(row * p.n_head + h) * hd..][..hd];
                for (a, &b) in q16.iter_mut().zip(qrow) {
                    *a = f16_to_f32(f32_to_f16(b));
                }
                let (keys, values) = (&kf[lo * hd..(hi + 1) * hd], &vf[lo * hd..(hi + 1) * hd]);
                one_head(q16, keys, values, p.scale, scores, o);
            },
        );
    }

    /// The f32 keys and values a sequence's queries can see in this call, from the first
    /// position any of them attends to; returns them with that first position.
    fn widen(&self, layer: usize, s: &AttnSeq<'_>, p: &AttnParams) -> (Vec<f32>, Vec<f32>, usize) {
        let hd = p.head_dim;
        let end = s.start_pos + s.n_tokens;
        let first = match p.window {
            Some(w) => (s.start_pos + 1).saturating_sub(w),
            None => 0,
        };
        let n_pos = end - first;
        let mut kf = vec![0f32; p.n_head_kv * n_pos * hd];
        let mut vf = vec![0f32; p.n_head_kv * n_pos * hd];
        for (j, pos) in (first..end).enumerate() {
            let slot = self.slot(s.blocks, pos);
            let src_k = &self.k[layer][slot * self.kv_dim..][..self.kv_dim];
            let src_v = &self.v[layer][slot * self.kv_dim..][..self.kv_dim];
            for h in 0..p.n_head_kv {
                let dst = (h * n_pos + j) * hd;
                for (d, &x) in kf[dst..dst + hd]
                    .iter_mut()
                    .zip(&src_k[h * hd..(h + 1) * hd])
                {
                    *d = f16_to_f32(x);
                }
                for (d, &x) in vf[dst..dst + hd]
                    .iter_mut()
                    .zip(&src_v[h * hd..(h + 1) * hd])
                {
                    *d = f16_to_f32(x);
                }
            }
        }
        (kf, vf, first)
    }
}

/// Softmax-weighted sum of `values` for one query head over `keys` (rows of the head
/// size), compiled for AVX2 where the CPU has it (the crate itself targets baseline x86-64).
fn one_head(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time.
        return unsafe { one_head_avx2(q, keys, values, scale, scores, o) };
    }
    one_head_generic(q, keys, values, scale, scores, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn one_head_avx2(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    one_head_generic(q, keys, values, scale, scores, o)
}

#[inline(always)]
fn one_head_generic(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = q.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for k in keys.chunks_exact(hd) {
        let dot = dot(q, k) * scale;
        max = max.max(dot);
        scores.push(dot);
    }
    let mut sum = 0f64;
    for x in scores.iter_mut() {
        *x = (*x - max).exp();
        sum += *x as f64;
    }
    let inv = (1.0 / sum) as f32;
    o.fill(0.0);
    for (&w, v) in scores.iter().zip(values.chunks_exact(hd)) {
        let w = f16_to_f32(f32_to_f16(w * inv));
        for (a, &b) in o.iter_mut().zip(v) {
            *a += w * b;
        }
    }
}

/// `q·k` in f32 with eight partial sums (as a SIMD loop would; vectorizes).
#[inline(always)]
fn dot(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut qc = q.chunks_exact(8);
    let mut kc = k.chunks_exact(8);
    for (a, b) in (&mut qc).zip(&mut kc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let mut s = 0f32;
    for (a, b) in qc.remainder().iter().zip(kc.remainder()) {
        s += a * b;
    }
    acc.iter().sum::<f32>() + s
}
