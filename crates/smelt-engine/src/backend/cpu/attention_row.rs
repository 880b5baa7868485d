//! The one-query-row order of [`super::attention::CpuKv::attend`]: one head of one query
//! row against every key it sees, as llama.cpp's non-flash attention sums it (ggml's
//! vec_dot for a single token, tinyBLAS for a batch), in portable, AVX2 + F16C and AVX-512
//! builds of the same operations. Decode takes this order, and so does every prompt row
//! that the tiled order ([`super::attention_tiled`]) does not take. The tiled order reuses
//! this file's score dot, softmax and lane combine.

use half::f16;
use smelt_quant::fp::{f16_to_f32, f32_to_f16};

use super::attention::{Scratch, View};
use super::ggml_math;
#[cfg(target_arch = "x86_64")]
use super::ggml_simd;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// f16 to f32, exactly: F16C eight at a time when `F16C` (the caller was compiled with it).
#[inline(always)]
fn widen_row<const F16C: bool>(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: only instantiated with `F16C` inside functions compiled for F16C, which run
        // only after it was detected.
        return unsafe { widen_row_f16c(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
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

/// `a[d] = prob * v[d] + a[d]` (one rounding, as `mul_add`), `v` widened exactly.
#[inline(always)]
fn axpy_f16<const F16C: bool>(a: &mut [f32], prob: f32, v: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: as in `widen_row`.
        return unsafe { axpy_f16c(a, prob, v) };
    }
    for (a, &v) in a.iter_mut().zip(v) {
        *a = prob.mul_add(f16_to_f32(v), *a);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn axpy_f16c(a: &mut [f32], prob: f32, v: &[f16]) {
    use std::arch::x86_64::*;
    let n = a.len().min(v.len());
    let whole = n - n % 8;
    let p = _mm256_set1_ps(prob);
    for i in (0..whole).step_by(8) {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
        let y = _mm256_loadu_ps(a.as_ptr().add(i));
        _mm256_storeu_ps(a.as_mut_ptr().add(i), _mm256_fmadd_ps(p, x, y));
    }
    for i in whole..n {
        a[i] = prob.mul_add(f16_to_f32(v[i]), a[i]);
    }
}

/// [`one_head`] compiled for AVX2 + FMA + F16C (`mul_add` one instruction, lanes
/// vectorized, f16 widened in registers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn one_head_fast(
    w: &View<'_>,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    sc: &mut Scratch,
    o: &mut [f32],
) {
    one_head::<true, false>(w, lo, pos, scale, batched, sc, o)
}

/// [`one_head`] with AVX-512F on top: ggml's 16-lane accumulators one register each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn one_head_512(
    w: &View<'_>,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    sc: &mut Scratch,
    o: &mut [f32],
) {
    one_head::<true, true>(w, lo, pos, scale, batched, sc, o)
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn one_head_512(
    w: &View<'_>,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    sc: &mut Scratch,
    o: &mut [f32],
) {
    one_head::<false, false>(w, lo, pos, scale, batched, sc, o)
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn one_head_fast(
    w: &View<'_>,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    sc: &mut Scratch,
    o: &mut [f32],
) {
    one_head::<false, false>(w, lo, pos, scale, batched, sc, o)
}

/// Softmax-weighted sum of the values for one query head over positions `lo..=pos`, as
/// llama.cpp's non-flash attention computes it: `q·k` with the query rounded to f16 (in
/// ggml's vec_dot or tinyBLAS order), scaled, ggml's softmax (its polynomial exp over
/// position-aligned chunks of 16, summed in f64), probabilities rounded to f16, and each
/// output dimension a dot of them with that dimension's values over the positions.
#[inline(always)]
pub(super) fn one_head<const F16C: bool, const Z: bool>(
    w: &View<'_>,
    lo: usize,
    pos: usize,
    scale: f32,
    batched: bool,
    sc: &mut Scratch,
    o: &mut [f32],
) {
    let Scratch {
        q16: q,
        scores,
        acc,
        keys,
        ..
    } = sc;
    let q = &q[..];
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
    let mut max = f32::NEG_INFINITY;
    let mut j = first;
    #[cfg(target_arch = "x86_64")]
    if F16C && !Z && hd.is_multiple_of(if gemm { 16 } else { 64 }) {
        // Eight keys at a time: each key's lanes summed down to eight in registers, then
        // the eight keys' last horizontal adds done side by side (the same adds, per key).
        // SAFETY: as in `widen_row`.
        unsafe {
            let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
            let sc8 = _mm256_set1_ps(scale);
            while j + 8 <= last + 1 {
                let d = _mm256_mul_ps(dot8_keys_f16c(w, j, q, gemm), sc8);
                _mm256_storeu_ps(scores.as_mut_ptr().add(j), d);
                mx = _mm256_max_ps(mx, d);
                j += 8;
            }
            let mut m = [0f32; 8];
            _mm256_storeu_ps(m.as_mut_ptr(), mx);
            max = m.iter().fold(max, |a, &b| a.max(b));
        }
    }
    #[cfg(target_arch = "x86_64")]
    if F16C && hd.is_multiple_of(16) {
        // Each key widened in registers and dotted in ggml's lanes (eight or two independent
        // chains per key already, so one key at a time).
        for (j, sc) in scores.iter_mut().enumerate().take(last + 1).skip(j) {
            // SAFETY: as in `widen_row`.
            let d = if Z {
                // SAFETY: only instantiated with `Z` inside functions compiled for AVX-512F.
                unsafe { dot_key_512(w.key(j), q, gemm) }
            } else {
                unsafe { dot_key_f16c(w.key(j), q, gemm) }
            } * scale;
            max = max.max(d);
            *sc = d;
        }
        j = last + 1;
    }
    while j + 4 <= last + 1 {
        // Four keys widened into L1 (exact), then dotted in ggml's order.
        for (k, dst) in keys.chunks_exact_mut(hd).enumerate() {
            widen_row::<F16C>(w.key(j + k), dst);
        }
        let d = dot4(std::array::from_fn(|k| &keys[k * hd..(k + 1) * hd]), q);
        for (k, d) in d.into_iter().enumerate() {
            let d = d * scale;
            max = max.max(d);
            scores[j + k] = d;
        }
        j += 4;
    }
    for (j, sc) in scores.iter_mut().enumerate().take(last + 1).skip(j) {
        widen_row::<F16C>(w.key(j), &mut keys[..hd]);
        let d = dot(&keys[..hd], q) * scale;
        max = max.max(d);
        *sc = d;
    }
    head_tail::<F16C, Z>(w, scores, max, batched, acc, o)
}

/// The rest of [`one_head`] once a row's scores (`scores.len()` a multiple of 64, -inf where
/// masked) and their maximum are known: ggml's softmax, the f16 rounding of the
/// probabilities, and their dot with each output dimension's values.
#[inline(always)]
fn head_tail<const F16C: bool, const Z: bool>(
    w: &View<'_>,
    scores: &mut [f32],
    max: f32,
    batched: bool,
    acc: &mut Vec<f32>,
    o: &mut [f32],
) {
    let (hd, len) = (w.hd, scores.len());
    softmax_round::<F16C>(scores, max);
    // Each output dimension is a dot of the probabilities with that dimension's values
    // over the positions (ggml's V is transposed), in the same lanes as `dot`: position
    // `p` goes to lane `p % 16` of accumulator `(p / 16) % 4` (vec_dot_f16) or of the one
    // accumulator (tinyBLAS, whose k = n_kv is always a multiple of 16). Walking positions
    // with every dimension's lanes side by side vectorizes over the dimensions; positions
    // with probability 0 add exactly +0 and are skipped.
    let n_lanes = if batched { 16 } else { 64 };
    acc.clear();
    acc.resize(n_lanes * hd, 0.0);
    // Lane by lane: each lane's positions (`lane`, `lane + n_lanes`, ...) added in order,
    // which is the order each accumulator sees in ggml, with the lane's sums in registers.
    for (lane, a) in acc.chunks_exact_mut(hd).enumerate() {
        lane_sum::<F16C, Z>(w, &scores[..len], lane, n_lanes, a);
    }
    combine_lanes(acc, hd, batched, o);
}

/// ggml's horizontal adds of the p·V lane sums (`acc` = `[lane][d]`, 64 lanes for
/// vec_dot_f16, 16 for tinyBLAS), vectorized over the dimensions: `(s0+s2) + (s1+s3)` of
/// the four 16-lane accumulators (vec_dot_f16), then `_mm512_reduce_add_ps`'s tree.
#[inline(always)]
pub(super) fn combine_lanes(acc: &mut [f32], hd: usize, batched: bool, o: &mut [f32]) {
    if !batched {
        for l in 0..16 {
            for d in 0..hd {
                acc[l * hd + d] = (acc[l * hd + d] + acc[(32 + l) * hd + d])
                    + (acc[(16 + l) * hd + d] + acc[(48 + l) * hd + d]);
            }
        }
    }
    for (half, n) in [(8, 8), (4, 4)] {
        for i in 0..n {
            for d in 0..hd {
                acc[i * hd + d] += acc[(i + half) * hd + d];
            }
        }
    }
    for (d, y) in o.iter_mut().enumerate() {
        *y = (acc[d] + acc[2 * hd + d]) + (acc[hd + d] + acc[3 * hd + d]);
    }
}

/// ggml's softmax of one row of scores (`max` their maximum, `-inf` where masked), then
/// the probabilities rounded to f16: `expf(x - max)` over chunks of 16, each reduced as
/// `_mm512_reduce_add_ps` and summed in f64, times `1 / sum`.
#[inline(always)]
pub(super) fn softmax_round<const F16C: bool>(scores: &mut [f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // The same lanes eight at a time (ggml_simd's twins have the scalar bits).
        // SAFETY: as in `widen_row` (AVX2, FMA and F16C).
        unsafe {
            let sum = ggml_simd::exp_sum16(scores, max);
            ggml_simd::scale_round_f16(scores, (1.0 / sum) as f32);
        }
    }
    if !F16C || cfg!(not(target_arch = "x86_64")) {
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
    }
}

/// `out[d] = sum over positions p = lane, lane + step, ... of probs[p] * v[p][d]`, one
/// `mul_add` per position in increasing order (zero probabilities skipped: they add +0).
#[inline(always)]
fn lane_sum<const F16C: bool, const Z: bool>(
    w: &View<'_>,
    probs: &[f32],
    lane: usize,
    step: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    #[cfg(target_arch = "x86_64")]
    if Z && out.len().is_multiple_of(64) {
        // SAFETY: only instantiated with `Z` inside functions compiled for AVX-512F.
        return unsafe { lane_sum_512(w, probs, lane, step, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if F16C && out.len().is_multiple_of(32) {
        // SAFETY: as in `widen_row`.
        return unsafe { lane_sum_f16c(w, probs, lane, step, out) };
    }
    for p in (lane..probs.len()).step_by(step) {
        let prob = probs[p];
        if prob != 0.0 {
            axpy_f16::<F16C>(out, prob, w.value(p));
        }
    }
}

/// Eight keys' `q·k` (keys `j..j + 8` of the view), lane `i` key `j + i`, each exactly
/// [`dot_key_f16c`]: per key the 16 ggml lanes folded to eight (`t3`), then the
/// `_mm512_reduce_add_ps` tail (`t6 = t3[i + 4] + t3[i]`, `(t6[0] + t6[2]) + (t6[1] +
/// t6[3])`) done for eight keys at once after transposing. Needs `hd` a multiple of 64
/// (`gemm`: of 16), so no leftovers are summed in f64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot8_keys_f16c(w: &View<'_>, j: usize, q: &[f32], gemm: bool) -> __m256 {
    let hd = w.hd.min(q.len());
    let qp = q.as_ptr();
    let t3: [__m256; 8] = std::array::from_fn(|i| {
        let kp = w.key(j + i).as_ptr();
        let ld = |c: usize| {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c).cast())),
                _mm256_loadu_ps(qp.add(c)),
            )
        };
        if gemm {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for c in (0..hd).step_by(16) {
                let (a, b) = ld(c);
                lo = _mm256_fmadd_ps(a, b, lo);
                let (a, b) = ld(c + 8);
                hi = _mm256_fmadd_ps(a, b, hi);
            }
            return _mm256_add_ps(hi, lo);
        }
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..hd).step_by(64) {
            for (h, acc) in acc.iter_mut().enumerate() {
                let (a, b) = ld(c + 8 * h);
                *acc = _mm256_fmadd_ps(a, b, *acc);
            }
        }
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        _mm256_add_ps(hi, lo)
    });
    reduce8(&t3)
}

/// Eight keys' `_mm512_reduce_add_ps` tails from their folded lanes `t3` (see
/// [`dot8_keys_f16c`]); lane `i` is key `i`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn reduce8(t3: &[__m256; 8]) -> __m256 {
    // Keys 2m and 2m + 1 side by side: [t6 of 2m | t6 of 2m + 1].
    let s: [__m256; 4] = std::array::from_fn(|m| {
        let (a, b) = (t3[2 * m], t3[2 * m + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(a, b),
            _mm256_permute2f128_ps::<0x20>(a, b),
        )
    });
    // 4x4 transposes within each 128-bit half: t6[0..4] of keys (0, 2, 4, 6 | 1, 3, 5, 7).
    let u0 = _mm256_unpacklo_ps(s[0], s[1]);
    let u1 = _mm256_unpackhi_ps(s[0], s[1]);
    let u2 = _mm256_unpacklo_ps(s[2], s[3]);
    let u3 = _mm256_unpackhi_ps(s[2], s[3]);
    let x0 = _mm256_shuffle_ps::<0x44>(u0, u2);
    let x1 = _mm256_shuffle_ps::<0xEE>(u0, u2);
    let x2 = _mm256_shuffle_ps::<0x44>(u1, u3);
    let x3 = _mm256_shuffle_ps::<0xEE>(u1, u3);
    let r = _mm256_add_ps(_mm256_add_ps(x0, x2), _mm256_add_ps(x1, x3));
    _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// `q·k` in [`ggml_math::dot_vec`]'s order (`gemm`: [`ggml_math::dot_gemm`]'s), the key
/// widened from f16 in registers; `q.len()` a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dot_key_f16c(k: &[f16], q: &[f32], gemm: bool) -> f32 {
    use std::arch::x86_64::*;
    let n = k.len().min(q.len());
    let (kp, qp) = (k.as_ptr(), q.as_ptr());
    let ld = |i: usize| {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(kp.add(i).cast())),
            _mm256_loadu_ps(qp.add(i)),
        )
    };
    // The 16 lanes of one accumulator as two halves; `_mm512_reduce_add_ps`'s tree.
    let reduce = |lo: __m256, hi: __m256| {
        let mut t3 = [0f32; 8];
        _mm256_storeu_ps(t3.as_mut_ptr(), _mm256_add_ps(hi, lo));
        let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
        (t6[0] + t6[2]) + (t6[1] + t6[3])
    };
    if gemm {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in (0..n - n % 16).step_by(16) {
            let (a, b) = ld(c);
            lo = _mm256_fmadd_ps(a, b, lo);
            let (a, b) = ld(c + 8);
            hi = _mm256_fmadd_ps(a, b, hi);
        }
        return reduce(lo, hi);
    }
    let np = n - n % 64;
    let mut acc = [_mm256_setzero_ps(); 8];
    for c in (0..np).step_by(64) {
        for (h, acc) in acc.iter_mut().enumerate() {
            let (a, b) = ld(c + 8 * h);
            *acc = _mm256_fmadd_ps(a, b, *acc);
        }
    }
    // Accumulator j is halves 2j, 2j + 1: (s0 + s2) + (s1 + s3), lane by lane.
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    let mut sum = reduce(lo, hi) as f64;
    for i in np..n {
        sum += (f16_to_f32(k[i]) * q[i]) as f64;
    }
    sum as f32
}

/// [`dot_key_f16c`] with one 16-lane register per ggml accumulator.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn dot_key_512(k: &[f16], q: &[f32], gemm: bool) -> f32 {
    use std::arch::x86_64::*;
    let n = k.len().min(q.len());
    let (kp, qp) = (k.as_ptr(), q.as_ptr());
    let ld = |i: usize| {
        (
            _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(i).cast())),
            _mm512_loadu_ps(qp.add(i)),
        )
    };
    // `_mm512_reduce_add_ps` as GCC defines it.
    let reduce = |v: __m512| {
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), v);
        ggml_math::reduce16(&l)
    };
    if gemm {
        let mut acc = _mm512_setzero_ps();
        for c in (0..n - n % 16).step_by(16) {
            let (a, b) = ld(c);
            acc = _mm512_fmadd_ps(a, b, acc);
        }
        return reduce(acc);
    }
    let np = n - n % 64;
    let mut acc = [_mm512_setzero_ps(); 4];
    for c in (0..np).step_by(64) {
        for (j, acc) in acc.iter_mut().enumerate() {
            let (a, b) = ld(c + 16 * j);
            *acc = _mm512_fmadd_ps(a, b, *acc);
        }
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    let mut sum = reduce(s) as f64;
    for i in np..n {
        sum += (f16_to_f32(k[i]) * q[i]) as f64;
    }
    sum as f32
}

/// [`lane_sum`] with 64 dimensions in four 16-lane registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn lane_sum_512(w: &View<'_>, probs: &[f32], lane: usize, step: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    for d0 in (0..out.len()).step_by(64) {
        let mut r = [_mm512_setzero_ps(); 4];
        for p in (lane..probs.len()).step_by(step) {
            let prob = probs[p];
            if prob == 0.0 {
                continue;
            }
            let pb = _mm512_set1_ps(prob);
            let v = w.value(p)[d0..d0 + 64].as_ptr();
            for (k, r) in r.iter_mut().enumerate() {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.add(16 * k).cast()));
                *r = _mm512_fmadd_ps(pb, x, *r);
            }
        }
        for (k, r) in r.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(d0 + 16 * k), *r);
        }
    }
}

/// [`lane_sum`] with 32 dimensions (four registers) or, when they divide, 64 (eight) at a
/// time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lane_sum_f16c(w: &View<'_>, probs: &[f32], lane: usize, step: usize, out: &mut [f32]) {
    if out.len().is_multiple_of(64) {
        lane_sum_regs::<8>(w, probs, lane, step, out)
    } else {
        lane_sum_regs::<4>(w, probs, lane, step, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lane_sum_regs<const R: usize>(
    w: &View<'_>,
    probs: &[f32],
    lane: usize,
    step: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    for d0 in (0..out.len()).step_by(8 * R) {
        let mut r = [_mm256_setzero_ps(); R];
        for p in (lane..probs.len()).step_by(step) {
            let prob = probs[p];
            if prob == 0.0 {
                continue;
            }
            let pb = _mm256_set1_ps(prob);
            let v = w.value(p)[d0..d0 + 8 * R].as_ptr();
            for (k, r) in r.iter_mut().enumerate() {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.add(8 * k).cast()));
                *r = _mm256_fmadd_ps(pb, x, *r);
            }
        }
        for (k, r) in r.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(d0 + 8 * k), *r);
        }
    }
}
