//! Small AVX2 building blocks shared by the K-quant dot products.

use super::common::fold;
use super::BlockQ8K;
use std::arch::x86_64::*;

/// Sum of the eight i32 lanes (exact: callers keep block sums far from overflow).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Loads 32 bytes from `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// One K-quant format's AVX2 inner kernel: the exact integer sums of one super-block
/// against one Q8_K block, spread over lanes (the block's sums are the lane totals).
pub(crate) trait Kernel: Sized {
    /// `(scaled quant sums, min sums)`; formats without mins return zero for the latter.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    unsafe fn sums(&self, y: &BlockQ8K) -> (__m256i, __m128i);

    /// `(d * y.d, dmin * y.d)`, exactly as the portable path computes them.
    fn scales(&self, y: &BlockQ8K) -> (f32, f32);

    /// [`Kernel::scales`] of four blocks as `(dd, dm)` vectors; formats with f16
    /// scales override it with [`f16_scales4`], bit-identical lane by lane.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline(always)]
    unsafe fn scales4(x: &[Self; 4], y: &[BlockQ8K; 4]) -> (__m128, __m128) {
        let f = [
            x[0].scales(&y[0]),
            x[1].scales(&y[1]),
            x[2].scales(&y[2]),
            x[3].scales(&y[3]),
        ];
        (
            _mm_setr_ps(f[0].0, f[1].0, f[2].0, f[3].0),
            _mm_setr_ps(f[0].1, f[1].1, f[2].1, f[3].1),
        )
    }
}

/// `common::f16_to_f32` on the low 16 bits of four lanes, bit for bit (the same three
/// candidates, picked by masks).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn f16x4_to_f32(h: __m128i) -> __m128 {
    let mag = _mm_and_si128(h, _mm_set1_epi32(0x7fff));
    let shifted = _mm_slli_epi32::<13>(mag);
    let normal = _mm_add_epi32(shifted, _mm_set1_epi32(0x3800_0000));
    let subnormal = _mm_castps_si128(_mm_mul_ps(
        _mm_cvtepi32_ps(mag),
        _mm_set1_ps(f32::from_bits(0x3380_0000)),
    ));
    let special = _mm_or_si128(shifted, _mm_set1_epi32(0x7f80_0000));
    let bits = _mm_blendv_epi8(
        normal,
        subnormal,
        _mm_cmplt_epi32(mag, _mm_set1_epi32(0x0400)),
    );
    let bits = _mm_blendv_epi8(bits, special, _mm_cmpgt_epi32(mag, _mm_set1_epi32(0x7bff)));
    let sign = _mm_slli_epi32::<16>(_mm_and_si128(h, _mm_set1_epi32(0x8000)));
    _mm_castsi128_ps(_mm_or_si128(bits, sign))
}

/// `(y.d * d, y.d * dmin)` for four blocks from their f16 scale bits (`d | dmin << 16`);
/// without mins (`MIN == false`) the second is exactly zero, as the scalar `scales`
/// returns it.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn f16_scales4<const MIN: bool>(
    bits: [u32; 4],
    y: &[BlockQ8K; 4],
) -> (__m128, __m128) {
    let v = _mm_setr_epi32(
        bits[0] as i32,
        bits[1] as i32,
        bits[2] as i32,
        bits[3] as i32,
    );
    let yd = _mm_setr_ps(y[0].d, y[1].d, y[2].d, y[3].d);
    let dd = _mm_mul_ps(yd, f16x4_to_f32(v));
    let dm = if MIN {
        _mm_mul_ps(yd, f16x4_to_f32(_mm_srli_epi32::<16>(v)))
    } else {
        _mm_setzero_ps()
    };
    (dd, dm)
}

/// Lane totals of four vectors: `[sum(a), sum(b), sum(c), sum(d)]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn totals4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    let ab = _mm256_hadd_epi32(a, b);
    let cd = _mm256_hadd_epi32(c, d);
    let abcd = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(
        _mm256_castsi256_si128(abcd),
        _mm256_extracti128_si256::<1>(abcd),
    )
}

/// Lane totals of four 128-bit vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn totals4_128(a: __m128i, b: __m128i, c: __m128i, d: __m128i) -> __m128i {
    _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d))
}

/// Sum of the four i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_i32_128(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// The dot product of a row: four blocks' integer sums are reduced together and their
/// terms `dd * isum - dm * msum` formed four wide, then added to the total one block
/// at a time in order. Each term is computed with the same f32 operations as
/// `common::fold`, so the result is bit-identical to the portable path.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot<X: Kernel>(x: &[X], y: &[BlockQ8K]) -> f32 {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut acc = 0.0f32;
    let mut xs = x.chunks_exact(4);
    let mut ys = y.chunks_exact(4);
    for (xc, yc) in (&mut xs).zip(&mut ys) {
        // `chunks_exact(4)` yields exactly four blocks: these conversions cannot fail.
        let (Ok(x4), Ok(y4)) = (<&[X; 4]>::try_from(xc), <&[BlockQ8K; 4]>::try_from(yc)) else {
            continue;
        };
        let s0 = x4[0].sums(&y4[0]);
        let s1 = x4[1].sums(&y4[1]);
        let s2 = x4[2].sums(&y4[2]);
        let s3 = x4[3].sums(&y4[3]);
        let isum = _mm_cvtepi32_ps(totals4(s0.0, s1.0, s2.0, s3.0));
        let msum = _mm_cvtepi32_ps(totals4_128(s0.1, s1.1, s2.1, s3.1));
        let (dd, dm) = X::scales4(x4, y4);
        let t: [f32; 4] =
            std::mem::transmute(_mm_sub_ps(_mm_mul_ps(dd, isum), _mm_mul_ps(dm, msum)));
        acc += t[0];
        acc += t[1];
        acc += t[2];
        acc += t[3];
    }
    for (x, y) in xs.remainder().iter().zip(ys.remainder()) {
        let (i, m) = x.sums(y);
        let (dd, dm) = x.scales(y);
        acc = fold(acc, dd, hsum_i32(i), dm, hsum_i32_128(m));
    }
    acc
}

/// Broadcasts i16 lane `lo` of each 128-bit half of `v` across the low half of the
/// result and lane `hi` across the high half (both halves of `v` must be equal).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pick_pair(v: __m256i, lo: usize, hi: usize) -> __m256i {
    let sel = |i: usize| (((2 * i + 1) << 8) | (2 * i)) as i16;
    _mm256_shuffle_epi8(
        v,
        _mm256_set_m128i(_mm_set1_epi16(sel(hi)), _mm_set1_epi16(sel(lo))),
    )
}

/// Q4_K/Q5_K's twelve scale bytes as sixteen i16 lanes, scales 0..8 then mins 0..8
/// (ggml's 32-bit unpacking; same values as `common::unpack_scale_min_k4`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scales_mins_k4(q: &[u8; 12]) -> __m256i {
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_lo = u0 & M6;
    let sc_hi = (u2 & M4) | (((u0 >> 6) & M2) << 4);
    let m_lo = u1 & M6;
    let m_hi = ((u2 >> 4) & M4) | (((u1 >> 6) & M2) << 4);
    _mm256_cvtepu8_epi16(_mm_set_epi32(
        m_hi as i32,
        m_lo as i32,
        sc_hi as i32,
        sc_lo as i32,
    ))
}

/// The min term of Q4_K/Q5_K, `m_j * (bsums[2j] + bsums[2j+1])`, over four i32 lanes.
/// Each min meets its two group sums in one `madd`, so no i16 sum can wrap even for
/// activations whose sums are arbitrary.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn mins_k4(scales_mins: __m256i, bsums: &[i16; 16]) -> __m128i {
    let m = _mm256_extracti128_si256::<1>(scales_mins);
    let pairs = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    let prod = _mm256_madd_epi16(pairs, load(bsums.as_ptr().cast()));
    _mm_add_epi32(
        _mm256_castsi256_si128(prod),
        _mm256_extracti128_si256::<1>(prod),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16x4_conversion_matches_the_scalar_one_everywhere() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        for base in (0..=u16::MAX as u32).step_by(4) {
            let lanes = [base, base + 1, base + 2, base + 3];
            // SAFETY: the CPU was just checked for AVX2 and FMA.
            let got: [f32; 4] = unsafe {
                std::mem::transmute(f16x4_to_f32(_mm_setr_epi32(
                    lanes[0] as i32,
                    lanes[1] as i32 | 0x5a5a_0000,
                    lanes[2] as i32,
                    lanes[3] as i32,
                )))
            };
            for (g, h) in got.iter().zip(lanes) {
                let want = super::super::common::f16_to_f32(half::f16::from_bits(h as u16));
                assert_eq!(g.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }
}
