//! The f16 GEMM in blocks shaped for batched decode (16-64 tokens a step).
//!
//! Nsight Compute on decode steps of 32 sequences (H200, bench/RESULTS.md 2026-11-27):
//! every GEMM the engine had for that size ran at 9-14% of DRAM bandwidth with the L1/shared
//! pipe 65-84% busy. The prompt f16 GEMM ([`super::f16`], 128 x 128 blocks) multiplies 128
//! token columns of which 32 are real, so three quarters of its `ldmatrix` traffic and
//! `mma`s are padding. These kernels are the same body ([`super::f16::multiply`]: weights
//! dequantized into shared memory a 64-weight step at a time, tokens copied with
//! `cp.async`, `ldmatrix` + `mma.m16n8k16`) in blocks whose token width fits the batch, with
//! warps of 32 rows x 32 tokens (2 x 4 `mma` tiles: 256 bytes of shared memory read an
//! `mma`, against 768 for each real token's `mma` in a 128-wide block at 32 tokens):
//!
//! - [`N32`]: 256 rows x 32 tokens (eight row warps; the staging makes two 128-row passes),
//! - [`N64`]: 128 rows x 64 tokens (four row warps x two token warps).
//!
//! Same arguments, split K and reduce as the other GEMMs; same CPU twin as the prompt f16
//! GEMM ([`super::f16::cpu_with_magnitude`]): the staged halves are identical, only the
//! order of the f32 sums inside an `mma` tile's K steps is the tensor core's.

use super::f16::{kernel_shaped, Shape, BLOCKS_PER_SM};
use crate::formats::Q4K;
use crate::ops::Launch;
use crate::GgmlType;

/// Blocks of 256 rows x 32 tokens.
pub const N32: Shape = Shape {
    rows: 256,
    tokens: 32,
    ahead: 2,
};
/// Blocks of 128 rows x 64 tokens.
pub const N64: Shape = Shape {
    rows: 128,
    tokens: 64,
    ahead: 2,
};

/// The engine's default: matmuls of at most this many tokens (and at least
/// [`super::MIN_TOKENS`]) take these kernels where [`preferred`] says so. Whole decode
/// steps of the Llama-3-8B-shape Q4_K on an H100 (bench/RESULTS.md 2026-11-27 00:35 UTC,
/// against the int8 GEMM): 16 sequences 1.08x, 32 1.07x, 64 1.05x.
/// `SMELT_CUDA_GEMM_SMALL_MAX` sets it (0: off).
pub const MAX_TOKENS: usize = 64;

/// Whether a matmul of `nrows` x `k` weights and `ntok` tokens runs faster here than on
/// the int8 GEMM, as measured on an H100 (`gpu_ops perf -o gemm_f16`, bench/RESULTS.md
/// 2026-11-27, one step of weights in flight; time against the int8 GEMM's):
/// 14336x4096 0.72 at 16 and 32 tokens, 1.04 at 64; 4096x14336 0.64 / 0.66 / 0.78;
/// 4096x4096 1.29 / 1.29 / 1.04; 1024x4096 1.70 / 1.74 / 1.48. Small matrices make too
/// few blocks of 256 rows to keep enough weights in flight.
pub fn preferred(nrows: usize, k: usize, ntok: usize) -> bool {
    let big = nrows * k >= 1 << 25;
    (big && ntok <= 32) || (big && k >= 8192 && ntok <= 64)
}

/// Formats with small-batch f16 GEMMs, and their kernels for [`N32`] and [`N64`].
pub const TYPES: [(GgmlType, [&str; 2]); 1] =
    [(GgmlType::Q4_K, ["gemm_f16s32_q4_k", "gemm_f16s64_q4_k"])];

/// The block shape for `ntok` tokens: [`N32`] up to 32, else [`N64`].
pub fn shape(ntok: usize) -> Shape {
    if ntok <= 32 {
        N32
    } else {
        N64
    }
}

/// The kernel for `ntok` tokens of type `ty`, if there is one.
pub fn name(ty: GgmlType, ntok: usize) -> Option<&'static str> {
    let (_, names) = TYPES.iter().find(|(t, _)| *t == ty)?;
    Some(if shape(ntok) == N32 {
        names[0]
    } else {
        names[1]
    })
}

/// Splits of the K range for `ntok` tokens ([`super::splits_for_blocks`] of its shape).
pub fn splits(nrows: usize, ntiles: usize, ntok: usize, sm_count: usize) -> usize {
    super::f16::splits_for(shape(ntok), nrows, ntiles, Some(ntok), sm_count)
}

/// The launch for `a` (its token count picks the shape).
pub fn launch(a: &super::Args) -> Launch {
    super::f16::launch_for(shape(a.ntok as usize), a)
}

/// The small-batch f16 GEMMs, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    let [n32, n64] = TYPES[0].1;
    vec![
        (
            n32.to_string(),
            Box::new(|k| kernel_shaped::<Q4K, 2, 4>(k, BLOCKS_PER_SM, N32)),
        ),
        (
            n64.to_string(),
            Box::new(|k| kernel_shaped::<Q4K, 2, 4>(k, BLOCKS_PER_SM, N64)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_names_and_launches_follow_the_token_count() {
        assert_eq!(name(GgmlType::Q4_K, 16), Some("gemm_f16s32_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 32), Some("gemm_f16s32_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 33), Some("gemm_f16s64_q4_k"));
        assert_eq!(name(GgmlType::Q6_K, 16), None);
        // Llama-3-8B: the MLP's matrices at 16-32 tokens, its down matrix up to 64.
        assert!(preferred(14336, 4096, 32) && !preferred(14336, 4096, 64));
        assert!(preferred(4096, 14336, 64) && !preferred(4096, 14336, 65));
        assert!(!preferred(4096, 4096, 16) && !preferred(1024, 4096, 32));
        for s in [N32, N64] {
            assert!(s.shared_bytes() <= 48 * 1024, "{s:?}");
        }
        let a = super::super::Args::q4_k_for_test(4097, 40, 16);
        let l = launch(&a);
        assert_eq!(l.grid, (1, 33, 4));
        let l = launch(&super::super::Args { ntok: 20, ..a });
        assert_eq!(l.grid, (1, 17, 4));
        // H100, 32 tokens: 14336 rows are 56 blocks of 256, two splits fill 132 SMs twice.
        assert_eq!(splits(14336, 16, 32, 132), 4);
        assert_eq!(splits(4096, 16, 32, 132), 4);
    }

    #[test]
    fn every_small_f16_gemm_builds() {
        crate::catalog::assert_builds(catalog, &TYPES[0].1);
    }
}
