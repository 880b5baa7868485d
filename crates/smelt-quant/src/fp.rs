//! Plain float formats (F32, F16, BF16) as one-weight blocks.
//!
//! The conversions are ggml's own (`ggml-impl.h`): f32 -> f16 rounds to nearest even,
//! f32 -> bf16 rounds to nearest even keeping subnormals. They are written branch-free so
//! that a whole row converts with SIMD, and they are also what the quantized formats use
//! for their f16 scales, so every format rounds its scales exactly like ggml.
//!
//! Dot products pair each type with itself (ggml's `vec_dot_type`). To make the AVX2 and
//! portable paths bit-identical, both keep 32 partial sums: element `i` is added to
//! partial `i % 32` (a product of two f16 or two bf16 values is exact in f32, so only the
//! additions round), and the partials are reduced in one fixed order by [`reduce`].

use crate::legacy::scan::vectorized;
use crate::{Block, GgmlType, Quantize};

/// A 32-bit float weight.
pub type F32 = f32;
/// An IEEE half-precision weight.
pub type F16 = half::f16;
/// A bfloat16 weight.
pub type BF16 = half::bf16;

const _: () = assert!(std::mem::size_of::<F32>() == 4);
const _: () = assert!(std::mem::size_of::<F16>() == 2);
const _: () = assert!(std::mem::size_of::<BF16>() == 2);

/// Widens an f16 to f32 (exact). Branch-free so that loops over many values vectorize;
/// the quantized formats call it for their scales.
#[inline(always)]
pub fn f16_to_f32(h: F16) -> f32 {
    let w = (h.to_bits() as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    // Normal values: move the exponent and mantissa into place, then rebias by a multiply
    // (which also turns f16 infinities into f32 infinities).
    let exp_offset = 0xE0u32 << 23;
    let normalized = f32::from_bits((two_w >> 4) + exp_offset) * f32::from_bits(0x0780_0000); // 2^-112
                                                                                              // Subnormals: place the mantissa under a fixed exponent and subtract that exponent's
                                                                                              // implicit one, which the FPU renormalizes exactly.
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let magnitude = if two_w < (1 << 27) {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | magnitude)
}

/// Narrows an f32 to f16, rounding to nearest even (ggml's `GGML_FP32_TO_FP16`; NaN
/// becomes a quiet NaN). The float additions do the rounding, so this is exact RNE for
/// normals, subnormals and overflow alike.
#[inline(always)]
pub fn f32_to_f16(f: f32) -> F16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    let magnitude = if shl1_w > 0xFF00_0000 {
        0x7E00
    } else {
        nonsign
    };
    F16::from_bits(((sign >> 16) | magnitude) as u16)
}

/// Widens a bf16 to f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(h: BF16) -> f32 {
    f32::from_bits((h.to_bits() as u32) << 16)
}

/// Narrows an f32 to bf16 as ggml's `ggml_fp32_to_bf16_row_ref` does: round to nearest
/// even on the bit pattern, subnormals kept, NaN forced quiet.
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> BF16 {
    let u = f.to_bits();
    // Compared as i32 (the masked value is non-negative): x86 has no unsigned vector compare.
    let bits = if (u & 0x7FFF_FFFF) as i32 > 0x7F80_0000 {
        (u >> 16) | 64
    } else {
        u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16
    };
    BF16::from_bits(bits as u16)
}

/// Partial sums kept by the float dot products (four AVX2 registers of eight).
pub const PARTIALS: usize = 32;

/// Sums the partials in the one order both paths use: the four registers lane-wise as
/// `(r0 + r1) + (r2 + r3)`, then the eight lanes by halving (`l + l+4`, `l + l+2`, `0 + 1`).
#[inline(always)]
pub fn reduce(p: &[f32; PARTIALS]) -> f32 {
    let s: [f32; 8] = std::array::from_fn(|l| (p[l] + p[8 + l]) + (p[16 + l] + p[24 + l]));
    let t: [f32; 4] = std::array::from_fn(|l| s[l] + s[l + 4]);
    let u = [t[0] + t[2], t[1] + t[3]];
    u[0] + u[1]
}

/// A float element that widens exactly to f32.
trait Widen: Copy {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for F16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self)
    }
}

impl Widen for BF16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self)
    }
}

/// Adds `x[i] * y[i]` for `i` in `start..n` into partial `i % PARTIALS`: the tail both
/// paths share, and the whole of the portable path.
#[inline(always)]
fn accumulate<T: Widen>(p: &mut [f32; PARTIALS], x: &[T], y: &[T], start: usize) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[start..n], &y[start..n]);
    let mut xc = x.chunks_exact(PARTIALS);
    let mut yc = y.chunks_exact(PARTIALS);
    for (xs, ys) in (&mut xc).zip(&mut yc) {
        for l in 0..PARTIALS {
            p[l] += xs[l].widen() * ys[l].widen();
        }
    }
    // `start` is always a multiple of PARTIALS, so the remainder starts at partial 0.
    for (l, (a, b)) in xc.remainder().iter().zip(yc.remainder()).enumerate() {
        p[l] += a.widen() * b.widen();
    }
}

fn dot_portable<T: Widen>(x: &[T], y: &[T]) -> f32 {
    let mut p = [0.0f32; PARTIALS];
    accumulate(&mut p, x, y, 0);
    reduce(&p)
}

/// `sum x[i]*y[i]` over `min(x.len(), y.len())` elements, portable path.
pub fn vec_dot_f32_portable(x: &[f32], y: &[f32]) -> f32 {
    dot_portable(x, y)
}

/// F16 x F16 dot, portable path.
pub fn vec_dot_f16_portable(x: &[F16], y: &[F16]) -> f32 {
    dot_portable(x, y)
}

/// BF16 x BF16 dot, portable path.
pub fn vec_dot_bf16_portable(x: &[BF16], y: &[BF16]) -> f32 {
    dot_portable(x, y)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{accumulate, reduce, BF16, F16, PARTIALS};
    use std::arch::x86_64::*;

    /// Runs `body` over whole chunks of 32 elements with four 8-lane accumulators (lane
    /// `l` of register `r` is partial `8r + l`), then finishes the tail in scalar code.
    #[inline(always)]
    unsafe fn dot<T: super::Widen>(x: &[T], y: &[T], load: impl Fn(*const T) -> __m256) -> f32 {
        let n = x.len().min(y.len());
        let whole = n - n % PARTIALS;
        let mut acc = [_mm256_setzero_ps(); 4];
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut i = 0;
        while i < whole {
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = load(xp.add(i + 8 * r));
                let yv = load(yp.add(i + 8 * r));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(xv, yv));
            }
            i += PARTIALS;
        }
        let mut p = [0.0f32; PARTIALS];
        for (r, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(p.as_mut_ptr().add(8 * r), *a);
        }
        accumulate(&mut p, x, y, whole);
        reduce(&p)
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
        dot(x, y, |p| unsafe { _mm256_loadu_ps(p) })
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_f16(x: &[F16], y: &[F16]) -> f32 {
        dot(x, y, |p| unsafe {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        })
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn vec_dot_bf16(x: &[BF16], y: &[BF16]) -> f32 {
        dot(x, y, |p| unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
        })
    }
}

#[cfg(target_arch = "x86_64")]
pub use avx2::{
    vec_dot_bf16 as vec_dot_bf16_avx2, vec_dot_f16 as vec_dot_f16_avx2,
    vec_dot_f32 as vec_dot_f32_avx2,
};

impl Block for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    const WEIGHTS: usize = 1;
    type Act = f32;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { avx2::vec_dot_f32(x, y) };
        }
        vec_dot_f32_portable(x, y)
    }
}

impl Quantize for f32 {
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

impl Block for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const WEIGHTS: usize = 1;
    type Act = F16;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f16_to_f32(*s);
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { avx2::vec_dot_f16(x, y) };
        }
        vec_dot_f16_portable(x, y)
    }
}

impl Quantize for F16 {
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32_to_f16(*s);
            }
        })
    }
}

impl Block for BF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const WEIGHTS: usize = 1;
    type Act = BF16;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = bf16_to_f32(*s);
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { avx2::vec_dot_bf16(x, y) };
        }
        vec_dot_bf16_portable(x, y)
    }
}

impl Quantize for BF16 {
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32_to_bf16(*s);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every f32 bit pattern with a stride coprime to the field widths (about 600M values)
    /// against `half`'s round-to-nearest-even; NaN only needs to stay NaN.
    #[test]
    fn f32_to_f16_matches_round_to_nearest_even() {
        let mut bits = 0u32;
        loop {
            let f = f32::from_bits(bits);
            let ours = f32_to_f16(f);
            if f.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(
                    ours.to_bits(),
                    half::f16::from_f32(f).to_bits(),
                    "{f:e} ({bits:#x})"
                );
            }
            match bits.checked_add(7) {
                Some(b) => bits = b,
                None => break,
            }
        }
    }

    #[test]
    fn f16_to_f32_is_exact_for_every_half() {
        for bits in 0..=u16::MAX {
            let h = F16::from_bits(bits);
            let ours = f16_to_f32(h);
            if h.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(ours.to_bits(), h.to_f32().to_bits(), "{bits:#x}");
            }
        }
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even_and_keeps_subnormals() {
        let cases: [(f32, u16); 8] = [
            (1.0, 0x3F80),
            (f32::from_bits(0x3F80_8000), 0x3F80), // tie, even stays
            (f32::from_bits(0x3F81_8000), 0x3F82), // tie, odd rounds up
            (f32::from_bits(0x3F80_8001), 0x3F81),
            (f32::from_bits(0x0000_8001), 0x0001), // subnormal kept
            (-0.0, 0x8000),
            (f32::MAX, 0x7F80), // rounds to infinity like ggml
            (f32::INFINITY, 0x7F80),
        ];
        for (f, want) in cases {
            assert_eq!(f32_to_bf16(f).to_bits(), want, "{f:e}");
        }
        assert_eq!(f32_to_bf16(f32::from_bits(0x7F80_0001)).to_bits(), 0x7FC0);
    }

    fn random_vec(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
    }

    #[test]
    fn dot_paths_agree_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in (0..300).chain([1023, 1024, 4097]) {
            let x = random_vec(&mut rng, n);
            let y = random_vec(&mut rng, n);
            let (xh, yh): (Vec<F16>, Vec<F16>) = (
                x.iter().map(|&v| f32_to_f16(v)).collect(),
                y.iter().map(|&v| f32_to_f16(v)).collect(),
            );
            let (xb, yb): (Vec<BF16>, Vec<BF16>) = (
                x.iter().map(|&v| f32_to_bf16(v)).collect(),
                y.iter().map(|&v| f32_to_bf16(v)).collect(),
            );
            let exact = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(&p, &q)| p as f64 * q as f64)
                    .sum::<f64>()
            };
            let p32 = vec_dot_f32_portable(&x, &y);
            let p16 = vec_dot_f16_portable(&xh, &yh);
            let pb = vec_dot_bf16_portable(&xb, &yb);
            let w = |v: &[F16]| v.iter().map(|&h| h.to_f32()).collect::<Vec<_>>();
            let wb = |v: &[BF16]| v.iter().map(|&h| h.to_f32()).collect::<Vec<_>>();
            let tol = 1e-5 * n as f64 + 1e-6;
            assert!((p32 as f64 - exact(&x, &y)).abs() < tol, "n={n}");
            assert!((p16 as f64 - exact(&w(&xh), &w(&yh))).abs() < tol, "n={n}");
            assert!((pb as f64 - exact(&wb(&xb), &wb(&yb))).abs() < tol, "n={n}");
            #[cfg(target_arch = "x86_64")]
            if crate::legacy::dot::avx2_ready() {
                // SAFETY: features checked just above.
                unsafe {
                    assert_eq!(
                        p32.to_bits(),
                        vec_dot_f32_avx2(&x, &y).to_bits(),
                        "f32 n={n}"
                    );
                    assert_eq!(
                        p16.to_bits(),
                        vec_dot_f16_avx2(&xh, &yh).to_bits(),
                        "f16 n={n}"
                    );
                    assert_eq!(
                        pb.to_bits(),
                        vec_dot_bf16_avx2(&xb, &yb).to_bits(),
                        "bf16 n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn rows_round_trip() {
        let src = [0.0f32, -0.0, 1.0, -1.5, 65504.0, 1e-8, 3.25, -2.5e-5];
        let mut h = [F16::ZERO; 8];
        F16::quantize_row(&src, &mut h);
        let mut back = [0.0f32; 8];
        F16::dequantize_row(&h, &mut back);
        for (a, b) in src.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() * 1e-3 + 6e-8, "{a} {b}");
        }
        let mut bf = [BF16::ZERO; 8];
        BF16::quantize_row(&src, &mut bf);
        BF16::dequantize_row(&bf, &mut back);
        for (a, b) in src.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() * 4e-3, "{a} {b}");
        }
        assert_eq!(back[1].to_bits(), (-0.0f32).to_bits());
    }
}
