//! The mixture-of-experts router on the GPU: the f32 matrix-vector product of its weights
//! (llama.cpp keeps `ffn_gate_inp` in F32) and the routing of each token's logits to its
//! `k` experts (softmax or sigmoid, top-k, optional normalisation and scale), with their CPU
//! twins. The grouped expert GEMV, the plan and the combine are in [`crate::moe`], which
//! re-exports these; the fused decode router (`moe_fused`) shares [`route_row`] and
//! [`add_dot4`].

use smelt_ptx::{Cmp, Exact, FloatRound, Kernel, Load, Reg, Shfl, Store};
use smelt_ptx::{F32, F64, FULL_WARP, U32, U64};

use crate::moe::{GEMV_WARPS, MAX_EXPERTS, ROUTE_WARPS};
use crate::ops::{kernel_params, Launch, LOG2E};

/// Router probabilities (the engine's `Gating`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// Name of [`route_kernel`] for `g`.
pub fn route_name(g: Gating) -> &'static str {
    match g {
        Gating::Softmax => "moe_route_softmax",
        Gating::Sigmoid => "moe_route_sigmoid",
    }
}

kernel_params! {
    /// Arguments of [`route_kernel`].
    RouteArgs, RouteRegs {
        logits: Ptr,
        route: Ptr,
        n: U32,
        n_expert: U32,
        k: U32,
        norm: U32,
        scale: F32,
    }
}

/// Launch of [`route_kernel`] over `n` tokens.
pub fn route_launch(n: usize) -> Launch {
    Launch::new(
        ((n.max(1) as u32).div_ceil(ROUTE_WARPS), 1, 1),
        (32, ROUTE_WARPS, 1),
    )
}

/// Routes each row of `logits` (`n x n_expert`, at most [`MAX_EXPERTS`]) to its `k`
/// experts: probabilities (softmax: `2^((x - max) log2 e)` over their sum; sigmoid:
/// `1 / (1 + 2^(-x log2 e))`), the `k` largest in descending order (the lower index first
/// on ties), then, with `norm != 0`, divided by their sum (added in f64, clamped below at
/// f16's smallest normal as ggml does), then multiplied by `scale` (1: none). Writes
/// `route[t] = [ids as f32 (k), weights (k)]`.
///
/// Parameters: `logits, route, n, n_expert, k, norm, scale`. Launch: [`route_launch`].
pub fn route_kernel(k: &Kernel, gating: Gating) {
    k.max_threads(32, ROUTE_WARPS, 1);
    let r = RouteRegs::declare(k);
    let row = k.mad(k.reg(), k.ctaid_x(), ROUTE_WARPS, k.tid_y());
    k.exit_if(k.ge(row, r.n));
    let xrow = k.elem_addr(r.logits, k.mul(k.reg(), row, r.n_expert), 4);
    let two_k = k.add(k.reg(), r.k, r.k);
    let out = k.elem_addr(r.route, k.mul(k.reg(), row, two_k), 4);
    let p = RouteRow {
        n_expert: r.n_expert,
        k: r.k,
        norm: r.norm,
        scale: r.scale,
    };
    route_row(k, gating, Load::GLOBAL, xrow, out, &p);
}

/// What [`route_row`] needs besides the addresses: the router's shape and options.
pub(crate) struct RouteRow {
    pub n_expert: Reg<U32>,
    pub k: Reg<U32>,
    pub norm: Reg<U32>,
    pub scale: Reg<F32>,
}

/// One warp routes one row of logits at `xrow` (read with `ld`) into `out` (`[ids (k),
/// weights (k)]`, `k` at most [`MAX_K`]): the body of [`route_kernel`] (see there), shared
/// with the fused router (`moe_fused::router_kernel`), whose last block reads logits other
/// blocks wrote. The row stays in registers, a lane's columns `lane + 32 j`: loaded
/// together, and each of the `k` rounds picks from registers (it went through shared
/// memory, loaded one stride step at a time and read its weights back from global memory:
/// one dependent chain at the end of the fused router). Lane `i` keeps round `i`'s choice
/// and writes it.
pub(crate) fn route_row(
    k: &Kernel,
    gating: Gating,
    ld: Load,
    xrow: Reg<U64>,
    out: Reg<U64>,
    r: &RouteRow,
) {
    let lane = k.tid_x();
    let cols: Vec<_> = (0..MAX_EXPERTS as u32 / 32)
        .map(|j| {
            let c = k.add(k.reg(), lane, 32 * j);
            let valid = k.lt(c, r.n_expert);
            let v = k.f32(f32::NEG_INFINITY);
            k.guarded(valid, |k| {
                k.ld(ld, v, k.elem_addr(xrow, c, 4));
            });
            (c, valid, v)
        })
        .collect();
    match gating {
        Gating::Softmax => {
            let m = k.f32(f32::NEG_INFINITY);
            for &(_, valid, v) in &cols {
                k.guarded(valid, |k| {
                    k.max(m, m, v);
                });
            }
            let m = k.warp_max(m);
            // A lane's terms in column order, then the warp's butterfly.
            let sum = k.f32(0.0);
            for &(_, valid, v) in &cols {
                k.guarded(valid, |k| {
                    k.sub(v, v, m);
                    k.mul(v, v, LOG2E);
                    k.ex2_approx(v, v);
                    k.add(sum, sum, v);
                });
            }
            let sum = k.warp_sum(sum);
            let inv = k.div_rn(k.reg(), 1.0f32, sum);
            for &(_, valid, v) in &cols {
                k.guarded(valid, |k| {
                    k.mul(v, v, inv);
                });
            }
        }
        Gating::Sigmoid => {
            for &(_, valid, v) in &cols {
                k.guarded(valid, |k| {
                    k.mul(v, v, -LOG2E);
                    k.ex2_approx(v, v);
                    k.add(v, v, 1.0f32);
                    k.div_rn(v, 1.0f32, v);
                });
            }
        }
    }
    let mine_w = k.f32(0.0);
    let mine_id = k.u32(0);
    let sum = k.reg::<F64>();
    k.mov(sum, 0.0f64);
    k.for_count(r.k, |k, i| {
        let best = k.f32(f32::NEG_INFINITY);
        let bi = k.u32(u32::MAX);
        // A lane's columns rise: a strict `>` keeps the lower index of equal values.
        for &(c, _, v) in &cols {
            let gt = k.cmp(Cmp::Gt, v, best);
            k.selp(best, v, best, gt);
            k.selp(bi, c, bi, gt);
        }
        for off in [16u32, 8, 4, 2, 1] {
            let ov = k.shfl_sync(Shfl::Bfly, k.reg(), best, off, FULL_WARP);
            let oi = k.shfl_sync(Shfl::Bfly, k.reg(), bi, off, FULL_WARP);
            let gt = k.cmp(Cmp::Gt, ov, best);
            let eq = k.cmp(Cmp::Eq, ov, best);
            let lower = k.lt(oi, bi);
            k.and(eq, eq, lower);
            k.or(gt, gt, eq);
            k.selp(best, ov, best, gt);
            k.selp(bi, oi, bi, gt);
        }
        // Column `bi` is one lane's register: taken.
        for &(c, _, v) in &cols {
            let hit = k.eq(c, bi);
            k.selp(v, f32::NEG_INFINITY, v, hit);
        }
        let me = k.eq(lane, i);
        k.selp(mine_w, best, mine_w, me);
        k.selp(mine_id, bi, mine_id, me);
        // Every lane adds the weights in round order (f64), as the CPU does.
        let wd = k.cvt(k.reg::<F64>(), best, Exact);
        k.add(sum, sum, wd);
    });
    let s = k.cvt(k.reg::<F32>(), sum, FloatRound::Rn);
    k.max(s, s, 6.103_515_6e-5f32);
    let plain = k.cmp(Cmp::Eq, r.norm, 0u32);
    k.selp(s, 1.0f32, s, plain);
    k.if_(k.lt(lane, r.k), |k| {
        let id = k.cvt(k.reg::<F32>(), mine_id, FloatRound::Rn);
        k.st(Store::GLOBAL, k.elem_addr(out, lane, 4), id);
        let w = k.div_rn(k.reg(), mine_w, s);
        k.mul(w, w, r.scale);
        let wout = k.elem_addr(out, r.k, 4);
        k.st(Store::GLOBAL, k.elem_addr(wout, lane, 4), w);
    });
}

/// `acc += w . x` over four columns (products fused in column order into a fresh sum, as
/// `dense_cpu` adds them), nothing where `inside` is false: a 16-byte step of the f32
/// router matmuls.
pub(crate) fn add_dot4(
    k: &Kernel,
    acc: Reg<F32>,
    w: [Reg<F32>; 4],
    x: [Reg<F32>; 4],
    inside: Reg<smelt_ptx::Pred>,
) {
    let p = k.f32(0.0);
    for i in 0..4 {
        k.fma(p, w[i], x[i], p);
    }
    let zero = k.f32(0.0);
    k.selp(p, p, zero, inside);
    k.add(acc, acc, p);
}

/// CPU twin of [`route_kernel`] (the engine's CPU backend has the ggml-exact one; this is
/// the same function in plain f32/f64, for the kernel check).
pub fn route_cpu(
    logits: &[f32],
    n_expert: usize,
    gating: Gating,
    k: usize,
    norm: bool,
    scale: f32,
) -> Vec<f32> {
    let mut out = Vec::new();
    for x in logits.chunks(n_expert) {
        let p: Vec<f32> = match gating {
            Gating::Softmax => {
                let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
                let s: f32 = e.iter().sum();
                e.iter().map(|v| v / s).collect()
            }
            Gating::Sigmoid => x.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect(),
        };
        let mut order: Vec<usize> = (0..n_expert).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut w: Vec<f32> = order[..k].iter().map(|&i| p[i]).collect();
        if norm {
            let s = (w.iter().map(|&v| v as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
            w.iter_mut().for_each(|v| *v /= s);
        }
        w.iter_mut().for_each(|v| *v *= scale);
        out.extend(order[..k].iter().map(|&i| i as f32));
        out.extend(w);
    }
    out
}

kernel_params! {
    /// Arguments of [`dense_f32_kernel`].
    DenseArgs, DenseRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        nrows: U32,
        cols: U32,
    }
}

/// Launch of [`dense_f32_kernel`]: `nrows` rows, `ntok` tokens.
pub fn dense_launch(nrows: usize, ntok: usize) -> Launch {
    Launch::new(
        (
            (nrows.max(1) as u32).div_ceil(GEMV_WARPS),
            ntok.max(1) as u32,
            1,
        ),
        (32, GEMV_WARPS, 1),
    )
}

/// 16-byte loads of the weights a lane issues before its first multiply-add in
/// [`dense_f32_kernel`]'s vector loop (a warp covers `32 * 4 * DENSE_UNROLL` columns an
/// iteration).
pub const DENSE_UNROLL: u32 = 4;

/// `y[t][r] = W[r] . x[t]` in f32, `W` f32 rows of `cols` (the router, which llama.cpp
/// keeps in F32): one warp per (row, token), a butterfly sum.
///
/// With `cols % 4 == 0` (every router: 2048 columns for Qwen3-30B-A3B and Qwen3-Next) each
/// lane issues [`DENSE_UNROLL`] 16-byte loads of its row (and of `x`) before it multiplies:
/// four round trips to memory for a 2048-wide row. The first version
/// ([`dense_f32_scalar_kernel`]) loads 4 bytes a lane and iteration, 64 iterations for that
/// row, each multiply-add waiting for its loads before the next iteration's issue (unless
/// ptxas unrolls the loop): up to 64 round trips one after the other, every MoE layer of a
/// decode step, for 1 MB of weights (`gpu_ops -o delta` times both). Columns past the
/// row's end are read at its last four (in bounds) and not added. Any other width takes
/// the scalar loop.
///
/// Parameters: `w, x, y, nrows, cols`. Launch: [`dense_launch`].
pub fn dense_f32_kernel(k: &Kernel) {
    dense_row(k, |k, d, wr, xr, acc| {
        let lane = k.tid_x();
        let low = k.and(k.reg(), d.cols, 3u32);
        let vector = k.eq(low, 0u32);
        k.if_else(
            vector,
            |k| {
                let last = k.sub(k.reg(), d.cols, 4u32);
                let start = k.mul(k.reg(), lane, 4u32);
                let step = 32 * 4 * DENSE_UNROLL;
                k.stride_loop(start, d.cols, step, |k, c| {
                    let mut loads = Vec::new();
                    for u in 0..DENSE_UNROLL {
                        let cu = k.add(k.reg(), c, 128 * u);
                        let inside = k.lt(cu, d.cols);
                        let at = k.min(k.reg(), cu, last);
                        let wv = k.regs::<F32, 4>();
                        k.ld_v4(Load::GLOBAL_NC, wv, k.elem_addr(wr, at, 4));
                        let xv = k.regs::<F32, 4>();
                        k.ld_v4(Load::GLOBAL, xv, k.elem_addr(xr, at, 4));
                        loads.push((inside, wv, xv));
                    }
                    for (inside, wv, xv) in loads {
                        add_dot4(k, acc, wv, xv, inside);
                    }
                });
            },
            |k| scalar_dot(k, d, wr, xr, acc),
        );
    });
}

/// The first [`dense_f32_kernel`]: 4 bytes a lane and iteration (a GPU check times it beside
/// the vector loop; the engine does not launch it). Same parameters and launch.
pub fn dense_f32_scalar_kernel(k: &Kernel) {
    dense_row(k, scalar_dot);
}

/// One warp's (row, token) of the f32 router matmul: `body` adds the row's products into
/// `acc` from the row's and the token's addresses, then lane 0 stores the warp's sum.
fn dense_row(k: &Kernel, body: impl FnOnce(&Kernel, &DenseRegs, Reg<U64>, Reg<U64>, Reg<F32>)) {
    k.max_threads(32, GEMV_WARPS, 1);
    let d = DenseRegs::declare(k);
    let row = k.mad(k.reg(), k.ctaid_x(), GEMV_WARPS, k.tid_y());
    k.exit_if(k.ge(row, d.nrows));
    let t = k.ctaid_y();
    let wr = k.elem_addr(d.w, k.mul(k.reg(), row, d.cols), 4);
    let xr = k.elem_addr(d.x, k.mul(k.reg(), t, d.cols), 4);
    let acc = k.f32(0.0);
    body(k, &d, wr, xr, acc);
    let s = k.warp_sum(acc);
    k.if_(k.eq(k.tid_x(), 0u32), |k| {
        let i = k.mad(k.reg(), t, d.nrows, row);
        k.st(Store::GLOBAL, k.elem_addr(d.y, i, 4), s);
    });
}

/// 4 bytes a lane and iteration, fused in column order into `acc`.
fn scalar_dot(k: &Kernel, d: &DenseRegs, wr: Reg<U64>, xr: Reg<U64>, acc: Reg<F32>) {
    k.stride_loop(k.tid_x(), d.cols, 32u32, |k, c| {
        let a = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(wr, c, 4));
        let b = k.load::<F32>(Load::GLOBAL, k.elem_addr(xr, c, 4));
        k.fma(acc, a, b, acc);
    });
}

/// CPU twin of [`dense_f32_kernel`] (f64 sums).
pub fn dense_cpu(w: &[f32], x: &[f32], nrows: usize, cols: usize) -> Vec<f32> {
    let ntok = x.len() / cols.max(1);
    let mut y = vec![0f32; ntok * nrows];
    for t in 0..ntok {
        for r in 0..nrows {
            let s: f64 = (0..cols)
                .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                .sum();
            y[t * nrows + r] = s as f32;
        }
    }
    y
}
