//! Q6_K: 6.5625 bits per weight. Sixteen 16-weight groups, each `d * sc * (q - 32)`
//! with 6-bit `q` (low nibbles in `ql`, top two bits in `qh`) and signed 8-bit `sc`.

use super::common::{f16_to_f32, fold, group_sums, nearest_int, to_lanes, GROUP_MAX_EPS, QK_K};
use super::{lanes, BlockQ8K};
use half::f16;

/// ggml's `block_q6_K` (210 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low four bits: in each 128-weight half `h`, byte `64 * h + l` holds weights
    /// `l` (low nibble) and `64 + l` (high), byte `64 * h + 32 + l` weights `32 + l`
    /// and `96 + l`.
    pub ql: [u8; QK_K / 2],
    /// Top two bits: byte `32 * h + l`, bits `2k..2k+2` for weight `32 * k + l` of half `h`.
    pub qh: [u8; QK_K / 4],
    /// Group scales.
    pub scales: [i8; QK_K / 16],
    /// Scale of the group scales.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// ggml's `quantize_row_q6_K_ref` for one super-block. ggml keeps the levels of each
    /// group's scale search but overwrites them wherever the rounded group scale is
    /// non-zero, so the search here keeps only its winning candidate and the levels are
    /// derived from it for the (rare) groups whose scale rounds to zero.
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let xt: [[f32; 16]; 16] = to_lanes(x);
        let found = lanes::make_qx_scales::<16>(32, &xt);
        let scales = found.scale;
        let mut l = [0i8; QK_K];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for &scale in &scales {
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        let mut y = <Self as bytemuck::Zeroable>::zeroed();
        if max_abs_scale < GROUP_MAX_EPS {
            return y;
        }
        let iscale = -128.0f32 / max_scale;
        y.d = f16::from_f32(1.0 / iscale);
        for (s, &v) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..16 {
            let d = f16_to_f32(y.d) * y.scales[j] as f32;
            if d == 0.0 {
                for i in 16 * j..16 * j + 16 {
                    l[i] = found.level(j, x[i]);
                }
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            let l = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                let q = [
                    l[i] as u8,
                    l[32 + i] as u8,
                    l[64 + i] as u8,
                    l[96 + i] as u8,
                ];
                y.ql[64 * h + i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                y.ql[64 * h + 32 + i] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                y.qh[32 * h + i] =
                    (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
        y
    }

    /// The 6-bit quant of weight `32 * k + i` in half `h` (stored with offset 32).
    #[inline(always)]
    fn q(&self, h: usize, k: usize, i: usize) -> i32 {
        let ql = self.ql[64 * h + 32 * (k & 1) + i] >> (4 * (k >> 1));
        let qh = self.qh[32 * h + i] >> (2 * k);
        ((ql & 0xF) | ((qh & 3) << 4)) as i32
    }

    /// ggml's `dequantize_row_q6_K` for one super-block.
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    let sc = self.scales[8 * h + 2 * k + i / 16];
                    out[128 * h + 32 * k + i] = d * sc as f32 * (self.q(h, k, i) - 32) as f32;
                }
            }
        }
    }
}

/// Q6_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut q = [0u8; QK_K];
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    q[128 * h + 32 * k + i] = x.q(h, k, i) as u8;
                }
            }
        }
        let sc = x.scales.map(i32::from);
        // The offset 32 goes through the activation group sums, as in the AVX2 path,
        // so both give the same integer even for activations with inconsistent sums
        // (arbitrary sums can exceed i32: both paths then wrap alike).
        let offset = (0..16).fold(0i32, |s, j| s.wrapping_add(sc[j] * y.bsums[j] as i32));
        let isum = group_sums::<16>(&q, &y.qs, &sc).wrapping_sub(offset.wrapping_mul(32));
        acc = fold(acc, y.d * f16_to_f32(x.d), isum, 0.0, 0);
    }
    acc
}

/// Q6_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ6K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use super::avx2::{load, pick_pair};
        use std::arch::x86_64::*;
        let nibble = _mm256_set1_epi8(0x0F);
        let two = _mm256_set1_epi8(0x30);
        // Quants are summed unsigned (0..64) and the offset 32 taken off through the
        // activation group sums: sum sc * (q - 32) * y = sum sc * q * y - 32 * sum sc * bsum.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load(y.bsums.as_ptr().cast()), sc16));
        let mut sum = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
        for h in 0..2 {
            let scales = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let qa = load(self.ql.as_ptr().add(64 * h));
            let qb = load(self.ql.as_ptr().add(64 * h + 32));
            let qh = load(self.qh.as_ptr().add(32 * h));
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(qa, nibble),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), two),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(qb, nibble),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), two),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(qa), nibble),
                    _mm256_and_si256(qh, two),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(qb), nibble),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), two),
                ),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let ys = load(y.qs.as_ptr().add(128 * h + 32 * k).cast());
                let p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q, ys),
                    pick_pair(scales, 2 * k, 2 * k + 1),
                );
                sum = _mm256_add_epi32(sum, p);
            }
        }
        (sum, _mm_setzero_si128())
    }

    fn scales(&self, y: &BlockQ8K) -> (f32, f32) {
        (y.d * f16_to_f32(self.d), 0.0)
    }

    #[inline(always)]
    unsafe fn scales4(
        x: &[Self; 4],
        y: &[BlockQ8K; 4],
    ) -> (std::arch::x86_64::__m128, std::arch::x86_64::__m128) {
        super::avx2::f16_scales4::<false>(x.map(|b| b.d.to_bits() as u32), y)
    }
}

impl_kquant!(BlockQ6K, Q6_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ6K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ6K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 1e-2);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        check_round_trip::<BlockQ6K>(0.03);
    }

    #[test]
    fn zero_row_is_all_zero() {
        check_zero_row::<BlockQ6K>();
    }
}
