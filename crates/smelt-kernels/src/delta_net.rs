//! Gated DeltaNet kernels (the linear-attention layers of Qwen3.5/3.6 and Qwen3-Next), the
//! GPU side of the CPU backend's `delta_net` module, for the decode path first:
//!
//! - [`conv1d_kernel`]: the causal depthwise convolution (4 taps) of each sequence's new
//!   rows with its window of the last 3 inputs, which it advances, then SiLU;
//! - [`l2_norm_kernel`]: the q/k normalisation `x / sqrt(sum x^2 + eps)` per head;
//! - [`step_kernel`]: one token of the gated delta rule per sequence, gates computed in
//!   place (`g = softplus(alpha + dt_bias) * a`, `beta = sigmoid(beta)`), the state updated
//!   in device memory;
//! - [`gated_norm_kernel`]: the output norm `rms_norm(o) * w * silu(z)` per value head;
//! - the small ops around these layers in the hybrid models: [`gather_cols_kernel`]
//!   (Qwen3-Next's fused projections split into q/k/v, z, beta, alpha),
//!   [`split_halves_kernel`] (a gated Q `[q, gate]` per head, a fused expert gate|up) and
//!   [`mul_sigmoid_kernel`] (the attention output gate, the shared expert's gate).
//!
//! Per-sequence state lives in device memory owned by the sequence; the kernels find it
//! through a device array of addresses (one per sequence of the step, in the step's
//! order), and the sequence's rows through the step's descriptors (`{row, n_tokens,
//! start_pos, block_table_offset}`), so a decode step stays capturable as a graph. A
//! short prompt runs the step kernel over its tokens in order (the state in registers);
//! longer ones take the chunked form (`delta_chunk`).
//!
//! The CUDA backend runs them (`backend::cuda::delta` in smelt-engine); each kernel has its
//! CPU twin here, tied to the CPU backend's functions by `tests/twins_vs_engine.rs`,
//! ptxas checks in `tests/ptxas.rs`, GPU parity in `examples/gpu_ops` (`-o delta`).

use smelt_ptx::{Cmp, Kernel, Load, Reg, Shfl, Store, F32, FULL_WARP, U32, U64};

use crate::catalog::Entry;
use crate::ops::{kernel_params, Launch, LOG2E};

/// Taps of the convolution (Qwen3.5 and Qwen3-Next: `ssm.conv_kernel` = 4).
pub const CONV_TAPS: usize = 4;
/// Threads per block of the convolution.
pub const CONV_THREADS: u32 = 256;
/// Head sizes the delta-rule step is emitted for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];
/// Threads per state row in the step kernel (each owns `head_dim / 4` keys of the row).
pub const ROW_THREADS: u32 = 4;
/// State rows (value dimensions) per block of the step kernel: a head's rows are
/// independent, so a head spreads over `head_dim / 32` blocks (H100, run 1: one block per
/// head left a single sequence's decode at 48 of 132 SMs, 551 GB/s of state).
pub const BLOCK_ROWS: usize = 32;

/// Name of [`conv1d_kernel`].
pub const CONV1D: &str = "delta_conv1d_silu";
/// Name of [`l2_norm_kernel`].
pub const L2_NORM: &str = "delta_l2_norm";
/// Name of [`gated_norm_kernel`].
pub const GATED_NORM: &str = "delta_gated_norm";

/// Name of [`gather_cols_kernel`].
pub const GATHER_COLS: &str = "delta_gather_cols";
/// Name of [`split_halves_kernel`].
pub const SPLIT_HALVES: &str = "delta_split_halves";
/// Name of [`mul_sigmoid_kernel`].
pub const MUL_SIGMOID: &str = "delta_mul_sigmoid";
/// Threads per block of the flat kernels (gather, split, sigmoid gate).
pub const FLAT_THREADS: u32 = 256;

/// Name of [`step_kernel`] for heads of `head_dim`.
pub fn step_name(head_dim: usize) -> &'static str {
    match head_dim {
        64 => "delta_step_s64",
        _ => "delta_step_s128",
    }
}

/// Name of the run-1 step kernel, one block per head ([`step_kernel_rows`] with `rows =
/// head_dim`): kept beside the 32-row one until a GPU run times both.
pub fn step_head_name(head_dim: usize) -> &'static str {
    match head_dim {
        64 => "delta_step_head_s64",
        _ => "delta_step_head_s128",
    }
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = vec![
        (CONV1D.to_string(), Box::new(conv1d_kernel)),
        (L2_NORM.to_string(), Box::new(l2_norm_kernel)),
        (GATED_NORM.to_string(), Box::new(gated_norm_kernel)),
        (GATHER_COLS.to_string(), Box::new(gather_cols_kernel)),
        (SPLIT_HALVES.to_string(), Box::new(split_halves_kernel)),
        (MUL_SIGMOID.to_string(), Box::new(mul_sigmoid_kernel)),
    ];
    for s in HEAD_DIMS {
        v.push((
            step_name(s).to_string(),
            Box::new(move |k: &Kernel| step_kernel(k, s)),
        ));
        v.push((
            step_head_name(s).to_string(),
            Box::new(move |k: &Kernel| step_kernel_rows(k, s, s)),
        ));
    }
    v.extend(crate::delta_chunk::catalog());
    v
}

fn silu(k: &Kernel, x: Reg<F32>) -> Reg<F32> {
    let e = k.mul(k.reg(), x, -LOG2E);
    k.ex2_approx(e, e);
    k.add(e, e, 1.0f32);
    k.div_rn(k.reg(), x, e)
}

kernel_params! {
    /// Arguments of [`conv1d_kernel`].
    ConvArgs, ConvRegs {
        x: Ptr,
        out: Ptr,
        w: Ptr,
        windows: Ptr,
        seqs: Ptr,
        ch: U32,
        state_off: U32,
    }
}

/// Launch of [`conv1d_kernel`] over `ch` channels and `n_seqs` sequences.
pub fn conv1d_launch(ch: usize, n_seqs: usize) -> Launch {
    Launch::new(
        (
            (ch.div_ceil(CONV_THREADS as usize)).max(1) as u32,
            n_seqs.max(1) as u32,
            1,
        ),
        (CONV_THREADS, 1, 1),
    )
}

/// `out[t][c] = silu(sum_i all[t + i][c] * w[c][i])` over each sequence's new rows, `all`
/// its window (`[3][ch]`, oldest first, at `windows[seq]`) followed by its rows of `x`; the
/// sum is a chain of fused multiply-adds from tap 0 (the CPU backend's `conv1d`, bit for
/// bit before the SiLU). Leaves the last 3 inputs in the window.
///
/// Parameters: `x, out, w ([ch][4]), windows (one address per sequence), seqs (the step's
/// descriptors), ch, state_off` (bytes from a sequence's address to this layer's window:
/// a sequence's state is one block for every layer). Launch: [`conv1d_launch`] (grid y:
/// the sequence).
pub fn conv1d_kernel(k: &Kernel) {
    k.max_threads(CONV_THREADS, 1, 1);
    let a = ConvRegs::declare(k);
    let c = k.global_id_x();
    k.exit_if(k.ge(c, a.ch));
    let seq = k.ctaid_y();
    let desc = k.elem_addr(a.seqs, k.mul(k.reg(), seq, 4u32), 4);
    let row0 = k.load::<U32>(Load::GLOBAL, desc);
    let n = k.load::<U32>(Load::GLOBAL, desc.at(4));
    let win = k.load::<U64>(Load::GLOBAL, k.elem_addr(a.windows, seq, 8));
    let win = k.elem_addr(win, a.state_off, 1);
    let taps: Vec<_> = (0..CONV_TAPS as u32)
        .map(|i| {
            let at = k.mad(k.reg(), c, CONV_TAPS as u32, i);
            k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(a.w, at, 4))
        })
        .collect();
    let past: Vec<_> = (0..CONV_TAPS as u32 - 1)
        .map(|i| {
            let at = k.mad(k.reg(), k.u32(i), a.ch, c);
            k.load::<F32>(Load::GLOBAL, k.elem_addr(win, at, 4))
        })
        .collect();
    k.for_count(n, |k, t| {
        let r = k.add(k.reg(), row0, t);
        let i = k.mad(k.reg(), r, a.ch, c);
        let xt = k.load::<F32>(Load::GLOBAL, k.elem_addr(a.x, i, 4));
        let sum = k.f32(0.0);
        for (j, &w) in taps.iter().enumerate() {
            let v = if j < past.len() { past[j] } else { xt };
            k.fma(sum, v, w, sum);
        }
        let y = silu(k, sum);
        k.st(Store::GLOBAL, k.elem_addr(a.out, i, 4), y);
        // Shift the window in registers.
        for j in 0..past.len() {
            let next = if j + 1 < past.len() { past[j + 1] } else { xt };
            k.mov(past[j], next);
        }
    });
    for (i, &p) in past.iter().enumerate() {
        let at = k.mad(k.reg(), k.u32(i as u32), a.ch, c);
        k.st(Store::GLOBAL, k.elem_addr(win, at, 4), p);
    }
}

/// CPU twin of [`conv1d_kernel`] for one sequence (the CPU backend's `conv1d` then SiLU).
pub fn conv1d_cpu(x: &[f32], window: &mut [f32], w: &[f32], ch: usize) -> Vec<f32> {
    let n = x.len() / ch;
    let past = CONV_TAPS - 1;
    let mut all = window[..past * ch].to_vec();
    all.extend_from_slice(x);
    let mut out = vec![0f32; n * ch];
    for t in 0..n {
        for c in 0..ch {
            let mut sum = 0f32;
            for i in 0..CONV_TAPS {
                sum = all[(t + i) * ch + c].mul_add(w[c * CONV_TAPS + i], sum);
            }
            out[t * ch + c] = sum / (1.0 + (-sum).exp());
        }
    }
    window[..past * ch].copy_from_slice(&all[n * ch..(n + past) * ch]);
    out
}

kernel_params! {
    /// Arguments of [`l2_norm_kernel`].
    L2Args, L2Regs {
        x: Ptr,
        n_chunks: U32,
        width: U32,
        eps: F32,
        per_row: U32,
        row_stride: U32,
    }
}

/// Warps per block of the per-head norms.
pub const NORM_WARPS: u32 = 4;

/// Launch of the per-head norms over `n_chunks` heads: one warp each.
pub fn norm_launch(n_chunks: usize) -> Launch {
    Launch::new(
        ((n_chunks.max(1) as u32).div_ceil(NORM_WARPS), 1, 1),
        (32, NORM_WARPS, 1),
    )
}

/// One warp's `sum x^2` over a chunk at `base` of `width` floats.
fn sum_squares(k: &Kernel, base: Reg<U64>, width: Reg<U32>) -> Reg<F32> {
    let acc = k.f32(0.0);
    k.stride_loop(k.tid_x(), width, 32u32, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(base, i, 4));
        k.fma(acc, v, v, acc);
    });
    k.warp_sum(acc)
}

/// `x *= 1 / sqrt(sum x^2 + eps)` over each `width`-long chunk (llama.cpp's
/// `rms_norm(x, eps / width) / sqrt(width)`, the same function). The chunks are the first
/// `per_row` heads of rows `row_stride` floats apart (q and k, the first columns of the
/// convolution's output): chunk `c` starts at `(c / per_row) * row_stride + (c % per_row)
/// * width`.
///
/// Parameters: `x (in place), n_chunks, width, eps, per_row, row_stride`. Launch:
/// [`norm_launch`].
pub fn l2_norm_kernel(k: &Kernel) {
    k.max_threads(32, NORM_WARPS, 1);
    let a = L2Regs::declare(k);
    let chunk = k.mad(k.reg(), k.ctaid_x(), NORM_WARPS, k.tid_y());
    k.exit_if(k.ge(chunk, a.n_chunks));
    let row = k.div_int(k.reg(), chunk, a.per_row);
    let head = k.rem(k.reg(), chunk, a.per_row);
    let off = k.mul(k.reg(), head, a.width);
    k.mad(off, row, a.row_stride, off);
    let base = k.elem_addr(a.x, off, 4);
    let ss = sum_squares(k, base, a.width);
    k.add(ss, ss, a.eps);
    let inv = k.sqrt_rn(k.reg(), ss);
    k.div_rn(inv, 1.0f32, inv);
    k.stride_loop(k.tid_x(), a.width, 32u32, |k, i| {
        let at = k.elem_addr(base, i, 4);
        let v = k.load::<F32>(Load::GLOBAL, at);
        k.mul(v, v, inv);
        k.st(Store::GLOBAL, at, v);
    });
}

/// CPU twin of [`l2_norm_kernel`].
pub fn l2_norm_cpu(x: &mut [f32], width: usize, eps: f32) {
    for r in x.chunks_mut(width) {
        let ss: f64 = r.iter().map(|&v| (v * v) as f64).sum();
        let inv = 1.0 / ((ss as f32) + eps).sqrt();
        r.iter_mut().for_each(|v| *v *= inv);
    }
}

kernel_params! {
    /// Arguments of [`gated_norm_kernel`].
    GatedNormArgs, GatedNormRegs {
        o: Ptr,
        w: Ptr,
        z: Ptr,
        n_chunks: U32,
        width: U32,
        eps: F32,
    }
}

/// `o = (o / sqrt(mean(o^2) + eps)) * w * silu(z)` over each value head (`width` =
/// `w`'s length).
///
/// Parameters: `o (in place), w, z, n_chunks, width, eps`. Launch: [`norm_launch`].
pub fn gated_norm_kernel(k: &Kernel) {
    k.max_threads(32, NORM_WARPS, 1);
    let a = GatedNormRegs::declare(k);
    let chunk = k.mad(k.reg(), k.ctaid_x(), NORM_WARPS, k.tid_y());
    k.exit_if(k.ge(chunk, a.n_chunks));
    let off = k.mul(k.reg(), chunk, a.width);
    let base = k.elem_addr(a.o, off, 4);
    let zb = k.elem_addr(a.z, off, 4);
    let ss = sum_squares(k, base, a.width);
    let wf = k.cvt(k.reg::<F32>(), a.width, smelt_ptx::FloatRound::Rn);
    let mean = k.div_rn(k.reg(), ss, wf);
    k.add(mean, mean, a.eps);
    let inv = k.sqrt_rn(k.reg(), mean);
    k.div_rn(inv, 1.0f32, inv);
    k.stride_loop(k.tid_x(), a.width, 32u32, |k, i| {
        let at = k.elem_addr(base, i, 4);
        let v = k.load::<F32>(Load::GLOBAL, at);
        let w = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(a.w, i, 4));
        let z = k.load::<F32>(Load::GLOBAL, k.elem_addr(zb, i, 4));
        k.mul(v, v, inv);
        k.mul(v, v, w);
        let g = silu(k, z);
        k.mul(v, v, g);
        k.st(Store::GLOBAL, at, v);
    });
}

/// CPU twin of [`gated_norm_kernel`] (the CPU backend's `gated_rms_norm`).
pub fn gated_norm_cpu(o: &mut [f32], w: &[f32], z: &[f32], eps: f32) {
    let n = w.len();
    for (r, z) in o.chunks_mut(n).zip(z.chunks(n)) {
        let ss: f64 = r.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((ss / n as f64) as f32 + eps).sqrt();
        for ((v, &w), &z) in r.iter_mut().zip(w).zip(z) {
            *v = ((*v * scale) * w) * (z / (1.0 + (-z).exp()));
        }
    }
}

kernel_params! {
    /// Arguments of [`step_kernel`].
    StepArgs, StepRegs {
        q: Ptr,
        k: Ptr,
        v: Ptr,
        alpha: Ptr,
        beta: Ptr,
        dt_bias: Ptr,
        a: Ptr,
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

/// Launch of [`step_kernel`]: one block per ([`BLOCK_ROWS`] rows of a value head,
/// sequence).
pub fn step_launch(head_dim: usize, h_v: usize, n_seqs: usize) -> Launch {
    step_launch_rows(head_dim, h_v, n_seqs, BLOCK_ROWS)
}

/// Launch of [`step_kernel_rows`] with `rows` state rows a block (`head_dim`: the run-1
/// kernel, [`step_head_name`]).
pub fn step_launch_rows(head_dim: usize, h_v: usize, n_seqs: usize, rows: usize) -> Launch {
    let groups = (head_dim / rows).max(1);
    Launch::new(
        ((h_v * groups).max(1) as u32, n_seqs.max(1) as u32, 1),
        (ROW_THREADS * rows as u32, 1, 1),
    )
}

/// The gated delta rule for value head `h = ctaid.x / (s / 32)` (rows `32 * (ctaid.x % (s /
/// 32))` on, [`BLOCK_ROWS`] of them) of sequence `ctaid.y`, over each of
/// the sequence's new tokens in order (its rows from the descriptor: one at decode, a
/// whole prompt chunk otherwise; the state stays in registers between tokens). Its state,
/// `[h_v][s][s]` with row `j` holding `S[.][j]`, is at `states[seq] + state_off` bytes.
/// Per token: `g = softplus(alpha + dt_bias[h]) * a[h]` (softplus `x` above 20),
/// `b = sigmoid(beta)`, `S *= e^g`, `d_j = (v_j - S_j . k) b`, `S_j += k d_j`,
/// `o_j = (S_j . q) / sqrt(s)`. `q`, `k`, `v`: rows `stride` floats apart (heads of `s`:
/// `h_k` of q and k, L2-normed; `h_v` of v), `alpha`, `beta`: `[rows][h_v]`, `out`:
/// `[rows][h_v][s]`; value head `h` reads key head `h / (h_v / h_k)` when `grouped`, else
/// `h % h_k`.
///
/// [`ROW_THREADS`] threads per state row, each with `s / 4` keys in registers.
///
/// Parameters: `q, k, v, alpha, beta, dt_bias, a, out, states, seqs, h_k, h_v, grouped,
/// stride, state_off`. Launch: [`step_launch`].
pub fn step_kernel(k: &Kernel, s: usize) {
    step_kernel_rows(k, s, BLOCK_ROWS)
}

/// [`step_kernel`] with `rows` state rows a block (a divisor of `s`, at least 8).
pub fn step_kernel_rows(k: &Kernel, s: usize, rows: usize) {
    if !HEAD_DIMS.contains(&s) {
        k.reject(format!("heads of {s}: one of {HEAD_DIMS:?}"));
        return;
    }
    if rows < 8 || s % rows != 0 {
        k.reject(format!("{rows} rows a block for heads of {s}"));
        return;
    }
    let threads = ROW_THREADS * rows as u32;
    k.max_threads(threads, 1, 1);
    let p = StepRegs::declare(k);
    let per = s / ROW_THREADS as usize;
    let groups = (s / rows) as u32;
    let h = k.div_int(k.reg(), k.ctaid_x(), groups);
    let group = k.rem(k.reg(), k.ctaid_x(), groups);
    let seq = k.ctaid_y();
    let tid = k.tid_x();
    let j = k.shr(k.reg(), tid, 2u32);
    k.mad(j, group, rows as u32, j);
    let part = k.and(k.reg(), tid, 3u32);
    let desc = k.elem_addr(p.seqs, k.mul(k.reg(), seq, 4u32), 4);
    let row0 = k.load::<U32>(Load::GLOBAL, desc);
    let n = k.load::<U32>(Load::GLOBAL, desc.at(4));
    // Key head of this value head.
    let ratio = k.div_int(k.reg(), p.h_v, p.h_k);
    let kh_g = k.div_int(k.reg(), h, ratio);
    let kh_m = k.rem(k.reg(), h, p.h_k);
    let grouped = k.cmp(Cmp::Ne, p.grouped, 0u32);
    let kh = k.selp(k.reg(), kh_g, kh_m, grouped);
    let dt = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(p.dt_bias, h, 4));
    let av = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(p.a, h, 4));
    let s32 = s as u32;
    // Offsets within a row: this thread's keys of q and k, its value j of v.
    let qk_col = k.mad(k.reg(), kh, s32, k.mul(k.reg(), part, per as u32));
    let v_col = k.mad(k.reg(), h, s32, j);
    let st = k.load::<U64>(Load::GLOBAL, k.elem_addr(p.states, seq, 8));
    let st = k.elem_addr(st, p.state_off, 1);
    let srow = k.mad(k.reg(), h, s32, j);
    let sbase = k.mad(k.reg(), srow, s32, k.mul(k.reg(), part, per as u32));
    let sa = k.elem_addr(st, sbase, 4);
    let words: Vec<Reg<F32>> = (0..per).map(|_| k.reg::<F32>()).collect();
    for c in (0..per).step_by(4) {
        k.ld_v4(
            Load::GLOBAL,
            [words[c], words[c + 1], words[c + 2], words[c + 3]],
            sa.at(4 * c as i64),
        );
    }
    let ks: Vec<Reg<F32>> = (0..per).map(|_| k.reg::<F32>()).collect();
    let quad_sum = |k: &Kernel, v: Reg<F32>| {
        for off in [1u32, 2] {
            let o = k.shfl_sync(Shfl::Bfly, k.reg(), v, off, FULL_WARP);
            k.add(v, v, o);
        }
    };
    k.for_count(n, |k, t| {
        let row = k.add(k.reg(), row0, t);
        let rbase = k.mul(k.reg(), row, p.stride);
        // Gates.
        let gi = k.mad(k.reg(), row, p.h_v, h);
        let al = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.alpha, gi, 4));
        let bl = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.beta, gi, 4));
        let qk = k.add(k.reg(), rbase, qk_col);
        let qa = k.elem_addr(p.q, qk, 4);
        let ka = k.elem_addr(p.k, qk, 4);
        let vi = k.add(k.reg(), rbase, v_col);
        let vj = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.v, vi, 4));
        for c in (0..per).step_by(4) {
            k.ld_v4(
                Load::GLOBAL,
                [ks[c], ks[c + 1], ks[c + 2], ks[c + 3]],
                ka.at(4 * c as i64),
            );
        }
        let x = k.add(k.reg(), al, dt);
        // softplus(x) = ln(1 + e^x) = log2(1 + 2^(x log2 e)) / log2 e.
        let e = k.mul(k.reg(), x, LOG2E);
        k.ex2_approx(e, e);
        k.add(e, e, 1.0f32);
        k.lg2_approx(e, e);
        k.mul(e, e, std::f32::consts::LN_2);
        let big = k.cmp(Cmp::Gt, x, 20.0f32);
        let sp = k.selp(k.reg(), x, e, big);
        let g = k.mul(k.reg(), sp, av);
        let decay = k.mul(k.reg(), g, LOG2E);
        k.ex2_approx(decay, decay);
        let nb = k.mul(k.reg(), bl, -LOG2E);
        k.ex2_approx(nb, nb);
        k.add(nb, nb, 1.0f32);
        let b = k.div_rn(k.reg(), 1.0f32, nb);
        // Four partial sums: a chain of `s / 16` fused multiply-adds each, not `s / 4`
        // (a prompt runs this loop once per token: its latency is the kernel's time).
        let parts: [Reg<F32>; 4] = std::array::from_fn(|_| k.f32(0.0));
        for (i, (w, &kv)) in words.iter().zip(&ks).enumerate() {
            k.mul(*w, *w, decay);
            k.fma(parts[i % 4], *w, kv, parts[i % 4]);
        }
        let dot = sum4(k, parts);
        quad_sum(k, dot);
        let d = k.sub(k.reg(), vj, dot);
        k.mul(d, d, b);
        let parts: [Reg<F32>; 4] = std::array::from_fn(|_| k.f32(0.0));
        for c in (0..per).step_by(4) {
            let qs = k.regs::<F32, 4>();
            k.ld_v4(Load::GLOBAL, qs, qa.at(4 * c as i64));
            for i in 0..4 {
                let w = words[c + i];
                k.fma(w, ks[c + i], d, w);
                k.fma(parts[i], w, qs[i], parts[i]);
            }
        }
        let o = sum4(k, parts);
        quad_sum(k, o);
        let first = k.eq(part, 0u32);
        k.if_(first, |k| {
            k.mul(o, o, 1.0 / (s as f32).sqrt());
            let oi = k.mad(k.reg(), gi, s32, j);
            k.st(Store::GLOBAL, k.elem_addr(p.out, oi, 4), o);
        });
    });
    for c in (0..per).step_by(4) {
        k.st_v4(
            Store::GLOBAL,
            sa.at(4 * c as i64),
            [words[c], words[c + 1], words[c + 2], words[c + 3]],
        );
    }
}

/// `(p0 + p1) + (p2 + p3)`.
fn sum4(k: &Kernel, p: [Reg<F32>; 4]) -> Reg<F32> {
    k.add(p[0], p[0], p[1]);
    k.add(p[2], p[2], p[3]);
    k.add(p[0], p[0], p[2])
}

/// CPU twin of [`step_kernel`] for one token of one sequence: gates from `alpha`, `beta`
/// (`[h_v]`), then the recurrence (the CPU backend's `delta_rule` of one token).
#[allow(clippy::too_many_arguments)]
pub fn step_cpu(
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
    let h_v = alpha.len();
    let mut out = vec![0f32; h_v * s];
    for h in 0..h_v {
        let kh = if grouped { h / (h_v / h_k) } else { h % h_k };
        let x = alpha[h] + dt_bias[h];
        let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
        let decay = (sp * a[h]).exp();
        let b = 1.0 / (1.0 + (-beta[h]).exp());
        let (qd, kd) = (&q[kh * s..(kh + 1) * s], &k[kh * s..(kh + 1) * s]);
        let m = &mut state[h * s * s..(h + 1) * s * s];
        m.iter_mut().for_each(|x| *x *= decay);
        for j in 0..s {
            let row = &mut m[j * s..(j + 1) * s];
            let dot: f32 = row.iter().zip(kd).map(|(x, y)| x * y).sum();
            let d = (v[h * s + j] - dot) * b;
            row.iter_mut()
                .zip(kd)
                .for_each(|(x, &ki)| *x = ki.mul_add(d, *x));
            out[h * s + j] =
                row.iter().zip(qd).map(|(x, y)| x * y).sum::<f32>() / (s as f32).sqrt();
        }
    }
    out
}

/// Launch of the flat kernels over `n` outputs (grid-stride, at most 4096 blocks).
pub fn flat_launch(n: usize) -> Launch {
    let blocks = n.div_ceil(FLAT_THREADS as usize).clamp(1, 4096) as u32;
    Launch::new((blocks, 1, 1), (FLAT_THREADS, 1, 1))
}

kernel_params! {
    /// Arguments of [`gather_cols_kernel`].
    GatherArgs, GatherRegs {
        x: Ptr,
        out: Ptr,
        cols: Ptr,
        n: U32,
        n_cols: U32,
        x_cols: U32,
    }
}

/// `out[r][j] = x[r][cols[j]]` for the `n = rows * n_cols` outputs.
///
/// Parameters: `x, out, cols (u32 column indices), n, n_cols, x_cols`. Launch:
/// [`flat_launch`].
pub fn gather_cols_kernel(k: &Kernel) {
    k.max_threads(FLAT_THREADS, 1, 1);
    let a = GatherRegs::declare(k);
    k.stride_loop(k.global_id_x(), a.n, k.grid_size_x(), |k, i| {
        let r = k.div_int(k.reg(), i, a.n_cols);
        let j = k.rem(k.reg(), i, a.n_cols);
        let c = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(a.cols, j, 4));
        let src = k.mad(k.reg(), r, a.x_cols, c);
        let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(a.x, src, 4));
        k.st(Store::GLOBAL, k.elem_addr(a.out, i, 4), v);
    });
}

/// CPU twin of [`gather_cols_kernel`].
pub fn gather_cols_cpu(x: &[f32], x_cols: usize, cols: &[u32]) -> Vec<f32> {
    x.chunks(x_cols)
        .flat_map(|r| cols.iter().map(move |&c| r[c as usize]))
        .collect()
}

kernel_params! {
    /// Arguments of [`split_halves_kernel`].
    SplitArgs, SplitRegs {
        x: Ptr,
        a: Ptr,
        b: Ptr,
        n: U32,
        width: U32,
    }
}

/// Splits chunks of `2 * width` (`[first (width), second (width)]`: a gated Q's heads,
/// a fused expert gate|up row) into `a` and `b`: `a[c][o] = x[c][o]`, `b[c][o] =
/// x[c][width + o]` for the `n` outputs of each.
///
/// Parameters: `x, a, b, n, width`. Launch: [`flat_launch`].
pub fn split_halves_kernel(k: &Kernel) {
    k.max_threads(FLAT_THREADS, 1, 1);
    let p = SplitRegs::declare(k);
    k.stride_loop(k.global_id_x(), p.n, k.grid_size_x(), |k, i| {
        let c = k.div_int(k.reg(), i, p.width);
        let o = k.rem(k.reg(), i, p.width);
        let w2 = k.add(k.reg(), p.width, p.width);
        let src = k.mad(k.reg(), c, w2, o);
        let first = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.x, src, 4));
        let at = k.add(k.reg(), src, p.width);
        let second = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.x, at, 4));
        k.st(Store::GLOBAL, k.elem_addr(p.a, i, 4), first);
        k.st(Store::GLOBAL, k.elem_addr(p.b, i, 4), second);
    });
}

/// CPU twin of [`split_halves_kernel`]: `(a, b)`.
pub fn split_halves_cpu(x: &[f32], width: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for c in x.chunks(2 * width) {
        a.extend_from_slice(&c[..width]);
        b.extend_from_slice(&c[width..]);
    }
    (a, b)
}

kernel_params! {
    /// Arguments of [`mul_sigmoid_kernel`].
    MulSigmoidArgs, MulSigmoidRegs {
        x: Ptr,
        g: Ptr,
        n: U32,
        cols: U32,
        per_row: U32,
    }
}

/// `x[i] *= sigmoid(g[i])`, or with `per_row` (one gate logit per row of `cols`)
/// `x[i] *= sigmoid(g[i / cols])`.
///
/// Parameters: `x (in place), g, n, cols, per_row (0 or 1)`. Launch: [`flat_launch`].
pub fn mul_sigmoid_kernel(k: &Kernel) {
    k.max_threads(FLAT_THREADS, 1, 1);
    let p = MulSigmoidRegs::declare(k);
    let per_row = k.cmp(Cmp::Ne, p.per_row, 0u32);
    k.stride_loop(k.global_id_x(), p.n, k.grid_size_x(), |k, i| {
        let r = k.div_int(k.reg(), i, p.cols);
        let gi = k.selp(k.reg(), r, i, per_row);
        let g = k.load::<F32>(Load::GLOBAL, k.elem_addr(p.g, gi, 4));
        let at = k.elem_addr(p.x, i, 4);
        let v = k.load::<F32>(Load::GLOBAL, at);
        // sigmoid(g) = 1 / (1 + 2^(-g log2 e)).
        let e = k.mul(k.reg(), g, -LOG2E);
        k.ex2_approx(e, e);
        k.add(e, e, 1.0f32);
        let sg = k.div_rn(k.reg(), 1.0f32, e);
        k.mul(v, v, sg);
        k.st(Store::GLOBAL, at, v);
    });
}

/// CPU twin of [`mul_sigmoid_kernel`] (the CPU backend's `mul_sigmoid`).
pub fn mul_sigmoid_cpu(x: &mut [f32], g: &[f32], cols: usize, per_row: bool) {
    for (i, v) in x.iter_mut().enumerate() {
        let gv = if per_row { g[i / cols] } else { g[i] };
        *v *= 1.0 / (1.0 + (-gv).exp());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build() {
        crate::catalog::assert_builds(catalog, &[]);
        let mut m = Module::new(Target::Sm80);
        assert!(m.kernel("x", |k| step_kernel(k, 96)).is_err());
    }

    #[test]
    fn twins_keep_their_invariants() {
        // The convolution over a prompt equals it token by token and leaves the same window.
        let ch = 5;
        let x: Vec<f32> = (0..3 * ch).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..ch * CONV_TAPS)
            .map(|i| (i as f32 * 0.11).cos())
            .collect();
        let w0: Vec<f32> = (0..3 * ch).map(|i| i as f32 * 0.01).collect();
        let (mut a, mut b) = (w0.clone(), w0.clone());
        let all = conv1d_cpu(&x, &mut a, &w, ch);
        let mut steps = Vec::new();
        for t in 0..3 {
            steps.extend(conv1d_cpu(&x[t * ch..(t + 1) * ch], &mut b, &w, ch));
        }
        assert_eq!(all, steps);
        assert_eq!(a, b);
        let mut v = vec![3.0f32, 4.0];
        l2_norm_cpu(&mut v, 2, 0.0);
        assert!((v[0] - 0.6).abs() < 1e-6);
        // A zero state and beta logit 0 (b = 1/2): S_j = k v_j / 2, o_j = (k.q) v_j / 2 / 8.
        let s = 64;
        let mut k1 = vec![0f32; s];
        k1[0] = 1.0;
        let vv: Vec<f32> = (0..s).map(|j| j as f32).collect();
        let mut st = vec![0f32; s * s];
        let o = step_cpu(
            s,
            1,
            false,
            &k1,
            &k1,
            &vv,
            &[0.0],
            &[0.0],
            &[0.0],
            &[-1.0],
            &mut st,
        );
        assert!((o[4] - 4.0 / 2.0 / 8.0).abs() < 1e-6, "{}", o[4]);
        assert!((st[4 * s] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn small_op_twins_do_what_they_say() {
        // Two rows of 4: columns 3, 0, 3.
        let x = [0.0f32, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0];
        assert_eq!(
            gather_cols_cpu(&x, 4, &[3, 0, 3]),
            [3.0, 0.0, 3.0, 13.0, 10.0, 13.0]
        );
        // Chunks of [first 2, second 2].
        let (a, b) = split_halves_cpu(&x, 2);
        assert_eq!(a, [0.0, 1.0, 10.0, 11.0]);
        assert_eq!(b, [2.0, 3.0, 12.0, 13.0]);
        // sigmoid(0) = 1/2 per element, or per row.
        let mut y = [2.0f32, 4.0, 6.0, 8.0];
        mul_sigmoid_cpu(&mut y, &[0.0, 0.0, 100.0, -100.0], 2, false);
        assert_eq!(y[..2], [1.0, 2.0]);
        assert!((y[2] - 6.0).abs() < 1e-6 && y[3].abs() < 1e-6);
        let mut y = [2.0f32, 4.0, 6.0, 8.0];
        mul_sigmoid_cpu(&mut y, &[0.0, 100.0], 2, true);
        assert_eq!(y, [1.0, 2.0, 6.0, 8.0]);
        assert_eq!(flat_launch(0).grid.0, 1);
        assert_eq!(flat_launch(10_000_000).grid.0, 4096);
    }
}
