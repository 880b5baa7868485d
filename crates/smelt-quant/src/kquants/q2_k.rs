//! Q2_K: 2.625 bits per weight. Sixteen 16-weight groups, each `d * sc * q - dmin * m`
//! with 2-bit `q` and 4-bit `sc`/`m` sharing a byte.

use super::common::{f16_to_f32, fold, from_lanes, group_sums, nearest_int, to_lanes, QK_K};
use super::{lanes, BlockQ8K};
use half::f16;

/// ggml's `block_q2_K` (84 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    /// Group scale in the low nibble, group min in the high nibble.
    pub scales: [u8; QK_K / 16],
    /// Quants: in each 128-weight half `h`, bits `2k..2k+2` of byte `32 * h + l`
    /// belong to weight `128 * h + 32 * k + l`.
    pub qs: [u8; QK_K / 4],
    /// Scale of the group scales.
    pub d: f16,
    /// Scale of the group mins.
    pub dmin: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// ggml's `make_qkx2_quants` on all sixteen groups at once.
#[inline(always)]
fn fit_groups(
    xt: &[[f32; 16]; 16],
    w: &[[f32; 16]; 16],
    lt: &mut [[u8; 16]; 16],
) -> ([f32; 16], [f32; 16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: has_avx2 checked the CPU for AVX2.
        return unsafe {
            lanes::avx2::make_qkx2_quants::<16, 16, 2, true>(3, -0.5, 0.1, 15, xt, w, lt)
        };
    }
    lanes::make_qkx2_quants::<16, 16, true>(3, -0.5, 0.1, 15, xt, w, lt)
}

impl BlockQ2K {
    /// ggml's `quantize_row_q2_K_ref` for one super-block.
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let xt: [[f32; 16]; 16] = to_lanes(x);
        let w: [[f32; 16]; 16] = std::array::from_fn(|i| std::array::from_fn(|k| xt[i][k].abs()));
        let mut lt = [[0u8; 16]; 16];
        let (scales, mins) = fit_groups(&xt, &w, &mut lt);
        let mut l = [0u8; QK_K];
        from_lanes(&lt, &mut l);
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut y = <Self as bytemuck::Zeroable>::zeroed();
        // ggml stores nearest_int straight into the uint8_t scale bytes: keep that wrap.
        if max_scale > 0.0 {
            let iscale = 15.0f32 / max_scale;
            for (s, &v) in y.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
            y.d = f16::from_f32(max_scale / 15.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0f32 / max_min;
            for (s, &v) in y.scales.iter_mut().zip(&mins) {
                *s |= nearest_int(iscale * v).wrapping_shl(4) as u8;
            }
            y.dmin = f16::from_f32(max_min / 15.0);
        }
        for j in 0..16 {
            let d = f16_to_f32(y.d) * (y.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(y.dmin) * (y.scales[j] >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for h in 0..2 {
            let l = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                y.qs[32 * h + i] = l[i] | (l[32 + i] << 2) | (l[64 + i] << 4) | (l[96 + i] << 6);
            }
        }
        y
    }

    /// The 2-bit quants in weight order.
    #[inline(always)]
    fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for h in 0..2 {
            let out = &mut q[128 * h..128 * h + 128];
            for (i, &b) in self.qs[32 * h..32 * h + 32].iter().enumerate() {
                out[i] = b & 3;
                out[32 + i] = (b >> 2) & 3;
                out[64 + i] = (b >> 4) & 3;
                out[96 + i] = b >> 6;
            }
        }
        q
    }

    /// ggml's `dequantize_row_q2_K` for one super-block.
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    let e = 128 * h + 32 * k + i;
                    let sc = self.scales[e / 16];
                    let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                    let q = (self.qs[32 * h + i] >> (2 * k)) & 3;
                    out[e] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// Q2_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sc: [i32; 16] = std::array::from_fn(|g| (x.scales[g] & 0xF) as i32);
        let isum = group_sums::<16>(&x.quants(), &y.qs, &sc);
        let msum: i32 = (0..16)
            .map(|j| (x.scales[j] >> 4) as i32 * y.bsums[j] as i32)
            .sum();
        acc = fold(
            acc,
            y.d * f16_to_f32(x.d),
            isum,
            y.d * f16_to_f32(x.dmin),
            msum,
        );
    }
    acc
}

/// Q2_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ2K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use super::avx2::{load, pick_pair};
        use std::arch::x86_64::*;
        let two_bits = _mm256_set1_epi8(3);
        let low4 = _mm_set1_epi8(0x0F);
        let packed = _mm_loadu_si128(self.scales.as_ptr().cast());
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), low4));
        let m = _mm256_madd_epi16(mins, load(y.bsums.as_ptr().cast()));
        let msum = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
        let mut sum = _mm256_setzero_si256();
        for h in 0..2 {
            let scales = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let mut q = load(self.qs.as_ptr().add(32 * h));
            for k in 0..4 {
                let ys = load(y.qs.as_ptr().add(128 * h + 32 * k).cast());
                let p = _mm256_maddubs_epi16(_mm256_and_si256(q, two_bits), ys);
                sum = _mm256_add_epi32(
                    sum,
                    _mm256_madd_epi16(p, pick_pair(scales, 2 * k, 2 * k + 1)),
                );
                q = _mm256_srli_epi16::<2>(q);
            }
        }
        (sum, msum)
    }

    fn scales(&self, y: &BlockQ8K) -> (f32, f32) {
        (y.d * f16_to_f32(self.d), y.d * f16_to_f32(self.dmin))
    }

    #[inline(always)]
    unsafe fn scales4(
        x: &[Self; 4],
        y: &[BlockQ8K; 4],
    ) -> (std::arch::x86_64::__m128, std::arch::x86_64::__m128) {
        super::avx2::f16_scales4::<true>(
            x.map(|b| b.d.to_bits() as u32 | (b.dmin.to_bits() as u32) << 16),
            y,
        )
    }
}

impl_kquant!(BlockQ2K, Q2_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ2K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ2K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 8e-2);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        check_round_trip::<BlockQ2K>(0.45);
    }

    #[test]
    fn zero_row_is_all_zero() {
        check_zero_row::<BlockQ2K>();
    }
}
