//! Q8_0's staging for the f16 GEMMs (`super::f16`): Q8_0 prompts ran on the int8 GEMM,
//! which is slower there than llama.cpp's MMQ (pp512 0.97x on an H100, bench/RESULTS.md
//! 2026-11-27), where Q4_K's prompts gained 1.4x on the f16 GEMM.
//!
//! The rows are the GEMV's repacked ones (`formats::q8_0`: all quants, 256 bytes a tile,
//! then all f16 scales, 16 bytes a tile). Step `q` (weights `64 q..64 q + 64` of a tile) is
//! blocks `2 q` and `2 q + 1`; thread `tid` takes row `tid / 2` and block `2 q + c`
//! (`c = tid % 2`): its 32 quant bytes and the scale word of both blocks. A weight is `q d`
//! rounded once to a half, as the narrow GEMM makes it (`super::narrow_q8_0`): the signed
//! byte under the exponent of 1024 (`prmt`) with its sign bit flipped, `1152` subtracted
//! exactly, one `fma` with zero.

use smelt_ptx::{Kernel, Load, Reg, Store, B32, U32, U64};

use super::f16::{dequant_pair, GemmF16Format, Stage};
use crate::formats::Q8_0;
use crate::KernelError;

/// Per-thread constants of the Q8_0 staging.
pub struct Q8Setup {
    /// The thread's row's first byte.
    row: Reg<U64>,
    /// Offset of its block's quants in a tile's 256 bytes, in step 0 (`32 c`).
    qoff: Reg<U64>,
    /// Offset of the row's scales (`256 ntiles`).
    scales: Reg<U64>,
    /// The selector that puts its block's scale into both halves of a word.
    dsel: Reg<U32>,
    /// The bytes 0x64, the sign flips, 1152 and 0 as halves.
    high: Reg<B32>,
    flip: Reg<B32>,
    bias: Reg<B32>,
    zero: Reg<B32>,
    /// Shared address of its 32 halves.
    dst: Reg<U32>,
}

/// One step's loads: the block's eight quant words and the word of the step's two scales.
pub struct Q8Regs {
    q: [Reg<U32>; 8],
    d: Reg<U32>,
}

impl GemmF16Format for Q8_0 {
    const GEMM_F16_NAME: &'static str = "gemm_f16_q8_0";
    const GROUPED_NAME: &'static str = "gemm_f16_moe_q8_0";
    type StageSetup = Q8Setup;
    type StepRegs = Q8Regs;

    fn stage_setup(k: &Kernel, s: &Stage) -> Q8Setup {
        let r = k.shr(k.reg(), s.tid, 1u32);
        let c = k.and(k.reg(), s.tid, 1u32);
        // Tiles of the row: 272 bytes a tile, padded to 16 bytes.
        let ntiles = k.div_int(k.reg(), s.row_bytes(), 272u32);
        let scales = k.mul_wide(k.reg::<U64>(), ntiles, 256u32);
        // Halves 0 or 1 of the scale word into both halves: prmt selectors 0x1010, 0x3232.
        let dsel = k.mad(k.reg(), c, 0x2222u32, 0x1010u32);
        let dst = s.aq_row(k, r);
        k.mad(dst, c, 64u32, dst);
        Q8Setup {
            row: s.row(k, r),
            qoff: k.mul_wide(k.reg::<U64>(), c, 32u32),
            scales,
            dsel,
            high: k.mov(k.reg::<B32>(), 0x6464_6464u32),
            flip: k.mov(k.reg::<B32>(), 0x0080_0080u32),
            bias: k.mov(k.reg::<B32>(), 0x6480_6480u32),
            zero: k.mov(k.reg::<B32>(), 0u32),
            dst,
        }
    }

    fn step_regs(k: &Kernel) -> Q8Regs {
        Q8Regs {
            q: k.regs::<U32, 8>(),
            d: k.reg::<U32>(),
        }
    }

    fn load_step(k: &Kernel, c: &Q8Setup, regs: &Q8Regs, tile: Reg<U32>, q: u32) {
        let quants = k.add(k.reg(), c.row, k.mul_wide(k.reg::<U64>(), tile, 256u32));
        k.add(quants, quants, c.qoff);
        let w = &regs.q;
        let at = 64 * i64::from(q);
        k.ld_v4(Load::GLOBAL_NC, [w[0], w[1], w[2], w[3]], quants.at(at));
        k.ld_v4(
            Load::GLOBAL_NC,
            [w[4], w[5], w[6], w[7]],
            quants.at(at + 16),
        );
        let d = k.add(k.reg(), c.row, c.scales);
        k.add(d, d, k.mul_wide(k.reg::<U64>(), tile, 16u32));
        k.ld(Load::GLOBAL_NC, regs.d, d.at(4 * i64::from(q)));
    }

    fn stage_step(k: &Kernel, c: &Q8Setup, regs: &Q8Regs, _q: u32) {
        let d = k.prmt(k.reg::<B32>(), regs.d, regs.d, c.dsel);
        // Word i holds weights 4i..4i + 4: halves (4i, 4i + 2), then (4i + 1, 4i + 3), the
        // GEMM's K permutation.
        let out: Vec<Reg<B32>> = regs
            .q
            .iter()
            .flat_map(|&w| {
                [0x4240u32, 0x4341].map(|sel| {
                    let v = k.prmt(k.reg::<B32>(), w, c.high, sel);
                    let v = k.xor(v, v, c.flip);
                    dequant_pair(k, v, c.bias, d, c.zero)
                })
            })
            .collect();
        for (j, w) in out.chunks(4).enumerate() {
            k.st_v4(
                Store::SHARED,
                c.dst.at(16 * j as i64),
                [w[0], w[1], w[2], w[3]],
            );
        }
    }

    fn dequantize_row(ggml: &[u8], k: usize) -> Result<Vec<u16>, KernelError> {
        super::narrow_q8_0::dequantize_row(ggml, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_builds_and_its_twin_is_the_narrow_gemms() {
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        m.kernel(Q8_0::GEMM_F16_NAME, super::super::f16::kernel::<Q8_0>)
            .unwrap();
        let ptx = m.to_ptx();
        assert!(ptx.contains("prmt.b32") && ptx.contains("mma.sync"));
        let w: Vec<f32> = (0..256).map(|i| (i as f32 - 100.0) / 37.0).collect();
        let mut ggml = vec![0u8; 8 * 34];
        smelt_quant::quantize_row(crate::GgmlType::Q8_0, &w, &mut ggml).unwrap();
        assert_eq!(
            <Q8_0 as GemmF16Format>::dequantize_row(&ggml, 256).unwrap(),
            super::super::narrow_q8_0::dequantize_row(&ggml, 256).unwrap()
        );
    }
}
