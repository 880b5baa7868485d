//! Small AVX2 building blocks shared by the K-quant dot products.

use std::arch::x86_64::*;

/// Sum of the eight i32 lanes (exact: callers keep block sums far from overflow).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
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

/// Per-i16-lane scale vector: lanes 0..8 get `lo`, lanes 8..16 get `hi` (the two
/// 16-weight groups covered by one 32-byte `maddubs`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scales_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}
