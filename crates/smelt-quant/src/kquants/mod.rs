//! K-quants: 256-weight super-blocks split into 16- or 32-weight groups whose scales
//! (and mins) are themselves quantized against one f16 scale per super-block.
//!
//! Quantization follows ggml's reference quantizers (`quantize_row_q*_K_ref`, no
//! importance matrix) operation for operation, so the bytes match ggml's. Dot products
//! run against [`BlockQ8K`] activations; each format has a portable and an AVX2 path
//! that compute every super-block's integer sums exactly and fold them into the result
//! through the same scalar code, which is why the two paths agree bit for bit.

// Indexed loops mirror ggml's layout arithmetic (weight `128 * h + 32 * k + i` ...),
// which is what a reader checks them against.
#![allow(clippy::needless_range_loop)]

/// Implements [`crate::Block`] and [`crate::Quantize`] for a K-quant block from the
/// invoking module's `quantize`/`dequantize` methods and `vec_dot_portable`/
/// `vec_dot_avx2` functions. Quantizing is compiled twice, once with AVX2 enabled so
/// the lane loops of `lanes.rs` vectorize 8 wide; no FMA is enabled or formed, so both
/// builds compute the same bytes.
macro_rules! impl_kquant {
    ($block:ident, $ty:ident) => {
        impl $crate::Block for $block {
            const TYPE: $crate::GgmlType = $crate::GgmlType::$ty;
            const WEIGHTS: usize = $crate::kquants::QK_K;
            type Act = $crate::kquants::BlockQ8K;

            fn dequantize_row(src: &[Self], dst: &mut [f32]) {
                for (b, out) in src.iter().zip(dst.chunks_exact_mut($crate::kquants::QK_K)) {
                    if let Ok(out) = out.try_into() {
                        b.dequantize(out);
                    }
                }
            }

            fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32 {
                #[cfg(target_arch = "x86_64")]
                if $crate::simd::has_avx2() {
                    // SAFETY: has_avx2 checked the CPU for AVX2 and FMA.
                    return unsafe { vec_dot_avx2(x, y) };
                }
                vec_dot_portable(x, y)
            }
        }

        impl $crate::Quantize for $block {
            fn quantize_row(src: &[f32], dst: &mut [Self]) {
                #[inline(always)]
                fn blocks(src: &[f32], dst: &mut [$block]) {
                    for (x, y) in src.chunks_exact($crate::kquants::QK_K).zip(dst) {
                        if let Ok(x) = x.try_into() {
                            *y = <$block>::quantize(x);
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                if $crate::simd::has_avx2() {
                    #[target_feature(enable = "avx2")]
                    unsafe fn blocks_avx2(src: &[f32], dst: &mut [$block]) {
                        blocks(src, dst)
                    }
                    // SAFETY: has_avx2 checked the CPU for AVX2.
                    unsafe { blocks_avx2(src, dst) };
                    return;
                }
                blocks(src, dst)
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod common;
mod lanes;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_k;

pub use common::QK_K;
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_k::BlockQ4K;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_k::BlockQ8K;

#[cfg(test)]
mod reference;
#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Block;

    fn check_layout<B: Block>() {
        assert_eq!(
            std::mem::size_of::<B>(),
            B::TYPE.type_size(),
            "{:?}",
            B::TYPE
        );
        assert_eq!(B::WEIGHTS, B::TYPE.block_size(), "{:?}", B::TYPE);
        assert_eq!(
            <B::Act as Block>::TYPE,
            crate::GgmlType::Q8_K,
            "{:?}",
            B::TYPE
        );
    }

    #[test]
    fn block_sizes_are_ggml_type_sizes() {
        check_layout::<BlockQ2K>();
        check_layout::<BlockQ3K>();
        check_layout::<BlockQ4K>();
        check_layout::<BlockQ5K>();
        check_layout::<BlockQ6K>();
        check_layout::<BlockQ8K>();
    }
}
