//! Attention over the paged KV cache, with llama.cpp's (non flash-attention) precision:
//! K and V are stored as f16, the query is rounded to f16 before `q·k` (ggml converts the
//! f32 operand of an f16 matmul), the softmax runs in f32 with an f64 sum, and the
//! probabilities are rounded to f16 before they weight V.

use half::f16;
use rayon::prelude::*;
use smelt_quant::fp::{f16_to_f32, f32_to_f16};

use super::ggml_math;
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
        // Each sequence's keys (`[kv_head][position][d]`) and values (transposed,
        // `[kv_head][d][position]`, as llama.cpp's V cache), widened to f32 once per layer:
        // every key is read by every query of the batch (and by `group` heads).
        let widened: Vec<Widened> = seqs.par_iter().map(|s| self.widen(layer, s, p)).collect();
        // Which sequence each batch row belongs to.
        let mut owner = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            if owner.len() < s.row + s.n_tokens {
                owner.resize(s.row + s.n_tokens, usize::MAX);
            }
            owner[s.row..s.row + s.n_tokens].fill(si);
        }
        out.par_chunks_mut(hd).enumerate().for_each_init(
            || (vec![0f32; hd], Vec::<f32>::new(), Vec::<f32>::new()),
            |(q16, scores, acc), (i, o)| {
                let (row, h) = (i / p.n_head, i % p.n_head);
                let Some(&si) = owner.get(row) else { return };
                let (Some(s), Some(w)) = (seqs.get(si), widened.get(si)) else {
                    return;
                };
                let pos = s.start_pos + row - s.row;
                let lo = match p.window {
                    Some(win) => (pos + 1).saturating_sub(win),
                    None => 0,
                };
                let kvh = h / group;
                let qrow = &q[(row * p.n_head + h) * hd..][..hd];
                for (a, &b) in q16.iter_mut().zip(qrow) {
                    *a = f16_to_f32(f32_to_f16(b));
                }
                // llama.cpp multiplies a batch of two or more tokens through tinyBLAS and
                // a single token through ggml's vec_dot: two summation orders.
                let batched = s.n_tokens >= 2;
                if ggml_math::fma_ok() {
                    // SAFETY: AVX2 and FMA were detected at run time.
                    unsafe { one_head_fma(q16, w, kvh, lo, pos, p.scale, batched, scores, acc, o) }
                } else {
                    one_head(q16, w, kvh, lo, pos, p.scale, batched, scores, acc, o)
                }
            },
        );
    }

    /// The f32 keys and values a sequence's queries can see in this call, from the first
    /// position any of them attends to rounded down to a multiple of 64 (ggml's summation
    /// lanes are fixed by the position, and the rounding keeps them aligned).
    fn widen(&self, layer: usize, s: &AttnSeq<'_>, p: &AttnParams) -> Widened {
        let hd = p.head_dim;
        let end = s.start_pos + s.n_tokens;
        let first = match p.window {
            Some(w) => (s.start_pos + 1).saturating_sub(w),
            None => 0,
        };
        let base = first - first % 64;
        let n_pos = (end - base).div_ceil(64) * 64;
        let mut k = vec![0f32; p.n_head_kv * n_pos * hd];
        let mut v = vec![0f32; p.n_head_kv * n_pos * hd];
        for (j, pos) in (first..end)
            .enumerate()
            .map(|(j, pos)| (j + first - base, pos))
        {
            let slot = self.slot(s.blocks, pos);
            let src_k = &self.k[layer][slot * self.kv_dim..][..self.kv_dim];
            let src_v = &self.v[layer][slot * self.kv_dim..][..self.kv_dim];
            for h in 0..p.n_head_kv {
                let dst = (h * n_pos + j) * hd;
                widen_row(&src_k[h * hd..(h + 1) * hd], &mut k[dst..dst + hd]);
                widen_row(&src_v[h * hd..(h + 1) * hd], &mut v[dst..dst + hd]);
            }
        }
        Widened { k, v, base, n_pos }
    }
}

/// f16 to f32, exactly (F16C eight at a time where the CPU has it: every decode step
/// widens the whole visible cache, so this conversion is hot).
#[inline]
fn widen_row(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if ggml_math::fma_ok() && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2 and F16C were detected at run time.
        return unsafe { widen_row_f16c(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_row_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for i in whole..n {
        dst[i] = f16_to_f32(src[i]);
    }
}

/// One sequence's keys and values in f32 for one layer.
struct Widened {
    /// `[kv_head][position - base][d]`.
    k: Vec<f32>,
    /// `[kv_head][position - base][d]`, zero past the last position.
    v: Vec<f32>,
    /// First position held (a multiple of 64).
    base: usize,
    /// Positions held (a multiple of 64).
    n_pos: usize,
}

/// [`one_head`] compiled for AVX2 + FMA (`mul_add` one instruction, lanes vectorized).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn one_head_fma(
    q: &[f32],
    w: &Widened,
    kvh: usize,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    scores: &mut Vec<f32>,
    acc: &mut Vec<f32>,
    o: &mut [f32],
) {
    one_head(q, w, kvh, lo, pos, scale, batched, scores, acc, o)
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn one_head_fma(
    q: &[f32],
    w: &Widened,
    kvh: usize,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    scores: &mut Vec<f32>,
    acc: &mut Vec<f32>,
    o: &mut [f32],
) {
    one_head(q, w, kvh, lo, pos, scale, batched, scores, acc, o)
}

/// Softmax-weighted sum of the values for one query head over positions `lo..=pos`, as
/// llama.cpp's non-flash attention computes it: `q·k` with the query rounded to f16 (in
/// ggml's vec_dot or tinyBLAS order), scaled, ggml's softmax (its polynomial exp over
/// position-aligned chunks of 16, summed in f64), probabilities rounded to f16, and each
/// output dimension a dot of them with that dimension's values over the positions.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn one_head(
    q: &[f32],
    w: &Widened,
    kvh: usize,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    scores: &mut Vec<f32>,
    acc: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = q.len();
    let gemm = batched && hd.is_multiple_of(16);
    let dot = |a: &[f32], b: &[f32]| {
        if gemm {
            ggml_math::dot_gemm(a, b)
        } else {
            ggml_math::dot_vec(a, b)
        }
    };
    // Four rows against one: four independent chains, each row in the same order as `dot`.
    let dot4 = |a: [&[f32]; 4], b: &[f32]| {
        if gemm {
            ggml_math::dot_gemm4(a, b)
        } else {
            ggml_math::dot_vec4(a, b)
        }
    };
    // Scores over whole chunks of 64 positions from `base`, -inf where masked.
    let (first, last) = (lo - w.base, pos - w.base);
    let len = (last + 1).div_ceil(64) * 64;
    scores.clear();
    scores.resize(len, f32::NEG_INFINITY);
    let keys = &w.k[kvh * w.n_pos * hd..];
    let mut max = f32::NEG_INFINITY;
    let key = |j: usize| &keys[j * hd..(j + 1) * hd];
    let mut j = first;
    while j + 4 <= last + 1 {
        let d = dot4(std::array::from_fn(|k| key(j + k)), q);
        for (k, d) in d.into_iter().enumerate() {
            let d = d * scale;
            max = max.max(d);
            scores[j + k] = d;
        }
        j += 4;
    }
    for (j, sc) in scores.iter_mut().enumerate().take(last + 1).skip(j) {
        let d = dot(key(j), q) * scale;
        max = max.max(d);
        *sc = d;
    }
    let mut sum = 0f64;
    for chunk in scores.chunks_exact_mut(16) {
        let mut e = [0f32; 16];
        for (x, e) in chunk.iter_mut().zip(&mut e) {
            *x = ggml_math::expf(*x - max);
            *e = *x;
        }
        sum += ggml_math::reduce16(&e) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for x in scores.iter_mut() {
        *x = f16_to_f32(f32_to_f16(*x * inv));
    }
    // Each output dimension is a dot of the probabilities with that dimension's values
    // over the positions (ggml's V is transposed), in the same lanes as `dot`: position
    // `p` goes to lane `p % 16` of accumulator `(p / 16) % 4` (vec_dot_f16) or of the one
    // accumulator (tinyBLAS, whose k = n_kv is always a multiple of 16). Walking positions
    // with every dimension's lanes side by side vectorizes over the dimensions; positions
    // with probability 0 add exactly +0 and are skipped.
    let n_acc = if batched { 1 } else { 4 };
    acc.clear();
    acc.resize(n_acc * 16 * hd, 0.0);
    let vals = &w.v[kvh * w.n_pos * hd..];
    for (p, &prob) in scores[..len].iter().enumerate() {
        if prob == 0.0 {
            continue;
        }
        let lane = if batched { p % 16 } else { p % 64 };
        let a = &mut acc[lane * hd..(lane + 1) * hd];
        for (a, &v) in a.iter_mut().zip(&vals[p * hd..(p + 1) * hd]) {
            *a = prob.mul_add(v, *a);
        }
    }
    for (d, y) in o.iter_mut().enumerate() {
        let at = |j: usize, l: usize| acc[(16 * j + l) * hd + d];
        let s: [f32; 16] = if batched {
            std::array::from_fn(|l| at(0, l))
        } else {
            std::array::from_fn(|l| (at(0, l) + at(2, l)) + (at(1, l) + at(3, l)))
        };
        *y = ggml_math::reduce16(&s);
    }
}
