//! Q5_0: 32 weights as 5-bit offsets from 16, one f16 scale (`w = d * (q - 16)`).

use super::dot::{self, dot_blocks, dot_nibbles5, nibbles_with_high_bit};
use super::scan::{blocks32, blocks32_mut, inverse, pack5, signed_abs_max, trunc_i8, vectorized};
use super::BlockQ8_0;
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::{Block, GgmlType, Quantize};
use half::f16;

/// ggml's `block_q5_0`: low four bits as in Q4_0, bit `j` of `qh` (little-endian u32) is
/// the fifth bit of weight `j`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

impl BlockQ5_0 {
    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8_0) -> i32 {
        dot_nibbles5(&x.qs, x.qh, 16, &y.qs)
    }

    #[inline(always)]
    fn term(x: &Self, y: &BlockQ8_0, isum: i32) -> f32 {
        (f16_to_f32(x.d) * f16_to_f32(y.d)) * isum as f32
    }

    /// [`Block::vec_dot`] without SIMD.
    pub fn vec_dot_portable(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        dot_blocks(x, y, Self::isum, Self::term)
    }

    /// [`Block::vec_dot`] with AVX2, bit-identical to [`Self::vec_dot_portable`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_avx2(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        use dot::x86;
        use std::arch::x86_64::_mm256_or_si256;
        let group = |xs: &[Self], ys: &[BlockQ8_0]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| {
                    let q = _mm256_or_si256(x86::nibbles(&xs[l].qs), x86::fifth_bits(xs[l].qh));
                    x86::dot_offset(q, 16, x86::load(&ys[l].qs))
                }));
                x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                let d = f16_to_f32(b.d);
                for (o, q) in out.iter_mut().zip(nibbles_with_high_bit(&b.qs, b.qh)) {
                    *o = (q as i32 - 16) as f32 * d;
                }
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { Self::vec_dot_avx2(x, y) };
        }
        Self::vec_dot_portable(x, y)
    }
}

impl Quantize for BlockQ5_0 {
    /// `quantize_row_q5_0_ref`: as Q4_0 with 32 levels (scale = signed extreme / -16,
    /// truncation after adding 16.5, cap at 31).
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let d = signed_abs_max(x) / -16.0;
                let id = inverse(d);
                b.d = f32_to_f16(d);
                let mut q = [0u8; 32];
                for (j, q) in q.iter_mut().enumerate() {
                    *q = trunc_i8(x[j] * id + 16.5).min(31) as u8;
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
        let mut b = [BlockQ5_0::zeroed()];
        BlockQ5_0::quantize_row(&[0.0; 32], &mut b);
        // d = 0.0 / -16 = -0.0; every quant is trunc(16.5) = 16: fifth bit set everywhere.
        assert_eq!(
            (b[0].d.to_bits(), b[0].qh, b[0].qs),
            (0x8000, [0xFF; 4], [0; 16])
        );

        // -16 ..= 15 with max = -16: d = 1, id = 1, q = x + 16 (0 ..= 31).
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 - 16.0);
        BlockQ5_0::quantize_row(&x, &mut b);
        assert_eq!(b[0].d, f16::ONE);
        assert_eq!(b[0].qh, 0xFFFF_0000u32.to_le_bytes());
        let want: [u8; 16] = std::array::from_fn(|j| j as u8 | ((j as u8) << 4));
        assert_eq!(b[0].qs, want);
        let back = dequantized(&b);
        assert_eq!(back, x.to_vec());
    }

    #[test]
    fn round_trip_error() {
        // The weight opposite the extreme can be clamped from 32 to 31: one whole step.
        check_round_trip::<BlockQ5_0>(1.0 / 16.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ5_0>(BlockQ5_0::vec_dot_portable, avx2!(BlockQ5_0));
    }
}
