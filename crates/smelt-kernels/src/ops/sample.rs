//! Per-row reductions over logits: softmax, argmax (greedy decoding without copying the
//! logits to the host), and sampling.

use smelt_ptx::{Cmp, Kernel, Load, Reg, Shfl, Store, F32, FULL_WARP, U32};

use super::{block_max, block_sum, dim, reduce_scratch, Launch, LOG2E, ROW_THREADS};
use crate::catalog::Entry;

/// Name of [`softmax_kernel`].
pub const SOFTMAX: &str = "softmax_rows";
/// Name of [`argmax_kernel`].
pub const ARGMAX: &str = "argmax_rows";

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    vec![
        (SOFTMAX.to_string(), Box::new(softmax_kernel)),
        (ARGMAX.to_string(), Box::new(argmax_kernel)),
    ]
}

/// Launch of the per-row kernels: one block of [`ROW_THREADS`] per row.
pub fn launch(rows: usize) -> Launch {
    Launch::new((dim(rows), 1, 1), (ROW_THREADS, 1, 1))
}

/// `out[r] = softmax(x[r])` over rows of `cols` values.
///
/// Parameters: `x: *const f32, out: *mut f32, cols: u32`. Launch: [`launch`]. `out` may
/// be `x`. `exp` is `ex2.approx` of the max-shifted value times log2(e); the sum is an f32
/// block reduction and the output is `e * (1 / sum)`.
pub fn softmax_kernel(k: &Kernel) {
    let x = k.param_ptr("x");
    let out = k.param_ptr("out");
    let cols = k.param_u32("cols");
    let scratch = reduce_scratch(k, "softmax_red");
    let base = k.mul_wide(k.reg(), k.ctaid_x(), cols);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let os = k.add(k.reg(), out, base);
    let tid = k.tid_x();
    let mx = k.f32(f32::NEG_INFINITY);
    k.stride_loop(tid, cols, ROW_THREADS, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(xs, i, 4));
        k.max(mx, mx, v);
    });
    let mx = block_max(k, mx, &scratch);
    let shift = k.mul(k.reg(), mx, LOG2E);
    let sum = k.f32(0.0);
    k.stride_loop(tid, cols, ROW_THREADS, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(xs, i, 4));
        let e = k.fma(k.reg(), v, LOG2E, k.neg(k.reg(), shift));
        k.ex2_approx(e, e);
        k.add(sum, sum, e);
    });
    let total = block_sum(k, sum, &scratch);
    let inv = k.div_rn(k.reg(), 1.0f32, total);
    k.stride_loop(tid, cols, ROW_THREADS, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(xs, i, 4));
        let e = k.fma(k.reg(), v, LOG2E, k.neg(k.reg(), shift));
        k.ex2_approx(e, e);
        k.mul(e, e, inv);
        k.st(Store::GLOBAL, k.elem_addr(os, i, 4), e);
    });
}

/// Index of the largest value of each row: the first one on ties; NaN is never chosen;
/// a row of only NaN gives 0.
///
/// Parameters: `x: *const f32, out: *mut u32 (one per row), cols: u32`. Launch:
/// [`launch`].
pub fn argmax_kernel(k: &Kernel) {
    let x = k.param_ptr("x");
    let out = k.param_ptr("out");
    let cols = k.param_u32("cols");
    let sv = k.shared::<F32>("argmax_v", 32, 16);
    let si = k.shared::<U32>("argmax_i", 32, 16);
    let base = k.mul_wide(k.reg(), k.ctaid_x(), cols);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let tid = k.tid_x();
    // (value, index), index u32::MAX while nothing is held.
    let bv = k.f32(f32::NEG_INFINITY);
    let bi = k.u32(u32::MAX);
    k.stride_loop(tid, cols, ROW_THREADS, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(xs, i, 4));
        // Take v when it is larger, or when nothing is held yet and v is a number
        // (-inf included). Indices rise along a thread's loop: ties keep the first.
        let gt = k.cmp(Cmp::Gt, v, bv);
        let none = k.eq(bi, u32::MAX);
        let num = k.cmp(Cmp::Eq, v, v);
        k.and(none, none, num);
        k.or(gt, gt, none);
        k.selp(bv, v, bv, gt);
        k.selp(bi, i, bi, gt);
    });
    let combine = |k: &Kernel, bv: Reg<F32>, bi: Reg<U32>, ov: Reg<F32>, oi: Reg<U32>| {
        // Other wins when larger, or equal with a smaller index (held values are never
        // NaN; the none marker is the largest index, so it loses every tie).
        let gt = k.cmp(Cmp::Gt, ov, bv);
        let eq = k.cmp(Cmp::Eq, ov, bv);
        let lower = k.lt(oi, bi);
        k.and(eq, eq, lower);
        let none = k.eq(bi, u32::MAX);
        let onum = k.cmp(Cmp::Ne, oi, u32::MAX);
        k.and(none, none, onum);
        k.or(gt, gt, eq);
        k.or(gt, gt, none);
        k.selp(bv, ov, bv, gt);
        k.selp(bi, oi, bi, gt);
    };
    let warp_round = |k: &Kernel| {
        for offset in [16u32, 8, 4, 2, 1] {
            let ov = k.shfl_sync(Shfl::Bfly, k.reg::<F32>(), bv, offset, FULL_WARP);
            let oi = k.shfl_sync(Shfl::Bfly, k.reg::<U32>(), bi, offset, FULL_WARP);
            combine(k, bv, bi, ov, oi);
        }
    };
    warp_round(k);
    let lane = k.and(k.reg(), tid, 31u32);
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane0 = k.eq(lane, 0u32);
    let vb = k.shared_base(&sv);
    let ib = k.shared_base(&si);
    k.guarded(lane0, |k| {
        k.st(Store::SHARED, k.mad(k.reg(), warp, 4u32, vb), bv);
        k.st(Store::SHARED, k.mad(k.reg(), warp, 4u32, ib), bi);
    });
    k.bar_sync();
    let w0 = k.eq(warp, 0u32);
    k.if_(w0, |k| {
        let nw = ROW_THREADS / 32;
        let has = k.lt(lane, nw);
        k.mov(bv, f32::NEG_INFINITY);
        k.mov(bi, u32::MAX);
        k.guarded(has, |k| {
            k.ld(Load::SHARED, bv, k.mad(k.reg(), lane, 4u32, vb));
            k.ld(Load::SHARED, bi, k.mad(k.reg(), lane, 4u32, ib));
        });
        warp_round(k);
        let none = k.eq(bi, u32::MAX);
        k.selp(bi, 0u32, bi, none);
        k.guarded(lane0, |k| {
            k.st(Store::GLOBAL, k.elem_addr(out, k.ctaid_x(), 4), bi)
        });
    });
}

/// CPU twin of [`softmax_kernel`] (in f64).
pub fn softmax_cpu(x: &[f32], cols: usize, out: &mut [f32]) {
    for (o, r) in out.chunks_mut(cols.max(1)).zip(x.chunks(cols.max(1))) {
        let mx = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = r
            .iter()
            .map(|&v| (f64::from(v) - f64::from(mx)).exp())
            .collect();
        let s: f64 = e.iter().sum();
        for (o, e) in o.iter_mut().zip(e) {
            *o = (e / s) as f32;
        }
    }
}

/// CPU twin of [`argmax_kernel`]: the first index of the largest non-NaN value, 0 when
/// the row holds only NaN.
pub fn argmax_cpu(x: &[f32], cols: usize) -> Vec<u32> {
    x.chunks(cols.max(1))
        .map(|r| {
            let mut best: Option<usize> = None;
            for (i, &v) in r.iter().enumerate() {
                if v.is_nan() {
                    continue;
                }
                if best.is_none_or(|b| v > r[b]) {
                    best = Some(i);
                }
            }
            best.unwrap_or(0) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build() {
        let mut m = Module::new(Target::Sm80);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        assert!(ptx.contains("shfl.sync.bfly.b32"));
        assert!(ptx.contains("setp.gt.f32"));
    }

    #[test]
    fn argmax_twin_takes_the_first_maximum_and_skips_nan() {
        let x = [
            1.0,
            3.0,
            3.0,
            f32::NAN,
            f32::NAN,
            2.0,
            f32::NAN,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        assert_eq!(argmax_cpu(&x[..4], 4), vec![1]);
        assert_eq!(argmax_cpu(&x[3..7], 4), vec![2]);
        assert_eq!(argmax_cpu(&x[6..8], 2), vec![0]);
        assert_eq!(argmax_cpu(&x[7..10], 3), vec![1]);
        let mut o = [0f32; 2];
        softmax_cpu(&[0.0, 0.0], 2, &mut o);
        assert_eq!(o, [0.5, 0.5]);
    }
}
