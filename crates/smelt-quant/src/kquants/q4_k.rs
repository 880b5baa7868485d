//! Q4_K: 4.5 bits per weight. Eight 32-weight groups, each `d * sc * q - dmin * m`
//! with 4-bit `q` and 6-bit `sc`/`m` packed into 12 bytes.

use super::common::{
    fold, make_qkx2_quants, nearest_int, pack_scale_min_k4, unpack_scale_min_k4, Qkx2Search, QK_K,
};
use super::BlockQ8K;
use crate::{Block, GgmlType, Quantize};
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

const SEARCH: Qkx2Search = Qkx2Search {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};

/// Fits each 32-weight group with ggml's weighting `sqrt(mean(x^2)) + |x|`; the part
/// shared by Q4_K and Q5_K. Returns group scales and mins, levels in `l`.
pub(crate) fn fit_groups(
    x: &[f32; QK_K],
    search: &Qkx2Search,
    l: &mut [u8; QK_K],
) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for (j, (xs, ls)) in x.chunks_exact(32).zip(l.chunks_exact_mut(32)).enumerate() {
        let (Ok(xs), Ok(ls)) = (<&[f32; 32]>::try_from(xs), <&mut [u8; 32]>::try_from(ls)) else {
            continue;
        };
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights = std::array::from_fn(|i| av_x + xs[i].abs());
        (scales[j], mins[j]) = make_qkx2_quants(search, xs, &weights, ls);
    }
    (scales, mins)
}

/// Quantizes the group scales and mins to 6 bits against their maxima, then
/// re-rounds every weight with the scales as stored; the part shared by Q4_K and Q5_K.
/// Returns `(d, dmin, packed scales)`.
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
        let dj = d.to_f32() * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed)
}

impl BlockQ4K {
    /// ggml's `quantize_row_q4_K_ref` for one super-block.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let (scales, mins) = fit_groups(x, &SEARCH, &mut l);
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
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
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
        let mut isum = 0i32;
        for c in 0..4 {
            let q = &x.qs[32 * c..32 * c + 32];
            let ys = &y.qs[64 * c..64 * c + 64];
            let (mut lo, mut hi) = (0i32, 0i32);
            for i in 0..32 {
                lo += (q[i] & 0xF) as i32 * ys[i] as i32;
                hi += (q[i] >> 4) as i32 * ys[32 + i] as i32;
            }
            isum += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
        }
        acc = fold(
            acc,
            y.d * x.d.to_f32(),
            isum,
            y.d * x.dmin.to_f32(),
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
    use super::avx2::{hsum_i32, load};
    use std::arch::x86_64::*;
    let nibble = _mm256_set1_epi8(0x0F);
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (sc, m) = unpack_scale_min_k4(&x.scales);
        let mut sum = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load(x.qs.as_ptr().add(32 * c));
            let lo = _mm256_and_si256(q, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
            let ylo = load(y.qs.as_ptr().add(64 * c).cast());
            let yhi = load(y.qs.as_ptr().add(64 * c + 32).cast());
            let plo = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, ylo),
                _mm256_set1_epi16(sc[2 * c] as i16),
            );
            let phi = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, yhi),
                _mm256_set1_epi16(sc[2 * c + 1] as i16),
            );
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(plo, phi));
        }
        acc = fold(
            acc,
            y.d * x.d.to_f32(),
            hsum_i32(sum),
            y.d * x.dmin.to_f32(),
            min_sum(&m, &y.bsums),
        );
    }
    acc
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const WEIGHTS: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        for (b, out) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
            if let Ok(out) = out.try_into() {
                b.dequantize(out);
            }
        }
    }

    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: has_avx2 checked the CPU for AVX2 and FMA.
            return unsafe { vec_dot_avx2(x, y) };
        }
        vec_dot_portable(x, y)
    }
}

impl Quantize for BlockQ4K {
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        for (x, y) in src.chunks_exact(QK_K).zip(dst) {
            if let Ok(x) = x.try_into() {
                *y = Self::quantize(x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

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
