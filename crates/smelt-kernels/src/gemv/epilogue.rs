//! The fused GEMVs' epilogues: what a single-token GEMV does after its dot products when
//! its [`Config`] fuses a neighbour's work in: the rope + KV-cache append of the Q|K|V
//! GEMV ([`Config::rope_kv`]), the residual add and split RMS norm of the producer half
//! (`Fuse::ResidualNorm`), and the consumer half's `1 / rms` and norm output
//! (`Fuse::RmsInput`), with the loads they issue before the main loop. Kept apart from the
//! kernel body (`gemv.rs`), which only declares their parameters and calls them.

use smelt_ptx::{Cmp, Exact, FloatRound, Kernel, Load, Narrow, Reg, Store, F16, F32, U32, U64};

use super::{Config, RopeKvRegs, MAX_PARTS, NORM_ROWS_PER_CTA};
use crate::act;
use crate::fused::quantize_warp_block;
use crate::TILE;

/// The parameters of the rope + KV-append epilogue ([`Config::rope_kv`]).
pub(super) struct RopeKv {
    pos: Reg<U64>,
    freq_factors: Reg<U64>,
    k_cache: Reg<U64>,
    v_cache: Reg<U64>,
    seqs: Reg<U64>,
    tables: Reg<U64>,
    q_rows: Reg<U32>,
    kv_dim: Reg<U32>,
    head_dim: Reg<U32>,
    block_size: Reg<U32>,
    theta_scale: Reg<F32>,
    freq_scale: Reg<F32>,
}

/// Where the token's K and V go, and its position, loaded before the wait.
pub(super) struct RopeSlot {
    pos: Reg<U32>,
    /// Element index of the slot's row in either cache.
    base: Reg<U64>,
}

impl RopeKv {
    pub(super) fn params(k: &Kernel) -> Self {
        let r = RopeKvRegs::declare(k);
        Self {
            pos: r.pos,
            freq_factors: r.freq_factors,
            k_cache: r.k_cache,
            v_cache: r.v_cache,
            seqs: r.seqs,
            tables: r.block_tables,
            q_rows: r.q_rows,
            kv_dim: r.kv_dim,
            head_dim: r.head_dim,
            block_size: r.block_size,
            theta_scale: r.theta_scale,
            freq_scale: r.freq_scale,
        }
    }

    /// The token's position and cache slot, found as `rope_kv_rows_kernel` finds them.
    pub(super) fn slot(&self, k: &Kernel) -> RopeSlot {
        let pos = k.load::<U32>(Load::GLOBAL_NC, self.pos);
        let w = k.regs::<U32, 4>();
        k.ld_v4(Load::GLOBAL_NC, w, self.seqs);
        let (start, bto) = (w[2], w[3]);
        let bi = k.div_int(k.reg(), start, self.block_size);
        let off = k.rem(k.reg(), start, self.block_size);
        let ti = k.add(k.reg(), bto, bi);
        let block = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(self.tables, ti, 4));
        let slot = k.mad(k.reg(), block, self.block_size, off);
        RopeSlot {
            pos,
            base: k.mul_wide(k.reg::<U64>(), slot, self.kv_dim),
        }
    }

    /// Rotates the warp's rows `first_row`, `first_row + 1` (`y0`, `y1`, in place) when
    /// they are a Q or K pair, and stores K and V rows as f16 at the slot (lane 0): the
    /// operations of `rope_kv_rows_kernel`, on the values it would have read back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn epilogue(
        &self,
        k: &Kernel,
        slot: &RopeSlot,
        first_row: Reg<U32>,
        nrows: Reg<U32>,
        lane: Reg<U32>,
        y0: Reg<F32>,
        y1: Reg<F32>,
    ) {
        let rot_end = k.add(k.reg(), self.q_rows, self.kv_dim);
        let rotated = k.lt(first_row, rot_end);
        k.if_(rotated, |k| {
            let within = k.rem(k.reg(), first_row, self.head_dim);
            let pair = k.shr(k.reg(), within, 1u32);
            let (sin, cos) = crate::ops::rope::angle(
                k,
                slot.pos,
                pair,
                self.freq_factors,
                self.theta_scale,
                self.freq_scale,
            );
            let (r0, r1) = crate::ops::rope::rotate(k, y0, y1, sin, cos);
            k.mov(y0, r0);
            k.mov(y1, r1);
        });
        let store = k.ge(first_row, self.q_rows);
        k.and(store, store, k.lt(first_row, nrows));
        k.and(store, store, k.eq(lane, 0u32));
        k.if_(store, |k| {
            let col = k.sub(k.reg(), first_row, self.q_rows);
            let is_v = k.ge(col, self.kv_dim);
            let vcol = k.sub(k.reg(), col, self.kv_dim);
            k.selp(col, vcol, col, is_v);
            let cache = k.copy(self.k_cache);
            k.selp(cache, self.v_cache, self.k_cache, is_v);
            let e = k.cvt(k.reg::<U64>(), col, Exact);
            k.add(e, e, slot.base);
            k.shl(e, e, 1u32);
            let (h0, h1) = (k.reg::<F16>(), k.reg::<F16>());
            k.cvt(h0, y0, FloatRound::Rn);
            k.cvt(h1, y1, FloatRound::Rn);
            let both = k.reg::<U32>();
            k.raw(format!("mov.b32 {both}, {{{h0}, {h1}}}"));
            k.st(Store::GLOBAL, k.add(k.reg(), cache, e), both);
        });
    }
}

/// The parameters of a fused GEMV's epilogue.
pub(super) enum Fused {
    None,
    ResidualNorm {
        res: Reg<U64>,
        g: Reg<U64>,
        q: Reg<U64>,
        partials: Reg<U64>,
    },
    RmsInput {
        partials: Reg<U64>,
        nparts: Reg<U32>,
        n: Reg<U32>,
        eps: Reg<F32>,
        res: Reg<U64>,
        g: Reg<U64>,
        out: Reg<U64>,
    },
}

/// What the epilogue reads from memory, loaded before the main loop.
pub(super) enum Early {
    None,
    /// Per row of the warp: `res[row]`.
    Rows(Vec<Reg<F32>>),
    /// This lane's partial sums `partials[lane + 32 j]` (0 past `nparts`).
    Parts(Vec<Reg<F32>>),
}

impl Early {
    pub(super) fn load(k: &Kernel, fused: &Fused, rows: &[Reg<U32>], lane: Reg<U32>) -> Self {
        match *fused {
            Fused::None => Early::None,
            Fused::ResidualNorm { res, .. } => Early::Rows(
                rows.iter()
                    // `res` was written by an earlier kernel and is written again by this
                    // one: coherent loads.
                    .map(|&row| k.load::<F32>(Load::GLOBAL, k.elem_addr(res, row, 4)))
                    .collect(),
            ),
            Fused::RmsInput {
                partials, nparts, ..
            } => Early::Parts(
                (0..MAX_PARTS / 32)
                    .map(|j| {
                        let v = k.f32(0.0);
                        let i = k.add(k.reg(), lane, 32 * j);
                        let inside = k.lt(i, nparts);
                        k.guarded(inside, |k| {
                            k.ld(Load::GLOBAL_NC, v, k.elem_addr(partials, i, 4));
                        });
                        v
                    })
                    .collect(),
            ),
        }
    }
}

/// `1 / sqrt(sum(partials) / n + eps)`, the same bits in every lane of every warp: each
/// lane adds its partials in index order, then the warp's butterfly; then the norm
/// kernels' operations (`ops::norm`): IEEE division, `sqrt.rn`, IEEE reciprocal.
pub(crate) fn rms_from_partials(
    k: &Kernel,
    parts: &[Reg<F32>],
    n: Reg<U32>,
    eps: Reg<F32>,
) -> Reg<F32> {
    let acc = k.f32(0.0);
    for &p in parts {
        k.add(acc, acc, p);
    }
    let total = k.warp_sum(acc);
    crate::fused::rms_scale(k, total, n, eps)
}

/// The producer's epilogue: `res[row] += y[row]`; the block's 32 values of `res * g` as one
/// q8_1 block of `q` (unscaled by the RMS) and its sum of `res²` into `partials[block]`;
/// block 0 also zeroes the q8_1 blocks that pad the last tile past `nrows`.
#[allow(clippy::too_many_arguments)]
pub(super) fn residual_norm_epilogue(
    k: &Kernel,
    cfg: Config,
    nrows: Reg<U32>,
    first_row: Reg<U32>,
    lane: Reg<U32>,
    sums: &[Reg<F32>],
    rv: &[Reg<F32>],
    res: Reg<U64>,
    g: Reg<U64>,
    q: Reg<U64>,
    partials: Reg<U64>,
) {
    let vals = k.shared::<F32>("resnorm_v", NORM_ROWS_PER_CTA, 16);
    let squares = k.shared::<F32>("resnorm_sq", NORM_ROWS_PER_CTA, 16);
    let vbase = k.shared_base(&vals);
    let sbase = k.shared_base(&squares);
    let lane0 = k.eq(lane, 0u32);
    for (r, (&s, &old)) in sums.iter().zip(rv).enumerate() {
        let row = k.add(k.reg(), first_row, r as u32);
        let inside = k.lt(row, nrows);
        let gv = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(g, row, 4));
        let nres = k.add(k.reg(), old, s);
        let v = k.mul(k.reg(), nres, gv);
        let sq = k.mul(k.reg(), nres, nres);
        // Rows past the end (never, with whole 32-row blocks) count as zeros.
        k.selp(v, v, 0.0f32, inside);
        k.selp(sq, sq, 0.0f32, inside);
        let store = k.and(k.reg(), inside, lane0);
        k.guarded(store, |k| {
            k.st(Store::GLOBAL, k.elem_addr(res, row, 4), nres)
        });
        let slot = k.mad(k.reg(), k.tid_y(), cfg.rows_per_warp, r as u32);
        let va = k.mad(k.reg(), slot, 4u32, vbase);
        let sa = k.mad(k.reg(), slot, 4u32, sbase);
        k.guarded(lane0, |k| {
            k.st(Store::SHARED, va, v);
            k.st(Store::SHARED, sa, sq);
        });
    }
    k.bar_sync();
    let warp0 = k.eq(k.tid_y(), 0u32);
    k.if_(warp0, |k| {
        let v = k.load::<F32>(Load::SHARED, k.mad(k.reg(), lane, 4u32, vbase));
        let sq = k.load::<F32>(Load::SHARED, k.mad(k.reg(), lane, 4u32, sbase));
        let f = k.mad(k.reg(), k.ctaid_x(), NORM_ROWS_PER_CTA, lane);
        quantize_warp_block(k, v, lane, f, q);
        let total = k.warp_sum(sq);
        k.guarded(lane0, |k| {
            k.st(Store::GLOBAL, k.elem_addr(partials, k.ctaid_x(), 4), total)
        });
    });
    // The last tile's blocks past `nrows` (a row of 576 fills 2.25 tiles): zeros, as the
    // quantize kernel writes them, so the consumer's padded weights meet zeros, not junk.
    let warp1 = k.eq(k.tid_y(), 1u32);
    let block0 = k.eq(k.ctaid_x(), 0u32);
    k.and(warp1, warp1, block0);
    k.if_(warp1, |k| {
        let used = k.shr(k.reg(), nrows, 5u32);
        let ntiles = k.add(k.reg(), nrows, (TILE - 1) as u32);
        k.shr(ntiles, ntiles, 8u32);
        let total = k.shl(k.reg(), ntiles, 3u32);
        let b = k.add(k.reg(), used, lane);
        let pad = k.lt(b, total);
        k.guarded(pad, |k| {
            let tile = k.shr(k.reg(), b, 3u32);
            let slot = k.and(k.reg(), b, 7u32);
            let tdst = k.elem_addr(q, tile, act::TILE_BYTES as u32);
            let qdst = k.add(k.reg(), tdst, k.mul_wide(k.reg::<U64>(), slot, 32u32));
            let z = k.u32(0);
            k.st_v4(Store::GLOBAL, qdst, [z, z, z, z]);
            k.st_v4(Store::GLOBAL, qdst.at(16), [z, z, z, z]);
            let hdst = k.add(k.reg(), tdst, k.mul_wide(k.reg::<U64>(), slot, 2u32));
            for off in [act::D_OFFSET, act::SUM_OFFSET, act::S_OFFSET] {
                k.st_narrow(Store::GLOBAL, Narrow::U16, hdst.at(off as i64), z);
            }
        });
    });
}

/// The consumer's second job: `out[i] = res[i] * inv_rms * g[i]` (the norm kernels'
/// operations and order) for every `i < n`, spread over all threads of the grid.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_norm_output(
    k: &Kernel,
    cfg: Config,
    n: Reg<U32>,
    res: Reg<U64>,
    g: Reg<U64>,
    out: Reg<U64>,
    inv: Reg<F32>,
    lane: Reg<U32>,
) {
    let wanted = k.cmp(Cmp::Ne, out, 0u64);
    k.if_(wanted, |k| {
        let threads = 32 * cfg.warps_per_cta;
        let tid = k.mad(k.reg(), k.tid_y(), 32u32, lane);
        let start = k.mad(k.reg(), k.ctaid_x(), threads, tid);
        let step = k.mul(k.reg(), k.nctaid_x(), threads);
        k.stride_loop(start, n, step, |k, i| {
            let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(res, i, 4));
            let gv = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(g, i, 4));
            k.mul(v, v, inv);
            k.mul(v, v, gv);
            k.st(Store::GLOBAL, k.elem_addr(out, i, 4), v);
        });
    });
}
