//! Q3_K on the GPU. ggml's 110-byte super-blocks are repacked per row into all `hmask`
//! (32 bytes per super-block), all `qs` (64), all scales (12), all `d` (2), padded to 16.
//!
//! Quants are laid out as Q2_K's, plus a third bit: bit `4h + j` of `hmask` byte `l`
//! belongs to weight `128h + 32j + l`; set means `q2`, clear `q2 - 4`. Thread `p` (half
//! `h = p / 2`, runs `j = 2c, 2c + 1` with `c = p % 2`) takes weights `64p..64p + 64`, whose
//! four 6-bit group scales are word `p` of ggml's unpacked scale array: low nibbles from
//! word `p % 2` (shifted by 4 for `p >= 2`), top bits from word 2 shifted by `2p`. The
//! quant is dotted as `q2 | h << 2` (0..7) and `4 * sum(x)` taken off with a second `dp4a`.

use smelt_ptx::{Bytes, Cmp, FloatRound, Kernel, Load, Pred, Reg, F16, F32, S32, U32, U64};

use super::{ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::{and_or, ActRegs};
use crate::{tiles, GgmlType, KernelError};

/// The Q3_K format (repacked rows).
pub struct Q3K;

/// Per-thread offsets and shifts.
pub struct Setup {
    qs: Reg<U64>,
    hmask: Reg<U64>,
    scales: Reg<U64>,
    d: Reg<U64>,
    /// `4c`: brings the thread's two runs of `qs` to bits 0-1 and 2-3.
    q_shift: Reg<U32>,
    /// `4h + 2c`: brings the runs' `hmask` bits to bits 0 and 1.
    h_shift: Reg<U32>,
    /// The thread's low nibbles are in scale word 1 (odd `p`).
    odd: Reg<Pred>,
    /// 4 for `p >= 2` (high nibbles of the scale words).
    nib_shift: Reg<U32>,
    /// `2p`: the top bits' position in scale word 2.
    top_shift: Reg<U32>,
}

/// Raw loads of a thread's share of a super-block.
pub struct Loaded {
    qs: [Reg<U32>; 8],
    hmask: [Reg<U32>; 8],
    scales: [Reg<U32>; 3],
    d: Reg<F16>,
}

/// The two runs' quants (0..8, value + 4), the four group scales, `d`.
pub struct Decoded {
    q: [Reg<U32>; 16],
    scale: [Reg<S32>; 4],
    d: Reg<F32>,
}

impl GpuFormat for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const NAME: &'static str = "q3_k";
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = Decoded;

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(pad16(tiles(k, "Q3_K GEMV")? * 110))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        let n = k / 256;
        for (b, block) in ggml.chunks_exact(110).enumerate() {
            out[64 * b..64 * b + 64].copy_from_slice(&block[32..96]);
            out[64 * n + 32 * b..64 * n + 32 * b + 32].copy_from_slice(&block[..32]);
            out[96 * n + 12 * b..96 * n + 12 * b + 12].copy_from_slice(&block[96..108]);
            out[108 * n + 2 * b..108 * n + 2 * b + 2].copy_from_slice(&block[108..]);
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Setup {
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let half = k.shr(k.reg(), part, 1u32);
        let col = k.and(k.reg(), part, 1u32);
        let qs = k.mul_wide(k.reg::<U64>(), half, 32u32);
        let hmask = k.mul(k.reg(), ntiles, 64u32);
        let scales = k.mul(k.reg(), ntiles, 96u32);
        let d = k.mul(k.reg(), ntiles, 108u32);
        let q_shift = k.shl(k.reg(), col, 2u32);
        let h_shift = k.shl(k.reg(), half, 2u32);
        k.mad(h_shift, col, 2u32, h_shift);
        let odd = k.cmp(Cmp::Eq, col, 1u32);
        let nib_shift = k.shl(k.reg(), half, 2u32);
        let top_shift = k.shl(k.reg(), part, 1u32);
        Setup {
            qs,
            hmask: wide(hmask),
            scales: wide(scales),
            d: wide(d),
            q_shift,
            h_shift,
            odd,
            nib_shift,
            top_shift,
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
        let (qs_at, hm_at) = (at(s.qs, 64), at(s.hmask, 32));
        let qs = k.regs::<U32, 8>();
        let hmask = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], qs_at);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], qs_at.at(16));
        ld_weights(k, how, [hmask[0], hmask[1], hmask[2], hmask[3]], hm_at);
        ld_weights(
            k,
            how,
            [hmask[4], hmask[5], hmask[6], hmask[7]],
            hm_at.at(16),
        );
        let sc_at = at(s.scales, 12);
        let scales = k.regs::<U32, 3>();
        for (i, w) in scales.iter().enumerate() {
            k.ld(Load::GLOBAL_NC, *w, sc_at.at(4 * i as i64));
        }
        let d = k.ld(Load::GLOBAL_NC, k.reg::<F16>(), at(s.d, 2));
        Loaded {
            qs,
            hmask,
            scales,
            d,
        }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![
            w.qs[0],
            w.qs[4],
            w.hmask[0],
            w.hmask[4],
            w.scales[0],
            w.scales[2],
        ]
    }

    fn decode(k: &Kernel, s: &Setup, w: &Loaded) -> Decoded {
        let mut q = [k.reg::<U32>(); 16];
        for i in 0..8 {
            let t = k.shr(k.reg(), w.qs[i], s.q_shift);
            let h = k.shr(k.reg(), w.hmask[i], s.h_shift);
            let h0 = k.and(k.reg(), h, 0x0101_0101u32);
            k.shl(h0, h0, 2u32);
            q[i] = k.lop3(k.reg(), t, 0x0303_0303u32, h0, and_or());
            let h1 = k.and(k.reg(), h, 0x0202_0202u32);
            k.shl(h1, h1, 1u32);
            let t1 = k.shr(k.reg(), t, 2u32);
            q[8 + i] = k.lop3(k.reg(), t1, 0x0303_0303u32, h1, and_or());
        }
        // ggml's scale unpacking, for the thread's word only.
        let low = k.selp(k.reg::<U32>(), w.scales[1], w.scales[0], s.odd);
        k.shr(low, low, s.nib_shift);
        let top = k.shr(k.reg(), w.scales[2], s.top_shift);
        k.and(top, top, 0x0303_0303u32);
        k.shl(top, top, 4u32);
        let word = k.lop3(k.reg::<U32>(), low, 0x0F0F_0F0Fu32, top, and_or());
        let scale = std::array::from_fn(|g| {
            let b = k
                .bfe(k.reg::<U32>(), word, 8 * g as u32, 8u32)
                .cast::<S32>();
            k.sub(b, b, 32i32)
        });
        let d = k.cvt(k.reg::<F32>(), w.d, smelt_ptx::Exact);
        Decoded { q, scale, d }
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Decoded, x: &ActRegs, acc: Reg<F32>) {
        let minus4 = 0xFCFC_FCFCu32;
        let mut sums = Vec::with_capacity(2);
        for r in 0..2 {
            let sd = k.s32(0);
            for g in 0..2 {
                let iq = k.s32(0);
                for i in 4 * g..4 * g + 4 {
                    let a = x.q[8 * r + i];
                    k.dp4a_with(Bytes::Unsigned, Bytes::Signed, iq, w.q[8 * r + i], a, iq);
                    k.dp4a(iq, minus4, a, iq);
                }
                k.mad(sd, iq, w.scale[2 * r + g], sd);
            }
            sums.push(k.cvt(k.reg::<F32>(), sd, FloatRound::Rn));
        }
        let total = k.mul(k.reg(), x.d[0], sums[0]);
        k.fma(total, x.d[1], sums[1], total);
        k.fma(acc, w.d, total, acc);
    }
}
