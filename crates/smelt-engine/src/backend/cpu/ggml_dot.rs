//! Block dot products in exactly the order ggml's x86 CPU backend computes them
//! (`ggml-cpu/arch/x86/quants.c`, AVX2 + FMA build), so a matmul gives llama.cpp's bits.
//!
//! ggml's AVX2 `vec_dot`s walk the blocks one at a time with one `__m256` accumulator:
//! lane `l` of a block's integer dot is the exact sum of its weights `4l..4l+3` times the
//! activations (`maddubs` + `madd`), converted to f32 and fused-multiply-added with the
//! block's combined scale into accumulator lane `l`; at the end `hsum_float_8` adds the
//! lanes as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. Formats with a minimum (Q4_1) add a
//! scalar running sum of `m * s` after that. The portable path computes the same lanes in
//! scalars with `f32::mul_add`, so `SMELT_NO_SIMD=1` gives the same bits.
//!
//! smelt-quant's own `vec_dot`s keep another (equally valid) order that the GPU kernels'
//! CPU twins rely on, so these live here, next to the matmul that needs ggml's order.

use smelt_quant::fp::{self, f16_to_f32};
use smelt_quant::iq4::{BlockIQ4NL, BlockIQ4XS};
use smelt_quant::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use smelt_quant::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use smelt_quant::Block;

/// A weight block with a dot product against its activation block in ggml's order.
pub trait GgmlDot: Block {
    /// The dot ggml computes for a single token (or a token outside a group of four).
    fn ggml_dot(x: &[Self], y: &[Self::Act]) -> f32;
    /// The dot ggml computes for token `t` of a matmul over `n_tok` tokens: llama.cpp
    /// routes some formats through other kernels in a batch (repacked Q4_K: gemm for the
    /// groups of four; Q6_K from eight tokens on: the tiled K-quant matmul).
    #[inline]
    fn ggml_dot_in_batch(x: &[Self], y: &[Self::Act], t: usize, n_tok: usize) -> f32 {
        let _ = (t, n_tok);
        Self::ggml_dot(x, y)
    }

    /// Whether [`GgmlDot::ggml_dot_in_batch`] is [`GgmlDot::ggml_dot`] for every token.
    const BATCH_IS_SINGLE: bool = true;

    /// [`GgmlDot::ggml_dot`] of four weight rows with one activation row, each in ggml's
    /// order; the four dependency chains interleave, which a single dot (one accumulator,
    /// one fused multiply-add per block) cannot.
    #[inline]
    fn ggml_dot4(x: [&[Self]; 4], y: &[Self::Act]) -> [f32; 4] {
        x.map(|x| Self::ggml_dot(x, y))
    }

    /// [`GgmlDot::ggml_dot4`] against two activation rows (a batch): each weight block is
    /// unpacked once for both; every output keeps ggml's order.
    #[inline]
    fn ggml_dot4x2(x: [&[Self]; 4], y0: &[Self::Act], y1: &[Self::Act]) -> [[f32; 4]; 2] {
        [Self::ggml_dot4(x, y0), Self::ggml_dot4(x, y1)]
    }
}

/// Formats whose ggml order is not reproduced yet: smelt-quant's own dot.
macro_rules! own_order {
    ($($B:ty),*) => {$(
        impl GgmlDot for $B {
            #[inline]
            fn ggml_dot(x: &[Self], y: &[Self::Act]) -> f32 {
                <$B as Block>::vec_dot(x, y)
            }
        }
    )*};
}
own_order!(
    fp::F16,
    fp::BF16,
    BlockQ4_0,
    BlockQ5_1,
    BlockQ2K,
    BlockQ3K,
    BlockQ5K,
    BlockIQ4NL,
    BlockIQ4XS
);

/// F32 weights: `ggml_vec_dot_f32` for one token (and for every expert row of a
/// `MUL_MAT_ID`), llamafile's tinyBLAS for batches of two or more when the row is whole
/// 16-lane vectors (as a MoE router's logits need, to pick the same experts as llama.cpp).
impl GgmlDot for fp::F32 {
    const BATCH_IS_SINGLE: bool = false;

    #[inline(always)]
    fn ggml_dot(x: &[f32], y: &[f32]) -> f32 {
        super::ggml_math::dot_vec_f32(x, y)
    }

    #[inline(always)]
    fn ggml_dot_in_batch(x: &[f32], y: &[f32], _t: usize, n_tok: usize) -> f32 {
        if n_tok >= 2 && x.len().is_multiple_of(16) {
            super::ggml_math::dot_gemm(x, y)
        } else {
            Self::ggml_dot(x, y)
        }
    }
}

/// Q4_K weights are repacked by llama.cpp on x86 (`CPU_REPACK`, `block_q4_Kx8`) and
/// multiplied by `ggml_gemv_q4_K_8x8_q8_K` (one token) or `ggml_gemm_q4_K_8x8_q8_K` (groups
/// of four tokens); [`GgmlDot::ggml_dot`] is the gemv order, [`q4_k_gemm`] the gemm one.
impl GgmlDot for BlockQ4K {
    const BATCH_IS_SINGLE: bool = false;

    #[inline(always)]
    fn ggml_dot(x: &[Self], y: &[BlockQ8K]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { x86::q4_k_gemv(x, y) };
        }
        q4_k_repacked::<false>(x, y)
    }
    #[inline(always)]
    fn ggml_dot_in_batch(x: &[Self], y: &[BlockQ8K], t: usize, n_tok: usize) -> f32 {
        if t < n_tok - n_tok % 4 {
            q4_k_gemm(x, y)
        } else {
            Self::ggml_dot(x, y)
        }
    }
}

/// One weight row of `ggml_gemm_q4_K_8x8_q8_K` (AVX-512 build): like the gemv but the
/// float accumulation happens per pair of sub-blocks (64 weights), not per super-block.
#[inline(always)]
pub fn q4_k_gemm(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    q4_k_repacked::<true>(x, y)
}

/// ggml's 6-bit scale and min of sub-block `j` (`get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (i32, i32) {
    if j < 4 {
        ((q[j] & 63) as i32, (q[j + 4] & 63) as i32)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i32,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i32,
        )
    }
}

/// The repacked Q4_K kernels per weight row: exact integer sums of `scale * q4 * q8` and
/// of `min * bsum` over a super-block (`PER_PAIR == false`, gemv) or over each pair of
/// sub-blocks (`PER_PAIR`, gemm), each fused-multiply-added with `d * y.d` and
/// `dmin * y.d` into two accumulators, subtracted at the end.
#[inline(always)]
fn q4_k_repacked<const PER_PAIR: bool>(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let d = f16_to_f32(a.d) * b.d;
        let dmin = f16_to_f32(a.dmin) * b.d;
        let (mut isum, mut imin) = (0i32, 0i32);
        for p in 0..4 {
            let qs = &a.qs[32 * p..32 * p + 32];
            let q8 = &b.qs[64 * p..64 * p + 64];
            let (mut lo, mut hi) = (0i32, 0i32);
            for i in 0..32 {
                lo += (qs[i] & 15) as i32 * q8[i] as i32;
                hi += (qs[i] >> 4) as i32 * q8[32 + i] as i32;
            }
            let (s0, m0) = scale_min_k4(2 * p, &a.scales);
            let (s1, m1) = scale_min_k4(2 * p + 1, &a.scales);
            let bs = |j: usize| b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32;
            isum += s0 * lo + s1 * hi;
            imin += m0 * bs(2 * p) + m1 * bs(2 * p + 1);
            if PER_PAIR {
                acc = (isum as f32).mul_add(d, acc);
                acc_min = (imin as f32).mul_add(dmin, acc_min);
                (isum, imin) = (0, 0);
            }
        }
        if !PER_PAIR {
            acc = (isum as f32).mul_add(d, acc);
            acc_min = (imin as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

/// `hsum_float_8`: the one order ggml adds its eight accumulator lanes in.
#[inline(always)]
pub fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Whether the AVX2 + FMA paths may run (`SMELT_NO_SIMD` turns them off).
#[inline(always)]
pub(super) fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        smelt_quant::simd::has_avx2()
            && *F16C.get_or_init(|| std::arch::is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Eight lanes of four consecutive products each, as `maddubs` + `madd` group them.
#[inline(always)]
fn lanes4(q: &[i32; 32], y: &[i8; 32]) -> [i32; 8] {
    std::array::from_fn(|l| (0..4).map(|k| q[4 * l + k] * y[4 * l + k] as i32).sum())
}

#[inline(always)]
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// Formats with ggml-order dots for one, four, and four-times-two rows: the AVX2 path when
/// the CPU has it, else the portable one, which gives the same bits.
macro_rules! ggml_order {
    ($($B:ty => $one:ident, $four:ident, $four_by_two:ident;)*) => {$(
        impl GgmlDot for $B {
            fn ggml_dot4x2(x: [&[Self]; 4], y0: &[Self::Act], y1: &[Self::Act]) -> [[f32; 4]; 2] {
                #[cfg(target_arch = "x86_64")]
                if simd() {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    return unsafe { x86::$four_by_two(x, y0, y1) };
                }
                [
                    x.map(|x| portable::$one(x, y0)),
                    x.map(|x| portable::$one(x, y1)),
                ]
            }

            fn ggml_dot4(x: [&[Self]; 4], y: &[Self::Act]) -> [f32; 4] {
                #[cfg(target_arch = "x86_64")]
                if simd() {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    return unsafe { x86::$four(x, y) };
                }
                x.map(|x| portable::$one(x, y))
            }

            fn ggml_dot(x: &[Self], y: &[Self::Act]) -> f32 {
                #[cfg(target_arch = "x86_64")]
                if simd() {
                    // SAFETY: AVX2 and FMA were detected at run time.
                    return unsafe { x86::$one(x, y) };
                }
                portable::$one(x, y)
            }
        }
    )*};
}

ggml_order! {
    BlockQ4_1 => q4_1, q4_1_x4, q4_1_x4x2;
    BlockQ5_0 => q5_0, q5_0_x4, q5_0_x4x2;
    BlockQ8_0 => q8_0, q8_0_x4, q8_0_x4x2;
}

impl GgmlDot for BlockQ8_1 {
    fn ggml_dot(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        <Self as Block>::vec_dot(x, y)
    }
}

/// Batches of eight or more tokens take ggml's tiled K-quant matmul (`ggml-cpu/tiled`,
/// AVX2 kernel): per super-block the exact integer dot, times the weight's `d`, then
/// fused-multiply-added with the activation's `d` into one accumulator.
#[inline(always)]
pub fn q6_k_tiled(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut isum = 0i32;
        for j in 0..2 {
            let (ql, qh, q8) = (&a.ql[64 * j..], &a.qh[32 * j..], &b.qs[128 * j..]);
            for k in 0..4 {
                let mut s = 0i32;
                let mut s2 = 0i32;
                for i in 0..32 {
                    let lo = ql[i + 32 * (k & 1)];
                    let lo = if k < 2 { lo & 15 } else { lo >> 4 } as i32;
                    let hi = ((qh[i] >> (2 * k)) & 3) as i32;
                    let v = ((lo | (hi << 4)) - 32) * q8[32 * k + i] as i32;
                    if i < 16 {
                        s += v;
                    } else {
                        s2 += v;
                    }
                }
                let sb = 8 * j + 2 * k;
                isum += a.scales[sb] as i32 * s + a.scales[sb + 1] as i32 * s2;
            }
        }
        let res = f16_to_f32(a.d) * isum as f32;
        acc = res.mul_add(b.d, acc);
    }
    acc
}

impl GgmlDot for BlockQ6K {
    const BATCH_IS_SINGLE: bool = false;

    #[inline(always)]
    fn ggml_dot_in_batch(x: &[Self], y: &[BlockQ8K], _t: usize, n_tok: usize) -> f32 {
        if n_tok >= 8 {
            q6_k_tiled(x, y)
        } else {
            Self::ggml_dot(x, y)
        }
    }

    fn ggml_dot(x: &[Self], y: &[BlockQ8K]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { x86::q6_k(x, y) };
        }
        portable::q6_k(x, y)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! The AVX2 + FMA kernels, instruction for instruction ggml's.
    use super::*;
    use std::arch::x86_64::*;

    /// ggml's `hsum_float_8`: the eight lanes summed in its order.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in crate::backend::cpu) unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    /// ggml's `bytes_from_nibbles_32`: low nibbles, then high nibbles.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(in crate::backend::cpu) unsafe fn bytes_from_nibbles_32(qs: &[u8; 16]) -> __m256i {
        let tmp = _mm_loadu_si128(qs.as_ptr().cast());
        let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
        _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
    }

    /// ggml's `bytes_from_bits_32`: byte `j` is 0xFF where bit `j` is set.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(in crate::backend::cpu) unsafe fn bytes_from_bits_32(qh: [u8; 4]) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
        let dot = _mm256_maddubs_epi16(ax, sy);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8_pairs_float(ax, sy)
    }

    /// [`q4_k_repacked`]`::<false>` (the repacked gemv's order) with the exact integer sums
    /// of each super-block formed eight lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_gemv(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
        let m4 = _mm256_set1_epi8(15);
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (a, b) in x.iter().zip(y) {
            let (ad, admin) = h2f_pair(&a.d);
            let (d, dmin) = (ad * b.d, admin * b.d);
            let mut sc = [0i16; 8];
            let mut mins = [0i16; 16];
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &a.scales);
                sc[j] = s as i16;
                mins[2 * j] = m as i16;
                mins[2 * j + 1] = m as i16;
            }
            let mut vi = _mm256_setzero_si256();
            for p in 0..4 {
                let v = _mm256_loadu_si256(a.qs.as_ptr().add(32 * p).cast());
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                let y0 = _mm256_loadu_si256(b.qs.as_ptr().add(64 * p).cast());
                let y1 = _mm256_loadu_si256(b.qs.as_ptr().add(64 * p + 32).cast());
                let s0 = _mm256_set1_epi16(sc[2 * p]);
                let s1 = _mm256_set1_epi16(sc[2 * p + 1]);
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
                vi = _mm256_add_epi32(vi, _mm256_add_epi32(p0, p1));
            }
            let vm = _mm256_madd_epi16(
                _mm256_loadu_si256(b.bsums.as_ptr().cast()),
                _mm256_loadu_si256(mins.as_ptr().cast()),
            );
            acc = (hsum_i32_8(vi) as f32).mul_add(d, acc);
            acc_min = (hsum_i32_8(vm) as f32).mul_add(dmin, acc_min);
        }
        acc - acc_min
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn hsum_i32_8(v: __m256i) -> i32 {
        let s4 = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for (a, b) in x.iter().zip(y) {
            let (d0, m0) = h2f_pair(&a.d);
            let (d1, s1) = h2f_pair(&b.d);
            summs = m0.mul_add(s1, summs);
            let d0d1 = _mm256_set1_ps(d0 * d1);
            let qx = bytes_from_nibbles_32(&a.qs);
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let xy = mul_sum_us8_pairs_float(qx, qy);
            acc = _mm256_fmadd_ps(d0d1, xy, acc);
        }
        hsum_float_8(acc) + summs
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let d = _mm256_set1_ps(h2f_pair(&a.d).0 * h2f_pair(&b.d).0);
            let mut qx = bytes_from_nibbles_32(&a.qs);
            let bxhi =
                _mm256_andnot_si256(bytes_from_bits_32(a.qh), _mm256_set1_epi8(0xF0u8 as i8));
            qx = _mm256_or_si256(qx, bxhi);
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let q = mul_sum_i8_pairs_float(qx, qy);
            acc = _mm256_fmadd_ps(d, q, acc);
        }
        hsum_float_8(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let d = _mm256_set1_ps(h2f_pair(&a.d).0 * h2f_pair(&b.d).0);
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let q = mul_sum_i8_pairs_float(qx, qy);
            acc = _mm256_fmadd_ps(d, q, acc);
        }
        hsum_float_8(acc)
    }

    /// One f16 widened with F16C (exact, like the software conversion).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn h2f(h: half::f16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
    }

    /// The four f16 at `p` widened (exact) by `vcvtph2ps` straight from memory. Written as
    /// asm because LLVM turns any narrower form into `vpinsrw`, which merges into whatever
    /// register it picks: in `q4_1` that was the running `summs`, in `q8_0` the accumulator,
    /// chaining every block's scale load behind the previous block's FMA (a third of the
    /// decode time). `p` must have 8 readable bytes.
    #[inline(always)]
    unsafe fn f16x4_at(p: *const u8) -> __m128 {
        let v: __m128;
        std::arch::asm!(
            "vcvtph2ps {v}, qword ptr [{p}]",
            p = in(reg) p,
            v = out(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags),
        );
        v
    }

    /// The f16 at `h` and the one after it (every block type this is used on has at least 8
    /// bytes from its leading f16 scale to its end).
    #[inline(always)]
    unsafe fn h2f_pair(h: &half::f16) -> (f32, f32) {
        let v = f16x4_at((h as *const half::f16).cast());
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// Q6_K's scale, its block's last field: the last of the block's last 8 bytes.
    #[inline(always)]
    unsafe fn q6_k_scale(b: &BlockQ6K) -> f32 {
        let end = (b as *const BlockQ6K)
            .cast::<u8>()
            .add(std::mem::size_of::<BlockQ6K>());
        let v = f16x4_at(end.sub(8));
        _mm_cvtss_f32(_mm_shuffle_ps::<0xff>(v, v))
    }

    /// Four f16 values widened at once (exact).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn f16x4(h: [half::f16; 4]) -> __m128 {
        let bits = h.map(|h| h.to_bits() as u64);
        let packed = bits[0] | bits[1] << 16 | bits[2] << 32 | bits[3] << 48;
        _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64))
    }

    /// Four rows at once: each row's operations are exactly [`q4_1`]'s.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_x4(x: [&[BlockQ4_1]; 4], y: &[BlockQ8_1]) -> [f32; 4] {
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(y.len());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut summs = [0f32; 4];
        for (i, b) in y[..n].iter().enumerate() {
            let (d1, s1) = h2f_pair(&b.d);
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let a: [&BlockQ4_1; 4] = std::array::from_fn(|r| x[r].get_unchecked(i));
            // The four rows' d and m widened together (exact), then `d * d1` per row:
            // the same IEEE products as one at a time.
            let dd = _mm_mul_ps(f16x4(a.map(|a| a.d)), _mm_set1_ps(d1));
            let m: [f32; 4] = std::mem::transmute(f16x4(a.map(|a| a.m)));
            let dd: [f32; 4] = std::mem::transmute(dd);
            for r in 0..4 {
                summs[r] = m[r].mul_add(s1, summs[r]);
                let xy = mul_sum_us8_pairs_float(bytes_from_nibbles_32(&a[r].qs), qy);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd[r]), xy, acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]) + summs[r])
    }

    /// Four rows at once: each row's operations are exactly [`q5_0`]'s.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_x4(x: [&[BlockQ5_0]; 4], y: &[BlockQ8_0]) -> [f32; 4] {
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(y.len());
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, b) in y[..n].iter().enumerate() {
            let d1 = h2f_pair(&b.d).0;
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let a: [&BlockQ5_0; 4] = std::array::from_fn(|r| x[r].get_unchecked(i));
            let dd: [f32; 4] =
                std::mem::transmute(_mm_mul_ps(f16x4(a.map(|a| a.d)), _mm_set1_ps(d1)));
            for r in 0..4 {
                let bxhi = _mm256_andnot_si256(
                    bytes_from_bits_32(a[r].qh),
                    _mm256_set1_epi8(0xF0u8 as i8),
                );
                let qx = _mm256_or_si256(bytes_from_nibbles_32(&a[r].qs), bxhi);
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd[r]), q, acc[r]);
            }
        }
        acc.map(|a| hsum_float_8(a))
    }

    /// Four rows at once: each row's operations are exactly [`q8_0`]'s.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_x4(x: [&[BlockQ8_0]; 4], y: &[BlockQ8_0]) -> [f32; 4] {
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(y.len());
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, b) in y[..n].iter().enumerate() {
            let d1 = h2f_pair(&b.d).0;
            let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let a: [&BlockQ8_0; 4] = std::array::from_fn(|r| x[r].get_unchecked(i));
            let dd: [f32; 4] =
                std::mem::transmute(_mm_mul_ps(f16x4(a.map(|a| a.d)), _mm_set1_ps(d1)));
            for r in 0..4 {
                let qx = _mm256_loadu_si256(a[r].qs.as_ptr().cast());
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd[r]), q, acc[r]);
            }
        }
        acc.map(|a| hsum_float_8(a))
    }

    /// The weight bytes of a block as ggml's kernels feed them to `maddubs`-style products,
    /// for the 4x2 kernels below.
    trait Unpack {
        unsafe fn qx(&self) -> __m256i;
    }
    impl Unpack for BlockQ4_1 {
        #[inline(always)]
        unsafe fn qx(&self) -> __m256i {
            bytes_from_nibbles_32(&self.qs)
        }
    }
    impl Unpack for BlockQ5_0 {
        #[inline(always)]
        unsafe fn qx(&self) -> __m256i {
            let bxhi =
                _mm256_andnot_si256(bytes_from_bits_32(self.qh), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(bytes_from_nibbles_32(&self.qs), bxhi)
        }
    }
    impl Unpack for BlockQ8_0 {
        #[inline(always)]
        unsafe fn qx(&self) -> __m256i {
            _mm256_loadu_si256(self.qs.as_ptr().cast())
        }
    }

    /// Four rows times two activation rows: per output exactly [`q4_1`]'s operations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_x4x2(
        x: [&[BlockQ4_1]; 4],
        y0: &[BlockQ8_1],
        y1: &[BlockQ8_1],
    ) -> [[f32; 4]; 2] {
        let n = x
            .iter()
            .map(|r| r.len())
            .min()
            .unwrap_or(0)
            .min(y0.len())
            .min(y1.len());
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        let mut summs = [[0f32; 4]; 2];
        for i in 0..n {
            let (b0, b1) = (y0.get_unchecked(i), y1.get_unchecked(i));
            let ((d0, s0), (d1, s1)) = (h2f_pair(&b0.d), h2f_pair(&b1.d));
            let qy0 = _mm256_loadu_si256(b0.qs.as_ptr().cast());
            let qy1 = _mm256_loadu_si256(b1.qs.as_ptr().cast());
            for r in 0..4 {
                let a = x[r].get_unchecked(i);
                let (da, ma) = h2f_pair(&a.d);
                summs[0][r] = ma.mul_add(s0, summs[0][r]);
                summs[1][r] = ma.mul_add(s1, summs[1][r]);
                let qx = a.qx();
                let xy0 = mul_sum_us8_pairs_float(qx, qy0);
                let xy1 = mul_sum_us8_pairs_float(qx, qy1);
                acc[0][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * d0), xy0, acc[0][r]);
                acc[1][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * d1), xy1, acc[1][r]);
            }
        }
        std::array::from_fn(|t| std::array::from_fn(|r| hsum_float_8(acc[t][r]) + summs[t][r]))
    }

    /// Four rows times two activation rows for the signed formats (Q5_0, Q8_0): per output
    /// exactly [`q5_0`]'s / [`q8_0`]'s operations.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn signed_x4x2<X: Unpack + HasD>(
        x: [&[X]; 4],
        y0: &[BlockQ8_0],
        y1: &[BlockQ8_0],
    ) -> [[f32; 4]; 2] {
        let n = x
            .iter()
            .map(|r| r.len())
            .min()
            .unwrap_or(0)
            .min(y0.len())
            .min(y1.len());
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        for i in 0..n {
            let (b0, b1) = (y0.get_unchecked(i), y1.get_unchecked(i));
            let (d0, d1) = (h2f_pair(&b0.d).0, h2f_pair(&b1.d).0);
            let qy0 = _mm256_loadu_si256(b0.qs.as_ptr().cast());
            let qy1 = _mm256_loadu_si256(b1.qs.as_ptr().cast());
            for r in 0..4 {
                let a = x[r].get_unchecked(i);
                let da = h2f(a.d());
                let qx = a.qx();
                let ax = _mm256_sign_epi8(qx, qx);
                let p0 = mul_sum_us8_pairs_float(ax, _mm256_sign_epi8(qy0, qx));
                let p1 = mul_sum_us8_pairs_float(ax, _mm256_sign_epi8(qy1, qx));
                acc[0][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * d0), p0, acc[0][r]);
                acc[1][r] = _mm256_fmadd_ps(_mm256_set1_ps(da * d1), p1, acc[1][r]);
            }
        }
        std::array::from_fn(|t| std::array::from_fn(|r| hsum_float_8(acc[t][r])))
    }

    trait HasD {
        fn d(&self) -> half::f16;
    }
    impl HasD for BlockQ5_0 {
        #[inline(always)]
        fn d(&self) -> half::f16 {
            self.d
        }
    }
    impl HasD for BlockQ8_0 {
        #[inline(always)]
        fn d(&self) -> half::f16 {
            self.d
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_x4x2(
        x: [&[BlockQ5_0]; 4],
        y0: &[BlockQ8_0],
        y1: &[BlockQ8_0],
    ) -> [[f32; 4]; 2] {
        signed_x4x2(x, y0, y1)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_x4x2(
        x: [&[BlockQ8_0]; 4],
        y0: &[BlockQ8_0],
        y1: &[BlockQ8_0],
    ) -> [[f32; 4]; 2] {
        signed_x4x2(x, y0, y1)
    }

    #[rustfmt::skip]
    static SCALE_SHUFFLE: [u8; 128] = [
         0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
         4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
         6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7,
         8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9,
        10,10,10,10,10,10,10,10, 11,11,11,11,11,11,11,11,
        12,12,12,12,12,12,12,12, 13,13,13,13,13,13,13,13,
        14,14,14,14,14,14,14,14, 15,15,15,15,15,15,15,15,
    ];

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scale_shuffle(i: usize) -> __m128i {
        _mm_loadu_si128(SCALE_SHUFFLE.as_ptr().add(16 * i).cast())
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let d = b.d * q6_k_scale(a);
            let mut q4 = a.ql.as_ptr();
            let mut qh = a.qh.as_ptr();
            let mut q8 = b.qs.as_ptr();
            let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
            let scales = _mm_loadu_si128(a.scales.as_ptr().cast());
            let scales_16 = _mm256_cvtepi8_epi16(scales);
            let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            let mut sumi = _mm256_setzero_si256();
            let mut is = 0;
            for _ in 0..2 {
                let q4bits1 = _mm256_loadu_si256(q4.cast());
                q4 = q4.add(32);
                let q4bits2 = _mm256_loadu_si256(q4.cast());
                q4 = q4.add(32);
                let q4bits_h = _mm256_loadu_si256(qh.cast());
                qh = qh.add(32);
                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                let q4_2 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                let q4_3 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
                let q8_0 = _mm256_loadu_si256(q8.cast());
                let q8_1 = _mm256_loadu_si256(q8.add(32).cast());
                let q8_2 = _mm256_loadu_si256(q8.add(64).cast());
                let q8_3 = _mm256_loadu_si256(q8.add(96).cast());
                q8 = q8.add(128);
                let mut p16_0 = _mm256_maddubs_epi16(q4_0, q8_0);
                let mut p16_1 = _mm256_maddubs_epi16(q4_1, q8_1);
                let mut p16_2 = _mm256_maddubs_epi16(q4_2, q8_2);
                let mut p16_3 = _mm256_maddubs_epi16(q4_3, q8_3);
                let scale_0 = _mm_shuffle_epi8(scales, scale_shuffle(is));
                let scale_1 = _mm_shuffle_epi8(scales, scale_shuffle(is + 1));
                let scale_2 = _mm_shuffle_epi8(scales, scale_shuffle(is + 2));
                let scale_3 = _mm_shuffle_epi8(scales, scale_shuffle(is + 3));
                is += 4;
                p16_0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_0), p16_0);
                p16_1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_1), p16_1);
                p16_2 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_2), p16_2);
                p16_3 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_3), p16_3);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_2, p16_3));
            }
            sumi = _mm256_sub_epi32(sumi, q8sclsub);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

/// The same lanes in scalars (`SMELT_NO_SIMD`, CPUs without AVX2 + FMA).
pub mod portable {
    use super::*;

    pub fn q4_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let mut acc = [0f32; 8];
        let mut summs = 0f32;
        for (a, b) in x.iter().zip(y) {
            let d = f16_to_f32(a.d) * f16_to_f32(b.d);
            summs = f16_to_f32(a.m).mul_add(f16_to_f32(b.s), summs);
            let q: [i32; 32] = std::array::from_fn(|j| {
                let byte = a.qs[j % 16];
                (if j < 16 { byte & 15 } else { byte >> 4 }) as i32
            });
            fma_lanes(&mut acc, d, lanes4(&q, &b.qs));
        }
        hsum8(&acc) + summs
    }

    pub fn q5_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = [0f32; 8];
        for (a, b) in x.iter().zip(y) {
            let d = f16_to_f32(a.d) * f16_to_f32(b.d);
            let qh = u32::from_le_bytes(a.qh);
            let q: [i32; 32] = std::array::from_fn(|j| {
                let byte = a.qs[j % 16];
                let nib = (if j < 16 { byte & 15 } else { byte >> 4 }) as i32;
                nib + 16 * ((qh >> j) & 1) as i32 - 16
            });
            fma_lanes(&mut acc, d, lanes4(&q, &b.qs));
        }
        hsum8(&acc)
    }

    pub fn q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = [0f32; 8];
        for (a, b) in x.iter().zip(y) {
            let d = f16_to_f32(a.d) * f16_to_f32(b.d);
            let q: [i32; 32] = std::array::from_fn(|j| a.qs[j] as i32);
            fma_lanes(&mut acc, d, lanes4(&q, &b.qs));
        }
        hsum8(&acc)
    }

    pub fn q6_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
        let mut acc = [0f32; 8];
        for (a, b) in x.iter().zip(y) {
            let d = b.d * f16_to_f32(a.d);
            let sc = |i: usize| a.scales[i] as i32;
            let mut lanes: [i32; 8] = std::array::from_fn(|l| {
                -32 * (b.bsums[2 * l] as i32 * sc(2 * l)
                    + b.bsums[2 * l + 1] as i32 * sc(2 * l + 1))
            });
            for j in 0..2 {
                let (ql, qh) = (&a.ql[64 * j..], &a.qh[32 * j..]);
                for k in 0..4 {
                    for bi in 0..32 {
                        let lo = ql[bi + 32 * (k & 1)];
                        let lo = if k < 2 { lo & 15 } else { lo >> 4 } as i32;
                        let hi = ((qh[bi] >> (2 * k)) & 3) as i32;
                        let e = 128 * j + 32 * k + bi;
                        lanes[bi / 4] += sc(e / 16) * (lo | (hi << 4)) * b.qs[e] as i32;
                    }
                }
            }
            fma_lanes(&mut acc, d, lanes);
        }
        hsum8(&acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::act_quant::quantize_act;
    use bytemuck::Zeroable;
    use rand::{Rng, SeedableRng};
    use smelt_quant::Quantize;

    fn blocks<B: Block + Quantize>(rng: &mut impl Rng, n: usize) -> (Vec<B>, Vec<B::Act>) {
        let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-5.0f32..5.0)).collect();
        let mut wb = vec![B::zeroed(); n / B::WEIGHTS];
        B::quantize_row(&w, &mut wb);
        let mut xb = vec![<B::Act as Zeroable>::zeroed(); n / <B::Act as Block>::WEIGHTS];
        quantize_act::<B::Act>(&x, &mut xb);
        (wb, xb)
    }

    /// The scalar twins give the AVX2 kernels' bits (what `SMELT_NO_SIMD=1` relies on).
    #[test]
    fn portable_equals_simd() {
        if !simd() {
            eprintln!("no AVX2 + FMA here: only the portable path exists");
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..20 {
            let (w, x) = blocks::<BlockQ4_1>(&mut rng, 1024);
            assert_eq!(
                portable::q4_1(&w, &x).to_bits(),
                BlockQ4_1::ggml_dot(&w, &x).to_bits()
            );
            let (w, x) = blocks::<BlockQ5_0>(&mut rng, 1024);
            assert_eq!(
                portable::q5_0(&w, &x).to_bits(),
                BlockQ5_0::ggml_dot(&w, &x).to_bits()
            );
            let (w, x) = blocks::<BlockQ8_0>(&mut rng, 1024);
            assert_eq!(
                portable::q8_0(&w, &x).to_bits(),
                BlockQ8_0::ggml_dot(&w, &x).to_bits()
            );
            let (w, x) = blocks::<BlockQ6K>(&mut rng, 1024);
            assert_eq!(
                portable::q6_k(&w, &x).to_bits(),
                BlockQ6K::ggml_dot(&w, &x).to_bits()
            );
            let (w, x) = blocks::<BlockQ4K>(&mut rng, 1024);
            assert_eq!(
                q4_k_repacked::<false>(&w, &x).to_bits(),
                BlockQ4K::ggml_dot(&w, &x).to_bits()
            );
        }
    }
}
