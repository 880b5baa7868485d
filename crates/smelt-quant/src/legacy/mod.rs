//! Legacy 32-weight block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), byte-identical with
//! ggml's reference quantizers (`quantize_row_*_ref` in `ggml-quants.c`).
//!
//! Each block type has two dot-product paths as associated functions, `vec_dot_portable`
//! and (on x86_64) the unsafe `vec_dot_avx2`, between which [`crate::Block::vec_dot`]
//! picks at run time. Both compute every block's integer dot exactly and apply the float
//! scales with the same operations in the same order (see `legacy/dot.rs`), so they agree
//! bit for bit on every input, including byte patterns no quantizer writes.

pub(crate) mod dot;
mod q4_0;
mod q4_1;
mod q5_0;
mod q5_1;
mod q8_0;
mod q8_1;
pub(crate) mod scan;
#[cfg(test)]
pub(crate) mod testutil;

pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Block;

    fn layout<B: Block>() {
        assert_eq!(
            std::mem::size_of::<B>(),
            B::TYPE.type_size(),
            "{:?}",
            B::TYPE
        );
        assert_eq!(B::WEIGHTS, B::TYPE.block_size(), "{:?}", B::TYPE);
    }

    #[test]
    fn block_layouts_match_the_gguf_type_table() {
        layout::<BlockQ4_0>();
        layout::<BlockQ4_1>();
        layout::<BlockQ5_0>();
        layout::<BlockQ5_1>();
        layout::<BlockQ8_0>();
        layout::<BlockQ8_1>();
        layout::<f32>();
        layout::<half::f16>();
        layout::<half::bf16>();
        layout::<crate::iq4::BlockIQ4NL>();
        layout::<crate::iq4::BlockIQ4XS>();
    }
}
