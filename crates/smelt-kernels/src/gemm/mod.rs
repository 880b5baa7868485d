//! Many-token matrix multiply of quantized weights on the tensor cores: `y[t][r] = W[r] ·
//! x[t]` for prompt chunks and batched decode, where the GEMV would read the weights again
//! for every eight tokens. The idea is ggml's MMQ (int8 `mma.sync` on unpacked weights and
//! int8 activations); the layout and the scale handling are ours.
//!
//! A block of [`THREADS`] threads owns [`BM`] rows x [`BN`] tokens. For each 256-weight
//! tile it stages into shared memory the rows' weights unpacked to int8 plus their scales
//! ([`GemmFormat::stage`]) and the tokens' quants as they are (`cp.async`, [`act`]: one f32
//! scale per tile). Each of its eight warps computes 32 rows x 16 tokens with int8
//! `mma.sync` (m16n8k32 for 32-weight groups, m16n8k16 for 16) and sums a tile in integers:
//!
//! - integer group scales (K-quants): `I += sc_g * isum_g` per group (one `mad` per
//!   product), and for formats with minima `M = sum_g m_g * qsum_g` as a second `mma`
//!   chained over the groups, whose A operand is each row's 6-bit minimum repeated over the
//!   group; once per tile `acc += D_t * (d_r * I + (-dmin_r) * M)`;
//! - float group scales (Q8_0, Q4_0, Q5_0, IQ4_NL) read the GEMV's q8_1 tiles instead
//!   ([`reads_q8_1`]: a scale `D_tg` per 32 values, as ggml-cpu's Q8_0/Q8_1 dot products
//!   for these formats take; one per 256 doubled their prompt logits' error):
//!   `acc += dA_g * (D_tg * isum_g)` per group; with float minima (Q4_1, Q5_1:
//!   `w = d q + m`) also `acc += m_g * s_tg`, the tile's `s = D * sum(q)` of the group.
//!
//! Every output is summed in one fixed order whatever else shares its launch, so a
//! sequence's results do not depend on the other tokens of its step.
//!
//! CPU twin: [`cpu_with_magnitude`] (f64, from ggml's dequantized weights and the
//! activation tiles).
//!
//! Files: `args.rs` the launch's arguments and split count, `int8.rs` the kernel body,
//! `store.rs` the output stores the GEMMs share, `reduce.rs` the split reduce kernel,
//! `fixup.rs` the reduce's in-kernel alternative.

pub mod act;
mod args;
pub mod f16;
mod f16_q6_k;
mod f16_q8_0;
pub mod f16_small;
pub mod fixup;
mod formats;
pub mod grouped;
mod int8;
mod legacy;
mod lowbit;
pub mod members;
pub mod narrow;
mod narrow_q4_k;
mod narrow_q6_k;
mod narrow_q8_0;
mod reduce;
#[cfg(test)]
mod staging_model;
mod store;

use smelt_ptx::{Kernel, Reg, U32, U64};

pub(crate) use args::GemmRegs;
pub use args::{splits, splits_for_blocks, Args, GemmArgs};
pub use int8::{kernel, kernel_variant, Variant, VARIANT};
pub(crate) use reduce::sum_splits;
pub use reduce::{reduce_kernel, ReduceArgs, REDUCE, REDUCE_THREADS};
pub(crate) use store::{split_range, store_outputs, Out};

use crate::formats::{
    GpuFormat, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::{GgmlType, KernelError, TILE};

/// Rows of W per block.
pub const BM: u32 = 64;
/// Tokens per block.
pub const BN: u32 = 64;
/// Threads per block: eight warps, each 32 rows x 16 tokens.
pub const THREADS: u32 = 256;
/// Bytes of one row's 256 int8 weights in shared memory: 16 more than 256, so the eight
/// rows an `mma` fragment load touches fall in different banks.
const A_STRIDE: u32 = TILE as u32 + 16;
/// Bytes of one token's 256 int8 quants in shared memory (padded as [`A_STRIDE`]).
const B_STRIDE: u32 = TILE as u32 + 16;
/// Bytes of one row's group scales in shared memory ([`Scales`]), for every format but
/// those with 16-weight groups and minima ([`sc_stride`]).
const SC_STRIDE: u32 = 64;
/// The same for 16-weight groups with minima (Q2_K): sixteen scales, sixteen minima.
const SC_STRIDE_WIDE: u32 = 128;

/// Bytes of one row's group scales in shared memory for format `F`.
const fn sc_stride<F: GemmFormat>() -> u32 {
    match (F::GROUP, F::SCALES) {
        (16, Scales::Int { min: true }) => SC_STRIDE_WIDE,
        _ => SC_STRIDE,
    }
}
/// Whether format `F`'s GEMM reads the GEMV's q8_1 activation tiles (`crate::act`: a
/// scale per 32 values, and `s = d * sum(q)`) instead of this module's [`act`] tiles (one
/// scale per 256): the formats with float group scales, whose products take a float per
/// group anyway, as ggml-cpu's dot products for them take Q8_0/Q8_1 (the K-quants take
/// Q8_K, a scale per 256, as [`act`] is). With one scale per 256 their prompt logits had
/// twice the CPU's error (bench/RESULTS.md, 2026-11-26 14:40).
pub const fn reads_q8_1<F: GemmFormat>() -> bool {
    matches!(F::SCALES, Scales::Float | Scales::FloatMin)
}

/// Whether the GEMM for `ty` reads q8_1 tiles ([`reads_q8_1`]); false for a type with no
/// GEMM.
pub fn reads_q8_1_tiles(ty: GgmlType) -> bool {
    match ty {
        GgmlType::Q8_0 => reads_q8_1::<Q8_0>(),
        GgmlType::Q4_0 => reads_q8_1::<Q4_0>(),
        GgmlType::Q5_0 => reads_q8_1::<Q5_0>(),
        GgmlType::Q4_1 => reads_q8_1::<Q4_1>(),
        GgmlType::Q5_1 => reads_q8_1::<Q5_1>(),
        GgmlType::IQ4_NL => reads_q8_1::<IQ4NL>(),
        GgmlType::IQ4_XS => reads_q8_1::<IQ4XS>(),
        GgmlType::Q4_K => reads_q8_1::<Q4K>(),
        GgmlType::Q5_K => reads_q8_1::<Q5K>(),
        GgmlType::Q6_K => reads_q8_1::<Q6K>(),
        GgmlType::Q3_K => reads_q8_1::<Q3K>(),
        GgmlType::Q2_K => reads_q8_1::<Q2K>(),
        _ => false,
    }
}

/// Bytes of one token's activation row of `k` values in the tiles the GEMM for `ty` reads.
pub fn activation_row_bytes(ty: GgmlType, k: usize) -> Result<usize, KernelError> {
    if reads_q8_1_tiles(ty) {
        crate::act::row_bytes(k)
    } else {
        act::row_bytes(k)
    }
}

/// Bytes of one row's per-tile floats (`d`, `-dmin`).
const ROWF_STRIDE: u32 = 8;

/// Static shared memory of a GEMM block (over the decode kernels' 32 KB carveout: the
/// GEMMs get a carveout of their own, `smelt_cuda`): the most any format declares, that of
/// formats with [`SC_STRIDE_WIDE`] scales (one token scale a tile) or that of q8_1 readers
/// with float minima (sixteen token floats a token).
pub const SHARED_BYTES: usize = {
    let common = BM * A_STRIDE + BN * B_STRIDE + BM * ROWF_STRIDE;
    let wide = common + BM * SC_STRIDE_WIDE + BN * 4;
    let q8_1 = common + BM * SC_STRIDE + BN * 16 * 4;
    (if wide > q8_1 { wide } else { q8_1 }) as usize
};

// Static shared memory is capped at 48 KB a block.
const _: () = assert!(SHARED_BYTES <= 48 * 1024);

/// Fewest tokens for which a matmul takes the GEMM instead of the GEMV (which reads the
/// weights once per eight tokens). A first guess until measured on the card
/// (`SMELT_CUDA_GEMM_MIN` moves it for that measurement).
pub const MIN_TOKENS: usize = 16;

/// How a format's group scales sit in shared memory ([`sc_stride`] bytes a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scales {
    /// Integer scales, one `s32` per group; with `min`, after the scales (8 for 32-weight
    /// groups, 16 for 16-weight groups, whose rows are [`SC_STRIDE_WIDE`] bytes) one `u32`
    /// per group holding the group's minimum in all four bytes. The row's `d` and `-dmin`
    /// go to the per-tile floats.
    Int { min: bool },
    /// One f32 per group (32-weight groups).
    Float,
    /// One f32 `d` per group, then (byte 32) one f32 minimum `m` per group: `w = d q + m`
    /// (32-weight groups).
    FloatMin,
}

/// What a format's staging code works with: the block's rows, the tile, the thread index
/// and where in shared memory the unpacked weights and scales go.
#[derive(Clone, Copy)]
pub struct Stage {
    /// Thread index in the block (0..[`THREADS`]).
    pub tid: Reg<U32>,
    /// Tile index (256 weights) along the rows.
    pub tile: Reg<U32>,
    /// Tiles per row.
    pub ntiles: Reg<U32>,
    /// Shared address of row 0's int8 weights (rows [`A_STRIDE`] bytes apart, weight `i`
    /// of the tile at byte `i`).
    pub aq: Reg<U32>,
    /// Shared address of row 0's group scales ([`Stage::sc_stride`] bytes a row,
    /// [`Scales`]).
    pub asc: Reg<U32>,
    /// Bytes of one row's group scales ([`SC_STRIDE`], or [`SC_STRIDE_WIDE`]).
    pub sc_stride: u32,
    /// Shared address of row 0's per-tile floats (`d`, `-dmin`; [`ROWF_STRIDE`] bytes).
    pub rowf: Reg<U32>,
    rows: Rows,
}

/// The block's rows of W in global memory (both GEMMs').
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub w: Reg<U64>,
    pub row0: Reg<U32>,
    pub last_row: Reg<U32>,
    pub row_bytes: Reg<U32>,
}

impl Rows {
    /// Global address of the block's row `local` (clamped to the last row: rows past the
    /// end are read again and never stored).
    pub fn row(&self, k: &Kernel, local: Reg<U32>) -> Reg<U64> {
        let r = k.add(k.reg(), self.row0, local);
        k.min(r, r, self.last_row);
        k.add(
            k.reg(),
            self.w,
            k.mul_wide(k.reg::<U64>(), r, self.row_bytes),
        )
    }
}

impl Stage {
    /// Global address of the block's row `local` ([`Rows::row`]).
    pub fn row(&self, k: &Kernel, local: Reg<U32>) -> Reg<U64> {
        self.rows.row(k, local)
    }

    /// Shared address of byte `col` of row `local`'s weights.
    pub fn aq_at(&self, k: &Kernel, local: Reg<U32>, col: Reg<U32>) -> Reg<U32> {
        let a = k.mad(k.reg(), local, A_STRIDE, self.aq);
        k.add(a, a, col)
    }

    /// Shared address of row `local`'s group scales.
    pub fn asc_at(&self, k: &Kernel, local: Reg<U32>) -> Reg<U32> {
        k.mad(k.reg(), local, self.sc_stride, self.asc)
    }

    /// Shared address of row `local`'s per-tile floats.
    pub fn rowf_at(&self, k: &Kernel, local: Reg<U32>) -> Reg<U32> {
        k.mad(k.reg(), local, ROWF_STRIDE, self.rowf)
    }
}

/// A weight format the GEMM reads: how a tile of [`BM`] rows becomes int8 weights and
/// group scales in shared memory.
pub trait GemmFormat: GpuFormat {
    /// The kernel's name.
    const GEMM_NAME: &'static str;
    /// Weights per scale group: 32, or 16 for formats with 16-weight scales.
    const GROUP: u32;
    /// How the group scales are kept.
    const SCALES: Scales;
    /// Blocks per SM asked of ptxas on sm_80 (`.minnctapersm`), 0 to leave the register
    /// budget to ptxas: for some formats its occupancy guess (80 registers) spills.
    const SM80_MIN_BLOCKS: u32 = 0;
    /// Stages tile `s.tile` of the block's rows (all [`THREADS`] threads take part).
    fn stage(k: &Kernel, s: &Stage);
}

/// Weight types with a GEMM, and their kernel names.
pub const TYPES: [(GgmlType, &str); 12] = [
    (GgmlType::Q4_K, Q4K::GEMM_NAME),
    (GgmlType::Q5_K, Q5K::GEMM_NAME),
    (GgmlType::Q6_K, Q6K::GEMM_NAME),
    (GgmlType::Q8_0, Q8_0::GEMM_NAME),
    (GgmlType::Q4_0, Q4_0::GEMM_NAME),
    (GgmlType::Q5_0, Q5_0::GEMM_NAME),
    (GgmlType::Q4_1, Q4_1::GEMM_NAME),
    (GgmlType::Q5_1, Q5_1::GEMM_NAME),
    (GgmlType::IQ4_NL, IQ4NL::GEMM_NAME),
    (GgmlType::IQ4_XS, IQ4XS::GEMM_NAME),
    (GgmlType::Q3_K, Q3K::GEMM_NAME),
    (GgmlType::Q2_K, Q2K::GEMM_NAME),
];

/// The GEMM kernel's name for `ty`, if it has one.
pub fn name(ty: GgmlType) -> Option<&'static str> {
    TYPES.iter().find(|(t, _)| *t == ty).map(|(_, n)| *n)
}

/// Every GEMM kernel and the activation quantize kernel, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    vec![
        (act::QUANTIZE.to_string(), Box::new(act::quantize_kernel)),
        (REDUCE.to_string(), Box::new(reduce_kernel)),
        (Q4K::GEMM_NAME.to_string(), Box::new(kernel::<Q4K>)),
        (Q5K::GEMM_NAME.to_string(), Box::new(kernel::<Q5K>)),
        (Q6K::GEMM_NAME.to_string(), Box::new(kernel::<Q6K>)),
        (Q8_0::GEMM_NAME.to_string(), Box::new(kernel::<Q8_0>)),
        (Q4_0::GEMM_NAME.to_string(), Box::new(kernel::<Q4_0>)),
        (Q5_0::GEMM_NAME.to_string(), Box::new(kernel::<Q5_0>)),
        (Q4_1::GEMM_NAME.to_string(), Box::new(kernel::<Q4_1>)),
        (Q5_1::GEMM_NAME.to_string(), Box::new(kernel::<Q5_1>)),
        (IQ4NL::GEMM_NAME.to_string(), Box::new(kernel::<IQ4NL>)),
        (IQ4XS::GEMM_NAME.to_string(), Box::new(kernel::<IQ4XS>)),
        (Q3K::GEMM_NAME.to_string(), Box::new(kernel::<Q3K>)),
        (Q2K::GEMM_NAME.to_string(), Box::new(kernel::<Q2K>)),
    ]
}

/// CPU twin of the GEMM: `y[t][r] = sum_i W[r][i] * x[t][i]` in f64, with `W` dequantized
/// from its ggml bytes by `smelt_quant` and `x` from the tiles the GEMM for `ty` reads
/// ([`act`], or q8_1 for [`reads_q8_1_tiles`]); also each output's
/// `sum_i |W[r][i] * x[t][i]|`, the scale its float rounding error grows with.
pub fn cpu_with_magnitude(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    if reads_q8_1_tiles(ty) {
        // The GEMV's tiles, and so the GEMV's twin.
        return crate::gemv::cpu_with_magnitude(ty, ggml, nrows, k, x, ntok);
    }
    let tiles = crate::gemv::TwinTiles {
        tile_bytes: act::TILE_BYTES,
        dequantize: act::dequantize_tile,
        shift: &|_: &[u8], _: &[u8]| 0.0,
    };
    crate::gemv::dot_twin(ty, ggml, nrows, k, x, ntok, &tiles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn every_gemm_builds_and_fits_static_shared_memory() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k)).unwrap();
            }
            let ptx = m.to_ptx();
            for (_, name) in TYPES {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
            }
        }
    }

    #[test]
    fn float_scale_formats_read_q8_1_tiles_and_k_quants_read_tiles_of_256() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_1,
        ] {
            assert!(reads_q8_1_tiles(ty), "{ty:?}");
            assert_eq!(
                activation_row_bytes(ty, 512).unwrap(),
                crate::act::row_bytes(512).unwrap()
            );
        }
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_XS,
        ] {
            assert!(!reads_q8_1_tiles(ty), "{ty:?}");
            assert_eq!(
                activation_row_bytes(ty, 512).unwrap(),
                act::row_bytes(512).unwrap()
            );
        }
        assert!(reads_q8_1_tiles(GgmlType::Q5_1) && reads_q8_1_tiles(GgmlType::IQ4_NL));
    }

    #[test]
    fn types_have_gemv_layouts() {
        for (ty, name) in TYPES {
            assert!(crate::catalog::row_bytes(ty, 256).is_ok(), "{name}");
            assert_eq!(super::name(ty), Some(name));
        }
        assert_eq!(super::name(GgmlType::Q8_K), None);
    }

    #[test]
    fn the_twin_is_the_dequantized_product() {
        // One Q8_0 row of ones-ish weights against a known activation row.
        let k = 64;
        let w: Vec<f32> = (0..k).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut ggml = vec![0u8; k / 32 * 34];
        smelt_quant::quantize_row(GgmlType::Q8_0, &w, &mut ggml).unwrap();
        let x: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.25 - 1.0).collect();
        // Q8_0's GEMM reads the GEMV's q8_1 tiles.
        assert!(reads_q8_1_tiles(GgmlType::Q8_0));
        let xq = crate::act::quantize_cpu(&x, k).unwrap();
        assert_eq!(xq.len(), activation_row_bytes(GgmlType::Q8_0, k).unwrap());
        let (y, mag) = cpu_with_magnitude(GgmlType::Q8_0, &ggml, 1, k, &xq, 1).unwrap();
        let exact: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        assert!(
            (f64::from(y[0]) - exact).abs() < 0.02 * mag[0],
            "{} vs {exact}",
            y[0]
        );
        assert!(cpu_with_magnitude(GgmlType::Q8_0, &ggml, 2, k, &xq, 1).is_err());
    }
}
