//! Q4_0, Q4_1, Q5_0 and Q5_1 on the GPU: one implementation, with the 5th bit (`qh`) and
//! the block minimum (`m`) as generation-time switches.
//!
//! ggml's blocks (18 to 24 bytes) leave nothing 16-byte aligned, so a row is repacked at
//! upload into one array per field: all nibbles (16 bytes per block), all `qh` (4), all
//! `d` (2), all `m` (2), padded with zero blocks to whole tiles and to 16 bytes. Thread
//! `p` of a tile dots blocks `2p` and `2p + 1`: two 16-byte loads of nibbles, one 8-byte
//! load of high bits, 4-byte loads of the scales. Byte `j` of a block holds weight `j`
//! (low nibble) and `j + 16` (high nibble); bit `j` of `qh` is weight `j`'s fifth bit.
//! The fifth bits of four weights are spread to bit 4 of four bytes with one multiply.
//! Offsets (`q - 8`, `q - 16`) are applied once per block through the activation block's
//! exact quant sum; minima through its `s = f16(d * sum)`, ggml-cpu's `m * s` term.

use smelt_ptx::{Bytes, FloatRound, Kernel, Load, Reg, F32, S32, U32, U64};

use super::{halves_to_f32, ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::{self, and_or, ActRegs};
use crate::{padded_tiles, GgmlType, KernelError};

/// A legacy 32-weight format: `HIGH` = 5-bit quants, `MIN` = `d * q + m` (else `d * (q -
/// offset)`).
pub struct Legacy<const HIGH: bool, const MIN: bool>;

/// Q4_0: `d * (q - 8)`.
pub type Q4_0 = Legacy<false, false>;
/// Q4_1: `d * q + m`.
pub type Q4_1 = Legacy<false, true>;
/// Q5_0: `d * (q - 16)`, 5-bit `q`.
pub type Q5_0 = Legacy<true, false>;
/// Q5_1: `d * q + m`, 5-bit `q`.
pub type Q5_1 = Legacy<true, true>;

/// Per-thread offsets (bytes from the row start, before the tile's own offset).
pub struct Setup {
    qs: Reg<U64>,
    qh: Reg<U64>,
    d: Reg<U64>,
    m: Reg<U64>,
}

/// Raw loads of a thread's two blocks.
pub struct Loaded {
    pub(crate) qs: [Reg<U32>; 8],
    qh: [Reg<U32>; 2],
    pub(crate) d: Reg<U32>,
    m: Reg<U32>,
}

/// Two blocks as quant bytes (0..32) in weight order, with their scales.
pub struct Decoded {
    q: [Reg<U32>; 16],
    d: [Reg<F32>; 2],
    m: [Reg<F32>; 2],
}

impl<const HIGH: bool, const MIN: bool> Legacy<HIGH, MIN> {
    /// ggml's block size in bytes.
    const BLOCK: usize = 18 + if HIGH { 4 } else { 0 } + if MIN { 2 } else { 0 };
    /// Where the fields start in a ggml block.
    const QH_AT: usize = if MIN { 4 } else { 2 };
    const QS_AT: usize = Self::QH_AT + if HIGH { 4 } else { 0 };
    /// What `q` is offset by when there is no minimum.
    const OFFSET: i32 = if HIGH { 16 } else { 8 };
}

impl<const HIGH: bool, const MIN: bool> GpuFormat for Legacy<HIGH, MIN> {
    const TYPE: GgmlType = match (HIGH, MIN) {
        (false, false) => GgmlType::Q4_0,
        (false, true) => GgmlType::Q4_1,
        (true, false) => GgmlType::Q5_0,
        (true, true) => GgmlType::Q5_1,
    };
    const NAME: &'static str = match (HIGH, MIN) {
        (false, false) => "q4_0",
        (false, true) => "q4_1",
        (true, false) => "q5_0",
        (true, true) => "q5_1",
    };
    const COMPACT: bool = !HIGH;
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        let blocks = padded_tiles(k, "legacy GEMV")? * 8;
        Ok(pad16(blocks * Self::BLOCK))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        let nb = k.div_ceil(256) * 8;
        let qh_at = 16 * nb;
        let d_at = qh_at + if HIGH { 4 * nb } else { 0 };
        let m_at = d_at + 2 * nb;
        for (b, block) in ggml.chunks_exact(Self::BLOCK).enumerate() {
            out[16 * b..16 * b + 16].copy_from_slice(&block[Self::QS_AT..Self::QS_AT + 16]);
            if HIGH {
                out[qh_at + 4 * b..qh_at + 4 * b + 4]
                    .copy_from_slice(&block[Self::QH_AT..Self::QH_AT + 4]);
            }
            out[d_at + 2 * b..d_at + 2 * b + 2].copy_from_slice(&block[..2]);
            if MIN {
                out[m_at + 2 * b..m_at + 2 * b + 2].copy_from_slice(&block[2..4]);
            }
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Setup {
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let qs = k.mul_wide(k.reg::<U64>(), part, 32u32);
        // Per tile: 128 bytes of nibbles, 32 of qh, 16 of d, 16 of m.
        let qh_base = k.mul(k.reg(), ntiles, 128u32);
        let qh = k.mad(k.reg(), part, 8u32, qh_base);
        let d_base = k.mul(k.reg(), ntiles, if HIGH { 160u32 } else { 128 });
        let d = k.mad(k.reg(), part, 4u32, d_base);
        let m = k.mul(k.reg(), ntiles, 16u32);
        k.add(m, m, d);
        Setup {
            qs,
            qh: wide(qh),
            d: wide(d),
            m: wide(m),
        }
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        let b0 = k.shl(k.reg(), part, 1u32);
        let b1 = k.add(k.reg(), b0, 1u32);
        (b0, b1)
    }

    fn load(k: &Kernel, s: &Setup, row: Reg<U64>, tile: Reg<U32>, how: WeightLoad) -> Loaded {
        let at = |base: Reg<U64>, stride: u32| {
            let a = k.add(k.reg(), row, base);
            k.add(a, a, k.mul_wide(k.reg::<U64>(), tile, stride))
        };
        let qs_at = at(s.qs, 128);
        let qs = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], qs_at);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], qs_at.at(16));
        let qh = k.regs::<U32, 2>();
        if HIGH {
            k.ld_v2(Load::GLOBAL_NC, qh, at(s.qh, 32));
        }
        let d = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), at(s.d, 16));
        let m = k.reg::<U32>();
        if MIN {
            k.ld(Load::GLOBAL_NC, m, at(s.m, 16));
        }
        Loaded { qs, qh, d, m }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        let mut v = vec![w.qs[0], w.qs[4], w.d];
        if HIGH {
            v.push(w.qh[0]);
        }
        if MIN {
            v.push(w.m);
        }
        v
    }

    fn decode(k: &Kernel, _s: &Setup, w: &Loaded) -> Decoded {
        let q = std::array::from_fn(|i| {
            // Word i of the 16: block i / 8; within it, words 0..4 are low nibbles of
            // bytes 0..16 (weights 0..16), words 4..8 the high nibbles (weights 16..32).
            let (b, j) = (i / 8, i % 8);
            let word = w.qs[4 * b + j % 4];
            let nibbles = if j < 4 {
                word
            } else {
                k.shr(k.reg::<U32>(), word, 4u32)
            };
            if HIGH {
                let bits = k.bfe(k.reg::<U32>(), w.qh[b], 4 * j as u32, 4u32);
                let spread = k.mul(bits, bits, 0x0204_0810u32);
                k.and(spread, spread, 0x1010_1010u32);
                k.lop3(k.reg::<U32>(), nibbles, 0x0F0F_0F0Fu32, spread, and_or())
            } else {
                k.and(k.reg::<U32>(), nibbles, 0x0F0F_0F0Fu32)
            }
        });
        let d = halves_to_f32(k, w.d);
        let m = if MIN {
            halves_to_f32(k, w.m)
        } else {
            [k.f32(0.0), k.f32(0.0)]
        };
        Decoded { q, d, m }
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
        for b in 0..2 {
            let isum = k.s32(0);
            for (&q, &a) in w.q[8 * b..8 * b + 8].iter().zip(&x.q[8 * b..8 * b + 8]) {
                k.dp4a_with(Bytes::Unsigned, Bytes::Signed, isum, q, a, isum);
            }
            let scale = k.mul(k.reg(), w.d[b], x.d[b]);
            if MIN {
                let f = k.cvt(k.reg::<F32>(), isum, FloatRound::Rn);
                k.fma(acc, scale, f, acc);
                k.fma(acc, w.m[b], x.s[b], acc);
            } else {
                let centered = k.mad(k.reg::<S32>(), x.sum[b], -Self::OFFSET, isum);
                let f = k.cvt(k.reg::<F32>(), centered, FloatRound::Rn);
                k.fma(acc, scale, f, acc);
            }
        }
    }
}

/// What the kernel's Q4_1/Q5_1 minimum term adds over the dot of the dequantized values,
/// for the CPU twin: `sum_b m_b * (s_b - d_b * sum_b)` over the blocks of one weight row
/// (`ggml_row`, ggml bytes) and one token's activation tiles (`tiles`), for `k` weights. The
/// twin dots `W = d q + m` with `x = d_x q_x`, whose minimum term is `m * d_x * sum`; the
/// kernel uses ggml's `m * s` instead, `s = f16(d_x_f32 * sum)`. Zero for the other types.
pub fn cpu_min_term_shift(ty: GgmlType, ggml_row: &[u8], tiles: &[u8], k: usize) -> f64 {
    let block = match ty {
        GgmlType::Q4_1 => Q4_1::BLOCK,
        GgmlType::Q5_1 => Q5_1::BLOCK,
        _ => return 0.0,
    };
    let half = |b: &[u8], at: usize| half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]]));
    let blocks = ggml_row.chunks_exact(block).take(k / 32);
    blocks
        .enumerate()
        .map(|(b, w)| {
            let tile = &tiles[(b / 8) * act::TILE_BYTES..];
            let slot = 2 * (b % 8);
            let d = half(tile, act::D_OFFSET + slot).to_f64();
            let s = half(tile, act::S_OFFSET + slot).to_f64();
            let sum = i16::from_le_bytes([
                tile[act::SUM_OFFSET + slot],
                tile[act::SUM_OFFSET + slot + 1],
            ]);
            half(w, 2).to_f64() * (s - d * f64::from(sum))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shift is what separates `m * s` from `m * d * sum`, block by block.
    #[test]
    fn min_term_shift_is_m_times_s_minus_d_sum() {
        let k = 512;
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 37 % 101) as f32 - 43.0) / 7.3)
            .collect();
        let tiles = act::quantize_cpu(&x, k).unwrap();
        let w: Vec<f32> = (0..k).map(|i| ((i * 13 % 29) as f32 - 9.0) / 3.1).collect();
        let mut q8 = vec![0u8; k / 32 * 36];
        smelt_quant::quantize_row(GgmlType::Q8_1, &x, &mut q8).unwrap();
        for ty in [GgmlType::Q4_1, GgmlType::Q5_1] {
            let mut row = vec![0u8; k / 32 * ty.type_size()];
            smelt_quant::quantize_row(ty, &w, &mut row).unwrap();
            let bs = ty.type_size();
            let half = |b: &[u8], at: usize| {
                half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f64()
            };
            let want: f64 = (0..k / 32)
                .map(|b| {
                    let (wb, xb) = (&row[b * bs..], &q8[36 * b..]);
                    let sum: i32 = xb[4..36].iter().map(|&q| i32::from(q as i8)).sum();
                    half(wb, 2) * (half(xb, 2) - half(xb, 0) * f64::from(sum))
                })
                .sum();
            let got = cpu_min_term_shift(ty, &row, &tiles, k);
            assert_eq!(got, want);
            assert_ne!(got, 0.0, "{ty:?}: the f16 rounding of s must show");
        }
        assert_eq!(
            cpu_min_term_shift(GgmlType::Q4_0, &[0; 18 * 16], &tiles, k),
            0.0
        );
    }
}
