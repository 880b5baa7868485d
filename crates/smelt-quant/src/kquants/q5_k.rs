//! Q5_K: 5.5 bits per weight. Q5_K's layout plus one high bit per weight in `qh`.

use super::common::{f16_to_f32, fold, group_sums, unpack_scale_min_k4, QK_K};
use super::q4_k::{fit_groups, min_sum, pack_groups};
use super::BlockQ8K;
use half::f16;

/// ggml's `block_q5_K` (176 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    /// Scale of the 6-bit group scales.
    pub d: f16,
    /// Scale of the 6-bit group mins.
    pub dmin: f16,
    /// Group scales and mins, 6 bits each (see `pack_scale_min_k4`).
    pub scales: [u8; 12],
    /// High bits: bit `2 * c` of byte `l` belongs to weight `64 * c + l`, bit
    /// `2 * c + 1` to weight `64 * c + 32 + l`.
    pub qh: [u8; QK_K / 8],
    /// Low four bits of the quants: byte `32 * c + l` holds weight `64 * c + l` (low nibble) and
    /// `64 * c + 32 + l` (high nibble).
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    /// ggml's `quantize_row_q5_K_ref` for one super-block.
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let (scales, mins) = fit_groups(x, 31, -0.5, 15, &mut l);
        let (d, dmin, packed) = pack_groups(x, &scales, &mins, 31, &mut l);
        let mut qs = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 8];
        for c in 0..4 {
            for i in 0..32 {
                let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
                qh[i] |= (l1 >> 4) << (2 * c) | (l2 >> 4) << (2 * c + 1);
                qs[32 * c + i] = (l1 & 0xF) | ((l2 & 0xF) << 4);
            }
        }
        Self {
            d,
            dmin,
            scales: packed,
            qh,
            qs,
        }
    }

    /// ggml's `dequantize_row_q5_K` for one super-block.
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        let (sc, m) = unpack_scale_min_k4(&self.scales);
        for c in 0..4 {
            let (d1, m1) = (d * sc[2 * c] as f32, min * m[2 * c] as f32);
            let (d2, m2) = (d * sc[2 * c + 1] as f32, min * m[2 * c + 1] as f32);
            let q = &self.qs[32 * c..32 * c + 32];
            let (lo, hi) = out[64 * c..64 * c + 64].split_at_mut(32);
            for i in 0..32 {
                let h = self.qh[i] >> (2 * c);
                lo[i] = d1 * ((q[i] & 0xF) | (h & 1) << 4) as f32 - m1;
                hi[i] = d2 * ((q[i] >> 4) | (h & 2) << 3) as f32 - m2;
            }
        }
    }
}

/// Q5_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (sc, m) = unpack_scale_min_k4(&x.scales);
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for i in 0..32 {
                let h = x.qh[i] >> (2 * c);
                q[64 * c + i] = (x.qs[32 * c + i] & 0xF) | (h & 1) << 4;
                q[64 * c + 32 + i] = (x.qs[32 * c + i] >> 4) | (h & 2) << 3;
            }
        }
        let isum = group_sums::<32>(&q, &y.qs, &sc.map(i32::from));
        acc = fold(
            acc,
            y.d * f16_to_f32(x.d),
            isum,
            y.d * f16_to_f32(x.dmin),
            min_sum(&m, &y.bsums),
        );
    }
    acc
}

/// Q5_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ5K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use super::avx2::{load, mins_k4, pick_pair, scales_mins_k4};
        use std::arch::x86_64::*;
        let nibble = _mm256_set1_epi8(0x0F);
        let bit4 = _mm256_set1_epi8(0x10);
        let sm = scales_mins_k4(&self.scales);
        let scales = _mm256_permute2x128_si256::<0x00>(sm, sm);
        let mut sum = _mm256_setzero_si256();
        // Shifted right by 2 per chunk so that chunk c's two bits sit at bits 0 and 1.
        let mut h = load(self.qh.as_ptr());
        for c in 0..4 {
            let q = load(self.qs.as_ptr().add(32 * c));
            let lo = _mm256_or_si256(
                _mm256_and_si256(q, nibble),
                _mm256_and_si256(_mm256_slli_epi16::<4>(h), bit4),
            );
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble),
                _mm256_and_si256(_mm256_slli_epi16::<3>(h), bit4),
            );
            h = _mm256_srli_epi16::<2>(h);
            let ylo = load(y.qs.as_ptr().add(64 * c).cast());
            let yhi = load(y.qs.as_ptr().add(64 * c + 32).cast());
            let plo = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, ylo),
                pick_pair(scales, 2 * c, 2 * c),
            );
            let phi = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, yhi),
                pick_pair(scales, 2 * c + 1, 2 * c + 1),
            );
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(plo, phi));
        }
        (sum, mins_k4(sm, &y.bsums))
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

impl_kquant!(BlockQ5K, Q5_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ5K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ5K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 2e-2);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        check_round_trip::<BlockQ5K>(0.06);
    }

    #[test]
    fn zero_row_is_all_zero() {
        check_zero_row::<BlockQ5K>();
    }
}
