//! ggml's per-group scale searches (`make_qx_quants`, `make_q3_quants`,
//! `make_qkx2_quants`) as PTX, one group per thread, each a line-by-line transcription
//! of smelt-quant's `kquants/reference.rs` (the scalar specification its lane code is
//! tested against). Branches of the C become predicated selects; the loops over candidate
//! scales and refinement rounds are runtime loops (unrolled they made 185 KB kernels that
//! were slower to JIT and to run), the loops over a group's weights unroll into registers.

use smelt_ptx::{Cmp, Kernel, Pred, Reg, F32, S32};

use super::{clamp, nearest_int, to_f32};

/// Below this magnitude a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The first element of largest magnitude, with its sign, and that magnitude (ggml's
/// `if (ax > amax) { amax = ax; max = x; }` scan from zero).
fn signed_max(k: &Kernel, x: &[Reg<F32>]) -> (Reg<F32>, Reg<F32>) {
    let max = k.f32(0.0);
    let amax = k.f32(0.0);
    for &v in x {
        let ax = k.abs(k.reg(), v);
        let p = k.cmp(Cmp::Gt, ax, amax);
        k.selp(amax, ax, amax, p);
        k.selp(max, v, max, p);
    }
    (max, amax)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)` for one group: levels
/// `l + nmax` and the group's scale.
pub(crate) fn make_qx_quants(k: &Kernel, nmax: i32, x: &[Reg<F32>]) -> (Reg<F32>, Vec<Reg<S32>>) {
    let n = x.len();
    let (max, amax) = signed_max(k, x);
    let w: Vec<Reg<F32>> = x.iter().map(|&v| k.mul(k.reg(), v, v)).collect();
    let wx: Vec<Reg<F32>> = (0..n).map(|i| k.mul(k.reg(), w[i], x[i])).collect();
    let nmaxf = nmax as f32;
    let level = |iscale: Reg<F32>, v: Reg<F32>| {
        let t = k.mul(k.reg(), iscale, v);
        clamp(k, nearest_int(k, t), -nmax, nmax - 1)
    };
    // Sums of a candidate's levels, in ggml's order: `sumlx += w*x*l; suml2 += w*l*l`.
    let sums = |ls: &[Reg<S32>]| {
        let sumlx = k.f32(0.0);
        let suml2 = k.f32(0.0);
        for i in 0..n {
            let lf = to_f32(k, ls[i]);
            let a = k.mul(k.reg(), wx[i], lf);
            k.add(sumlx, sumlx, a);
            let b = k.mul(k.reg(), w[i], lf);
            k.mul(b, b, lf);
            k.add(suml2, suml2, b);
        }
        (sumlx, suml2)
    };

    let iscale = k.div_rn(k.reg(), -nmaxf, max);
    let ls: Vec<Reg<S32>> = x.iter().map(|&v| level(iscale, v)).collect();
    let out: Vec<Reg<S32>> = ls.iter().map(|&l| k.add(k.reg(), l, nmax)).collect();
    let (sumlx, suml2) = sums(&ls);
    let zero = k.cmp(Cmp::Eq, suml2, 0.0f32);
    let q = k.div_rn(k.reg(), sumlx, suml2);
    let scale = k.selp(k.reg(), 0.0f32, q, zero);
    let best = k.mul(k.reg(), scale, sumlx);
    // is = -9 ..= 9 without 0, as a runtime loop (unrolled, the 18 candidates made the
    // kernel 185 KB of PTX, slow to JIT): `-(nmax + 0.1f * is)` in the same f32 steps.
    k.for_count(19u32, |k, it| {
        let is = k.sub(k.reg(), it.cast::<S32>(), 9i32);
        let t = k.mul(k.reg(), to_f32(k, is), 0.1f32);
        let num = k.add(k.reg(), t, nmaxf);
        k.neg(num, num);
        let iscale = k.div_rn(k.reg(), num, max);
        let ls: Vec<Reg<S32>> = x.iter().map(|&v| level(iscale, v)).collect();
        let (sumlx, suml2) = sums(&ls);
        let pos = k.cmp(Cmp::Gt, suml2, 0.0f32);
        let lhs = k.mul(k.reg(), sumlx, sumlx);
        let rhs = k.mul(k.reg(), best, suml2);
        let better = k.cmp(Cmp::Gt, lhs, rhs);
        let take = k.and(k.reg::<Pred>(), pos, better);
        let candidate = k.cmp(Cmp::Ne, is, 0i32);
        k.and(take, take, candidate);
        for i in 0..n {
            let l = k.add(k.reg(), ls[i], nmax);
            k.selp(out[i], l, out[i], take);
        }
        let s = k.div_rn(k.reg(), sumlx, suml2);
        k.selp(scale, s, scale, take);
        let b = k.mul(k.reg(), scale, sumlx);
        k.selp(best, b, best, take);
    });
    let tiny = k.cmp(Cmp::Lt, amax, GROUP_MAX_EPS);
    for &o in &out {
        k.selp(o, 0i32, o, tiny);
    }
    k.selp(scale, 0.0f32, scale, tiny);
    (scale, out)
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)` for one group: levels `l + nmax` and
/// the group's scale.
pub(crate) fn make_q3_quants(k: &Kernel, nmax: i32, x: &[Reg<F32>]) -> (Reg<F32>, Vec<Reg<S32>>) {
    let n = x.len();
    let (max, amax) = signed_max(k, x);
    let w: Vec<Reg<F32>> = x.iter().map(|&v| k.mul(k.reg(), v, v)).collect();
    let wx: Vec<Reg<F32>> = (0..n).map(|i| k.mul(k.reg(), w[i], x[i])).collect();
    let iscale = k.div_rn(k.reg(), -(nmax as f32), max);
    let sumlx = k.f32(0.0);
    let suml2 = k.f32(0.0);
    let l: Vec<Reg<S32>> = (0..n)
        .map(|i| {
            let t = k.mul(k.reg(), iscale, x[i]);
            let li = clamp(k, nearest_int(k, t), -nmax, nmax - 1);
            let lf = to_f32(k, li);
            let a = k.mul(k.reg(), wx[i], lf);
            k.add(sumlx, sumlx, a);
            let b = k.mul(k.reg(), w[i], lf);
            k.mul(b, b, lf);
            k.add(suml2, suml2, b);
            li
        })
        .collect();
    let done = k.label();
    k.for_count(5u32, |k, _| {
        let changed = k.reg::<Pred>();
        k.setp(Cmp::Ne, changed, k.u32(0), 0u32); // false
        for i in 0..n {
            let li = to_f32(k, l[i]);
            let t = k.mul(k.reg(), wx[i], li);
            let slx = k.sub(k.reg(), sumlx, t);
            let slx_pos = k.cmp(Cmp::Gt, slx, 0.0f32);
            let t = k.mul(k.reg(), w[i], li);
            k.mul(t, t, li);
            let sl2 = k.sub(k.reg(), suml2, t);
            let num = k.mul(k.reg(), x[i], sl2);
            let q = k.div_rn(k.reg(), num, slx);
            let new_l = clamp(k, nearest_int(k, q), -nmax, nmax - 1);
            let differs = k.cmp(Cmp::Ne, new_l, l[i]);
            let nf = to_f32(k, new_l);
            let t = k.mul(k.reg(), wx[i], nf);
            k.add(slx, slx, t);
            let t = k.mul(k.reg(), w[i], nf);
            k.mul(t, t, nf);
            k.add(sl2, sl2, t);
            let sl2_pos = k.cmp(Cmp::Gt, sl2, 0.0f32);
            let lhs = k.mul(k.reg(), slx, slx);
            k.mul(lhs, lhs, suml2);
            let rhs = k.mul(k.reg(), sumlx, sumlx);
            k.mul(rhs, rhs, sl2);
            let better = k.cmp(Cmp::Gt, lhs, rhs);
            let take = k.and(k.reg::<Pred>(), slx_pos, differs);
            k.and(take, take, sl2_pos);
            k.and(take, take, better);
            k.selp(l[i], new_l, l[i], take);
            k.selp(sumlx, slx, sumlx, take);
            k.selp(suml2, sl2, suml2, take);
            k.or(changed, changed, take);
        }
        // A round that changes nothing leaves the state as it was, so every later round
        // would change nothing too: ggml's `break`.
        k.bra_if(!changed, done);
    });
    k.place(done);
    let out: Vec<Reg<S32>> = l.iter().map(|&v| k.add(k.reg(), v, nmax)).collect();
    let pos = k.cmp(Cmp::Gt, suml2, 0.0f32);
    let q = k.div_rn(k.reg(), sumlx, suml2);
    let scale = k.selp(k.reg(), q, 0.0f32, pos);
    let tiny = k.cmp(Cmp::Lt, amax, GROUP_MAX_EPS);
    for &o in &out {
        k.selp(o, 0i32, o, tiny);
    }
    k.selp(scale, 0.0f32, scale, tiny);
    (scale, out)
}

/// How `make_qkx2_quants` searches (ggml passes these per format).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: u32,
    pub use_mad: bool,
}

/// `make_qkx2_quants` for one group with weights `weights`: levels in `0..=nmax`, the
/// scale and `-min` (ggml returns the min negated).
pub(crate) fn make_qkx2_quants(
    k: &Kernel,
    p: Qkx2,
    x: &[Reg<F32>],
    weights: &[Reg<F32>],
) -> (Reg<F32>, Reg<F32>, Vec<Reg<S32>>) {
    let n = x.len();
    let nmax = p.nmax;
    let min = k.copy(x[0]);
    let max = k.copy(x[0]);
    let sum_w = k.copy(weights[0]);
    let sum_x = k.mul(k.reg(), sum_w, x[0]);
    for i in 1..n {
        let lt = k.cmp(Cmp::Lt, x[i], min);
        k.selp(min, x[i], min, lt);
        let gt = k.cmp(Cmp::Gt, x[i], max);
        k.selp(max, x[i], max, gt);
        k.add(sum_w, sum_w, weights[i]);
        let t = k.mul(k.reg(), weights[i], x[i]);
        k.add(sum_x, sum_x, t);
    }
    let pos = k.cmp(Cmp::Gt, min, 0.0f32);
    k.selp(min, 0.0f32, min, pos);
    let flat = k.cmp(Cmp::Eq, max, min);
    // The flat case returns (0, -min) with zero levels; decided before `min` moves.
    let flat_min = k.neg(k.reg(), min);

    let err = |k: &Kernel, diff: Reg<F32>| -> Reg<F32> {
        if p.use_mad {
            k.abs(k.reg(), diff)
        } else {
            k.mul(k.reg(), diff, diff)
        }
    };
    let level = |k: &Kernel, iscale: Reg<F32>, v: Reg<F32>, min: Reg<F32>| {
        let d = k.sub(k.reg(), v, min);
        let t = k.mul(k.reg(), iscale, d);
        clamp(k, nearest_int(k, t), 0, nmax)
    };

    let range = k.sub(k.reg(), max, min);
    let iscale = k.div_rn(k.reg(), nmax as f32, range);
    let scale = k.div_rn(k.reg(), 1.0f32, iscale);
    let best_error = k.f32(0.0);
    let out: Vec<Reg<S32>> = (0..n)
        .map(|i| {
            let l = level(k, iscale, x[i], min);
            let t = k.mul(k.reg(), scale, to_f32(k, l));
            k.add(t, t, min);
            k.sub(t, t, x[i]);
            let e = err(k, t);
            k.mul(e, weights[i], e);
            k.add(best_error, best_error, e);
            l
        })
        .collect();

    k.for_count(p.nstep + 1, |k, is| {
        let isf = to_f32(k, is.cast::<S32>());
        let t = k.mul(k.reg(), isf, p.rdelta);
        let num = k.add(k.reg(), k.f32(p.rmin), t);
        k.add(num, num, nmax as f32);
        let range = k.sub(k.reg(), max, min);
        let iscale = k.div_rn(k.reg(), num, range);
        let sum_l = k.f32(0.0);
        let sum_l2 = k.f32(0.0);
        let sum_xl = k.f32(0.0);
        let aux: Vec<Reg<S32>> = (0..n)
            .map(|i| {
                let l = level(k, iscale, x[i], min);
                let lf = to_f32(k, l);
                let wl = k.mul(k.reg(), weights[i], lf);
                k.add(sum_l, sum_l, wl);
                let t = k.mul(k.reg(), wl, lf);
                k.add(sum_l2, sum_l2, t);
                let t = k.mul(k.reg(), wl, x[i]);
                k.add(sum_xl, sum_xl, t);
                l
            })
            .collect();
        let a = k.mul(k.reg(), sum_w, sum_l2);
        let b = k.mul(k.reg(), sum_l, sum_l);
        let d = k.sub(k.reg(), a, b);
        let d_pos = k.cmp(Cmp::Gt, d, 0.0f32);
        let a = k.mul(k.reg(), sum_w, sum_xl);
        let b = k.mul(k.reg(), sum_x, sum_l);
        let t = k.sub(k.reg(), a, b);
        let this_scale = k.div_rn(k.reg(), t, d);
        let a = k.mul(k.reg(), sum_l2, sum_x);
        let b = k.mul(k.reg(), sum_l, sum_xl);
        let t = k.sub(k.reg(), a, b);
        let this_min = k.div_rn(k.reg(), t, d);
        let min_pos = k.cmp(Cmp::Gt, this_min, 0.0f32);
        k.selp(this_min, 0.0f32, this_min, min_pos);
        let alt = k.div_rn(k.reg(), sum_xl, sum_l2);
        k.selp(this_scale, alt, this_scale, min_pos);
        let cur_error = k.f32(0.0);
        for i in 0..n {
            let t = k.mul(k.reg(), this_scale, to_f32(k, aux[i]));
            k.add(t, t, this_min);
            k.sub(t, t, x[i]);
            let e = err(k, t);
            k.mul(e, weights[i], e);
            k.add(cur_error, cur_error, e);
        }
        let better = k.cmp(Cmp::Lt, cur_error, best_error);
        let take = k.and(k.reg::<Pred>(), d_pos, better);
        for i in 0..n {
            k.selp(out[i], aux[i], out[i], take);
        }
        k.selp(best_error, cur_error, best_error, take);
        k.selp(scale, this_scale, scale, take);
        k.selp(min, this_min, min, take);
    });

    let neg_min = k.neg(k.reg(), min);
    for &o in &out {
        k.selp(o, 0i32, o, flat);
    }
    k.selp(scale, 0.0f32, scale, flat);
    k.selp(neg_min, flat_min, neg_min, flat);
    (scale, neg_min, out)
}
