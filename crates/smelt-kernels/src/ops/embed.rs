//! Embedding lookup and dequantization of whole rows, for tables and matrices in ggml's
//! own byte layout (no repack): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K
//! and Q6_K.
//!
//! One thread per output value: it reads its block's scales and its own quant bits and
//! computes the value with the same float operations, in the same order, as
//! `smelt_quant::dequantize_row` (`mul.rn` / `add.rn` / `sub.rn`, never contracted), so the
//! result is bit-identical to the CPU's. Threads of a warp share a block's header, which
//! the L1 cache serves once.

use smelt_ptx::{Exact, FloatRound, Kernel, Load, Narrow, Reg, Store, F16, F32, S32, U32, U64};
use smelt_quant::fp::f32_to_f16;

use super::{dim, kernel_params, Launch};
use crate::catalog::Entry;
use crate::{GgmlType, KernelError};

/// Table and matrix types these kernels read.
pub const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The float type a dequantize kernel writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// f32.
    F32,
    /// f16, the f32 value rounded to nearest even.
    F16,
}

fn check(ty: GgmlType) -> Result<(), KernelError> {
    if TYPES.contains(&ty) {
        Ok(())
    } else {
        Err(KernelError::Quant(smelt_quant::QuantError::Unsupported {
            ty,
            op: "GPU embedding / dequantize",
        }))
    }
}

/// Name of the embedding kernel for tables of `ty`.
pub fn embed_name(ty: GgmlType) -> Result<String, KernelError> {
    check(ty)?;
    Ok(format!("embed_{}", ty.name().to_lowercase()))
}

/// Name of the dequantize kernel for `ty` writing `out`.
pub fn dequantize_name(ty: GgmlType, out: OutType) -> Result<String, KernelError> {
    check(ty)?;
    let o = match out {
        OutType::F32 => "f32",
        OutType::F16 => "f16",
    };
    Ok(format!("dequantize_{}_{o}", ty.name().to_lowercase()))
}

#[derive(Clone, Copy)]
enum Mode {
    Embed,
    Rows(OutType),
}

/// Every kernel of this module: per type, the embedding and both dequantizations.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for ty in TYPES {
        for (name, mode) in [
            (embed_name(ty), Mode::Embed),
            (dequantize_name(ty, OutType::F32), Mode::Rows(OutType::F32)),
            (dequantize_name(ty, OutType::F16), Mode::Rows(OutType::F16)),
        ] {
            if let Ok(name) = name {
                v.push((name, Box::new(move |k: &Kernel| kernel(k, ty, mode))));
            }
        }
    }
    v
}

/// Threads per block.
pub const THREADS: u32 = 256;

/// Launch of either kernel over `rows` output rows (tokens, or matrix rows) of `cols`.
pub fn launch(rows: usize, cols: usize) -> Launch {
    Launch::new(
        (dim(rows), dim(cols.div_ceil(THREADS as usize)), 1),
        (THREADS, 1, 1),
    )
}

/// Bytes of a row of `cols` values of `ty` in ggml's layout.
pub fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize, KernelError> {
    check(ty)?;
    if cols % ty.block_size() != 0 {
        return Err(KernelError::RaggedRow {
            k: cols,
            multiple: ty.block_size(),
            what: "ggml rows",
        });
    }
    Ok(cols / ty.block_size() * ty.type_size())
}

kernel_params! {
    /// Arguments of an embedding kernel ([`embed_name`]).
    EmbedArgs, EmbedRegs {
        table: Ptr,
        tokens: Ptr,
        out: Ptr,
        cols: U32,
        row_bytes: U32,
        n_vocab: U32,
    }
}

kernel_params! {
    /// Arguments of a dequantize kernel ([`dequantize_name`]).
    DequantizeArgs, DequantizeRegs {
        src: Ptr,
        out: Ptr,
        cols: U32,
        row_bytes: U32,
    }
}

/// The embedding kernel (`Mode::Embed`) or the dequantize kernel (`Mode::Rows`).
///
/// Embedding parameters: `table: *const u8, tokens: *const u32 (one per output row),
/// out: *mut f32, cols: u32, row_bytes: u32, n_vocab: u32`; a token id at or past
/// `n_vocab` yields a row of NaN (the host validates ids; NaN makes a bad one loud).
///
/// Dequantize parameters: `src: *const u8, out: *mut f32 or *mut f16, cols: u32,
/// row_bytes: u32`.
///
/// Launch: [`launch`] (grid x = rows, grid y = column blocks of [`THREADS`]).
fn kernel(k: &Kernel, ty: GgmlType, mode: Mode) {
    k.max_threads(THREADS, 1, 1);
    let (src, tokens, out, cols, row_bytes, n_vocab) = match mode {
        Mode::Embed => {
            let r = EmbedRegs::declare(k);
            let (t, o, c, b, v) = (r.tokens, r.out, r.cols, r.row_bytes, r.n_vocab);
            (r.table, Some(t), o, c, b, Some(v))
        }
        Mode::Rows(_) => {
            let r = DequantizeRegs::declare(k);
            (r.src, None, r.out, r.cols, r.row_bytes, None)
        }
    };
    let c = k.mad(k.reg(), k.ctaid_y(), THREADS, k.tid_x());
    k.exit_if(k.ge(c, cols));
    let row = k.ctaid_x();
    let src_row = match (tokens, n_vocab) {
        (Some(tokens), Some(n_vocab)) => {
            let t = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(tokens, row, 4));
            let bad = k.ge(t, n_vocab);
            k.if_(bad, |k| {
                let o = k.mad(k.reg(), row, cols, c);
                let nan = k.f32(f32::NAN);
                k.st(Store::GLOBAL, k.elem_addr(out, o, 4), nan);
                k.exit();
            });
            t
        }
        _ => row,
    };
    let base = k.mul_wide(k.reg::<U64>(), src_row, row_bytes);
    k.add(base, base, src);
    let y = value(k, ty, base, c);
    let o = k.mad(k.reg(), row, cols, c);
    match mode {
        Mode::Embed | Mode::Rows(OutType::F32) => k.st(Store::GLOBAL, k.elem_addr(out, o, 4), y),
        Mode::Rows(OutType::F16) => {
            let h = k.cvt(k.reg::<F16>(), y, FloatRound::Rn);
            k.st(Store::GLOBAL, k.elem_addr(out, o, 2), h);
        }
    }
}

const NC: Load = Load::GLOBAL_NC;

fn f16_at(k: &Kernel, addr: Reg<U64>, off: i64) -> Reg<F32> {
    let h = k.ld(NC, k.reg::<F16>(), addr.at(off));
    k.cvt(k.reg::<F32>(), h, Exact)
}

fn u8_at(k: &Kernel, addr: Reg<U64>) -> Reg<U32> {
    k.ld_narrow(NC, Narrow::U8, k.reg::<U32>(), addr)
}

fn byte_addr(k: &Kernel, base: Reg<U64>, off: u32, index: Reg<U32>) -> Reg<U64> {
    let i = k.add(k.reg(), index, off);
    let a = k.cvt(k.reg::<U64>(), i, Exact);
    k.add(a, a, base)
}

fn to_f32(k: &Kernel, q: Reg<U32>) -> Reg<F32> {
    k.cvt(k.reg::<F32>(), q, FloatRound::Rn)
}

fn s_to_f32(k: &Kernel, q: Reg<S32>) -> Reg<F32> {
    k.cvt(k.reg::<F32>(), q, FloatRound::Rn)
}

/// Value `c` of the row at `row` (ggml bytes of `ty`).
fn value(k: &Kernel, ty: GgmlType, row: Reg<U64>, c: Reg<U32>) -> Reg<F32> {
    use GgmlType::*;
    let qk = ty.block_size() as u32;
    let b = k.shr(k.reg(), c, qk.trailing_zeros());
    let j = k.and(k.reg(), c, qk - 1);
    let blk = k.mul_wide(k.reg::<U64>(), b, ty.type_size() as u32);
    k.add(blk, blk, row);
    match ty {
        F32 => k.load::<smelt_ptx::F32>(NC, blk),
        F16 => f16_at(k, blk, 0),
        BF16 => {
            let h = k.ld_narrow(NC, Narrow::U16, k.reg::<U32>(), blk);
            k.shl(h, h, 16u32);
            k.bitcast::<smelt_ptx::F32, U32>(h)
        }
        Q8_0 => {
            let d = f16_at(k, blk, 0);
            let q = k.ld_narrow(NC, Narrow::S8, k.reg::<S32>(), byte_addr(k, blk, 2, j));
            let y = s_to_f32(k, q);
            k.mul(y, y, d)
        }
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
            let (qs_off, qh_off, has_min) = match ty {
                Q4_0 => (2, None, false),
                Q4_1 => (4, None, true),
                Q5_0 => (6, Some(2), false),
                _ => (8, Some(4), true),
            };
            let d = f16_at(k, blk, 0);
            let idx = k.and(k.reg(), j, 15u32);
            let shift = k.shr(k.reg(), j, 4u32);
            k.shl(shift, shift, 2u32);
            let byte = u8_at(k, byte_addr(k, blk, qs_off, idx));
            let q = k.shr(k.reg(), byte, shift);
            k.and(q, q, 15u32);
            if let Some(qh_off) = qh_off {
                // Bit j of the 32-bit qh (little-endian) is weight j's fifth bit.
                let hb = k.shr(k.reg(), j, 3u32);
                let hbyte = u8_at(k, byte_addr(k, blk, qh_off, hb));
                let bit = k.and(k.reg(), j, 7u32);
                k.shr(hbyte, hbyte, bit);
                k.and(hbyte, hbyte, 1u32);
                k.shl(hbyte, hbyte, 4u32);
                k.or(q, q, hbyte);
            }
            if has_min {
                let m = f16_at(k, blk, 2);
                let y = to_f32(k, q);
                k.mul(y, y, d);
                k.add(y, y, m)
            } else {
                let offset = if qh_off.is_some() { 16 } else { 8 };
                let qs = k.sub(k.reg::<S32>(), q.cast::<S32>(), offset);
                let y = s_to_f32(k, qs);
                k.mul(y, y, d)
            }
        }
        Q4_K | Q5_K => {
            let d = f16_at(k, blk, 0);
            let dmin = f16_at(k, blk, 2);
            let sub = k.shr(k.reg(), j, 5u32); // 0..8: 32-weight group
            let (sc, m) = scale_min_k4(k, blk, sub);
            let chunk = k.shr(k.reg(), j, 6u32);
            let i = k.and(k.reg(), j, 31u32);
            let hi = k.and(k.reg(), sub, 1u32);
            let qs_off = if ty == Q4_K { 16 } else { 48 };
            let qi = k.mad(k.reg(), chunk, 32u32, i);
            let byte = u8_at(k, byte_addr(k, blk, qs_off, qi));
            let shift = k.shl(k.reg(), hi, 2u32);
            let q = k.shr(k.reg(), byte, shift);
            k.and(q, q, 15u32);
            if ty == Q5_K {
                let h = u8_at(k, byte_addr(k, blk, 16, i));
                k.shr(h, h, sub);
                k.and(h, h, 1u32);
                k.shl(h, h, 4u32);
                k.or(q, q, h);
            }
            let d1 = k.mul(k.reg(), d, to_f32(k, sc));
            let m1 = k.mul(k.reg(), dmin, to_f32(k, m));
            let y = k.mul(k.reg(), d1, to_f32(k, q));
            k.sub(y, y, m1)
        }
        Q6_K => {
            let d = f16_at(k, blk, 208);
            let h = k.shr(k.reg(), j, 7u32);
            let kk = k.shr(k.reg(), j, 5u32);
            k.and(kk, kk, 3u32);
            let i = k.and(k.reg(), j, 31u32);
            // ql[64h + 32(kk & 1) + i] >> 4(kk >> 1)
            let odd = k.and(k.reg(), kk, 1u32);
            let li = k.mad(k.reg(), h, 64u32, i);
            k.mad(li, odd, 32u32, li);
            let ql = u8_at(k, byte_addr(k, blk, 0, li));
            let ls = k.shr(k.reg(), kk, 1u32);
            k.shl(ls, ls, 2u32);
            k.shr(ql, ql, ls);
            k.and(ql, ql, 15u32);
            // qh[32h + i] >> 2kk & 3
            let hi = k.mad(k.reg(), h, 32u32, i);
            let qh = u8_at(k, byte_addr(k, blk, 128, hi));
            let hs = k.shl(k.reg(), kk, 1u32);
            k.shr(qh, qh, hs);
            k.and(qh, qh, 3u32);
            k.shl(qh, qh, 4u32);
            k.or(ql, ql, qh);
            let q = k.sub(k.reg::<S32>(), ql.cast::<S32>(), 32i32);
            // The group scale of weight j is scales[j / 16].
            let si = k.shr(k.reg(), j, 4u32);
            let sc = k.ld_narrow(NC, Narrow::S8, k.reg::<S32>(), byte_addr(k, blk, 192, si));
            let ds = k.mul(k.reg(), d, s_to_f32(k, sc));
            k.mul(ds, ds, s_to_f32(k, q))
        }
        _ => {
            k.reject(format!("no GPU dequantization for {ty}"));
            k.f32(0.0)
        }
    }
}

/// The 6-bit scale and min of group `s` (0..8) of a Q4_K/Q5_K super-block (ggml's
/// `get_scale_min_k4`), from the 12 bytes at offset 4; both variants computed and
/// selected, since a warp's 32 values share one group.
fn scale_min_k4(k: &Kernel, blk: Reg<U64>, s: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
    let lo4 = k.lt(s, 4u32);
    let a = u8_at(k, byte_addr(k, blk, 4, s)); // scales[s]
    let b = u8_at(k, byte_addr(k, blk, 8, s)); // scales[s + 4]
    let s4 = k.and(k.reg(), s, 3u32);
    let c = u8_at(k, byte_addr(k, blk, 4, s4)); // scales[s - 4] when s >= 4
                                                // s < 4: sc = a & 63, m = b & 63.
    let sc_lo = k.and(k.reg(), a, 63u32);
    let m_lo = k.and(k.reg(), b, 63u32);
    // s >= 4: sc = (b & 0xF) | (c >> 6) << 4, m = (b >> 4) | (a >> 6) << 4.
    let sc_hi = k.and(k.reg(), b, 15u32);
    let t = k.shr(k.reg(), c, 6u32);
    k.shl(t, t, 4u32);
    k.or(sc_hi, sc_hi, t);
    let m_hi = k.shr(k.reg(), b, 4u32);
    let t = k.shr(k.reg(), a, 6u32);
    k.shl(t, t, 4u32);
    k.or(m_hi, m_hi, t);
    let sc = k.selp(k.reg(), sc_lo, sc_hi, lo4);
    let m = k.selp(k.reg(), m_lo, m_hi, lo4);
    (sc, m)
}

/// CPU twin of the dequantize kernels writing f32: `rows` rows of `cols` values.
pub fn dequantize_cpu(
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, KernelError> {
    let rb = row_bytes(ty, cols)?;
    if src.len() < rows * rb {
        return Err(KernelError::BadLength {
            what: "dequantize source",
            got: src.len(),
            want: rows * rb,
        });
    }
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_mut(cols.max(1)).enumerate() {
        smelt_quant::dequantize_row(ty, &src[r * rb..(r + 1) * rb], o)?;
    }
    Ok(out)
}

/// CPU twin of the dequantize kernels writing f16 (bits): the f32 values rounded to
/// nearest even.
pub fn dequantize_f16_cpu(
    ty: GgmlType,
    src: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<u16>, KernelError> {
    Ok(dequantize_cpu(ty, src, rows, cols)?
        .into_iter()
        .map(|v| f32_to_f16(v).to_bits())
        .collect())
}

/// CPU twin of the embedding kernels: rows of `table` (`n_vocab` rows of `cols` values
/// of `ty`) for `tokens`; an id at or past `n_vocab` gives a row of NaN.
pub fn embed_cpu(
    ty: GgmlType,
    table: &[u8],
    n_vocab: usize,
    cols: usize,
    tokens: &[u32],
) -> Result<Vec<f32>, KernelError> {
    let rb = row_bytes(ty, cols)?;
    let mut out = vec![f32::NAN; tokens.len() * cols];
    for (&t, o) in tokens.iter().zip(out.chunks_mut(cols.max(1))) {
        let t = t as usize;
        if t < n_vocab {
            smelt_quant::dequantize_row(ty, &table[t * rb..(t + 1) * rb], o)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn every_type_builds_three_kernels() {
        let entries = catalog();
        assert_eq!(entries.len(), 3 * TYPES.len());
        let mut m = Module::new(Target::Sm80);
        for (name, build) in entries {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        assert!(ptx.contains(".entry embed_q4_k("));
        assert!(ptx.contains(".entry dequantize_bf16_f16("));
        // Scales multiply and subtract the way smelt-quant does: never one fused op.
        assert!(!ptx.contains("fma.rn.f32"));
        assert!(ptx.contains("ld.global.nc.s8"));
    }

    #[test]
    fn unsupported_types_and_ragged_rows_are_errors() {
        assert!(embed_name(GgmlType::IQ4_XS).is_err());
        assert!(row_bytes(GgmlType::Q4_K, 100).is_err());
        assert_eq!(row_bytes(GgmlType::Q4_0, 64).unwrap(), 36);
        let t = vec![0u8; 2 * 36];
        let e = embed_cpu(GgmlType::Q4_0, &t, 2, 64, &[1, 5]).unwrap();
        assert!(e[..64].iter().all(|&v| v == -0.0));
        assert!(e[64..].iter().all(|v| v.is_nan()));
    }
}
