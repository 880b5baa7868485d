//! Mixture-of-experts kernels: the plan that groups a step's (token, expert) slots by
//! expert into tiles, the grouped GEMV that multiplies every selected expert of the step in
//! one launch per projection, and the weighted combine of the experts' outputs. The router
//! (its f32 matmul and the top-k) is in [`crate::moe_route`], re-exported here.
//!
//! Everything a step decides lives in device memory: the router writes its expert ids and
//! weights (`route`, `[n][2k]` f32, ids first as the CPU backend lays them out), the plan
//! kernel turns them into tiles, and the grouped GEMV reads the tiles. No launch depends on
//! the ids, only on the step's shape, so a decode step with experts is captured as a CUDA
//! graph like any other.
//!
//! Tiles: the grid of the grouped GEMV has [`max_tiles`] tiles in y; tile `j` is
//! `tile_tokens + 2` words `[expert, count, slot_0 .. slot_{tile_tokens - 1}]`, a count of
//! 0 meaning an unused tile (its blocks exit). A slot is `t * k + i`, the output row of
//! token `t`'s `i`-th expert. Where a slot lands in a tile does not change its result: each
//! slot's dot product is computed alone, in the same order, so the atomically filled
//! tiles give the same bits on every run.

use smelt_ptx::{Dim, IntRound, Kernel, Load, Reg, Shfl, Space, Special, Store};
use smelt_ptx::{F32, FULL_WARP, U32, U64};

use crate::act::{self, ActSlots};
use crate::catalog::Entry;
use crate::formats::{GpuFormat, WeightLoad};
use crate::ops::{kernel_params, Launch};
use crate::{GgmlType, KernelError};

pub(crate) use crate::moe_route::{add_dot4, route_row, RouteRow};
pub use crate::moe_route::{
    dense_cpu, dense_f32_kernel, dense_f32_scalar_kernel, dense_launch, route_cpu, route_kernel,
    route_launch, route_name, DenseArgs, Gating, RouteArgs, DENSE_UNROLL,
};

/// Most experts a layer may have (the router's registers, the plan's shared arrays).
pub const MAX_EXPERTS: usize = 512;
/// Most experts a token may choose (a lane of the router's warp keeps each).
pub const MAX_K: usize = 32;
/// Rows (tokens) per block of the router: one warp each.
pub const ROUTE_WARPS: u32 = 4;
/// Threads of the one-block plan kernel.
pub const PLAN_THREADS: u32 = 256;
/// Warps per block of the grouped GEMV and of the f32 GEMV.
pub const GEMV_WARPS: u32 = 4;
/// Weight rows per warp of the grouped GEMV with `tile_tokens` tokens per tile: two for one
/// token (more loads in flight), one for more (whose accumulators and activations would
/// otherwise spill).
pub fn rows_per_warp(tile_tokens: usize) -> u32 {
    if tile_tokens == 1 {
        2
    } else {
        1
    }
}
/// Tokens per tile the grouped GEMV is emitted for.
pub const TILE_TOKENS: [usize; 4] = [1, 2, 4, 8];
/// Lanes a row of the grouped GEMV takes, one variant each: a warp's 32 lanes cover eight
/// 256-weight tiles a step, so a row of 768 weights (Qwen3-30B-A3B's down projection)
/// would keep 12 of them busy; 16 or 8 lanes a row put two or four rows in a warp instead.
pub const ROW_LANES: [u32; 3] = [32, 16, 8];

/// Tiles of at most this many tokens have lane-group variants (decode; prompts' wider
/// tiles have enough work a row, and most of them run on the grouped GEMM).
pub const GROUPED_LANES_MAX_TOKENS: usize = 2;

/// Lanes a row of `ntiles` tiles takes in a tile of `tile_tokens`: the fewest it fills
/// whole (four a tile; at least 8), else 32. A row that fits its lanes in one step adds its
/// tiles' partial sums in the order the full warp's butterfly does (the other lanes' zeros
/// drop out exactly), so every variant gives the same bits.
pub fn row_lanes(ntiles: usize, tile_tokens: usize) -> u32 {
    if tile_tokens > GROUPED_LANES_MAX_TOKENS {
        return 32;
    }
    ROW_LANES
        .into_iter()
        .rev()
        .find(|&l| ntiles <= (l / 4) as usize)
        .unwrap_or(32)
}

/// The `(tile_tokens, lanes)` pairs the grouped GEMV is emitted for.
pub fn gemv_id_variants() -> impl Iterator<Item = (usize, u32)> {
    TILE_TOKENS.into_iter().flat_map(|t| {
        ROW_LANES
            .into_iter()
            .filter(move |&l| l == 32 || t <= GROUPED_LANES_MAX_TOKENS)
            .map(move |l| (t, l))
    })
}
/// Threads per block of the combine.
pub const COMBINE_THREADS: u32 = 256;

/// Name of [`plan_kernel`].
pub const PLAN: &str = "moe_plan";
/// Name of [`combine_kernel`].
pub const COMBINE: &str = "moe_combine";
/// Name of [`dense_f32_kernel`].
pub const DENSE_F32: &str = "matmul_f32_rows";
/// Name of [`dense_f32_scalar_kernel`] (the first version, kept to be timed beside it).
pub const DENSE_F32_SCALAR: &str = "matmul_f32_rows_scalar";

/// Name of the grouped GEMV for format `F`, `tile_tokens` tokens per tile and `lanes`
/// lanes a row (one of [`ROW_LANES`]).
pub fn gemv_id_name<F: GpuFormat>(tile_tokens: usize, lanes: u32) -> String {
    match lanes {
        32 => format!("moe_gemv_{}_t{tile_tokens}", F::NAME),
        _ => format!("moe_gemv_{}_t{tile_tokens}_l{lanes}", F::NAME),
    }
}

/// Name of the grouped GEMV for weights of type `ty`, `tile_tokens` tokens per tile and
/// `lanes` lanes a row.
pub fn gemv_id(ty: GgmlType, tile_tokens: usize, lanes: u32) -> Result<String, KernelError> {
    crate::catalog::moe_gemv_name(ty, tile_tokens, lanes)
}

/// Tokens per tile for a step of `n_slots` (token, expert) slots over `n_expert` experts:
/// about as many as an expert gets on average (1 at single-sequence decode, 8 for prompts),
/// so a tile reads its expert's weights once for as many tokens as it has.
pub fn tile_tokens(n_slots: usize, n_expert: usize) -> usize {
    let per = n_slots.div_ceil(n_expert.max(1));
    TILE_TOKENS
        .into_iter()
        .find(|&t| t >= per)
        .unwrap_or(TILE_TOKENS[TILE_TOKENS.len() - 1])
}

/// Most tiles the plan can produce: every expert's slots in whole tiles, at most one
/// partial tile per expert that has any.
pub fn max_tiles(n_slots: usize, n_expert: usize, tile_tokens: usize) -> usize {
    (n_slots / tile_tokens + n_expert.min(n_slots)).min(n_slots)
}

/// Words of one tile.
pub fn tile_words(tile_tokens: usize) -> usize {
    tile_tokens + 2
}

/// The kernels of this module that are not per weight format (`catalog::all` adds the
/// grouped GEMV of every GEMV format).
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = [Gating::Softmax, Gating::Sigmoid]
        .into_iter()
        .map(|g| -> Entry {
            (
                route_name(g).to_string(),
                Box::new(move |k: &Kernel| route_kernel(k, g)),
            )
        })
        .collect();
    v.push((PLAN.to_string(), Box::new(plan_kernel)));
    v.push((COMBINE.to_string(), Box::new(combine_kernel)));
    v.push((DENSE_F32.to_string(), Box::new(dense_f32_kernel)));
    v.push((
        DENSE_F32_SCALAR.to_string(),
        Box::new(dense_f32_scalar_kernel),
    ));
    v
}

kernel_params! {
    /// Arguments of [`plan_kernel`].
    PlanArgs, PlanRegs {
        route: Ptr,
        tiles: Ptr,
        n_slots: U32,
        k: U32,
        n_expert: U32,
        tile_tokens: U32,
        max_tiles: U32,
    }
}

/// Launch of [`plan_kernel`]: one block.
pub fn plan_launch() -> Launch {
    Launch::new((1, 1, 1), (PLAN_THREADS, 1, 1))
}

/// Groups the `n_slots = n * k` slots of `route` (`[n][2k]`, ids first) by expert into
/// tiles of at most `tile_tokens` slots (layout in the module doc), experts in ascending
/// order, and marks the tiles past the last used one, up to `max_tiles`, unused.
///
/// Parameters: `route, tiles, n_slots, k, n_expert, tile_tokens, max_tiles`.
/// Launch: [`plan_launch`].
pub fn plan_kernel(k: &Kernel) {
    k.max_threads(PLAN_THREADS, 1, 1);
    let p = PlanRegs::declare(k);
    let counts = k.shared::<U32>("counts", MAX_EXPERTS as u32, 16);
    let starts = k.shared::<U32>("starts", MAX_EXPERTS as u32, 16);
    let cursor = k.shared::<U32>("cursor", MAX_EXPERTS as u32, 16);
    let total = k.shared::<U32>("total", 4, 16);
    let (cb, sb, ub) = (
        k.shared_base(&counts),
        k.shared_base(&starts),
        k.shared_base(&cursor),
    );
    let at = |k: &Kernel, base: Reg<U32>, i: Reg<U32>| k.mad(k.reg(), i, 4u32, base);
    let tid = k.tid_x();
    let tw = k.add(k.reg(), p.tile_tokens, 2u32);
    let two_k = k.add(k.reg(), p.k, p.k);
    let last_expert = k.sub(k.reg(), p.n_expert, 1u32);
    let expert_of = |k: &Kernel, s: Reg<U32>| {
        let t = k.div_int(k.reg(), s, p.k);
        let i = k.rem(k.reg(), s, p.k);
        let idx = k.mad(k.reg(), t, two_k, i);
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.route, idx, 4));
        let e = k.cvt(k.reg::<U32>(), v, IntRound::Rzi);
        k.min(e, e, last_expert)
    };
    let ntiles_of = |k: &Kernel, c: Reg<U32>| {
        let n = k.add(k.reg(), c, p.tile_tokens);
        k.sub(n, n, 1u32);
        k.div_int(n, n, p.tile_tokens)
    };
    k.stride_loop(tid, p.n_expert, PLAN_THREADS, |k, e| {
        let z = k.u32(0);
        k.st(Store::SHARED, at(k, cb, e), z);
        k.st(Store::SHARED, at(k, ub, e), z);
    });
    k.bar_sync();
    k.stride_loop(tid, p.n_slots, PLAN_THREADS, |k, s| {
        let e = expert_of(k, s);
        k.red_add::<U32>(Space::Shared, at(k, cb, e), 1u32);
    });
    k.bar_sync();
    // Warp 0 scans the tile counts: each lane a run of experts, then the lanes' totals.
    let warp0 = k.lt(tid, 32u32);
    k.if_(warp0, |k| {
        let per = k.add(k.reg(), p.n_expert, 31u32);
        k.shr(per, per, 5u32);
        let lo = k.mul(k.reg(), tid, per);
        k.min(lo, lo, p.n_expert);
        let hi = k.add(k.reg(), lo, per);
        k.min(hi, hi, p.n_expert);
        let local = k.u32(0);
        k.stride_loop(lo, hi, 1u32, |k, e| {
            let c = k.load::<U32>(Load::SHARED, at(k, cb, e));
            let t = ntiles_of(k, c);
            k.add(local, local, t);
        });
        let incl = k.copy(local);
        for off in [1u32, 2, 4, 8, 16] {
            let o = k.shfl_sync(Shfl::Up, k.reg(), incl, off, FULL_WARP);
            let take = k.ge(tid, off);
            let z = k.u32(0);
            k.selp(o, o, z, take);
            k.add(incl, incl, o);
        }
        let run = k.sub(k.reg(), incl, local);
        k.stride_loop(lo, hi, 1u32, |k, e| {
            k.st(Store::SHARED, at(k, sb, e), run);
            let c = k.load::<U32>(Load::SHARED, at(k, cb, e));
            let t = ntiles_of(k, c);
            k.add(run, run, t);
        });
        let last = k.eq(tid, 31u32);
        k.if_(last, |k| k.st(Store::SHARED, total.at(0), incl));
    });
    k.bar_sync();
    // Tile headers: expert and count of each used tile, count 0 for the rest.
    k.stride_loop(tid, p.n_expert, PLAN_THREADS, |k, e| {
        let c = k.load::<U32>(Load::SHARED, at(k, cb, e));
        let first = k.load::<U32>(Load::SHARED, at(k, sb, e));
        let nt = ntiles_of(k, c);
        k.for_count(nt, |k, j| {
            let tile = k.add(k.reg(), first, j);
            let desc = k.elem_addr(p.tiles, k.mul(k.reg(), tile, tw), 4);
            let done = k.mul(k.reg(), j, p.tile_tokens);
            let left = k.sub(k.reg(), c, done);
            k.min(left, left, p.tile_tokens);
            k.st(Store::GLOBAL, desc, e);
            k.st(Store::GLOBAL, desc.at(4), left);
        });
    });
    let used = k.load::<U32>(Load::SHARED, total.at(0));
    let from = k.add(k.reg(), used, tid);
    k.stride_loop(from, p.max_tiles, PLAN_THREADS, |k, j| {
        let desc = k.elem_addr(p.tiles, k.mul(k.reg(), j, tw), 4);
        let z = k.u32(0);
        k.st(Store::GLOBAL, desc, z);
        k.st(Store::GLOBAL, desc.at(4), z);
    });
    // Slots into their expert's tiles.
    k.stride_loop(tid, p.n_slots, PLAN_THREADS, |k, s| {
        let e = expert_of(k, s);
        let pos = k.atom_add(Space::Shared, k.reg::<U32>(), at(k, ub, e), 1u32);
        let first = k.load::<U32>(Load::SHARED, at(k, sb, e));
        let j = k.div_int(k.reg(), pos, p.tile_tokens);
        let l = k.rem(k.reg(), pos, p.tile_tokens);
        let tile = k.add(k.reg(), first, j);
        let w = k.mad(k.reg(), tile, tw, l);
        k.add(w, w, 2u32);
        k.st(Store::GLOBAL, k.elem_addr(p.tiles, w, 4), s);
    });
}

/// CPU twin of [`plan_kernel`] up to the order of slots inside an expert's tiles (which
/// the GPU fills atomically): for each used tile, `(expert, sorted slots)`, in tile order.
pub fn plan_cpu(ids: &[u32], n_expert: usize, tile_tokens: usize) -> Vec<(u32, Vec<u32>)> {
    let mut by: Vec<Vec<u32>> = vec![Vec::new(); n_expert];
    for (s, &e) in ids.iter().enumerate() {
        by[(e as usize).min(n_expert - 1)].push(s as u32);
    }
    let mut out = Vec::new();
    for (e, slots) in by.into_iter().enumerate() {
        for c in slots.chunks(tile_tokens) {
            out.push((e as u32, c.to_vec()));
        }
    }
    out
}

/// Reads the GPU plan's tiles (`words` as written) into [`plan_cpu`]'s shape, each tile's
/// slots sorted; stops at the first unused tile and checks that every later one is unused.
pub fn read_plan(words: &[u32], tile_tokens: usize) -> Result<Vec<(u32, Vec<u32>)>, String> {
    let tw = tile_words(tile_tokens);
    let mut out = Vec::new();
    let mut ended = false;
    for (j, t) in words.chunks_exact(tw).enumerate() {
        let count = t[1] as usize;
        if count == 0 {
            ended = true;
            continue;
        }
        if ended || count > tile_tokens {
            return Err(format!(
                "tile {j}: count {count} after the end or too large"
            ));
        }
        let mut s = t[2..2 + count].to_vec();
        s.sort_unstable();
        out.push((t[0], s));
    }
    Ok(out)
}

kernel_params! {
    /// Arguments of the grouped GEMV ([`gemv_id_kernel`]).
    GemvIdArgs, GemvIdRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        tiles: Ptr,
        nrows: U32,
        ntiles: U32,
        row_bytes: U32,
        expert_bytes: U32,
        x_div: U32,
        k: U32,
        w2: Ptr,
        y2: Ptr,
    }
}

/// Launch of the grouped GEMV: `nrows` rows per expert, `max_tiles` tiles of
/// `tile_tokens` tokens (with one token per tile, one tile per slot), `pair`: two weight
/// arrays of the same shape (gate and up) in one launch.
pub fn gemv_id_launch(
    nrows: usize,
    max_tiles: usize,
    tile_tokens: usize,
    pair: bool,
    lanes: u32,
) -> Launch {
    let per_cta = (GEMV_WARPS * rows_per_warp(tile_tokens) * (32 / lanes)) as usize;
    Launch::new(
        (
            nrows.div_ceil(per_cta).max(1) as u32,
            max_tiles.max(1) as u32,
            1 + pair as u32,
        ),
        (32, GEMV_WARPS, 1),
    )
}

/// `y[s][r] = W[e][r] . x[s / x_div]` for every slot `s` of every tile (expert `e`): the
/// GEMV's dot products (`gemv::kernel`, format `F`), weights of expert `e` at
/// `w + e * expert_bytes`, activations as q8_1 tiles (`ntiles` per row), one row per token
/// (`x_div = k`) or per slot (`x_div = 1`). Each block owns [`GEMV_WARPS`] x
/// [`rows_per_warp`] rows of one tile, reading those rows' weights once for all its slots.
///
/// With one token per tile there is no plan: `tiles` is the route itself (`[n][2k]`, `k`
/// experts per token) and tile `j` is slot `j`. Blocks with `ctaid.z = 1` multiply the
/// second weight array `w2` into `y2` (same shapes: gate and up in one launch).
///
/// With `lanes` under 32 a warp's lanes are `32 / lanes` groups, each owning its own
/// rows ([`row_lanes`]: for rows of at most `lanes / 4` tiles).
///
/// Parameters: `w, x, y, tiles, nrows, ntiles, row_bytes, expert_bytes, x_div, k, w2, y2`.
/// Launch: [`gemv_id_launch`].
pub fn gemv_id_kernel<F: GpuFormat>(k: &Kernel, tile_tokens: usize, lanes: u32) {
    if !TILE_TOKENS.contains(&tile_tokens) {
        k.reject(format!(
            "{tile_tokens} tokens per tile: one of {TILE_TOKENS:?}"
        ));
        return;
    }
    if !gemv_id_variants().any(|v| v == (tile_tokens, lanes)) {
        k.reject(format!(
            "{lanes} lanes a row at {tile_tokens} tokens a tile: not a variant (moe::gemv_id_variants)"
        ));
        return;
    }
    k.max_threads(32, GEMV_WARPS, 1);
    let a = GemvIdRegs::declare(k);
    let second = k.eq(k.special(Special::Ctaid(Dim::Z)), 1u32);
    k.selp(a.w, a.w2, a.w, second);
    k.selp(a.y, a.y2, a.y, second);
    let tw = (tile_tokens + 2) as u32;
    let desc = k.elem_addr(a.tiles, k.mul(k.reg(), k.ctaid_y(), tw), 4);
    // One token per tile: tile `j` is slot `j`, its expert read from the route.
    let direct = tile_tokens == 1;
    let (expert, count) = if direct {
        let j = k.ctaid_y();
        let t = k.div_int(k.reg(), j, a.k);
        let i = k.rem(k.reg(), j, a.k);
        let two_k = k.add(k.reg(), a.k, a.k);
        let at = k.mad(k.reg(), t, two_k, i);
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(a.tiles, at, 4));
        (k.cvt(k.reg::<U32>(), v, IntRound::Rzi), k.u32(1))
    } else {
        let e = k.load::<U32>(Load::GLOBAL, desc);
        let c = k.load::<U32>(Load::GLOBAL, desc.at(4));
        k.exit_if(k.eq(c, 0u32));
        (e, c)
    };
    let warp = k.mad(k.reg(), k.ctaid_x(), GEMV_WARPS, k.tid_y());
    let nr = rows_per_warp(tile_tokens);
    let groups = 32 / lanes;
    let lane = k.tid_x();
    // The warp leaves whole (its shuffles need every lane); a group past the last row
    // computes the last row again and stores nothing. Whole-warp rows emit what they did
    // before the groups.
    let (first_row, in_group) = if groups == 1 {
        let first_row = k.mul(k.reg(), warp, nr);
        k.exit_if(k.ge(first_row, a.nrows));
        (first_row, lane)
    } else {
        let warp_row = k.mul(k.reg(), warp, nr * groups);
        k.exit_if(k.ge(warp_row, a.nrows));
        let group = k.shr(k.reg(), lane, lanes.trailing_zeros());
        let first_row = k.mad(k.reg(), group, nr, warp_row);
        (first_row, k.and(k.reg(), lane, lanes - 1))
    };
    let last = k.sub(k.reg(), a.nrows, 1u32);
    let wexp = k.add(
        k.reg(),
        a.w,
        k.mul_wide(k.reg::<U64>(), expert, a.expert_bytes),
    );
    let wrows: Vec<_> = (0..nr)
        .map(|r| {
            let row = k.add(k.reg(), first_row, r);
            k.min(row, row, last);
            k.add(k.reg(), wexp, k.mul_wide(k.reg::<U64>(), row, a.row_bytes))
        })
        .collect();
    let part = k.and(k.reg(), lane, 3u32);
    let first = k.shr(k.reg(), in_group, 2u32);
    let setup = F::setup(k, part, a.ntiles);
    let how = WeightLoad { no_l1: false };
    let (b0, b1) = F::act_blocks(k, part);
    let slots = ActSlots::new(k, b0, b1);
    let xrow_bytes = k.mul(k.reg(), a.ntiles, act::TILE_BYTES as u32);
    // Each token's activation row (the first slot's again past `count`); the slots are
    // read again for the stores, which keeps fewer registers live through the loop.
    let tokens: Vec<_> = (0..tile_tokens)
        .map(|t| {
            let valid = k.lt(k.u32(t as u32), count);
            let z = k.u32(0);
            let idx = k.selp(k.reg(), k.u32(t as u32), z, valid);
            let slot = if direct {
                k.ctaid_y()
            } else {
                let at = k.add(k.reg(), idx, 2u32);
                k.load::<U32>(Load::GLOBAL, k.elem_addr(desc, at, 4))
            };
            let xr = k.div_int(k.reg(), slot, a.x_div);
            k.add(k.reg(), a.x, k.mul_wide(k.reg::<U64>(), xr, xrow_bytes))
        })
        .collect();
    let ahead = tile_tokens <= 2;
    let accs: Vec<Vec<_>> = (0..nr)
        .map(|_| (0..tile_tokens).map(|_| k.f32(0.0)).collect())
        .collect();
    k.stride_loop(first, a.ntiles, lanes / 4, |k, tile| {
        let weights: Vec<_> = wrows
            .iter()
            .map(|&wr| F::load(k, &setup, wr, tile, how))
            .collect();
        let off = k.mul_wide(k.reg::<U64>(), tile, act::TILE_BYTES as u32);
        let xs: Vec<_> = if ahead {
            tokens
                .iter()
                .map(|&base| act::load_tile(k, k.add(k.reg(), base, off), &slots))
                .collect()
        } else {
            Vec::new()
        };
        let decoded: Vec<_> = weights.iter().map(|wl| F::decode(k, &setup, wl)).collect();
        for (t, &base) in tokens.iter().enumerate() {
            let later;
            let xa = match xs.get(t) {
                Some(xa) => xa,
                None => {
                    later = act::load_tile(k, k.add(k.reg(), base, off), &slots);
                    &later
                }
            };
            for (dw, acc_r) in decoded.iter().zip(&accs) {
                F::dot(k, &setup, dw, xa, acc_r[t]);
            }
        }
    });
    let lane0 = k.eq(in_group, 0u32);
    for (r, acc_r) in accs.iter().enumerate() {
        let sums: Vec<_> = acc_r.iter().map(|&a| k.group_sum(a, lanes)).collect();
        let row = k.add(k.reg(), first_row, r as u32);
        let store = k.lt(row, a.nrows);
        k.and(store, store, lane0);
        k.if_(store, |k| {
            for (t, s) in sums.iter().enumerate() {
                let valid = k.lt(k.u32(t as u32), count);
                k.if_(valid, |k| {
                    let slot = if direct {
                        k.ctaid_y()
                    } else {
                        k.load::<U32>(Load::GLOBAL, desc.at(4 * (t as i64 + 2)))
                    };
                    let i = k.mad(k.reg(), slot, a.nrows, row);
                    k.st(Store::GLOBAL, k.elem_addr(a.y, i, 4), *s);
                });
            }
        });
    }
}

kernel_params! {
    /// Arguments of [`combine_kernel`].
    CombineArgs, CombineRegs {
        y: Ptr,
        route: Ptr,
        out: Ptr,
        cols: U32,
        k: U32,
        n: U32,
    }
}

/// Launch of [`combine_kernel`] over `n` output values.
pub fn combine_launch(n: usize) -> Launch {
    Launch::new(
        (
            (n.div_ceil(COMBINE_THREADS as usize)).clamp(1, 8192) as u32,
            1,
            1,
        ),
        (COMBINE_THREADS, 1, 1),
    )
}

/// `out[t][c] = sum_i w(t, i) * y[t*k + i][c]`, each product rounded and added in the
/// router's order (the CPU backend's `moe_combine`, bit for bit), for `n = rows * cols`.
///
/// Parameters: `y, route, out, cols, k, n`. Launch: [`combine_launch`].
pub fn combine_kernel(k: &Kernel) {
    k.max_threads(COMBINE_THREADS, 1, 1);
    let c = CombineRegs::declare(k);
    let two_k = k.add(k.reg(), c.k, c.k);
    k.stride_loop(k.global_id_x(), c.n, k.grid_size_x(), |k, i| {
        let t = k.div_int(k.reg(), i, c.cols);
        let col = k.rem(k.reg(), i, c.cols);
        let wrow = k.mad(k.reg(), t, two_k, c.k);
        let yrow = k.mul(k.reg(), t, c.k);
        let term = |k: &Kernel, j: Reg<U32>| {
            let w = k.load::<F32>(
                Load::GLOBAL,
                k.elem_addr(c.route, k.add(k.reg(), wrow, j), 4),
            );
            let r = k.add(k.reg(), yrow, j);
            let v = k.load::<F32>(
                Load::GLOBAL,
                k.elem_addr(c.y, k.mad(k.reg(), r, c.cols, col), 4),
            );
            k.mul(v, v, w)
        };
        let acc = term(k, k.u32(0));
        k.stride_loop(1u32, c.k, 1u32, |k, j| {
            let p = term(k, j);
            k.add(acc, acc, p);
        });
        k.st(Store::GLOBAL, k.elem_addr(c.out, i, 4), acc);
    });
}

/// CPU twin of [`combine_kernel`].
pub fn combine_cpu(y: &[f32], route: &[f32], k: usize, cols: usize) -> Vec<f32> {
    let n = route.len() / (2 * k);
    let mut out = vec![0f32; n * cols];
    for t in 0..n {
        let w = &route[t * 2 * k + k..t * 2 * k + 2 * k];
        for c in 0..cols {
            let mut acc = y[t * k * cols + c] * w[0];
            for (i, &w) in w.iter().enumerate().skip(1) {
                acc += y[(t * k + i) * cols + c] * w;
            }
            out[t * cols + c] = acc;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn rows_of_few_tiles_take_lane_groups_at_decode() {
        // Qwen3-Next-80B's down rows (512 weights), Qwen3-30B-A3B's (768), its gate/up (2048).
        assert_eq!(row_lanes(2, 1), 8);
        assert_eq!(row_lanes(3, 1), 16);
        assert_eq!(row_lanes(4, 2), 16);
        assert_eq!(row_lanes(5, 1), 32);
        assert_eq!(row_lanes(8, 1), 32);
        // Prompt tiles keep whole warps.
        assert_eq!(row_lanes(3, 4), 32);
        // Every choice is an emitted variant, and a row fits its lanes in one step.
        for t in TILE_TOKENS {
            for n in 1..=12 {
                let l = row_lanes(n, t);
                assert!(gemv_id_variants().any(|v| v == (t, l)), "{n} tiles, t{t}");
                assert!(l == 32 || n <= (l / 4) as usize);
            }
        }
        // A warp's rows per block grow with its groups.
        let whole = gemv_id_launch(2048, 8, 1, false, 32);
        let groups = gemv_id_launch(2048, 8, 1, false, 16);
        assert_eq!(whole.grid.0, 2 * groups.grid.0);
    }

    #[test]
    fn kernels_build() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            let gemvs = crate::catalog::all()
                .into_iter()
                .filter(|(n, _)| n.starts_with("moe_gemv_"));
            for (name, build) in catalog().into_iter().chain(gemvs) {
                m.kernel(&name, |k| build(k))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            let ptx = m.to_ptx();
            assert!(ptx.contains(".entry moe_gemv_q4_k_t8("));
            assert!(ptx.contains(".entry moe_plan("));
        }
    }

    #[test]
    fn tiles_cover_every_slot() {
        // Decode: one token, 8 of 128 experts: tiles of one slot.
        assert_eq!(tile_tokens(8, 128), 1);
        assert_eq!(tile_tokens(4096, 128), 8);
        assert_eq!(tile_tokens(256, 128), 2);
        for (n_slots, ne) in [(8, 128), (256, 128), (4096, 128), (5, 4), (64, 8)] {
            let t = tile_tokens(n_slots, ne);
            let max = max_tiles(n_slots, ne, t);
            // The worst case: as many experts as possible with a partial tile.
            let ids: Vec<u32> = (0..n_slots as u32).map(|s| s % ne as u32).collect();
            let plan = plan_cpu(&ids, ne, t);
            assert!(plan.len() <= max, "{n_slots} {ne}: {} > {max}", plan.len());
            let mut all: Vec<u32> = plan.iter().flat_map(|(_, s)| s.clone()).collect();
            all.sort_unstable();
            assert_eq!(all, (0..n_slots as u32).collect::<Vec<_>>());
            assert!(plan.iter().all(|(_, s)| !s.is_empty() && s.len() <= t));
        }
    }

    #[test]
    fn read_plan_stops_at_the_first_unused_tile() {
        let words = [3, 2, 5, 1, 7, 1, 4, 0, 0, 0, 0, 0];
        assert_eq!(
            read_plan(&words, 2).unwrap(),
            vec![(3, vec![1, 5]), (7, vec![4])]
        );
        assert!(read_plan(&[0, 0, 0, 0, 1, 1, 0, 0], 2).is_err());
    }

    #[test]
    fn twins_route_and_combine() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 0.3, 1.9];
        let r = route_cpu(&logits, 6, Gating::Softmax, 3, true, 1.0);
        assert_eq!(&r[..3], &[1.0, 5.0, 3.0]);
        assert!((r[3..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let y = [1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0];
        let out = combine_cpu(&y, &r, 3, 2);
        assert_eq!(out[0], (1.0 * r[3] + 2.0 * r[4]) + 3.0 * r[5]);
        let d = dense_cpu(&[1.0, 2.0, 3.0, 4.0], &[1.0, 1.0], 2, 2);
        assert_eq!(d, vec![3.0, 7.0]);
    }
}
