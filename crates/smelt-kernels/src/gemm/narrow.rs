//! The GEMM for batches of a few dozen tokens (batched decode): weights go from global
//! memory straight into `mma` fragments in registers, with no shared-memory staging, and
//! the block's activations come through a ring of shared-memory stages.
//!
//! At 16-64 tokens the staged GEMMs ([`super`], [`super::f16`], [`super::f16_small`]) are
//! bound by their shared-memory pipe (Nsight Compute, bench/RESULTS.md 2026-11-27: 65-84%
//! busy, 9-23% of DRAM bandwidth): every weight is loaded, unpacked, stored to shared
//! memory and read back as a fragment, ~6 bytes of shared-memory traffic a weight, which
//! only pays when 128 tokens share it. Here each thread loads exactly the bytes of its
//! own `mma.m16n8k16` A fragments and dequantizes them in registers, as Marlin does for
//! int4 weights, so a weight costs one global load, about two instructions and no shared
//! memory at all; only the activations (32 tokens x 128 weights, 8 KB a stage) pass
//! through shared memory, read by the block's four warps: ~1 byte of shared-memory
//! traffic a weight.
//!
//! **Which weights a thread holds.** In a warp, lane `(g, c)` (`g = lane / 4`, `c = lane %
//! 4`) takes, of each 144-byte Q4_K super-block of its four rows (`g`, `g + 8`, `g + 16`,
//! `g + 24` of the warp's 32), the 16-byte header and quant bytes `32 c..32 c + 32`: the
//! weights `64 c + l` (low nibbles, sub-block `2 c`) and `64 c + 32 + l` (high, `2 c + 1`)
//! for `l < 32`, exactly the Q4_K GEMV's share ([`crate::formats::q4_k`]). A tile is then
//! two halves `h` (low and high nibbles) of eight `k16` steps; in step `(h, t)` the four
//! lanes of a row give the `mma` its 16 K positions as lane `c`'s weights `64 c + 32 h +
//! 4 t + 0..4`. The `mma` does not care which physical K a logical K is, only that A and B
//! agree: the activation rows of [`super::f16::act_kernel`] (values `0, 2, 1, 3` of every
//! four) put exactly the matching values in lane `(g, c)`'s two B registers, 8 bytes at
//! the same offset.
//!
//! **The activation ring.** A stage is one half `h` of one tile for the block's tokens:
//! per token the four 64-byte chunks `128 c + 64 h..` of its tile row (chunk `c` at
//! `64 c + 16 (c / 2)` of a 288-byte slot, so that the 16-byte reads of a quarter warp
//! fall in 32 different banks). Three stages rotate: stage `s + 2` is copied
//! (`cp.async`) while stage `s` is multiplied, one barrier a stage.
//!
//! **Shape.** A block owns [`BM`] rows x `8 NI` tokens: four warps of 32 rows (two `m16`
//! tiles, so each B fragment feeds two `mma`s) or eight of 16 ([`Layout`]), each over the
//! block's whole K slice. The next tile's weights are loaded into a second register set
//! while this tile's are multiplied. At ~200 registers a thread two blocks fit an SM. Split
//! K and its reduce are the other GEMMs' ([`super::Args`] with [`splits`]).
//!
//! CPU twin: [`super::f16::cpu_with_magnitude`] (the weights are the f16 GEMM's to the
//! bit: the same `q * A + B` with `A`, `B` rounded to halves; only the f32 summation
//! order differs).

use smelt_ptx::{CpAsyncCache, FloatRound, Kernel, Load, MmaFloat, Reg, B32, U32, U64};

use super::f16::{dequant_pair, nibble_pair};
use super::{split_range, GemmRegs, Out, Rows};
use crate::formats::q4_k::{decode_header, setup_with_quants_at};
use crate::formats::{ld_weights, WeightLoad};
use crate::ops::Launch;
use crate::{GgmlType, TILE};

/// Rows of W per block (whatever the warp layout).
pub const BM: u32 = 128;
/// Blocks an SM asked of ptxas on sm_90 (a cap of 255 registers a thread with 4 warps a
/// block, 128 with 8).
pub const BLOCKS_PER_SM: u32 = 2;

/// How a block's [`BM`] rows are cut among its warps: four warps of 32 rows (two `m16`
/// tiles, each activation fragment feeding two `mma`s) or eight warps of 16 (one tile:
/// half the registers a thread, so twice the warps an SM to hide the weight loads and the
/// dequantization chains; Nsight Compute on the 4-warp blocks at 32 tokens, H100
/// 2026-11-27: 255 registers, 8 warps an SM, an instruction a warp every 7 cycles, 25% of
/// the issue slots used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Four warps of 32 rows.
    Rows32,
    /// Eight warps of 16 rows.
    Rows16,
}

impl Layout {
    /// Both layouts, in the order of [`TYPES`]'s name lists.
    pub const ALL: [Layout; 2] = [Layout::Rows32, Layout::Rows16];

    /// `m16` tiles of a warp.
    pub const fn mi(self) -> usize {
        match self {
            Layout::Rows32 => 2,
            Layout::Rows16 => 1,
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
pub const DEFAULT_LAYOUT: [Layout; 3] = [Layout::Rows32, Layout::Rows16, Layout::Rows16];

/// The default layout for `ntok` tokens.
pub fn default_layout(ntok: usize) -> Layout {
    DEFAULT_LAYOUT[block_tokens(ntok).trailing_zeros() as usize - 3]
}

/// Bytes of a Q4_K super-block.
const BLOCK: u32 = 144;
/// Activation stages in the shared-memory ring.
const RING: u32 = 3;
/// Bytes of one token's slot in a stage: four 64-byte chunks and 32 bytes of padding.
const SLOT: u32 = 288;

/// Byte offset of chunk `c` in a token's slot, as the kernel computes it (16-byte reads of a quarter warp, lanes
/// `(g, c)` for two `g`, then hit 32 different banks with [`SLOT`]'s 72 words).
#[cfg(test)]
const fn chunk_at(c: u32) -> u32 {
    64 * c + 16 * (c / 2)
}

/// Bytes of one stage for blocks of `8 NI` tokens.
pub const fn stage_bytes(ni: usize) -> u32 {
    8 * ni as u32 * SLOT
}

/// Static shared memory of a block of `8 NI` tokens.
pub const fn shared_bytes(ni: usize) -> usize {
    (RING * stage_bytes(ni)) as usize
}
const _: () = assert!(shared_bytes(4) <= crate::catalog::MAX_SHARED_BYTES);

/// The engine's default: every Q4_K matmul of at most this many tokens takes this GEMM.
/// Whole decode steps of the Llama-3-8B-shape Q4_K on an H100 (bench/RESULTS.md,
/// 2026-11-27 04:50 UTC, graphs, against the batch-wide f16 blocks and the int8 GEMM): 8
/// sequences 1.00x, 16 1.06x, 32 1.01x, 64 0.92x; so up to 32.
/// `SMELT_CUDA_GEMM_NARROW_MAX` sets it (0: off).
pub const MAX_TOKENS: usize = 32;

/// Formats with a narrow GEMM, and their kernels for blocks of 8, 16 and 32 tokens, per
/// [`Layout`] (in [`Layout::ALL`]'s order).
pub const TYPES: [(GgmlType, [[&str; 3]; 2]); 1] = [(
    GgmlType::Q4_K,
    [
        [
            "gemm_narrow8_q4_k",
            "gemm_narrow16_q4_k",
            "gemm_narrow32_q4_k",
        ],
        [
            "gemm_narrow8_r16_q4_k",
            "gemm_narrow16_r16_q4_k",
            "gemm_narrow32_r16_q4_k",
        ],
    ],
)];

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

/// Tokens per block for `ntok` tokens: 8, 16, else 32 (more tokens are more blocks).
pub fn block_tokens(ntok: usize) -> u32 {
    match ntok {
        0..=8 => 8,
        9..=16 => 16,
        _ => 32,
    }
}

/// The kernel for `ntok` tokens of type `ty` in `layout`, if there is one.
pub fn name(ty: GgmlType, ntok: usize, layout: Layout) -> Option<&'static str> {
    let (_, names) = TYPES.iter().find(|(t, _)| *t == ty)?;
    Some(names[layout.index()][block_tokens(ntok).trailing_zeros() as usize - 3])
}

/// The narrow GEMMs, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    let [[n8, n16, n32], [r8, r16, r32]] = TYPES[0].1;
    vec![
        (n8.to_string(), Box::new(kernel::<1, 2>)),
        (n16.to_string(), Box::new(kernel::<2, 2>)),
        (n32.to_string(), Box::new(kernel::<4, 2>)),
        (r8.to_string(), Box::new(kernel::<1, 1>)),
        (r16.to_string(), Box::new(kernel::<2, 1>)),
        (r32.to_string(), Box::new(kernel::<4, 1>)),
    ]
}

/// Splits of the K range, chosen by how well the blocks fill the GPU's waves (two blocks an
/// SM: `2 sm_count` slots a wave): the fewest splits whose blocks fill their last wave to
/// at least [`MIN_FILL`] (every split at least two tiles), else the best filling count.
/// The engine waits for a GEMM's last block before its reduce, so a wave and a quarter
/// costs two waves: the first version (splits to fill every slot twice, whatever the
/// remainder) ran 14336x4096 at 32 tokens as 336 blocks on 264 slots, 1.6x its
/// microbenchmark time inside decode steps (bench/RESULTS.md, 2026-11-27 04:20 UTC).
pub fn splits(nrows: usize, ntiles: usize, ntok: usize, sm_count: usize) -> usize {
    let blocks =
        nrows.div_ceil(BM as usize).max(1) * ntok.div_ceil(block_tokens(ntok) as usize).max(1);
    let slots = BLOCKS_PER_SM as usize * sm_count.max(1);
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

/// The launch of a narrow GEMM in `layout` for `a` (token blocks fastest, so blocks
/// sharing rows run together and the second reads the weights from L2).
pub fn launch(a: &super::Args, layout: Layout) -> Launch {
    Launch::new(
        (
            a.ntok.div_ceil(block_tokens(a.ntok as usize)).max(1),
            a.nrows.div_ceil(BM).max(1),
            a.ntiles.div_ceil(a.kslice()).max(1),
        ),
        (layout.threads(), 1, 1),
    )
}

/// One tile's loads of a thread's rows (two an `m16` tile): each row's header, then its
/// 32 quant bytes.
struct Set {
    hdr: Vec<[Reg<U32>; 4]>,
    qs: Vec<[Reg<U32>; 8]>,
}

/// `y = W x` for Q4_K weights `w` and f16 activation rows `x` ([`super::f16::act_kernel`])
/// in blocks of `8 NI` tokens, warps of `MI` `m16` tiles ([`Layout`]); see the module doc.
/// Parameters [`super::GemmArgs`].
pub fn kernel<const NI: usize, const MI: usize>(k: &Kernel) {
    let layout = if MI == 2 {
        Layout::Rows32
    } else {
        Layout::Rows16
    };
    assert_eq!(layout.mi(), MI);
    let threads = layout.threads();
    super::f16::attributes_for(k, threads, BLOCKS_PER_SM);
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
    let ring_s = k.shared::<U32>("narrow_ring", RING * stage / 4, 16);
    let ring = k.shared_base(&ring_s);

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
    // The thread's rows: m-tile mi, half hh is warp row 16 mi + 8 hh + g.
    let arow = k.mad(k.reg(), warp, layout.warp_rows(), g);
    let row_at: Vec<Reg<U64>> = (0..2 * MI)
        .map(|r| {
            let local = k.add(k.reg(), arow, 8 * r as u32);
            rows.row(k, local)
        })
        .collect();
    let setup = setup_with_quants_at(k, c, 16);
    let tok_stride = k.mul(k.reg(), ntiles, (TILE * 2) as u32);

    // The copies of a stage: piece `tid + T m` (16 bytes; `T` threads) is token
    // `tid / 16 + (T / 16) m`'s piece `p = tid % 16`, i.e. chunk `p / 4`, bytes `16 (p %
    // 4)..` of it. Tokens past the block's or the matrix's end are not copied (their
    // outputs are never stored).
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
    // Copies stage (tile, h) into the ring slot at byte `at`.
    let copy_stage = |k: &Kernel, tile: Reg<U32>, h: u32, at: Reg<U32>| {
        let off = k.mul_wide(k.reg::<U64>(), tile, (TILE * 2) as u32);
        k.add(off, off, u64::from(64 * h));
        for &(src, dst, valid) in &copies {
            let s = k.add(k.reg(), src, off);
            let d = k.add(k.reg(), dst, at);
            k.guarded(valid, |k| {
                k.cp_async(CpAsyncCache::Cg, d.at(0), s, 16);
            });
        }
    };
    // Lane (g, c)'s B reads: token 8 ni + g, chunk c.
    let b_lane = k.mul(k.reg(), g, SLOT);
    let cb = k.mul(k.reg(), c, 64u32);
    let ch = k.shr(k.reg(), c, 1u32);
    k.mad(cb, ch, 16u32, cb);
    k.add(b_lane, b_lane, cb);

    let acc: [[[Reg<smelt_ptx::F32>; 4]; NI]; MI] =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));
    let sets: [Set; 2] = std::array::from_fn(|_| Set {
        hdr: (0..2 * MI).map(|_| k.regs::<U32, 4>()).collect(),
        qs: (0..2 * MI).map(|_| k.regs::<U32, 8>()).collect(),
    });
    let how = WeightLoad { no_l1: true };
    let load = |k: &Kernel, set: &Set, tile: Reg<U32>| {
        let off = k.mul_wide(k.reg::<U64>(), tile, BLOCK);
        for ((&at, &hdr), &qs) in row_at.iter().zip(&set.hdr).zip(&set.qs) {
            let block = k.add(k.reg(), at, off);
            ld_weights(k, how, hdr, block);
            let q = k.add(k.reg(), block, setup.qoff);
            let [a, b, cc, d, e, f, gg, h] = qs;
            ld_weights(k, how, [a, b, cc, d], q);
            ld_weights(k, how, [e, f, gg, h], q.at(16));
        }
    };
    let magic = k.mov(k.reg::<B32>(), 0x6400_6400u32);

    // The ring: `rd` is the slot of the stage being multiplied, `wr` that of the stage
    // two ahead (the one multiplied last: every warp is past it after this stage's
    // barrier).
    let rd = k.mov(k.reg::<U32>(), ring);
    let wr = k.add(k.reg(), ring, 2 * stage);
    let ring_end = k.add(k.reg(), ring, RING * stage);
    let (first, end, y) = split_range(k, y, nrows, ntok, ntiles, kslice);
    // One stage: half h of tile `tile` (whose weights are in `set`); copies half h of
    // the next tile into `wr`.
    let stage_step = |k: &Kernel, set: &Set, tile: Reg<U32>, h: usize| {
        k.cp_async_wait(1);
        k.bar_sync();
        let next = k.add(k.reg(), tile, 1u32);
        k.if_(k.lt(next, end), |k| copy_stage(k, next, h as u32, wr));
        k.cp_async_commit();
        // The rows' group terms A = d sc, B = -dmin m of sub-block 2c + h, as halves.
        let coef: Vec<(Reg<B32>, Reg<B32>)> = (0..2 * MI)
            .map(|r| {
                let hd = decode_header(k, &setup, set.hdr[r]);
                let sc = k.cvt(k.reg::<smelt_ptx::F32>(), hd.scale[h], FloatRound::Rn);
                let m = k.cvt(k.reg::<smelt_ptx::F32>(), hd.min[h], FloatRound::Rn);
                let a = k.mul(k.reg(), hd.d, sc);
                let b = k.mul(k.reg(), hd.neg_dmin, m);
                (k.cvt_f16x2(k.reg(), a, a), k.cvt_f16x2(k.reg(), b, b))
            })
            .collect();
        let (sa, sb) = if h == 0 { (0, 8) } else { (4, 12) };
        let base = k.add(k.reg(), rd, b_lane);
        for tq in 0..2usize {
            // Halves 64 c + 32 h + 16 tq..+16 of each token: steps t = 4 tq..4 tq + 4.
            let bq: [[Reg<B32>; 8]; NI] = std::array::from_fn(|ni| {
                let v = k.regs::<B32, 8>();
                let at = (ni as u32 * 8 * SLOT + 32 * tq as u32) as i64;
                k.ld_v4(Load::SHARED, [v[0], v[1], v[2], v[3]], base.at(at));
                k.ld_v4(Load::SHARED, [v[4], v[5], v[6], v[7]], base.at(at + 16));
                v
            });
            for ti in 0..4usize {
                let t = 4 * tq + ti;
                for (mi, acc_m) in acc.iter().enumerate() {
                    let (r0, r1) = (2 * mi, 2 * mi + 1);
                    let frag = |r: usize, shift: u32| {
                        let (a, b) = coef[r];
                        let v = nibble_pair(k, set.qs[r][t], shift, magic);
                        dequant_pair(k, v, magic, a, b)
                    };
                    let a = [frag(r0, sa), frag(r1, sa), frag(r0, sb), frag(r1, sb)];
                    for (ni, &cfrag) in acc_m.iter().enumerate() {
                        let b = [bq[ni][2 * ti], bq[ni][2 * ti + 1]];
                        k.mma_m16n8k16(MmaFloat::F16, cfrag, a, b, cfrag);
                    }
                }
            }
        }
        // Rotate the ring: this stage's slot is the next write slot.
        k.mov(wr, rd);
        k.add(rd, rd, stage);
        let wrap = k.ge(rd, ring_end);
        let back = k.sub(k.reg(), rd, RING * stage);
        k.selp(rd, back, rd, wrap);
    };
    let compute = |k: &Kernel, set: &Set, tile: Reg<U32>| {
        stage_step(k, set, tile, 0);
        stage_step(k, set, tile, 1);
    };

    // Tiles [first, end) in pairs (set 0, set 1), the next pair's weights loaded while
    // this pair is multiplied. Weight loads past the end read the last tile again and are
    // never used; they need nothing of the previous kernel, so the first go before the
    // programmatic launch wait, the activations' copies after it.
    let last_tile = k.sub(k.reg(), end, 1u32);
    let clamp = |k: &Kernel, t: Reg<U32>, ahead: u32| {
        let a = k.add(k.reg(), t, ahead);
        k.min(a, a, last_tile)
    };
    k.if_(k.lt(first, end), |k| {
        load(k, &sets[0], clamp(k, first, 0));
        load(k, &sets[1], clamp(k, first, 1));
    });
    k.grid_dep_wait();
    k.if_(k.lt(first, end), |k| {
        copy_stage(k, first, 0, rd);
        k.cp_async_commit();
        let second = k.add(k.reg(), rd, stage);
        copy_stage(k, first, 1, second);
        k.cp_async_commit();
    });
    k.stride_loop(first, end, 2u32, |k, t| {
        compute(k, &sets[0], t);
        load(k, &sets[0], clamp(k, t, 2));
        let t1 = k.add(k.reg(), t, 1u32);
        k.if_(k.lt(t1, end), |k| compute(k, &sets[1], t1));
        load(k, &sets[1], clamp(k, t, 3));
    });
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
        assert_eq!(name(GgmlType::Q4_K, 5, r32), Some("gemm_narrow8_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 16, r32), Some("gemm_narrow16_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 17, r32), Some("gemm_narrow32_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 64, r32), Some("gemm_narrow32_q4_k"));
        assert_eq!(
            name(GgmlType::Q4_K, 64, Layout::Rows16),
            Some("gemm_narrow32_r16_q4_k")
        );
        assert_eq!(name(GgmlType::Q6_K, 16, r32), None);
        let a = super::super::Args::q4_k_for_test(4097, 40, 16);
        let l = launch(&a, r32);
        assert_eq!(l.grid, (2, 33, 4));
        assert_eq!(l.block, (128, 1, 1));
        assert_eq!(launch(&a, Layout::Rows16).block, (256, 1, 1));
        // Every kernel listed once, with its layout's and width's name.
        let all = kernels_of(GgmlType::Q4_K);
        assert_eq!(all.len(), 6);
        for (n, l, w) in all {
            assert_eq!(name(GgmlType::Q4_K, w as usize, l), Some(n));
        }
        // H100 (264 slots), 32 tokens: 4096x4096 is 32 blocks, 8 splits (256 blocks:
        // 97% of a wave); 14336 rows are 112 blocks, 2 splits (224: 85%, where 3 made
        // 336, a wave and a quarter); 28672 rows one (224); K 14336 at 32 tokens, 7
        // splits of 8 tiles (224); 1024 rows cannot fill a wave: the best, 8 splits.
        assert_eq!(splits(4096, 16, 32, 132), 8);
        assert_eq!(splits(14336, 16, 32, 132), 2);
        assert_eq!(splits(28672, 16, 32, 132), 1);
        assert_eq!(splits(4096, 56, 32, 132), 7);
        assert_eq!(splits(1024, 16, 32, 132), 8);
        // 64 tokens are two token blocks: 14336 rows fill 85% of a wave unsplit.
        assert_eq!(splits(14336, 16, 64, 132), 1);
        assert_eq!(splits(4096, 56, 64, 132), 4);
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
    fn every_narrow_gemm_builds_within_static_shared_memory() {
        let names: Vec<&str> = TYPES[0].1.iter().flatten().copied().collect();
        crate::catalog::assert_builds(catalog, &names);
    }
}
