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

pub mod act;
pub mod f16;
mod f16_q6_k;
mod f16_q8_0;
pub mod f16_small;
pub mod fixup;
mod formats;
pub mod grouped;
mod legacy;
mod lowbit;
pub mod members;
pub mod narrow;
mod narrow_q4_k;
mod narrow_q6_k;
mod narrow_q8_0;
#[cfg(test)]
mod staging_model;

use smelt_ptx::{CpAsyncCache, Kernel, Load, Pred, Reg, Store, B32, F32, S32, U32, U64};

use crate::formats::{
    GpuFormat, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::ops::{kernel_params, ArgValue};
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

/// Build-time choices of the GEMM kernel that only speed decides, so `gpu_ops -o
/// gemm_variants` can time each against [`VARIANT`] on the card. (An L2 prefetch of the
/// next tiles was one, and lost 5-15% everywhere on an H100: bench/RESULTS.md, 2026-11-26.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Fragments loaded with `ldmatrix` (one instruction for an m-tile's A fragment, one
    /// for both n-tiles' B) instead of one 32-bit shared load per register.
    pub ldmatrix: bool,
}

/// The variant the catalog builds.
pub const VARIANT: Variant = Variant { ldmatrix: false };

kernel_params! {
    /// The kernel's parameters, declared once for [`kernel`] and packed by [`Args::values`].
    GemmArgs, GemmRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        nrows: U32,
        ntok: U32,
        ntiles: U32,
        row_bytes: U32,
        kslice: U32,
    }
}

/// Splits of the K range (`Args::splits`) for a matrix of `nrows` rows and `ntiles` tiles
/// and `ntok` tokens on a GPU of `sm_count` multiprocessors: enough blocks x splits to fill
/// every SM twice, each split at least four tiles. With `ntok` None the count is that of
/// one token block whatever the batch: it then depends on the matrix and the GPU only, so
/// an output is summed in the same order however many tokens share the launch
/// (`--batch-invariant`); with the token count, large batches skip the split workspace and
/// its reduce (8% of a 512-token prompt's GPU time on an H100).
pub fn splits(nrows: usize, ntiles: usize, ntok: Option<usize>, sm_count: usize) -> usize {
    splits_for_blocks((BM, BN), nrows, ntiles, ntok, sm_count)
}

/// [`splits`] for a GEMM whose blocks are `block.0` rows x `block.1` tokens.
pub fn splits_for_blocks(
    block: (u32, u32),
    nrows: usize,
    ntiles: usize,
    ntok: Option<usize>,
    sm_count: usize,
) -> usize {
    let token_blocks = ntok.map_or(1, |n| n.div_ceil(block.1 as usize).max(1));
    let blocks = nrows.div_ceil(block.0 as usize).max(1) * token_blocks;
    let want = (2 * sm_count).div_ceil(blocks);
    want.clamp(1, (ntiles / 4).max(1))
}

/// One GEMM launch: weights `w` (`nrows` rows of `row_bytes` in the GPU layout), activation
/// tiles `x` ([`act`], `ntok` rows of `ntiles` tiles), output `y` (`ntok x nrows` f32), the
/// K range cut into `splits` slices of `ceil(ntiles / splits)` tiles. With more than one
/// split, `y` is a workspace of `splits` outputs, summed in split order into the real
/// output by the last block of each tile ([`fixup`], with `fixup`) or else by
/// [`reduce_kernel`] ([`Args::reduce`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub nrows: u32,
    pub ntok: u32,
    pub ntiles: u32,
    pub row_bytes: u32,
    pub splits: u32,
    /// The split fix-up's output and counters ([`Args::with_fixup`] sets it only for a
    /// launch with several splits whose grid has a counter per tile).
    pub fixup: Option<fixup::Fixup>,
}

impl Args {
    /// Test fixture: Q4_K rows of `ntiles` tiles, no addresses, four splits.
    #[cfg(test)]
    pub(crate) fn q4_k_for_test(nrows: u32, ntok: u32, ntiles: u32) -> Args {
        Args {
            w: 0,
            x: 0,
            y: 0,
            nrows,
            ntok,
            ntiles,
            row_bytes: ntiles * 144,
            splits: 4,
            fixup: None,
        }
    }

    /// Tiles per split.
    pub fn kslice(&self) -> u32 {
        self.ntiles.div_ceil(self.splits.max(1)).max(1)
    }

    /// Slices of the K range the launch really makes (`grid.2` of every family's launch):
    /// whole slices of [`Args::kslice`] tiles, so at most `splits`.
    pub fn split_count(&self) -> u32 {
        self.ntiles.div_ceil(self.kslice()).max(1)
    }

    /// Whether the launch's last blocks sum its splits ([`fixup`]): a fix-up set and more
    /// than one split. Then there is no reduce launch ([`Args::reduce`] is `None`).
    pub fn fixed_up(&self) -> bool {
        self.fixup.is_some() && self.split_count() > 1
    }

    /// `self` with the split fix-up into `out` on `counters` (`capacity` of them), for a
    /// launch of grid `grid` (the family's launch shape): set only when the launch has
    /// more than one split and a counter for each (token block, row block) of its grid;
    /// else unchanged (the reduce launch sums the splits).
    pub fn with_fixup(
        self,
        grid: (u32, u32, u32),
        out: u64,
        counters: u64,
        capacity: usize,
    ) -> Args {
        let tiles = grid.0 as usize * grid.1 as usize;
        if self.split_count() > 1 && grid.2 == self.split_count() && tiles <= capacity {
            Args {
                fixup: Some(fixup::Fixup { out, counters }),
                ..self
            }
        } else {
            self
        }
    }

    /// The kernel's arguments ([`GemmArgs`], then [`fixup::SplitArgs`]: zeros unless
    /// [`Args::fixed_up`]), in its order.
    pub fn values(&self) -> Vec<ArgValue> {
        let f = self.fixup.filter(|_| self.fixed_up());
        let mut v = GemmArgs {
            w: self.w,
            x: self.x,
            y: self.y,
            nrows: self.nrows,
            ntok: self.ntok,
            ntiles: self.ntiles,
            row_bytes: self.row_bytes,
            kslice: self.kslice(),
        }
        .values();
        v.extend(
            fixup::SplitArgs {
                out: f.map_or(0, |f| f.out),
                counters: f.map_or(0, |f| f.counters),
            }
            .values(),
        );
        v
    }

    /// Grid (token blocks fastest, so the blocks that share rows run together and read the
    /// weights from L2; splits last) and block size.
    pub fn launch(&self) -> crate::ops::Launch {
        crate::ops::Launch::new(
            (
                self.ntok.div_ceil(BN).max(1),
                self.nrows.div_ceil(BM).max(1),
                self.split_count(),
            ),
            (THREADS, 1, 1),
        )
    }

    /// Floats of the split workspace (0 with one split: the GEMM writes `y` itself).
    pub fn workspace_floats(&self) -> usize {
        let splits = self.split_count() as usize;
        if splits > 1 {
            splits * self.ntok as usize * self.nrows as usize
        } else {
            0
        }
    }

    /// The reduce launch that sums the workspace `y` into `out`, if there is more than one
    /// split and the GEMM's last blocks do not sum them ([`Args::fixed_up`]): its
    /// arguments and launch shape.
    pub fn reduce(&self, out: u64) -> Option<(ReduceArgs, crate::ops::Launch)> {
        let splits = self.split_count();
        if splits <= 1 || self.fixed_up() {
            return None;
        }
        let n = self.ntok * self.nrows;
        Some((
            ReduceArgs {
                part: self.y,
                y: out,
                n,
                splits,
            },
            crate::ops::Launch::new(
                (n.div_ceil(REDUCE_THREADS).max(1), 1, 1),
                (REDUCE_THREADS, 1, 1),
            ),
        ))
    }
}

/// Name of the split reduce kernel.
pub const REDUCE: &str = "gemm_reduce";
kernel_params! {
    /// Arguments of [`reduce_kernel`].
    ReduceArgs, ReduceRegs {
        part: Ptr,
        y: Ptr,
        n: U32,
        splits: U32,
    }
}
/// Threads per block of [`reduce_kernel`].
pub const REDUCE_THREADS: u32 = 256;

/// `y[i] = sum_z part[z][i]` for `i < n`, `z = 0..splits` in order (a fixed summation
/// order, so the result is the same for any batch). Parameters [`ReduceArgs`].
pub fn reduce_kernel(k: &Kernel) {
    let ReduceRegs { part, y, n, splits } = ReduceRegs::declare(k);
    let i = k.global_id_x();
    k.grid_dep_wait();
    k.exit_if(k.ge(i, n));
    let sum = sum_splits(k, part, i, n, splits);
    k.st(Store::GLOBAL, k.elem_addr(y, i, 4), sum);
}

/// `sum_z part[z][i]` over `z = 0..splits` in order, slices of `n` floats: the split
/// reduces' sum ([`reduce_kernel`], [`members::reduce_kernel`]).
pub(crate) fn sum_splits(
    k: &Kernel,
    part: Reg<U64>,
    i: Reg<U32>,
    n: Reg<U32>,
    splits: Reg<U32>,
) -> Reg<F32> {
    let at = k.elem_addr(part, i, 4);
    let stride = k.mul_wide(k.reg::<U64>(), n, 4u32);
    let sum = k.ld(Load::GLOBAL, k.reg::<F32>(), at);
    k.for_count(k.sub(k.reg(), splits, 1u32), |k, _| {
        k.add(at, at, stride);
        let v = k.ld(Load::GLOBAL, k.reg::<F32>(), at);
        k.add(sum, sum, v);
    });
    sum
}

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

/// `y = W x` for `ntok` tokens: see the module doc. Parameters [`GemmArgs`]; launch
/// [`Args::launch`].
pub fn kernel<F: GemmFormat>(k: &Kernel) {
    kernel_variant::<F>(k, VARIANT)
}

/// [`kernel`] built as variant `v`.
pub fn kernel_variant<F: GemmFormat>(k: &Kernel, v: Variant) {
    k.max_threads(THREADS, 1, 1);
    // Two blocks per SM (at most 128 registers a thread): one block's staging overlaps the
    // other's tensor-core work. sm_80's ptxas spills at 128 (16-40 bytes), so there the
    // register budget is its own.
    if matches!(
        k.target(),
        smelt_ptx::Target::Sm90 | smelt_ptx::Target::Sm90a
    ) {
        k.min_blocks_per_sm(2);
    } else if F::SM80_MIN_BLOCKS > 0 {
        k.min_blocks_per_sm(F::SM80_MIN_BLOCKS);
    }
    let GemmRegs {
        w,
        x,
        y,
        nrows,
        ntok,
        ntiles,
        row_bytes,
        kslice,
    } = GemmRegs::declare(k);
    let aq_s = k.shared::<U32>("gemm_aq", BM * A_STRIDE / 4, 16);
    let bq_s = k.shared::<U32>("gemm_bq", BN * B_STRIDE / 4, 16);
    let sc_stride = sc_stride::<F>();
    let asc_s = k.shared::<U32>("gemm_asc", BM * sc_stride / 4, 16);
    let rowf_s = k.shared::<F32>("gemm_rowf", BM * ROWF_STRIDE / 4, 16);
    // Token scales: one a tile, or with q8_1 tiles eight `d` (and, with float minima,
    // eight `s` after them) a token.
    let q8_1 = reads_q8_1::<F>();
    let per_token = if !q8_1 {
        1
    } else if F::SCALES == Scales::FloatMin {
        16
    } else {
        8
    };
    let bd_s = k.shared::<F32>("gemm_bd", BN * per_token, 16);
    let aq = k.shared_base(&aq_s);
    let bq = k.shared_base(&bq_s);
    let asc = k.shared_base(&asc_s);
    let rowf = k.shared_base(&rowf_s);
    let bd = k.shared_base(&bd_s);

    let tid = k.tid_x();
    let tok0 = k.mul(k.reg(), k.ctaid_x(), BN);
    let row0 = k.mul(k.reg(), k.ctaid_y(), BM);
    let last_row = k.sub(k.reg(), nrows, 1u32);
    let last_tok = k.sub(k.reg(), ntok, 1u32);
    let tile_bytes_x = if q8_1 {
        crate::act::TILE_BYTES
    } else {
        act::TILE_BYTES
    } as u32;
    let tok_stride = k.mul(k.reg(), ntiles, tile_bytes_x);
    // The address of token `tok0 + local` (clamped: tokens past the end are read again and
    // never stored).
    let token = |local: Reg<U32>| {
        let t = k.add(k.reg(), tok0, local);
        k.min(t, t, last_tok);
        k.add(k.reg(), x, k.mul_wide(k.reg::<U64>(), t, tok_stride))
    };
    // Token quants: thread copies 16-byte chunk `tid % 16` of tokens `tid / 16 + 16 i`.
    let bch = k.and(k.reg(), tid, 15u32);
    let bt0 = k.shr(k.reg(), tid, 4u32);
    let bsrc: Vec<Reg<U64>> = (0..BN / 16)
        .map(|i| {
            let src = token(k.add(k.reg(), bt0, 16 * i));
            k.add(src, src, k.mul_wide(k.reg::<U64>(), bch, 16u32))
        })
        .collect();
    // Tokens past the end are not copied (their outputs are never stored): every block
    // reading the last token for them made one L2 line a hot spot, which cost batches
    // under 64 tokens half their speed.
    let bvalid: Vec<Reg<Pred>> = (0..BN / 16)
        .map(|i| {
            let t = k.add(k.reg(), tok0, bt0);
            k.add(t, t, 16 * i);
            k.lt(t, ntok)
        })
        .collect();
    let bdst = k.mad(k.reg(), bt0, B_STRIDE, bq);
    k.mad(bdst, bch, 16u32, bdst);
    // Token scales: thread `tid < BN` loads token `tid`'s (0 past the end).
    // With q8_1 tiles: thread `tid < BN` loads token `tid`'s eight f16 `d`, and with float
    // minima thread `BN + i` token `i`'s eight f16 `s`, as f32 into `bd[token][0..8]`
    // (`[8..16]`).
    let scale_threads = if F::SCALES == Scales::FloatMin && q8_1 {
        2 * BN
    } else {
        BN
    };
    let scale_thread = k.lt(tid, scale_threads);
    let stok = k.and(k.reg(), tid, BN - 1);
    let scale_valid = {
        let t = k.add(k.reg(), tok0, stok);
        k.lt(t, ntok)
    };
    let ssrc = token(stok);
    let sdst = k.mad(k.reg(), stok, 4 * per_token, bd);
    if q8_1 {
        // The upper threads take `s`, 16 bytes further in the tile and 32 in shared.
        let upper = k.shr(k.reg(), tid, BN.trailing_zeros());
        let off = k.mad(
            k.reg(),
            upper,
            (crate::act::S_OFFSET - crate::act::D_OFFSET) as u32,
            crate::act::D_OFFSET as u32,
        );
        k.add(ssrc, ssrc, k.cvt(k.reg::<U64>(), off, smelt_ptx::Exact));
        k.mad(sdst, upper, 32u32, sdst);
    } else {
        k.add(ssrc, ssrc, act::D_OFFSET as u64);
    }

    // Warp geometry: warp (wm, wn) computes rows 32 wm.. and tokens 16 wn..; lane (g, t).
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane = k.and(k.reg(), tid, 31u32);
    let g = k.shr(k.reg(), lane, 2u32);
    let t = k.and(k.reg(), lane, 3u32);
    let wm = k.and(k.reg(), warp, 1u32);
    let wn = k.shr(k.reg(), warp, 1u32);
    let arow = k.mad(k.reg(), wm, 32u32, g);
    let btok = k.mad(k.reg(), wn, 16u32, g);
    // `ldmatrix` rows: lane `8 m + r` gives row `r` of matrix `m`. A: matrices (rows 0-7,
    // bytes 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31) are a0..a3. B with 32-weight
    // groups: (tokens 0-7, bytes 0-15), (0-7, 16-31) for n-tile 0, then n-tile 1's; with
    // 16-weight groups (x2): tokens 0-7, then 8-15.
    let lm = v.ldmatrix.then(|| {
        let r = k.and(k.reg(), lane, 7u32);
        let lo = k.bfe(k.reg(), lane, 3u32, 1u32);
        let hi = k.shr(k.reg(), lane, 4u32);
        let row = k.mad(k.reg(), wm, 32u32, r);
        k.mad(row, lo, 8u32, row);
        let a = k.mad(k.reg(), row, A_STRIDE, aq);
        k.mad(a, hi, 16u32, a);
        let (tile8, kbyte) = if F::GROUP == 32 {
            (hi, lo)
        } else {
            (lo, k.u32(0))
        };
        let tok = k.mad(k.reg(), wn, 16u32, r);
        k.mad(tok, tile8, 8u32, tok);
        let b = k.mad(k.reg(), tok, B_STRIDE, bq);
        k.mad(b, kbyte, 16u32, b);
        (a, b)
    });
    let frags = Frags {
        a: {
            let a = k.mad(k.reg(), arow, A_STRIDE, aq);
            k.mad(a, t, 4u32, a)
        },
        b: {
            let b = k.mad(k.reg(), btok, B_STRIDE, bq);
            k.mad(b, t, 4u32, b)
        },
        asc: k.mad(k.reg(), arow, sc_stride, asc),
        rowf: k.mad(k.reg(), arow, ROWF_STRIDE, rowf),
        lm,
        per_token,
        // Tokens 2t, 2t + 1 of each n-tile are the thread's accumulator columns.
        bd: {
            let c = k.mad(k.reg(), wn, 16u32, k.shl(k.reg(), t, 1u32));
            k.mad(c, c, 4 * per_token, bd)
        },
    };
    let ctok = k.mad(k.reg(), wn, 16u32, k.shl(k.reg(), t, 1u32));

    let stage = Stage {
        tid,
        tile: k.u32(0),
        ntiles,
        aq,
        asc,
        sc_stride,
        rowf,
        rows: Rows {
            w,
            row0,
            last_row,
            row_bytes,
        },
    };
    let acc: Acc<F32> =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));

    let (first, end, y) = split_range(k, y, nrows, ntok, ntiles, kslice);

    k.grid_dep_wait();
    k.stride_loop(first, end, 1u32, |k, tile| {
        let stage = Stage { tile, ..stage };
        // Every warp is done with the previous tile's shared memory.
        k.bar_sync();
        let toff = k.mul_wide(k.reg::<U64>(), tile, tile_bytes_x);
        for (i, &src) in bsrc.iter().enumerate() {
            let src = k.add(k.reg(), src, toff);
            k.guarded(bvalid[i], |k| {
                k.cp_async(
                    CpAsyncCache::Cg,
                    bdst.at(i as i64 * 16 * B_STRIDE as i64),
                    src,
                    16,
                );
            });
        }
        let dsrc = k.add(k.reg(), ssrc, toff);
        if q8_1 {
            let h: [Reg<U32>; 4] = std::array::from_fn(|_| k.u32(0));
            k.guarded(scale_valid, |k| {
                k.ld_v4(Load::GLOBAL_NC, h, dsrc);
            });
            let f: Vec<Reg<F32>> = h
                .iter()
                .flat_map(|&w| crate::formats::halves_to_f32(k, w))
                .collect();
            k.guarded(scale_thread, |k| {
                k.st_v4(Store::SHARED, sdst, [f[0], f[1], f[2], f[3]]);
                k.st_v4(Store::SHARED, sdst.at(16), [f[4], f[5], f[6], f[7]]);
            });
        } else {
            let dval = k.f32(0.0);
            k.guarded(scale_valid, |k| {
                k.ld(Load::GLOBAL_NC, dval, dsrc);
            });
            k.guarded(scale_thread, |k| {
                k.st(Store::SHARED, sdst, dval);
            });
        }
        F::stage(k, &stage);
        // One group for the token quants and any weight copies the format issued.
        k.cp_async_commit();
        k.cp_async_wait(0);
        k.bar_sync();
        compute_tile::<F>(k, &frags, &acc);
    });

    fixup::store_split_outputs(
        k,
        &acc,
        Out {
            y,
            row: k.add(k.reg(), row0, arow),
            tok: k.add(k.reg(), tok0, ctok),
            nrows,
            ntok,
            slots: None,
        },
    );
}

/// This block's split of the K range: tiles `[first, end)`, and `y` moved to split z of
/// the workspace (both GEMMs).
pub(super) fn split_range(
    k: &Kernel,
    y: Reg<U64>,
    nrows: Reg<U32>,
    ntok: Reg<U32>,
    ntiles: Reg<U32>,
    kslice: Reg<U32>,
) -> (Reg<U32>, Reg<U32>, Reg<U64>) {
    let z = k.special(smelt_ptx::Special::Ctaid(smelt_ptx::Dim::Z));
    let first = k.mul(k.reg(), z, kslice);
    let end = k.add(k.reg(), first, kslice);
    k.min(end, end, ntiles);
    let zoff = k.mul(k.reg(), ntok, nrows);
    k.mul(zoff, zoff, z);
    (
        first,
        end,
        k.add(k.reg(), y, k.mul_wide(k.reg::<U64>(), zoff, 4u32)),
    )
}

/// Where a warp's outputs go: `y` (`ntok x nrows` f32), and the thread's first row
/// (`row0 + arow`) and first token (`tok0 + ctok`).
pub(super) struct Out {
    pub y: Reg<U64>,
    pub row: Reg<U32>,
    pub tok: Reg<U32>,
    pub nrows: Reg<U32>,
    pub ntok: Reg<U32>,
    /// Gathered tokens (the grouped GEMM, [`grouped`]): token `t`'s outputs go to row
    /// `slots[t]` (a `u32` at `slots + 4 t`) of `y` instead of row `t`.
    pub slots: Option<Reg<U64>>,
}

/// Stores a warp's accumulators, those inside the matrix: accumulator e of (mi, ni) is row
/// `row + 16 mi + 8 (e / 2)`, token `tok + 8 ni + e % 2` (the `mma` C layout).
pub(super) fn store_outputs<const NI: usize>(k: &Kernel, acc: &[[[Reg<F32>; 4]; NI]], o: Out) {
    let Out {
        y,
        row: row_t,
        tok: tok_t,
        nrows,
        ntok,
        slots,
    } = o;
    // Accumulator e of (mi, ni), row `row` (`row_ok`: inside the matrix), to token `tok`'s
    // output row `out_row`.
    let store = |row: Reg<U32>, row_ok, c: Reg<F32>, tok: Reg<U32>, out_row: Reg<U32>| {
        let ok = k.reg::<Pred>();
        k.raw(format!("setp.lt.and.u32 {ok}, {tok}, {ntok}, {row_ok}"));
        let idx = k.mad(k.reg(), out_row, nrows, row);
        let at = k.elem_addr(y, idx, 4);
        k.guarded(ok, |k| {
            k.st(Store::GLOBAL, at, c);
        });
    };
    let row_of = |mi: usize, h: u32| {
        let row = k.add(k.reg(), row_t, 16 * mi as u32 + 8 * h);
        (row, k.lt(row, nrows))
    };
    match slots {
        // Gathered tokens: token by token, its output row read just before its stores
        // (every token of a block has a slot word, used or not, so the read stays inside
        // the tile), so no more than one is held beside the accumulators.
        Some(s) => {
            for ni in 0..NI {
                for j in 0..2u32 {
                    let tok = k.add(k.reg(), tok_t, 8 * ni as u32 + j);
                    let out_row = k.load::<U32>(Load::GLOBAL, k.elem_addr(s, tok, 4));
                    for (mi, per_n) in acc.iter().enumerate() {
                        for h in 0..2u32 {
                            let (row, row_ok) = row_of(mi, h);
                            store(row, row_ok, per_n[ni][(2 * h + j) as usize], tok, out_row);
                        }
                    }
                }
            }
        }
        None => {
            for (mi, per_n) in acc.iter().enumerate() {
                for h in 0..2u32 {
                    let (row, row_ok) = row_of(mi, h);
                    for (ni, c) in per_n.iter().enumerate() {
                        for j in 0..2u32 {
                            let tok = k.add(k.reg(), tok_t, 8 * ni as u32 + j);
                            store(row, row_ok, c[(2 * h + j) as usize], tok, tok);
                        }
                    }
                }
            }
        }
    }
}

/// A warp's accumulators: 2 m-tiles x 2 n-tiles x 4 values.
pub(super) type Acc<T> = [[[Reg<T>; 4]; 2]; 2];

/// A thread's shared-memory addresses for one warp tile.
struct Frags {
    /// Its A fragment bytes (row `g`, byte `4t`) of m-tile 0.
    a: Reg<U32>,
    /// Its B fragment bytes (token `g`, byte `4t`) of n-tile 0.
    b: Reg<U32>,
    /// With [`Variant::ldmatrix`], its `ldmatrix` row addresses: m-tile 0's A fragment,
    /// and both n-tiles' B fragments.
    lm: Option<(Reg<U32>, Reg<U32>)>,
    /// Group scales of its row `g` of m-tile 0.
    asc: Reg<U32>,
    /// Per-tile floats of its row `g` of m-tile 0.
    rowf: Reg<U32>,
    /// Floats of token scales a token keeps in shared memory (1, 8 or 16).
    per_token: u32,
    /// Scale of its token `2t` of n-tile 0 (with q8_1 tiles: its eight group scales, then
    /// with float minima its eight `s`; tokens `4 per_token` bytes apart).
    bd: Reg<U32>,
}

/// The dot products of one staged tile into `acc` (see the module doc).
fn compute_tile<F: GemmFormat>(k: &Kernel, fr: &Frags, acc: &Acc<F32>) {
    let zero: [Reg<S32>; 4] = std::array::from_fn(|_| k.s32(0));
    let isum: Acc<S32> =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.s32(0))));
    let msum: Acc<S32> =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.s32(0))));
    let fsum: Acc<F32> =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));
    let lds = |at: smelt_ptx::Addr| k.ld(Load::SHARED, k.reg::<B32>(), at);
    // Row offsets of rows g and g + 8 of each m-tile, in units of a row stride.
    let rows = |mi: usize, h: usize| (16 * mi + 8 * h) as i64;
    let groups = TILE as u32 / F::GROUP;
    for grp in 0..groups {
        let kb = i64::from(grp * F::GROUP);
        let a: Vec<Vec<Reg<B32>>> = (0..2)
            .map(|mi| {
                if let Some((a_lm, _)) = fr.lm {
                    let at = a_lm.at(rows(mi, 0) * A_STRIDE as i64 + kb);
                    return if F::GROUP == 32 {
                        let r = k.regs::<B32, 4>();
                        k.ldmatrix(r, at, false);
                        r.to_vec()
                    } else {
                        let r = k.regs::<B32, 2>();
                        k.ldmatrix(r, at, false);
                        r.to_vec()
                    };
                }
                let at = |h: usize, off: i64| fr.a.at(rows(mi, h) * A_STRIDE as i64 + kb + off);
                let mut v = vec![lds(at(0, 0)), lds(at(1, 0))];
                if F::GROUP == 32 {
                    v.push(lds(at(0, 16)));
                    v.push(lds(at(1, 16)));
                }
                v
            })
            .collect();
        let b: Vec<Vec<Reg<B32>>> = if let Some((_, b_lm)) = fr.lm {
            if F::GROUP == 32 {
                let r = k.regs::<B32, 4>();
                k.ldmatrix(r, b_lm.at(kb), false);
                vec![vec![r[0], r[1]], vec![r[2], r[3]]]
            } else {
                let r = k.regs::<B32, 2>();
                k.ldmatrix(r, b_lm.at(kb), false);
                vec![vec![r[0]], vec![r[1]]]
            }
        } else {
            (0..2i64)
                .map(|ni| {
                    let base = ni * 8 * B_STRIDE as i64 + kb;
                    let mut v = vec![lds(fr.b.at(base))];
                    if F::GROUP == 32 {
                        v.push(lds(fr.b.at(base + 16)));
                    }
                    v
                })
                .collect()
        };
        let sc_stride = i64::from(sc_stride::<F>());
        let sc_at = |mi: usize, h: usize, off: i64| {
            fr.asc
                .at(rows(mi, h) * sc_stride + off + 4 * i64::from(grp))
        };
        // The minima follow the scales: 4 bytes for each of the tile's groups.
        let min_off = 4 * i64::from(groups);
        // Float minima: each token's quant sum over the group (an all-ones A operand; every
        // row of the result is the same, so elements 0 and 1 are the n-tile's two tokens).
        // Float group scales read q8_1 tiles ([`reads_q8_1`]): the group's scale `d` of
        // each of the thread's tokens (2t, 2t + 1 of each n-tile), and with float minima
        // its `s = d * sum(q)`.
        let per_token = i64::from(fr.per_token);
        let token_f = |ni: usize, j: usize, off: i64| {
            k.ld(
                Load::SHARED,
                k.reg::<F32>(),
                fr.bd
                    .at(4 * per_token * (8 * ni + j) as i64 + off + 4 * i64::from(grp)),
            )
        };
        let float = matches!(F::SCALES, Scales::Float | Scales::FloatMin);
        let dtok_g: Vec<[Reg<F32>; 2]> = if float {
            (0..2)
                .map(|ni| std::array::from_fn(|j| token_f(ni, j, 0)))
                .collect()
        } else {
            Vec::new()
        };
        let stok_g: Vec<[Reg<F32>; 2]> = if F::SCALES == Scales::FloatMin {
            (0..2)
                .map(|ni| std::array::from_fn(|j| token_f(ni, j, 32)))
                .collect()
        } else {
            Vec::new()
        };
        for mi in 0..2 {
            let sc: [Reg<B32>; 2] = std::array::from_fn(|h| lds(sc_at(mi, h, 0)));
            let mins = match F::SCALES {
                Scales::Int { min: true } | Scales::FloatMin => {
                    Some([lds(sc_at(mi, 0, min_off)), lds(sc_at(mi, 1, min_off))])
                }
                _ => None,
            };
            for ni in 0..2 {
                let c = k.regs::<S32, 4>();
                if F::GROUP == 32 {
                    k.mma_m16n8k32_s8(
                        c,
                        [a[mi][0], a[mi][1], a[mi][2], a[mi][3]],
                        [b[ni][0], b[ni][1]],
                        zero,
                    );
                } else {
                    k.mma_m16n8k16_s8(c, [a[mi][0], a[mi][1]], b[ni][0], zero);
                }
                for e in 0..4 {
                    match F::SCALES {
                        Scales::Int { .. } => {
                            let s = isum[mi][ni][e];
                            k.mad(s, c[e], sc[e / 2].cast::<S32>(), s);
                        }
                        Scales::Float | Scales::FloatMin => {
                            let f = fsum[mi][ni][e];
                            let cf = k.cvt(k.reg::<F32>(), c[e], smelt_ptx::FloatRound::Rn);
                            k.mul(cf, cf, dtok_g[ni][e % 2]);
                            k.fma(f, cf, sc[e / 2].cast::<F32>(), f);
                            if let (Scales::FloatMin, Some(m)) = (F::SCALES, mins) {
                                k.fma(f, stok_g[ni][e % 2], m[e / 2].cast::<F32>(), f);
                            }
                        }
                    }
                }
                if let (Scales::Int { min: true }, Some([m0, m1])) = (F::SCALES, mins) {
                    let m = msum[mi][ni];
                    if F::GROUP == 32 {
                        k.mma_m16n8k32_s8(m, [m0, m1, m0, m1], [b[ni][0], b[ni][1]], m);
                    } else {
                        k.mma_m16n8k16_s8(m, [m0, m1], b[ni][0], m);
                    }
                }
            }
        }
    }
    // Once per tile: acc += D_t * (d_r * I + (-dmin_r) * M), or with float group scales
    // (token scales already applied per group) acc += T.
    if matches!(F::SCALES, Scales::Float | Scales::FloatMin) {
        for (a, f) in acc
            .iter()
            .flatten()
            .flatten()
            .zip(fsum.iter().flatten().flatten())
        {
            k.add(*a, *a, *f);
        }
        return;
    }
    let dtok: [[Reg<F32>; 2]; 2] = std::array::from_fn(|ni| {
        std::array::from_fn(|j| {
            k.ld(
                Load::SHARED,
                k.reg::<F32>(),
                fr.bd.at(4 * (8 * ni + j) as i64),
            )
        })
    });
    for mi in 0..2 {
        let rf: [[Reg<F32>; 2]; 2] = std::array::from_fn(|h| {
            let v = k.regs::<F32, 2>();
            k.ld_v2(
                Load::SHARED,
                v,
                fr.rowf.at(rows(mi, h) * ROWF_STRIDE as i64),
            );
            v
        });
        for ni in 0..2 {
            for e in 0..4 {
                let (h, j) = (e / 2, e % 2);
                let tsum = k.cvt(k.reg::<F32>(), isum[mi][ni][e], smelt_ptx::FloatRound::Rn);
                k.mul(tsum, tsum, rf[h][0]);
                if F::SCALES == (Scales::Int { min: true }) {
                    let m = k.cvt(k.reg::<F32>(), msum[mi][ni][e], smelt_ptx::FloatRound::Rn);
                    k.fma(tsum, m, rf[h][1], tsum);
                }
                let a = acc[mi][ni][e];
                k.fma(a, tsum, dtok[ni][j], a);
            }
        }
    }
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
    fn launch_covers_ragged_shapes() {
        let a = Args {
            w: 0,
            x: 0,
            y: 0,
            nrows: 65,
            ntok: 3,
            ntiles: 1,
            row_bytes: 144,
            splits: 1,
            fixup: None,
        };
        let l = a.launch();
        assert_eq!(l.grid, (1, 2, 1));
        assert_eq!(l.block, (THREADS, 1, 1));
        assert_eq!(
            a.values().len(),
            GemmArgs::NAMES.len() + fixup::SplitArgs::NAMES.len()
        );
        assert_eq!(a.workspace_floats(), 0);
        assert!(a.reduce(0).is_none());
        // 56 tiles in 5 splits: 12 tiles each, the last 8; a workspace of 5 outputs.
        let b = Args {
            ntiles: 56,
            splits: 5,
            ..a
        };
        assert_eq!(b.kslice(), 12);
        assert_eq!(b.launch().grid.2, 5);
        assert_eq!(b.workspace_floats(), 5 * 3 * 65);
        let (vals, l) = b.reduce(7).unwrap();
        assert_eq!(vals.splits, 5);
        assert_eq!(l.grid.0, 1);
        // 16 tiles in 5 asked splits: 4 tiles each, so 4 splits.
        let c = Args {
            ntiles: 16,
            splits: 5,
            ..a
        };
        assert_eq!(c.launch().grid.2, 4);
    }

    #[test]
    fn the_fixup_replaces_the_reduce_only_for_split_launches_that_have_counters() {
        let a = Args {
            y: 0x1000,
            ntiles: 56,
            splits: 5,
            ..Args::q4_k_for_test(4096, 32, 56)
        };
        let l = a.launch();
        assert_eq!(l.grid, (1, 64, 5));
        // Unset: the kernel gets zeros for the fix-up and the reduce follows.
        let zeros = |a: &Args| a.values()[GemmArgs::NAMES.len()..].to_vec();
        assert_eq!(zeros(&a), vec![ArgValue::Ptr(0), ArgValue::Ptr(0)]);
        assert!(a.reduce(0x2000).is_some() && !a.fixed_up());
        // Set: the output and counters follow the GEMM's arguments, no reduce.
        let f = a.with_fixup(l.grid, 0x2000, 0x3000, 64);
        assert!(f.fixed_up());
        assert_eq!(
            zeros(&f),
            vec![ArgValue::Ptr(0x2000), ArgValue::Ptr(0x3000)]
        );
        assert!(f.reduce(0x2000).is_none());
        assert_eq!(
            f.values()[..GemmArgs::NAMES.len()],
            a.values()[..GemmArgs::NAMES.len()]
        );
        // The workspace is the same: the partials still go there.
        assert_eq!(f.workspace_floats(), a.workspace_floats());
        // Too few counters for the grid (64 tiles), or a grid of other splits: the reduce.
        assert_eq!(a.with_fixup(l.grid, 0x2000, 0x3000, 63), a);
        assert_eq!(a.with_fixup((1, 64, 4), 0x2000, 0x3000, 64), a);
        // One split: nothing to sum, the GEMM writes the output itself.
        let one = Args { splits: 1, ..a };
        assert_eq!(one.with_fixup(one.launch().grid, 0x2000, 0x3000, 64), one);
        assert!(one.reduce(0x2000).is_none());
        // A fix-up set on a one-split launch passes zeros (nothing to sum).
        let forced = Args {
            fixup: f.fixup,
            ..one
        };
        assert!(!forced.fixed_up());
        assert_eq!(zeros(&forced), vec![ArgValue::Ptr(0), ArgValue::Ptr(0)]);
        // Every family's grid has the same split count.
        assert_eq!(
            narrow::launch(GgmlType::Q4_K, &a, narrow::Layout::Rows16)
                .grid
                .2,
            a.split_count()
        );
        assert_eq!(f16_small::launch(&a).grid.2, a.split_count());
        assert_eq!(f16::launch(&a).grid.2, a.split_count());
    }

    #[test]
    fn splits_fill_the_gpu_from_the_shape_alone() {
        // H100: 132 SMs. 4096 rows (64 blocks) x 56 tiles: 5 splits of >= 4 tiles.
        assert_eq!(splits(4096, 56, None, 132), 5);
        assert_eq!(splits(4096, 16, None, 132), 4);
        assert_eq!(splits(14336, 16, None, 132), 2);
        assert_eq!(splits(128256, 16, None, 132), 1);
        assert_eq!(splits(64, 2, None, 132), 1);
        // By token count: one block of 64 tokens as None; 512 tokens fill the GPU unsplit.
        assert_eq!(splits(4096, 56, Some(64), 132), 5);
        assert_eq!(splits(4096, 56, Some(512), 132), 1);
        assert_eq!(splits(4096, 56, Some(128), 132), 3);
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
