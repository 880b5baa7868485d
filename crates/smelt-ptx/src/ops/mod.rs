//! Instruction families, each an `impl Kernel` block.

pub mod arith;
pub mod bits;
pub mod control;
pub mod convert;
pub mod dot;
pub mod memory;
pub mod special;
pub mod tensor;
pub mod warp;
