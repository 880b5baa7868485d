//! AVX2 twins of [`ggml_math`]'s lane functions for the activations and the softmax:
//! eight lanes per instruction, the same IEEE operations in the same order on each lane, so
//! the same bits as the scalar code (which stays the reference and the fallback without
//! AVX2/FMA/F16C or with `SMELT_NO_SIMD`). llama.cpp runs these loops through AVX-512's
//! 16-lane `ggml_v_expf`/`ggml_v_silu`; one scalar lane each was ~30 instructions here, run
//! once per attention score and per FFN activation.
//!
//! Every function here must only run after [`ok`] said yes.

use super::ggml_math;

/// Whether the AVX2 + FMA + F16C paths may run (`SMELT_NO_SIMD` turns them off).
#[inline(always)]
pub fn ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static F16C: OnceLock<bool> = OnceLock::new();
        ggml_math::fma_ok() && *F16C.get_or_init(|| std::arch::is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ggml_math;

    #[inline(always)]
    unsafe fn c(bits: u32) -> __m256 {
        _mm256_set1_ps(f32::from_bits(bits))
    }

    /// [`ggml_math::expf`] of eight lanes. Lanes whose exponent `n` lies outside the range
    /// a single power-of-two multiply covers (`|n| > 126` but not past the ±192 flush:
    /// results that are subnormal or overflow through `vscalefps`'s single rounding) are
    /// recomputed by the scalar code, so every lane has the scalar bits.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn expf8(x: __m256) -> __m256 {
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let neg_n = _mm256_xor_ps(n, _mm256_set1_ps(-0.0));
        let b = _mm256_fmadd_ps(
            neg_n,
            c(0x35bf_be8e),
            _mm256_fmadd_ps(neg_n, c(0x3f31_7200), x),
        );
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        // `j * 2^n` for -126 <= n <= 127: one multiply by an exact power of two.
        let ni = _mm256_cvttps_epi32(n);
        let pow = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(ni, _mm256_set1_epi32(127)),
            23,
        ));
        let scaled = _mm256_mul_ps(j, pow);
        // Past |n| > 192: exactly 0 (n <= 0) or infinity.
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let flush = _mm256_blendv_ps(
            _mm256_set1_ps(f32::INFINITY),
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
        );
        let out = _mm256_blendv_ps(scaled, flush, big);
        let odd = _mm256_andnot_ps(
            big,
            _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_LT_OQ>(n, _mm256_set1_ps(-126.0)),
                _mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_set1_ps(127.0)),
            ),
        );
        if _mm256_movemask_ps(odd) == 0 {
            return out;
        }
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), x);
        for v in &mut v {
            *v = ggml_math::expf(*v);
        }
        _mm256_loadu_ps(v.as_ptr())
    }

    /// [`ggml_math::silu`] of eight lanes: `x / (1 + expf(0 - x))`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn silu8(x: __m256) -> __m256 {
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// `g = silu(g) * u` over the first `g.len() / 16 * 16` values (ggml's vector part).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu_whole16(g: &mut [f32], u: &[f32]) -> usize {
        let whole = g.len().min(u.len()) / 16 * 16;
        let (gp, up) = (g.as_mut_ptr(), u.as_ptr());
        for i in (0..whole).step_by(8) {
            let s = silu8(_mm256_loadu_ps(gp.add(i)));
            _mm256_storeu_ps(gp.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(up.add(i))));
        }
        whole
    }

    /// ggml's GELU (tanh form, looked up by the input rounded to f16) times `u`, eight at a
    /// time: 0 at or below -10, `x * u` at or above 10, else `table[f16(x)] * u`. Returns how
    /// many values it did (whole groups of eight).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn geglu8(g: &mut [f32], u: &[f32], table: &[f32]) -> usize {
        debug_assert_eq!(table.len(), 1 << 16);
        let whole = g.len().min(u.len()) / 8 * 8;
        let (gp, up) = (g.as_mut_ptr(), u.as_ptr());
        for i in (0..whole).step_by(8) {
            let x = _mm256_loadu_ps(gp.add(i));
            let y = _mm256_loadu_ps(up.add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let idx = _mm256_cvtepu16_epi32(h);
            let t = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
            let mid = _mm256_mul_ps(t, y);
            let hi = _mm256_mul_ps(x, y);
            let r = _mm256_blendv_ps(
                mid,
                hi,
                _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(10.0)),
            );
            let r = _mm256_blendv_ps(
                r,
                _mm256_setzero_ps(),
                _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(-10.0)),
            );
            _mm256_storeu_ps(gp.add(i), r);
        }
        whole
    }

    /// `_mm512_reduce_add_ps` of 16 lanes held as two halves (`lo` = lanes 0..8).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn reduce16(lo: __m256, hi: __m256) -> f32 {
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t7 = _mm_add_ps(_mm_movehl_ps(t6, t6), t6);
        _mm_cvtss_f32(_mm_add_ss(_mm_movehdup_ps(t7), t7))
    }

    /// The softmax's exponentials and sum as llama.cpp computes them: `x = expf(x - max)`
    /// for every value (`x.len()` a multiple of 16), each chunk of 16 reduced as
    /// `_mm512_reduce_add_ps` and the chunks summed in order in f64.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sum16(x: &mut [f32], max: f32) -> f64 {
        let m = _mm256_set1_ps(max);
        let p = x.as_mut_ptr();
        let mut sum = 0f64;
        for i in (0..x.len() / 16 * 16).step_by(16) {
            let lo = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
            let hi = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), m));
            _mm256_storeu_ps(p.add(i), lo);
            _mm256_storeu_ps(p.add(i + 8), hi);
            sum += reduce16(lo, hi) as f64;
        }
        sum
    }

    /// `x = f16(x * inv)` held in f32 (ggml rounds the probabilities to f16 before they
    /// weight V), eight at a time with F16C, the rest one by one.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn scale_round_f16(x: &mut [f32], inv: f32) {
        let s = _mm256_set1_ps(inv);
        let p = x.as_mut_ptr();
        let whole = x.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), s);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
        }
        for v in &mut x[whole..] {
            *v = smelt_quant::fp::f16_to_f32(smelt_quant::fp::f32_to_f16(*v * inv));
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::arch::x86_64::*;

    /// Inputs that reach every branch: the flush past ±192, the subnormal and overflowing
    /// exponents, zeros of both signs, infinities, and a dense sweep.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-3000..=3000).map(|i| i as f32 * 0.0713).collect();
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -87.0,
            -87.4,
            -88.0,
            -100.0,
            -103.9,
            -104.0,
            -132.0,
            -133.5,
            88.0,
            88.8,
            89.0,
            120.0,
            133.0,
            134.0,
            f32::MIN_POSITIVE,
            1e-30,
            -1e-30,
        ]);
        let mut s = 0x1234_5678u32;
        for _ in 0..20000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s & 0xc3ff_ffff)); // |x| < 2^8 or so, both signs
        }
        while !v.len().is_multiple_of(16) {
            v.push(1.5);
        }
        v
    }

    #[test]
    fn vector_exp_silu_equal_scalar_bits() {
        if !ok() {
            return;
        }
        let x = inputs();
        for c in x.chunks_exact(8) {
            let (mut e, mut s) = ([0f32; 8], [0f32; 8]);
            // SAFETY: `ok()` checked AVX2, FMA and F16C.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(e.as_mut_ptr(), expf8(v));
                _mm256_storeu_ps(s.as_mut_ptr(), silu8(v));
            }
            for i in 0..8 {
                assert_eq!(
                    e[i].to_bits(),
                    ggml_math::expf(c[i]).to_bits(),
                    "exp {}",
                    c[i]
                );
                let want = ggml_math::silu(c[i]);
                assert!(
                    s[i].to_bits() == want.to_bits() || (s[i].is_nan() && want.is_nan()),
                    "silu {}",
                    c[i]
                );
            }
        }
    }

    #[test]
    fn vector_softmax_pieces_equal_scalar_bits() {
        if !ok() {
            return;
        }
        let mut x: Vec<f32> = inputs()
            .into_iter()
            .filter(|v| v.is_finite() && v.abs() < 300.0)
            .collect();
        x.truncate(x.len() / 16 * 16);
        x[5] = f32::NEG_INFINITY; // a masked position
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut want = x.clone();
        let mut sum = 0f64;
        for chunk in want.chunks_exact_mut(16) {
            let mut e = [0f32; 16];
            for (x, e) in chunk.iter_mut().zip(&mut e) {
                *x = ggml_math::expf(*x - max);
                *e = *x;
            }
            sum += ggml_math::reduce16(&e) as f64;
        }
        // SAFETY: `ok()` checked AVX2, FMA and F16C.
        let got_sum = unsafe { exp_sum16(&mut x, max) };
        assert_eq!(got_sum.to_bits(), sum.to_bits());
        assert!(want.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()));
        let inv = (1.0 / sum) as f32;
        for v in &mut want {
            *v = smelt_quant::fp::f16_to_f32(smelt_quant::fp::f32_to_f16(*v * inv));
        }
        let mut y = x.clone();
        y.push(0.3); // a ragged tail
        want.push(smelt_quant::fp::f16_to_f32(smelt_quant::fp::f32_to_f16(
            0.3 * inv,
        )));
        // SAFETY: as above.
        unsafe { scale_round_f16(&mut y, inv) };
        assert!(want.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
