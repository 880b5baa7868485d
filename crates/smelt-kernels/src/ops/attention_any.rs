//! Attention for any head size up to [`ANY_MAX_HEAD_DIM`] in one slow, correct kernel
//! ([`any_kernel`]): the fallback for head sizes with no split kernel of their own (see
//! [`HEAD_DIMS`](super::attention::HEAD_DIMS)), so a model never stops for want of a
//! kernel. It shares only the window's first position ([`behind`]) with the split kernels,
//! so it is kept apart from them; `super::attention` re-exports everything public here, so
//! every path stays `ops::attention::...`.

use smelt_ptx::{Cmp, Exact, FloatRound, Kernel, Load, Reg, Store, F16, F32, U32};

use super::attention::behind;
use super::{dim, kernel_params, Launch, LOG2E};

/// Name of [`any_kernel`].
pub const ANY: &str = "attention_any";
/// Largest head [`any_kernel`] takes.
pub const ANY_MAX_HEAD_DIM: usize = 512;
/// Threads of a block of [`any_kernel`]: one key each while scoring, up to
/// `ANY_MAX_HEAD_DIM / ANY_THREADS` values each while weighting V.
pub const ANY_THREADS: u32 = 128;

kernel_params! {
    /// The parameters of [`any_kernel`], in order: `q`, the caches, `seqs` and
    /// `block_tables` as [`Args`](super::attention::Args), then `out: *mut f32
    /// ([rows][n_head * head_dim])`.
    AnyArgs, AnyRegs {
        q: Ptr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        out: Ptr,
        n_head: U32,
        n_head_kv: U32,
        head_dim: U32,
        block_size: U32,
        window: U32,
        scale: F32,
    }
}

/// Launch of [`any_kernel`] for `n_seqs` sequences of at most `max_tokens` query tokens:
/// one block per (token, query head) along x, one row of blocks per sequence.
pub fn any_launch(n_seqs: usize, max_tokens: usize, n_head: usize) -> Launch {
    Launch::new(
        (dim(max_tokens.max(1) * n_head), dim(n_seqs), 1),
        (ANY_THREADS, 1, 1),
    )
}

/// Whether [`any_kernel`] takes heads of `head_dim` values.
pub fn any_fits(head_dim: usize) -> bool {
    (1..=ANY_MAX_HEAD_DIM).contains(&head_dim)
}

/// Attention for any head size up to [`ANY_MAX_HEAD_DIM`] (the head size a runtime
/// parameter): the slow, correct path for heads with no kernel of their own (see
/// [`HEAD_DIMS`](super::attention::HEAD_DIMS)), the same semantics as
/// [`kernel`](super::attention::kernel) + [`reduce_kernel`](super::attention::reduce_kernel)
/// (query rounded to f16, base-2 softmax in f32) in one launch and no partials.
///
/// One block per (token, query head): the query goes to shared memory; then for each
/// chunk of [`ANY_THREADS`] visible keys each thread scores one key (a loop over the head,
/// one half at a time), the block takes the chunk's max and rescales its running sums
/// (online softmax), and each thread adds the chunk's weighted values of its own columns.
///
/// Parameters: [`AnyArgs`]. Launch: [`any_launch`].
pub fn any_kernel(k: &Kernel) {
    k.max_threads(ANY_THREADS, 1, 1);
    let AnyRegs {
        q,
        k_cache: kc,
        v_cache: vc,
        seqs,
        block_tables: tables,
        out,
        n_head,
        n_head_kv,
        head_dim,
        block_size: bs,
        window,
        scale,
    } = AnyRegs::declare(k);
    let tid = k.tid_x();
    let x = k.ctaid_x();
    let t = k.div_int(k.reg(), x, n_head);
    let head = k.rem(k.reg(), x, n_head);
    let dw = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, dw, k.elem_addr(seqs, k.ctaid_y(), 16));
    let [row0, n_tokens, start, bto] = dw;
    // Whole blocks leave: past the sequence's tokens, or a head too large (the host
    // never launches one).
    k.exit_if(k.ge(t, n_tokens));
    k.exit_if(k.cmp(Cmp::Gt, head_dim, ANY_MAX_HEAD_DIM as u32));
    let group = k.div_int(k.reg(), n_head, n_head_kv);
    let kvh = k.div_int(k.reg(), head, group);
    let row = k.add(k.reg(), row0, t);
    let pos = k.add(k.reg(), start, t);
    let end = k.add(k.reg(), pos, 1u32);
    let lo = behind(k, pos, window);
    let qrow = k.mad(k.reg(), row, n_head, head);
    let qfirst = k.mul(k.reg(), qrow, head_dim);
    let qs = k.shared::<F32>("any_q", ANY_MAX_HEAD_DIM as u32, 16);
    let ps = k.shared::<F32>("any_p", ANY_THREADS, 16);
    let ss = k.shared::<U32>("any_slot", ANY_THREADS, 16);
    let red = super::reduce_scratch(k, "any_red");
    let (qsb, psb, ssb) = (k.shared_base(&qs), k.shared_base(&ps), k.shared_base(&ss));
    k.stride_loop(tid, head_dim, ANY_THREADS, |k, d| {
        let i = k.add(k.reg(), qfirst, d);
        let v = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(q, i, 4));
        let h = k.cvt(k.reg::<F16>(), v, FloatRound::Rn);
        k.cvt(v, h, Exact);
        k.st(Store::SHARED, k.mad(k.reg(), d, 4u32, qsb), v);
    });
    k.bar_sync();
    let kv_dim = k.mul(k.reg(), n_head_kv, head_dim);
    let head_off = k.mul(k.reg(), kvh, head_dim);
    let scale2 = k.mul(k.reg(), scale, LOG2E);
    let m = k.f32(f32::NEG_INFINITY);
    let l = k.f32(0.0);
    let per = ANY_MAX_HEAD_DIM / ANY_THREADS as usize;
    let acc: Vec<Reg<F32>> = (0..per).map(|_| k.f32(0.0)).collect();
    // Element index of the head in slot `slot` of a cache.
    let elem = |k: &Kernel, slot: Reg<U32>| k.mad(k.reg(), slot, kv_dim, head_off);
    k.stride_loop(lo, end, ANY_THREADS, |k, j0| {
        let j = k.add(k.reg(), j0, tid);
        let valid = k.lt(j, end);
        let s = k.f32(f32::NEG_INFINITY);
        let slot = k.u32(0);
        k.if_(valid, |k| {
            let bi = k.div_int(k.reg(), j, bs);
            let within = k.rem(k.reg(), j, bs);
            let ti = k.add(k.reg(), bto, bi);
            let b = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(tables, ti, 4));
            k.mad(slot, b, bs, within);
            let ka = k.elem_addr(kc, elem(k, slot), 2);
            let dot = k.f32(0.0);
            k.for_count(head_dim, |k, d| {
                let kh = k.ld(Load::GLOBAL_NC, k.reg::<F16>(), k.elem_addr(ka, d, 2).at(0));
                let kf = k.cvt(k.reg::<F32>(), kh, Exact);
                let qv = k.load::<F32>(Load::SHARED, k.mad(k.reg(), d, 4u32, qsb));
                k.fma(dot, qv, kf, dot);
            });
            k.mul(s, dot, scale2);
        });
        // The chunk's largest score (its first key is always visible: finite).
        let cm = super::block_max(k, s, &red);
        let nm = k.max(k.reg(), m, cm);
        let corr = k.sub(k.reg(), m, nm);
        k.ex2_approx(corr, corr);
        let p = k.sub(k.reg(), s, nm);
        k.ex2_approx(p, p);
        k.selp(p, p, 0.0f32, valid);
        k.st(Store::SHARED, k.mad(k.reg(), tid, 4u32, psb), p);
        k.st(Store::SHARED, k.mad(k.reg(), tid, 4u32, ssb), slot);
        // The sum's barriers also publish the chunk's weights and slots.
        let psum = super::block_sum(k, p, &red);
        k.fma(l, l, corr, psum);
        k.mov(m, nm);
        let n = k.sub(k.reg(), end, j0);
        k.min(n, n, ANY_THREADS);
        for (i, &a) in acc.iter().enumerate() {
            k.mul(a, a, corr);
            let d = k.add(k.reg(), tid, ANY_THREADS * i as u32);
            let live = k.lt(d, head_dim);
            k.if_(live, |k| {
                let col = k.add(k.reg(), head_off, d);
                k.for_count(n, |k, jj| {
                    let w = k.load::<F32>(Load::SHARED, k.mad(k.reg(), jj, 4u32, psb));
                    let sl = k.load::<U32>(Load::SHARED, k.mad(k.reg(), jj, 4u32, ssb));
                    let vi = k.mad(k.reg(), sl, kv_dim, col);
                    let vh = k.ld(
                        Load::GLOBAL_NC,
                        k.reg::<F16>(),
                        k.elem_addr(vc, vi, 2).at(0),
                    );
                    let vf = k.cvt(k.reg::<F32>(), vh, Exact);
                    k.fma(a, w, vf, a);
                });
            });
        }
        // Before the next chunk's weights and slots overwrite these.
        k.bar_sync();
    });
    for (i, &a) in acc.iter().enumerate() {
        let d = k.add(k.reg(), tid, ANY_THREADS * i as u32);
        let live = k.lt(d, head_dim);
        k.if_(live, |k| {
            k.div_rn(a, a, l);
            let oi = k.add(k.reg(), qfirst, d);
            k.st(Store::GLOBAL, k.elem_addr(out, oi, 4), a);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_in_order_and_the_launch_is_a_block_per_token_and_head() {
        let a = AnyArgs {
            q: 1,
            k_cache: 2,
            v_cache: 3,
            seqs: 4,
            block_tables: 5,
            out: 6,
            n_head: 7,
            n_head_kv: 8,
            head_dim: 9,
            block_size: 10,
            window: 11,
            scale: 0.5,
        };
        assert_eq!(a.values().len(), AnyArgs::NAMES.len());
        assert_eq!(a.values()[6], crate::ops::ArgValue::U32(7));
        assert_eq!(a.values()[11], crate::ops::ArgValue::F32(0.5));
        assert_eq!(any_launch(2, 3, 5).grid, (15, 2, 1));
    }
}
