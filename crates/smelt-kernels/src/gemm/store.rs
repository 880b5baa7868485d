//! Where a GEMM block's results go: the block's slice of the K range and of the split
//! workspace ([`split_range`]), and the stores of a warp's `mma` accumulators to the output
//! ([`store_outputs`], [`Out`]). Shared by the int8 (`int8.rs`), f16 and grouped GEMMs and
//! by the split fix-up, so it lives beside them rather than in any one kernel body.

use smelt_ptx::{Kernel, Load, Pred, Reg, Store, F32, U32, U64};

/// This block's split of the K range: tiles `[first, end)`, and `y` moved to split z of
/// the workspace (both GEMMs).
pub(crate) fn split_range(
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
pub(crate) struct Out {
    pub y: Reg<U64>,
    pub row: Reg<U32>,
    pub tok: Reg<U32>,
    pub nrows: Reg<U32>,
    pub ntok: Reg<U32>,
    /// Gathered tokens (the grouped GEMM, [`grouped`]): token `t`'s outputs go to row
    /// `slots[t]` (a `u32` at `slots + 4 t`) of `y` instead of row `t`.
    ///
    /// [`grouped`]: super::grouped
    pub slots: Option<Reg<U64>>,
}

/// Stores a warp's accumulators, those inside the matrix: accumulator e of (mi, ni) is row
/// `row + 16 mi + 8 (e / 2)`, token `tok + 8 ni + e % 2` (the `mma` C layout).
pub(crate) fn store_outputs<const NI: usize>(k: &Kernel, acc: &[[[Reg<F32>; 4]; NI]], o: Out) {
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
