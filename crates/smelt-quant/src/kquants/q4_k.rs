//! Q4_K: 4.5 bits per weight. Eight 32-weight groups, each `d * sc * q - dmin * m`
//! with 4-bit `q` and 6-bit `sc`/`m` packed into 12 bytes.

use super::common::{
    f16_to_f32, fold, from_lanes, group_sums, nearest_int, pack_scale_min_k4, to_lanes,
    unpack_scale_min_k4, QK_K,
};
use super::{lanes, BlockQ8K};
use half::f16;

/// ggml's `block_q4_K` (144 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    /// Scale of the 6-bit group scales.
    pub d: f16,
    /// Scale of the 6-bit group mins.
    pub dmin: f16,
    /// Group scales and mins, 6 bits each (see `pack_scale_min_k4`).
    pub scales: [u8; 12],
    /// Quants: byte `32 * c + l` holds weight `64 * c + l` (low nibble) and
    /// `64 * c + 32 + l` (high nibble).
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Fits each 32-weight group with ggml's weighting `sqrt(mean(x^2)) + |x|`, all eight
/// at once; the part shared by Q4_K (`nmax` 15) and Q5_K (31). Returns group scales
/// and mins, levels in `l`.
#[inline(always)]
pub(crate) fn fit_groups(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> ([f32; 8], [f32; 8]) {
    let xt: [[f32; 8]; 32] = to_lanes(x);
    let mut sum_x2 = [0.0f32; 8];
    for row in &xt {
        for k in 0..8 {
            sum_x2[k] += row[k] * row[k];
        }
    }
    let av_x: [f32; 8] = std::array::from_fn(|k| (sum_x2[k] / 32.0).sqrt());
    let w: [[f32; 8]; 32] =
        std::array::from_fn(|i| std::array::from_fn(|k| av_x[k] + xt[i][k].abs()));
    let mut lt = [[0u8; 8]; 32];
    #[cfg(target_arch = "x86_64")]
    let fit = if crate::simd::has_avx2() {
        // SAFETY: has_avx2 checked the CPU for AVX2.
        unsafe {
            lanes::avx2::make_qkx2_quants::<32, 8, 1, false>(
                nmax, rmin, 0.1, nstep, &xt, &w, &mut lt,
            )
        }
    } else {
        lanes::make_qkx2_quants::<32, 8, false>(nmax, rmin, 0.1, nstep, &xt, &w, &mut lt)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let fit = lanes::make_qkx2_quants::<32, 8, false>(nmax, rmin, 0.1, nstep, &xt, &w, &mut lt);
    from_lanes(&lt, l);
    fit
}

/// Quantizes the group scales and mins to 6 bits against their maxima, then
/// re-rounds every weight with the scales as stored; the part shared by Q4_K and Q5_K.
/// Returns `(d, dmin, packed scales)`.
#[inline(always)]
pub(crate) fn pack_groups(
    x: &[f32; QK_K],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    l: &mut [u8; QK_K],
) -> (f16, f16, [u8; 12]) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores nearest_int into a uint8_t before clamping: keep that wrap.
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);

    let (sc, m) = unpack_scale_min_k4(&packed);
    for j in 0..8 {
        let dj = f16_to_f32(d) * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed)
}

impl BlockQ4K {
    /// ggml's `quantize_row_q4_K_ref` for one super-block.
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let (scales, mins) = fit_groups(x, 15, -1.0, 20, &mut l);
        let (d, dmin, packed) = pack_groups(x, &scales, &mins, 15, &mut l);
        let mut qs = [0u8; QK_K / 2];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
        Self {
            d,
            dmin,
            scales: packed,
            qs,
        }
    }

    /// ggml's `dequantize_row_q4_K` for one super-block.
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
                lo[i] = d1 * (q[i] & 0xF) as f32 - m1;
                hi[i] = d2 * (q[i] >> 4) as f32 - m2;
            }
        }
    }
}

/// The min term of a super-block: `sum_j m_j * (sum of y over group j)`.
#[inline(always)]
pub(crate) fn min_sum(m: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    (0..8)
        .map(|j| m[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

/// Q4_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (sc, m) = unpack_scale_min_k4(&x.scales);
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for i in 0..32 {
                q[64 * c + i] = x.qs[32 * c + i] & 0xF;
                q[64 * c + 32 + i] = x.qs[32 * c + i] >> 4;
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

/// Q4_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ4K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use super::avx2::{load, mins_k4, pick_pair, scales_mins_k4};
        use std::arch::x86_64::*;
        let nibble = _mm256_set1_epi8(0x0F);
        let sm = scales_mins_k4(&self.scales);
        let scales = _mm256_permute2x128_si256::<0x00>(sm, sm);
        let mut sum = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load(self.qs.as_ptr().add(32 * c));
            let lo = _mm256_and_si256(q, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
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

impl_kquant!(BlockQ4K, Q4_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ4K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ4K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 2e-2);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        check_round_trip::<BlockQ4K>(0.12);
    }

    #[test]
    fn zero_row_is_all_zero() {
        check_zero_row::<BlockQ4K>();
    }
}
