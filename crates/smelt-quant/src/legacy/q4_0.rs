//! Q4_0: 32 weights as 4-bit offsets from 8, one f16 scale (`w = d * (q - 8)`).

use super::dot::{self, dot_blocks, dot_nibbles, nibbles};
use super::scan::{blocks32, blocks32_mut, inverse, pack4, signed_abs_max, trunc_i8, vectorized};
use super::BlockQ8_0;
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::{Block, GgmlType, Quantize};
use half::f16;

/// ggml's `block_q4_0`: weight `j` in the low nibble of `qs[j]`, weight `j + 16` in the
/// high nibble.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockQ4_0 {
    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8_0) -> i32 {
        dot_nibbles(&x.qs, 8, &y.qs)
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
        let group = |xs: &[Self], ys: &[BlockQ8_0]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| {
                    x86::dot_offset(x86::nibbles(&xs[l].qs), 8, x86::load(&ys[l].qs))
                }));
                x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                let d = f16_to_f32(b.d);
                for (o, q) in out.iter_mut().zip(nibbles(&b.qs)) {
                    *o = (q as i32 - 8) as f32 * d;
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

impl Quantize for BlockQ4_0 {
    /// `quantize_row_q4_0_ref`: the scale is the signed extreme over -8, so it maps to
    /// quant 0; each weight is truncated after adding 8.5 and capped at 15.
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let d = signed_abs_max(x) / -8.0;
                let id = inverse(d);
                b.d = f32_to_f16(d);
                let mut q = [0u8; 32];
                for (j, q) in q.iter_mut().enumerate() {
                    *q = trunc_i8(x[j] * id + 8.5).min(15) as u8;
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
        let mut b = [BlockQ4_0::zeroed()];
        BlockQ4_0::quantize_row(&[0.0; 32], &mut b);
        // ggml: max = +0.0, d = 0.0 / -8 = -0.0; every quant is trunc(8.5) = 8.
        assert_eq!(b[0].d.to_bits(), 0x8000);
        assert_eq!(b[0].qs, [0x88; 16]);

        let x: [f32; 32] = std::array::from_fn(|i| i as f32 - 16.0); // -16 ..= 15
        BlockQ4_0::quantize_row(&x, &mut b);
        // max = -16, d = 2, id = 0.5: q = min(15, trunc(x/2 + 8.5)).
        assert_eq!(b[0].d, f16::from_f32(2.0));
        for j in 0..16 {
            let q = |v: f32| ((v / 2.0 + 8.5) as i32).min(15) as u8;
            assert_eq!(b[0].qs[j], q(x[j]) | (q(x[j + 16]) << 4), "j={j}");
        }
        assert_eq!(b[0].qs[0] & 0xF, 0);
    }

    #[test]
    fn round_trip_error() {
        // The weight opposite the extreme can be clamped from quant 16 to 15: one whole step.
        check_round_trip::<BlockQ4_0>(1.0 / 8.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ4_0>(BlockQ4_0::vec_dot_portable, avx2!(BlockQ4_0));
    }
}
