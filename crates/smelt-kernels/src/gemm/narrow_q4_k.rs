//! Q4_K in the narrow GEMM ([`super::narrow`]): the format it was written for, whose
//! lane layout the other formats copy. A ring slot holds a row's tile as its 144-byte
//! super-block (16-byte header, 128 quant bytes), as it lies in global memory.

use smelt_ptx::{FloatRound, Kernel, Load, Reg, B32, U32};

use super::f16::{dequant_pair, nibble_pair};
use super::narrow::{Field, NarrowFormat};
use crate::formats::q4_k::{decode_header, setup_with_quants_at, Setup};
use crate::formats::Q4K;
use crate::GgmlType;

/// Q4_K: a row's tile is one 144-byte super-block (16-byte header, 128 quant bytes); lane
/// `(g, c)` reads the header and quant bytes `32 c..32 c + 32`: low nibbles in half 0,
/// high in half 1 (the Q4_K GEMV's share, [`crate::formats::q4_k`]).
impl NarrowFormat for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const NAMES: [[&'static str; 4]; 3] = [
        [
            "gemm_narrow8_q4_k",
            "gemm_narrow16_q4_k",
            "gemm_narrow32_q4_k",
            "gemm_narrow64_q4_k",
        ],
        [
            "gemm_narrow8_r16_q4_k",
            "gemm_narrow16_r16_q4_k",
            "gemm_narrow32_r16_q4_k",
            "gemm_narrow64_r16_q4_k",
        ],
        [
            "gemm_narrow8_r16p_q4_k",
            "gemm_narrow16_r16p_q4_k",
            "gemm_narrow32_r16p_q4_k",
            "gemm_narrow64_r16p_q4_k",
        ],
    ];
    const FIELDS: &'static [Field] = &[Field {
        at_per_tile: 0,
        bytes: 144,
        share: 1,
    }];
    /// The header decoder's constants and the lane's quant offset `16 + 32 c`.
    type Lane = (Setup, Reg<U32>);
    /// The header, then the 32 quant bytes.
    type Row = ([Reg<U32>; 4], [Reg<U32>; 8]);
    /// `A = d sc`, `B = -dmin m` of sub-block `2 c + h`, as halves.
    type Coef = (Reg<B32>, Reg<B32>);

    fn lane(k: &Kernel, c: Reg<U32>) -> Self::Lane {
        (
            setup_with_quants_at(k, c, 16),
            k.mad(k.reg(), c, 32u32, 16u32),
        )
    }

    fn row_regs(k: &Kernel) -> Self::Row {
        (k.regs::<U32, 4>(), k.regs::<U32, 8>())
    }

    fn load(k: &Kernel, lane: &Self::Lane, row: &Self::Row, at: Reg<U32>, _tile: Reg<U32>) {
        let (hdr, qs) = *row;
        k.ld_v4(Load::SHARED, hdr, at.at(0));
        let q = k.add(k.reg(), at, lane.1);
        let [a, b, cc, d, e, f, gg, h] = qs;
        k.ld_v4(Load::SHARED, [a, b, cc, d], q.at(0));
        k.ld_v4(Load::SHARED, [e, f, gg, h], q.at(16));
    }

    fn coef(k: &Kernel, lane: &Self::Lane, row: &Self::Row, h: usize) -> Self::Coef {
        let hd = decode_header(k, &lane.0, row.0);
        let sc = k.cvt(k.reg::<smelt_ptx::F32>(), hd.scale[h], FloatRound::Rn);
        let m = k.cvt(k.reg::<smelt_ptx::F32>(), hd.min[h], FloatRound::Rn);
        let a = k.mul(k.reg(), hd.d, sc);
        let b = k.mul(k.reg(), hd.neg_dmin, m);
        (k.cvt_f16x2(k.reg(), a, a), k.cvt_f16x2(k.reg(), b, b))
    }

    fn pair(
        k: &Kernel,
        _lane: &Self::Lane,
        row: &Self::Row,
        coef: &Self::Coef,
        h: usize,
        t: usize,
        j: usize,
        magic: Reg<B32>,
    ) -> Reg<B32> {
        let v = nibble_pair(k, row.1[t], 4 * h as u32 + 8 * j as u32, magic);
        dequant_pair(k, v, magic, coef.0, coef.1)
    }
}
