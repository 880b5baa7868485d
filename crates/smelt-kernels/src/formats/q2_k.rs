//! Q2_K on the GPU. ggml's 84-byte super-blocks are repacked per row into all quants (64
//! bytes per super-block), all group scales (16), all `d|dmin` pairs (4), padded to 16.
//!
//! In each 128-weight half `h`, bits `2j..2j+2` of quant byte `32h + l` belong to weight
//! `128h + 32j + l`. Thread `p` (half `h = p / 2`, `c = p % 2`) reads the half's 32 bytes
//! and takes runs `j = 2c, 2c + 1`: weights `64p .. 64p + 64`, so its four group scales
//! (low nibble scale, high nibble min) are the four bytes `4p..4p + 4`, one 4-byte load.
//! The minimum term needs activation sums per 16 weights: one `dp4a` against ones per word.

use smelt_ptx::{Bytes, FloatRound, Kernel, Load, Reg, F32, S32, U32, U64};

use super::{halves_to_f32, ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::ActRegs;
use crate::{tiles, GgmlType, KernelError};

/// The Q2_K format (repacked rows).
pub struct Q2K;

/// Per-thread offsets and the shift that brings its two runs to bits 0-1 and 2-3.
pub struct Setup {
    qs: Reg<U64>,
    scales: Reg<U64>,
    dm: Reg<U64>,
    shift: Reg<U32>,
}

/// Raw loads of a thread's share of a super-block.
pub struct Loaded {
    qs: [Reg<U32>; 8],
    scales: Reg<U32>,
    dm: Reg<U32>,
}

/// Quant bytes (0..4) of the two runs, the four groups' scales and mins, `d`, `-dmin`.
pub struct Decoded {
    q: [Reg<U32>; 16],
    scale: [Reg<S32>; 4],
    min: [Reg<S32>; 4],
    d: Reg<F32>,
    neg_dmin: Reg<F32>,
}

impl GpuFormat for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const NAME: &'static str = "q2_k";
    const COMPACT: bool = true;
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(pad16(tiles(k, "Q2_K GEMV")? * 84))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        let n = k / 256;
        for (b, block) in ggml.chunks_exact(84).enumerate() {
            out[64 * b..64 * b + 64].copy_from_slice(&block[16..80]);
            out[64 * n + 16 * b..64 * n + 16 * b + 16].copy_from_slice(&block[..16]);
            out[80 * n + 4 * b..80 * n + 4 * b + 4].copy_from_slice(&block[80..84]);
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Setup {
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let half = k.shr(k.reg(), part, 1u32);
        let qs = k.mul_wide(k.reg::<U64>(), half, 32u32);
        let scales = k.mul(k.reg(), ntiles, 64u32);
        k.mad(scales, part, 4u32, scales);
        let dm = k.mul(k.reg(), ntiles, 80u32);
        let col = k.and(k.reg(), part, 1u32);
        let shift = k.shl(k.reg(), col, 2u32);
        Setup {
            qs,
            scales: wide(scales),
            dm: wide(dm),
            shift,
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
        let qs_at = at(s.qs, 64);
        let qs = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], qs_at);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], qs_at.at(16));
        let scales = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), at(s.scales, 16));
        let dm = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), at(s.dm, 4));
        Loaded { qs, scales, dm }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![w.qs[0], w.qs[4], w.scales, w.dm]
    }

    fn decode(k: &Kernel, s: &Setup, w: &Loaded) -> Decoded {
        let mut q = [k.reg::<U32>(); 16];
        for i in 0..8 {
            let t = k.shr(k.reg(), w.qs[i], s.shift);
            q[i] = k.and(k.reg(), t, 0x0303_0303u32);
            let t2 = k.shr(k.reg(), t, 2u32);
            q[8 + i] = k.and(t2, t2, 0x0303_0303u32);
        }
        let field = |pos: u32| k.bfe(k.reg::<U32>(), w.scales, pos, 4u32).cast::<S32>();
        let scale = std::array::from_fn(|g| field(8 * g as u32));
        let min = std::array::from_fn(|g| field(8 * g as u32 + 4));
        let [d, dmin] = halves_to_f32(k, w.dm);
        let neg_dmin = k.neg(dmin, dmin);
        Decoded {
            q,
            scale,
            min,
            d,
            neg_dmin,
        }
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
        let mut sums_d = Vec::with_capacity(2);
        let mut sums_m = Vec::with_capacity(2);
        for r in 0..2 {
            let (sd, sm) = (k.s32(0), k.s32(0));
            for g in 0..2 {
                let (iq, ia) = (k.s32(0), k.s32(0));
                for i in 4 * g..4 * g + 4 {
                    let a = x.q[8 * r + i];
                    k.dp4a_with(Bytes::Unsigned, Bytes::Signed, iq, w.q[8 * r + i], a, iq);
                    k.dp4a_with(Bytes::Unsigned, Bytes::Signed, ia, 0x0101_0101u32, a, ia);
                }
                k.mad(sd, iq, w.scale[2 * r + g], sd);
                k.mad(sm, ia, w.min[2 * r + g], sm);
            }
            sums_d.push(k.cvt(k.reg::<F32>(), sd, FloatRound::Rn));
            sums_m.push(k.cvt(k.reg::<F32>(), sm, FloatRound::Rn));
        }
        let total_d = k.mul(k.reg(), x.d[0], sums_d[0]);
        k.fma(total_d, x.d[1], sums_d[1], total_d);
        let total_m = k.mul(k.reg(), x.d[0], sums_m[0]);
        k.fma(total_m, x.d[1], sums_m[1], total_m);
        k.fma(acc, w.d, total_d, acc);
        k.fma(acc, w.neg_dmin, total_m, acc);
    }
}
