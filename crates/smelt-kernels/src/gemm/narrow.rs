//! The GEMM for batches of a few dozen tokens (batched decode): weights stream through a
//! shared-memory ring of packed tiles by `cp.async` and go from there straight into `mma`
//! fragments in registers, never unpacked into shared memory.
//!
//! At 16-64 tokens the staged GEMMs ([`super`], [`super::f16`], [`super::f16_small`]) are
//! bound by their shared-memory pipe (Nsight Compute, bench/RESULTS.md 2026-11-27: 65-84%
//! busy, 9-23% of DRAM bandwidth): every weight is loaded, unpacked, stored to shared
//! memory and read back as a fragment, ~6 bytes of shared-memory traffic a weight, which
//! only pays when 128 tokens share it. Here each thread reads exactly the bytes of its
//! own `mma.m16n8k16` A fragments and dequantizes them in registers, as Marlin does for
//! int4 weights, so a weight costs about two instructions and ~1.1 bytes of shared-memory
//! traffic (its packed byte copied in and read once); the activations (32 tokens x 128
//! weights, 8 KB a half tile) are read from shared memory by the block's warps: ~1 byte
//! of shared-memory traffic a weight.
//!
//! **Why a ring of packed weights.** The first version loaded each thread's weights from
//! global memory into registers, the next tile's while this one was multiplied: 255
//! registers a thread, 8 warps an SM, one tile (5 KB a warp) in flight, and Nsight Compute
//! found it waiting on those loads (long scoreboard 40% of stalls, DRAM 29% busy, H100
//! 2026-11-27). `cp.async` copies hold no registers, so all but one of the ring's tiles (of the
//! block: 18 KB of weights each) are in flight while one is multiplied, and a thread
//! keeps one tile's weights in registers (read from shared memory just before use).
//!
//! **Which weights a thread holds.** In a warp, lane `(g, c)` (`g = lane / 4`, `c = lane %
//! 4`) takes, of each 144-byte Q4_K super-block of its rows (`g`, `g + 8`, `g + 16`,
//! `g + 24` of the warp's 32, or the first two of 16), the 16-byte header and quant bytes
//! `32 c..32 c + 32`: the weights `64 c + l` (low nibbles, sub-block `2 c`) and `64 c + 32
//! + l` (high, `2 c + 1`) for `l < 32`, exactly the Q4_K GEMV's share
//! ([`crate::formats::q4_k`]). A tile is then two halves `h` (low and high nibbles) of
//! eight `k16` steps; in step `(h, t)` the four lanes of a row give the `mma` its 16 K
//! positions as lane `c`'s weights `64 c + 32 h + 4 t + 0..4`. The `mma` does not care
//! which physical K a logical K is, only that A and B agree: the activation rows of
//! [`super::f16::act_kernel`] (values `0, 2, 1, 3` of every four) put exactly the matching
//! values in lane `(g, c)`'s two B registers, 8 bytes at the same offset.
//!
//! **The ring.** A slot is one tile: the block's 128 rows' super-blocks as they lie in
//! global memory (144 bytes a row: lane `(g, c)`'s 16-byte reads of a quarter warp, rows
//! `g` and `g + 1` 36 words apart, fall in 32 different banks), then the tile's two
//! activation halves for the block's tokens: per token the four 64-byte chunks `128 c +
//! 64 h..` of its tile row (chunk `c` at `64 c + 16 (c / 2)` of a 288-byte slot, so that
//! the 16-byte reads of a quarter warp fall in 32 different banks). `R` slots rotate
//! ([`RING`], or two in [`Layout::Rows16Pair`]), one `cp.async` group and one barrier a
//! tile: tile `s + R - 1` is copied while tile `s` is multiplied. The ring is dynamic
//! shared memory ([`dynamic_bytes`]: 108 KB at 32 tokens, two blocks an SM on sm_90).
//!
//! **Shape.** A block owns [`BM`] rows x `8 NI` tokens: four warps of 32 rows (two `m16`
//! tiles, so each B fragment feeds two `mma`s) or eight of 16 ([`Layout`]), each over the
//! block's whole K slice. Split K and its reduce are the other GEMMs' ([`super::Args`]
//! with [`splits`]).
//!
//! CPU twin: [`super::f16::cpu_with_magnitude`] (the weights are the f16 GEMM's to the
//! bit: the same `q * A + B` with `A`, `B` rounded to halves; only the f32 summation
//! order differs).

use smelt_ptx::{CpAsyncCache, Kernel, Load, MmaFloat, Reg, B32, U32, U64};

use super::{split_range, GemmRegs, Out, Rows};
use crate::formats::{Q4K, Q6K, Q8_0};
use crate::ops::Launch;
use crate::{GgmlType, TILE};

/// Rows of W per block (whatever the warp layout).
pub const BM: u32 = 128;
/// Blocks an SM a kernel in `layout` is built for (ptxas's register cap on sm_90: 255
/// registers a thread with 4 warps a block, 128 with 8), where its ring fits twice: 228 KB
/// an SM, 1 KB of it kept per block. Q6_K's 224-byte row slots at 32 tokens fit once.
/// 64-token blocks are built for one whatever their ring: at 128 registers the two-tile
/// ring's Q4_K kernel spilled 40 bytes (ptxas 13.0), and two of them an SM measured 3-4%
/// slower than one three-tile block anyway (bench/RESULTS.md 2026-11-27 21:25 UTC).
pub const fn blocks_per_sm(ty: GgmlType, ni: usize, layout: Layout) -> u32 {
    if ni < 8 && 2 * (dynamic_bytes(ty, ni, layout) + 1024) <= 228 * 1024 {
        2
    } else {
        1
    }
}

/// How a block's [`BM`] rows are cut among its warps, and how deep its ring is: four warps
/// of 32 rows (two `m16` tiles, each activation fragment feeding two `mma`s) or eight
/// warps of 16 (one tile: half the registers a thread, so twice the warps an SM to hide
/// the weight loads and the dequantization chains; Nsight Compute on the 4-warp blocks at
/// 32 tokens, H100 2026-11-27: 255 registers, 8 warps an SM, an instruction a warp every 7
/// cycles, 25% of the issue slots used); or eight warps of 16 with a ring of two tiles:
/// a shorter ring to fill at each block's start, which Q4_K's 16- and 32-token blocks
/// gained from ([`default_layout_for`]). (Two 64-token blocks with two-tile rings would
/// fit an SM, 111 KB each, but need 128 registers a thread and measured slower:
/// [`blocks_per_sm`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Four warps of 32 rows.
    Rows32,
    /// Eight warps of 16 rows.
    Rows16,
    /// Eight warps of 16 rows, a ring of two tiles.
    Rows16Pair,
}

impl Layout {
    /// Both layouts, in the order of [`TYPES`]'s name lists.
    pub const ALL: [Layout; 3] = [Layout::Rows32, Layout::Rows16, Layout::Rows16Pair];

    /// `m16` tiles of a warp.
    pub const fn mi(self) -> usize {
        match self {
            Layout::Rows32 => 2,
            Layout::Rows16 | Layout::Rows16Pair => 1,
        }
    }

    /// Tiles in the shared-memory ring (weights and activations): all but one are in
    /// flight while one is multiplied.
    pub const fn ring(self) -> u32 {
        match self {
            Layout::Rows32 | Layout::Rows16 => RING,
            Layout::Rows16Pair => 2,
        }
    }

    /// The layout `SMELT_CUDA_GEMM_NARROW_ROWS` names: `32`, `16` or `16p`.
    pub fn parse(s: &str) -> Option<Layout> {
        match s.trim() {
            "32" => Some(Layout::Rows32),
            "16" => Some(Layout::Rows16),
            "16p" => Some(Layout::Rows16Pair),
            _ => None,
        }
    }

    /// Rows of W a warp owns.
    pub const fn warp_rows(self) -> u32 {
        16 * self.mi() as u32
    }

    /// Threads of a block.
    pub const fn threads(self) -> u32 {
        32 * (BM / self.warp_rows())
    }

    /// Index in [`Layout::ALL`].
    const fn index(self) -> usize {
        match self {
            Layout::Rows32 => 0,
            Layout::Rows16 => 1,
            Layout::Rows16Pair => 2,
        }
    }
}

/// The layout the engine takes for blocks of 8, 16 and 32 tokens unless told otherwise
/// (`SMELT_CUDA_GEMM_NARROW_ROWS`). Whole decode steps of the Llama-3-8B-shape Q4_K on an
/// H100 (bench/RESULTS.md, 2026-11-27 10:16 UTC, two interleaved rounds, same greedy
/// tokens): 16 sequences 2,130 -> 2,185 tok/s (+2.5%), 32 sequences 3,758 -> 3,794
/// (+1.0%) with 16-row warps; 8 tokens run on the GEMV, so that width keeps its layout.
/// Twice the warps an SM gained so little because the kernel is bound by the weight bytes
/// it keeps in flight, not by issue (bench/gpu/NOTES.md).
/// 64-token blocks: Rows16 (half of Rows32's accumulators; Rows32 at 64 is unmeasured).
/// Q4_K takes [`Layout::Rows16Pair`] at 16 and 32 ([`default_layout_for`]).
pub const DEFAULT_LAYOUT: [Layout; 4] = [
    Layout::Rows32,
    Layout::Rows16,
    Layout::Rows16,
    Layout::Rows16,
];

/// Token widths of a block: a kernel for each, per layout.
pub const WIDTHS: [u32; 4] = [8, 16, 32, 64];

/// The widest block the engine takes by default: 33-64 tokens run as one 64-token block,
/// which unpacks each weight once for all of them (two 32-token blocks unpacked it twice).
/// Whole decode steps of the Llama-3-8B shape on an H100, two interleaved rounds
/// (bench/RESULTS.md 2026-11-27 19:20 UTC, `bench/gpu/narrow64.sh`): Q4_K 40 sequences
/// 4,990 -> 5,786 tok/s, 64 sequences 7,419 -> 8,091; Q8_0 4,358 -> 5,264 and 6,526 ->
/// 7,473. `SMELT_CUDA_GEMM_NARROW_WIDTH=32` restores the two blocks.
pub const DEFAULT_MAX_WIDTH: u32 = 64;

/// Index of block width `width` in [`WIDTHS`].
const fn width_index(width: u32) -> usize {
    width.trailing_zeros() as usize - 3
}

/// The default layout for blocks of `width` tokens of type `ty`: [`DEFAULT_LAYOUT`], but a
/// two-tile ring for Q4_K at 16 and 32 tokens. Whole decode steps of the Llama-3-8B-shape
/// Q4_K on an H100, same greedy tokens (bench/RESULTS.md 2026-11-27 21:18 and 21:25 UTC,
/// `bench/gpu/pair64.sh`, two and three interleaved rounds): 16 sequences 3,565 -> 3,673
/// and 3,532 -> 3,654 tok/s, 32 sequences 5,581 -> 5,803 and 5,557 -> 5,757 (+3-4%: the
/// same blocks an SM, a shorter ring to fill at each block's start); 40 and 64 sequences,
/// where the two-tile ring doubles the blocks an SM and so the splits, -3-4%, and Q8_0 at
/// 32 (twice the blocks too) -3%. Q6_K's is unmeasured.
pub fn default_layout_for(ty: GgmlType, width: u32) -> Layout {
    match (ty, width) {
        (GgmlType::Q4_K, 16 | 32) => Layout::Rows16Pair,
        _ => DEFAULT_LAYOUT[width_index(width)],
    }
}

/// Tiles in the shared-memory ring of [`Layout::Rows32`] and [`Layout::Rows16`]: all but
/// one are in flight while one is multiplied.
pub const RING: u32 = 3;
/// Bytes of one token's slot in a half-tile stage: four 64-byte chunks and 32 bytes of
/// padding.
const SLOT: u32 = 288;

/// Byte offset of chunk `c` in a token's slot, as the kernel computes it (16-byte reads of a quarter warp, lanes
/// `(g, c)` for two `g`, then hit 32 different banks with [`SLOT`]'s 72 words).
#[cfg(test)]
const fn chunk_at(c: u32) -> u32 {
    64 * c + 16 * (c / 2)
}

/// Bytes of one half-tile activation stage for blocks of `8 NI` tokens.
pub const fn stage_bytes(ni: usize) -> u32 {
    8 * ni as u32 * SLOT
}

/// One field of a repacked row that a ring slot holds of each tile: the field's array
/// starts at byte `at_per_tile * ntiles` of the row (a row's arrays follow each other), a
/// tile's share is the `bytes` (16-byte pieces) at `bytes * tile`; or, for a field whose
/// 16-byte piece `share` tiles have in common (Q6_K's 2-byte `d`), the piece at `16 (tile
/// / share)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub at_per_tile: u32,
    pub bytes: u32,
    pub share: u32,
}

/// A weight format the narrow GEMM reads: what a ring slot holds of a row's tile, and how
/// lane `(g, c)` reads its share of it and turns it into the `mma`'s A halves: weights
/// `64 c + 32 h + 4 t + j` and `+ 2` of the tile in half `h`, step `t`, pair `j` (module
/// doc).
pub trait NarrowFormat {
    /// The weight type.
    const TYPE: GgmlType;
    /// The kernels for blocks of 8, 16, 32 and 64 tokens ([`WIDTHS`]), per [`Layout`] (in
    /// [`Layout::ALL`]'s order).
    const NAMES: [[&'static str; 4]; 3];
    /// The fields of a row's tile, in slot order.
    const FIELDS: &'static [Field];
    /// A lane's constants.
    type Lane;
    /// One row's registers of one tile.
    type Row;
    /// One row's terms of one half (its scales).
    type Coef;
    /// The constants of lane column `c`.
    fn lane(k: &Kernel, c: Reg<U32>) -> Self::Lane;
    /// Registers for one row's share of a tile.
    fn row_regs(k: &Kernel) -> Self::Row;
    /// Loads the lane's share of tile `tile` of the row whose slot starts at shared byte
    /// `at`.
    fn load(k: &Kernel, lane: &Self::Lane, row: &Self::Row, at: Reg<U32>, tile: Reg<U32>);
    /// The row's terms of half `h`.
    fn coef(k: &Kernel, lane: &Self::Lane, row: &Self::Row, h: usize) -> Self::Coef;
    /// The halves of weights `64 c + 32 h + 4 t + j` and `+ 2` of the row.
    #[allow(clippy::too_many_arguments)]
    fn pair(
        k: &Kernel,
        lane: &Self::Lane,
        row: &Self::Row,
        coef: &Self::Coef,
        h: usize,
        t: usize,
        j: usize,
        magic: Reg<B32>,
    ) -> Reg<B32>;
}

/// Fields of `ty`'s rows (none: no narrow GEMM).
pub const fn fields(ty: GgmlType) -> &'static [Field] {
    match ty {
        GgmlType::Q4_K => <Q4K as NarrowFormat>::FIELDS,
        GgmlType::Q6_K => <Q6K as NarrowFormat>::FIELDS,
        GgmlType::Q8_0 => <Q8_0 as NarrowFormat>::FIELDS,
        _ => &[],
    }
}

/// Bytes of one row's tile in a ring slot.
pub const fn row_slot(ty: GgmlType) -> u32 {
    let f = fields(ty);
    let mut i = 0;
    let mut sum = 0;
    while i < f.len() {
        sum += f[i].bytes;
        i += 1;
    }
    sum
}

/// Bytes of one ring slot for blocks of `8 NI` tokens: a tile's weights, then its two
/// activation stages.
const fn slot_bytes(ty: GgmlType, ni: usize) -> u32 {
    BM * row_slot(ty) + 2 * stage_bytes(ni)
}

/// Dynamic shared memory of a block of `8 NI` tokens in `layout`: the ring (over the 48 KB
/// a static array may take, so the launch sizes it and the driver is told
/// [`MAX_DYNAMIC_BYTES`]).
pub const fn dynamic_bytes(ty: GgmlType, ni: usize, layout: Layout) -> u32 {
    layout.ring() * slot_bytes(ty, ni)
}

/// The most dynamic shared memory a narrow kernel takes (Q8_0's 64-token blocks).
pub const MAX_DYNAMIC_BYTES: u32 = dynamic_bytes(GgmlType::Q8_0, 8, Layout::Rows16);
const _: () = assert!(MAX_DYNAMIC_BYTES >= dynamic_bytes(GgmlType::Q6_K, 8, Layout::Rows16));
const _: () = assert!(MAX_DYNAMIC_BYTES >= dynamic_bytes(GgmlType::Q4_K, 8, Layout::Rows16));
// One block fits an sm_90 SM (227 KB a block at most).
const _: () = assert!(MAX_DYNAMIC_BYTES <= 227 * 1024);

/// The engine's default: every Q4_K matmul of at least [`MIN_TOKENS`] and at most this
/// many tokens takes this GEMM. Whole decode steps of the Llama-3-8B-shape Q4_K on an
/// H100 with the ring (bench/RESULTS.md, 2026-11-27 13:35 UTC, two interleaved rounds):
/// 64 sequences 6,235 -> 7,317 tok/s against the batch-wide f16 blocks and the int8 GEMM,
/// 128 sequences 8,763 -> 8,238; so up to 64 (before the ring, 2026-11-27 04:50 UTC: 32).
/// `SMELT_CUDA_GEMM_NARROW_MAX` sets it (0: off).
pub const MAX_TOKENS: usize = 64;

/// The engine's default: Q4_K matmuls of at least this many tokens leave the GEMV for
/// this GEMM (the other GEMMs take over at [`super::MIN_TOKENS`]). Same measurement as
/// [`MAX_TOKENS`]: 8 sequences 1,340 tok/s on the GEMV, 1,719 here. Fewer tokens are
/// unmeasured and stay on the GEMV, whose cost falls with them (this GEMM's does not).
/// `SMELT_CUDA_GEMM_NARROW_MIN` sets it for every type.
pub const MIN_TOKENS: usize = 8;

/// The fewest tokens for which the engine takes the narrow GEMM of `ty` by default:
/// [`MIN_TOKENS`] for Q4_K and Q8_0 (8 sequences of the Llama-3-8B-shape Q8_0 on an H100:
/// 1,302 tok/s on the GEMV, 1,493 here; bench/RESULTS.md 2026-11-27 14:25 UTC). Q6_K's
/// was measured against the int8 GEMM (half its time from 8 to 32 tokens, `gpu_ops perf
/// -o gemm_f16`, 14:00 UTC) but not against the GEMV that 8 tokens take, so it starts
/// where the int8 GEMM does.
pub fn min_tokens(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q8_0 => MIN_TOKENS,
        _ => super::MIN_TOKENS,
    }
}

/// Formats with a narrow GEMM, and their kernels for blocks of 8, 16, 32 and 64 tokens,
/// per [`Layout`] (in [`Layout::ALL`]'s order).
pub const TYPES: [(GgmlType, [[&str; 4]; 3]); 3] = [
    (GgmlType::Q4_K, <Q4K as NarrowFormat>::NAMES),
    (GgmlType::Q6_K, <Q6K as NarrowFormat>::NAMES),
    (GgmlType::Q8_0, <Q8_0 as NarrowFormat>::NAMES),
];

/// Every narrow kernel of `ty` with its layout and token width.
pub fn kernels_of(ty: GgmlType) -> Vec<(&'static str, Layout, u32)> {
    TYPES
        .iter()
        .filter(|(t, _)| *t == ty)
        .flat_map(|(_, per)| {
            Layout::ALL.iter().flat_map(move |&l| {
                per[l.index()]
                    .iter()
                    .enumerate()
                    .map(move |(i, &n)| (n, l, 8u32 << i))
            })
        })
        .collect()
}

/// Tokens per block for `ntok` tokens, blocks at most [`DEFAULT_MAX_WIDTH`] wide.
pub fn block_tokens(ntok: usize) -> u32 {
    block_tokens_up_to(ntok, DEFAULT_MAX_WIDTH)
}

/// Tokens per block for `ntok` tokens: the narrowest of [`WIDTHS`] that holds them, at most
/// `max_width` (more tokens are more blocks).
pub fn block_tokens_up_to(ntok: usize, max_width: u32) -> u32 {
    WIDTHS
        .into_iter()
        .find(|&w| ntok <= w as usize || w >= max_width)
        .unwrap_or(WIDTHS[WIDTHS.len() - 1])
}

/// The kernel for `ntok` tokens of type `ty` in `layout` (blocks at most
/// [`DEFAULT_MAX_WIDTH`] wide), if there is one.
pub fn name(ty: GgmlType, ntok: usize, layout: Layout) -> Option<&'static str> {
    name_for(ty, block_tokens(ntok), layout)
}

/// The kernel of type `ty` for blocks of `width` tokens in `layout`, if there is one.
pub fn name_for(ty: GgmlType, width: u32, layout: Layout) -> Option<&'static str> {
    let (_, names) = TYPES.iter().find(|(t, _)| *t == ty)?;
    Some(names[layout.index()][width_index(width)])
}

/// The narrow GEMMs, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    let mut v = entries::<Q4K>();
    v.extend(entries::<Q6K>());
    v.extend(entries::<Q8_0>());
    v
}

/// The narrow GEMMs of format `F`.
fn entries<F: NarrowFormat + 'static>() -> Vec<crate::catalog::Entry> {
    let [[n8, n16, n32, n64], [r8, r16, r32, r64], [p8, p16, p32, p64]] = F::NAMES;
    vec![
        (n8.to_string(), Box::new(kernel::<F, 1, 0>)),
        (n16.to_string(), Box::new(kernel::<F, 2, 0>)),
        (n32.to_string(), Box::new(kernel::<F, 4, 0>)),
        (n64.to_string(), Box::new(kernel::<F, 8, 0>)),
        (r8.to_string(), Box::new(kernel::<F, 1, 1>)),
        (r16.to_string(), Box::new(kernel::<F, 2, 1>)),
        (r32.to_string(), Box::new(kernel::<F, 4, 1>)),
        (r64.to_string(), Box::new(kernel::<F, 8, 1>)),
        (p8.to_string(), Box::new(kernel::<F, 1, 2>)),
        (p16.to_string(), Box::new(kernel::<F, 2, 2>)),
        (p32.to_string(), Box::new(kernel::<F, 4, 2>)),
        (p64.to_string(), Box::new(kernel::<F, 8, 2>)),
    ]
}

/// Splits of the K range, chosen by how well the blocks fill the GPU's waves
/// ([`blocks_per_sm`] of type `ty`: two blocks an SM are `2 sm_count` slots a wave): the fewest splits whose blocks fill their last wave to
/// at least [`MIN_FILL`] (every split at least two tiles), else the best filling count.
/// The engine waits for a GEMM's last block before its reduce, so a wave and a quarter
/// costs two waves: the first version (splits to fill every slot twice, whatever the
/// remainder) ran 14336x4096 at 32 tokens as 336 blocks on 264 slots, 1.6x its
/// microbenchmark time inside decode steps (bench/RESULTS.md, 2026-11-27 04:20 UTC).
pub fn splits(ty: GgmlType, nrows: usize, ntiles: usize, ntok: usize, sm_count: usize) -> usize {
    let width = block_tokens(ntok);
    splits_for(
        ty,
        nrows,
        ntiles,
        ntok,
        sm_count,
        (width, default_layout_for(ty, width)),
    )
}

/// [`splits`] for blocks of `block.0` tokens in layout `block.1`.
pub fn splits_for(
    ty: GgmlType,
    nrows: usize,
    ntiles: usize,
    ntok: usize,
    sm_count: usize,
    (width, layout): (u32, Layout),
) -> usize {
    let blocks = nrows.div_ceil(BM as usize).max(1) * ntok.div_ceil(width as usize).max(1);
    let slots = blocks_per_sm(ty, width as usize / 8, layout) as usize * sm_count.max(1);
    // The blocks a split count really launches (slices of whole tiles), and their fill.
    let fill = |s: usize| {
        let z = ntiles.div_ceil(ntiles.div_ceil(s).max(1)).max(1);
        let n = blocks * z;
        (n as f64 / (n.div_ceil(slots) * slots) as f64, z)
    };
    let max = (ntiles / 2).max(1);
    if let Some(s) = (1..=max).find(|&s| fill(s).0 >= MIN_FILL) {
        return fill(s).1;
    }
    let best = (1..=max)
        .map(fill)
        .fold((0.0, 1), |b, f| if f.0 > b.0 { f } else { b });
    best.1
}

/// The share of its last wave a split count must fill to be taken ([`splits`]).
pub const MIN_FILL: f64 = 0.8;

/// The launch of a narrow GEMM of type `ty` in `layout` for `a` (token blocks fastest, so
/// blocks sharing rows run together and the second reads the weights from L2).
pub fn launch(ty: GgmlType, a: &super::Args, layout: Layout) -> Launch {
    launch_width(ty, a, layout, block_tokens(a.ntok as usize))
}

/// [`launch`] on the kernel for blocks of `width` tokens (8, 16 or 32), whatever `a`'s
/// token count (the op harness runs every width on every shape).
pub fn launch_width(ty: GgmlType, a: &super::Args, layout: Layout, width: u32) -> Launch {
    let mut l = Launch::new(
        (
            a.ntok.div_ceil(width).max(1),
            a.nrows.div_ceil(BM).max(1),
            a.ntiles.div_ceil(a.kslice()).max(1),
        ),
        (layout.threads(), 1, 1),
    );
    l.shared_bytes = dynamic_bytes(ty, width as usize / 8, layout);
    l
}

/// One 16-byte copy a tile of a thread: its source for tile 0, its destination in a slot,
/// whether the thread has it (the last pass of pieces may be partial), and its field.
type Copy16 = (Reg<U64>, Reg<U32>, Option<Reg<smelt_ptx::Pred>>, Field);

/// `y = W x` for weights `w` of format `F` and f16 activation rows `x`
/// ([`super::f16::act_kernel`]) in blocks of `8 NI` tokens, in layout `Layout::ALL[L]`;
/// see the module doc. Parameters [`super::GemmArgs`]; [`dynamic_bytes`]`(F::TYPE, NI,
/// layout)` of dynamic shared memory.
pub fn kernel<F: NarrowFormat, const NI: usize, const L: usize>(k: &Kernel) {
    let layout = Layout::ALL[L];
    let ring_tiles = layout.ring();
    let threads = layout.threads();
    let mi_tiles = layout.mi();
    super::f16::attributes_for(k, threads, blocks_per_sm(F::TYPE, NI, layout));
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
    let stage = stage_bytes(NI);
    let slot = slot_bytes(F::TYPE, NI);
    let wtile = BM * row_slot(F::TYPE);
    let smem = k.shared_dynamic(16, dynamic_bytes(F::TYPE, NI, layout));
    let ring = k.shared_base(&smem);

    let tid = k.tid_x();
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane = k.and(k.reg(), tid, 31u32);
    let g = k.shr(k.reg(), lane, 2u32);
    let c = k.and(k.reg(), lane, 3u32);
    let bn = 8 * NI as u32;
    let tok0 = k.mul(k.reg(), k.ctaid_x(), bn);
    let row0 = k.mul(k.reg(), k.ctaid_y(), BM);
    let rows = Rows {
        w,
        row0,
        last_row: k.sub(k.reg(), nrows, 1u32),
        row_bytes,
    };
    // The thread's rows: m-tile mi, half hh is warp row 16 mi + 8 hh + g, whose bytes
    // start at `row_slot` times it in a slot's weights.
    let arow = k.mad(k.reg(), warp, layout.warp_rows(), g);
    let row_in_slot: Vec<Reg<U32>> = (0..2 * mi_tiles)
        .map(|r| {
            let local = k.add(k.reg(), arow, 8 * r as u32);
            k.mul(k.reg(), local, row_slot(F::TYPE))
        })
        .collect();
    let lane_c = F::lane(k, c);
    let tok_stride = k.mul(k.reg(), ntiles, (TILE * 2) as u32);

    // The weight copies of a tile, field by field: piece `i = tid + T m` (16 bytes; `T`
    // threads) of a field of `p` pieces a row is piece `i % p` of the block's row `i / p`.
    // Rows past the matrix's end read its last row (their outputs are never stored).
    let mut wcopies: Vec<Copy16> = Vec::new();
    let mut field_at = 0u32;
    for &f in F::FIELDS {
        let per_row = f.bytes / 16;
        let pieces = BM * per_row;
        for m in 0..pieces.div_ceil(threads) {
            let i = k.add(k.reg(), tid, threads * m);
            let row = k.div_int(k.reg(), i, per_row);
            let q = k.sub(k.reg(), i, k.mul(k.reg(), row, per_row));
            let src = rows.row(k, row);
            let base = k.mul(k.reg(), ntiles, f.at_per_tile);
            k.mad(base, q, 16u32, base);
            k.add(src, src, k.mul_wide(k.reg::<U64>(), base, 1u32));
            let dst = k.mul(k.reg(), row, row_slot(F::TYPE));
            k.add(dst, dst, field_at);
            k.mad(dst, q, 16u32, dst);
            let valid = (threads * (m + 1) > pieces).then(|| k.lt(i, pieces));
            wcopies.push((src, dst, valid, f));
        }
        field_at += f.bytes;
    }
    // The activation copies of a half tile: piece `tid + T m` is token `tid / 16 + (T /
    // 16) m`'s piece `p = tid % 16`, i.e. chunk `p / 4`, bytes `16 (p % 4)..` of it.
    // Tokens past the block's or the matrix's end are not copied (their outputs are never
    // stored).
    let p = k.and(k.reg(), tid, 15u32);
    let pc = k.shr(k.reg(), p, 2u32);
    let pq = k.and(k.reg(), p, 3u32);
    let src_in_row = k.mul(k.reg(), pc, 128u32);
    k.mad(src_in_row, pq, 16u32, src_in_row);
    let dst_in_slot = k.mul(k.reg(), pc, 64u32);
    let half = k.shr(k.reg(), pc, 1u32);
    k.mad(dst_in_slot, half, 16u32, dst_in_slot);
    k.mad(dst_in_slot, pq, 16u32, dst_in_slot);
    let per_pass = threads / 16;
    let copies: Vec<(Reg<U64>, Reg<U32>, Reg<smelt_ptx::Pred>)> = (0..(8 * NI as u32)
        .div_ceil(per_pass))
        .map(|m| {
            let j = k.shr(k.reg(), tid, 4u32);
            k.add(j, j, per_pass * m);
            let t = k.add(k.reg(), tok0, j);
            let valid = k.lt(t, ntok);
            if per_pass * (m + 1) > 8 * NI as u32 {
                let inside = k.lt(j, 8 * NI as u32);
                k.raw(format!("and.pred {valid}, {valid}, {inside}"));
            }
            let src = k.add(k.reg(), x, k.mul_wide(k.reg::<U64>(), t, tok_stride));
            k.add(src, src, k.mul_wide(k.reg::<U64>(), src_in_row, 1u32));
            let dst = k.mad(k.reg(), j, SLOT, dst_in_slot);
            (src, dst, valid)
        })
        .collect();
    // Copies tile `tile`'s weights into the slot at byte `at` (they need nothing of the
    // previous kernel).
    let copy_weights = |k: &Kernel, tile: Reg<U32>, at: Reg<U32>| {
        for &(src, dst, valid, f) in &wcopies {
            let off = if f.share == 1 {
                k.mul_wide(k.reg::<U64>(), tile, f.bytes)
            } else {
                let piece = k.div_int(k.reg(), tile, f.share);
                k.mul_wide(k.reg::<U64>(), piece, 16u32)
            };
            let s = k.add(k.reg(), src, off);
            let d = k.add(k.reg(), dst, at);
            let copy = |k: &Kernel| k.cp_async(CpAsyncCache::Cg, d.at(0), s, 16);
            match valid {
                Some(v) => k.guarded(v, copy),
                None => copy(k),
            }
        }
    };
    // Copies tile `tile`'s activations (both halves) into the slot at byte `at`.
    let copy_acts = |k: &Kernel, tile: Reg<U32>, at: Reg<U32>| {
        for h in 0..2u32 {
            let off = k.mul_wide(k.reg::<U64>(), tile, (TILE * 2) as u32);
            k.add(off, off, u64::from(64 * h));
            let base = k.add(k.reg(), at, wtile + h * stage);
            for &(src, dst, valid) in &copies {
                let s = k.add(k.reg(), src, off);
                let d = k.add(k.reg(), dst, base);
                k.guarded(valid, |k| {
                    k.cp_async(CpAsyncCache::Cg, d.at(0), s, 16);
                });
            }
        }
    };
    // Lane (g, c)'s B reads: token 8 ni + g, chunk c.
    let b_lane = k.mul(k.reg(), g, SLOT);
    let cb = k.mul(k.reg(), c, 64u32);
    let ch = k.shr(k.reg(), c, 1u32);
    k.mad(cb, ch, 16u32, cb);
    k.add(b_lane, b_lane, cb);

    let acc: Vec<[[Reg<smelt_ptx::F32>; 4]; NI]> = (0..mi_tiles)
        .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))))
        .collect();
    let set: Vec<F::Row> = (0..2 * mi_tiles).map(|_| F::row_regs(k)).collect();
    let magic = k.mov(k.reg::<B32>(), 0x6400_6400u32);

    // The ring: `rd` is the slot of the tile being multiplied, `wr` that of the tile
    // `ring_tiles - 1` ahead (the one multiplied last: every warp is past it after this tile's
    // barrier).
    let rd = k.mov(k.reg::<U32>(), ring);
    let wr = k.add(k.reg(), ring, (ring_tiles - 1) * slot);
    let ring_end = k.add(k.reg(), ring, ring_tiles * slot);
    let (first, end, y) = split_range(k, y, nrows, ntok, ntiles, kslice);
    // Half h of the tile whose weights are in `set` and activations at `rd`.
    let half_step = |k: &Kernel, h: usize| {
        let coef: Vec<F::Coef> = set.iter().map(|r| F::coef(k, &lane_c, r, h)).collect();
        let base = k.add(k.reg(), rd, b_lane);
        // Piece `q` (16 bytes) of a token's chunk holds its halves for steps `2 q`, `2 q +
        // 1`. Blocks of up to 32 tokens read two pieces a tile at a time, 64-token blocks
        // one (their 8 tiles' B registers of four steps would be 64 of a thread's 128).
        let per = if NI >= 8 { 1 } else { 2 };
        for q0 in (0..4usize).step_by(per) {
            let bq: Vec<Vec<Reg<B32>>> = (0..NI)
                .map(|ni| {
                    let at =
                        (wtile + h as u32 * stage + ni as u32 * 8 * SLOT + 16 * q0 as u32) as i64;
                    (0..per)
                        .flat_map(|p| {
                            let v = k.regs::<B32, 4>();
                            k.ld_v4(Load::SHARED, v, base.at(at + 16 * p as i64));
                            v
                        })
                        .collect()
                })
                .collect();
            for ti in 0..2 * per {
                let t = 2 * q0 + ti;
                for (mi, acc_m) in acc.iter().enumerate() {
                    let (r0, r1) = (2 * mi, 2 * mi + 1);
                    let frag =
                        |r: usize, j: usize| F::pair(k, &lane_c, &set[r], &coef[r], h, t, j, magic);
                    let a = [frag(r0, 0), frag(r1, 0), frag(r0, 1), frag(r1, 1)];
                    for (ni, &cfrag) in acc_m.iter().enumerate() {
                        let b = [bq[ni][2 * ti], bq[ni][2 * ti + 1]];
                        k.mma_m16n8k16(MmaFloat::F16, cfrag, a, b, cfrag);
                    }
                }
            }
        }
    };
    // One tile: waits for its copies (all but the newest group: the tile after it), starts
    // those of the tile `ring_tiles - 1` ahead into the slot the last tile left, reads the
    // thread's weights and multiplies both halves.
    let tile_step = |k: &Kernel, tile: Reg<U32>| {
        k.cp_async_wait(ring_tiles - 2);
        k.bar_sync();
        let ahead = k.add(k.reg(), tile, ring_tiles - 1);
        k.if_(k.lt(ahead, end), |k| {
            copy_weights(k, ahead, wr);
            copy_acts(k, ahead, wr);
        });
        k.cp_async_commit();
        for (&at, row) in row_in_slot.iter().zip(&set) {
            let at = k.add(k.reg(), rd, at);
            F::load(k, &lane_c, row, at, tile);
        }
        half_step(k, 0);
        half_step(k, 1);
        // Rotate the ring: this tile's slot is the next write slot.
        k.mov(wr, rd);
        k.add(rd, rd, slot);
        let wrap = k.ge(rd, ring_end);
        let back = k.sub(k.reg(), rd, ring_tiles * slot);
        k.selp(rd, back, rd, wrap);
    };

    // The first `ring_tiles - 1` tiles' weights go before the programmatic launch wait (they need
    // nothing of the previous kernel), in one group; their activations after it, a group
    // a tile, so that the first tile waits only for its own.
    k.if_(k.lt(first, end), |k| {
        for j in 0..ring_tiles - 1 {
            let t = k.add(k.reg(), first, j);
            let at = k.add(k.reg(), ring, j * slot);
            k.if_(k.lt(t, end), |k| copy_weights(k, t, at));
        }
        k.cp_async_commit();
    });
    k.grid_dep_wait();
    k.if_(k.lt(first, end), |k| {
        for j in 0..ring_tiles - 1 {
            let t = k.add(k.reg(), first, j);
            let at = k.add(k.reg(), ring, j * slot);
            k.if_(k.lt(t, end), |k| copy_acts(k, t, at));
            k.cp_async_commit();
        }
    });
    k.stride_loop(first, end, 1u32, |k, t| tile_step(k, t));
    k.cp_async_wait(0);
    super::fixup::store_split_outputs(
        k,
        &acc,
        Out {
            y,
            row: k.add(k.reg(), row0, arow),
            tok: k.add(k.reg(), tok0, k.shl(k.reg(), c, 1u32)),
            nrows,
            ntok,
            slots: None,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_splits_and_names_follow_the_token_count() {
        let r32 = Layout::Rows32;
        let q4 = GgmlType::Q4_K;
        assert_eq!(name(q4, 5, r32), Some("gemm_narrow8_q4_k"));
        assert_eq!(name(q4, 16, r32), Some("gemm_narrow16_q4_k"));
        assert_eq!(name(q4, 17, r32), Some("gemm_narrow32_q4_k"));
        assert_eq!(name(q4, 32, r32), Some("gemm_narrow32_q4_k"));
        assert_eq!(name(q4, 64, r32), Some("gemm_narrow64_q4_k"));
        assert_eq!(name(q4, 64, Layout::Rows16), Some("gemm_narrow64_r16_q4_k"));
        assert_eq!(name(GgmlType::Q6_K, 16, r32), Some("gemm_narrow16_q6_k"));
        assert_eq!(name(GgmlType::Q8_0, 16, r32), Some("gemm_narrow16_q8_0"));
        assert_eq!(name(GgmlType::Q5_K, 16, r32), None);
        // Blocks as wide as asked: 64 tokens one block of 64, or two of 32.
        assert_eq!(block_tokens_up_to(33, 64), 64);
        assert_eq!(block_tokens_up_to(64, 64), 64);
        assert_eq!(block_tokens_up_to(65, 64), 64);
        assert_eq!(block_tokens_up_to(64, 32), 32);
        assert_eq!(block_tokens_up_to(20, 64), 32);
        assert_eq!(block_tokens_up_to(3, 64), 8);
        assert_eq!(block_tokens_up_to(64, 16), 16);
        assert_eq!(
            name_for(q4, 64, Layout::Rows16),
            Some("gemm_narrow64_r16_q4_k")
        );
        // One 64-token block an SM: 14336 rows are 112 blocks on 132 slots (85%), unsplit.
        assert_eq!(splits_for(q4, 14336, 16, 64, 132, (64, Layout::Rows16)), 1);
        assert_eq!(
            splits_for(q4, 14336, 16, 64, 132, (64, Layout::Rows16Pair)),
            1
        );
        let a = super::super::Args::q4_k_for_test(4097, 40, 16);
        let l = launch(q4, &a, r32);
        assert_eq!(l.grid, (1, 33, 4));
        assert_eq!(l.block, (128, 1, 1));
        assert_eq!(l.shared_bytes, dynamic_bytes(q4, 8, r32));
        assert_eq!(launch_width(q4, &a, r32, 32).grid, (2, 33, 4));
        assert_eq!(
            launch_width(q4, &a, r32, 8).shared_bytes,
            dynamic_bytes(q4, 1, r32)
        );
        assert_eq!(launch_width(q4, &a, r32, 8).grid, (5, 33, 4));
        assert_eq!(launch(q4, &a, Layout::Rows16).block, (256, 1, 1));
        // A slot is a tile's weights and both activation halves: 108 KB at 32 tokens for
        // Q4_K (two blocks an SM), 138 KB for Q6_K (one), 103 KB for Q6_K at 16 (two).
        assert_eq!(dynamic_bytes(q4, 4, r32), 3 * (128 * 144 + 2 * 32 * 288));
        assert_eq!(
            dynamic_bytes(GgmlType::Q6_K, 4, r32),
            3 * (128 * 224 + 2 * 32 * 288)
        );
        assert_eq!(MAX_DYNAMIC_BYTES, 3 * (128 * 272 + 2 * 64 * 288));
        let r16 = Layout::Rows16;
        assert_eq!(blocks_per_sm(q4, 8, r16), 1);
        assert_eq!(blocks_per_sm(GgmlType::Q8_0, 4, r16), 1);
        assert_eq!(blocks_per_sm(q4, 4, r16), 2);
        assert_eq!(blocks_per_sm(GgmlType::Q6_K, 4, r16), 1);
        assert_eq!(blocks_per_sm(GgmlType::Q6_K, 2, r16), 2);
        // A two-tile ring: 64-token Q4_K blocks would fit an SM twice (111 KB each) but
        // are built for one (registers); Q8_0's do not fit (143 KB).
        let pair = Layout::Rows16Pair;
        assert_eq!(dynamic_bytes(q4, 8, pair), 2 * (128 * 144 + 2 * 64 * 288));
        assert_eq!(blocks_per_sm(q4, 8, pair), 1);
        assert_eq!(blocks_per_sm(q4, 4, pair), 2);
        assert_eq!(blocks_per_sm(GgmlType::Q8_0, 8, pair), 1);
        assert_eq!(Layout::parse("16p"), Some(pair));
        assert_eq!(Layout::parse("32"), Some(r32));
        assert_eq!(Layout::parse("8"), None);
        assert_eq!(name_for(q4, 32, pair), Some("gemm_narrow32_r16p_q4_k"));
        assert_eq!(default_layout_for(q4, 32), pair);
        assert_eq!(default_layout_for(q4, 64), r16);
        assert_eq!(default_layout_for(GgmlType::Q8_0, 32), r16);
        // Every kernel listed once, with its layout's and width's name.
        for (ty, _) in TYPES {
            let all = kernels_of(ty);
            assert_eq!(all.len(), 12);
            for (n, l, w) in all {
                assert_eq!(name_for(ty, w, l), Some(n));
                assert_eq!(
                    crate::catalog::max_dynamic_shared_bytes(n),
                    MAX_DYNAMIC_BYTES
                );
            }
        }
        // H100 (264 slots), 32 tokens: 4096x4096 is 32 blocks, 8 splits (256 blocks:
        // 97% of a wave); 14336 rows are 112 blocks, 2 splits (224: 85%, where 3 made
        // 336, a wave and a quarter); 28672 rows one (224); K 14336 at 32 tokens, 7
        // splits of 8 tiles (224); 1024 rows cannot fill a wave: the best, 8 splits.
        assert_eq!(splits(q4, 4096, 16, 32, 132), 8);
        assert_eq!(splits(q4, 14336, 16, 32, 132), 2);
        assert_eq!(splits(q4, 28672, 16, 32, 132), 1);
        assert_eq!(splits(q4, 4096, 56, 32, 132), 7);
        assert_eq!(splits(q4, 1024, 16, 32, 132), 8);
        // 64 tokens are one 64-token block (one block an SM): 14336 rows are 112 blocks
        // (85% of 132 slots) unsplit; 4096 rows 4 splits of 32 blocks (97%).
        assert_eq!(splits(q4, 14336, 16, 64, 132), 1);
        assert_eq!(splits(q4, 4096, 56, 64, 132), 4);
        // Q6_K at 32 tokens: one block an SM (132 slots): 4096 rows are 32 blocks, 4
        // splits (128: 97%).
        assert_eq!(splits(GgmlType::Q6_K, 4096, 56, 32, 132), 4);
        // The chunks of a slot: 16-byte reads of lanes (g, c), g < 2, in 32 banks.
        let mut banks = std::collections::BTreeSet::new();
        for g in 0..2 {
            for c in 0..4 {
                for w in 0..4 {
                    banks.insert(((g * SLOT + chunk_at(c)) / 4 + w) % 32);
                }
            }
        }
        assert_eq!(banks.len(), 32);
        assert!(chunk_at(3) + 64 <= SLOT);
    }

    #[test]
    fn every_narrow_gemm_builds() {
        let names: Vec<&str> = TYPES
            .iter()
            .flat_map(|(_, n)| n.iter().flatten().copied())
            .collect();
        assert_eq!(names.len(), catalog().len());
        crate::catalog::assert_builds(catalog, &names);
    }
}
