//! The reduce of the split attention: [`reduce_kernel`] combines the partials that each
//! split of [`kernel`](super::attention::kernel) leaves into the output rows, and
//! [`reduce_sink_kernel`] also writes them in the form the output projection reads (q8_1
//! tiles or f16 rows); with their names, parameters, launch and the shapes they take. A
//! launch of its own after the attention's, where the combining attention
//! ([`combine_kernel`](super::attention::combine_kernel)) does not run. Kept apart from the
//! attention body so that each file holds one job; `super::attention` re-exports
//! everything public here, so every path stays `ops::attention::...`.

use smelt_ptx::{Cmp, Kernel, Load, Store, F32};

use super::{dim, kernel_params, Launch};
use crate::fused::Sink;

/// Most splits [`reduce_kernel`] combines.
pub const MAX_SPLITS: usize = 256;

/// Largest block of [`reduce_kernel`]: one thread per value of the largest head.
pub const REDUCE_THREADS: u32 = 256;

/// Name of [`reduce_kernel`].
pub const REDUCE: &str = "attention_reduce";
/// Name of [`reduce_sink_kernel`] writing q8_1 tiles.
pub const REDUCE_Q8: &str = "attention_reduce_q8_1";
/// Name of [`reduce_sink_kernel`] writing f16 rows.
pub const REDUCE_F16: &str = "attention_reduce_f16";

/// Name of [`reduce_sink_kernel`] for `sink`.
pub const fn reduce_sink_name(sink: Sink) -> &'static str {
    match sink {
        Sink::Q8_1 => REDUCE_Q8,
        Sink::F16Rows => REDUCE_F16,
    }
}

/// Whether [`reduce_sink_kernel`] takes rows of `n_head` heads of `head_dim`: whole warps
/// per head (one q8_1 block per warp), one thread per value, whole tiles per row.
pub fn reduce_q8_fits(n_head: usize, head_dim: usize) -> bool {
    head_dim % 32 == 0
        && head_dim <= REDUCE_THREADS as usize
        && (n_head * head_dim) % crate::TILE == 0
}

/// Launch of [`reduce_kernel`] for `rows` query rows.
pub fn reduce_launch(rows: usize, n_head: usize, head_dim: usize) -> Launch {
    Launch::new(
        (dim(rows * n_head), 1, 1),
        (
            (head_dim.div_ceil(32) * 32).clamp(32, REDUCE_THREADS as usize) as u32,
            1,
            1,
        ),
    )
}

/// Combines the split partials into the attention output.
///
/// Parameters: `part_acc: *const f32, part_ml: *const f32, out: *mut f32 ([rows][n_head *
/// head_dim]), n_splits: u32 (at most [`MAX_SPLITS`]), head_dim: u32`. Launch:
/// [`reduce_launch`]: one block per (row, head), one thread per value. Every row of the
/// batch must belong to a sequence of the attention call (rows that do not read stale
/// partials).
///
/// The split weights `2^(m_s - max m)` and the normalizer are computed once per block
/// (threads over splits, block reductions), then each thread sums its value over the
/// splits with sixteen loads in flight.
pub fn reduce_kernel(k: &Kernel) {
    reduce_body(k, None);
}

/// [`reduce_kernel`], and what the output projection reads of its output (one launch
/// instead of two), in `sink`'s form: q8_1 tiles (each warp quantizes its 32 values as one
/// block, exactly as `act::quantize_kernel` would) or f16 rows (as
/// `gemm::f16::act_kernel` writes them).
///
/// Parameters: `part_acc, part_ml, out` as [`reduce_kernel`], then `q: *mut u8 (the tiles
/// or rows of each row)`, `n_splits: u32, head_dim: u32`. Only for shapes
/// [`reduce_q8_fits`] accepts. Launch: [`reduce_launch`].
pub fn reduce_sink_kernel(k: &Kernel, sink: Sink) {
    reduce_body(k, Some(sink));
}

kernel_params! {
    /// Arguments of [`reduce_kernel`].
    ReduceArgs, ReduceRegs {
        part_acc: Ptr,
        part_ml: Ptr,
        out: Ptr,
        n_splits: U32,
        head_dim: U32,
    }
}

kernel_params! {
    /// Arguments of [`reduce_sink_kernel`].
    ReduceQ8Args, ReduceQ8Regs {
        part_acc: Ptr,
        part_ml: Ptr,
        out: Ptr,
        q: Ptr,
        n_splits: U32,
        head_dim: U32,
    }
}

fn reduce_body(k: &Kernel, sink: Option<Sink>) {
    // Heads have at most 256 values (HEAD_DIMS), and the cap leaves room for the
    // sixteen loads in flight.
    k.max_threads(REDUCE_THREADS, 1, 1);
    let (part_acc, part_ml, out, q, n_splits, head_dim) = if let Some(sink) = sink {
        let r = ReduceQ8Regs::declare(k);
        (
            r.part_acc,
            r.part_ml,
            r.out,
            Some((r.q, sink)),
            r.n_splits,
            r.head_dim,
        )
    } else {
        let r = ReduceRegs::declare(k);
        (r.part_acc, r.part_ml, r.out, None, r.n_splits, r.head_dim)
    };
    let wsh = k.shared::<F32>("reduce_w", MAX_SPLITS as u32, 16);
    let red = super::reduce_scratch(k, "reduce_red");
    let wb = k.shared_base(&wsh);
    let idx = k.ctaid_x();
    let d = k.tid_x();
    let first = k.mul(k.reg(), idx, n_splits);
    let ns = k.min(k.reg(), n_splits, MAX_SPLITS as u32);
    let mloc = k.f32(f32::NEG_INFINITY);
    k.stride_loop(d, ns, k.ntid_x(), |k, s| {
        let i = k.add(k.reg(), first, s);
        let ms = k.load::<F32>(Load::GLOBAL, k.elem_addr(part_ml, i, 8));
        k.st(Store::SHARED, k.mad(k.reg(), s, 4u32, wb), ms);
        k.max(mloc, mloc, ms);
    });
    let mx = super::block_max(k, mloc, &red);
    let lsum = k.f32(0.0);
    k.stride_loop(d, ns, k.ntid_x(), |k, s| {
        let i = k.add(k.reg(), first, s);
        let ls = k.load::<F32>(Load::GLOBAL, k.elem_addr(part_ml, i, 8).at(4));
        let wa = k.mad(k.reg(), s, 4u32, wb);
        let ms = k.load::<F32>(Load::SHARED, wa);
        let w = k.sub(k.reg(), ms, mx);
        k.ex2_approx(w, w);
        let empty = k.cmp(Cmp::Eq, ms, f32::NEG_INFINITY);
        k.selp(w, 0.0f32, w, empty);
        k.st(Store::SHARED, wa, w);
        k.fma(lsum, ls, w, lsum);
    });
    // The block sum's barriers also publish the weights.
    let l = super::block_sum(k, lsum, &red);
    let live = k.lt(d, head_dim);
    k.if_(live, |k| {
        let o = k.f32(0.0);
        // Sixteen splits' loads in flight: a decode step's few splits take one round.
        k.stride_loop(0u32, ns, 16u32, |k, s0| {
            let mut terms = Vec::new();
            for u in 0..16u32 {
                let s = k.add(k.reg(), s0, u);
                let ok = k.lt(s, ns);
                let a = k.f32(0.0);
                let w = k.f32(0.0);
                k.guarded(ok, |k| {
                    let i = k.add(k.reg(), first, s);
                    let ai = k.mad(k.reg(), i, head_dim, d);
                    k.ld(Load::GLOBAL, a, k.elem_addr(part_acc, ai, 4));
                    k.ld(Load::SHARED, w, k.mad(k.reg(), s, 4u32, wb));
                });
                terms.push((a, w));
            }
            for (a, w) in terms {
                k.fma(o, a, w, o);
            }
        });
        k.div_rn(o, o, l);
        let oi = k.mad(k.reg(), idx, head_dim, d);
        k.st(Store::GLOBAL, k.elem_addr(out, oi, 4), o);
        if let Some((q, sink)) = q {
            let lane = k.and(k.reg(), d, 31u32);
            crate::fused::sink_warp_value(k, sink, o, lane, oi, q);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn the_reduce_q8_kernel_builds_and_says_which_shapes_it_takes() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            m.kernel(REDUCE_Q8, |k| reduce_sink_kernel(k, Sink::Q8_1))
                .unwrap();
            let ptx = m.to_ptx();
            assert!(ptx.contains(&format!(".entry {REDUCE_Q8}(")));
            assert!(ptx.contains(".param .u64 q"));
            assert!(ptx.contains("st.global.u8"));
            assert!(ptx.contains("st.global.u16"));
            assert!(ptx.contains("div.rn.f32"));
        }
        // Llama-3-8B (32 x 128), Gemma 3 270M (4 x 256): yes; SmolLM2 (9 x 64, rows of 576
        // values, not whole tiles) and head sizes that split a warp: no.
        assert!(reduce_q8_fits(32, 128));
        assert!(reduce_q8_fits(4, 256));
        assert!(!reduce_q8_fits(9, 64));
        assert!(!reduce_q8_fits(16, 80));
        assert!(!reduce_q8_fits(2, 512));
    }
}
