//! The 32-weight formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): one thread per block, ggml's
//! `quantize_row_*_ref` line by line (smelt-quant's `legacy/`), including x86's
//! truncating conversion of the out-of-range values a block of tiny weights produces.

use smelt_ptx::{Cmp, Kernel, Narrow, Reg, Store, F32, S32, U32};
use smelt_quant::GgmlType;

use super::{cvtt, f16_bits, prologue, round_away, shape, Input};

/// `d ? 1/d : 0` (ggml's inverse scale).
fn inverse(k: &Kernel, d: Reg<F32>) -> Reg<F32> {
    let zero = k.cmp(Cmp::Eq, d, 0.0f32);
    let r = k.div_rn(k.reg(), 1.0f32, d);
    k.selp(r, 0.0f32, r, zero)
}

/// ggml's `max` of q4_0/q5_0: the first element of largest magnitude, with its sign.
fn signed_max(k: &Kernel, x: &[Reg<F32>]) -> Reg<F32> {
    let max = k.f32(0.0);
    let amax = k.f32(0.0);
    for &v in x {
        let a = k.abs(k.reg(), v);
        let p = k.cmp(Cmp::Lt, amax, a);
        k.selp(amax, a, amax, p);
        k.selp(max, v, max, p);
    }
    max
}

/// ggml's `if (v < min) min = v; if (v > max) max = v;` from `FLT_MAX` / `-FLT_MAX`.
fn min_max(k: &Kernel, x: &[Reg<F32>]) -> (Reg<F32>, Reg<F32>) {
    let min = k.f32(f32::MAX);
    let max = k.f32(-f32::MAX);
    for &v in x {
        let lt = k.cmp(Cmp::Lt, v, min);
        k.selp(min, v, min, lt);
        let gt = k.cmp(Cmp::Gt, v, max);
        k.selp(max, v, max, gt);
    }
    (min, max)
}

/// `(int8_t)v` as x86 computes it, sign-extended back to 32 bits.
fn trunc_i8(k: &Kernel, v: Reg<F32>) -> Reg<S32> {
    let t = cvtt(k, v);
    k.sext_i8(k.reg(), t.cast::<U32>())
}

/// Quants `q` (bytes in the low 8 bits) packed as ggml's 4-bit layout (weight `j` low
/// nibble, `j + 16` high nibble of byte `j`), plus the fifth bits as a u32.
fn pack(k: &Kernel, q: &[Reg<U32>]) -> (Vec<Reg<U32>>, Reg<U32>) {
    let qs: Vec<Reg<U32>> = (0..16)
        .map(|j| {
            let lo = k.and(k.reg(), q[j], 0x0Fu32);
            let hi = k.shl(k.reg(), q[j + 16], 4u32);
            k.and(hi, hi, 0xF0u32);
            k.or(lo, lo, hi)
        })
        .collect();
    let qh = k.u32(0);
    for (j, &v) in q.iter().enumerate() {
        let b = k.bfe(k.reg(), v, 4u32, 1u32);
        k.shl(b, b, j as u32);
        k.or(qh, qh, b);
    }
    (qs, qh)
}

/// Splits a word into its four bytes (each in the low 8 bits of a register).
fn bytes_of(k: &Kernel, w: Reg<U32>) -> [Reg<U32>; 4] {
    std::array::from_fn(|i| k.bfe(k.reg(), w, 8 * i as u32, 8u32))
}

/// Emits the kernel for a legacy format.
pub(crate) fn kernel(k: &Kernel, ty: GgmlType, input: Input) {
    let s = match shape(ty) {
        Ok(s) => s,
        Err(e) => return k.reject(e.to_string()),
    };
    let t = prologue(k, input, s);
    let x = &t.x;
    // The block's bytes, one per register (low 8 bits).
    let mut bytes: Vec<Reg<U32>> = Vec::with_capacity(s.bytes as usize);
    let push_u16 = |bytes: &mut Vec<Reg<U32>>, h: Reg<U32>| {
        bytes.push(k.and(k.reg(), h, 0xFFu32));
        bytes.push(k.shr(k.reg(), h, 8u32));
    };
    match ty {
        GgmlType::Q8_0 => {
            let amax = k.f32(0.0);
            for &v in x {
                let a = k.abs(k.reg(), v);
                k.max(amax, amax, a);
            }
            let d = k.div_rn(k.reg(), amax, 127.0f32);
            let id = inverse(k, d);
            push_u16(&mut bytes, f16_bits(k, d));
            for &v in x {
                let q = round_away(k, k.mul(k.reg(), v, id));
                bytes.push(q.cast::<U32>());
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let five = ty == GgmlType::Q5_0;
            let (div, off, cap) = if five {
                (-16.0f32, 16.5f32, 31)
            } else {
                (-8.0, 8.5, 15)
            };
            let max = signed_max(k, x);
            let d = k.div_rn(k.reg(), max, div);
            let id = inverse(k, d);
            push_u16(&mut bytes, f16_bits(k, d));
            let q: Vec<Reg<U32>> = x
                .iter()
                .map(|&v| {
                    let t = k.mul(k.reg(), v, id);
                    k.add(t, t, off);
                    let q = trunc_i8(k, t);
                    k.min(q, q, cap);
                    q.cast::<U32>()
                })
                .collect();
            let (qs, qh) = pack(k, &q);
            if five {
                bytes.extend(bytes_of(k, qh));
            }
            bytes.extend(qs);
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let five = ty == GgmlType::Q5_1;
            let (min, max) = min_max(k, x);
            let range = k.sub(k.reg(), max, min);
            let d = k.div_rn(k.reg(), range, if five { 31.0f32 } else { 15.0 });
            let id = inverse(k, d);
            push_u16(&mut bytes, f16_bits(k, d));
            push_u16(&mut bytes, f16_bits(k, min));
            let q: Vec<Reg<U32>> = x
                .iter()
                .map(|&v| {
                    let t = k.sub(k.reg(), v, min);
                    k.mul(t, t, id);
                    k.add(t, t, 0.5f32);
                    let q = trunc_i8(k, t);
                    if !five {
                        k.min(q, q, 15i32);
                    }
                    q.cast::<U32>()
                })
                .collect();
            let (qs, qh) = pack(k, &q);
            if five {
                bytes.extend(bytes_of(k, qh));
            }
            bytes.extend(qs);
        }
        _ => return k.reject(format!("{ty} is not a legacy format")),
    }
    if bytes.len() != s.bytes as usize {
        return k.reject(format!("{ty}: {} bytes packed", bytes.len()));
    }
    k.guarded(t.valid, |k| {
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let h = k.prmt(k.reg::<U32>(), pair[0], pair[1], 0x0040u32);
            k.st_narrow(Store::GLOBAL, Narrow::U16, t.dst.at(2 * i as i64), h);
        }
    });
}
