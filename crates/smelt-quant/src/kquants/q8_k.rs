//! Q8_K: the activation format every K-quant is dotted against. One f32 scale, 256
//! signed bytes, and the sums of each 16 bytes, so a weight format's min term becomes
//! 16 multiplies instead of 256.

use super::common::{fold, nearest_int, QK_K};

/// ggml's `block_q8_K` (292 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    /// Scale: weight `i` is `d * qs[i]`.
    pub d: f32,
    /// Quants in `-127..=127`.
    pub qs: [i8; QK_K],
    /// `bsums[j]` is the sum of `qs[16 * j..16 * j + 16]`.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    /// ggml's `quantize_row_q8_K_ref` for one super-block: the value of largest
    /// magnitude maps to -127 (its sign kept in the scale).
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        // ggml keeps the first value of largest magnitude; finding the magnitude first
        // (a max is order-free) and then its first position picks the same value
        // without a loop-carried branch.
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
        let mut y = <Self as bytemuck::Zeroable>::zeroed();
        if amax == 0.0 {
            return y;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
        y
    }

    /// Unpacks into `out`.
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }
}

/// Exact integer dot of two blocks' quants.
#[inline(always)]
fn isum_portable(x: &BlockQ8K, y: &BlockQ8K) -> i32 {
    x.qs.iter()
        .zip(&y.qs)
        .map(|(&a, &b)| a as i32 * b as i32)
        .sum()
}

/// Q8_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ8K], y: &[BlockQ8K]) -> f32 {
    x.iter().zip(y).fold(0.0, |acc, (x, y)| {
        fold(acc, x.d * y.d, isum_portable(x, y), 0.0, 0)
    })
}

/// Q8_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ8K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ8K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use std::arch::x86_64::*;
        let mut sum = _mm256_setzero_si256();
        // Widen to i16 before multiplying: maddubs would saturate on a -128 byte.
        for c in 0..QK_K / 16 {
            let a = _mm_loadu_si128(self.qs.as_ptr().add(16 * c).cast());
            let b = _mm_loadu_si128(y.qs.as_ptr().add(16 * c).cast());
            let p = _mm256_madd_epi16(_mm256_cvtepi8_epi16(a), _mm256_cvtepi8_epi16(b));
            sum = _mm256_add_epi32(sum, p);
        }
        (sum, _mm_setzero_si128())
    }

    fn scales(&self, y: &BlockQ8K) -> (f32, f32) {
        (self.d * y.d, 0.0)
    }
}

impl_kquant!(BlockQ8K, Q8_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn keeps_the_sign_of_the_largest_value_in_the_scale() {
        let mut x = [0.0f32; QK_K];
        x[3] = 2.0;
        x[7] = -1.0;
        let b = BlockQ8K::quantize(&x);
        assert_eq!(b.qs[3], -127);
        assert_eq!(b.qs[7], 64); // 63.5 rounds to even
        assert!(b.d < 0.0);
        assert_eq!(b.bsums[0], -127 + 64);
    }

    #[test]
    fn zero_row_is_all_zero() {
        let b = BlockQ8K::quantize(&[0.0; QK_K]);
        assert_eq!(bytemuck::bytes_of(&b), &[0u8; 292][..]);
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        for seed in 0..8 {
            let x = random_row(seed, QK_K, 3.0);
            let b = BlockQ8K::quantize(x[..].try_into().unwrap());
            let mut back = [0.0f32; QK_K];
            b.dequantize(&mut back);
            let step = b.d.abs();
            for (a, r) in x.iter().zip(&back) {
                assert!((a - r).abs() <= 0.5 * step * 1.0001, "{a} vs {r}");
            }
        }
    }

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ8K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ8K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 2e-3);
    }
}
