//! Per-row reductions over logits: softmax, argmax (greedy decoding without copying the
//! logits to the host), and sampling.

use smelt_ptx::{Cmp, Kernel, Load, Reg, Shfl, Store, F32, FULL_WARP, U32};

use super::{block_max, block_sum, dim, kernel_params, reduce_scratch, Launch, LOG2E};
use crate::catalog::Entry;

/// Name of [`softmax_kernel`].
pub const SOFTMAX: &str = "softmax_rows";
/// Name of [`argmax_kernel`].
pub const ARGMAX: &str = "argmax_rows";
/// Name of [`argmax_split_kernel`].
pub const ARGMAX_SPLIT: &str = "argmax_rows_split";
/// Name of [`sample_kernel`].
pub const SAMPLE: &str = "sample_rows";
/// Largest `top_k` of [`sample_kernel`] (a `top_k` of 0 or above means this).
pub const MAX_TOP_K: usize = 64;

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    vec![
        (SOFTMAX.to_string(), Box::new(softmax_kernel)),
        (ARGMAX.to_string(), Box::new(argmax_kernel)),
        (ARGMAX_SPLIT.to_string(), Box::new(argmax_split_kernel)),
        (SAMPLE.to_string(), Box::new(sample_kernel)),
    ]
}

/// Threads per block of the per-row kernels: a row of a large vocabulary is read by one
/// block, so it gets the most threads a block can have.
pub const ROW_THREADS: u32 = 1024;

/// Threads per block of [`sample_kernel`]: half of [`ROW_THREADS`], so its many live
/// values fit in registers (128 a thread) instead of spilling.
pub const SAMPLE_THREADS: u32 = 512;

/// Loads each thread keeps in flight while it walks a row.
const UNROLL: u32 = 4;

/// Launch of softmax and argmax: one block of [`ROW_THREADS`] per row.
pub fn launch(rows: usize) -> Launch {
    Launch::new((dim(rows), 1, 1), (ROW_THREADS, 1, 1))
}

/// Threads per block of [`argmax_split_kernel`].
pub const SPLIT_THREADS: u32 = 256;

/// Values one block of [`argmax_split_kernel`] scans: eight a thread, two 16-byte loads.
pub const SPLIT_VALUES: usize = 8 * SPLIT_THREADS as usize;

/// Most blocks per row of [`argmax_split_kernel`].
pub const MAX_SPLIT_PARTS: usize = 256;

/// Blocks per row of [`argmax_split_kernel`] for rows of `cols` values.
pub fn split_parts(cols: usize) -> usize {
    cols.div_ceil(SPLIT_VALUES).clamp(1, MAX_SPLIT_PARTS)
}

/// Launch of [`argmax_split_kernel`]: [`split_parts`] blocks per row.
pub fn split_launch(rows: usize, cols: usize) -> Launch {
    Launch::new(
        (dim(split_parts(cols)), dim(rows), 1),
        (SPLIT_THREADS, 1, 1),
    )
}

/// Launch of [`sample_kernel`]: one block of [`SAMPLE_THREADS`] per row.
pub fn sample_launch(rows: usize) -> Launch {
    Launch::new((dim(rows), 1, 1), (SAMPLE_THREADS, 1, 1))
}

/// Walks this thread's values of the row at `xs` (`cols` floats) in increasing index
/// order, [`UNROLL`] loads issued before any is used (16-byte loads when `cols` is a
/// multiple of 4, which keeps four times as many bytes in flight: one block reading a
/// whole row is latency bound); `body(k, index, value, valid)` runs for each slot
/// (`valid` false past the row's end, where the value is NaN).
fn scan_row(
    k: &Kernel,
    threads: u32,
    xs: Reg<smelt_ptx::U64>,
    cols: Reg<U32>,
    mut body: impl FnMut(&Kernel, Reg<U32>, Reg<F32>, Reg<smelt_ptx::Pred>),
) {
    let tid = k.tid_x();
    let low = k.and(k.reg(), cols, 3u32);
    let vec4 = k.eq(low, 0u32);
    // 16-byte loads need a 16-byte aligned start too (a split row's part may not have one).
    let addr_low = k.cvt(k.reg::<U32>(), xs, smelt_ptx::Exact);
    k.and(addr_low, addr_low, 15u32);
    let aligned = k.eq(addr_low, 0u32);
    k.and(vec4, vec4, aligned);
    k.if_(vec4, |k| {
        let n4 = k.shr(k.reg(), cols, 2u32);
        k.stride_loop(tid, n4, threads * UNROLL, |k, i| {
            let mut slots = Vec::new();
            for u in 0..UNROLL {
                let j = k.add(k.reg(), i, u * threads);
                let ok = k.lt(j, n4);
                let v: [Reg<F32>; 4] = std::array::from_fn(|_| k.f32(f32::NAN));
                k.guarded(ok, |k| {
                    k.ld_v4(Load::GLOBAL_NC, v, k.elem_addr(xs, j, 16));
                });
                slots.push((j, v, ok));
            }
            for (j, v, ok) in slots {
                for (e, &x) in v.iter().enumerate() {
                    let idx = k.mad(k.reg(), j, 4u32, e as u32);
                    body(k, idx, x, ok);
                }
            }
        });
    });
    k.if_(!vec4, |k| {
        k.stride_loop(tid, cols, threads * UNROLL, |k, i| {
            let mut slots = Vec::new();
            for u in 0..UNROLL {
                let idx = k.add(k.reg(), i, u * threads);
                let ok = k.lt(idx, cols);
                let v = k.f32(f32::NAN);
                k.guarded(ok, |k| {
                    k.ld(Load::GLOBAL_NC, v, k.elem_addr(xs, idx, 4));
                });
                slots.push((idx, v, ok));
            }
            for (idx, v, ok) in slots {
                body(k, idx, v, ok);
            }
        });
    });
}

kernel_params! {
    /// Arguments of [`softmax_kernel`].
    SoftmaxArgs, SoftmaxRegs {
        x: Ptr,
        out: Ptr,
        cols: U32,
    }
}

/// `out[r] = softmax(x[r])` over rows of `cols` values.
///
/// Parameters: `x: *const f32, out: *mut f32, cols: u32`. Launch: [`launch`]. `out` may
/// be `x`. `exp` is `ex2.approx` of the max-shifted value times log2(e); the sum is an f32
/// block reduction and the output is `e * (1 / sum)`.
pub fn softmax_kernel(k: &Kernel) {
    k.max_threads(ROW_THREADS, 1, 1);
    let SoftmaxRegs { x, out, cols } = SoftmaxRegs::declare(k);
    let scratch = reduce_scratch(k, "softmax_red");
    let base = k.mul_wide(k.reg(), k.ctaid_x(), cols);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let os = k.add(k.reg(), out, base);
    let mx = k.f32(f32::NEG_INFINITY);
    // max.f32 ignores the NaN of slots past the row.
    scan_row(k, ROW_THREADS, xs, cols, |k, _, v, _| {
        k.max(mx, mx, v);
    });
    let mx = block_max(k, mx, &scratch);
    let shift = k.mul(k.reg(), mx, LOG2E);
    let sum = k.f32(0.0);
    let nshift = k.neg(k.reg(), shift);
    scan_row(k, ROW_THREADS, xs, cols, |k, _, v, ok| {
        let e = k.fma(k.reg(), v, LOG2E, nshift);
        k.ex2_approx(e, e);
        k.guarded(ok, |k| {
            k.add(sum, sum, e);
        });
    });
    let total = block_sum(k, sum, &scratch);
    let inv = k.div_rn(k.reg(), 1.0f32, total);
    scan_row(k, ROW_THREADS, xs, cols, |k, i, v, ok| {
        let e = k.fma(k.reg(), v, LOG2E, nshift);
        k.ex2_approx(e, e);
        k.mul(e, e, inv);
        k.guarded(ok, |k| k.st(Store::GLOBAL, k.elem_addr(os, i, 4), e));
    });
}

kernel_params! {
    /// Arguments of [`argmax_kernel`].
    ArgmaxArgs, ArgmaxRegs {
        x: Ptr,
        out: Ptr,
        cols: U32,
    }
}

/// Index of the largest value of each row: the first one on ties; NaN is never chosen;
/// a row of only NaN gives 0.
///
/// Parameters: `x: *const f32, out: *mut u32 (one per row), cols: u32`. Launch:
/// [`launch`].
pub fn argmax_kernel(k: &Kernel) {
    k.max_threads(ROW_THREADS, 1, 1);
    let ArgmaxRegs { x, out, cols } = ArgmaxRegs::declare(k);
    let base = k.mul_wide(k.reg(), k.ctaid_x(), cols);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let (_, bi) = block_argmax(k, ROW_THREADS, xs, cols, None);
    let none = k.eq(bi, u32::MAX);
    k.selp(bi, 0u32, bi, none);
    let first = k.eq(k.tid_x(), 0u32);
    k.guarded(first, |k| {
        k.st(Store::GLOBAL, k.elem_addr(out, k.ctaid_x(), 4), bi)
    });
}

kernel_params! {
    /// Arguments of [`argmax_split_kernel`].
    ArgmaxSplitArgs, ArgmaxSplitRegs {
        x: Ptr,
        out: Ptr,
        cols: U32,
        best: Ptr,
        counters: Ptr,
    }
}

/// [`argmax_kernel`] with each row split over [`split_parts`] blocks (one block reading a
/// 128k-value row took 14.5 us of a 1.8 ms decode step on an H200, latency bound): each
/// block reduces its part, folds `(value, index)` into the row's 64-bit word with
/// `atom.max` (the value's bits made unsigned-ordered above, the complement of the index
/// below, so the larger value wins and on ties the smaller index), and the last block of
/// the row to count itself in (a counter per row, after a GPU-scope fence) writes the
/// index, and puts the word and the counter back to zero for the next launch.
///
/// Parameters: `x: *const f32, out: *mut u32 (one per row), cols: u32, best: *mut u64
/// (one per row), counters: *mut u32 (one per row)`; `best` and `counters` zero before
/// the first launch, and every launch leaves them so. Launch: [`split_launch`].
pub fn argmax_split_kernel(k: &Kernel) {
    k.max_threads(SPLIT_THREADS, 1, 1);
    let ArgmaxSplitRegs {
        x,
        out,
        cols,
        best,
        counters,
    } = ArgmaxSplitRegs::declare(k);
    let row = k.ctaid_y();
    let part = k.ctaid_x();
    let parts = k.special(smelt_ptx::Special::Nctaid(smelt_ptx::Dim::X));
    // Parts of a multiple of four values, so that 16-byte loads stay aligned.
    let chunk = k.add(k.reg(), cols, parts);
    k.sub(chunk, chunk, 1u32);
    k.div_int(chunk, chunk, parts);
    k.add(chunk, chunk, 3u32);
    k.and(chunk, chunk, !3u32);
    let lo = k.mul(k.reg(), part, chunk);
    k.min(lo, lo, cols);
    let hi = k.add(k.reg(), lo, chunk);
    k.min(hi, hi, cols);
    let len = k.sub(k.reg(), hi, lo);
    let start = k.mad(k.reg(), row, cols, lo);
    let xs = k.elem_addr(x, start, 4);
    let (bv, bi) = block_argmax(k, SPLIT_THREADS, xs, len, Some(lo));
    let first = k.eq(k.tid_x(), 0u32);
    k.if_(first, |k| {
        let word = k.elem_addr(best, row, 8);
        let held = k.cmp(Cmp::Ne, bi, u32::MAX);
        k.if_(held, |k| {
            // Unsigned order of the float: negative values flipped, positive ones above.
            let bits = k.reg::<U32>();
            k.raw(format!("mov.b32 {bits}, {bv}"));
            let neg = k.shr(k.reg(), bits, 31u32);
            let flip = k.u32(0x8000_0000);
            let negp = k.eq(neg, 1u32);
            k.selp(flip, 0xFFFF_FFFFu32, 0x8000_0000u32, negp);
            k.xor(bits, bits, flip);
            let low = k.not(k.reg(), bi);
            let key = k.reg::<smelt_ptx::U64>();
            k.raw(format!("mov.b64 {key}, {{{low}, {bits}}}"));
            k.raw(format!("red.global.max.u64 [{word}], {key}"));
        });
        k.membar(smelt_ptx::Scope::Gpu);
        let at = k.elem_addr(counters, row, 4);
        let old = k.atom_add(smelt_ptx::Space::Global, k.reg::<U32>(), at, 1u32);
        let last = k.sub(k.reg(), parts, 1u32);
        let is_last = k.eq(old, last);
        k.if_(is_last, |k| {
            k.membar(smelt_ptx::Scope::Gpu);
            let key = k.reg::<smelt_ptx::U64>();
            let zero = k.reg::<smelt_ptx::U64>();
            k.raw(format!("mov.u64 {zero}, 0"));
            k.raw(format!("atom.global.exch.b64 {key}, [{word}], {zero}"));
            let (low, high) = (k.reg::<U32>(), k.reg::<U32>());
            k.raw(format!("mov.b64 {{{low}, {high}}}, {key}"));
            let idx = k.not(k.reg(), low);
            // Nothing held (a row of NaN): index 0, as the one-block kernel gives.
            let empty = k.cmp(Cmp::Eq, key, 0u64);
            k.selp(idx, 0u32, idx, empty);
            k.st(Store::GLOBAL, k.elem_addr(out, row, 4), idx);
            let z = k.u32(0);
            k.st(Store::GLOBAL, at, z);
        });
    });
}

/// The first largest value of the `len` values at `xs` and its index (plus `offset`),
/// reduced over a block of `threads` threads: `(value, index)` in every lane of warp 0,
/// index `u32::MAX` when every value is NaN.
fn block_argmax(
    k: &Kernel,
    threads: u32,
    xs: Reg<smelt_ptx::U64>,
    len: Reg<U32>,
    offset: Option<Reg<U32>>,
) -> (Reg<F32>, Reg<U32>) {
    let sv = k.shared::<F32>("argmax_v", 32, 16);
    let si = k.shared::<U32>("argmax_i", 32, 16);
    let tid = k.tid_x();
    // (value, index), index u32::MAX while nothing is held.
    let bv = k.f32(f32::NEG_INFINITY);
    let bi = k.u32(u32::MAX);
    // Slots past the row are NaN, which is never taken.
    scan_row(k, threads, xs, len, |k, i, v, _| {
        // Take v when it is larger, or when nothing is held yet and v is a number
        // (-inf included). Indices rise along a thread's loop: ties keep the first.
        let gt = k.cmp(Cmp::Gt, v, bv);
        let none = k.eq(bi, u32::MAX);
        let num = k.cmp(Cmp::Eq, v, v);
        k.and(none, none, num);
        k.or(gt, gt, none);
        k.selp(bv, v, bv, gt);
        let idx = match offset {
            Some(o) => k.add(k.reg(), i, o),
            None => i,
        };
        k.selp(bi, idx, bi, gt);
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
        let nw = threads / 32;
        let has = k.lt(lane, nw);
        k.mov(bv, f32::NEG_INFINITY);
        k.mov(bi, u32::MAX);
        k.guarded(has, |k| {
            k.ld(Load::SHARED, bv, k.mad(k.reg(), lane, 4u32, vb));
            k.ld(Load::SHARED, bi, k.mad(k.reg(), lane, 4u32, ib));
        });
        warp_round(k);
    });
    (bv, bi)
}

/// Sampling settings of one row, as [`sample_kernel`] reads them from device memory (so
/// a captured decode step samples every request with its own settings).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct SampleParams {
    /// Candidates kept (1..=64; 0 or more than 64 means 64).
    pub top_k: u32,
    /// Nucleus: the smallest prefix of the candidates whose probability reaches this.
    pub top_p: f32,
    /// Softmax temperature, above 0 (greedy decoding is [`argmax_kernel`]).
    pub temperature: f32,
    /// The row's uniform random number in [0, 1): the draw is a function of it, so a run
    /// is reproducible from the host's random stream.
    pub uniform: f32,
}

impl SampleParams {
    /// The four words the kernel reads.
    pub fn words(&self) -> [u32; 4] {
        [
            self.top_k,
            self.top_p.to_bits(),
            self.temperature.to_bits(),
            self.uniform.to_bits(),
        ]
    }
}

/// The total order of floats as `u32`: larger key, larger value (+0 above -0); NaN is 0,
/// below everything (no number maps to 0).
fn order_key(k: &Kernel, v: Reg<F32>) -> Reg<U32> {
    let bits = k.bitcast::<U32, F32>(v);
    let neg = k.cmp(Cmp::Lt, bits.cast::<smelt_ptx::S32>(), 0i32);
    let flipped = k.not(k.reg(), bits);
    let key = k.or(k.reg(), bits, 0x8000_0000u32);
    k.selp(key, flipped, key, neg);
    let nan = k.reg::<smelt_ptx::Pred>();
    k.raw(format!("testp.notanumber.f32 {nan}, {v}"));
    k.selp(key, 0u32, key, nan);
    key
}

kernel_params! {
    /// Arguments of [`sample_kernel`].
    SampleArgs, SampleRegs {
        logits: Ptr,
        out: Ptr,
        params: Ptr,
        cols: U32,
    }
}

/// `top_k` → `temperature` → `top_p` sampling of each row, from the row's uniform number.
///
/// Parameters: `logits: *const f32, out: *mut u32 (one token per row), params: *const
/// SampleParams (one per row), cols: u32`. Launch: [`sample_launch`].
///
/// Exactly: the candidates are the `k = min(top_k, 64, non-NaN count)` largest values by
/// (value descending, index ascending; +0 above -0), found by a radix select over the
/// values' order keys (and over indices for ties at the threshold), sorted; their
/// probabilities are `p_i = 2^((v_i - v_0) · log2(e) / temperature)`; the nucleus is the
/// shortest prefix whose cumulative sum reaches `top_p · Σp` (at least one); the token is
/// the first of the nucleus whose cumulative sum exceeds `uniform · Σ nucleus` (the last
/// one if rounding leaves none). A row of only NaN gives 0.
pub fn sample_kernel(k: &Kernel) {
    // The cap makes ptxas keep to 128 registers a thread; without it, it took more than a
    // block of 1024 threads can have, which failed at launch (LAUNCH_OUT_OF_RESOURCES on
    // an H100), hence also the smaller block.
    k.max_threads(SAMPLE_THREADS, 1, 1);
    let SampleRegs {
        logits,
        out,
        params,
        cols,
    } = SampleRegs::declare(k);
    let hist = k.shared::<U32>("sample_hist", 256, 16);
    // 0: prefix / threshold key, 1: remaining rank, 2: count at the chosen bin,
    // 3: candidate counter, 4: index threshold.
    let sc = k.shared::<U32>("sample_sc", 8, 16);
    let ckey = k.shared::<U32>("sample_ckey", MAX_TOP_K as u32, 16);
    let cidx = k.shared::<U32>("sample_cidx", MAX_TOP_K as u32, 16);
    let sval = k.shared::<F32>("sample_sval", MAX_TOP_K as u32, 16);
    let sidx = k.shared::<U32>("sample_sidx", MAX_TOP_K as u32, 16);
    let red = reduce_scratch(k, "sample_red");
    let row = k.ctaid_x();
    let base = k.mul_wide(k.reg(), row, cols);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), logits, base);
    let pw = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, pw, k.elem_addr(params, row, 16));
    let top_k = pw[0];
    let top_p = k.bitcast::<F32, U32>(pw[1]);
    let temp = k.bitcast::<F32, U32>(pw[2]);
    let uniform = k.bitcast::<F32, U32>(pw[3]);
    let tid = k.tid_x();
    let lane = k.and(k.reg(), tid, 31u32);
    let warp = k.shr(k.reg(), tid, 5u32);
    let hb = k.shared_base(&hist);
    let scb = k.shared_base(&sc);
    let w0 = k.eq(warp, 0u32);
    let lane0 = k.eq(lane, 0u32);
    let t0 = k.eq(tid, 0u32);

    let clear_hist = |k: &Kernel| {
        let has = k.lt(tid, 256u32);
        k.guarded(has, |k| {
            let z = k.u32(0);
            k.st(Store::SHARED, k.mad(k.reg(), tid, 4u32, hb), z);
        });
    };
    let sc_at = |i: i64| scb.at(4 * i);

    // Pass 1 over the keys' top byte, counting the numbers on the way.
    clear_hist(k);
    k.bar_sync();
    let count = k.f32(0.0);
    scan_row(k, SAMPLE_THREADS, xs, cols, |k, _, v, ok| {
        let key = order_key(k, v);
        let num = k.cmp(Cmp::Ne, key, 0u32);
        k.and(num, num, ok);
        k.guarded(num, |k| {
            k.add(count, count, 1.0f32);
            let bin = k.shr(k.reg(), key, 24u32);
            k.red_add::<U32>(
                smelt_ptx::Space::Shared,
                k.mad(k.reg(), bin, 4u32, hb),
                1u32,
            );
        });
    });
    let n_valid = block_sum(k, count, &red);
    let n_valid = k.cvt(k.reg::<U32>(), n_valid, smelt_ptx::IntRound::Rzi);
    let kk = k.sub(k.reg(), top_k, 1u32);
    k.min(kk, kk, (MAX_TOP_K - 1) as u32); // top_k 0 wraps to u32::MAX: 64
    k.add(kk, kk, 1u32);
    k.min(kk, kk, n_valid);
    let none = k.eq(kk, 0u32);
    k.if_(none, |k| {
        k.guarded(t0, |k| {
            let z = k.u32(0);
            k.st(Store::GLOBAL, k.elem_addr(out, row, 4), z);
        });
        k.exit();
    });
    k.guarded(t0, |k| {
        let z = k.u32(0);
        k.st(Store::SHARED, sc_at(0), z);
        k.st(Store::SHARED, sc_at(1), kk);
        k.st(Store::SHARED, sc_at(3), z);
        let all = k.u32(u32::MAX);
        k.st(Store::SHARED, sc_at(4), all);
    });
    k.bar_sync();

    // Warp 0 finds the bin holding the element of rank `sc[1]` (1-based), scanning bins
    // from the top (`descending`) or the bottom, and narrows prefix, rank and count.
    let find_bin = |k: &Kernel, shift: u32, descending: bool, prefix_slot: i64| {
        k.if_(w0, |k| {
            let rank = k.load::<U32>(Load::SHARED, sc_at(1));
            // Lane l holds 8 bins in scan order: bins 8l..8l+8 counted from the scan's start.
            let bins: Vec<Reg<U32>> = (0..8u32)
                .map(|j| {
                    let pos = k.mad(k.reg(), lane, 8u32, j);
                    let bin = if descending {
                        k.sub(k.reg(), k.u32(255), pos)
                    } else {
                        pos
                    };
                    k.load::<U32>(Load::SHARED, k.mad(k.reg(), bin, 4u32, hb))
                })
                .collect();
            let sum = k.copy(bins[0]);
            for &h in &bins[1..] {
                k.add(sum, sum, h);
            }
            let incl = k.copy(sum);
            for off in [1u32, 2, 4, 8, 16] {
                let o = k.shfl_sync(Shfl::Up, k.reg::<U32>(), incl, off, FULL_WARP);
                let take = k.cmp(Cmp::Ge, lane, off);
                k.guarded(take, |k| {
                    k.add(incl, incl, o);
                });
            }
            let before = k.sub(k.reg(), incl, sum);
            // The lane where before < rank <= incl.
            let mine = k.lt(before, rank);
            let le = k.cmp(Cmp::Le, rank, incl);
            k.and(mine, mine, le);
            k.if_(mine, |k| {
                let c = k.copy(before);
                let done = k.reg::<smelt_ptx::Pred>();
                k.setp(Cmp::Ne, done, lane, lane); // false
                for (j, &h) in bins.iter().enumerate() {
                    let next = k.add(k.reg(), c, h);
                    let hit = k.cmp(Cmp::Ge, next, rank);
                    let fresh = k.not(k.reg(), done);
                    k.and(hit, hit, fresh);
                    k.guarded(hit, |k| {
                        let pos = k.mad(k.reg(), lane, 8u32, j as u32);
                        let bin = if descending {
                            k.sub(k.reg(), k.u32(255), pos)
                        } else {
                            pos
                        };
                        k.shl(bin, bin, shift);
                        let p = k.load::<U32>(Load::SHARED, sc_at(prefix_slot));
                        let p = if prefix_slot == 4 && shift == 16 {
                            // The index search starts from an all-ones marker.
                            k.mov(p, 0u32)
                        } else {
                            p
                        };
                        k.or(p, p, bin);
                        k.st(Store::SHARED, sc_at(prefix_slot), p);
                        let r = k.sub(k.reg(), rank, c);
                        k.st(Store::SHARED, sc_at(1), r);
                        k.st(Store::SHARED, sc_at(2), h);
                    });
                    k.or(done, done, hit);
                    k.mov(c, next);
                }
            });
        });
        k.bar_sync();
    };

    find_bin(k, 24, true, 0);
    for shift in [16u32, 8, 0] {
        clear_hist(k);
        k.bar_sync();
        let prefix = k.load::<U32>(Load::SHARED, sc_at(0));
        let mask = !((1u32 << (shift + 8)) - 1);
        scan_row(k, SAMPLE_THREADS, xs, cols, |k, _, v, ok| {
            let key = order_key(k, v);
            let hi = k.and(k.reg(), key, mask);
            let m = k.cmp(Cmp::Eq, hi, prefix);
            let num = k.cmp(Cmp::Ne, key, 0u32);
            k.and(m, m, num);
            k.and(m, m, ok);
            k.guarded(m, |k| {
                let bin = k.shr(k.reg(), key, shift);
                k.and(bin, bin, 255u32);
                k.red_add::<U32>(
                    smelt_ptx::Space::Shared,
                    k.mad(k.reg(), bin, 4u32, hb),
                    1u32,
                );
            });
        });
        k.bar_sync();
        find_bin(k, shift, true, 0);
    }
    // Ties at the threshold key: keep the lowest indices, found the same way over index
    // bits (rows are shorter than 2^24), unless every tie is kept.
    let thr = k.load::<U32>(Load::SHARED, sc_at(0));
    let rank = k.load::<U32>(Load::SHARED, sc_at(1));
    let ties = k.load::<U32>(Load::SHARED, sc_at(2));
    let some = k.lt(rank, ties);
    k.if_(some, |k| {
        for shift in [16u32, 8, 0] {
            clear_hist(k);
            k.bar_sync();
            let prefix = k.load::<U32>(Load::SHARED, sc_at(4));
            let first = shift == 16;
            let mask = !((1u32 << (shift + 8)) - 1);
            scan_row(k, SAMPLE_THREADS, xs, cols, |k, i, v, ok| {
                let key = order_key(k, v);
                let m = k.cmp(Cmp::Eq, key, thr);
                k.and(m, m, ok);
                if !first {
                    let hi = k.and(k.reg(), i, mask);
                    let same = k.cmp(Cmp::Eq, hi, prefix);
                    k.and(m, m, same);
                }
                k.guarded(m, |k| {
                    let bin = k.shr(k.reg(), i, shift);
                    k.and(bin, bin, 255u32);
                    k.red_add::<U32>(
                        smelt_ptx::Space::Shared,
                        k.mad(k.reg(), bin, 4u32, hb),
                        1u32,
                    );
                });
            });
            k.bar_sync();
            find_bin(k, shift, false, 4);
        }
    });
    let ithr = k.load::<U32>(Load::SHARED, sc_at(4));

    // Gather the k candidates (unordered), then rank them.
    let ckb = k.shared_base(&ckey);
    let cib = k.shared_base(&cidx);
    scan_row(k, SAMPLE_THREADS, xs, cols, |k, i, v, ok| {
        let key = order_key(k, v);
        let above = k.cmp(Cmp::Gt, key, thr);
        let at = k.cmp(Cmp::Eq, key, thr);
        let low = k.cmp(Cmp::Le, i, ithr);
        k.and(at, at, low);
        k.or(above, above, at);
        k.and(above, above, ok);
        let slot = k.u32(MAX_TOP_K as u32);
        k.guarded(above, |k| {
            k.atom_add::<U32>(smelt_ptx::Space::Shared, slot, sc_at(3), 1u32);
        });
        // The selection gives exactly kk candidates; the bound only keeps a bug in bounds.
        let fits = k.lt(slot, MAX_TOP_K as u32);
        k.guarded(fits, |k| {
            k.st(Store::SHARED, k.mad(k.reg(), slot, 4u32, ckb), key);
            k.st(Store::SHARED, k.mad(k.reg(), slot, 4u32, cib), i);
        });
    });
    k.bar_sync();
    let svb = k.shared_base(&sval);
    let sib = k.shared_base(&sidx);
    let mine = k.lt(tid, kk);
    k.if_(mine, |k| {
        let key = k.load::<U32>(Load::SHARED, k.mad(k.reg(), tid, 4u32, ckb));
        let idx = k.load::<U32>(Load::SHARED, k.mad(k.reg(), tid, 4u32, cib));
        let rank = k.u32(0);
        k.for_count(kk, |k, j| {
            let oj = k.load::<U32>(Load::SHARED, k.mad(k.reg(), j, 4u32, ckb));
            let ij = k.load::<U32>(Load::SHARED, k.mad(k.reg(), j, 4u32, cib));
            let before = k.cmp(Cmp::Gt, oj, key);
            let eq = k.cmp(Cmp::Eq, oj, key);
            let lower = k.lt(ij, idx);
            k.and(eq, eq, lower);
            k.or(before, before, eq);
            let inc = k.selp(k.reg::<U32>(), 1u32, 0u32, before);
            k.add(rank, rank, inc);
        });
        // Back from the key to the value.
        let pos = k.cmp(Cmp::Ge, key, 0x8000_0000u32);
        let bits = k.xor(k.reg(), key, 0x8000_0000u32);
        let nbits = k.not(k.reg(), key);
        k.selp(bits, bits, nbits, pos);
        let v = k.bitcast::<F32, U32>(bits);
        k.st(Store::SHARED, k.mad(k.reg(), rank, 4u32, svb), v);
        k.st(Store::SHARED, k.mad(k.reg(), rank, 4u32, sib), idx);
    });
    k.bar_sync();

    // Warp 0: probabilities, nucleus and draw over the sorted candidates (two per lane).
    k.if_(w0, |k| {
        let v0 = k.load::<F32>(Load::SHARED, sval.at(0));
        let c = k.div_rn(k.reg(), LOG2E, temp);
        let e: Vec<Reg<F32>> = (0..2u32)
            .map(|j| {
                let i = k.mad(k.reg(), lane, 2u32, j);
                let ok = k.lt(i, kk);
                let p = k.f32(0.0);
                k.guarded(ok, |k| {
                    let v = k.load::<F32>(Load::SHARED, k.mad(k.reg(), i, 4u32, svb));
                    k.sub(p, v, v0);
                    k.mul(p, p, c);
                    k.ex2_approx(p, p);
                });
                p
            })
            .collect();
        let pair = k.add(k.reg(), e[0], e[1]);
        let incl = k.copy(pair);
        for off in [1u32, 2, 4, 8, 16] {
            let o = k.shfl_sync(Shfl::Up, k.reg::<F32>(), incl, off, FULL_WARP);
            let take = k.cmp(Cmp::Ge, lane, off);
            k.guarded(take, |k| {
                k.add(incl, incl, o);
            });
        }
        // Exclusive prefix of the pairs, then the two running sums of this lane.
        let before = k.shfl_sync(Shfl::Up, k.reg::<F32>(), incl, 1u32, FULL_WARP);
        k.selp(before, 0.0f32, before, lane0);
        let cum0 = k.add(k.reg(), before, e[0]);
        let cum1 = k.add(k.reg(), cum0, e[1]);
        let cum = [cum0, cum1];
        let total = k.shfl_sync(Shfl::Idx, k.reg::<F32>(), cum1, 31u32, FULL_WARP);
        let thr_p = k.mul(k.reg(), top_p, total);
        // Nucleus size: 1 + how many candidates end below top_p of the mass.
        let below = k.u32(0);
        for (j, &cj) in cum.iter().enumerate() {
            let i = k.mad(k.reg(), lane, 2u32, j as u32);
            let b = k.cmp(Cmp::Lt, cj, thr_p);
            let ok = k.lt(i, kk);
            k.and(b, b, ok);
            let inc = k.selp(k.reg::<U32>(), 1u32, 0u32, b);
            k.add(below, below, inc);
        }
        let n_keep = k.warp_sum(below);
        k.add(n_keep, n_keep, 1u32);
        k.min(n_keep, n_keep, kk);
        // The nucleus' mass: the cumulative sum at n_keep - 1.
        let last = k.sub(k.reg(), n_keep, 1u32);
        let src = k.shr(k.reg(), last, 1u32);
        let odd = k.and(k.reg(), last, 1u32);
        let odd = k.eq(odd, 1u32);
        let m0 = k.shfl_sync(Shfl::Idx, k.reg::<F32>(), cum0, src, FULL_WARP);
        let m1 = k.shfl_sync(Shfl::Idx, k.reg::<F32>(), cum1, src, FULL_WARP);
        let mass = k.selp(k.reg(), m1, m0, odd);
        let r = k.mul(k.reg(), uniform, mass);
        let upto = k.u32(0);
        for (j, &cj) in cum.iter().enumerate() {
            let i = k.mad(k.reg(), lane, 2u32, j as u32);
            let b = k.cmp(Cmp::Le, cj, r);
            let ok = k.lt(i, n_keep);
            k.and(b, b, ok);
            let inc = k.selp(k.reg::<U32>(), 1u32, 0u32, b);
            k.add(upto, upto, inc);
        }
        let pick = k.warp_sum(upto);
        k.min(pick, pick, last);
        k.guarded(lane0, |k| {
            let t = k.load::<U32>(Load::SHARED, k.mad(k.reg(), pick, 4u32, sib));
            k.st(Store::GLOBAL, k.elem_addr(out, row, 4), t);
        });
    });
}

/// CPU twin of [`sample_kernel`] for one row, in f64: the token, and how close the draw
/// came to a decision boundary (the smallest distance of `uniform · mass` or `top_p · Σp`
/// to a cumulative sum, relative to `Σp`): below ~1e-6 the GPU's f32 sums may decide
/// the other way.
pub fn sample_cpu(row: &[f32], p: &SampleParams) -> (u32, f64) {
    let key = |v: f32| -> u32 {
        if v.is_nan() {
            0
        } else if v.to_bits() >> 31 == 1 {
            !v.to_bits()
        } else {
            v.to_bits() | 0x8000_0000
        }
    };
    let mut c: Vec<(u32, usize)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (key(v), i))
        .collect();
    if c.is_empty() {
        return (0, f64::INFINITY);
    }
    c.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let top_k = match p.top_k as usize {
        0 => MAX_TOP_K,
        k => k.min(MAX_TOP_K),
    };
    c.truncate(top_k);
    let v0 = f64::from(row[c[0].1]);
    let t = f64::from(p.temperature);
    let e: Vec<f64> = c
        .iter()
        .map(|&(_, i)| ((f64::from(row[i]) - v0) / t).exp())
        .collect();
    let mut cum = Vec::with_capacity(e.len());
    let mut s = 0.0;
    for &x in &e {
        s += x;
        cum.push(s);
    }
    let total = s;
    let thr = f64::from(p.top_p) * total;
    let n_keep = (cum.iter().filter(|&&x| x < thr).count() + 1).min(cum.len());
    let r = f64::from(p.uniform) * cum[n_keep - 1];
    let pick = cum[..n_keep]
        .iter()
        .filter(|&&x| x <= r)
        .count()
        .min(n_keep - 1);
    let margin = cum
        .iter()
        .map(|&x| (x - thr).abs().min((x - r).abs()))
        .fold(f64::INFINITY, f64::min)
        / total;
    (c[pick].1 as u32, margin)
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
    fn sample_twin_keeps_top_k_and_the_nucleus() {
        let row = [1.0f32, 5.0, f32::NAN, 5.0, 3.0, -0.0, 0.0];
        let p = |top_k, top_p, uniform| SampleParams {
            top_k,
            top_p,
            temperature: 1.0,
            uniform,
        };
        // top-1: the first of the tied maxima.
        assert_eq!(sample_cpu(&row, &p(1, 1.0, 0.99)).0, 1);
        // top-2 keeps both 5.0s: a draw past half picks the second.
        assert_eq!(sample_cpu(&row, &p(2, 1.0, 0.75)).0, 3);
        // A tiny top_p keeps only the first candidate.
        assert_eq!(sample_cpu(&row, &p(0, 0.01, 0.99)).0, 1);
        // +0 ranks above -0: with every candidate, the last is -0.0 (index 5).
        assert_eq!(sample_cpu(&row, &p(6, 1.0, 0.999_999_9)).0, 5);
        assert_eq!(sample_cpu(&[f32::NAN; 3], &p(4, 1.0, 0.5)).0, 0);
        assert_eq!(
            SampleParams {
                top_k: 3,
                ..p(0, 0.5, 0.25)
            }
            .words()[0],
            3
        );
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
