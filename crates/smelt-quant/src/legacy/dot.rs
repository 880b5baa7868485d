//! The shared skeleton of the block dot products, and the AVX2 building blocks.
//!
//! A dot product of two block rows is `sum_b term(b)` where `term` turns block `b`'s exact
//! integer dot into a float with the blocks' scales (`(dx * dy) * isum`, plus `mx * sy`
//! for the formats with a minimum). Both paths compute every integer dot exactly and then
//! perform the same float operations in the same order: block `b`'s term is added to
//! partial sum `b % LANES`, and the partials are added in one fixed order at the end. The
//! portable path does this one block at a time in scalars; the AVX2 path does eight
//! blocks per vector, one block per lane, converting eight f16 scales at once. Eight
//! independent partials also keep the adds from serializing on one register.

/// Whether the AVX2 dot paths may run: they need AVX2 and FMA (see [`crate::simd`]) and
/// F16C, which converts eight f16 scales in one instruction (every AVX2 CPU has it).
pub(crate) fn avx2_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *READY
            .get_or_init(|| crate::simd::has_avx2() && std::arch::is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Partial sums a dot product keeps.
pub(crate) const LANES: usize = 8;

/// Eight partial sums of block terms; block `b` always lands in partial `b % LANES`.
pub(crate) struct Lanes([f32; LANES]);

impl Lanes {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Self([0.0; LANES])
    }

    #[inline(always)]
    pub(crate) fn from_array(p: [f32; LANES]) -> Self {
        Self(p)
    }

    #[inline(always)]
    pub(crate) fn add(&mut self, block: usize, term: f32) {
        self.0[block % LANES] += term;
    }

    /// `((p0+p4) + (p2+p6)) + ((p1+p5) + (p3+p7))`, the one order both paths use.
    #[inline(always)]
    pub(crate) fn sum(&self) -> f32 {
        let p = &self.0;
        let h: [f32; 4] = std::array::from_fn(|l| p[l] + p[l + 4]);
        (h[0] + h[2]) + (h[1] + h[3])
    }
}

/// The portable path: eight blocks at a time (integer dots, then their terms into the
/// eight partials), which lets the compiler vectorize across blocks; the trailing blocks
/// one by one into the same partials.
#[inline(always)]
pub(crate) fn dot_blocks<X, Y>(
    x: &[X],
    y: &[Y],
    isum: impl Fn(&X, &Y) -> i32,
    term: impl Fn(&X, &Y, i32) -> f32,
) -> f32 {
    let n = x.len().min(y.len());
    let whole = n - n % LANES;
    let mut acc = Lanes::new();
    for (xs, ys) in x[..whole]
        .chunks_exact(LANES)
        .zip(y[..whole].chunks_exact(LANES))
    {
        let sums: [i32; LANES] = std::array::from_fn(|l| isum(&xs[l], &ys[l]));
        let terms: [f32; LANES] = std::array::from_fn(|l| term(&xs[l], &ys[l], sums[l]));
        for (p, t) in acc.0.iter_mut().zip(terms) {
            *p += t;
        }
    }
    for b in whole..n {
        acc.add(b, term(&x[b], &y[b], isum(&x[b], &y[b])));
    }
    acc.sum()
}

/// Exact `sum a[i] * b[i]` of two 32-byte signed rows (the portable integer kernel).
#[inline(always)]
pub(crate) fn dot_i8(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    // i16 products summed as i32 is the shape compilers turn into `pmaddwd`.
    a.iter()
        .zip(b)
        .map(|(&p, &q)| (p as i16 * q as i16) as i32)
        .sum()
}

/// Exact `sum (q[j] - offset) * y[j]` straight from a packed 4-bit block (weight `j`
/// in the low nibble of byte `j`, weight `j + 16` in its high nibble).
#[inline(always)]
pub(crate) fn dot_nibbles(qs: &[u8; 16], offset: i16, y: &[i8; 32]) -> i32 {
    let (ylo, yhi) = y.split_at(16);
    qs.iter()
        .zip(ylo.iter().zip(yhi))
        .map(|(&b, (&a, &c))| {
            let lo = (b & 0x0F) as i16 - offset;
            let hi = (b >> 4) as i16 - offset;
            lo as i32 * a as i32 + hi as i32 * c as i32
        })
        .sum()
}

/// [`dot_nibbles`] for a 5-bit block: bit `j` of `qh` (little-endian) adds 16 to weight
/// `j`, so the high bits contribute `16 * sum of y[j] over set bits` (selected by testing
/// constant masks, which vectorizes where shifting by the index does not).
#[inline(always)]
pub(crate) fn dot_nibbles5(qs: &[u8; 16], qh: [u8; 4], offset: i16, y: &[i8; 32]) -> i32 {
    let qh = u32::from_le_bytes(qh);
    let high: i32 = y
        .iter()
        .enumerate()
        .map(|(j, &v)| if qh & (1 << j) != 0 { v as i32 } else { 0 })
        .sum();
    dot_nibbles(qs, offset, y) + 16 * high
}

/// Weights of a 4-bit block as values 0..15 in weight order.
#[inline(always)]
pub(crate) fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut q = [0u8; 32];
    let (lo, hi) = q.split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi).zip(qs) {
        *l = b & 0x0F;
        *h = b >> 4;
    }
    q
}

/// Weights of a 5-bit block (4-bit `qs` plus the fifth bits in `qh`) as values 0..31.
#[inline(always)]
pub(crate) fn nibbles_with_high_bit(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let low = nibbles(qs);
    std::array::from_fn(|i| low[i] | ((((qh >> i) & 1) as u8) << 4))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! AVX2 kernels. The integer ones return eight i32 partials whose sum is the block's
    //! exact integer dot for *every* input: `maddubs` only ever sees operand pairs that
    //! cannot saturate, and 8-bit by 8-bit products are widened to 16 bits first. The float
    //! side handles eight blocks per vector, lane `l` doing exactly the scalar operations
    //! the portable path does for block `l` (IEEE multiply, add and int->float conversion
    //! round the same in a vector lane as in a scalar register).
    use super::{Lanes, LANES};
    use half::f16;
    use std::arch::x86_64::*;

    /// The AVX2 driver: `group` turns `LANES` blocks into a vector of their terms (the
    /// same values the scalar `term` gives); lane `l` accumulates blocks `l, l+8, ...`,
    /// exactly as [`super::dot_blocks`] does, and the trailing blocks run through the
    /// scalar `isum`/`term` into the same lanes.
    #[inline(always)]
    pub(crate) unsafe fn dot_groups<X, Y>(
        x: &[X],
        y: &[Y],
        group: impl Fn(&[X], &[Y]) -> __m256,
        isum: impl Fn(&X, &Y) -> i32,
        term: impl Fn(&X, &Y, i32) -> f32,
    ) -> f32 {
        let n = x.len().min(y.len());
        let whole = n - n % LANES;
        let mut acc = _mm256_setzero_ps();
        for g in (0..whole).step_by(LANES) {
            acc = _mm256_add_ps(acc, group(&x[g..g + LANES], &y[g..g + LANES]));
        }
        let mut p = [0.0f32; LANES];
        _mm256_storeu_ps(p.as_mut_ptr(), acc);
        let mut lanes = Lanes::from_array(p);
        for b in whole..n {
            lanes.add(b, term(&x[b], &y[b], isum(&x[b], &y[b])));
        }
        lanes.sum()
    }

    /// Eight f16 scales, `h(0)` in lane 0, widened exactly.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) unsafe fn f16x8(h: impl Fn(usize) -> f16) -> __m256 {
        let bits: [u16; LANES] = std::array::from_fn(|l| h(l).to_bits());
        _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast()))
    }

    /// Lane-wise `(dx * dy) * sums as f32`: the common block term.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn scaled(dx: __m256, dy: __m256, sums: __m256i) -> __m256 {
        _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sums))
    }

    /// The 32 quants of a 4-bit block (`j` low nibble, `j + 16` high nibble) as bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
        let lo = _mm_loadu_si128(qs.as_ptr().cast());
        let hi = _mm_srli_epi16(lo, 4);
        _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0F))
    }

    /// Byte `j` is `0x10` when bit `j` of `qh` is set: the fifth bits of a 5-bit block.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn fifth_bits(qh: [u8; 4]) -> __m256i {
        let spread = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), spread);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn load(q: &[i8; 32]) -> __m256i {
        _mm256_loadu_si256(q.as_ptr().cast())
    }

    /// Partials of `sum (q - offset) * y` for unsigned `q <= 31` and `offset <= 16`: both
    /// `maddubs` stay far from i16 saturation, and their difference is exact.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn dot_offset(q: __m256i, offset: i8, y: __m256i) -> __m256i {
        let qy = _mm256_maddubs_epi16(q, y);
        let oy = _mm256_maddubs_epi16(_mm256_set1_epi8(offset), y);
        _mm256_madd_epi16(_mm256_sub_epi16(qy, oy), _mm256_set1_epi16(1))
    }

    /// Partials of `sum q * y` for unsigned `q <= 127`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn dot_unsigned(q: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), _mm256_set1_epi16(1))
    }

    /// Pair sums (16 x i16) of `sum v * y` for signed `v` in -127..=127 given as its
    /// positive and negative parts (`pos`, `neg` unsigned, at most one nonzero per byte):
    /// each `maddubs` is at most 2*127*128 in magnitude, and the true difference fits i16,
    /// so the wrapping subtraction is exact.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn pairs_signed(pos: __m256i, neg: __m256i, y: __m256i) -> __m256i {
        _mm256_sub_epi16(_mm256_maddubs_epi16(pos, y), _mm256_maddubs_epi16(neg, y))
    }

    /// Partials of `sum a * b` for two arbitrary signed 32-byte rows, widened to i16.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn dot_i8(a: &[i8; 32], b: &[i8; 32]) -> __m256i {
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.cast()));
        let a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.add(16).cast()));
        let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.cast()));
        let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(16).cast()));
        _mm256_add_epi32(_mm256_madd_epi16(a0, b0), _mm256_madd_epi16(a1, b1))
    }

    /// The eight totals of eight vectors of i32 partials (lane `l` = total of `v[l]`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn hsum8(v: [__m256i; LANES]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // Per 128-bit half: [v0, v1, v2, v3] partly summed (low half of each v, high half).
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        let lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
        let hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
        _mm256_add_epi32(lo, hi)
    }
}
