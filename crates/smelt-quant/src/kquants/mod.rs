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

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod common;
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
pub(crate) mod testutil;
