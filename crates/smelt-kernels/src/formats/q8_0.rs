//! Q8_0 on the GPU. ggml's 34-byte blocks leave the quants 2-byte aligned, so a row is
//! repacked at upload into all its quants (32 bytes per block) followed by all its f16
//! scales, padded to 16 bytes. Rows whose length is not a multiple of 256 get zero blocks
//! up to the next tile, as the activations do. Thread `p` of a tile dots blocks `2p` and `2p + 1`: four
//! 16-byte loads of quants and one 4-byte load of both scales.

use smelt_ptx::{FloatRound, Kernel, Load, Reg, F32, U32, U64};

use super::{halves_to_f32, ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::ActRegs;
use crate::{padded_tiles, GgmlType, KernelError};

/// The Q8_0 format (repacked rows).
pub struct Q8_0;

/// Per-thread offsets.
pub struct Setup {
    /// Offset of the thread's quants in a tile's 256 quant bytes.
    qoff: Reg<U64>,
    /// Offset of the thread's two scales in the row (before the tile's 16 bytes).
    doff: Reg<U64>,
}

/// Raw loads of a thread's two blocks.
pub struct Loaded {
    qs: [Reg<U32>; 16],
    d: Reg<U32>,
}

impl GpuFormat for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const NAME: &'static str = "q8_0";
    type Setup = Setup;
    type Loaded = Loaded;
    type Decoded = ([Reg<U32>; 16], [Reg<F32>; 2]);

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(pad16(padded_tiles(k, "Q8_0 GEMV")? * 8 * 34))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        // Blocks of the padded row: the zero blocks past `k` have d = 0.
        let nb = k.div_ceil(256) * 8;
        let (quants, rest) = out.split_at_mut(32 * nb);
        for (b, block) in ggml.chunks_exact(34).enumerate() {
            quants[32 * b..32 * b + 32].copy_from_slice(&block[2..]);
            rest[2 * b..2 * b + 2].copy_from_slice(&block[..2]);
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Setup {
        let qoff = k.mul_wide(k.reg::<U64>(), part, 64u32);
        let scales = k.mul(k.reg(), ntiles, 256u32);
        let doff = k.mad(k.reg(), part, 4u32, scales);
        let doff = k.cvt(k.reg::<U64>(), doff, smelt_ptx::Exact);
        Setup { qoff, doff }
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        let b0 = k.shl(k.reg(), part, 1u32);
        let b1 = k.add(k.reg(), b0, 1u32);
        (b0, b1)
    }

    fn load(k: &Kernel, s: &Setup, row: Reg<U64>, tile: Reg<U32>, how: WeightLoad) -> Loaded {
        let tile_q = k.add(k.reg(), row, k.mul_wide(k.reg::<U64>(), tile, 256u32));
        let quants = k.add(k.reg(), tile_q, s.qoff);
        let qs = k.regs::<U32, 16>();
        for c in 0..4 {
            let words = [qs[4 * c], qs[4 * c + 1], qs[4 * c + 2], qs[4 * c + 3]];
            ld_weights(k, how, words, quants.at(16 * c as i64));
        }
        let scales = k.add(k.reg(), row, s.doff);
        let scales = k.add(scales, scales, k.mul_wide(k.reg::<U64>(), tile, 16u32));
        let d = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), scales);
        Loaded { qs, d }
    }

    fn load_words(w: &Loaded) -> Vec<Reg<U32>> {
        vec![w.qs[0], w.qs[4], w.qs[8], w.qs[12], w.d]
    }

    fn decode(k: &Kernel, _s: &Setup, w: &Loaded) -> Self::Decoded {
        (w.qs, halves_to_f32(k, w.d))
    }

    fn dot(k: &Kernel, _s: &Setup, w: &Self::Decoded, x: &ActRegs, acc: Reg<F32>) {
        let (qs, d) = w;
        for (b, (&dw, &dx)) in d.iter().zip(&x.d).enumerate() {
            let isum = k.s32(0);
            for (&q, &a) in qs[8 * b..8 * b + 8].iter().zip(&x.q[8 * b..8 * b + 8]) {
                k.dp4a(isum, q, a, isum);
            }
            let f = k.cvt(k.reg::<F32>(), isum, FloatRound::Rn);
            let scale = k.mul(k.reg(), dw, dx);
            k.fma(acc, scale, f, acc);
        }
    }
}
