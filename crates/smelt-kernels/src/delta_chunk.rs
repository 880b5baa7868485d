//! The gated delta rule over prompts in chunks of [`CHUNK`] tokens on the GPU (Qwen3.5/3.6
//! and Qwen3-Next's linear attention): the token-by-token step kernel
//! (`delta_net::step_kernel`) runs a 512-token prompt as 512 dependent steps (H100, run 1:
//! 1,137 us a layer at the 27B shape); in chunks, the 64 tokens of a chunk update the state
//! together through one triangular solve, and the sequential part is the chunks.
//!
//! Two kernels, the split being what depends on the state and what does not:
//!
//! - [`prep_kernel`], every (chunk, value head, sequence) at once: the chunk's gates (`G_t`,
//!   the running sum of `g`; `b_t = sigmoid(beta)`), `L = tril_strict(b_t (k_t . k_u)
//!   e^(G_t - G_u))` solved into `A = (I + L)^-1` (forward substitution in shared memory),
//!   and `P = tril(q_t . k_u e^(G_t - G_u))`, both `64 x 64`, to a scratch buffer;
//! - [`chunk_kernel`], one block per (32 value dimensions of a head, sequence), its
//!   sequence's chunks in order, the state's 32 columns in shared memory:
//!   `X = b (v - e^G (K S))`, `v' = A X`, `o = (e^G (Q S) + P v') / sqrt(s)`,
//!   `S = e^(G_last) S + K^T (e^(G_last - G) v')`. A head's value dimensions are
//!   independent given `A` and `P`, so a head spreads over `s / 32` blocks.
//!
//! The same algebra as the CPU backend's `delta_rule_chunked` (llama.cpp's chunked form),
//! with `v' = A (b v - b e^G K S)` instead of `u - w S` (the same product, associated so the
//! state-free part is the prep kernel's). f32 on the CUDA cores throughout: TF32 tensor
//! cores would leave the recurrence's 1e-3 tolerance to chance over many chunks.
//! [`chunked_cpu`] is the twin (the same order of operations per output), tied to the
//! token-by-token twin by this module's tests; GPU parity is `gpu_ops -o delta`.

use smelt_ptx::{Cmp, Kernel, Load, Reg, Shfl, Store, F32, FULL_WARP, U32, U64};

use crate::delta_net::HEAD_DIMS;
use crate::ops::{kernel_params, Launch, LOG2E};

/// Tokens per chunk (llama.cpp's chunk for scalar gates).
pub const CHUNK: usize = 64;
/// Value dimensions (state columns) per block of [`chunk_kernel`]: a warp's lanes.
pub const COLS: usize = 32;
/// Threads per block of both kernels (8 warps).
pub const THREADS: u32 = 256;
/// Floats of one (chunk, head) slot of the scratch buffer: `A` then `P`.
pub const SLOT_FLOATS: usize = 2 * CHUNK * CHUNK;
/// Shared-memory row pitch of the state columns (32 + 1: no bank conflicts either way).
const S_PITCH: u32 = COLS as u32 + 1;
/// Shared-memory row pitch of `L`/`A` in the prep kernel.
const A_PITCH: u32 = CHUNK as u32 + 1;

/// Name of [`prep_kernel`] for heads of `s`.
pub fn prep_name(s: usize) -> &'static str {
    match s {
        64 => "delta_chunk_prep_s64",
        _ => "delta_chunk_prep_s128",
    }
}

/// Name of [`chunk_kernel`] for heads of `s`.
pub fn chunk_name(s: usize) -> &'static str {
    match s {
        64 => "delta_chunk_s64",
        _ => "delta_chunk_s128",
    }
}

/// Both kernels for every head size.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    let mut v: Vec<crate::catalog::Entry> = Vec::new();
    for s in HEAD_DIMS {
        v.push((
            prep_name(s).to_string(),
            Box::new(move |k: &Kernel| prep_kernel(k, s)),
        ));
        v.push((
            chunk_name(s).to_string(),
            Box::new(move |k: &Kernel| chunk_kernel(k, s)),
        ));
    }
    v
}

/// Scratch slots a step needs: sequence `i` with first row `row_i` uses slots `i +
/// row_i / 64` on, one per chunk; they never overlap and stay below `n_seqs +
/// ceil(n_rows / 64)`.
pub fn slots(n_seqs: usize, n_rows: usize) -> usize {
    n_seqs + n_rows.div_ceil(CHUNK)
}

/// Bytes of scratch for a step of `n_seqs` sequences, `n_rows` rows, `h_v` value heads.
pub fn scratch_bytes(n_seqs: usize, n_rows: usize, h_v: usize) -> usize {
    4 * slots(n_seqs, n_rows) * h_v * SLOT_FLOATS
}

kernel_params! {
    /// Arguments of [`prep_kernel`].
    PrepArgs, PrepRegs {
        q: Ptr,
        k: Ptr,
        alpha: Ptr,
        beta: Ptr,
        dt_bias: Ptr,
        a: Ptr,
        scratch: Ptr,
        seqs: Ptr,
        h_k: U32,
        h_v: U32,
        grouped: U32,
        stride: U32,
    }
}

kernel_params! {
    /// Arguments of [`chunk_kernel`].
    ChunkArgs, ChunkRegs {
        q: Ptr,
        k: Ptr,
        v: Ptr,
        alpha: Ptr,
        beta: Ptr,
        dt_bias: Ptr,
        a: Ptr,
        scratch: Ptr,
        out: Ptr,
        states: Ptr,
        seqs: Ptr,
        h_k: U32,
        h_v: U32,
        grouped: U32,
        stride: U32,
        state_off: U32,
    }
}

/// Launch of [`prep_kernel`]: one block per (value head, chunk) in x, sequence in y;
/// `max_chunks` is the most chunks of any sequence (blocks past a sequence's end exit).
pub fn prep_launch(h_v: usize, max_chunks: usize, n_seqs: usize) -> Launch {
    Launch::new(
        ((h_v * max_chunks).max(1) as u32, n_seqs.max(1) as u32, 1),
        (THREADS, 1, 1),
    )
}

/// Launch of [`chunk_kernel`]: one block per ([`COLS`] value dimensions of a head,
/// sequence).
pub fn chunk_launch(s: usize, h_v: usize, n_seqs: usize) -> Launch {
    Launch::new(
        ((h_v * (s / COLS)).max(1) as u32, n_seqs.max(1) as u32, 1),
        (THREADS, 1, 1),
    )
}

/// `2^(x log2 e)`.
fn exp(k: &Kernel, x: Reg<F32>) -> Reg<F32> {
    let e = k.mul(k.reg(), x, LOG2E);
    k.ex2_approx(e, e)
}

/// The shared-memory address of float `i` of `base`.
fn sh(k: &Kernel, base: Reg<U32>, i: Reg<U32>) -> Reg<U32> {
    k.mad(k.reg(), i, 4u32, base)
}

/// Gates of the chunk of `c` tokens from row `row0`, value head `h`, into shared memory:
/// `gc[t]` the running sum of `g = softplus(alpha + dt_bias) * a` (0 past the chunk's end,
/// so `gc` stays flat there), `bs[t] = sigmoid(beta)` (0 past the end). Ends with a barrier.
#[allow(clippy::too_many_arguments)]
fn gates(
    k: &Kernel,
    alpha: Reg<U64>,
    beta: Reg<U64>,
    dt: Reg<F32>,
    av: Reg<F32>,
    h_v: Reg<U32>,
    h: Reg<U32>,
    row0: Reg<U32>,
    c: Reg<U32>,
    graw: Reg<U32>,
    gc: Reg<U32>,
    bs: Reg<U32>,
) {
    let t = k.tid_x();
    k.if_(k.lt(t, CHUNK as u32), |k| {
        let g = k.f32(0.0);
        let b = k.f32(0.0);
        k.if_(k.lt(t, c), |k| {
            let row = k.add(k.reg(), row0, t);
            let gi = k.mad(k.reg(), row, h_v, h);
            let al = k.load::<F32>(Load::GLOBAL, k.elem_addr(alpha, gi, 4));
            let bl = k.load::<F32>(Load::GLOBAL, k.elem_addr(beta, gi, 4));
            let x = k.add(k.reg(), al, dt);
            // softplus(x) = log2(1 + 2^(x log2 e)) ln 2; x itself above 20.
            let e = exp(k, x);
            k.add(e, e, 1.0f32);
            k.lg2_approx(e, e);
            k.mul(e, e, std::f32::consts::LN_2);
            let big = k.cmp(Cmp::Gt, x, 20.0f32);
            let sp = k.selp(k.reg(), x, e, big);
            k.mul(g, sp, av);
            let nb = k.mul(k.reg(), bl, -LOG2E);
            k.ex2_approx(nb, nb);
            k.add(nb, nb, 1.0f32);
            k.div_rn(b, 1.0f32, nb);
        });
        k.st(Store::SHARED, sh(k, graw, t), g);
        k.st(Store::SHARED, sh(k, bs, t), b);
    });
    k.bar_sync();
    k.if_(k.lt(t, CHUNK as u32), |k| {
        let acc = k.f32(0.0);
        let n = k.add(k.reg(), t, 1u32);
        k.for_count(n, |k, u| {
            let g = k.load::<F32>(Load::SHARED, sh(k, graw, u));
            k.add(acc, acc, g);
        });
        k.st(Store::SHARED, sh(k, gc, t), acc);
    });
    k.bar_sync();
}

/// (first row, tokens, key head, dt_bias, a) of one value head of one sequence.
type SeqHead = (Reg<U32>, Reg<U32>, Reg<U32>, Reg<F32>, Reg<F32>);

/// The per-sequence values both kernels start from: (first row, tokens, key head, dt_bias,
/// a) for value head `h` of sequence `seq`.
#[allow(clippy::too_many_arguments)]
fn seq_head(
    k: &Kernel,
    seqs: Reg<U64>,
    seq: Reg<U32>,
    h: Reg<U32>,
    h_k: Reg<U32>,
    h_v: Reg<U32>,
    grouped: Reg<U32>,
    dt_bias: Reg<U64>,
    a: Reg<U64>,
) -> SeqHead {
    let desc = k.elem_addr(seqs, k.mul(k.reg(), seq, 4u32), 4);
    let row0 = k.load::<U32>(Load::GLOBAL, desc);
    let n = k.load::<U32>(Load::GLOBAL, desc.at(4));
    let ratio = k.div_int(k.reg(), h_v, h_k);
    let kh_g = k.div_int(k.reg(), h, ratio);
    let kh_m = k.rem(k.reg(), h, h_k);
    let gp = k.cmp(Cmp::Ne, grouped, 0u32);
    let kh = k.selp(k.reg(), kh_g, kh_m, gp);
    let dt = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(dt_bias, h, 4));
    let av = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(a, h, 4));
    (row0, n, kh, dt, av)
}

/// Float offset of scratch slot `slot`, head `h`: `(slot h_v + h) SLOT_FLOATS`.
fn slot_base(
    k: &Kernel,
    scratch: Reg<U64>,
    slot: Reg<U32>,
    h_v: Reg<U32>,
    h: Reg<U32>,
) -> Reg<U64> {
    let i = k.mad(k.reg(), slot, h_v, h);
    k.mul(i, i, SLOT_FLOATS as u32);
    k.elem_addr(scratch, i, 4)
}

/// Address of row `min(t, c - 1)` of a q/k/v buffer (`row0` first, `stride` floats a row)
/// at column `col`: rows past the chunk's end are read as its last (and not used).
#[allow(clippy::too_many_arguments)]
fn row_addr(
    k: &Kernel,
    x: Reg<U64>,
    row0: Reg<U32>,
    t: impl smelt_ptx::Src<U32>,
    c: Reg<U32>,
    stride: Reg<U32>,
    col: Reg<U32>,
) -> Reg<U64> {
    let last = k.sub(k.reg(), c, 1u32);
    let tt = k.mov(k.reg::<U32>(), t);
    k.min(tt, tt, last);
    let r = k.add(k.reg(), row0, tt);
    let i = k.mad(k.reg(), r, stride, col);
    k.elem_addr(x, i, 4)
}

/// The state-free half of a chunk: `A = (I + L)^-1` and `P` for value head `h = ctaid.x %
/// h_v`, chunk `z = ctaid.x / h_v` of sequence `ctaid.y`, into scratch slot `seq + row0 /
/// 64 + z` (`A` at float 0, `P` at 4096, row-major `[t][u]`; rows past the chunk's end are
/// zero, `A`'s diagonal is 1 within it). `L[t][u] = b_t (k_t . k_u) e^(G_t - G_u)` for `u
/// < t`, `P[t][u] = (q_t . k_u) e^(G_t - G_u)` for `u <= t`. `A`'s rows come by forward
/// substitution, `A[t][x] = -L[t][x] - sum_{x < u < t} L[t][u] A[u][x]`, four threads per
/// `x`.
///
/// Parameters: `q, k, alpha, beta, dt_bias, a, scratch, seqs, h_k, h_v, grouped, stride`.
/// Launch: [`prep_launch`].
pub fn prep_kernel(k: &Kernel, s: usize) {
    if !HEAD_DIMS.contains(&s) {
        k.reject(format!("heads of {s}: one of {HEAD_DIMS:?}"));
        return;
    }
    k.max_threads(THREADS, 1, 1);
    let p = PrepRegs::declare(k);
    let h = k.rem(k.reg(), k.ctaid_x(), p.h_v);
    let z = k.div_int(k.reg(), k.ctaid_x(), p.h_v);
    let seq = k.ctaid_y();
    let (row0, n, kh, dt, av) =
        seq_head(k, p.seqs, seq, h, p.h_k, p.h_v, p.grouped, p.dt_bias, p.a);
    let first = k.mul(k.reg(), z, CHUNK as u32);
    k.exit_if(k.ge(first, n));
    let rest = k.sub(k.reg(), n, first);
    let c = k.min(k.reg(), rest, CHUNK as u32);
    let r0 = k.add(k.reg(), row0, first);
    let slot = k.div_int(k.reg(), row0, CHUNK as u32);
    k.add(slot, slot, seq);
    k.add(slot, slot, z);
    let base = slot_base(k, p.scratch, slot, p.h_v, h);

    let graw_s = k.shared::<F32>("dcp_graw", CHUNK as u32, 16);
    let gc_s = k.shared::<F32>("dcp_gc", CHUNK as u32, 16);
    let bs_s = k.shared::<F32>("dcp_bs", CHUNK as u32, 16);
    let l_s = k.shared::<F32>("dcp_l", CHUNK as u32 * A_PITCH, 16);
    let (graw, gc, bs, lsm) = (
        k.shared_base(&graw_s),
        k.shared_base(&gc_s),
        k.shared_base(&bs_s),
        k.shared_base(&l_s),
    );
    gates(k, p.alpha, p.beta, dt, av, p.h_v, h, r0, c, graw, gc, bs);

    // Thread (t = tid / 4, part = tid % 4): row t of L and P, columns part + 4 m.
    let tid = k.tid_x();
    let t = k.shr(k.reg(), tid, 2u32);
    let part = k.and(k.reg(), tid, 3u32);
    let s32 = s as u32;
    let col = k.mul(k.reg(), kh, s32);
    let kt = row_addr(k, p.k, r0, t, c, p.stride, col);
    let qt = row_addr(k, p.q, r0, t, c, p.stride, col);
    let m_cols = CHUNK / 4;
    let ku: Vec<Reg<U64>> = (0..m_cols)
        .map(|m| {
            let u = k.add(k.reg(), part, 4 * m as u32);
            row_addr(k, p.k, r0, u, c, p.stride, col)
        })
        .collect();
    let kk: Vec<Reg<F32>> = (0..m_cols).map(|_| k.f32(0.0)).collect();
    let qk: Vec<Reg<F32>> = (0..m_cols).map(|_| k.f32(0.0)).collect();
    k.for_count((s / 4) as u32, |k, ib| {
        let at = |a: Reg<U64>| -> Reg<U64> { k.elem_addr(a, ib, 16) };
        let kv = k.regs::<F32, 4>();
        k.ld_v4(Load::GLOBAL_NC, kv, at(kt));
        let qv = k.regs::<F32, 4>();
        k.ld_v4(Load::GLOBAL_NC, qv, at(qt));
        for m in 0..m_cols {
            let uv = k.regs::<F32, 4>();
            k.ld_v4(Load::GLOBAL_NC, uv, at(ku[m]));
            for i in 0..4 {
                k.fma(kk[m], kv[i], uv[i], kk[m]);
                k.fma(qk[m], qv[i], uv[i], qk[m]);
            }
        }
    });
    let gct = k.load::<F32>(Load::SHARED, sh(k, gc, t));
    let bt = k.load::<F32>(Load::SHARED, sh(k, bs, t));
    let in_chunk = k.lt(t, c);
    let pbase = k.elem_addr(base, k.u32((CHUNK * CHUNK) as u32), 4);
    for m in 0..m_cols {
        let u = k.add(k.reg(), part, 4 * m as u32);
        let gu = k.load::<F32>(Load::SHARED, sh(k, gc, u));
        let d = k.sub(k.reg(), gct, gu);
        let e = exp(k, d);
        let l = k.mul(k.reg(), kk[m], bt);
        k.mul(l, l, e);
        let below = k.lt(u, t);
        let zero = k.f32(0.0);
        k.selp(l, l, zero, below);
        k.selp(l, l, zero, in_chunk);
        let at = k.mad(k.reg(), t, A_PITCH, u);
        k.st(Store::SHARED, sh(k, lsm, at), l);
        let pv = k.mul(k.reg(), qk[m], e);
        let upto = k.cmp(Cmp::Le, u, t);
        k.selp(pv, pv, zero, upto);
        k.selp(pv, pv, zero, in_chunk);
        let pi = k.mad(k.reg(), t, CHUNK as u32, u);
        k.st(Store::GLOBAL, k.elem_addr(pbase, pi, 4), pv);
    }
    k.bar_sync();

    // Forward substitution, row by row: thread (x = tid / 4, part) sums u = x + 1 + part,
    // step 4, below t.
    let x = t;
    k.for_count((CHUNK - 1) as u32, |k, it| {
        let row = k.add(k.reg(), it, 1u32);
        let active = k.lt(x, row);
        let acc = k.f32(0.0);
        k.if_(active, |k| {
            let start = k.add(k.reg(), x, 1u32);
            k.add(start, start, part);
            k.stride_loop(start, row, 4u32, |k, u| {
                let lt = k.load::<F32>(Load::SHARED, sh(k, lsm, k.mad(k.reg(), row, A_PITCH, u)));
                let au = k.load::<F32>(Load::SHARED, sh(k, lsm, k.mad(k.reg(), u, A_PITCH, x)));
                k.fma(acc, lt, au, acc);
            });
        });
        // The whole warp shuffles (inactive threads add zeros among themselves).
        for off in [1u32, 2] {
            let o = k.shfl_sync(Shfl::Bfly, k.reg(), acc, off, FULL_WARP);
            k.add(acc, acc, o);
        }
        let ltx = k.load::<F32>(Load::SHARED, sh(k, lsm, k.mad(k.reg(), row, A_PITCH, x)));
        k.add(acc, acc, ltx);
        let val = k.neg(k.reg(), acc);
        k.bar_sync();
        let write = k.eq(part, 0u32);
        k.if_(active, |k| {
            k.if_(write, |k| {
                k.st(
                    Store::SHARED,
                    sh(k, lsm, k.mad(k.reg(), row, A_PITCH, x)),
                    val,
                );
            });
        });
        k.bar_sync();
    });

    // A to scratch: strictly lower from shared memory, 1 on the diagonal within the chunk.
    k.stride_loop(tid, (CHUNK * CHUNK) as u32, THREADS, |k, i| {
        let r = k.shr(k.reg(), i, 6u32);
        let cc = k.and(k.reg(), i, (CHUNK - 1) as u32);
        let v = k.load::<F32>(Load::SHARED, sh(k, lsm, k.mad(k.reg(), r, A_PITCH, cc)));
        let zero = k.f32(0.0);
        let below = k.lt(cc, r);
        k.selp(v, v, zero, below);
        let diag = k.eq(cc, r);
        let one = k.f32(1.0);
        let dv = k.selp(k.reg(), one, zero, k.lt(r, c));
        k.selp(v, dv, v, diag);
        k.st(Store::GLOBAL, k.elem_addr(base, i, 4), v);
    });
}

/// The state-dependent half: value dimensions `32 g .. 32 g + 32` (`g = ctaid.x % (s /
/// 32)`) of value head `h = ctaid.x / (s / 32)` of sequence `ctaid.y`, over its chunks in
/// order, with `A` and `P` from [`prep_kernel`]'s slots. Warp `w`, lane `j`: rows `8 w ..
/// 8 w + 8` of the chunk's `[64][32]` products, column `j`; the state's `[s][32]` columns
/// (key `i`, value `j`) in shared memory, `s / 8` of its rows per warp in the update.
/// Outputs and state as `delta_net::step_kernel` has them.
///
/// Parameters: `q, k, v, alpha, beta, dt_bias, a, scratch, out, states, seqs, h_k, h_v,
/// grouped, stride, state_off`. Launch: [`chunk_launch`].
pub fn chunk_kernel(k: &Kernel, s: usize) {
    if !HEAD_DIMS.contains(&s) {
        k.reject(format!("heads of {s}: one of {HEAD_DIMS:?}"));
        return;
    }
    k.max_threads(THREADS, 1, 1);
    let p = ChunkRegs::declare(k);
    let s32 = s as u32;
    let groups = (s / COLS) as u32;
    let h = k.div_int(k.reg(), k.ctaid_x(), groups);
    let grp = k.rem(k.reg(), k.ctaid_x(), groups);
    let seq = k.ctaid_y();
    let (row0, n, kh, dt, av) =
        seq_head(k, p.seqs, seq, h, p.h_k, p.h_v, p.grouped, p.dt_bias, p.a);
    let tid = k.tid_x();
    let w = k.shr(k.reg(), tid, 5u32);
    let j = k.and(k.reg(), tid, 31u32);
    // This lane's value dimension within the head.
    let jj = k.mad(k.reg(), grp, COLS as u32, j);

    let graw_s = k.shared::<F32>("dc_graw", CHUNK as u32, 16);
    let gc_s = k.shared::<F32>("dc_gc", CHUNK as u32, 16);
    let bs_s = k.shared::<F32>("dc_bs", CHUNK as u32, 16);
    let dl_s = k.shared::<F32>("dc_dl", CHUNK as u32, 16);
    let st_s = k.shared::<F32>("dc_state", s32 * S_PITCH, 16);
    let v_s = k.shared::<F32>("dc_v", (CHUNK * COLS) as u32, 16);
    let (graw, gc, bs, dl, ssm, vsm) = (
        k.shared_base(&graw_s),
        k.shared_base(&gc_s),
        k.shared_base(&bs_s),
        k.shared_base(&dl_s),
        k.shared_base(&st_s),
        k.shared_base(&v_s),
    );

    // The state's columns: global row h s + 32 g + col holds S[.][col] over keys.
    let st = k.load::<U64>(Load::GLOBAL, k.elem_addr(p.states, seq, 8));
    let st = k.elem_addr(st, p.state_off, 1);
    let col0 = k.mad(k.reg(), h, s32, k.mul(k.reg(), grp, COLS as u32));
    let gbase = k.mul(k.reg(), col0, s32);
    let sg = k.elem_addr(st, gbase, 4);
    let state_io = |k: &Kernel, load: bool| {
        k.stride_loop(tid, s32 * COLS as u32, THREADS, |k, idx| {
            let cc = k.div_int(k.reg(), idx, s32);
            let i = k.rem(k.reg(), idx, s32);
            let sa = sh(k, ssm, k.mad(k.reg(), i, S_PITCH, cc));
            let ga = k.elem_addr(sg, idx, 4);
            if load {
                let v = k.load::<F32>(Load::GLOBAL, ga);
                k.st(Store::SHARED, sa, v);
            } else {
                let v = k.load::<F32>(Load::SHARED, sa);
                k.st(Store::GLOBAL, ga, v);
            }
        });
    };
    state_io(k, true);

    let rows = CHUNK / 8; // per warp
    let srows = s / 8; // state rows per warp in the update
    let t0 = k.mul(k.reg(), w, rows as u32);
    let col = k.mul(k.reg(), kh, s32);
    let vcol = k.mad(k.reg(), h, s32, jj);
    let slot0 = k.div_int(k.reg(), row0, CHUNK as u32);
    k.add(slot0, slot0, seq);
    let n_chunks = k.add(k.reg(), n, (CHUNK - 1) as u32);
    k.shr(n_chunks, n_chunks, 6u32);
    let scale = 1.0 / (s as f32).sqrt();
    k.for_count(n_chunks, |k, z| {
        let first = k.mul(k.reg(), z, CHUNK as u32);
        let rest = k.sub(k.reg(), n, first);
        let c = k.min(k.reg(), rest, CHUNK as u32);
        let r0 = k.add(k.reg(), row0, first);
        let slot = k.add(k.reg(), slot0, z);
        let abase = slot_base(k, p.scratch, slot, p.h_v, h);
        gates(k, p.alpha, p.beta, dt, av, p.h_v, h, r0, c, graw, gc, bs);
        let last = k.sub(k.reg(), c, 1u32);
        let glast = k.load::<F32>(Load::SHARED, sh(k, gc, last));
        // dl[t] = e^(G_last - G_t), for the state update.
        k.if_(k.lt(tid, CHUNK as u32), |k| {
            let g = k.load::<F32>(Load::SHARED, sh(k, gc, tid));
            let d = k.sub(k.reg(), glast, g);
            let e = exp(k, d);
            k.st(Store::SHARED, sh(k, dl, tid), e);
        });

        // 1. Y = K S, Z = Q S over this warp's rows, column j.
        let ts: Vec<Reg<U32>> = (0..rows).map(|r| k.add(k.reg(), t0, r as u32)).collect();
        let ka: Vec<Reg<U64>> = ts
            .iter()
            .map(|&t| row_addr(k, p.k, r0, t, c, p.stride, col))
            .collect();
        let qa: Vec<Reg<U64>> = ts
            .iter()
            .map(|&t| row_addr(k, p.q, r0, t, c, p.stride, col))
            .collect();
        let y: Vec<Reg<F32>> = (0..rows).map(|_| k.f32(0.0)).collect();
        let zq: Vec<Reg<F32>> = (0..rows).map(|_| k.f32(0.0)).collect();
        k.for_count((s / 4) as u32, |k, ib| {
            let i0 = k.mul(k.reg(), ib, 4u32);
            let sv: Vec<Reg<F32>> = (0..4u32)
                .map(|q| {
                    let i = k.add(k.reg(), i0, q);
                    k.load::<F32>(Load::SHARED, sh(k, ssm, k.mad(k.reg(), i, S_PITCH, j)))
                })
                .collect();
            for r in 0..rows {
                let kv = k.regs::<F32, 4>();
                k.ld_v4(Load::GLOBAL_NC, kv, k.elem_addr(ka[r], ib, 16));
                let qv = k.regs::<F32, 4>();
                k.ld_v4(Load::GLOBAL_NC, qv, k.elem_addr(qa[r], ib, 16));
                for q in 0..4 {
                    k.fma(y[r], kv[q], sv[q], y[r]);
                    k.fma(zq[r], qv[q], sv[q], zq[r]);
                }
            }
        });
        // X = b (v - e^G Y), zero past the chunk's end.
        let eg: Vec<Reg<F32>> = ts
            .iter()
            .map(|&t| {
                let g = k.load::<F32>(Load::SHARED, sh(k, gc, t));
                exp(k, g)
            })
            .collect();
        for r in 0..rows {
            let t = ts[r];
            let xv = k.f32(0.0);
            k.if_(k.lt(t, c), |k| {
                let row = k.add(k.reg(), r0, t);
                let vi = k.mad(k.reg(), row, p.stride, vcol);
                let vv = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.v, vi, 4));
                let b = k.load::<F32>(Load::SHARED, sh(k, bs, t));
                let ey = k.mul(k.reg(), eg[r], y[r]);
                k.sub(xv, vv, ey);
                k.mul(xv, xv, b);
            });
            k.st(
                Store::SHARED,
                sh(k, vsm, k.mad(k.reg(), t, COLS as u32, j)),
                xv,
            );
        }
        k.bar_sync();

        // 2. v' = A X (A's rows from scratch; zero past the chunk's end).
        let mix = |k: &Kernel, mat: Reg<U64>, acc: &[Reg<F32>]| {
            let ra: Vec<Reg<U64>> = ts
                .iter()
                .map(|&t| k.elem_addr(mat, k.mul(k.reg(), t, CHUNK as u32), 4))
                .collect();
            k.for_count((CHUNK / 4) as u32, |k, xb| {
                let x0 = k.mul(k.reg(), xb, 4u32);
                let vs: Vec<Reg<F32>> = (0..4u32)
                    .map(|q| {
                        let x = k.add(k.reg(), x0, q);
                        k.load::<F32>(Load::SHARED, sh(k, vsm, k.mad(k.reg(), x, COLS as u32, j)))
                    })
                    .collect();
                for r in 0..rows {
                    let av4 = k.regs::<F32, 4>();
                    k.ld_v4(Load::GLOBAL, av4, k.elem_addr(ra[r], xb, 16));
                    for q in 0..4 {
                        k.fma(acc[r], av4[q], vs[q], acc[r]);
                    }
                }
            });
        };
        let vp: Vec<Reg<F32>> = (0..rows).map(|_| k.f32(0.0)).collect();
        mix(k, abase, &vp);
        k.bar_sync();
        for r in 0..rows {
            k.st(
                Store::SHARED,
                sh(k, vsm, k.mad(k.reg(), ts[r], COLS as u32, j)),
                vp[r],
            );
        }
        k.bar_sync();

        // 3. o = (e^G Z + P v') / sqrt(s).
        let pmat = k.elem_addr(abase, k.u32((CHUNK * CHUNK) as u32), 4);
        let o: Vec<Reg<F32>> = (0..rows).map(|r| k.mul(k.reg(), eg[r], zq[r])).collect();
        mix(k, pmat, &o);
        for r in 0..rows {
            let t = ts[r];
            k.if_(k.lt(t, c), |k| {
                let row = k.add(k.reg(), r0, t);
                let oi = k.mad(k.reg(), row, p.h_v, h);
                let oi = k.mad(k.reg(), oi, s32, jj);
                k.mul(o[r], o[r], scale);
                k.st(Store::GLOBAL, k.elem_addr(p.out, oi, 4), o[r]);
            });
        }

        // 4. S = e^(G_last) S + K^T (dl v'), this warp's state rows i = w s/8 + m.
        let el = exp(k, glast);
        let i0 = k.mul(k.reg(), w, srows as u32);
        let acc: Vec<Reg<F32>> = (0..srows)
            .map(|m| {
                let i = k.add(k.reg(), i0, m as u32);
                let v = k.load::<F32>(Load::SHARED, sh(k, ssm, k.mad(k.reg(), i, S_PITCH, j)));
                k.mul(v, v, el)
            })
            .collect();
        let kcol = k.add(k.reg(), col, i0);
        k.for_count(c, |k, x| {
            let vx = k.load::<F32>(Load::SHARED, sh(k, vsm, k.mad(k.reg(), x, COLS as u32, j)));
            let d = k.load::<F32>(Load::SHARED, sh(k, dl, x));
            let f = k.mul(k.reg(), vx, d);
            let row = k.add(k.reg(), r0, x);
            let ki = k.mad(k.reg(), row, p.stride, kcol);
            let kaddr = k.elem_addr(p.k, ki, 4);
            for m in (0..srows).step_by(4) {
                let kv = k.regs::<F32, 4>();
                k.ld_v4(Load::GLOBAL_NC, kv, kaddr.at(4 * m as i64));
                for q in 0..4 {
                    k.fma(acc[m + q], kv[q], f, acc[m + q]);
                }
            }
        });
        for (m, &a) in acc.iter().enumerate() {
            let i = k.add(k.reg(), i0, m as u32);
            k.st(Store::SHARED, sh(k, ssm, k.mad(k.reg(), i, S_PITCH, j)), a);
        }
        k.bar_sync();
    });
    state_io(k, false);
}

/// CPU twin of the two kernels for one sequence of `n` tokens: `q`, `k`: `[n][h_k s]`
/// (L2-normed), `v`: `[n][h_v s]`, `alpha`, `beta`: `[n][h_v]` (logits, gates computed as
/// the kernels do), `state`: `[h_v][s][s]` (row `j` holding `S[.][j]`), advanced. Returns
/// `[n][h_v][s]`.
#[allow(clippy::too_many_arguments)]
pub fn chunked_cpu(
    s: usize,
    h_k: usize,
    grouped: bool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: &[f32],
    beta: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let h_v = dt_bias.len();
    let n = alpha.len() / h_v;
    let mut out = vec![0f32; n * h_v * s];
    let scale = 1.0 / (s as f32).sqrt();
    let dot = |x: &[f32], y: &[f32]| -> f32 {
        x.iter().zip(y).fold(0f32, |acc, (a, b)| a.mul_add(*b, acc))
    };
    for h in 0..h_v {
        let kh = if grouped { h / (h_v / h_k) } else { h % h_k };
        let m = &mut state[h * s * s..(h + 1) * s * s];
        for c0 in (0..n).step_by(CHUNK) {
            let c = CHUNK.min(n - c0);
            let qr = |t: usize| &q[(c0 + t) * h_k * s + kh * s..][..s];
            let kr = |t: usize| &k[(c0 + t) * h_k * s + kh * s..][..s];
            let mut gc = vec![0f32; c];
            let mut bs = vec![0f32; c];
            let mut acc = 0f32;
            for t in 0..c {
                let x = alpha[(c0 + t) * h_v + h] + dt_bias[h];
                let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
                acc += sp * a[h];
                gc[t] = acc;
                bs[t] = 1.0 / (1.0 + (-beta[(c0 + t) * h_v + h]).exp());
            }
            // A = (I + L)^-1 (strictly lower part; diagonal 1), P.
            let mut am = vec![0f32; c * c];
            let mut pm = vec![0f32; c * c];
            for t in 0..c {
                for u in 0..c {
                    let e = (gc[t] - gc[u]).exp();
                    if u < t {
                        am[t * c + u] = dot(kr(t), kr(u)) * bs[t] * e;
                    }
                    if u <= t {
                        pm[t * c + u] = dot(qr(t), kr(u)) * e;
                    }
                }
            }
            for t in 1..c {
                let row: Vec<f32> = (0..t)
                    .map(|x| {
                        let sum: f32 = (x + 1..t).map(|u| am[t * c + u] * am[u * c + x]).sum();
                        -(am[t * c + x] + sum)
                    })
                    .collect();
                am[t * c..t * c + t].copy_from_slice(&row);
            }
            for t in 0..c {
                am[t * c + t] = 1.0;
            }
            // Per value dimension j: X, v', outputs, the state's column.
            for j in 0..s {
                let col = &mut m[j * s..(j + 1) * s];
                let x: Vec<f32> = (0..c)
                    .map(|t| {
                        let y = dot(kr(t), col);
                        bs[t] * (v[(c0 + t) * h_v * s + h * s + j] - gc[t].exp() * y)
                    })
                    .collect();
                let vp: Vec<f32> = (0..c)
                    .map(|t| (0..=t).map(|u| am[t * c + u] * x[u]).sum())
                    .collect();
                for t in 0..c {
                    let zq = dot(qr(t), col);
                    let intra: f32 = (0..=t).map(|u| pm[t * c + u] * vp[u]).sum();
                    out[(c0 + t) * h_v * s + h * s + j] = (gc[t].exp() * zq + intra) * scale;
                }
                let glast = gc[c - 1];
                let el = glast.exp();
                for (i, sv) in col.iter_mut().enumerate() {
                    let mut acc = *sv * el;
                    for t in 0..c {
                        acc = kr(t)[i].mul_add(vp[t] * (glast - gc[t]).exp(), acc);
                    }
                    *sv = acc;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta_net::{l2_norm_cpu, step_cpu};
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build() {
        crate::catalog::assert_builds(catalog, &[]);
        let mut m = Module::new(Target::Sm80);
        assert!(m.kernel("x", |k| chunk_kernel(k, 96)).is_err());
        assert_eq!(slots(1, 512), 9);
        assert_eq!(chunk_launch(128, 48, 1).grid, (192, 1, 1));
    }

    fn rand(n: usize, seed: &mut u64, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amp
            })
            .collect()
    }

    /// The chunked twin equals the token-by-token twin within float rounding across chunk
    /// edges (1, 63, 64, 65 and 200 tokens), both head mappings, from a non-zero state.
    #[test]
    fn chunked_twin_equals_the_steps() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (s, hk, hv) = (16usize, 2usize, 4usize);
        for (n, grouped) in [
            (1, false),
            (63, true),
            (64, false),
            (65, true),
            (200, false),
        ] {
            let mut q = rand(n * hk * s, &mut seed, 1.0);
            let mut kk = rand(n * hk * s, &mut seed, 1.0);
            l2_norm_cpu(&mut q, s, 1e-6);
            l2_norm_cpu(&mut kk, s, 1e-6);
            let v = rand(n * hv * s, &mut seed, 1.0);
            let alpha = rand(n * hv, &mut seed, 2.0);
            let beta = rand(n * hv, &mut seed, 3.0);
            let dt = rand(hv, &mut seed, 1.0);
            let a: Vec<f32> = rand(hv, &mut seed, 0.9).iter().map(|x| -1.0 - x).collect();
            let s0 = rand(hv * s * s, &mut seed, 0.5);
            let (mut sa, mut sb) = (s0.clone(), s0);
            let mut want = Vec::new();
            for t in 0..n {
                want.extend(step_cpu(
                    s,
                    hk,
                    grouped,
                    &q[t * hk * s..(t + 1) * hk * s],
                    &kk[t * hk * s..(t + 1) * hk * s],
                    &v[t * hv * s..(t + 1) * hv * s],
                    &alpha[t * hv..(t + 1) * hv],
                    &beta[t * hv..(t + 1) * hv],
                    &dt,
                    &a,
                    &mut sa,
                ));
            }
            let got = chunked_cpu(s, hk, grouped, &q, &kk, &v, &alpha, &beta, &dt, &a, &mut sb);
            let worst = |x: &[f32], y: &[f32]| {
                x.iter()
                    .zip(y)
                    .map(|(p, q)| (p - q).abs() / (1.0 + p.abs()))
                    .fold(0f32, f32::max)
            };
            assert!(
                worst(&got, &want) < 2e-5,
                "{n}: outputs {}",
                worst(&got, &want)
            );
            assert!(worst(&sb, &sa) < 2e-5, "{n}: states {}", worst(&sb, &sa));
        }
    }
}
