//! Q5_K on the GPU: ggml's 176-byte super-blocks as they are (a multiple of 16 bytes).
//!
//! As Q4_K (same header, same thread split: thread `p` takes quant bytes `32p..32p + 32`,
//! sub-blocks `2p` and `2p + 1`), plus the fifth bits: all 32 `qh` bytes, where bit `2p`
//! of byte `l` belongs to weight `64p + l` and bit `2p + 1` to weight `64p + 32 + l`.
//! Five 16-byte loads for 64 weights.

use smelt_ptx::{Bytes, FloatRound, Kernel, Reg, F32, S32, U32, U64};

use super::q4_k::{decode_header, setup_with_quants_at, Header, Setup};
use super::{ld_weights, GpuFormat, WeightLoad};
use crate::act::{and_or, ActRegs};
use crate::{tiles, GgmlType, KernelError};

/// Bytes of a Q5_K super-block.
const BLOCK: u32 = 176;

/// The Q5_K format.
pub struct Q5K;

/// The raw loads of one super-block.
pub struct Loaded {
    header: [Reg<U32>; 4],
    qh: [Reg<U32>; 8],
    qs: [Reg<U32>; 8],
}

/// One super-block unpacked: 5-bit quants (0..32) of the thread's two sub-blocks.
pub struct Decoded {
    d: Reg<F32>,
    neg_dmin: Reg<F32>,
    scale: [Reg<S32>; 2],
    min: [Reg<S32>; 2],
    low: [Reg<U32>; 8],
    high: [Reg<U32>; 8],
}

impl GpuFormat for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const NAME: &'static str = "q5_k";
    type Setup = (Setup, Reg<U32>);
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(tiles(k, "Q5_K GEMV")? * BLOCK as usize)
    }

    fn repack_row(ggml: &[u8], _k: usize, out: &mut [u8]) {
        out.copy_from_slice(ggml);
    }

    fn setup(k: &Kernel, part: Reg<U32>, _ntiles: Reg<U32>) -> Self::Setup {
        let shift = k.shl(k.reg(), part, 1u32);
        (setup_with_quants_at(k, part, 48), shift)
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        let b0 = k.shl(k.reg(), part, 1u32);
        let b1 = k.add(k.reg(), b0, 1u32);
        (b0, b1)
    }

    fn load(
        k: &Kernel,
        (s, _): &Self::Setup,
        row: Reg<U64>,
        tile: Reg<U32>,
        how: WeightLoad,
    ) -> Loaded {
        let block = k.add(k.reg(), row, k.mul_wide(k.reg::<U64>(), tile, BLOCK));
        let header = k.regs::<U32, 4>();
        ld_weights(k, how, header, block);
        let qh = k.regs::<U32, 8>();
        ld_weights(k, how, [qh[0], qh[1], qh[2], qh[3]], block.at(16));
        ld_weights(k, how, [qh[4], qh[5], qh[6], qh[7]], block.at(32));
        let quants = k.add(k.reg(), block, s.qoff);
        let qs = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], quants);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], quants.at(16));
        Loaded { header, qh, qs }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![w.header[0], w.qh[0], w.qh[4], w.qs[0], w.qs[4]]
    }

    fn decode(k: &Kernel, (s, shift): &Self::Setup, w: &Loaded) -> Decoded {
        let Header {
            d,
            neg_dmin,
            scale,
            min,
        } = decode_header(k, s, w.header);
        let mut low = [k.reg::<U32>(); 8];
        let mut high = [k.reg::<U32>(); 8];
        for i in 0..8 {
            let bits = k.shr(k.reg(), w.qh[i], *shift);
            let top_lo = k.and(k.reg(), bits, 0x0101_0101u32);
            k.shl(top_lo, top_lo, 4u32);
            low[i] = k.lop3(k.reg(), w.qs[i], 0x0F0F_0F0Fu32, top_lo, and_or());
            let top_hi = k.and(k.reg(), bits, 0x0202_0202u32);
            k.shl(top_hi, top_hi, 3u32);
            let nib = k.shr(k.reg(), w.qs[i], 4u32);
            high[i] = k.lop3(k.reg(), nib, 0x0F0F_0F0Fu32, top_hi, and_or());
        }
        Decoded {
            d,
            neg_dmin,
            scale,
            min,
            low,
            high,
        }
    }

    fn dot(k: &Kernel, _s: &Self::Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
        let lo = k.s32(0);
        let hi = k.s32(0);
        for i in 0..8 {
            k.dp4a_with(Bytes::Unsigned, Bytes::Signed, lo, w.low[i], x.q[i], lo);
            k.dp4a_with(
                Bytes::Unsigned,
                Bytes::Signed,
                hi,
                w.high[i],
                x.q[8 + i],
                hi,
            );
        }
        k.mul(lo, lo, w.scale[0]);
        k.mul(hi, hi, w.scale[1]);
        let f_lo = k.cvt(k.reg::<F32>(), lo, FloatRound::Rn);
        let f_hi = k.cvt(k.reg::<F32>(), hi, FloatRound::Rn);
        let sum_d = k.mul(k.reg(), x.d[0], f_lo);
        k.fma(sum_d, x.d[1], f_hi, sum_d);
        let m0 = k.mul(k.reg(), x.sum[0], w.min[0]);
        let m1 = k.mul(k.reg(), x.sum[1], w.min[1]);
        let f_m0 = k.cvt(k.reg::<F32>(), m0, FloatRound::Rn);
        let f_m1 = k.cvt(k.reg::<F32>(), m1, FloatRound::Rn);
        let sum_m = k.mul(k.reg(), x.d[0], f_m0);
        k.fma(sum_m, x.d[1], f_m1, sum_m);
        k.fma(acc, w.d, sum_d, acc);
        k.fma(acc, w.neg_dmin, sum_m, acc);
    }
}
