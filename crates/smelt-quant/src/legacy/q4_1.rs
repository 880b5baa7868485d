//! Q4_1: 32 weights as 4-bit steps above a minimum (`w = d * q + m`).

use super::dot::{self, dot_blocks, dot_nibbles, nibbles};
use super::scan::{blocks32, blocks32_mut, inverse, min_max, pack4, trunc_i8, vectorized};
use super::BlockQ8_1;
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::{Block, GgmlType, Quantize};
use half::f16;

/// ggml's `block_q4_1`: scale `d`, minimum `m`, then nibbles as in Q4_0.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_1 {
    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8_1) -> i32 {
        dot_nibbles(&x.qs, 0, &y.qs)
    }

    /// `d_x d_y sum(q y) + m_x s_y`, where `s_y = d_y sum(y)` comes precomputed in Q8_1.
    #[inline(always)]
    fn term(x: &Self, y: &BlockQ8_1, isum: i32) -> f32 {
        (f16_to_f32(x.d) * f16_to_f32(y.d)) * isum as f32 + f16_to_f32(x.m) * f16_to_f32(y.s)
    }

    /// [`Block::vec_dot`] without SIMD.
    pub fn vec_dot_portable(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        dot_blocks(x, y, Self::isum, Self::term)
    }

    /// [`Block::vec_dot`] with AVX2, bit-identical to [`Self::vec_dot_portable`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_avx2(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        use dot::x86;
        use std::arch::x86_64::{_mm256_add_ps, _mm256_mul_ps};
        let group = |xs: &[Self], ys: &[BlockQ8_1]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| {
                    x86::dot_unsigned(x86::nibbles(&xs[l].qs), x86::load(&ys[l].qs))
                }));
                let dxy = x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums);
                let ms = _mm256_mul_ps(x86::f16x8(|l| xs[l].m), x86::f16x8(|l| ys[l].s));
                _mm256_add_ps(dxy, ms)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
                for (o, q) in out.iter_mut().zip(nibbles(&b.qs)) {
                    *o = q as f32 * d + m;
                }
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { Self::vec_dot_avx2(x, y) };
        }
        Self::vec_dot_portable(x, y)
    }
}

impl Quantize for BlockQ4_1 {
    /// `quantize_row_q4_1_ref`: 15 steps from the block's minimum to its maximum; each
    /// weight truncated after adding 0.5, capped at 15.
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let (min, max) = min_max(x);
                let d = (max - min) / 15.0;
                let id = inverse(d);
                b.d = f32_to_f16(d);
                b.m = f32_to_f16(min);
                let mut q = [0u8; 32];
                for (j, q) in q.iter_mut().enumerate() {
                    *q = trunc_i8((x[j] - min) * id + 0.5).min(15) as u8;
                }
                b.qs = pack4(&q);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::testutil::*;
    use bytemuck::Zeroable;

    #[test]
    fn known_blocks() {
        let mut b = [BlockQ4_1::zeroed()];
        BlockQ4_1::quantize_row(&[0.0; 32], &mut b);
        assert_eq!(
            (b[0].d.to_bits(), b[0].m.to_bits(), b[0].qs),
            (0, 0, [0; 16])
        );

        // 0, 1, ..., 15 twice: d = 1, m = 0, quants are the values themselves.
        let x: [f32; 32] = std::array::from_fn(|i| (i % 16) as f32);
        BlockQ4_1::quantize_row(&x, &mut b);
        assert_eq!((b[0].d, b[0].m), (f16::ONE, f16::ZERO));
        let want: [u8; 16] = std::array::from_fn(|j| j as u8 | ((j as u8) << 4));
        assert_eq!(b[0].qs, want);

        // A constant block: d = 0, m = the constant, quants 0.
        BlockQ4_1::quantize_row(&[-2.5; 32], &mut b);
        assert_eq!(
            (b[0].d, b[0].m, b[0].qs),
            (f16::ZERO, f16::from_f32(-2.5), [0; 16])
        );
    }

    #[test]
    fn round_trip_error() {
        check_round_trip::<BlockQ4_1>(1.0 / 15.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ4_1>(BlockQ4_1::vec_dot_portable, avx2!(BlockQ4_1));
    }
}
