//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): one thread per group of a 256-weight
//! super-block, ggml's `quantize_row_q*_K_ref` (smelt-quant's `kquants/`) step by step.
//!
//! Each thread runs its group's scale search, the super-block's threads agree on the
//! largest group scale through butterfly shuffles (carrying the group index where ggml's
//! first-wins scan makes ties matter), each re-rounds its own weights against the stored
//! f16 scales, and the levels go through shared memory so that each thread can pack a
//! contiguous slice of the block's interleaved bytes.

use smelt_ptx::{Cmp, Kernel, Load, Narrow, Pred, Reg, Shfl, Store, F32, FULL_WARP, S32, U32};

use super::search::{make_q3_quants, make_qkx2_quants, make_qx_quants, Qkx2, GROUP_MAX_EPS};
use super::{
    clamp, f16_bits, nearest_int, pack_bytes, pack_halves, prologue, shape, store_u32_as_u16,
    through_f16, to_f32, warp_sync, Input, Thread, BLOCK_THREADS,
};
use smelt_quant::GgmlType;

/// The largest positive value over the super-block's `threads` lanes, `+0.0` when none is
/// positive: ggml's `if (s > max) max = s` scan from zero (order does not matter).
fn max_positive(k: &Kernel, v: Reg<F32>, threads: u32) -> Reg<F32> {
    let pos = k.cmp(Cmp::Gt, v, 0.0f32);
    let c = k.selp(k.reg(), v, 0.0f32, pos);
    let mut off = threads / 2;
    while off > 0 {
        let o = k.shfl_sync(Shfl::Bfly, k.reg::<F32>(), c, off, FULL_WARP);
        let p = k.cmp(Cmp::Gt, o, c);
        k.selp(c, o, c, p);
        off /= 2;
    }
    c
}

/// ggml's `if (fabsf(s) > amax) { amax = fabsf(s); max = s; }` over the super-block's
/// groups in order: the signed scale of largest magnitude, the first group winning ties
/// (the reduction carries group indices to decide them as the scan does).
fn first_abs_max(k: &Kernel, v: Reg<F32>, sub: Reg<U32>, threads: u32) -> Reg<F32> {
    let a = k.abs(k.reg(), v);
    let ok = k.cmp(Cmp::Gt, a, 0.0f32);
    k.selp(a, a, 0.0f32, ok);
    let s = k.selp(k.reg(), v, 0.0f32, ok);
    let i = k.selp(k.reg(), sub, threads, ok);
    let mut off = threads / 2;
    while off > 0 {
        let oa = k.shfl_sync(Shfl::Bfly, k.reg::<F32>(), a, off, FULL_WARP);
        let os = k.shfl_sync(Shfl::Bfly, k.reg::<F32>(), s, off, FULL_WARP);
        let oi = k.shfl_sync(Shfl::Bfly, k.reg::<U32>(), i, off, FULL_WARP);
        let gt = k.cmp(Cmp::Gt, oa, a);
        let eq = k.cmp(Cmp::Eq, oa, a);
        let first = k.cmp(Cmp::Lt, oi, i);
        k.and(eq, eq, first);
        k.or(gt, gt, eq);
        k.selp(a, oa, a, gt);
        k.selp(s, os, s, gt);
        k.selp(i, oi, i, gt);
        off /= 2;
    }
    s
}

/// `v` of lane `base + j` (every lane must call it).
fn from_lane(k: &Kernel, v: Reg<U32>, base: Reg<U32>, j: u32) -> Reg<U32> {
    let src = k.add(k.reg(), base, j);
    k.shfl_sync(Shfl::Idx, k.reg::<U32>(), v, src, FULL_WARP)
}

/// Where a thread's levels and its super-block's levels sit in shared memory.
struct Stage {
    /// This super-block's 256 levels (one byte each, weight order).
    sb: Reg<U32>,
    /// First lane of the super-block in the warp.
    lane0: Reg<U32>,
}

/// Stages a thread's levels (0..=255, weight order) in shared memory and waits for the
/// warp, so any thread can read its super-block's levels.
fn stage(k: &Kernel, t: &Thread, levels: &[Reg<S32>], threads: u32) -> Stage {
    let g = levels.len() as u32;
    let lv = k.shared::<U32>("levels", BLOCK_THREADS * g / 4, 16);
    let base = k.shared_base(&lv);
    let mine = k.mad(k.reg(), t.tid, g, base);
    let words: Vec<Reg<U32>> = levels
        .chunks_exact(4)
        .map(|c| pack_bytes(k, [c[0], c[1], c[2], c[3]].map(|r| r.cast::<U32>())))
        .collect();
    for (c, w) in words.chunks_exact(4).enumerate() {
        k.st_v4(
            Store::SHARED,
            mine.at(16 * c as i64),
            [w[0], w[1], w[2], w[3]],
        );
    }
    warp_sync(k);
    let first = k.and(k.reg(), t.tid, !(threads - 1));
    let sb = k.mad(k.reg(), first, g, base);
    let lane = k.lane();
    let lane0 = k.and(k.reg(), lane, !(threads - 1));
    Stage { sb, lane0 }
}

/// A word of four levels from the stage at `sb + off` (a register offset) `+ imm`.
fn level_word(k: &Kernel, addr: Reg<U32>, imm: i64) -> Reg<U32> {
    k.ld(Load::SHARED, k.reg::<U32>(), addr.at(imm))
}

/// `(h, i)` of thread `sub` for the layouts that split a super-block into two halves of
/// 128 with four 32-weight rows each: `h = sub / 8`, `i = 4 * (sub % 8)` (Q2/Q3/Q6_K).
fn half_and_col(k: &Kernel, sub: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
    let h = k.shr(k.reg(), sub, 3u32);
    let i = k.and(k.reg(), sub, 7u32);
    k.shl(i, i, 2u32);
    (h, i)
}

/// `d * l` for a signed level, as f32 (`f16_to_f32(d) * sc as f32`).
fn times(k: &Kernel, d: Reg<F32>, l: Reg<S32>) -> Reg<F32> {
    k.mul(k.reg(), d, to_f32(k, l))
}

/// Q6_K: `make_qx_quants(16, 32)` per group, 8-bit signed group scales against
/// `d = 1 / (-128 / max_scale)`.
pub(crate) fn q6_k(k: &Kernel, input: Input) {
    let Ok(s) = shape(GgmlType::Q6_K) else {
        return k.reject("Q6_K shape");
    };
    let t = prologue(k, input, s);
    let (scale, l) = make_qx_quants(k, 32, &t.x);
    let max_scale = first_abs_max(k, scale, t.sub, s.threads);
    let amax = k.abs(k.reg(), max_scale);
    let zero_all = k.cmp(Cmp::Lt, amax, GROUP_MAX_EPS);
    let iscale = k.div_rn(k.reg(), -128.0f32, max_scale);
    let d_val = k.div_rn(k.reg(), 1.0f32, iscale);
    let d_bits = f16_bits(k, d_val);
    let d = through_f16(k, d_val);
    let q = k.mul(k.reg(), iscale, scale);
    let sc = nearest_int(k, q);
    k.min(sc, sc, 127i32);
    let sc = k.sext_i8(k.reg(), sc.cast::<U32>());
    let dj = times(k, d, sc);
    let skip = k.cmp(Cmp::Eq, dj, 0.0f32);
    for (i, &li) in l.iter().enumerate() {
        let q = k.div_rn(k.reg(), t.x[i], dj);
        let n = clamp(k, nearest_int(k, q), -32, 31);
        k.add(n, n, 32i32);
        k.selp(li, li, n, skip);
        k.selp(li, 0i32, li, zero_all);
    }
    k.selp(sc, 0i32, sc, zero_all);
    k.selp(d_bits, 0u32, d_bits, zero_all);

    let st = stage(k, &t, &l, s.threads);
    let (h, i) = half_and_col(k, t.sub);
    // ql: bytes 8*sub .. +8 hold levels j (low nibble) and j + 64 (high) of half h, j
    // from 2*i: ql[64h + j] = l[128h + j] | l[128h + 64 + j] << 4.
    let j0 = k.shl(k.reg(), i, 1u32);
    let at = k.mad(k.reg(), h, 128u32, st.sb);
    k.add(at, at, j0);
    let ql: Vec<Reg<U32>> = (0..2)
        .map(|w| {
            let lo = level_word(k, at, 4 * w);
            let hi = level_word(k, at, 64 + 4 * w);
            k.and(lo, lo, 0x0F0F_0F0Fu32);
            k.and(hi, hi, 0x0F0F_0F0Fu32);
            k.shl(hi, hi, 4u32);
            k.or(lo, lo, hi)
        })
        .collect();
    // qh: bytes 4*sub .. +4: qh[32h + i] = sum_k (l[128h + 32k + i] >> 4) << 2k.
    let at = k.mad(k.reg(), h, 128u32, st.sb);
    k.add(at, at, i);
    let qh = k.u32(0);
    for kk in 0..4 {
        let w = level_word(k, at, 32 * kk);
        k.shr(w, w, 4u32);
        k.and(w, w, 0x0303_0303u32);
        k.shl(w, w, 2 * kk as u32);
        k.or(qh, qh, w);
    }
    let first = k.cmp(Cmp::Eq, t.sub, 0u32);
    k.guarded(t.valid, |k| {
        let ql_at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 8u32),
        );
        store_u32_as_u16(k, ql_at.at(0), ql[0]);
        store_u32_as_u16(k, ql_at.at(4), ql[1]);
        let qh_at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 4u32),
        );
        store_u32_as_u16(k, qh_at.at(128), qh);
        let sc_at = k.add(
            k.reg(),
            t.dst,
            k.cvt(k.reg::<smelt_ptx::U64>(), t.sub, smelt_ptx::Exact),
        );
        k.st_narrow(Store::GLOBAL, Narrow::U8, sc_at.at(192), sc);
    });
    let write_d = k.and(k.reg::<Pred>(), first, t.valid);
    k.guarded(write_d, |k| {
        k.st_narrow(Store::GLOBAL, Narrow::U16, t.dst.at(208), d_bits);
    });
}

/// Q3_K: `make_q3_quants(16, 4)` per group, 6-bit signed group scales against
/// `d = 1 / (-32 / max_scale)`.
pub(crate) fn q3_k(k: &Kernel, input: Input) {
    let Ok(s) = shape(GgmlType::Q3_K) else {
        return k.reject("Q3_K shape");
    };
    let t = prologue(k, input, s);
    let (scale, l) = make_q3_quants(k, 4, &t.x);
    let max_scale = first_abs_max(k, scale, t.sub, s.threads);
    let zero = k.cmp(Cmp::Eq, max_scale, 0.0f32);
    let iscale = k.div_rn(k.reg(), -32.0f32, max_scale);
    let q = k.mul(k.reg(), iscale, scale);
    let n = nearest_int(k, q);
    let n = k.sext_i8(k.reg(), n.cast::<U32>());
    let ls = clamp(k, n, -32, 31);
    k.add(ls, ls, 32i32);
    k.selp(ls, 0i32, ls, zero);
    let d_val = k.div_rn(k.reg(), 1.0f32, iscale);
    let d_bits = f16_bits(k, d_val);
    k.selp(d_bits, 0u32, d_bits, zero);
    let d = through_f16(k, d_val);
    k.selp(d, 0.0f32, d, zero);
    let sc = k.sub(k.reg(), ls, 32i32);
    let dj = times(k, d, sc);
    let skip = k.cmp(Cmp::Eq, dj, 0.0f32);
    for (i, &li) in l.iter().enumerate() {
        let q = k.div_rn(k.reg(), t.x[i], dj);
        let n = clamp(k, nearest_int(k, q), -4, 3);
        k.add(n, n, 4i32);
        k.selp(li, li, n, skip);
    }

    let st = stage(k, &t, &l, s.threads);
    // hmask: bytes 2*sub, 2*sub + 1: bit b of hmask[i] is bit 2 of l[32b + i].
    let at = k.mad(k.reg(), t.sub, 2u32, st.sb);
    let hm = k.u32(0);
    for b in 0..8 {
        let w = k.ld_narrow(Load::SHARED, Narrow::U16, k.reg::<U32>(), at.at(32 * b));
        k.shr(w, w, 2u32);
        k.and(w, w, 0x0101u32);
        k.shl(w, w, b as u32);
        k.or(hm, hm, w);
    }
    // qs: bytes 4*sub .. +4: qs[32h + i] = sum_k (l[128h + 32k + i] & 3) << 2k.
    let (h, i) = half_and_col(k, t.sub);
    let at = k.mad(k.reg(), h, 128u32, st.sb);
    k.add(at, at, i);
    let qs = k.u32(0);
    for kk in 0..4 {
        let w = level_word(k, at, 32 * kk);
        k.and(w, w, 0x0303_0303u32);
        k.shl(w, w, 2 * kk as u32);
        k.or(qs, qs, w);
    }
    // The 12 scale bytes, packed by the first thread from every group's 6-bit scale.
    let all: Vec<Reg<U32>> = (0..16)
        .map(|j| from_lane(k, ls.cast::<U32>(), st.lane0, j))
        .collect();
    let scales: Vec<Reg<U32>> = (0..12)
        .map(|b| {
            if b < 8 {
                let lo = k.and(k.reg(), all[b], 0x0Fu32);
                let hi = k.and(k.reg(), all[b + 8], 0x0Fu32);
                k.shl(hi, hi, 4u32);
                k.or(lo, lo, hi)
            } else {
                let m = b - 8;
                let v = k.u32(0);
                for q in 0..4 {
                    let top = k.shr(k.reg(), all[m + 4 * q], 4u32);
                    k.shl(top, top, 2 * q as u32);
                    k.or(v, v, top);
                }
                v
            }
        })
        .collect();
    let first = k.cmp(Cmp::Eq, t.sub, 0u32);
    k.guarded(t.valid, |k| {
        let hm_at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 2u32),
        );
        k.st_narrow(Store::GLOBAL, Narrow::U16, hm_at.at(0), hm);
        let qs_at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 4u32),
        );
        store_u32_as_u16(k, qs_at.at(32), qs);
    });
    let write = k.and(k.reg::<Pred>(), first, t.valid);
    k.guarded(write, |k| {
        for (p, pair) in scales.chunks_exact(2).enumerate() {
            let h = k.prmt(k.reg::<U32>(), pair[0], pair[1], 0x0040u32);
            k.st_narrow(Store::GLOBAL, Narrow::U16, t.dst.at(96 + 2 * p as i64), h);
        }
        k.st_narrow(Store::GLOBAL, Narrow::U16, t.dst.at(108), d_bits);
    });
}

/// The part of Q2_K, Q4_K and Q5_K after the group fits: group scale and min quantized
/// against the super-block's largest ones. Returns the re-rounded levels' inputs.
struct Fitted {
    scale: Reg<F32>,
    min: Reg<F32>,
    levels: Vec<Reg<S32>>,
}

/// Q2_K: `make_qkx2_quants(16, 3, |x|, -0.5, 0.1, 15, use_mad)` per group, 4-bit scales
/// and mins sharing a byte.
pub(crate) fn q2_k(k: &Kernel, input: Input) {
    let Ok(s) = shape(GgmlType::Q2_K) else {
        return k.reject("Q2_K shape");
    };
    let t = prologue(k, input, s);
    let w: Vec<Reg<F32>> = t.x.iter().map(|&v| k.abs(k.reg(), v)).collect();
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let (scale, min, levels) = make_qkx2_quants(k, p, &t.x, &w);
    let f = Fitted { scale, min, levels };
    let max_scale = max_positive(k, f.scale, s.threads);
    let max_min = max_positive(k, f.min, s.threads);
    let sp = k.cmp(Cmp::Gt, max_scale, 0.0f32);
    let mp = k.cmp(Cmp::Gt, max_min, 0.0f32);
    // ggml stores nearest_int straight into the byte (wrapping), then ORs the min << 4.
    let iscale = k.div_rn(k.reg(), 15.0f32, max_scale);
    let n = nearest_int(k, k.mul(k.reg(), iscale, f.scale));
    let byte = k.and(k.reg(), n.cast::<U32>(), 0xFFu32);
    k.selp(byte, byte, 0u32, sp);
    let iscale_m = k.div_rn(k.reg(), 15.0f32, max_min);
    let m = nearest_int(k, k.mul(k.reg(), iscale_m, f.min));
    let m = k.shl(k.reg(), m.cast::<U32>(), 4u32);
    k.and(m, m, 0xF0u32);
    k.selp(m, m, 0u32, mp);
    k.or(byte, byte, m);
    let d_val = k.div_rn(k.reg(), max_scale, 15.0f32);
    let d_bits = f16_bits(k, d_val);
    k.selp(d_bits, d_bits, 0u32, sp);
    let d = through_f16(k, d_val);
    k.selp(d, d, 0.0f32, sp);
    let dmin_val = k.div_rn(k.reg(), max_min, 15.0f32);
    let dmin_bits = f16_bits(k, dmin_val);
    k.selp(dmin_bits, dmin_bits, 0u32, mp);
    let dmin = through_f16(k, dmin_val);
    k.selp(dmin, dmin, 0.0f32, mp);
    let lo = k.and(k.reg(), byte, 0x0Fu32);
    let hi = k.shr(k.reg(), byte, 4u32);
    let dj = times(k, d, lo.cast::<S32>());
    let dm = times(k, dmin, hi.cast::<S32>());
    let skip = k.cmp(Cmp::Eq, dj, 0.0f32);
    for (i, &li) in f.levels.iter().enumerate() {
        let v = k.add(k.reg(), t.x[i], dm);
        let q = k.div_rn(k.reg(), v, dj);
        let n = clamp(k, nearest_int(k, q), 0, 3);
        k.selp(li, li, n, skip);
    }

    let st = stage(k, &t, &f.levels, s.threads);
    let (h, i) = half_and_col(k, t.sub);
    let at = k.mad(k.reg(), h, 128u32, st.sb);
    k.add(at, at, i);
    let qs = k.u32(0);
    for kk in 0..4 {
        let w = level_word(k, at, 32 * kk);
        k.shl(w, w, 2 * kk as u32);
        k.or(qs, qs, w);
    }
    let first = k.cmp(Cmp::Eq, t.sub, 0u32);
    k.guarded(t.valid, |k| {
        let qs_at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 4u32),
        );
        k.st(Store::GLOBAL, qs_at.at(16), qs);
        let sc_at = k.add(
            k.reg(),
            t.dst,
            k.cvt(k.reg::<smelt_ptx::U64>(), t.sub, smelt_ptx::Exact),
        );
        k.st_narrow(Store::GLOBAL, Narrow::U8, sc_at.at(0), byte);
    });
    let write = k.and(k.reg::<Pred>(), first, t.valid);
    k.guarded(write, |k| {
        let dd = pack_halves(k, d_bits, dmin_bits);
        k.st(Store::GLOBAL, t.dst.at(80), dd);
    });
}

/// Q4_K and Q5_K: weights `sqrt(mean(x^2)) + |x|`, `make_qkx2_quants(32, nmax, ...)` per
/// group, 6-bit scales and mins. Returns the levels (re-rounded), the packed 12 scale
/// bytes as three words and the f16 `d | dmin << 16` word, all valid in every thread.
fn q45_k(
    k: &Kernel,
    t: &Thread,
    nmax: i32,
    rmin: f32,
    nstep: u32,
) -> (Vec<Reg<S32>>, [Reg<U32>; 4]) {
    let threads = 8;
    let sum_x2 = k.f32(0.0);
    for &v in &t.x {
        let sq = k.mul(k.reg(), v, v);
        k.add(sum_x2, sum_x2, sq);
    }
    let mean = k.div_rn(k.reg(), sum_x2, 32.0f32);
    let av_x = k.sqrt_rn(k.reg(), mean);
    let w: Vec<Reg<F32>> =
        t.x.iter()
            .map(|&v| {
                let a = k.abs(k.reg(), v);
                k.add(a, av_x, a)
            })
            .collect();
    let p = Qkx2 {
        nmax,
        rmin,
        rdelta: 0.1,
        nstep,
        use_mad: false,
    };
    let (scale, min, levels) = make_qkx2_quants(k, p, &t.x, &w);
    let max_scale = max_positive(k, scale, threads);
    let max_min = max_positive(k, min, threads);
    let inv = |max: Reg<F32>| {
        let pos = k.cmp(Cmp::Gt, max, 0.0f32);
        let r = k.div_rn(k.reg(), 63.0f32, max);
        k.selp(r, r, 0.0f32, pos)
    };
    // ggml stores nearest_int into a uint8_t before clamping to 63.
    let six = |inv: Reg<F32>, v: Reg<F32>| {
        let n = nearest_int(k, k.mul(k.reg(), inv, v));
        let b = k.and(k.reg(), n.cast::<U32>(), 0xFFu32);
        k.min(b, b, 63u32)
    };
    let ls = six(inv(max_scale), scale);
    let lm = six(inv(max_min), min);
    let d_val = k.div_rn(k.reg(), max_scale, 63.0f32);
    let dmin_val = k.div_rn(k.reg(), max_min, 63.0f32);
    let d_bits = f16_bits(k, d_val);
    let dmin_bits = f16_bits(k, dmin_val);
    let dj = times(k, through_f16(k, d_val), ls.cast::<S32>());
    let dm = times(k, through_f16(k, dmin_val), lm.cast::<S32>());
    let skip = k.cmp(Cmp::Eq, dj, 0.0f32);
    for (i, &li) in levels.iter().enumerate() {
        let v = k.add(k.reg(), t.x[i], dm);
        let q = k.div_rn(k.reg(), v, dj);
        let n = clamp(k, nearest_int(k, q), 0, nmax);
        k.selp(li, li, n, skip);
    }
    // pack_scale_min_k4, from every group's (ls, lm).
    let lane0 = k.and(k.reg(), k.lane(), !(threads - 1));
    let sc: Vec<Reg<U32>> = (0..8).map(|j| from_lane(k, ls, lane0, j)).collect();
    let mn: Vec<Reg<U32>> = (0..8).map(|j| from_lane(k, lm, lane0, j)).collect();
    let top = |v: Reg<U32>| {
        let t = k.shr(k.reg(), v, 4u32);
        k.shl(t, t, 6u32)
    };
    let s: Vec<Reg<U32>> = (0..12)
        .map(|b| match b {
            0..=3 => k.or(k.reg(), sc[b], top(sc[b + 4])),
            4..=7 => k.or(k.reg(), mn[b - 4], top(mn[b])),
            _ => {
                let lo = k.and(k.reg(), sc[b - 4], 0x0Fu32);
                let hi = k.and(k.reg(), mn[b - 4], 0x0Fu32);
                k.shl(hi, hi, 4u32);
                k.or(lo, lo, hi)
            }
        })
        .collect();
    let header = [
        pack_halves(k, d_bits, dmin_bits),
        pack_bytes(k, [s[0], s[1], s[2], s[3]]),
        pack_bytes(k, [s[4], s[5], s[6], s[7]]),
        pack_bytes(k, [s[8], s[9], s[10], s[11]]),
    ];
    (levels, header)
}

/// Loads the 16 low- and high-half levels of Q4_K/Q5_K's quant bytes `16*sub ..`: byte
/// `32c + i` pairs weights `64c + i` and `64c + 32 + i`, with `c = sub / 2`.
fn q45_pairs(k: &Kernel, st: &Stage, sub: Reg<U32>) -> ([Reg<U32>; 4], [Reg<U32>; 4]) {
    let c = k.shr(k.reg(), sub, 1u32);
    let i0 = k.and(k.reg(), sub, 1u32);
    k.shl(i0, i0, 4u32);
    let at = k.mad(k.reg(), c, 64u32, st.sb);
    k.add(at, at, i0);
    let lo = k.regs::<U32, 4>();
    let hi = k.regs::<U32, 4>();
    k.ld_v4(Load::SHARED, lo, at.at(0));
    k.ld_v4(Load::SHARED, hi, at.at(32));
    (lo, hi)
}

/// Q4_K: `make_qkx2_quants(32, 15, w, -1, 0.1, 20)` per group.
pub(crate) fn q4_k(k: &Kernel, input: Input) {
    let Ok(s) = shape(GgmlType::Q4_K) else {
        return k.reject("Q4_K shape");
    };
    let t = prologue(k, input, s);
    let (levels, header) = q45_k(k, &t, 15, -1.0, 20);
    let st = stage(k, &t, &levels, s.threads);
    let (lo, hi) = q45_pairs(k, &st, t.sub);
    let qs: [Reg<U32>; 4] = std::array::from_fn(|j| {
        let h = k.shl(k.reg(), hi[j], 4u32);
        k.or(h, lo[j], h)
    });
    let first = k.cmp(Cmp::Eq, t.sub, 0u32);
    k.guarded(t.valid, |k| {
        let at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 16u32),
        );
        k.st_v4(Store::GLOBAL, at.at(16), qs);
    });
    let write = k.and(k.reg::<Pred>(), first, t.valid);
    k.guarded(write, |k| k.st_v4(Store::GLOBAL, t.dst.at(0), header));
}

/// Q5_K: `make_qkx2_quants(32, 31, w, -0.5, 0.1, 15)` per group; the fifth bits in `qh`.
pub(crate) fn q5_k(k: &Kernel, input: Input) {
    let Ok(s) = shape(GgmlType::Q5_K) else {
        return k.reject("Q5_K shape");
    };
    let t = prologue(k, input, s);
    let (levels, header) = q45_k(k, &t, 31, -0.5, 15);
    let st = stage(k, &t, &levels, s.threads);
    let (lo, hi) = q45_pairs(k, &st, t.sub);
    let qs: [Reg<U32>; 4] = std::array::from_fn(|j| {
        let l = k.and(k.reg(), lo[j], 0x0F0F_0F0Fu32);
        let h = k.and(k.reg(), hi[j], 0x0F0F_0F0Fu32);
        k.shl(h, h, 4u32);
        k.or(l, l, h)
    });
    // qh bytes 4*sub .. +4: bit 2c of qh[i] is bit 4 of l[64c + i], bit 2c + 1 that of
    // l[64c + 32 + i].
    let at = k.mad(k.reg(), t.sub, 4u32, st.sb);
    let qh = k.u32(0);
    for c in 0..4 {
        for half in 0..2 {
            let w = level_word(k, at, 64 * c + 32 * half);
            k.shr(w, w, 4u32);
            k.and(w, w, 0x0101_0101u32);
            k.shl(w, w, (2 * c + half) as u32);
            k.or(qh, qh, w);
        }
    }
    let first = k.cmp(Cmp::Eq, t.sub, 0u32);
    k.guarded(t.valid, |k| {
        let at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 16u32),
        );
        k.st_v4(Store::GLOBAL, at.at(48), qs);
        let at = k.add(
            k.reg(),
            t.dst,
            k.mul_wide(k.reg::<smelt_ptx::U64>(), t.sub, 4u32),
        );
        k.st(Store::GLOBAL, at.at(16), qh);
    });
    let write = k.and(k.reg::<Pred>(), first, t.valid);
    k.guarded(write, |k| k.st_v4(Store::GLOBAL, t.dst.at(0), header));
}
