//! RMS norm over chunks of the weight's length (a whole row, or each head for Q/K norms),
//! times the weight; and the fused residual add + RMS norm of a layer's boundary.

use smelt_ptx::{Kernel, Load, Pred, Reg, Store, F32, U32, U64};

use super::{block_sum, dim, kernel_params, reduce_scratch, Launch};
use crate::catalog::Entry;

/// Name of [`rms_norm_kernel`].
pub const RMS_NORM: &str = "rms_norm";
/// Name of [`add_rms_norm_kernel`].
pub const ADD_RMS_NORM: &str = "add_rms_norm";
/// Name of [`rms_norm_pair_kernel`].
pub const RMS_NORM_PAIR: &str = "rms_norm_pair";

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    vec![
        (RMS_NORM.to_string(), Box::new(rms_norm_kernel)),
        (ADD_RMS_NORM.to_string(), Box::new(add_rms_norm_kernel)),
        (RMS_NORM_PAIR.to_string(), Box::new(rms_norm_pair_kernel)),
    ]
}

/// Values a thread loads before it uses any.
const UNROLL: u32 = 4;

/// Threads per block for chunks of `n` values: four values per thread (one round
/// of loads) up to 4096 values, a whole number of warps, at most 1024.
pub fn threads(n: usize) -> u32 {
    (n.div_ceil(UNROLL as usize).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// Launch of either kernel over `n_chunks` chunks of `n` values (`rows * cols / n`).
pub fn launch(n_chunks: usize, n: usize) -> Launch {
    Launch::new((dim(n_chunks), 1, 1), (threads(n), 1, 1))
}

kernel_params! {
    /// Arguments of [`rms_norm_kernel`].
    RmsNormArgs, RmsNormRegs {
        x: Ptr,
        w: Ptr,
        out: Ptr,
        n: U32,
        eps: F32,
    }
}

/// `out = x / sqrt(mean(x²) + eps) * w` for each chunk of `n = len(w)` consecutive values.
///
/// Parameters: `x: *const f32, w: *const f32, out: *mut f32, n: u32, eps: f32`.
/// One block per chunk ([`launch`]); `out` may be `x` (in place).
///
/// The sum of squares is an f32 block reduction in a fixed order; the scale is
/// `1 / sqrt_rn(mean + eps)` with an IEEE division, as the CPU backend computes it.
pub fn rms_norm_kernel(k: &Kernel) {
    let RmsNormRegs { x, w, out, n, eps } = RmsNormRegs::declare(k);
    k.max_threads(1024, 1, 1);
    norm_body(k, x, None, w, out, n, eps);
}

kernel_params! {
    /// Arguments of [`rms_norm_pair_kernel`].
    RmsNormPairArgs, RmsNormPairRegs {
        x: Ptr,
        w: Ptr,
        w2: Ptr,
        out: Ptr,
        n: U32,
        split: U32,
        eps: F32,
    }
}

/// [`rms_norm_kernel`] over two runs of chunks in one launch: chunks `0..split` times `w`,
/// the chunks after them times `w2` (a decode row's Q heads then its K heads, which the
/// Q|K|V GEMV wrote one after the other: the Q and K head norms of Qwen3 and Gemma 3 in
/// one launch instead of two). Each chunk's floats are those [`rms_norm_kernel`] computes
/// with its weight.
///
/// Parameters: `x, w, w2, out, n, split, eps`. Launch: [`launch`] over all the chunks;
/// `out` may be `x`.
pub fn rms_norm_pair_kernel(k: &Kernel) {
    let RmsNormPairRegs {
        x,
        w,
        w2,
        out,
        n,
        split,
        eps,
    } = RmsNormPairRegs::declare(k);
    k.max_threads(1024, 1, 1);
    let second = k.ge(k.ctaid_x(), split);
    k.selp(w, w2, w, second);
    norm_body(k, x, None, w, out, n, eps);
}

kernel_params! {
    /// Arguments of [`add_rms_norm_kernel`].
    AddRmsNormArgs, AddRmsNormRegs {
        x: Ptr,
        y: Ptr,
        w: Ptr,
        out: Ptr,
        n: U32,
        eps: F32,
    }
}

/// `x += y; out = rms_norm(x) * w` in one pass over `x` and `y`: the residual stream is
/// updated in place and its norm written to `out` (which must not alias `x` or `y`).
///
/// Parameters: `x: *mut f32, y: *const f32, w: *const f32, out: *mut f32, n: u32,
/// eps: f32`. Launch as [`rms_norm_kernel`].
pub fn add_rms_norm_kernel(k: &Kernel) {
    let AddRmsNormRegs {
        x,
        y,
        w,
        out,
        n,
        eps,
    } = AddRmsNormRegs::declare(k);
    k.max_threads(1024, 1, 1);
    norm_body(k, x, Some(y), w, out, n, eps);
}

fn norm_body(
    k: &Kernel,
    x: smelt_ptx::Reg<smelt_ptx::U64>,
    y: Option<smelt_ptx::Reg<smelt_ptx::U64>>,
    w: smelt_ptx::Reg<smelt_ptx::U64>,
    out: smelt_ptx::Reg<smelt_ptx::U64>,
    n: smelt_ptx::Reg<smelt_ptx::U32>,
    eps: smelt_ptx::Reg<F32>,
) {
    let scratch = reduce_scratch(k, "norm_red");
    let chunk = k.ctaid_x();
    let base = k.mul_wide(k.reg(), chunk, n);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let os = k.add(k.reg(), out, base);
    let ys = y.map(|y| k.add(k.reg(), y, base));
    let sum = add_sum_squares(k, xs, ys, n);
    let total = block_sum(k, sum, &scratch);
    let nf = k.cvt(k.reg::<F32>(), n, smelt_ptx::FloatRound::Rn);
    let mean = k.div_rn(k.reg(), total, nf);
    k.add(mean, mean, eps);
    let root = k.sqrt_rn(k.reg(), mean);
    let scale = k.div_rn(k.reg(), 1.0f32, root);
    // Each thread reads back only the values it wrote itself: no barrier needed.
    let (tid, step) = (k.tid_x(), k.ntid_x());
    let wide = k.shl(k.reg(), step, UNROLL.trailing_zeros());
    k.stride_loop(tid, n, wide, |k, i| {
        let sl = slots(k, step, n, i);
        let vals: Vec<(Reg<F32>, Reg<F32>)> = sl
            .iter()
            .map(|&(idx, ok)| {
                let (v, g) = (k.f32(0.0), k.f32(0.0));
                k.guarded(ok, |k| {
                    k.ld(Load::GLOBAL, v, k.elem_addr(xs, idx, 4));
                    k.ld(Load::GLOBAL_NC, g, k.elem_addr(w, idx, 4));
                });
                (v, g)
            })
            .collect();
        for (&(idx, ok), &(v, g)) in sl.iter().zip(&vals) {
            k.mul(v, v, scale);
            k.mul(v, v, g);
            k.guarded(ok, |k| k.st(Store::GLOBAL, k.elem_addr(os, idx, 4), v));
        }
    });
}

/// Trip `i` of a thread's values: `i, i + step, ...` ([`UNROLL`] of them), each with
/// whether it is inside the chunk of `n`.
fn slots(k: &Kernel, step: Reg<U32>, n: Reg<U32>, i: Reg<U32>) -> Vec<(Reg<U32>, Reg<Pred>)> {
    (0..UNROLL)
        .map(|u| {
            let idx = k.mad(k.reg(), step, u, i);
            (idx, k.lt(idx, n))
        })
        .collect()
}

/// The first pass of every RMS norm of a chunk (this module's and `fused`'s): `x += y`
/// when `ys` is given (written back at `xs`), and this thread's sum of the squares of its
/// values of `x`, which are `tid, tid + step, tid + 2 step, ...` summed in that order (one
/// order for every norm kernel, so the fused and unfused ones agree to the bit). Every
/// load of a trip of [`UNROLL`] values is issued before any is used: a row is read by one
/// block, so the time is load latency times the number of dependent rounds.
pub(crate) fn add_sum_squares(
    k: &Kernel,
    xs: Reg<U64>,
    ys: Option<Reg<U64>>,
    n: Reg<U32>,
) -> Reg<F32> {
    let (tid, step) = (k.tid_x(), k.ntid_x());
    let wide = k.shl(k.reg(), step, UNROLL.trailing_zeros());
    let sum = k.f32(0.0);
    k.stride_loop(tid, n, wide, |k, i| {
        let sl = slots(k, step, n, i);
        let vals: Vec<(Reg<F32>, Reg<F32>)> = sl
            .iter()
            .map(|&(idx, ok)| {
                let (v, b) = (k.f32(0.0), k.f32(0.0));
                k.guarded(ok, |k| {
                    k.ld(Load::GLOBAL, v, k.elem_addr(xs, idx, 4));
                    if let Some(ys) = ys {
                        k.ld(Load::GLOBAL, b, k.elem_addr(ys, idx, 4));
                    }
                });
                (v, b)
            })
            .collect();
        for (&(idx, ok), &(v, b)) in sl.iter().zip(&vals) {
            if ys.is_some() {
                k.add(v, v, b);
                k.guarded(ok, |k| k.st(Store::GLOBAL, k.elem_addr(xs, idx, 4), v));
            }
            // Slots past the chunk hold 0 and add nothing.
            k.fma(sum, v, v, sum);
        }
    });
    sum
}

/// CPU twin of [`rms_norm_kernel`] (the CPU backend's `rms_norm`: f64 sum of the f32
/// squares, `(x * scale) * w`).
pub fn rms_norm_cpu(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len().max(1);
    for (y, x) in out.chunks_mut(n).zip(x.chunks(n)) {
        let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
            *y = (x * scale) * w;
        }
    }
}

/// CPU twin of [`add_rms_norm_kernel`]: `x += y`, then [`rms_norm_cpu`] of `x`.
pub fn add_rms_norm_cpu(x: &mut [f32], y: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
    rms_norm_cpu(x, w, eps, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_reduce_with_barriers_and_take_an_ieee_scale() {
        let mut m = Module::new(Target::Sm80);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        assert!(ptx.contains("bar.sync 0"));
        assert!(ptx.contains("sqrt.rn.f32"));
        assert!(ptx.contains("div.rn.f32"));
        assert!(ptx.contains("shfl.sync.bfly.b32"));
        assert!(ptx.contains(".param .f32 eps"));
    }

    #[test]
    fn threads_cover_chunks_in_whole_warps() {
        assert_eq!(threads(64), 32);
        assert_eq!(threads(4096), 1024);
        assert_eq!(threads(576), 160);
        assert_eq!(threads(1 << 20), 1024);
        assert_eq!(launch(7, 128).grid, (7, 1, 1));
    }

    #[test]
    fn twins_normalize_per_chunk() {
        let x = [3.0f32, 4.0, 1.0, 1.0];
        let w = [1.0f32, 2.0];
        let mut out = [0f32; 4];
        rms_norm_cpu(&x, &w, 0.0, &mut out);
        let s = 1.0 / 12.5f32.sqrt();
        assert_eq!(out, [3.0 * s, 4.0 * s * 2.0, 1.0, 2.0]);
        let mut x2 = [1.0f32, 2.0, 0.0, 0.0];
        add_rms_norm_cpu(&mut x2, &[2.0, 2.0, 1.0, 1.0], &w, 0.0, &mut out);
        assert_eq!(x2, x);
        assert_eq!(out, [3.0 * s, 4.0 * s * 2.0, 1.0, 2.0]);
    }
}
