//! Q4_K on the GPU: ggml's 144-byte super-blocks as they are (a multiple of 16 bytes).
//!
//! Thread `p` of a tile takes quant bytes `32p..32p + 32`, which hold weights `64p..64p+32`
//! (low nibbles, sub-block `2p`) and `64p+32..64p+64` (high nibbles, sub-block `2p+1`).
//! It loads the 16-byte header (d, dmin, 12 scale bytes) and its 32 quant bytes: three
//! 16-byte loads for 64 weights. High nibbles are masked in place (`& 0xF0`) rather than
//! shifted: the factor 16 is folded into the activation scale.

use smelt_ptx::{Bytes, Cmp, FloatRound, Kernel, Pred, Reg, F32, S32, U32, U64};

use super::{halves_to_f32, ld_weights, GpuFormat, WeightLoad};
use crate::act::{and_or, ActRegs};
use crate::{tiles, GgmlType, KernelError};

/// Bytes of a Q4_K super-block.
const BLOCK: u32 = 144;

/// The Q4_K format.
pub struct Q4K;

/// Per-thread constants: where the thread's quants sit and how its scale bytes decode.
pub struct Setup {
    /// Byte offset of the thread's quants in a super-block.
    pub(crate) qoff: Reg<U64>,
    /// The thread's sub-blocks are 4..8 (the split 6-bit encoding).
    upper: Reg<Pred>,
    /// `0x3F` bytes for sub-blocks 0..4, `0x0F` for 4..8.
    mask_lo: Reg<U32>,
    /// `0xC0` bytes for sub-blocks 4..8 (the top bits kept in the first eight bytes).
    mask_hi: Reg<U32>,
    /// Right shift of the min bytes: 0, or 4 for sub-blocks 4..8.
    min_shift: Reg<U32>,
    /// Bit position of the thread's first scale byte in a decoded word.
    pos: [Reg<U32>; 2],
}

/// The raw loads of one super-block.
pub struct Loaded {
    header: [Reg<U32>; 4],
    qs: [Reg<U32>; 8],
}

/// One super-block unpacked for the dot products.
pub struct Decoded {
    d: Reg<F32>,
    neg_dmin: Reg<F32>,
    scale: [Reg<S32>; 2],
    min: [Reg<S32>; 2],
    low: [Reg<U32>; 8],
    high: [Reg<U32>; 8],
}

impl GpuFormat for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const NAME: &'static str = "q4_k";
    const COMPACT: bool = true;
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(tiles(k, "Q4_K GEMV")? * BLOCK as usize)
    }

    fn repack_row(ggml: &[u8], _k: usize, out: &mut [u8]) {
        out.copy_from_slice(ggml);
    }

    fn setup(k: &Kernel, part: Reg<U32>, _ntiles: Reg<U32>) -> Setup {
        setup_with_quants_at(k, part, 16)
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        let b0 = k.shl(k.reg(), part, 1u32);
        let b1 = k.add(k.reg(), b0, 1u32);
        (b0, b1)
    }

    fn load(k: &Kernel, s: &Setup, row: Reg<U64>, tile: Reg<U32>, how: WeightLoad) -> Loaded {
        let block = k.add(k.reg(), row, k.mul_wide(k.reg::<U64>(), tile, BLOCK));
        let header = k.regs::<U32, 4>();
        ld_weights(k, how, header, block);
        let quants = k.add(k.reg(), block, s.qoff);
        let qs = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], quants);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], quants.at(16));
        Loaded { header, qs }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![w.header[0], w.qs[0], w.qs[4]]
    }

    fn decode(k: &Kernel, s: &Setup, w: &Loaded) -> Decoded {
        let Header {
            d,
            neg_dmin,
            scale,
            min,
        } = decode_header(k, s, w.header);
        let low = w.qs.map(|q| k.and(k.reg(), q, 0x0F0F_0F0Fu32));
        let high = w.qs.map(|q| k.and(k.reg(), q, 0xF0F0_F0F0u32));
        Decoded {
            d,
            neg_dmin,
            scale,
            min,
            low,
            high,
        }
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
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
        // sum_d = d8_0 * (lo * sc0) + d8_1 / 16 * (16 hi * sc1)
        k.mul(lo, lo, w.scale[0]);
        k.mul(hi, hi, w.scale[1]);
        let f_lo = k.cvt(k.reg::<F32>(), lo, FloatRound::Rn);
        let f_hi = k.cvt(k.reg::<F32>(), hi, FloatRound::Rn);
        let d8_hi = k.mul(k.reg(), x.d[1], 0.0625f32);
        let sum_d = k.mul(k.reg(), x.d[0], f_lo);
        k.fma(sum_d, d8_hi, f_hi, sum_d);
        // sum_m = d8_0 * (sum0 * m0) + d8_1 * (sum1 * m1)
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

/// The per-thread setup of the 144/176-byte K-quant super-blocks (Q4_K, Q5_K): the thread's
/// quant bytes start at `quants_at + 32 * part`.
pub(crate) fn setup_with_quants_at(k: &Kernel, part: Reg<U32>, quants_at: u32) -> Setup {
    let qoff = k.mad(k.reg(), part, 32u32, quants_at);
    let qoff = k.cvt(k.reg::<U64>(), qoff, smelt_ptx::Exact);
    let upper = k.cmp(Cmp::Ge, part, 2u32);
    let mask_lo = k.selp(k.reg(), 0x0F0F_0F0Fu32, 0x3F3F_3F3Fu32, upper);
    let mask_hi = k.selp(k.reg(), 0xC0C0_C0C0u32, 0u32, upper);
    let min_shift = k.selp(k.reg(), 4u32, 0u32, upper);
    let odd = k.and(k.reg(), part, 1u32);
    let pos0 = k.shl(k.reg(), odd, 4u32);
    let pos1 = k.add(k.reg(), pos0, 8u32);
    Setup {
        qoff,
        upper,
        mask_lo,
        mask_hi,
        min_shift,
        pos: [pos0, pos1],
    }
}

/// `d`, `-dmin` and the thread's two 6-bit scales and mins from a K-quant header (`d|dmin`
/// and the 12 scale bytes, as four words).
pub(crate) fn decode_header(k: &Kernel, s: &Setup, header: [Reg<U32>; 4]) -> Header {
    let [dm, s0, s1, s2] = header;
    // ggml's get_scale_min_k4 on four bytes at once, then the thread's two bytes.
    // Sub-blocks 0..4: scale = s0 & 63, min = s1 & 63. Sub-blocks 4..8: scale =
    // (s2 & 0xF) | (s0 >> 6) << 4, min = (s2 >> 4) | (s1 >> 6) << 4.
    let scale_src = k.selp(k.reg::<U32>(), s2, s0, s.upper);
    let min_src = k.selp(k.reg::<U32>(), s2, s1, s.upper);
    let top_s = k.and(k.reg(), s0, s.mask_hi);
    k.shr(top_s, top_s, 2u32);
    let scales = k.lop3(k.reg::<U32>(), scale_src, s.mask_lo, top_s, and_or());
    let top_m = k.and(k.reg(), s1, s.mask_hi);
    k.shr(top_m, top_m, 2u32);
    let min_src = k.shr(min_src, min_src, s.min_shift);
    let mins = k.lop3(k.reg::<U32>(), min_src, s.mask_lo, top_m, and_or());
    let scale = s
        .pos
        .map(|p| k.bfe(k.reg::<U32>(), scales, p, 8u32).cast::<S32>());
    let min = s
        .pos
        .map(|p| k.bfe(k.reg::<U32>(), mins, p, 8u32).cast::<S32>());
    let [d, dmin] = halves_to_f32(k, dm);
    let neg_dmin = k.neg(dmin, dmin);
    Header {
        d,
        neg_dmin,
        scale,
        min,
    }
}

/// A K-quant header decoded for one thread.
pub(crate) struct Header {
    pub(crate) d: Reg<F32>,
    pub(crate) neg_dmin: Reg<F32>,
    pub(crate) scale: [Reg<S32>; 2],
    pub(crate) min: [Reg<S32>; 2],
}
