//! IQ4_NL and IQ4_XS on the GPU: 4-bit indices into ggml's 16-level table
//! (`kvalues_iq4nl`), looked up four at a time with `prmt`.
//!
//! `prmt` picks bytes of an 8-byte pair by 3-bit selectors, so a lookup runs over both
//! halves of the table (entries 0..8 and 8..16) with the indices' low three bits and then
//! picks per byte by the fourth bit, as ggml's CUDA `get_int_from_table_16` does. A quant
//! word (eight nibbles: low and high nibble of four bytes) becomes two words of int8
//! levels: the low nibbles' (weights `j..j+4`) and the high nibbles' (`j+16..j+20`).
//!
//! IQ4_NL blocks (f16 `d`, 16 quant bytes) are Q4_0's layout and reuse its repacked rows.
//! IQ4_XS super-blocks (136 bytes) are repacked per row into all quants (128 bytes per
//! super-block), all `scales_l` (4), all `scales_h` (2), all `d` (2), padded to 16.

use smelt_ptx::{Bytes, FloatRound, Kernel, Load, Narrow, Reg, F16, F32, S32, U32, U64};
use smelt_quant::iq4::KVALUES_IQ4NL;

use super::legacy::{self, Q4_0};
use super::{halves_to_f32, ld_weights, pad16, GpuFormat, WeightLoad};
use crate::act::ActRegs;
use crate::{padded_tiles, tiles, GgmlType, KernelError};

/// The table as four little-endian words, entries `4w..4w + 4` in word `w`.
pub(crate) fn table_words() -> [u32; 4] {
    std::array::from_fn(|w| {
        u32::from_le_bytes(std::array::from_fn(|b| KVALUES_IQ4NL[4 * w + b] as u8))
    })
}

/// The table in registers, loaded once per thread.
#[derive(Clone, Copy)]
pub struct Table([Reg<U32>; 4]);

impl Table {
    pub(crate) fn new(k: &Kernel) -> Self {
        Self(table_words().map(|w| k.u32(w)))
    }

    /// Levels of the eight nibbles of `q`: (low nibbles, high nibbles), four int8 each.
    pub(crate) fn lookup(&self, k: &Kernel, q: Reg<U32>) -> [Reg<U32>; 2] {
        let [t0, t1, t2, t3] = self.0;
        let index = k.and(k.reg::<U32>(), q, 0x7777_7777u32);
        let upper = k.and(k.reg::<U32>(), q, 0x8888_8888u32);
        k.shr(upper, upper, 1u32);
        let pick = k.or(upper, upper, 0x3210_3210u32);
        let halves: [Reg<U32>; 2] = std::array::from_fn(|i| {
            let (index, pick) = if i == 0 {
                (index, pick)
            } else {
                (
                    k.shr(k.reg::<U32>(), index, 16u32),
                    k.shr(k.reg::<U32>(), pick, 16u32),
                )
            };
            let low = k.prmt(k.reg::<U32>(), t0, t1, index);
            let high = k.prmt(k.reg::<U32>(), t2, t3, index);
            k.prmt(k.reg::<U32>(), low, high, pick)
        });
        [
            k.prmt(k.reg::<U32>(), halves[0], halves[1], 0x6420u32),
            k.prmt(k.reg::<U32>(), halves[0], halves[1], 0x7531u32),
        ]
    }
}

/// Levels of a thread's two 32-weight groups in weight order (words 0..8: group 0).
fn levels(k: &Kernel, table: &Table, qs: &[Reg<U32>; 8]) -> [Reg<U32>; 16] {
    let mut out = [qs[0]; 16];
    for b in 0..2 {
        for i in 0..4 {
            let [lo, hi] = table.lookup(k, qs[4 * b + i]);
            out[8 * b + i] = lo;
            out[8 * b + 4 + i] = hi;
        }
    }
    out
}

/// The IQ4_NL format (Q4_0's repacked rows).
pub struct IQ4NL;

impl GpuFormat for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const NAME: &'static str = "iq4_nl";
    type Setup = (legacy::Setup, Table);
    type Loaded = legacy::Loaded;
    type Decoded = ([Reg<U32>; 16], [Reg<F32>; 2]);

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        padded_tiles(k, "IQ4_NL GEMV")?;
        <Q4_0 as GpuFormat>::row_bytes(k)
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        <Q4_0 as GpuFormat>::repack_row(ggml, k, out)
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Self::Setup {
        (<Q4_0 as GpuFormat>::setup(k, part, ntiles), Table::new(k))
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        <Q4_0 as GpuFormat>::act_blocks(k, part)
    }

    fn load(
        k: &Kernel,
        (s, _): &Self::Setup,
        row: Reg<U64>,
        tile: Reg<U32>,
        how: WeightLoad,
    ) -> Self::Loaded {
        <Q4_0 as GpuFormat>::load(k, s, row, tile, how)
    }

    fn load_words(w: &Self::Loaded) -> Vec<Reg<U32>> {
        <Q4_0 as GpuFormat>::load_words(w)
    }

    fn decode(k: &Kernel, (_, table): &Self::Setup, w: &Self::Loaded) -> Self::Decoded {
        (levels(k, table, &w.qs), halves_to_f32(k, w.d))
    }

    fn dot(k: &Kernel, _s: &Self::Setup, w: &Self::Decoded, x: &ActRegs, acc: Reg<F32>) {
        let (q, d) = w;
        for (b, (&dw, &dx)) in d.iter().zip(&x.d).enumerate() {
            let isum = k.s32(0);
            for (&v, &a) in q[8 * b..8 * b + 8].iter().zip(&x.q[8 * b..8 * b + 8]) {
                k.dp4a(isum, v, a, isum);
            }
            let f = k.cvt(k.reg::<F32>(), isum, FloatRound::Rn);
            let scale = k.mul(k.reg(), dw, dx);
            k.fma(acc, scale, f, acc);
        }
    }
}

/// The IQ4_XS format (repacked rows).
pub struct IQ4XS;

/// Per-thread offsets, the shift of its `scales_h` bits, and the table.
pub struct XsSetup {
    qs: Reg<U64>,
    scales_l: Reg<U64>,
    scales_h: Reg<U64>,
    d: Reg<U64>,
    h_shift: Reg<U32>,
    table: Table,
}

/// Raw loads of a thread's share of a super-block.
pub struct XsLoaded {
    qs: [Reg<U32>; 8],
    scales_l: Reg<U32>,
    scales_h: Reg<U32>,
    d: Reg<F16>,
}

impl GpuFormat for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const NAME: &'static str = "iq4_xs";
    type Setup = XsSetup;
    type Loaded = XsLoaded;
    type Decoded = ([Reg<U32>; 16], [Reg<S32>; 2], Reg<F32>);

    fn row_bytes(k: usize) -> Result<usize, KernelError> {
        Ok(pad16(tiles(k, "IQ4_XS GEMV")? * 136))
    }

    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]) {
        let n = k / 256;
        for (b, block) in ggml.chunks_exact(136).enumerate() {
            out[128 * b..128 * b + 128].copy_from_slice(&block[8..]);
            out[128 * n + 4 * b..128 * n + 4 * b + 4].copy_from_slice(&block[4..8]);
            out[132 * n + 2 * b..132 * n + 2 * b + 2].copy_from_slice(&block[2..4]);
            out[134 * n + 2 * b..134 * n + 2 * b + 2].copy_from_slice(&block[..2]);
        }
    }

    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> XsSetup {
        let wide = |v: Reg<U32>| k.cvt(k.reg::<U64>(), v, smelt_ptx::Exact);
        let qs = k.mul_wide(k.reg::<U64>(), part, 32u32);
        let scales_l = k.mul(k.reg(), ntiles, 128u32);
        k.add(scales_l, scales_l, part);
        let scales_h = k.mul(k.reg(), ntiles, 132u32);
        let d = k.mul(k.reg(), ntiles, 134u32);
        let h_shift = k.shl(k.reg(), part, 2u32);
        XsSetup {
            qs,
            scales_l: wide(scales_l),
            scales_h: wide(scales_h),
            d: wide(d),
            h_shift,
            table: Table::new(k),
        }
    }

    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
        let b0 = k.shl(k.reg(), part, 1u32);
        let b1 = k.add(k.reg(), b0, 1u32);
        (b0, b1)
    }

    fn load(k: &Kernel, s: &XsSetup, row: Reg<U64>, tile: Reg<U32>, how: WeightLoad) -> XsLoaded {
        let at = |base: Reg<U64>, stride: u32| {
            let a = k.add(k.reg(), row, base);
            k.add(a, a, k.mul_wide(k.reg::<U64>(), tile, stride))
        };
        let qs_at = at(s.qs, 128);
        let qs = k.regs::<U32, 8>();
        ld_weights(k, how, [qs[0], qs[1], qs[2], qs[3]], qs_at);
        ld_weights(k, how, [qs[4], qs[5], qs[6], qs[7]], qs_at.at(16));
        let scales_l = k.ld_narrow(
            Load::GLOBAL_NC,
            Narrow::U8,
            k.reg::<U32>(),
            at(s.scales_l, 4),
        );
        let scales_h = k.ld_narrow(
            Load::GLOBAL_NC,
            Narrow::U16,
            k.reg::<U32>(),
            at(s.scales_h, 2),
        );
        let d = k.ld(Load::GLOBAL_NC, k.reg::<F16>(), at(s.d, 2));
        XsLoaded {
            qs,
            scales_l,
            scales_h,
            d,
        }
    }

    fn load_words(w: &XsLoaded) -> Vec<Reg<U32>> {
        vec![w.qs[0], w.qs[4], w.scales_l, w.scales_h]
    }

    fn decode(k: &Kernel, s: &XsSetup, w: &XsLoaded) -> Self::Decoded {
        let high = k.shr(k.reg::<U32>(), w.scales_h, s.h_shift);
        let scale = std::array::from_fn(|g| {
            let low = k.bfe(k.reg::<U32>(), w.scales_l, 4 * g as u32, 4u32);
            let top = k.bfe(k.reg::<U32>(), high, 2 * g as u32, 2u32);
            let v = k.mad(k.reg::<U32>(), top, 16u32, low).cast::<S32>();
            k.sub(v, v, 32i32)
        });
        let d = k.cvt(k.reg::<F32>(), w.d, smelt_ptx::Exact);
        (levels(k, &s.table, &w.qs), scale, d)
    }

    fn dot(k: &Kernel, _s: &XsSetup, w: &Self::Decoded, x: &ActRegs, acc: Reg<F32>) {
        let (q, scale, d) = w;
        let total = k.f32(0.0);
        for b in 0..2 {
            let isum = k.s32(0);
            for (&v, &a) in q[8 * b..8 * b + 8].iter().zip(&x.q[8 * b..8 * b + 8]) {
                k.dp4a_with(Bytes::Signed, Bytes::Signed, isum, v, a, isum);
            }
            k.mul(isum, isum, scale[b]);
            let f = k.cvt(k.reg::<F32>(), isum, FloatRound::Rn);
            k.fma(total, x.d[b], f, total);
        }
        k.fma(acc, *d, total, acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_words_hold_the_levels_in_order() {
        let words = table_words();
        assert_eq!(words[0].to_le_bytes()[0] as i8, -127);
        assert_eq!(words[3].to_le_bytes()[3] as i8, 113);
    }
}
