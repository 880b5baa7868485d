//! Activation quantization as ggml's CPU backend does it on x86, which is not ggml's
//! reference quantizer: for Q8_0 and Q8_1 it scales by `127 / amax` (not `1 / (amax / 127)`)
//! and rounds halves to even (`_mm256_round_ps`), not away from zero. Matching it keeps our
//! matmul inputs identical to llama.cpp's; Q8_K (and the float types) use the reference
//! code on x86, which `smelt-quant` already reproduces.

use smelt_quant::fp::f32_to_f16;
use smelt_quant::legacy::{BlockQ8_0, BlockQ8_1};
use smelt_quant::{Block, GgmlType, Quantize};

/// Quantizes one activation row to `A`, the weight format's paired type.
pub fn quantize_act<A: Block + Quantize>(x: &[f32], dst: &mut [A]) {
    match A::TYPE {
        GgmlType::Q8_0 => {
            if let Ok(d) = bytemuck::try_cast_slice_mut::<A, BlockQ8_0>(dst) {
                for (b, x) in d.iter_mut().zip(x.chunks_exact(32)) {
                    let (d, _) = q8_block(x, &mut b.qs);
                    b.d = f32_to_f16(d);
                }
                return;
            }
        }
        GgmlType::Q8_1 => {
            if let Ok(d) = bytemuck::try_cast_slice_mut::<A, BlockQ8_1>(dst) {
                for (b, x) in d.iter_mut().zip(x.chunks_exact(32)) {
                    let (d, sum) = q8_block(x, &mut b.qs);
                    b.d = f32_to_f16(d);
                    b.s = f32_to_f16(d * sum as f32);
                }
                return;
            }
        }
        _ => {}
    }
    A::quantize_row(x, dst);
}

/// One 32-value block: returns the f32 scale (stored rounded to f16) and the sum of the
/// quants. Q8_1's `s` is the sum times the f32 `d` in ggml, not the rounded f16 one.
#[inline]
fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if x.len() == 32 && super::ggml_dot::simd() {
        // SAFETY: AVX2 was detected at run time; x has 32 values.
        return unsafe { q8_block_avx2(x, qs) };
    }
    q8_block_scalar(x, qs)
}

/// [`q8_block_scalar`] eight values per instruction, as ggml's AVX2 `quantize_row_q8_0/1`
/// (the same max, division, multiply and round-half-even per value; integer sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q8_block_avx2(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
    let a = v.map(|v| _mm256_andnot_ps(sign, v));
    let m8 = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m8, 1), _mm256_castps256_ps128(m8));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q = v.map(|v| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, id),
        );
        _mm256_cvtps_epi32(r)
    });
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
    let p16 = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs.as_mut_ptr().cast(), p);
    (d, sum)
}

fn q8_block_scalar(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = round_ties_even(v * id) as i32;
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}

/// Rounds half to even like `_mm256_round_ps(_MM_ROUND_NEAREST)`; `f32::round_ties_even`
/// is a libm call without SSE4.1, and adding and removing 1.5 * 2^23 does the same rounding
/// in two additions for the |x| <= 127 this is used on.
#[inline(always)]
fn round_ties_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The AVX2 block gives the scalar block's bytes, scale and sum (ties, zeros, signs).
    #[test]
    fn q8_block_simd_equals_scalar() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for case in 0..2000 {
            let x: Vec<f32> = (0..32)
                .map(|i| match case % 4 {
                    0 => rng.gen_range(-3.0..3.0),
                    1 => (rng.gen_range(-254..=254) as f32) * 0.5,
                    2 => 0.0,
                    _ => (i as f32 - 15.5) * 1e-3,
                })
                .collect();
            let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
            let sa = q8_block(&x, &mut a);
            let sb = q8_block_scalar(&x, &mut b);
            assert_eq!(a, b, "{x:?}");
            assert_eq!((sa.0.to_bits(), sa.1), (sb.0.to_bits(), sb.1));
        }
    }

    #[test]
    fn q8_1_sum_uses_unrounded_scale() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.3) * 0.37).collect();
        let mut b = [BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }];
        quantize_act(&x, &mut b);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(b[0].d, f32_to_f16(amax / 127.0));
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b[0].s, f32_to_f16(amax / 127.0 * sum as f32));

        assert!(b[0].qs.iter().any(|&q| q == 127 || q == -127));
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.0, 3.49, -3.51] {
            assert_eq!(round_ties_even(x), x.round_ties_even(), "{x}");
        }
    }
}
