//! Q8_0 in the narrow GEMM ([`super::narrow`]): Q8_0 files (and Q8_0 tensors in mixed
//! files) ran their batched decode on the int8 GEMM.
//!
//! A repacked row ([`crate::formats::q8_0`]) is all its quants (32 bytes a block, 256 a
//! tile) then all its f16 scales (16 bytes a tile). A ring slot holds a row's tile as its
//! 256 quant bytes then its 8 scales: 272 bytes, so at 32 tokens the ring fits one block an
//! SM.
//!
//! Lane `(g, c)` takes weights `64 c..64 c + 64` of the tile, as the Q4_K lanes do: blocks
//! `2 c` (half 0) and `2 c + 1` (half 1), so quant bytes `64 c..+64` and the two scales at
//! `256 + 4 c`. A weight is `q d` rounded once to a half: the signed byte goes into a half's
//! low byte under the exponent of 1024 (`prmt`), its sign bit flipped (`1024 + 128 + q`),
//! `1152` is subtracted exactly, and one `fma` with zero scales it by `d`.

use half::f16 as h16;
use smelt_ptx::{Kernel, Load, Reg, B32, U32};

use super::f16::dequant_pair;
use super::narrow::{Field, NarrowFormat};
use crate::formats::Q8_0;
use crate::{GgmlType, KernelError};

/// A lane's constants: its byte offsets in a row's slot and the halves the dequantization
/// takes.
pub struct Lane {
    /// Quant bytes `64 c..`, scales `256 + 4 c..`.
    q: Reg<U32>,
    d: Reg<U32>,
    /// The bytes 0x64 (high bytes of the halves), the sign flips, 1152 (`1024 + 128`)
    /// and 0 as halves.
    high: Reg<B32>,
    flip: Reg<B32>,
    bias: Reg<B32>,
    zero: Reg<B32>,
}

/// One row's share of a tile: half h's eight quant words at `8 h..`, and both scales.
pub struct Row {
    q: [Reg<U32>; 16],
    d: Reg<U32>,
}

impl NarrowFormat for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const NAMES: [[&'static str; 4]; 3] = [
        [
            "gemm_narrow8_q8_0",
            "gemm_narrow16_q8_0",
            "gemm_narrow32_q8_0",
            "gemm_narrow64_q8_0",
        ],
        [
            "gemm_narrow8_r16_q8_0",
            "gemm_narrow16_r16_q8_0",
            "gemm_narrow32_r16_q8_0",
            "gemm_narrow64_r16_q8_0",
        ],
        [
            "gemm_narrow8_r16p_q8_0",
            "gemm_narrow16_r16p_q8_0",
            "gemm_narrow32_r16p_q8_0",
            "gemm_narrow64_r16p_q8_0",
        ],
    ];
    const FIELDS: &'static [Field] = &[
        Field {
            at_per_tile: 0,
            bytes: 256,
            share: 1,
        },
        Field {
            at_per_tile: 256,
            bytes: 16,
            share: 1,
        },
    ];
    type Lane = Lane;
    type Row = Row;
    /// `d` of the half's block, in both halves.
    type Coef = Reg<B32>;

    fn lane(k: &Kernel, c: Reg<U32>) -> Lane {
        Lane {
            q: k.shl(k.reg(), c, 6u32),
            d: k.mad(k.reg(), c, 4u32, 256u32),
            high: k.mov(k.reg::<B32>(), 0x6464_6464u32),
            flip: k.mov(k.reg::<B32>(), 0x0080_0080u32),
            bias: k.mov(k.reg::<B32>(), 0x6480_6480u32),
            zero: k.mov(k.reg::<B32>(), 0u32),
        }
    }

    fn row_regs(k: &Kernel) -> Row {
        Row {
            q: k.regs::<U32, 16>(),
            d: k.reg::<U32>(),
        }
    }

    fn load(k: &Kernel, lane: &Lane, row: &Row, at: Reg<U32>, _tile: Reg<U32>) {
        let q = k.add(k.reg(), at, lane.q);
        for (i, w) in row.q.chunks(4).enumerate() {
            k.ld_v4(Load::SHARED, [w[0], w[1], w[2], w[3]], q.at(16 * i as i64));
        }
        let d = k.add(k.reg(), at, lane.d);
        k.ld(Load::SHARED, row.d, d.at(0));
    }

    fn coef(k: &Kernel, _lane: &Lane, row: &Row, h: usize) -> Reg<B32> {
        // Half h's scale into both halves.
        let sel = if h == 0 { 0x1010u32 } else { 0x3232 };
        k.prmt(k.reg::<B32>(), row.d, row.d, sel)
    }

    fn pair(
        k: &Kernel,
        lane: &Lane,
        row: &Row,
        coef: &Reg<B32>,
        h: usize,
        t: usize,
        j: usize,
        _magic: Reg<B32>,
    ) -> Reg<B32> {
        // Bytes 0 and 2 (j = 0) or 1 and 3 as the low bytes of two halves 0x64XX.
        let sel = if j == 0 { 0x4240u32 } else { 0x4341 };
        let v = k.prmt(k.reg::<B32>(), row.q[8 * h + t], lane.high, sel);
        let v = k.xor(v, v, lane.flip);
        dequant_pair(k, v, lane.bias, *coef, lane.zero)
    }
}

/// A Q8_0 row (ggml's 34-byte blocks: `d`, then 32 signed quants) as the halves the
/// narrow GEMM multiplies: `q d` rounded once to a half (the product of a half and a byte
/// is exact in f32). The CPU twin's weights ([`super::f16::cpu_with_magnitude`]).
pub(crate) fn dequantize_row(ggml: &[u8], k: usize) -> Result<Vec<u16>, KernelError> {
    if k % 32 != 0 || ggml.len() != k / 32 * 34 {
        return Err(KernelError::BadLength {
            what: "Q8_0 row",
            got: ggml.len(),
            want: k / 32 * 34,
        });
    }
    let mut out = Vec::with_capacity(k);
    for blk in ggml.chunks(34) {
        let d = h16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        out.extend(
            blk[2..]
                .iter()
                .map(|&q| h16::from_f32(f32::from(q as i8) * d).to_bits()),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::narrow::row_slot;
    use super::*;

    #[test]
    fn twin_weights_are_ggml_dequantization_rounded_to_halves() {
        let k = 512;
        let w: Vec<f32> = (0..k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let mut ggml = vec![0u8; k / 32 * 34];
        smelt_quant::quantize_row(GgmlType::Q8_0, &w, &mut ggml).unwrap();
        let mut exact = vec![0f32; k];
        smelt_quant::dequantize_row(GgmlType::Q8_0, &ggml, &mut exact).unwrap();
        let h = dequantize_row(&ggml, k).unwrap();
        for (i, (&b, &e)) in h.iter().zip(&exact).enumerate() {
            assert_eq!(h16::from_bits(b), h16::from_f32(e), "weight {i}");
        }
        assert!(dequantize_row(&ggml[..34], k).is_err());
        assert_eq!(row_slot(GgmlType::Q8_0), 272);
    }

    #[test]
    fn the_byte_trick_gives_the_signed_quant() {
        // prmt puts byte q under 0x64, the flip adds 128: 1024 + 128 + q, less 1152.
        for q in -128i32..=127 {
            let half = 0x6400u16 | (((q as u8) ^ 0x80) as u16);
            assert_eq!(h16::from_bits(half).to_f32() - 1152.0, q as f32);
        }
    }
}
