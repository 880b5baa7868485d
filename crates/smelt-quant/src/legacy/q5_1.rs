//! Q5_1: 32 weights as 5-bit steps above a minimum (`w = d * q + m`).

use super::dot::{self, dot_blocks, dot_nibbles5, nibbles_with_high_bit};
use super::scan::{blocks32, blocks32_mut, inverse, min_max, pack5, trunc_i8, vectorized};
use super::BlockQ8_1;
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::{Block, GgmlType, Quantize};
use half::f16;

/// ggml's `block_q5_1`: scale, minimum, fifth bits as in Q5_0, nibbles as in Q4_0.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl BlockQ5_1 {
    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8_1) -> i32 {
        dot_nibbles5(&x.qs, x.qh, 0, &y.qs)
    }

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
        use std::arch::x86_64::{_mm256_add_ps, _mm256_mul_ps, _mm256_or_si256};
        let group = |xs: &[Self], ys: &[BlockQ8_1]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| {
                    let q = _mm256_or_si256(x86::nibbles(&xs[l].qs), x86::fifth_bits(xs[l].qh));
                    x86::dot_unsigned(q, x86::load(&ys[l].qs))
                }));
                let dxy = x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums);
                let ms = _mm256_mul_ps(x86::f16x8(|l| xs[l].m), x86::f16x8(|l| ys[l].s));
                _mm256_add_ps(dxy, ms)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
                for (o, q) in out.iter_mut().zip(nibbles_with_high_bit(&b.qs, b.qh)) {
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

impl Quantize for BlockQ5_1 {
    /// `quantize_row_q5_1_ref`: 31 steps from minimum to maximum; each weight truncated
    /// to a byte after adding 0.5 (ggml has no cap here, and needs none).
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let (min, max) = min_max(x);
                let d = (max - min) / 31.0;
                let id = inverse(d);
                b.d = f32_to_f16(d);
                b.m = f32_to_f16(min);
                let mut q = [0u8; 32];
                for (j, q) in q.iter_mut().enumerate() {
                    *q = trunc_i8((x[j] - min) * id + 0.5) as u8;
                }
                (b.qs, b.qh) = pack5(&q);
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
        let mut b = [BlockQ5_1::zeroed()];
        BlockQ5_1::quantize_row(&[0.0; 32], &mut b);
        assert_eq!(
            (b[0].d.to_bits(), b[0].m.to_bits(), b[0].qh, b[0].qs),
            (0, 0, [0; 4], [0; 16])
        );

        // 0 ..= 31: d = 1, m = 0, q = x.
        let x: [f32; 32] = std::array::from_fn(|i| i as f32);
        BlockQ5_1::quantize_row(&x, &mut b);
        assert_eq!((b[0].d, b[0].m), (f16::ONE, f16::ZERO));
        assert_eq!(b[0].qh, 0xFFFF_0000u32.to_le_bytes());
        assert_eq!(dequantized(&b), x.to_vec());
    }

    #[test]
    fn round_trip_error() {
        check_round_trip::<BlockQ5_1>(1.0 / 31.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ5_1>(BlockQ5_1::vec_dot_portable, avx2!(BlockQ5_1));
    }
}
