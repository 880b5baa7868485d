//! Q8_1: Q8_0 plus `s = d * sum(q)`, the activation format of Q4_1 and Q5_1 (the sum
//! lets their minimum be applied once per block instead of once per weight).

use super::dot::{self, dot_blocks, dot_i8};
use super::q8_0::{dequantize_q8, quantize_q8};
use super::scan::{blocks32, blocks32_mut, vectorized};
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::{Block, GgmlType, Quantize};
use half::f16;

/// ggml's `block_q8_1`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl BlockQ8_1 {
    #[inline(always)]
    fn isum(x: &Self, y: &Self) -> i32 {
        dot_i8(&x.qs, &y.qs)
    }

    #[inline(always)]
    fn term(x: &Self, y: &Self, isum: i32) -> f32 {
        (f16_to_f32(x.d) * f16_to_f32(y.d)) * isum as f32
    }

    /// [`Block::vec_dot`] without SIMD. ggml has no Q8_1 x Q8_1 dot; this is the plain
    /// `d_x d_y sum(q_x q_y)` per block, `s` unused.
    pub fn vec_dot_portable(x: &[Self], y: &[Self]) -> f32 {
        dot_blocks(x, y, Self::isum, Self::term)
    }

    /// [`Block::vec_dot`] with AVX2, bit-identical to [`Self::vec_dot_portable`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_avx2(x: &[Self], y: &[Self]) -> f32 {
        use dot::x86;
        let group = |xs: &[Self], ys: &[Self]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| x86::dot_i8(&xs[l].qs, &ys[l].qs)));
                x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                dequantize_q8(b.d, &b.qs, out);
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[Self]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { Self::vec_dot_avx2(x, y) };
        }
        Self::vec_dot_portable(x, y)
    }
}

impl Quantize for BlockQ8_1 {
    /// `quantize_row_q8_1_ref`: as Q8_0, plus `s = f16(d * sum of quants)`.
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let d = quantize_q8(x, &mut b.qs);
                b.d = f32_to_f16(d);
                // ggml sums the stored bytes (what a block of tiny values wraps to included).
                let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
                b.s = f32_to_f16(sum as f32 * d);
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
        let mut b = [BlockQ8_1::zeroed()];
        BlockQ8_1::quantize_row(&[0.0; 32], &mut b);
        assert_eq!(
            (b[0].d.to_bits(), b[0].s.to_bits(), b[0].qs),
            (0, 0, [0; 32])
        );

        // d = 1: s is the plain sum of the quants.
        let x: [f32; 32] = std::array::from_fn(|i| if i == 0 { 127.0 } else { i as f32 - 20.4 });
        BlockQ8_1::quantize_row(&x, &mut b);
        assert_eq!(b[0].d, f16::ONE);
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b[0].s, f16::from_f32(sum as f32));
        assert_eq!(b[0].qs[1], -19);
    }

    #[test]
    fn round_trip_error() {
        check_round_trip::<BlockQ8_1>(1.0 / 254.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ8_1>(BlockQ8_1::vec_dot_portable, avx2!(BlockQ8_1));
    }
}
