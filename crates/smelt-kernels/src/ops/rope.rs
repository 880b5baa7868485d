//! Rotary position embedding, in place, positions read from device memory.
//!
//! The angle of pair `i` at position `p` is computed exactly as the CPU backend (and
//! ggml's CPU rope cache) computes it: `t = p as f32`, multiplied `i` times by
//! `theta_scale = freq_base^(-2 / n_rot)` in f32, divided by `freq_factors[i]` when
//! given, times `freq_scale`. The angle is then reduced modulo 2π in f64 and its sine and
//! cosine taken with the hardware approximations (absolute error below 1e-6 on [-π, π]),
//! which stay accurate at any position, unlike `sin.approx` of the raw angle.

use smelt_ptx::{FloatRound, IntRound, Kernel, Load, Store, F32, F64, U32, U64};

use super::{dim, kernel_params, Launch};
use crate::catalog::Entry;

/// How rope pairs the dimensions of a head (the engine's `RopeStyle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml's mode 0: Llama).
    Normal,
    /// Halves `(i, i + n_rot/2)` (ggml's NeoX mode: Qwen, Gemma).
    Neox,
}

/// The kernel's name for `style`.
pub fn name(style: RopeStyle) -> &'static str {
    match style {
        RopeStyle::Normal => "rope_normal",
        RopeStyle::Neox => "rope_neox",
    }
}

/// The fused rope + KV-append kernel's name for `style`.
pub fn kv_rows_name(style: RopeStyle) -> &'static str {
    match style {
        RopeStyle::Normal => "rope_kv_rows_normal",
        RopeStyle::Neox => "rope_kv_rows_neox",
    }
}

/// The name of the fused kernel that RMS-normalizes each Q and K head first
/// ([`rope_kv_rows_norm_kernel`]), for `style`.
pub fn kv_rows_norm_name(style: RopeStyle) -> &'static str {
    match style {
        RopeStyle::Normal => "rope_kv_rows_normal_qknorm",
        RopeStyle::Neox => "rope_kv_rows_neox_qknorm",
    }
}

/// The rope kernels and the fused rope + KV-append kernels (plain, and after the Q and K
/// head norms), for both styles.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for s in [RopeStyle::Normal, RopeStyle::Neox] {
        v.push((
            name(s).to_string(),
            Box::new(move |k: &Kernel| kernel(k, s)),
        ));
        v.push((
            kv_rows_name(s).to_string(),
            Box::new(move |k: &Kernel| rope_kv_rows_kernel(k, s)),
        ));
        v.push((
            kv_rows_norm_name(s).to_string(),
            Box::new(move |k: &Kernel| rope_kv_rows_norm_kernel(k, s)),
        ));
    }
    v
}

/// `freq_base^(-2 / n_rot)` as the CPU backend computes it (f32 `powf`): the host passes
/// this as the kernel's `theta_scale`.
pub fn theta_scale(freq_base: f32, n_rot: usize) -> f32 {
    freq_base.powf(-2.0 / n_rot as f32)
}

/// Launch over `rows` rows of `cols / head_dim` heads: one block per (row, head), one
/// thread per rotated pair.
pub fn launch(rows: usize, cols: usize, head_dim: usize, n_rot: usize) -> Launch {
    let heads = cols / head_dim.max(1);
    let pairs = (n_rot.min(head_dim) / 2).max(1);
    Launch::new(
        (dim(rows), dim(heads), 1),
        ((pairs.div_ceil(32) * 32) as u32, 1, 1),
    )
}

/// The angle of pair `i` at position `p` (see the module doc): `(sin, cos)`.
pub(crate) fn angle(
    k: &Kernel,
    p: smelt_ptx::Reg<U32>,
    i: smelt_ptx::Reg<U32>,
    ff_raw: smelt_ptx::Reg<U64>,
    theta_scale: smelt_ptx::Reg<F32>,
    freq_scale: smelt_ptx::Reg<F32>,
) -> (smelt_ptx::Reg<F32>, smelt_ptx::Reg<F32>) {
    let t = k.cvt(k.reg::<F32>(), p, FloatRound::Rn);
    k.for_count(i, |k, _| {
        k.mul(t, t, theta_scale);
    });
    let has_ff = k.cmp(smelt_ptx::Cmp::Ne, ff_raw, 0u64);
    k.if_(has_ff, |k| {
        let ff = k.reg::<U64>();
        k.raw(format!("cvta.to.global.u64 {ff}, {ff_raw}"));
        let f = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(ff, i, 4));
        k.div_rn(t, t, f);
    });
    let theta = k.mul(k.reg(), t, freq_scale);
    sincos(k, theta)
}

/// The rotated pair `(x0·cos - x1·sin, x0·sin + x1·cos)`, first products fused as the CPU
/// backend (and ggml built by GCC, which contracts them) computes them.
pub(crate) fn rotate(
    k: &Kernel,
    x0: smelt_ptx::Reg<F32>,
    x1: smelt_ptx::Reg<F32>,
    sin: smelt_ptx::Reg<F32>,
    cos: smelt_ptx::Reg<F32>,
) -> (smelt_ptx::Reg<F32>, smelt_ptx::Reg<F32>) {
    let t1 = k.mul(k.reg(), x1, sin);
    k.neg(t1, t1);
    let y0 = k.fma(k.reg(), x0, cos, t1);
    let t3 = k.mul(k.reg(), x1, cos);
    let y1 = k.fma(k.reg(), x0, sin, t3);
    (y0, y1)
}

/// Launch of [`rope_kv_rows_kernel`] for `n_seqs` sequences of at most `max_tokens` new
/// tokens: one block per (sequence, Q, K or V head), blocks striding over the sequence's
/// tokens (one per token up to 1024), one thread per pair.
pub fn kv_rows_launch(
    n_seqs: usize,
    max_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
) -> Launch {
    let pairs = (head_dim / 2).max(1);
    Launch::new(
        (
            dim(n_seqs),
            dim(n_head + 2 * n_head_kv),
            dim(max_tokens.clamp(1, 1024)),
        ),
        ((pairs.div_ceil(32) * 32) as u32, 1, 1),
    )
}

kernel_params! {
    /// Arguments of [`rope_kv_rows_kernel`] (either rope style).
    RopeKvRowsArgs, RopeKvRowsRegs {
        q: Ptr,
        k: Ptr,
        v: Ptr,
        pos: Ptr,
        freq_factors: MaybePtr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        n_head: U32,
        n_head_kv: U32,
        head_dim: U32,
        block_size: U32,
        theta_scale: F32,
        freq_scale: F32,
    }
}

/// A step's rope of Q and K and its KV-cache append in one launch, for any number of
/// sequences and tokens (instead of [`kernel`] twice and `kv::kv_append_kernel`): rows of
/// `q` (`n_head` heads) and `k` (`n_head_kv` heads) rotated in place as [`kernel`] rotates
/// them, every dimension (`n_rot == head_dim`), each row by its own position `pos[row]`;
/// the rotated K row and the row of `v` stored as f16 (round to nearest even) at position
/// `start_pos + t` of the row's sequence, as `kv_append` stores them.
///
/// Parameters: `q: *mut f32, k: *mut f32, v: *const f32, pos: *const u32 (one per row),
/// freq_factors: *const f32 (or 0), k_cache: *mut f16, v_cache: *mut f16, seqs: *const
/// SeqDesc, block_tables: *const u32, n_head: u32, n_head_kv: u32, head_dim: u32,
/// block_size: u32, theta_scale: f32, freq_scale: f32`. Launch: [`kv_rows_launch`].
pub fn rope_kv_rows_kernel(k: &Kernel, style: RopeStyle) {
    kv_rows_body(k, style, false);
}

kernel_params! {
    /// Then those of [`rope_kv_rows_norm_kernel`].
    HeadNormArgs, HeadNormRegs {
        q_norm: Ptr,
        k_norm: Ptr,
        eps: F32,
    }
}

/// [`rope_kv_rows_kernel`] after an RMS norm of each Q and K head (Qwen3's and Gemma 3's
/// `attn_q_norm` / `attn_k_norm`): the head's values `x * scale * w`, `scale = 1 /
/// sqrt(mean(x²) + eps)` as `rms_norm` forms it (`w` the norm's `head_dim` weights, the
/// sum of squares in the block's fixed order), then rotated and appended. One launch for
/// what was the head norms' launch and this one.
///
/// Parameters: [`rope_kv_rows_kernel`]'s, then `q_norm: *const f32, k_norm: *const f32
/// (head_dim each), eps: f32`. Launch: [`kv_rows_launch`].
pub fn rope_kv_rows_norm_kernel(k: &Kernel, style: RopeStyle) {
    kv_rows_body(k, style, true);
}

fn kv_rows_body(k: &Kernel, style: RopeStyle, norm: bool) {
    k.max_threads(1024, 1, 1);
    let RopeKvRowsRegs {
        q,
        k: kin,
        v,
        pos,
        freq_factors: ff_raw,
        k_cache: kc,
        v_cache: vc,
        seqs,
        block_tables: tables,
        n_head,
        n_head_kv,
        head_dim,
        block_size,
        theta_scale,
        freq_scale,
    } = RopeKvRowsRegs::declare(k);
    let norms = norm.then(|| HeadNormRegs::declare(k));
    let scratch = norm.then(|| super::reduce_scratch(k, "head_norm_red"));
    let half = k.shr(k.reg(), head_dim, 1u32);
    let i = k.tid_x();
    // With the norm, every thread stays for the block's sum (threads past the head's
    // pairs bring 0 and store nothing); without it, they leave at once.
    let active = k.lt(i, half);
    if !norm {
        k.exit_if(k.ge(i, half));
    }
    let head = k.ctaid_y();
    let (a, b) = match style {
        RopeStyle::Normal => {
            let a = k.shl(k.reg(), i, 1u32);
            (a, k.add(k.reg(), a, 1u32))
        }
        RopeStyle::Neox => (i, k.add(k.reg(), i, half)),
    };
    let w = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, w, k.elem_addr(seqs, k.ctaid_x(), 16));
    let [row0, n_tokens, start, bto] = w;
    let kv_dim = k.mul(k.reg(), n_head_kv, head_dim);
    let q_dim = k.mul(k.reg(), n_head, head_dim);
    let n_rope = k.add(k.reg(), n_head, n_head_kv);
    // What this block's head is: a Q head (rotated), a K head (rotated and stored) or a V
    // head (stored), and its first column in its own tensor.
    let is_q = k.lt(head, n_head);
    let not_q = k.ge(head, n_head);
    let is_v = k.ge(head, n_rope);
    let kh = k.sub(k.reg(), head, n_head);
    let vh = k.sub(k.reg(), head, n_rope);
    let col = k.mul(k.reg(), head, head_dim);
    k.if_(not_q, |k| {
        k.mul(col, kh, head_dim);
    });
    k.if_(is_v, |k| {
        k.mul(col, vh, head_dim);
    });
    let nz = k.special(smelt_ptx::Special::Nctaid(smelt_ptx::Dim::Z));
    let z = k.special(smelt_ptx::Special::Ctaid(smelt_ptx::Dim::Z));
    k.stride_loop(z, n_tokens, nz, |k, t| {
        let row = k.add(k.reg(), row0, t);
        // The token's cache slot, as kv_append finds it.
        let p_cache = k.add(k.reg(), start, t);
        let bi = k.div_int(k.reg(), p_cache, block_size);
        let off = k.rem(k.reg(), p_cache, block_size);
        let ti = k.add(k.reg(), bto, bi);
        let block = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(tables, ti, 4));
        let slot = k.mad(k.reg(), block, block_size, off);
        let slot_base = k.mul_wide(k.reg::<U64>(), slot, kv_dim);
        let store_f16 = |cache: smelt_ptx::Reg<U64>, c: smelt_ptx::Reg<U32>, val| {
            let e = k.cvt(k.reg::<U64>(), c, smelt_ptx::Exact);
            k.add(e, e, slot_base);
            k.shl(e, e, 1u32);
            let h = k.cvt(k.reg::<smelt_ptx::F16>(), val, FloatRound::Rn);
            k.st(Store::GLOBAL, k.add(k.reg(), cache, e), h);
        };
        let ca = k.add(k.reg(), col, a);
        let cb = k.add(k.reg(), col, b);
        let next = k.label();
        let store_v = k.copy(is_v);
        if norm {
            k.and(store_v, store_v, active);
        }
        k.if_(store_v, |k| {
            let e = k.mad(k.reg(), row, kv_dim, 0u32);
            let va = k.load::<F32>(Load::GLOBAL, k.elem_addr(v, k.add(k.reg(), e, ca), 4));
            let vb = k.load::<F32>(Load::GLOBAL, k.elem_addr(v, k.add(k.reg(), e, cb), 4));
            store_f16(vc, ca, va);
            store_f16(vc, cb, vb);
        });
        k.bra_if(is_v, next);
        let p = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(pos, row, 4));
        // Threads past the pairs (norm only) take the last pair's angle: no load of a
        // frequency factor past the head's.
        let pair = if norm {
            let last = k.sub(k.reg(), half, 1u32);
            k.min(k.reg(), i, last)
        } else {
            i
        };
        let (sin, cos) = angle(k, p, pair, ff_raw, theta_scale, freq_scale);
        // The row's first element in Q or K.
        let x = k.reg::<U64>();
        let first = k.reg::<U32>();
        k.if_else(
            is_q,
            |k| {
                k.mov(x, q);
                k.mul(first, row, q_dim);
            },
            |k| {
                k.mov(x, kin);
                k.mul(first, row, kv_dim);
            },
        );
        let (pa, pb) = (
            k.elem_addr(x, k.add(k.reg(), first, ca), 4),
            k.elem_addr(x, k.add(k.reg(), first, cb), 4),
        );
        let (x0, x1) = match (&norms, &scratch) {
            (Some(n), Some(sc)) => {
                // The norm's weights are loaded with the values, before the block's sum
                // (no round trip after it).
                let w = k.copy(n.q_norm);
                k.selp(w, n.k_norm, n.q_norm, not_q);
                let (x0, x1, wa, wb) = (k.f32(0.0), k.f32(0.0), k.f32(0.0), k.f32(0.0));
                k.guarded(active, |k| {
                    k.ld(Load::GLOBAL, x0, pa);
                    k.ld(Load::GLOBAL, x1, pb);
                    k.ld(Load::GLOBAL_NC, wa, k.elem_addr(w, a, 4));
                    k.ld(Load::GLOBAL_NC, wb, k.elem_addr(w, b, 4));
                });
                let sq = k.mul(k.reg(), x0, x0);
                let sq1 = k.mul(k.reg(), x1, x1);
                k.add(sq, sq, sq1);
                let total = super::block_sum(k, sq, sc);
                let nf = k.cvt(k.reg::<F32>(), head_dim, FloatRound::Rn);
                let mean = k.div_rn(k.reg(), total, nf);
                k.add(mean, mean, n.eps);
                let root = k.sqrt_rn(k.reg(), mean);
                let scale = k.div_rn(k.reg(), 1.0f32, root);
                for (x, g) in [(x0, wa), (x1, wb)] {
                    k.mul(x, x, scale);
                    k.mul(x, x, g);
                }
                (x0, x1)
            }
            _ => (
                k.load::<F32>(Load::GLOBAL, pa),
                k.load::<F32>(Load::GLOBAL, pb),
            ),
        };
        let (y0, y1) = rotate(k, x0, x1, sin, cos);
        let store = |k: &Kernel| {
            k.st(Store::GLOBAL, pa, y0);
            k.st(Store::GLOBAL, pb, y1);
            // Past the V heads' branch, not Q is K.
            k.if_(not_q, |_| {
                store_f16(kc, ca, y0);
                store_f16(kc, cb, y1);
            });
        };
        if norm {
            k.if_(active, store);
        } else {
            store(k);
        }
        k.place(next);
    });
}

/// The first step of [`rope_kv_rows_norm_kernel`]'s CPU twin: `rms_norm_cpu` of every
/// `head_dim` values of `q` (weights `q_norm`) and of `k` (`k_norm`), in place; the twin is
/// this, then [`rope_kv_rows_cpu`].
pub fn head_norms_cpu(
    q: &mut [f32],
    k: &mut [f32],
    head_dim: usize,
    (q_norm, k_norm, eps): (&[f32], &[f32], f32),
) {
    for (x, w) in [(q, q_norm), (k, k_norm)] {
        let mut normed = vec![0f32; head_dim];
        for h in x.chunks_mut(head_dim) {
            super::norm::rms_norm_cpu(h, w, eps, &mut normed[..h.len()]);
            h.copy_from_slice(&normed[..h.len()]);
        }
    }
}

/// CPU twin of [`rope_kv_rows_kernel`]: [`rope_cpu`] of `q` and of `k`, then
/// `kv_append_cpu` of the rotated `k` and `v`.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_rows_cpu(
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    positions: &[u32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    seqs: &[super::kv::SeqDesc],
    block_tables: &[u32],
    (n_head, n_head_kv, head_dim, block_size): (usize, usize, usize, usize),
    style: RopeStyle,
    (freq_base, freq_scale): (f32, f32),
    freq_factors: Option<&[f32]>,
) {
    let kv_dim = n_head_kv * head_dim;
    for (x, cols) in [(q, n_head * head_dim), (&mut *k, kv_dim)] {
        rope_cpu(
            x,
            positions,
            cols,
            head_dim,
            head_dim,
            style,
            freq_base,
            freq_scale,
            freq_factors,
        );
    }
    super::kv::kv_append_cpu(
        k,
        v,
        k_cache,
        v_cache,
        seqs,
        block_tables,
        kv_dim,
        block_size,
    );
}

kernel_params! {
    /// Arguments of the rope [`kernel`] (either style).
    RopeArgs, RopeRegs {
        x: Ptr,
        pos: Ptr,
        freq_factors: MaybePtr,
        cols: U32,
        head_dim: U32,
        n_rot: U32,
        theta_scale: F32,
        freq_scale: F32,
    }
}

/// Rotates every head of every row of `x` by the row's position.
///
/// Parameters: `x: *mut f32, pos: *const u32 (one per row), freq_factors: *const f32
/// (n_rot / 2 values, or 0 for none), cols: u32, head_dim: u32, n_rot: u32 (even, at most
/// head_dim), theta_scale: f32 ([`theta_scale`]), freq_scale: f32`. Launch: [`launch`].
pub fn kernel(k: &Kernel, style: RopeStyle) {
    k.max_threads(1024, 1, 1);
    let RopeRegs {
        x,
        pos,
        freq_factors: ff_raw,
        cols,
        head_dim,
        n_rot,
        theta_scale,
        freq_scale,
    } = RopeRegs::declare(k);
    let half = k.shr(k.reg(), n_rot, 1u32);
    let i = k.tid_x();
    k.exit_if(k.ge(i, half));
    let row = k.ctaid_x();
    let head = k.ctaid_y();
    let p = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(pos, row, 4));
    let (sin, cos) = angle(k, p, i, ff_raw, theta_scale, freq_scale);

    let first = k.mad(k.reg(), row, cols, 0u32);
    k.mad(first, head, head_dim, first);
    let (a, b) = match style {
        RopeStyle::Normal => {
            let a = k.mad(k.reg(), i, 2u32, first);
            (a, k.add(k.reg(), a, 1u32))
        }
        RopeStyle::Neox => {
            let a = k.add(k.reg(), first, i);
            (a, k.add(k.reg(), a, half))
        }
    };
    let (pa, pb) = (k.elem_addr(x, a, 4), k.elem_addr(x, b, 4));
    let x0 = k.load::<F32>(Load::GLOBAL, pa);
    let x1 = k.load::<F32>(Load::GLOBAL, pb);
    // `x0·cos - x1·sin` and `x0·sin + x1·cos` with the first product fused, as the CPU
    // backend (and ggml built by GCC, which contracts them) computes them.
    let t1 = k.mul(k.reg(), x1, sin);
    k.neg(t1, t1);
    let y0 = k.fma(k.reg(), x0, cos, t1);
    let t3 = k.mul(k.reg(), x1, cos);
    let y1 = k.fma(k.reg(), x0, sin, t3);
    k.st(Store::GLOBAL, pa, y0);
    k.st(Store::GLOBAL, pb, y1);
}

/// `(sin θ, cos θ)` of an f32 angle of any size: reduced to [-π, π] in f64, then the
/// hardware approximations.
pub(crate) fn sincos(
    k: &Kernel,
    theta: smelt_ptx::Reg<F32>,
) -> (smelt_ptx::Reg<F32>, smelt_ptx::Reg<F32>) {
    let td = k.cvt(k.reg::<F64>(), theta, smelt_ptx::Exact);
    let turns = k.mul(k.reg(), td, 1.0 / std::f64::consts::TAU);
    let n = k.cvt(k.reg::<F64>(), turns, IntRound::Rni);
    let r = k.fma(k.reg(), n, -std::f64::consts::TAU, td);
    let rf = k.cvt(k.reg::<F32>(), r, FloatRound::Rn);
    let (s, c) = (k.reg::<F32>(), k.reg::<F32>());
    k.raw(format!("sin.approx.f32 {s}, {rf}"));
    k.raw(format!("cos.approx.f32 {c}, {rf}"));
    (s, c)
}

/// CPU twin of the rope kernels (the CPU backend's `rope`, one row per position; the
/// rotation's first products fused as there).
#[allow(clippy::too_many_arguments)]
pub fn rope_cpu(
    x: &mut [f32],
    positions: &[u32],
    cols: usize,
    head_dim: usize,
    n_rot: usize,
    style: RopeStyle,
    freq_base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
) {
    let n_rot = n_rot.min(head_dim);
    let ts = theta_scale(freq_base, n_rot);
    let mut cs = vec![(0f32, 0f32); n_rot / 2];
    for (row, &pos) in x.chunks_mut(cols).zip(positions) {
        let mut theta_base = pos as f32;
        for (i, c) in cs.iter_mut().enumerate() {
            let extrap = match freq_factors {
                Some(ff) => theta_base / ff.get(i).copied().unwrap_or(1.0),
                None => theta_base,
            };
            let theta = freq_scale * extrap;
            *c = (theta.cos(), theta.sin());
            theta_base *= ts;
        }
        for head in row.chunks_mut(head_dim) {
            for (i, &(cos, sin)) in cs.iter().enumerate() {
                let (a, b) = match style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + n_rot / 2),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0.mul_add(cos, -(x1 * sin));
                head[b] = x0.mul_add(sin, x1 * cos);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_reduce_the_angle_in_f64_and_read_positions_from_memory() {
        let mut m = Module::new(Target::Sm90);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        assert!(ptx.contains("cvt.rni.f64.f64"));
        assert!(ptx.contains("sin.approx.f32"));
        assert!(ptx.contains(".param .u64 pos"));
        assert!(!ptx.contains(".param .u32 pos"));
    }

    #[test]
    fn fused_twin_ropes_q_and_k_and_stores_k_and_v_at_the_slot() {
        use crate::ops::kv::SeqDesc;
        let h = |x: f32| smelt_quant::fp::f32_to_f16(x).to_bits();
        // One Q head and one K head of 4 dims; position 5 in blocks of 4: block table
        // [_, 2, 0] from offset 1, so position 5 is in block 0 at offset 1: cache row 1.
        let x0: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 1.0).collect();
        let v = [0.5f32, -0.25, 2.0, 3.0];
        let (mut kc, mut vc) = (vec![0u16; 3 * 4 * 4], vec![0u16; 3 * 4 * 4]);
        let seq = SeqDesc {
            row: 0,
            n_tokens: 1,
            start_pos: 5,
            block_table_offset: 1,
        };
        let style = RopeStyle::Normal;
        let (mut q, mut k) = (x0[..4].to_vec(), x0[4..].to_vec());
        rope_kv_rows_cpu(
            &mut q,
            &mut k,
            &v,
            &[5],
            &mut kc,
            &mut vc,
            &[seq],
            &[9, 2, 0],
            (1, 1, 4, 4),
            style,
            (10000.0, 1.0),
            None,
        );
        let mut want = x0;
        rope_cpu(&mut want, &[5], 8, 4, 4, style, 10000.0, 1.0, None);
        assert_eq!([q, k.clone()].concat(), want);
        let slot = 1;
        let k16: Vec<u16> = want[4..].iter().map(|&f| h(f)).collect();
        assert_eq!(&kc[slot * 4..slot * 4 + 4], &k16[..]);
        let v16: Vec<u16> = v.iter().map(|&f| h(f)).collect();
        assert_eq!(&vc[slot * 4..slot * 4 + 4], &v16[..]);
        assert_eq!(kc.iter().filter(|&&b| b != 0).count(), 4);
        // One decode row: one block per Q, K and V head; a prompt's rows: blocks stride.
        assert_eq!(kv_rows_launch(1, 1, 32, 8, 128).grid, (1, 48, 1));
        assert_eq!(kv_rows_launch(3, 5000, 32, 8, 128).grid, (3, 48, 1024));
        // sm_90 PTX waits for the kernel before it; sm_80 PTX has no griddepcontrol.
        for (target, has) in [(Target::Sm80, false), (Target::Sm90, true)] {
            let mut m = Module::new(target);
            m.set_grid_dep(smelt_ptx::GridDep::ALL);
            m.kernel(kv_rows_name(style), |k| rope_kv_rows_kernel(k, style))
                .unwrap();
            assert_eq!(m.to_ptx().contains("griddepcontrol.wait"), has);
        }
    }

    #[test]
    fn twin_rotates_pairs() {
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope_cpu(&mut x, &[1], 4, 4, 4, RopeStyle::Normal, 10000.0, 1.0, None);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let mut y = vec![1.0, 0.0, 0.0, 0.0];
        rope_cpu(&mut y, &[1], 4, 4, 4, RopeStyle::Neox, 10000.0, 1.0, None);
        assert!((y[0] - 1f32.cos()).abs() < 1e-6 && (y[2] - 1f32.sin()).abs() < 1e-6);
        let mut z = vec![1.0, 0.0, 7.0, 9.0];
        rope_cpu(&mut z, &[0], 4, 4, 2, RopeStyle::Neox, 10000.0, 1.0, None);
        assert_eq!(z, vec![1.0, 0.0, 7.0, 9.0]);
        assert_eq!(launch(3, 4096, 128, 128).grid, (3, 32, 1));
        assert_eq!(launch(3, 4096, 128, 128).block, (64, 1, 1));
    }
}
