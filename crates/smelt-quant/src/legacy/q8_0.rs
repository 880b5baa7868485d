//! Q8_0: 32 weights as signed bytes with one f16 scale (`w = d * q`); also the activation
//! format of Q4_0, Q5_0, Q8_0 and IQ4_NL dot products.

use super::scan::{abs_max, blocks32, inverse, round_away, vectorized};
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::Quantize;
use half::f16;

/// ggml's `block_q8_0`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// The dot products and the `Block` impl of the two 8-bit formats: both are 32 signed bytes
/// under an f16 `d`, so everything but quantization (Q8_1 also stores a sum) is the same.
macro_rules! q8_block {
    ($block:ident, $ty:ident) => {
        impl $block {
            #[inline(always)]
            fn isum(x: &Self, y: &Self) -> i32 {
                $crate::legacy::dot::dot_i8(&x.qs, &y.qs)
            }

            #[inline(always)]
            fn term(x: &Self, y: &Self, isum: i32) -> f32 {
                ($crate::fp::f16_to_f32(x.d) * $crate::fp::f16_to_f32(y.d)) * isum as f32
            }

            /// [`Block::vec_dot`](crate::Block::vec_dot) without SIMD: `d_x d_y sum(q_x q_y)` per
            /// block (ggml has no Q8_1 x Q8_1 dot; its `s` plays no part).
            pub fn vec_dot_portable(x: &[Self], y: &[Self]) -> f32 {
                $crate::legacy::dot::dot_blocks(x, y, Self::isum, Self::term)
            }

            /// [`Block::vec_dot`](crate::Block::vec_dot) with AVX2, bit-identical to [`Self::vec_dot_portable`].
            ///
            /// # Safety
            /// The CPU must support AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn vec_dot_avx2(x: &[Self], y: &[Self]) -> f32 {
                use $crate::legacy::dot::x86;
                let group = |xs: &[Self], ys: &[Self]| {
                    // SAFETY: this closure runs inside an AVX2 function.
                    unsafe {
                        let sums =
                            x86::hsum8(std::array::from_fn(|l| x86::dot_i8(&xs[l].qs, &ys[l].qs)));
                        x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums)
                    }
                };
                x86::dot_groups(x, y, group, Self::isum, Self::term)
            }
        }

        impl $crate::Block for $block {
            const TYPE: $crate::GgmlType = $crate::GgmlType::$ty;
            const WEIGHTS: usize = 32;
            type Act = $block;

            fn dequantize_row(src: &[Self], dst: &mut [f32]) {
                $crate::legacy::scan::vectorized(|| {
                    for (b, out) in src.iter().zip($crate::legacy::scan::blocks32_mut(dst)) {
                        $crate::legacy::q8_0::dequantize_q8(b.d, &b.qs, out);
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
    };
}
pub(super) use q8_block;

q8_block!(BlockQ8_0, Q8_0);

impl Quantize for BlockQ8_0 {
    /// `quantize_row_q8_0_ref`: scale `amax / 127`, quants `roundf(x / d)`.
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                b.d = f32_to_f16(quantize_q8(x, &mut b.qs));
            }
        })
    }
}

/// The 8-bit step Q8_0 and Q8_1 share (`quantize_row_q8_{0,1}_ref`): scale `amax / 127`,
/// quants `roundf(x / d)`. Returns the f32 scale, which Q8_1's sum is computed from
/// before either is rounded to f16.
#[inline(always)]
pub(super) fn quantize_q8(x: &[f32; 32], qs: &mut [i8; 32]) -> f32 {
    let d = abs_max(x) / 127.0;
    let id = inverse(d);
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_away(v * id) as i8;
    }
    d
}

/// `w = d * q`, the dequantization Q8_0 and Q8_1 share (Q8_1's sum plays no part).
#[inline(always)]
pub(super) fn dequantize_q8(d: f16, qs: &[i8; 32], out: &mut [f32; 32]) {
    let d = f16_to_f32(d);
    for (o, &q) in out.iter_mut().zip(qs) {
        *o = q as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::testutil::*;
    use bytemuck::Zeroable;

    #[test]
    fn known_blocks() {
        let mut b = [BlockQ8_0::zeroed()];
        BlockQ8_0::quantize_row(&[0.0; 32], &mut b);
        assert_eq!((b[0].d.to_bits(), b[0].qs), (0, [0; 32]));

        // amax 127 gives d = 1 exactly; halves round away from zero.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = -127.0;
        x[2] = 2.5;
        x[3] = -2.5;
        x[4] = 0.49;
        BlockQ8_0::quantize_row(&x, &mut b);
        assert_eq!(b[0].d, f16::ONE);
        assert_eq!(&b[0].qs[..6], &[127, -127, 3, -3, 0, 0]);
    }

    #[test]
    fn round_trip_error() {
        check_round_trip::<BlockQ8_0>(1.0 / 254.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ8_0>(BlockQ8_0::vec_dot_portable, avx2!(BlockQ8_0));
    }
}
