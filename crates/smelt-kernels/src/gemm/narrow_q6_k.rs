//! Q6_K in the narrow GEMM ([`super::narrow`]): Q4_K_M files keep `attn_v`, some layers'
//! `ffn_down` and the output head in Q6_K, which batched decode otherwise runs on the int8
//! GEMM at about twice the narrow GEMM's time (`gpu_ops perf -o gemm_f16`, H100).
//!
//! A repacked row ([`crate::formats::q6_k`]) is four arrays: all `ql` (128 bytes a tile),
//! all `qh` (64), all scales (16), all `d` (2). A ring slot holds a row's tile as `ql`,
//! `qh`, scales and the 16-byte piece of `d` that holds its `d` (eight tiles share one):
//! 224 bytes, so at 32 tokens the ring fits one block an SM.
//!
//! Lane `(g, c)` takes weights `64 c..64 c + 64` of the tile, as the Q4_K lanes do: with
//! `n = c / 2`, `m = c % 2`, weight `64 c + 32 h + l` is ggml's quarter `2 m + h` of half
//! `n`: nibble `m` of `ql` byte `64 n + 32 h + l`, bits `4 m + 2 h` of `qh` byte `32 n +
//! l`, scale `8 n + 4 m + 2 h + l / 16` (`dequantize_row_q6_K`'s order). So the lane reads
//! `ql` bytes `64 n..+64`, `qh` bytes `32 n..+32` and one word of scales. A weight is `(q -
//! 32) A` rounded once to a half, `A = d sc` rounded to a half: the 6-bit `q` becomes the
//! half `1024 + q` (the nibble and the exponent in one `lop3`, the top bits in another),
//! `1056` is subtracted exactly, and one `fma` with zero scales it: the f16 GEMM's twin
//! ([`super::f16_q6_k`]) to the bit.

use smelt_ptx::{Kernel, Load, Reg, B32, F16, F32, S32, U32};

use super::f16::{dequant_pair, nibble_pair};
use super::narrow::{Field, NarrowFormat};
use crate::act::and_or;
use crate::formats::Q6K;
use crate::GgmlType;

/// A lane's constants: its byte offsets in a row's slot, its shifts, and the halves the
/// dequantization takes.
pub struct Lane {
    /// `ql` bytes `64 n..`, `qh` bytes `128 + 32 n..`, scale bytes `192 + 8 n + 4 m..`.
    ql: Reg<U32>,
    qh: Reg<U32>,
    sc: Reg<U32>,
    /// `4 m`: brings the lane's nibbles to bits 0-3 of each byte.
    nib: Reg<U32>,
    /// `4 m + 2 h`: brings half h's top bits to bits 0-1 of each byte.
    high: [Reg<U32>; 2],
    /// The halves 1056 (`1024 + 32`) and 0.
    bias: Reg<B32>,
    zero: Reg<B32>,
}

/// One row's share of a tile.
pub struct Row {
    /// `ql` words: half h's eight at `8 h..`.
    ql: [Reg<U32>; 16],
    qh: [Reg<U32>; 8],
    /// Scales `8 n + 4 m..+4`.
    sc: Reg<U32>,
    d: Reg<F16>,
}

impl NarrowFormat for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const NAMES: [[&'static str; 4]; 3] = [
        [
            "gemm_narrow8_q6_k",
            "gemm_narrow16_q6_k",
            "gemm_narrow32_q6_k",
            "gemm_narrow64_q6_k",
        ],
        [
            "gemm_narrow8_r16_q6_k",
            "gemm_narrow16_r16_q6_k",
            "gemm_narrow32_r16_q6_k",
            "gemm_narrow64_r16_q6_k",
        ],
        [
            "gemm_narrow8_r16p_q6_k",
            "gemm_narrow16_r16p_q6_k",
            "gemm_narrow32_r16p_q6_k",
            "gemm_narrow64_r16p_q6_k",
        ],
    ];
    const FIELDS: &'static [Field] = &[
        Field {
            at_per_tile: 0,
            bytes: 128,
            share: 1,
        },
        Field {
            at_per_tile: 128,
            bytes: 64,
            share: 1,
        },
        Field {
            at_per_tile: 192,
            bytes: 16,
            share: 1,
        },
        Field {
            at_per_tile: 208,
            bytes: 16,
            share: 8,
        },
    ];
    type Lane = Lane;
    type Row = Row;
    /// `A = d sc` of the half's two scales (steps 0-3, 4-7), as halves.
    type Coef = [Reg<B32>; 2];

    fn lane(k: &Kernel, c: Reg<U32>) -> Lane {
        let n = k.shr(k.reg(), c, 1u32);
        let m = k.and(k.reg(), c, 1u32);
        let nib = k.shl(k.reg(), m, 2u32);
        let sc = k.mad(k.reg(), n, 8u32, 192u32);
        k.mad(sc, m, 4u32, sc);
        Lane {
            ql: k.shl(k.reg(), n, 6u32),
            qh: k.mad(k.reg(), n, 32u32, 128u32),
            sc,
            nib,
            high: [nib, k.add(k.reg(), nib, 2u32)],
            bias: k.mov(k.reg::<B32>(), 0x6420_6420u32),
            zero: k.mov(k.reg::<B32>(), 0u32),
        }
    }

    fn row_regs(k: &Kernel) -> Row {
        Row {
            ql: k.regs::<U32, 16>(),
            qh: k.regs::<U32, 8>(),
            sc: k.reg::<U32>(),
            d: k.reg::<F16>(),
        }
    }

    fn load(k: &Kernel, lane: &Lane, row: &Row, at: Reg<U32>, tile: Reg<U32>) {
        let ql = k.add(k.reg(), at, lane.ql);
        for (i, w) in row.ql.chunks(4).enumerate() {
            k.ld_v4(Load::SHARED, [w[0], w[1], w[2], w[3]], ql.at(16 * i as i64));
        }
        let qh = k.add(k.reg(), at, lane.qh);
        for (i, w) in row.qh.chunks(4).enumerate() {
            k.ld_v4(Load::SHARED, [w[0], w[1], w[2], w[3]], qh.at(16 * i as i64));
        }
        let sc = k.add(k.reg(), at, lane.sc);
        k.ld(Load::SHARED, row.sc, sc.at(0));
        // The tile's `d` in its shared 16-byte piece.
        let d = k.and(k.reg(), tile, 7u32);
        k.mad(d, d, 2u32, at);
        k.ld(Load::SHARED, row.d, d.at(208));
    }

    fn coef(k: &Kernel, _lane: &Lane, row: &Row, h: usize) -> [Reg<B32>; 2] {
        let d = k.cvt(k.reg::<F32>(), row.d, smelt_ptx::Exact);
        let word = row.sc.cast::<S32>();
        std::array::from_fn(|i| {
            let sc = k.bfe(k.reg::<S32>(), word, 16 * h as u32 + 8 * i as u32, 8u32);
            let a = k.mul(
                k.reg(),
                d,
                k.cvt(k.reg::<F32>(), sc, smelt_ptx::FloatRound::Rn),
            );
            k.cvt_f16x2(k.reg(), a, a)
        })
    }

    fn pair(
        k: &Kernel,
        lane: &Lane,
        row: &Row,
        coef: &[Reg<B32>; 2],
        h: usize,
        t: usize,
        j: usize,
        magic: Reg<B32>,
    ) -> Reg<B32> {
        let wq = k.shr(k.reg(), row.ql[8 * h + t], lane.nib);
        let top = k.shr(k.reg(), row.qh[t], lane.high[h]);
        // Bytes 0 and 2 (j = 0) or 1 and 3: their top bits to bits 4-5 of each half.
        let top = if j == 0 {
            k.shl(k.reg(), top, 4u32)
        } else {
            k.shr(k.reg(), top, 4u32)
        };
        let v = nibble_pair(k, wq, 8 * j as u32, magic);
        let v = k.lop3(k.reg::<B32>(), top, 0x0030_0030u32, v, and_or());
        dequant_pair(k, v, lane.bias, coef[t / 4], lane.zero)
    }
}

#[cfg(test)]
mod tests {
    use super::super::narrow::{row_slot, NarrowFormat};
    use super::*;

    #[test]
    fn a_row_slot_holds_the_four_fields_of_a_tile() {
        let f = <Q6K as NarrowFormat>::FIELDS;
        // ql, qh, scales: a tile's bytes of each; d: the 16-byte piece eight tiles share.
        assert_eq!(
            f.iter()
                .map(|f| (f.at_per_tile, f.bytes, f.share))
                .collect::<Vec<_>>(),
            [(0, 128, 1), (128, 64, 1), (192, 16, 1), (208, 16, 8)]
        );
        assert_eq!(row_slot(GgmlType::Q6_K), 224);
        // The arrays of a repacked row: 210 bytes a tile, the d array 16-byte aligned.
        assert_eq!(208 % 16, 0);
        let rb = crate::catalog::row_bytes(GgmlType::Q6_K, 256 * 3).unwrap();
        assert!(
            rb >= 208 * 3 + 16,
            "the last d piece lies inside the row ({rb})"
        );
    }
}
