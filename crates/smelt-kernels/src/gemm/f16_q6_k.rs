//! Q6_K's staging for the f16 GEMMs (`super::f16`): Q4_K_M files keep some layers' expert
//! down projections (and `attn_v`) in Q6_K, so the grouped GEMM (`super::grouped`) needs
//! it beside Q4_K. The rows are the GEMV's repacked ones (`formats::q6_k`: all `ql`, all
//! `qh`, all scales, all `d`).
//!
//! Step `q` (weights `64 q..64 q + 64` of a 256-weight tile) lies in half `h = q / 2` of
//! the super-block; thread `tid` takes row `tid / 2` and the step's weights `32 c..32 c +
//! 32` (`c = tid % 2`): `ql` bytes `64 h + 32 c + l` (low nibbles in even steps, high in
//! odd), the 2-bit field at `2 c + 4 (q % 2)` of `qh` bytes `32 h + l`, and scales `4 q +
//! 2 c` (weights 0-15) and `+ 1` (16-31): ggml's `dequantize_row_q6_K` order. Even steps
//! load `ql`, `qh` and both steps' scales; odd steps reuse them.
//!
//! A weight is `(q - 32) * A` rounded once to f16, `A = d * sc` rounded to f16 once: the
//! 6-bit value becomes the half `1024 + q` (nibble, high bits and the exponent of 1024 in
//! two `lop3`), `1056` is subtracted exactly, and one `fma` with zero scales it.

use half::f16 as h16;
use smelt_ptx::{FloatRound, Kernel, Load, Reg, B32, F16, F32, S32, U32, U64};

use super::f16::{dequant_pair, nibble_pair, GemmF16Format, Stage};
use crate::act::and_or;
use crate::formats::Q6K;
use crate::{KernelError, TILE};

/// Per-thread constants of the Q6_K staging.
pub struct Q6KSetup {
    /// The thread's row's first byte.
    row: Reg<U64>,
    /// Offset of its `ql` bytes in tile 0, half 0 (`32 c`).
    ql: Reg<U64>,
    /// Offsets of the row's `qh`, scales and `d` arrays.
    qh: Reg<U64>,
    sc: Reg<U64>,
    d: Reg<U64>,
    /// Right shifts bringing the thread's `qh` field to bits 0-1 of each byte: even, odd
    /// steps.
    hsh: [Reg<U32>; 2],
    /// Bit position of the thread's first scale byte in a step's scale word (`16 c`).
    pos: Reg<U32>,
    /// Shared address of its 32 halves.
    dst: Reg<U32>,
}

/// A thread's loads of an even step and the odd one after it.
pub struct Q6KRegs {
    /// `ql` bytes (8 words), then `qh` bytes (8 words).
    q: [Reg<U32>; 16],
    /// The scales of the two steps (4 bytes each).
    sc: [Reg<U32>; 2],
    d: Reg<F16>,
}

impl GemmF16Format for Q6K {
    const GEMM_F16_NAME: &'static str = "gemm_f16_q6_k";
    const GROUPED_NAME: &'static str = "gemm_f16_moe_q6_k";
    /// Its 19 step registers (a pair of steps' `ql`, `qh` and scales, loaded a step ahead)
    /// spilled 52 bytes at 128 registers a thread: one block an SM (185 registers).
    const BLOCKS_PER_SM: u32 = 1;
    type StageSetup = Q6KSetup;
    type StepRegs = Q6KRegs;

    fn stage_setup(k: &Kernel, s: &Stage) -> Q6KSetup {
        let r = k.shr(k.reg(), s.tid, 1u32);
        let c = k.and(k.reg(), s.tid, 1u32);
        // Tiles of the row: its repacked bytes are 210 a tile plus under 16 of padding.
        let ntiles = k.div_int(k.reg(), s.row_bytes(), 210u32);
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let qh = k.mul(k.reg(), ntiles, 128u32);
        let sc = k.mul(k.reg(), ntiles, 192u32);
        let d = k.mul(k.reg(), ntiles, 208u32);
        let even = k.shl(k.reg(), c, 1u32);
        let odd = k.add(k.reg(), even, 4u32);
        let dst = s.aq_row(k, r);
        k.mad(dst, c, 64u32, dst);
        Q6KSetup {
            row: s.row(k, r),
            ql: k.mul_wide(k.reg::<U64>(), c, 32u32),
            qh: wide(qh),
            sc: wide(sc),
            d: wide(d),
            hsh: [even, odd],
            pos: k.shl(k.reg(), c, 4u32),
            dst,
        }
    }

    fn step_regs(k: &Kernel) -> Q6KRegs {
        Q6KRegs {
            q: k.regs::<U32, 16>(),
            sc: k.regs::<U32, 2>(),
            d: k.reg::<F16>(),
        }
    }

    fn load_step(k: &Kernel, c: &Q6KSetup, regs: &Q6KRegs, tile: Reg<U32>, q: u32) {
        if q % 2 == 1 {
            return;
        }
        let h = i64::from(q / 2);
        let at = |base: Reg<U64>, stride: u32| {
            let a = k.add(k.reg(), c.row, base);
            k.add(a, a, k.mul_wide(k.reg::<U64>(), tile, stride))
        };
        let ql = at(c.ql, 128);
        let qh = at(c.qh, 64);
        let w = &regs.q;
        k.ld_v4(Load::GLOBAL_NC, [w[0], w[1], w[2], w[3]], ql.at(64 * h));
        k.ld_v4(
            Load::GLOBAL_NC,
            [w[4], w[5], w[6], w[7]],
            ql.at(64 * h + 16),
        );
        k.ld_v4(Load::GLOBAL_NC, [w[8], w[9], w[10], w[11]], qh.at(32 * h));
        k.ld_v4(
            Load::GLOBAL_NC,
            [w[12], w[13], w[14], w[15]],
            qh.at(32 * h + 16),
        );
        k.ld_v2(Load::GLOBAL_NC, regs.sc, at(c.sc, 16).at(4 * i64::from(q)));
        if q == 0 {
            k.ld(Load::GLOBAL_NC, regs.d, at(c.d, 2));
        }
    }

    fn stage_step(k: &Kernel, c: &Q6KSetup, regs: &Q6KRegs, q: u32) {
        let odd = (q % 2) as usize;
        let d = k.cvt(k.reg::<F32>(), regs.d, smelt_ptx::Exact);
        let word = regs.sc[odd].cast::<S32>();
        let scale: Vec<Reg<B32>> = (0..2u32)
            .map(|g| {
                let p = k.add(k.reg(), c.pos, 8 * g);
                let sc = k.bfe(k.reg::<S32>(), word, p, 8u32);
                let a = k.mul(k.reg(), d, k.cvt(k.reg::<F32>(), sc, FloatRound::Rn));
                k.cvt_f16x2(k.reg(), a, a)
            })
            .collect();
        let magic = k.mov(k.reg::<B32>(), 0x6400_6400u32);
        let bias = k.mov(k.reg::<B32>(), 0x6420_6420u32);
        let zero = k.mov(k.reg::<B32>(), 0u32);
        let nib = 4 * odd as u32;
        let mut out = Vec::with_capacity(16);
        for i in 0..8 {
            let (wq, wh) = (regs.q[i], regs.q[8 + i]);
            let t = k.shr(k.reg(), wh, c.hsh[odd]);
            // Bytes 0 and 2 (weights 4i, 4i + 2), then 1 and 3, each with its high bits
            // moved to bits 4-5 of its half.
            let high = [k.shl(k.reg(), t, 4u32), k.shr(k.reg(), t, 4u32)];
            for (j, hb) in high.into_iter().enumerate() {
                let v = nibble_pair(k, wq, nib + 8 * j as u32, magic);
                let v = k.lop3(k.reg::<B32>(), hb, 0x0030_0030u32, v, and_or());
                out.push(dequant_pair(k, v, bias, scale[i / 4], zero));
            }
        }
        for (j, w) in out.chunks(4).enumerate() {
            k.st_v4(
                smelt_ptx::Store::SHARED,
                c.dst.at(16 * j as i64),
                [w[0], w[1], w[2], w[3]],
            );
        }
    }

    fn dequantize_row(ggml: &[u8], k: usize) -> Result<Vec<u16>, KernelError> {
        if k % TILE != 0 || ggml.len() != k / TILE * 210 {
            return Err(KernelError::BadLength {
                what: "Q6_K row",
                got: ggml.len(),
                want: k / TILE * 210,
            });
        }
        let mut out = vec![0u16; k];
        for (b, blk) in ggml.chunks(210).enumerate() {
            let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
            let d = h16::from_bits(u16::from_le_bytes([blk[208], blk[209]])).to_f32();
            for n in 0..2 {
                for l in 0..32 {
                    let (lo, hi) = (ql[64 * n + l], ql[64 * n + l + 32]);
                    let bits = qh[32 * n + l];
                    let q = [
                        (lo & 0xF) | ((bits & 3) << 4),
                        (hi & 0xF) | (((bits >> 2) & 3) << 4),
                        (lo >> 4) | (((bits >> 4) & 3) << 4),
                        (hi >> 4) | (((bits >> 6) & 3) << 4),
                    ];
                    for (j, &qj) in q.iter().enumerate() {
                        let s = sc[8 * n + l / 16 + 2 * j] as i8;
                        let a = h16::from_f32(d * f32::from(s)).to_f64();
                        let w = h16::from_f64((f64::from(qj) - 32.0) * a);
                        out[256 * b + 128 * n + 32 * j + l] = w.to_bits();
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    #[test]
    fn q6_k_twin_weights_match_ggml_dequantization_to_half_precision() {
        let k = 512;
        let w: Vec<f32> = (0..k)
            .map(|i| ((i * 53) % 127) as f32 / 60.0 - 1.05)
            .collect();
        let mut ggml = vec![0u8; k / TILE * 210];
        smelt_quant::quantize_row(GgmlType::Q6_K, &w, &mut ggml).unwrap();
        let mut exact = vec![0f32; k];
        smelt_quant::dequantize_row(GgmlType::Q6_K, &ggml, &mut exact).unwrap();
        let h = <Q6K as GemmF16Format>::dequantize_row(&ggml, k).unwrap();
        // (q - 32) A with A rounded to a half: 2^-11 relative twice at most.
        for (i, (&b, &e)) in h.iter().zip(&exact).enumerate() {
            let got = h16::from_bits(b).to_f32();
            assert!(
                (got - e).abs() <= 1.5e-3 * e.abs() + 1e-6,
                "weight {i}: {got} vs {e}"
            );
        }
        assert!(<Q6K as GemmF16Format>::dequantize_row(&ggml[..210], k).is_err());
    }
}
