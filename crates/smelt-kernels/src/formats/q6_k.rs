//! Q6_K on the GPU. ggml's 210-byte super-blocks are not 16-byte multiples, so a row is
//! repacked at upload field by field: all `ql` (128 bytes per super-block), all `qh` (64),
//! all scales (16), all `d` (2), padded to 16 bytes.
//!
//! Thread `p` of a tile works in half `h = p / 2` of the super-block, column group
//! `c = p % 2`: `ql` bytes `64h + 32c ..+32` hold weights `128h + 32c + l` (low nibbles)
//! and `128h + 64 + 32c + l` (high nibbles); their top two bits are bits `2c` and `4 + 2c`
//! of `qh` bytes `32h + l`. Values are `q - 32`: the 6-bit `q` is dotted as is and
//! `32 * sum(x)` taken off with a second `dp4a` against bytes of -32.

use smelt_ptx::{Bytes, FloatRound, Kernel, Load, Reg, F16, F32, S32, U32, U64};

use super::{ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::{and_or, ActRegs};
use crate::{tiles, GgmlType, KernelError};

/// The Q6_K format (repacked rows).
pub struct Q6K;

/// Per-thread offsets and shifts.
pub struct Setup {
    ql: Reg<U64>,
    qh: Reg<U64>,
    scales: Reg<U64>,
    d: Reg<U64>,
    /// Right shift that brings the thread's `qh` bits to bits 0-1 (low) and 4-5 (high).
    qh_shift: Reg<U32>,
    /// Bit positions of the thread's two scale bytes in each scale word.
    pos: [Reg<U32>; 2],
}

/// Raw loads of a thread's share of a super-block.
pub struct Loaded {
    ql: [Reg<U32>; 8],
    qh: [Reg<U32>; 8],
    scales: [Reg<U32>; 2],
    d: Reg<F16>,
}

/// A thread's 64 weights as bytes 0..64 (value + 32) with their four group scales.
pub struct Decoded {
    low: [Reg<U32>; 8],
    high: [Reg<U32>; 8],
    /// Scales of low groups 0, 1 and high groups 0, 1.
    scale: [Reg<S32>; 4],
    d: Reg<F32>,
}

impl GpuFormat for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const NAME: &'static str = "q6_k";
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(pad16(tiles(k, "Q6_K GEMV")? * 210))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        let n = k / 256;
        for (b, block) in ggml.chunks_exact(210).enumerate() {
            out[128 * b..128 * b + 128].copy_from_slice(&block[..128]);
            out[128 * n + 64 * b..128 * n + 64 * b + 64].copy_from_slice(&block[128..192]);
            out[192 * n + 16 * b..192 * n + 16 * b + 16].copy_from_slice(&block[192..208]);
            out[208 * n + 2 * b..208 * n + 2 * b + 2].copy_from_slice(&block[208..]);
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Setup {
        let half = k.shr(k.reg(), part, 1u32);
        let col = k.and(k.reg(), part, 1u32);
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let ql = k.mul_wide(k.reg::<U64>(), part, 32u32);
        let qh = k.mul(k.reg(), ntiles, 128u32);
        k.mad(qh, half, 32u32, qh);
        let scales = k.mul(k.reg(), ntiles, 192u32);
        k.mad(scales, half, 8u32, scales);
        let d = k.mul(k.reg(), ntiles, 208u32);
        let qh_shift = k.shl(k.reg(), col, 1u32);
        let pos0 = k.shl(k.reg(), col, 4u32);
        let pos1 = k.add(k.reg(), pos0, 8u32);
        Setup {
            ql,
            qh: wide(qh),
            scales: wide(scales),
            d: wide(d),
            qh_shift,
            pos: [pos0, pos1],
        }
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        // Low weights start at 128h + 32c = 32 * (4h + c), high ones 64 further.
        let half = k.shr(k.reg(), part, 1u32);
        let col = k.and(k.reg(), part, 1u32);
        let b0 = k.mad(k.reg(), half, 4u32, col);
        let b1 = k.add(k.reg(), b0, 2u32);
        (b0, b1)
    }

    fn load(k: &Kernel, s: &Setup, row: Reg<U64>, tile: Reg<U32>, how: WeightLoad) -> Loaded {
        let at = |base: Reg<U64>, stride: u32| {
            let a = k.add(k.reg(), row, base);
            k.add(a, a, k.mul_wide(k.reg::<U64>(), tile, stride))
        };
        let (ql_at, qh_at) = (at(s.ql, 128), at(s.qh, 64));
        let (sc_at, d_at) = (at(s.scales, 16), at(s.d, 2));
        let ql = k.regs::<U32, 8>();
        let qh = k.regs::<U32, 8>();
        ld_weights(k, how, [ql[0], ql[1], ql[2], ql[3]], ql_at);
        ld_weights(k, how, [ql[4], ql[5], ql[6], ql[7]], ql_at.at(16));
        ld_weights(k, how, [qh[0], qh[1], qh[2], qh[3]], qh_at);
        ld_weights(k, how, [qh[4], qh[5], qh[6], qh[7]], qh_at.at(16));
        let scales = k.regs::<U32, 2>();
        k.ld_v2(Load::GLOBAL_NC, scales, sc_at);
        let d = k.ld(Load::GLOBAL_NC, k.reg::<F16>(), d_at);
        Loaded { ql, qh, scales, d }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![w.ql[0], w.ql[4], w.qh[0], w.qh[4], w.scales[0]]
    }

    fn decode(k: &Kernel, s: &Setup, w: &Loaded) -> Decoded {
        let mut low = [k.reg::<U32>(); 8];
        let mut high = [k.reg::<U32>(); 8];
        for i in 0..8 {
            let bits = k.shr(k.reg(), w.qh[i], s.qh_shift);
            let top_lo = k.shl(k.reg(), bits, 4u32);
            k.and(top_lo, top_lo, 0x3030_3030u32);
            low[i] = k.lop3(k.reg(), w.ql[i], 0x0F0F_0F0Fu32, top_lo, and_or());
            let top_hi = k.and(k.reg(), bits, 0x3030_3030u32);
            let nib = k.shr(k.reg(), w.ql[i], 4u32);
            high[i] = k.lop3(k.reg(), nib, 0x0F0F_0F0Fu32, top_hi, and_or());
        }
        let sc = |word: Reg<U32>, p: Reg<U32>| k.bfe(k.reg::<S32>(), word.cast::<S32>(), p, 8u32);
        let scale = [
            sc(w.scales[0], s.pos[0]),
            sc(w.scales[0], s.pos[1]),
            sc(w.scales[1], s.pos[0]),
            sc(w.scales[1], s.pos[1]),
        ];
        let d = k.cvt(k.reg::<F32>(), w.d, smelt_ptx::Exact);
        Decoded {
            low,
            high,
            scale,
            d,
        }
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
        let minus32 = 0xE0E0_E0E0u32;
        let mut sums = Vec::with_capacity(2);
        for (b, quants) in [w.low, w.high].iter().enumerate() {
            let mut group = [k.s32(0), k.s32(0)];
            for (g, isum) in group.iter_mut().enumerate() {
                let xq = &x.q[8 * b + 4 * g..8 * b + 4 * g + 4];
                for (&q, &a) in quants[4 * g..4 * g + 4].iter().zip(xq) {
                    k.dp4a_with(Bytes::Unsigned, Bytes::Signed, *isum, q, a, *isum);
                    k.dp4a(*isum, minus32, a, *isum);
                }
            }
            let scaled = k.mul(k.reg(), group[0], w.scale[2 * b]);
            k.mad(scaled, group[1], w.scale[2 * b + 1], scaled);
            sums.push(k.cvt(k.reg::<F32>(), scaled, FloatRound::Rn));
        }
        let total = k.mul(k.reg(), x.d[0], sums[0]);
        k.fma(total, x.d[1], sums[1], total);
        k.fma(acc, w.d, total, acc);
    }
}
