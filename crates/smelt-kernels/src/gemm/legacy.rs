//! The GEMM's staging of the 32-weight formats with 16 bytes of nibbles per block: Q4_0,
//! Q5_0, Q4_1, Q5_1 and IQ4_NL (over the legacy repacked rows, `crate::formats::legacy`:
//! all nibbles, all `qh`, all `d`, all `m`) and IQ4_XS (its repacked rows,
//! `crate::formats::iq4`: all nibbles, all `scales_l`, all `scales_h`, all `d`).
//!
//! In all of them byte `j` of a block's 16 holds weight `j` (low nibble) and `j + 16`
//! (high). The weights go to shared memory as signed int8: `q - 8` or `q - 16` (Q4_0,
//! Q5_0: float scale per block, [`Scales::Float`]), `q` as it is (Q4_1, Q5_1, whose minimum
//! is [`Scales::FloatMin`]'s), or the 16-level table's value (IQ4_NL: float scale; IQ4_XS:
//! 6-bit integer group scales and one `d` per tile, [`Scales::Int`]).

use smelt_ptx::{Exact, Kernel, Load, Narrow, Reg, Store, S32, U32, U64};

use super::{GemmFormat, Scales, Stage, A_STRIDE, BM, THREADS};
use crate::act::and_or;
use crate::formats::iq4::Table;
use crate::formats::legacy::Legacy;
use crate::formats::{halves_to_f32, IQ4NL, IQ4XS};

/// Threads that stage the scales: two per row, each taking four of the row's eight blocks.
const SCALE_THREADS: u32 = 2 * BM;

/// Four words of a 16-byte load.
type Words = [Reg<U32>; 4];

/// What a nibble (with its fifth bit, if any) becomes in shared memory.
#[derive(Clone, Copy)]
enum Values {
    /// `q - offset`.
    Centered(u32),
    /// `q` (0..32).
    Unsigned,
    /// `KVALUES_IQ4NL[q]`.
    Table,
}

/// Bits 0..4 of `bits` to bit 4 of bytes 0..4 (one multiply, as the GEMV does).
fn spread_fifth(k: &Kernel, bits: Reg<U32>) -> Reg<U32> {
    let v = k.mul(k.reg(), bits, 0x0204_0810u32);
    k.and(v, v, 0x1010_1010u32)
}

/// The bias that [`centered`] adds to each byte.
pub(super) const fn bias(offset: u32) -> u32 {
    (0x80 - offset) * 0x0101_0101
}

/// `q - offset` of each byte `q` (`q < 2 offset <= 128`) as int8: `q + 128 - offset` stays
/// within the byte, and flipping its top bit takes 128 off modulo 256.
fn centered(k: &Kernel, q: Reg<U32>, offset: u32) -> Reg<U32> {
    let v = k.add(k.reg(), q, bias(offset));
    k.xor(v, v, 0x8080_8080u32)
}

/// A tile's 128 bytes of nibbles (at `tile * 128` of the row), with the fifth bits of a
/// `qh` array at `qh_base + tile * 32` when `qh_base` is given: each thread takes block
/// `tid % 8` of rows `tid / 8 + 32 i`. `scales` stages the scales between the loads and the
/// stores.
fn stage_nibbles(
    k: &Kernel,
    s: &Stage,
    qh_base: Option<Reg<U32>>,
    values: Values,
    scales: impl FnOnce(&Kernel),
) {
    let ch = k.and(k.reg(), s.tid, 7u32);
    let r0 = k.shr(k.reg(), s.tid, 3u32);
    let qoff = k.mul_wide(k.reg::<U64>(), s.tile, 128u32);
    k.add(qoff, qoff, k.mul_wide(k.reg::<U64>(), ch, 16u32));
    let hoff = qh_base.map(|base| {
        let h = k.mad(k.reg(), s.tile, 32u32, base);
        k.mad(h, ch, 4u32, h);
        k.cvt(k.reg::<U64>(), h, Exact)
    });
    let dst = s.aq_at(k, r0, k.shl(k.reg(), ch, 5u32));
    let per = BM * 8 / THREADS;
    let loads: Vec<(Words, Option<Reg<U32>>)> = (0..per)
        .map(|i| {
            let r = k.add(k.reg(), r0, THREADS / 8 * i);
            let row = s.row(k, r);
            let q = k.regs::<U32, 4>();
            k.ld_v4(Load::GLOBAL_NC, q, k.add(k.reg(), row, qoff));
            let h = hoff.map(|off| k.ld(Load::GLOBAL_NC, k.reg::<U32>(), k.add(k.reg(), row, off)));
            (q, h)
        })
        .collect();
    scales(k);
    let table = match values {
        Values::Table => Some(Table::new(k)),
        _ => None,
    };
    for (i, (q, h)) in loads.iter().enumerate() {
        let down = i as i64 * (THREADS / 8) as i64 * A_STRIDE as i64;
        let (lo, hi): (Vec<Reg<U32>>, Vec<Reg<U32>>) = match table {
            Some(table) => q.iter().map(|&w| table.lookup(k, w).into()).unzip(),
            None => q
                .iter()
                .enumerate()
                .map(|(w, &word)| {
                    // Word w: weights 4w.. (low nibbles) and 16 + 4w.. (high).
                    let nib = |word: Reg<U32>, fifth: u32| match h {
                        Some(h) => {
                            let bits = k.bfe(k.reg::<U32>(), *h, fifth, 4u32);
                            let top = spread_fifth(k, bits);
                            k.lop3(k.reg(), word, 0x0F0F_0F0Fu32, top, and_or())
                        }
                        None => k.and(k.reg(), word, 0x0F0F_0F0Fu32),
                    };
                    let lo = nib(word, 4 * w as u32);
                    let hi = nib(k.shr(k.reg(), word, 4u32), 16 + 4 * w as u32);
                    match values {
                        Values::Centered(off) => (centered(k, lo, off), centered(k, hi, off)),
                        _ => (lo, hi),
                    }
                })
                .unzip(),
        };
        let v4 = |v: Vec<Reg<U32>>| -> [Reg<U32>; 4] { [v[0], v[1], v[2], v[3]] };
        k.st_v4(Store::SHARED, dst.at(down), v4(lo));
        k.st_v4(Store::SHARED, dst.at(down + 16), v4(hi));
    }
}

/// One f16 per block at `base + tile * 16` (8 blocks a tile) as f32 at `off` of the row's
/// group scales: threads below [`SCALE_THREADS`], row `tid % 64`, blocks `4 (tid / 64)..+4`.
fn stage_block_floats(k: &Kernel, s: &Stage, bases: &[(Reg<U32>, i64)]) {
    k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
        let hr = k.and(k.reg(), s.tid, 63u32);
        let upper = k.shr(k.reg(), s.tid, 6u32);
        let row = s.row(k, hr);
        let sdst = s.asc_at(k, hr);
        k.mad(sdst, upper, 16u32, sdst);
        for &(base, off) in bases {
            let at = k.mad(k.reg(), s.tile, 16u32, base);
            k.mad(at, upper, 8u32, at);
            let h = k.regs::<U32, 2>();
            k.ld_v2(
                Load::GLOBAL_NC,
                h,
                k.add(k.reg(), row, k.cvt(k.reg::<U64>(), at, Exact)),
            );
            let [d0, d1] = halves_to_f32(k, h[0]);
            let [d2, d3] = halves_to_f32(k, h[1]);
            k.st_v4(Store::SHARED, sdst.at(off), [d0, d1, d2, d3]);
        }
    });
}

impl<const HIGH: bool, const MIN: bool> GemmFormat for Legacy<HIGH, MIN> {
    const GEMM_NAME: &'static str = match (HIGH, MIN) {
        (false, false) => "gemm_q4_0",
        (false, true) => "gemm_q4_1",
        (true, false) => "gemm_q5_0",
        (true, true) => "gemm_q5_1",
    };
    const GROUP: u32 = 32;
    const SCALES: Scales = if MIN { Scales::FloatMin } else { Scales::Float };
    /// ptxas (13.0) otherwise gives Q4_0 and Q5_0 80 registers and a 4-byte spill.
    const SM80_MIN_BLOCKS: u32 = if MIN { 0 } else { 1 };

    /// Per tile: 128 bytes of nibbles, 32 of `qh` (5-bit formats), 16 of `d`, 16 of `m`
    /// (formats with a minimum), each field an array over the row's tiles.
    fn stage(k: &Kernel, s: &Stage) {
        let qh_base = HIGH.then(|| k.mul(k.reg(), s.ntiles, 128u32));
        let d_base = k.mul(k.reg(), s.ntiles, if HIGH { 160u32 } else { 128 });
        let values = match (HIGH, MIN) {
            (_, true) => Values::Unsigned,
            (false, false) => Values::Centered(8),
            (true, false) => Values::Centered(16),
        };
        stage_nibbles(k, s, qh_base, values, |k| {
            if MIN {
                let m_base = k.mad(k.reg(), s.ntiles, 16u32, d_base);
                stage_block_floats(k, s, &[(d_base, 0), (m_base, 32)]);
            } else {
                stage_block_floats(k, s, &[(d_base, 0)]);
            }
        });
    }
}

impl GemmFormat for IQ4NL {
    const GEMM_NAME: &'static str = "gemm_iq4_nl";
    const GROUP: u32 = 32;
    const SCALES: Scales = Scales::Float;
    /// As Q4_0's.
    const SM80_MIN_BLOCKS: u32 = 1;

    /// Q4_0's repacked rows, the nibbles indexing the table.
    fn stage(k: &Kernel, s: &Stage) {
        let d_base = k.mul(k.reg(), s.ntiles, 128u32);
        stage_nibbles(k, s, None, Values::Table, |k| {
            stage_block_floats(k, s, &[(d_base, 0)]);
        });
    }
}

impl GemmFormat for IQ4XS {
    const GEMM_NAME: &'static str = "gemm_iq4_xs";
    const GROUP: u32 = 32;
    const SCALES: Scales = Scales::Int { min: false };

    /// Repacked rows: 128 bytes of nibbles a tile, then all `scales_l` (4 bytes a tile:
    /// group `g`'s low four bits at bits `4g`), all `scales_h` (2: its top two at `2g`), all
    /// f16 `d` (2). Group `g`'s weights are `d * (ls_g - 32) * table[q]`.
    fn stage(k: &Kernel, s: &Stage) {
        stage_nibbles(k, s, None, Values::Table, |k| {
            // Scales: threads below SCALE_THREADS, row `tid % 64`, groups 4 (tid / 64)..+4.
            k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
                let hr = k.and(k.reg(), s.tid, 63u32);
                let upper = k.shr(k.reg(), s.tid, 6u32);
                let row = s.row(k, hr);
                let at = |per_tile: u32, field: u32| {
                    let a = k.mul(k.reg(), s.ntiles, field);
                    k.mad(a, s.tile, per_tile, a);
                    k.add(k.reg(), row, k.cvt(k.reg::<U64>(), a, Exact))
                };
                let sl = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), at(4, 128));
                let sh = k.ld_narrow(Load::GLOBAL_NC, Narrow::U16, k.reg::<U32>(), at(2, 132));
                let dbits = k.ld_narrow(Load::GLOBAL_NC, Narrow::U16, k.reg::<U32>(), at(2, 134));
                // The thread's four groups: `scales_l` bits 16 upper.., `scales_h` 8 upper...
                k.shr(sl, sl, k.shl(k.reg(), upper, 4u32));
                k.shr(sh, sh, k.shl(k.reg(), upper, 3u32));
                let scs: [Reg<S32>; 4] = std::array::from_fn(|i| {
                    let lo = k.bfe(k.reg::<U32>(), sl, 4 * i as u32, 4u32);
                    let hi = k.bfe(k.reg::<U32>(), sh, 2 * i as u32, 2u32);
                    let v = k.mad(k.reg(), hi, 16u32, lo).cast::<S32>();
                    k.sub(v, v, 32i32)
                });
                let sdst = s.asc_at(k, hr);
                k.mad(sdst, upper, 16u32, sdst);
                k.st_v4(Store::SHARED, sdst, scs);
                let [d, _] = halves_to_f32(k, dbits);
                let z = k.f32(0.0);
                k.guarded(k.eq(upper, 0u32), |k| {
                    k.st_v2(Store::SHARED, s.rowf_at(k, hr), [d, z]);
                });
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::iq4::table_words;
    use smelt_quant::iq4::KVALUES_IQ4NL;

    /// `centered`'s arithmetic on whole words, for every pair of quants it is used on.
    #[test]
    fn biased_bytes_center_to_int8() {
        for offset in [8u32, 16] {
            for a in 0..2 * offset {
                for b in 0..2 * offset {
                    let word = a | b << 8 | a << 16 | b << 24;
                    let v = (word + bias(offset)) ^ 0x8080_8080;
                    let bytes = v.to_le_bytes().map(|x| i32::from(x as i8));
                    let (a, b) = (a as i32 - offset as i32, b as i32 - offset as i32);
                    assert_eq!(bytes, [a, b, a, b], "{offset}");
                }
            }
        }
    }

    /// `spread_fifth`'s multiply: each of four bits to bit 4 of its own byte.
    #[test]
    fn fifth_bits_spread_to_their_bytes() {
        for bits in 0u32..16 {
            let v = bits.wrapping_mul(0x0204_0810) & 0x1010_1010;
            let want: u32 = (0..4).map(|i| ((bits >> i) & 1) << (8 * i + 4)).sum();
            assert_eq!(v, want, "{bits:04b}");
        }
    }

    /// PTX `prmt.b32` (default mode): byte `i` of the result is byte `c >> 4i & 7` of
    /// `{b, a}`, its sign replicated when bit 3 of the selector is set.
    fn prmt(a: u32, b: u32, c: u32) -> u32 {
        let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
        (0..4)
            .map(|i| {
                let sel = (c >> (4 * i)) & 15;
                let byte = bytes[(sel & 7) as usize];
                let byte = if sel & 8 != 0 {
                    if byte & 0x80 != 0 {
                        0xFF
                    } else {
                        0
                    }
                } else {
                    byte
                };
                u32::from(byte) << (8 * i)
            })
            .sum()
    }

    /// `lookup`'s selectors on the host: every nibble of a word to its table value.
    #[test]
    fn table_lookup_gives_each_nibbles_value() {
        let [t0, t1, t2, t3] = table_words();
        for seed in 0u32..4096 {
            let q = seed.wrapping_mul(0x9E37_79B9) ^ (seed << 7);
            let index = q & 0x7777_7777;
            let pick = ((q & 0x8888_8888) >> 1) | 0x3210_3210;
            let halves: Vec<u32> = (0..2)
                .map(|i| {
                    let (index, pick) = (index >> (16 * i), pick >> (16 * i));
                    prmt(prmt(t0, t1, index), prmt(t2, t3, index), pick)
                })
                .collect();
            let lo = prmt(halves[0], halves[1], 0x6420);
            let hi = prmt(halves[0], halves[1], 0x7531);
            for byte in 0..4 {
                let nib = |shift: u32| KVALUES_IQ4NL[((q >> (8 * byte + shift)) & 15) as usize];
                assert_eq!((lo >> (8 * byte)) as u8 as i8, nib(0), "{q:08x}");
                assert_eq!((hi >> (8 * byte)) as u8 as i8, nib(4), "{q:08x}");
            }
        }
    }
}
