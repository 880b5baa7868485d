//! The GEMM for batches of a few dozen tokens (batched decode): weights go from global
//! memory straight into `mma` fragments in registers, with no shared-memory staging.
//!
//! At 16-64 tokens both staged GEMMs ([`super`], [`super::f16`]) run at a fifth of the copy
//! rate (bench/RESULTS.md, 2026-11-26: 14336x4096 Q4_K at 16 tokens 54 us, 10 at the
//! copy rate): every weight is loaded, unpacked, stored to shared memory and read back as a
//! fragment, work that only pays when 128 tokens share it. Here each thread loads exactly
//! the bytes of its own `mma.m16n8k16` A fragments and dequantizes them in registers, as
//! Marlin does for int4 weights, so a weight costs one global load and about two
//! instructions, and the activations (a few KB a tile) come through L1.
//!
//! **Which weights a thread holds.** In a warp, lane `(g, c)` (`g = lane / 4`, `c = lane %
//! 4`) takes, of each 144-byte Q4_K super-block of its four rows (`g`, `g + 8`, `g + 16`,
//! `g + 24` of the warp's 32), the 16-byte header and quant bytes `32 c..32 c + 32`: the
//! weights `64 c + l` (low nibbles, sub-block `2 c`) and `64 c + 32 + l` (high, `2 c + 1`)
//! for `l < 32`, exactly the Q4_K GEMV's share ([`crate::formats::q4_k`]). A tile is then
//! sixteen `k16` steps; in step `(h, t)` the four lanes of a row give the `mma` its 16 K
//! positions as lane `c`'s weights `64 c + 32 h + 4 t + 0..4`. The `mma` does not care which
//! physical K a logical K is, only that A and B agree: the activation rows of
//! [`super::f16::act_kernel`] (values `0, 2, 1, 3` of every four) put exactly the matching
//! values in lane `(g, c)`'s two B registers, one 8-byte load at the same offset.
//!
//! **Shape.** A block of [`THREADS`] threads owns [`BM`] rows x `8 NI` tokens: four row
//! warps of 32 rows (two `m16` tiles, so each B fragment feeds two `mma`s) times
//! [`K_WARPS`] warps that take alternate tiles of the block's K slice and add their sums
//! in shared memory at the end, in a fixed order. Loads of the next tile pair are issued
//! before this pair's products (two register sets). Split K and its reduce are the other
//! GEMMs' ([`super::Args`] with [`splits`]).
//!
//! **Status**: correct (`gpu_check --gemm-f16`: 28 ragged cases within 1.8e-6 of the
//! twin; `cuda_parity` passes with it on) but not yet faster; see [`MAX_TOKENS`].
//!
//! CPU twin: [`super::f16::cpu_with_magnitude`] (the weights are the f16 GEMM's to the
//! bit: the same `q * A + B` with `A`, `B` rounded to halves; only the f32 summation
//! order differs).

use smelt_ptx::{FloatRound, Kernel, Load, MmaFloat, Reg, Store, B32, F32, U32, U64};

use super::f16::{dequant_pair, nibble_pair};
use super::{split_range, store_outputs, GemmRegs, Out, Rows};
use crate::formats::q4_k::{decode_header, setup_with_quants_at};
use crate::formats::{ld_weights, WeightLoad};
use crate::ops::Launch;
use crate::{GgmlType, TILE};

/// Warps of a block along the rows, each of [`WARP_ROWS`] rows.
pub const ROW_WARPS: u32 = 4;
/// Rows of one warp: two `m16` tiles.
pub const WARP_ROWS: u32 = 32;
/// Rows of W per block.
pub const BM: u32 = ROW_WARPS * WARP_ROWS;
/// Warps of a block along K: warp `kw` takes tiles `first + kw, first + kw + K_WARPS, ...`.
pub const K_WARPS: u32 = 2;
/// Threads per block.
pub const THREADS: u32 = 32 * ROW_WARPS * K_WARPS;
/// `m16` tiles of a warp.
const MI: usize = 2;
/// Bytes of a Q4_K super-block.
const BLOCK: u32 = 144;

/// The engine's default: batches of at most this many tokens take this GEMM. None do:
/// on an H100 (bench/RESULTS.md, 2026-11-26 21:20 UTC) it beat the int8 GEMM only at 16
/// tokens on the large matrices (14336x4096: 41 against 54 us), and whole batched-decode
/// steps were slower at every size (0.93x at 16 sequences, 0.69x at 32, 0.52x at 64): its
/// time grows with the tokens, so it is bound by latency in the loop (activation loads
/// from L2 each step group, one 256-thread block an SM at ~250 registers), not by the
/// weights. `SMELT_CUDA_GEMM_NARROW_MAX` turns it on for the next measurement.
pub const MAX_TOKENS: usize = 0;

/// Formats with a narrow GEMM, and their kernels for blocks of 16 and of 32 tokens.
pub const TYPES: [(GgmlType, [&str; 2]); 1] =
    [(GgmlType::Q4_K, ["gemm_narrow16_q4_k", "gemm_narrow32_q4_k"])];

/// The kernel for `ntok` tokens of type `ty`, if there is one: blocks of 16 tokens up to
/// 16, else of 32.
pub fn name(ty: GgmlType, ntok: usize) -> Option<&'static str> {
    let (_, names) = TYPES.iter().find(|(t, _)| *t == ty)?;
    Some(if ntok <= 16 { names[0] } else { names[1] })
}

/// Tokens per block of the kernel `name` picks for `ntok`.
pub fn block_tokens(ntok: usize) -> u32 {
    if ntok <= 16 {
        16
    } else {
        32
    }
}

/// The narrow GEMMs, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    let [n16, n32] = TYPES[0].1;
    vec![
        (n16.to_string(), Box::new(kernel::<2>)),
        (n32.to_string(), Box::new(kernel::<4>)),
    ]
}

/// Splits of the K range: enough blocks for one on every SM (a block holds ~200
/// registers a thread, so an SM runs one), each warp at least two tiles.
pub fn splits(nrows: usize, ntiles: usize, ntok: usize, sm_count: usize) -> usize {
    let blocks =
        nrows.div_ceil(BM as usize).max(1) * ntok.div_ceil(block_tokens(ntok) as usize).max(1);
    let want = sm_count.div_ceil(blocks);
    want.clamp(1, (ntiles / (2 * K_WARPS as usize)).max(1))
}

/// The launch of a narrow GEMM for `a` (token blocks fastest, so blocks sharing rows run
/// together and the second reads the weights from L2).
pub fn launch(a: &super::Args) -> Launch {
    Launch::new(
        (
            a.ntok.div_ceil(block_tokens(a.ntok as usize)).max(1),
            a.nrows.div_ceil(BM).max(1),
            a.ntiles.div_ceil(a.kslice()).max(1),
        ),
        (THREADS, 1, 1),
    )
}

/// One tile's loads of a thread's four rows: each row's header, then its 32 quant bytes.
struct Set {
    hdr: [[Reg<U32>; 4]; 4],
    qs: [[Reg<U32>; 8]; 4],
}

/// `y = W x` for Q4_K weights `w` and f16 activation rows `x` ([`super::f16::act_kernel`])
/// in blocks of `8 NI` tokens; see the module doc. Parameters [`super::GemmArgs`].
pub fn kernel<const NI: usize>(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
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
    let red_s = k.shared::<F32>("narrow_sum", (MI * NI * 4) as u32 * ROW_WARPS * 32, 16);
    let red = k.shared_base(&red_s);

    let tid = k.tid_x();
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane = k.and(k.reg(), tid, 31u32);
    let g = k.shr(k.reg(), lane, 2u32);
    let c = k.and(k.reg(), lane, 3u32);
    let rw = k.and(k.reg(), warp, ROW_WARPS - 1);
    let kw = k.shr(k.reg(), warp, ROW_WARPS.trailing_zeros());
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
    let arow = k.mad(k.reg(), rw, WARP_ROWS, g);
    let row_at: [Reg<U64>; 4] = std::array::from_fn(|r| {
        let local = k.add(k.reg(), arow, 8 * r as u32);
        rows.row(k, local)
    });
    let setup = setup_with_quants_at(k, c, 16);
    // The thread's tokens (one an n-tile, clamped to the last: their outputs are never
    // stored), at its quarter of each tile's halves.
    let last_tok = k.sub(k.reg(), ntok, 1u32);
    let tok_stride = k.mul(k.reg(), ntiles, (TILE * 2) as u32);
    let x_at: [Reg<U64>; NI] = std::array::from_fn(|ni| {
        let t = k.add(k.reg(), tok0, g);
        k.add(t, t, 8 * ni as u32);
        k.min(t, t, last_tok);
        let a = k.add(k.reg(), x, k.mul_wide(k.reg::<U64>(), t, tok_stride));
        k.add(a, a, k.mul_wide(k.reg::<U64>(), c, 128u32))
    });

    let acc: [[[Reg<F32>; 4]; NI]; MI] =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));
    let sets: [Set; 2] = std::array::from_fn(|_| Set {
        hdr: std::array::from_fn(|_| k.regs::<U32, 4>()),
        qs: std::array::from_fn(|_| k.regs::<U32, 8>()),
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
    let compute = |k: &Kernel, set: &Set, tile: Reg<U32>| {
        // The rows' group terms A = d sc, B = -dmin m of sub-blocks 2c + h, as halves.
        let coef: [[(Reg<B32>, Reg<B32>); 2]; 4] = std::array::from_fn(|r| {
            let hd = decode_header(k, &setup, set.hdr[r]);
            std::array::from_fn(|h| {
                let sc = k.cvt(k.reg::<F32>(), hd.scale[h], FloatRound::Rn);
                let m = k.cvt(k.reg::<F32>(), hd.min[h], FloatRound::Rn);
                let a = k.mul(k.reg(), hd.d, sc);
                let b = k.mul(k.reg(), hd.neg_dmin, m);
                (k.cvt_f16x2(k.reg(), a, a), k.cvt_f16x2(k.reg(), b, b))
            })
        });
        let toff = k.mul_wide(k.reg::<U64>(), tile, (TILE * 2) as u32);
        let xt: [Reg<U64>; NI] = std::array::from_fn(|ni| k.add(k.reg(), x_at[ni], toff));
        // `h` picks both the group terms of each row and the nibbles.
        #[allow(clippy::needless_range_loop)]
        for h in 0..2usize {
            let (sa, sb) = if h == 0 { (0, 8) } else { (4, 12) };
            for tq in 0..2usize {
                // Halves 64 c + 32 h + 16 tq..+16 of each token: steps t = 4 tq..4 tq + 4.
                let bq: [[Reg<B32>; 8]; NI] = std::array::from_fn(|ni| {
                    let v = k.regs::<B32, 8>();
                    let at = (64 * h + 32 * tq) as i64;
                    k.ld_v4(Load::GLOBAL_NC, [v[0], v[1], v[2], v[3]], xt[ni].at(at));
                    k.ld_v4(
                        Load::GLOBAL_NC,
                        [v[4], v[5], v[6], v[7]],
                        xt[ni].at(at + 16),
                    );
                    v
                });
                for ti in 0..4usize {
                    let t = 4 * tq + ti;
                    for (mi, acc_m) in acc.iter().enumerate() {
                        let (r0, r1) = (2 * mi, 2 * mi + 1);
                        let frag = |r: usize, shift: u32| {
                            let (a, b) = coef[r][h];
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
        }
    };

    // This block's split: tiles [first, end); warp kw takes first + kw, + 2 K_WARPS, ...
    // in pairs (set 0, set 1), the next pair's loads issued before this pair's products
    // end. Loads past the end read the last tile again and are never used.
    let (first, end, y) = split_range(k, y, nrows, ntok, ntiles, kslice);
    let last_tile = k.sub(k.reg(), end, 1u32);
    let clamp = |k: &Kernel, t: Reg<U32>, ahead: u32| {
        let a = k.add(k.reg(), t, ahead);
        k.min(a, a, last_tile)
    };
    let t0 = k.add(k.reg(), first, kw);
    k.grid_dep_wait();
    load(k, &sets[0], clamp(k, t0, 0));
    load(k, &sets[1], clamp(k, t0, K_WARPS));
    k.stride_loop(t0, end, 2 * K_WARPS, |k, t| {
        compute(k, &sets[0], t);
        load(k, &sets[0], clamp(k, t, 2 * K_WARPS));
        let t1 = k.add(k.reg(), t, K_WARPS);
        k.if_(k.lt(t1, end), |k| compute(k, &sets[1], t1));
        load(k, &sets[1], clamp(k, t, 3 * K_WARPS));
    });

    // K warps 1.. leave their sums in shared memory (value e of the thread at e * 128 +
    // its index among the row warps: conflict-free), warp 0 adds them in order and stores.
    let slot = k.mad(k.reg(), rw, 32u32, lane);
    let slot_at = k.mad(k.reg(), slot, 4u32, red);
    let flat: Vec<Reg<F32>> = acc.iter().flatten().flatten().copied().collect();
    for kwi in 1..K_WARPS {
        k.if_(k.cmp(smelt_ptx::Cmp::Eq, kw, kwi), |k| {
            for (e, &v) in flat.iter().enumerate() {
                k.st(
                    Store::SHARED,
                    slot_at.at((e as u32 * ROW_WARPS * 128) as i64),
                    v,
                );
            }
        });
        k.bar_sync();
        k.if_(k.cmp(smelt_ptx::Cmp::Eq, kw, 0u32), |k| {
            for (e, &v) in flat.iter().enumerate() {
                let o = k.ld(
                    Load::SHARED,
                    k.reg::<F32>(),
                    slot_at.at((e as u32 * ROW_WARPS * 128) as i64),
                );
                k.add(v, v, o);
            }
        });
        k.bar_sync();
    }
    k.exit_if(k.cmp(smelt_ptx::Cmp::Ne, kw, 0u32));
    store_outputs(
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
        assert_eq!(name(GgmlType::Q4_K, 16), Some("gemm_narrow16_q4_k"));
        assert_eq!(name(GgmlType::Q4_K, 17), Some("gemm_narrow32_q4_k"));
        assert_eq!(name(GgmlType::Q6_K, 16), None);
        let a = super::super::Args::q4_k_for_test(4097, 40, 16);
        let l = launch(&a);
        assert_eq!(l.grid, (2, 33, 4));
        assert_eq!(l.block, (256, 1, 1));
        // H100, 32 tokens: 4096x4096 is 32 blocks, four splits of four tiles (each warp
        // two); 14336 rows fill the GPU alone.
        assert_eq!(splits(4096, 16, 32, 132), 4);
        assert_eq!(splits(14336, 16, 32, 132), 2);
        assert_eq!(splits(28672, 16, 32, 132), 1);
        assert_eq!(splits(4096, 56, 64, 132), 3);
    }

    #[test]
    fn every_narrow_gemm_builds_within_static_shared_memory() {
        crate::catalog::assert_builds(catalog, &TYPES[0].1);
    }
}
