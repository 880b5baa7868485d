//! Mixture-of-experts decode kernels that fuse what a single-token MoE layer otherwise
//! launches one after another. A Qwen3-30B-A3B decode step was 771 launches (issue 16), of
//! which each of the 48 MoE layers spent seven on its FFN norm, router matmul, routing,
//! expert GEMVs, GLU and combine, each a few microseconds of latency for kilobytes of work:
//!
//! - [`router_kernel`]: the FFN norm's output (from a split residual norm: the residual
//!   row and the per-32-row sums of squares its producer GEMV wrote, `gemv::Fuse`), its
//!   q8_1 tiles for the expert GEMVs, the router's f32 matmul on it, and the softmax or
//!   sigmoid top-k, in one launch: every block normalises the row itself (one `1/rms` from
//!   the partial sums, the bits the `RmsInput` GEMV computes), writes its warps' logits,
//!   and the last block to finish routes (`ops::attention::last_block`'s counter);
//! - [`combine_norm_kernel`]: the weighted combine of the experts' down outputs, the
//!   residual add and the next layer's RMS norm with its q8_1 tiles, in one block per row
//!   (what `moe_combine` then `add_rms_norm_q8_1` computed, the same floats).
//!
//! Both have CPU twins here ([`router_cpu`], [`combine_norm_cpu`]) and cases in the GPU op
//! harness (`examples/gpu_ops`, `-o moefuse`).

use smelt_ptx::{Cmp, Kernel, Load, LoadCache, Pred, Reg, Store, F32, U32};

use crate::catalog::Entry;
use crate::fused::{norm_quantize_row, norm_quantize_tile, rms_scale};
use crate::gemv::{rms_from_partials, MAX_PARTS};
use crate::moe::{
    add_dot4, combine_cpu, dense_cpu, route_cpu, route_row, Gating, RouteRow, MAX_EXPERTS,
};
use crate::ops::attention::last_block;
use crate::ops::{block_sum, kernel_params, reduce_scratch, Launch};
use crate::{KernelError, TILE};

/// Warps per block of [`router_kernel`] (one router row each).
pub const ROUTER_WARPS: u32 = 4;
/// 16-byte loads a lane issues before its first multiply-add in the router's row loop: a
/// pass of 2048 columns, a whole Qwen3-30B-A3B row (four passes of 512 were four DRAM
/// round trips one after another; with one pass, its first loads before the wait and the
/// row in shared memory, the router went from 8.4 to 8.0 us a layer on an H100, and to
/// 6.8 with `moe::route_row`'s registers).
const ROUTER_UNROLL: u32 = 16;
/// One pass of a router row's loads: per 16-byte group, whether it is inside the row, its
/// column and the four weights.
type RouterPass = Vec<(Reg<Pred>, Reg<U32>, [Reg<F32>; 4])>;

/// Widest row the router takes: the normed row is kept in shared memory.
pub const ROUTER_MAX_COLS: usize = 4096;

/// Name of [`router_kernel`] for `g`.
pub fn router_name(g: Gating) -> &'static str {
    match g {
        Gating::Softmax => "moe_router_softmax",
        Gating::Sigmoid => "moe_router_sigmoid",
    }
}

/// Experts whose route weights a thread of [`combine_norm_kernel`] keeps in registers and
/// whose outputs it loads together; any more are added one at a time after them.
const COMBINE_EXPERTS: u32 = 8;
/// Values a thread of [`combine_norm_kernel`] combines a pass, all their loads in flight.
const COMBINE_VALUES: u32 = 2;

/// Name of [`combine_norm_kernel`].
pub const COMBINE_NORM: &str = "moe_combine_add_rms_norm_q8_1";

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = [Gating::Softmax, Gating::Sigmoid]
        .into_iter()
        .map(|g| -> Entry {
            (
                router_name(g).to_string(),
                Box::new(move |k: &Kernel| router_kernel(k, g)),
            )
        })
        .collect();
    v.push((COMBINE_NORM.to_string(), Box::new(combine_norm_kernel)));
    v
}

/// Whether [`router_kernel`] takes a router of `n_expert` rows of `cols` floats choosing
/// `k` experts, with `nparts` partial sums when the input is a split norm (`None`: a plain
/// input row).
pub fn router_fits(n_expert: usize, cols: usize, k: usize, nparts: Option<usize>) -> bool {
    (1..=MAX_EXPERTS).contains(&n_expert)
        && (1..=n_expert.min(crate::moe::MAX_K)).contains(&k)
        && cols > 0
        && cols % 32 == 0
        && cols <= ROUTER_MAX_COLS
        && nparts.is_none_or(|p| (1..=MAX_PARTS as usize).contains(&p))
}

kernel_params! {
    /// Arguments of [`router_kernel`].
    RouterArgs, RouterRegs {
        w: Ptr,
        x: Ptr,
        g: Ptr,
        partials: Ptr,
        out: Ptr,
        q: Ptr,
        logits: Ptr,
        route: Ptr,
        counter: Ptr,
        nparts: U32,
        cols: U32,
        ntiles: U32,
        n_expert: U32,
        k: U32,
        norm: U32,
        normed: U32,
        eps: F32,
        scale: F32,
    }
}

/// Launch of [`router_kernel`]: a warp per router row, and at least a warp per 256-value
/// tile of the normed row.
pub fn router_launch(n_expert: usize, cols: usize) -> Launch {
    let warps = n_expert.max(cols.div_ceil(TILE)).max(1) as u32;
    Launch::new((warps.div_ceil(ROUTER_WARPS), 1, 1), (32, ROUTER_WARPS, 1))
}

/// One token's router in one launch. With `normed != 0` the input is a split residual
/// norm: `h = x * (1 / rms) * g`, `1/rms` from the `nparts` partial sums of `x²` (the
/// `RmsInput` GEMV's scale, the same bits); warp `j < ntiles` also writes tile `j` of `h`
/// to `out` (f32) and `q` (q8_1), as `rms_norm_q8_1` writes them for the same scale. With
/// `normed == 0`, `h = x` (`g` and `partials` are not read; `out` and `q` not written).
/// Then `logits[r] = W[r] . h` (f32, as `moe::dense_f32_kernel` sums it), one warp a row,
/// and the last block to finish routes the row as `moe::route_kernel` does into `route`
/// (`[ids as f32 (k), weights (k)]`). `counter` is one u32, zero between launches (the
/// last block resets it).
///
/// Parameters: [`RouterArgs`]. Launch: [`router_launch`]. `cols` a multiple of 32.
pub fn router_kernel(k: &Kernel, gating: Gating) {
    k.max_threads(32, ROUTER_WARPS, 1);
    let r = RouterRegs::declare(k);
    let hs = k.shared::<F32>("h", ROUTER_MAX_COLS as u32, 16);
    let lane = k.tid_x();
    let gw = k.mad(k.reg(), k.ctaid_x(), ROUTER_WARPS, k.tid_y());
    let in_rows = k.lt(gw, r.n_expert);
    // This warp's router row (warps past the last one read the last row and store nothing).
    let last_row = k.sub(k.reg(), r.n_expert, 1u32);
    let row = k.min(k.reg(), gw, last_row);
    let wr = k.elem_addr(r.w, k.mul(k.reg(), row, r.cols), 4);
    let last = k.sub(k.reg(), r.cols, 4u32);
    let start = k.mul(k.reg(), lane, 4u32);
    // A pass of the row: lane `l` loads columns `c + 4 l + 128 u`.
    let load_pass = |k: &Kernel, c: Reg<U32>| -> RouterPass {
        (0..ROUTER_UNROLL)
            .map(|u| {
                let cu = k.add(k.reg(), c, 128 * u);
                let inside = k.lt(cu, r.cols);
                let at = k.min(k.reg(), cu, last);
                let wv = k.regs::<F32, 4>();
                k.ld_v4(Load::GLOBAL_NC, wv, k.elem_addr(wr, at, 4));
                (inside, at, wv)
            })
            .collect()
    };
    // No kernel writes the router's weights: launched ahead of its input, the warp loads
    // its first pass while the kernel before it runs.
    let early = k.grid_dep().early_work.then(|| load_pass(k, start));
    k.grid_dep_wait();
    let normed = k.cmp(Cmp::Ne, r.normed, 0u32);
    // 1/rms from the producer's partial sums, as the `RmsInput` GEMV computes it; 1 for a
    // plain input.
    let parts: Vec<_> = (0..MAX_PARTS / 32)
        .map(|j| {
            let v = k.f32(0.0);
            let i = k.add(k.reg(), lane, 32 * j);
            let inside = k.lt(i, r.nparts);
            k.and(inside, inside, normed);
            k.guarded(inside, |k| {
                k.ld(Load::GLOBAL_NC, v, k.elem_addr(r.partials, i, 4));
            });
            v
        })
        .collect();
    let rms = rms_from_partials(k, &parts, r.cols, r.eps);
    let scale = k.f32(1.0);
    k.selp(scale, rms, scale, normed);
    // `h` as the norm kernels compute it (`x * scale`, then `* g`), once a block, into
    // shared memory.
    let h_base = k.shared_base(&hs);
    let tid = k.mad(k.reg(), k.tid_y(), 32u32, lane);
    k.stride_loop(
        k.mul(k.reg(), tid, 4u32),
        r.cols,
        32 * ROUTER_WARPS * 4,
        |k, c| {
            let xv = k.regs::<F32, 4>();
            k.ld_v4(Load::GLOBAL, xv, k.elem_addr(r.x, c, 4));
            let gv = k.regs::<F32, 4>();
            k.guarded(normed, |k| {
                k.ld_v4(Load::GLOBAL_NC, gv, k.elem_addr(r.g, c, 4));
            });
            for i in 0..4 {
                k.mul(xv[i], xv[i], scale);
                let gi = k.selp(k.reg(), gv[i], 1.0f32, normed);
                k.mul(xv[i], xv[i], gi);
            }
            k.st_v4(Store::SHARED, k.mad(k.reg(), c, 4u32, h_base), xv);
        },
    );
    k.bar_sync();
    // `logits[row] = W[row] . h`: each 4-column group's fused products, then added in
    // column order (`moe::dense_f32_kernel`'s floats).
    let acc = k.f32(0.0);
    let dot = |k: &Kernel, pass: RouterPass| {
        for (inside, at, wv) in pass {
            let hv = k.regs::<F32, 4>();
            k.ld_v4(Load::SHARED, hv, k.mad(k.reg(), at, 4u32, h_base));
            add_dot4(k, acc, wv, hv, inside);
        }
    };
    let from = match early {
        Some(pass) => {
            dot(k, pass);
            k.add(k.reg(), start, 128 * ROUTER_UNROLL)
        }
        None => start,
    };
    k.stride_loop(from, r.cols, 128 * ROUTER_UNROLL, |k, c| {
        let pass = load_pass(k, c);
        dot(k, pass);
    });
    // All lanes of a warp agree on `in_rows`: no divergence at the shuffles.
    k.if_(in_rows, |k| {
        let s = k.warp_sum(acc);
        k.if_(k.eq(lane, 0u32), |k| {
            k.st(Store::GLOBAL, k.elem_addr(r.logits, gw, 4), s);
        });
    });
    // The normed row's f32 values and q8_1 tiles for the expert GEMVs: a tile a warp.
    let tiles = k.lt(gw, r.ntiles);
    k.and(tiles, tiles, normed);
    k.if_(tiles, |k| {
        norm_quantize_tile(k, r.x, r.out, r.g, r.q, gw, r.cols, scale, lane);
    });
    // The last block routes the logits every block wrote (read through L2).
    let zero = k.u32(0);
    let last = last_block(k, r.counter, zero, k.nctaid_x());
    let warp0 = k.eq(k.tid_y(), 0u32);
    k.and(warp0, warp0, last);
    k.if_(warp0, |k| {
        let p = RouteRow {
            n_expert: r.n_expert,
            k: r.k,
            norm: r.norm,
            scale: r.scale,
        };
        let cg = Load::GLOBAL.cache(LoadCache::Cg);
        route_row(k, gating, cg, r.logits, r.route, &p);
    });
}

/// What [`router_cpu`] routes: the router `w` (`n_expert` rows of `cols`), one input row
/// `x`, and, for a split norm, `(g, scale)`: `h = x * scale * g` (f32, in that order).
pub struct RouterInput<'a> {
    pub w: &'a [f32],
    pub x: &'a [f32],
    pub norm: Option<(&'a [f32], f32)>,
    pub n_expert: usize,
}

/// CPU twin of [`router_kernel`]: `(route, h)` with `route` as `moe::route_cpu` writes it
/// from `moe::dense_cpu`'s logits of `h`.
pub fn router_cpu(
    i: &RouterInput<'_>,
    gating: Gating,
    k: usize,
    norm: bool,
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let h: Vec<f32> = match i.norm {
        Some((g, s)) => i.x.iter().zip(g).map(|(&x, &g)| x * s * g).collect(),
        None => i.x.to_vec(),
    };
    let logits = dense_cpu(i.w, &h, i.n_expert, h.len());
    (route_cpu(&logits, i.n_expert, gating, k, norm, scale), h)
}

kernel_params! {
    /// Arguments of [`combine_norm_kernel`].
    CombineNormArgs, CombineNormRegs {
        x: Ptr,
        y: Ptr,
        route: Ptr,
        w: Ptr,
        out: Ptr,
        q: Ptr,
        n: U32,
        ntiles: U32,
        k: U32,
        eps: F32,
    }
}

/// Launch of [`combine_norm_kernel`] over `rows` tokens of `n` values: `fused::launch`'s
/// block size (the norm's float order depends on it).
pub fn combine_norm_launch(rows: usize, n: usize) -> Launch {
    crate::fused::launch(rows, n)
}

/// Per token `t` (a block): `x[t] += sum_i w(t, i) * y[t*k + i]` (the combine's products
/// rounded and added in the router's order, `moe::combine_kernel`'s floats, then the add),
/// then `out = rms_norm(x) * w` and its q8_1 tiles as `fused::kernel` writes them.
///
/// Parameters: [`CombineNormArgs`] (`route` as the router writes it, `[ids (k), weights
/// (k)]` a token; `n` a multiple of 32, `ntiles = ceil(n / 256)`). Launch:
/// [`combine_norm_launch`]. `out` must not alias `x` or `y`.
pub fn combine_norm_kernel(k: &Kernel) {
    // Up to 1024 threads (rows of 4096): at most 64 registers a thread.
    k.max_threads(1024, 1, 1);
    let r = CombineNormRegs::declare(k);
    let scratch = reduce_scratch(k, "mcomb_red");
    let row = k.ctaid_x();
    let base = k.mul_wide(k.reg(), row, r.n);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), r.x, base);
    let os = k.add(k.reg(), r.out, base);
    let two_k = k.add(k.reg(), r.k, r.k);
    let wrow = k.mad(k.reg(), row, two_k, r.k);
    let yrow = k.mul(k.reg(), row, r.k);
    let tid = k.tid_x();
    let step = k.ntid_x();
    // The route's weights of the first experts, once (each term was two loads, one L2
    // round trip after another: 32 of them a thread at Qwen3-30B-A3B's shape, 6.4 us).
    let ws: Vec<_> = (0..COMBINE_EXPERTS)
        .map(|j| {
            let valid = k.lt(k.u32(j), r.k);
            let w = k.f32(0.0);
            let at = k.elem_addr(r.route, k.add(k.reg(), wrow, j), 4);
            k.guarded(valid, |k| {
                k.ld(Load::GLOBAL, w, at);
            });
            (valid, w)
        })
        .collect();
    let sum = k.f32(0.0);
    let stride = k.mul(k.reg(), step, COMBINE_VALUES);
    k.stride_loop(tid, r.n, stride, |k, i0| {
        // Every load of this pass's values before the first product.
        let values: Vec<_> = (0..COMBINE_VALUES)
            .map(|m| {
                let i = k.mad(k.reg(), step, m, i0);
                let inside = k.lt(i, r.n);
                let a = k.elem_addr(xs, i, 4);
                let x = k.f32(0.0);
                k.guarded(inside, |k| {
                    k.ld(Load::GLOBAL, x, a);
                });
                let ys: Vec<_> = ws
                    .iter()
                    .enumerate()
                    .map(|(j, &(valid, _))| {
                        let load = k.lt(i, r.n);
                        k.and(load, load, valid);
                        let s = k.add(k.reg(), yrow, j as u32);
                        let at = k.elem_addr(r.y, k.mad(k.reg(), s, r.n, i), 4);
                        let y = k.f32(0.0);
                        k.guarded(load, |k| {
                            k.ld(Load::GLOBAL, y, at);
                        });
                        y
                    })
                    .collect();
                (i, inside, a, x, ys)
            })
            .collect();
        for (i, inside, a, x, ys) in values {
            // The router's order: the first product, then each next one added.
            let acc = k.mul(k.reg(), ys[0], ws[0].1);
            for (&y, &(valid, w)) in ys.iter().zip(&ws).skip(1) {
                let p = k.mul(k.reg(), y, w);
                let t = k.add(k.reg(), acc, p);
                k.selp(acc, t, acc, valid);
            }
            k.if_(inside, |k| {
                // Experts past the first [`COMBINE_EXPERTS`], one at a time.
                k.stride_loop(COMBINE_EXPERTS, r.k, 1u32, |k, j| {
                    let wj = k.add(k.reg(), wrow, j);
                    let w = k.load::<F32>(Load::GLOBAL, k.elem_addr(r.route, wj, 4));
                    let s = k.add(k.reg(), yrow, j);
                    let v =
                        k.load::<F32>(Load::GLOBAL, k.elem_addr(r.y, k.mad(k.reg(), s, r.n, i), 4));
                    k.mul(v, v, w);
                    k.add(acc, acc, v);
                });
                k.add(x, x, acc);
                k.st(Store::GLOBAL, a, x);
                k.fma(sum, x, x, sum);
            });
        }
    });
    // The reduction's barriers also make every thread's `x` writes visible to the block.
    let total = block_sum(k, sum, &scratch);
    let scale = rms_scale(k, total, r.n, r.eps);
    norm_quantize_row(k, xs, os, r.w, r.q, row, r.n, r.ntiles, scale);
}

/// CPU twin of [`combine_norm_kernel`]: `x += moe::combine_cpu(y, route)`, then
/// `fused::cpu`'s norm and tiles; returns `(out, q)`.
pub fn combine_norm_cpu(
    x: &mut [f32],
    y: &[f32],
    route: &[f32],
    k: usize,
    w: &[f32],
    eps: f32,
) -> Result<(Vec<f32>, Vec<u8>), KernelError> {
    let c = combine_cpu(y, route, k, w.len());
    for (x, c) in x.iter_mut().zip(&c) {
        *x += c;
    }
    let mut out = vec![0f32; x.len()];
    crate::ops::norm::rms_norm_cpu(x, w, eps, &mut out);
    let q = crate::act::quantize_cpu(&out, w.len())?;
    Ok((out, q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            let ptx = m.to_ptx();
            for g in [Gating::Softmax, Gating::Sigmoid] {
                assert!(ptx.contains(&format!(".entry {}(", router_name(g))));
            }
            assert!(ptx.contains(&format!(".entry {COMBINE_NORM}(")));
            // The last block's counter and its reset.
            assert!(ptx.contains("atom.global.add.u32"));
        }
    }

    #[test]
    fn the_launch_covers_every_row_and_tile() {
        let l = router_launch(128, 2048);
        assert_eq!((l.grid.0 * ROUTER_WARPS, l.block), (128, (32, 4, 1)));
        // More tiles than rows (a small router on a wide row).
        let l = router_launch(4, 4096);
        assert_eq!(l.grid.0 * ROUTER_WARPS, 16);
        assert!(router_fits(128, 2048, 8, Some(64)));
        assert!(router_fits(128, 2048, 8, None));
        assert!(!router_fits(128, 2040, 8, None));
        assert!(!router_fits(600, 2048, 8, None));
        assert!(!router_fits(128, 2048, 8, Some(300)));
        assert!(!router_fits(4, 2048, 5, None));
    }

    #[test]
    fn twins_agree_with_the_unfused_twins() {
        // The router twin on a plain row is dense then route; with a norm, the same on h.
        let (ne, cols) = (6, 64);
        let w: Vec<f32> = (0..ne * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 200.0)
            .collect();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let g: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
        let input = RouterInput {
            w: &w,
            x: &x,
            norm: None,
            n_expert: ne,
        };
        let (route, h) = router_cpu(&input, Gating::Softmax, 2, true, 1.0);
        assert_eq!(h, x);
        let want = route_cpu(
            &dense_cpu(&w, &x, ne, cols),
            ne,
            Gating::Softmax,
            2,
            true,
            1.0,
        );
        assert_eq!(route, want);
        let normed = RouterInput {
            norm: Some((&g, 0.5)),
            ..input
        };
        let (_, h) = router_cpu(&normed, Gating::Sigmoid, 3, false, 2.0);
        assert_eq!(h[3], x[3] * 0.5 * g[3]);
        // The combine twin is combine, add, norm.
        let k = 2;
        let y: Vec<f32> = (0..k * cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut xa = x.clone();
        let (out, q) = combine_norm_cpu(&mut xa, &y, &route[..2 * k], k, &g, 1e-6).unwrap();
        let c = combine_cpu(&y, &route[..2 * k], k, cols);
        let mut xb = x.clone();
        let (out2, q2) = crate::fused::cpu(&mut xb, Some(&c), &g, 1e-6).unwrap();
        assert_eq!((xa, out, q), (xb, out2, q2));
    }
}
