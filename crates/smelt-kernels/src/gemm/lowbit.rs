//! The GEMM's staging of the 2- and 3-bit K-quants, Q2_K and Q3_K: 16-weight groups with
//! integer scales (and, for Q2_K, integer minima), over their repacked rows
//! (`crate::formats::q2_k`, `crate::formats::q3_k`).
//!
//! Both keep 2-bit quants as ggml does: in each 128-weight half `h` of a tile, bits
//! `2j..2j+2` of quant byte `32h + l` belong to weight `128h + 32j + l`. Each of the
//! block's 256 threads takes one row: half `(tid / 2) % 2`, bytes `l = 16 (tid % 2)..+16`,
//! and writes its four runs `j` of 16 weights. Q3_K's third bit (bit `4h + j` of `hmask`
//! byte `l`, clear meaning `q - 4`) makes the weight signed int8 `-4..4`.

use smelt_ptx::{Exact, Kernel, Load, Narrow, Reg, Store, S32, U32, U64};

use super::formats::store_int_scales;
use super::{GemmFormat, Scales, Stage, BM};
use crate::act::and_or;
use crate::formats::{halves_to_f32, Q2K, Q3K};

/// Threads that stage the scales: two per row, each taking eight of the row's sixteen
/// groups.
const SCALE_THREADS: u32 = 2 * BM;

/// Per thread: its row (`tid / 4`), half `h` of the tile, and the first weight of its runs
/// in the row's shared memory.
struct Runs {
    r0: Reg<U32>,
    half: Reg<U32>,
    l16: Reg<U32>,
    dst: Reg<U32>,
}

fn runs(k: &Kernel, s: &Stage) -> Runs {
    let l16 = k.and(k.reg(), s.tid, 1u32);
    let half = k.bfe(k.reg(), s.tid, 1u32, 1u32);
    let r0 = k.shr(k.reg(), s.tid, 2u32);
    let col = k.mul(k.reg(), half, 128u32);
    k.mad(col, l16, 16u32, col);
    let dst = s.aq_at(k, r0, col);
    Runs { r0, half, l16, dst }
}

/// The thread's 16 quant bytes of the tile (64 a tile at the row's start).
fn load_quants(k: &Kernel, s: &Stage, r: &Runs, row: Reg<U64>) -> [Reg<U32>; 4] {
    let off = k.mul(k.reg(), s.tile, 64u32);
    k.mad(off, r.half, 32u32, off);
    k.mad(off, r.l16, 16u32, off);
    let q = k.regs::<U32, 4>();
    k.ld_v4(
        Load::GLOBAL_NC,
        q,
        k.add(k.reg(), row, k.cvt(k.reg::<U64>(), off, Exact)),
    );
    q
}

/// Scale stage of the thread below [`SCALE_THREADS`]: its row `tid % 64` and which half of
/// the groups (`tid / 64`: groups `8 upper..+8`).
fn scale_rows(k: &Kernel, s: &Stage, body: impl FnOnce(&Kernel, Reg<U32>, Reg<U32>)) {
    k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
        let hr = k.and(k.reg(), s.tid, 63u32);
        let upper = k.shr(k.reg(), s.tid, 6u32);
        body(k, hr, upper);
    });
}

/// `ntiles * field + tile * per_tile` bytes into `row`.
fn field_at(k: &Kernel, s: &Stage, row: Reg<U64>, field: u32, per_tile: u32) -> Reg<U64> {
    let a = k.mul(k.reg(), s.ntiles, field);
    k.mad(a, s.tile, per_tile, a);
    k.add(k.reg(), row, k.cvt(k.reg::<U64>(), a, Exact))
}

/// `q - 4` where the `hmask` bit (bit 0 of each byte of `hbit`) is clear, else `q`, for
/// 2-bit `q` at bits 0-1 of each byte of `q2` (other bits ignored): OR-ing `0xFC` into a
/// byte `0..4` makes it `q - 4` as int8.
fn q3_value(k: &Kernel, q2: Reg<U32>, hbit: Reg<U32>) -> Reg<U32> {
    let clear = k.and(k.reg(), hbit, 0x0101_0101u32);
    k.xor(clear, clear, 0x0101_0101u32);
    k.mul(clear, clear, 0xFCu32);
    k.lop3(k.reg(), q2, 0x0303_0303u32, clear, and_or())
}

impl GemmFormat for Q3K {
    const GEMM_NAME: &'static str = "gemm_q3_k";
    const GROUP: u32 = 16;
    const SCALES: Scales = Scales::Int { min: false };

    /// Repacked rows: all `qs` (64 bytes a tile), all `hmask` (32), all scales (12: ggml's
    /// packed 6-bit scales, each `s - 32`), all f16 `d` (2).
    fn stage(k: &Kernel, s: &Stage) {
        let r = runs(k, s);
        let row = s.row(k, r.r0);
        let q = load_quants(k, s, &r, row);
        let hoff = k.mul(k.reg(), s.ntiles, 64u32);
        k.mad(hoff, s.tile, 32u32, hoff);
        k.mad(hoff, r.l16, 16u32, hoff);
        let hm = k.regs::<U32, 4>();
        k.ld_v4(
            Load::GLOBAL_NC,
            hm,
            k.add(k.reg(), row, k.cvt(k.reg::<U64>(), hoff, Exact)),
        );
        scale_rows(k, s, |k, hr, upper| {
            let row = s.row(k, hr);
            let at = field_at(k, s, row, 96, 12);
            let w = k.regs::<U32, 3>();
            for (i, &word) in w.iter().enumerate() {
                k.ld(Load::GLOBAL_NC, word, at.at(4 * i as i64));
            }
            let dbits = k.ld_narrow(
                Load::GLOBAL_NC,
                Narrow::U16,
                k.reg::<U32>(),
                field_at(k, s, row, 108, 2),
            );
            // ggml's unpacking of scale words p = 2 upper + i (groups 4p..4p + 4): low
            // nibbles of word i shifted by 4 upper, top bits of word 2 shifted by 2p.
            let nsh = k.shl(k.reg(), upper, 2u32);
            let tops = k.shr(k.reg(), w[2], nsh);
            let words: [Reg<U32>; 2] = std::array::from_fn(|i| {
                let low = k.shr(k.reg(), w[i], nsh);
                let top = k.shr(k.reg(), tops, 2 * i as u32);
                k.and(top, top, 0x0303_0303u32);
                k.shl(top, top, 4u32);
                k.lop3(k.reg(), low, 0x0F0F_0F0Fu32, top, and_or())
            });
            let scs: [Reg<S32>; 8] = std::array::from_fn(|g| {
                let v = k.bfe(k.reg::<U32>(), words[g / 4], 8 * (g % 4) as u32, 8u32);
                let v = v.cast::<S32>();
                k.sub(v, v, 32i32)
            });
            store_int_scales(k, s, hr, upper, scs, dbits);
        });
        // The run's hmask bits: bit 4h + j of each byte.
        let hsh = k.shl(k.reg(), r.half, 2u32);
        let hs = hm.map(|w| k.shr(k.reg(), w, hsh));
        for j in 0..4u32 {
            let words: [Reg<U32>; 4] = std::array::from_fn(|w| {
                let q2 = k.shr(k.reg(), q[w], 2 * j);
                let hb = k.shr(k.reg(), hs[w], j);
                q3_value(k, q2, hb)
            });
            k.st_v4(Store::SHARED, r.dst.at(32 * i64::from(j)), words);
        }
    }
}

impl GemmFormat for Q2K {
    const GEMM_NAME: &'static str = "gemm_q2_k";
    const GROUP: u32 = 16;
    const SCALES: Scales = Scales::Int { min: true };

    /// Repacked rows: all `qs` (64 bytes a tile), all scale bytes (16: group `g`'s scale
    /// in the low nibble of byte `g`, its minimum in the high), all f16 `d|dmin` (4).
    /// Weights are `d * sc * q - dmin * m`, `q` 0..4.
    fn stage(k: &Kernel, s: &Stage) {
        let r = runs(k, s);
        let row = s.row(k, r.r0);
        let q = load_quants(k, s, &r, row);
        scale_rows(k, s, |k, hr, upper| {
            let row = s.row(k, hr);
            let at = field_at(k, s, row, 64, 16);
            let w = k.regs::<U32, 2>();
            k.ld_v2(
                Load::GLOBAL_NC,
                w,
                k.add(k.reg(), at, k.mul_wide(k.reg::<U64>(), upper, 8u32)),
            );
            let dm = k.ld(Load::GLOBAL_NC, k.reg::<U32>(), field_at(k, s, row, 80, 4));
            let scs: [Reg<S32>; 8] = std::array::from_fn(|g| {
                k.bfe(k.reg::<U32>(), w[g / 4], 8 * (g % 4) as u32, 4u32)
                    .cast::<S32>()
            });
            // Each minimum in all four bytes: the A operand of the minima's `mma`.
            let mins: [Reg<U32>; 8] = std::array::from_fn(|g| {
                let m = k.bfe(k.reg::<U32>(), w[g / 4], 8 * (g % 4) as u32 + 4, 4u32);
                k.mul(m, m, 0x0101_0101u32)
            });
            let sdst = s.asc_at(k, hr);
            k.mad(sdst, upper, 32u32, sdst);
            k.st_v4(Store::SHARED, sdst, [scs[0], scs[1], scs[2], scs[3]]);
            k.st_v4(Store::SHARED, sdst.at(16), [scs[4], scs[5], scs[6], scs[7]]);
            k.st_v4(
                Store::SHARED,
                sdst.at(64),
                [mins[0], mins[1], mins[2], mins[3]],
            );
            k.st_v4(
                Store::SHARED,
                sdst.at(80),
                [mins[4], mins[5], mins[6], mins[7]],
            );
            let [d, dmin] = halves_to_f32(k, dm);
            let neg_dmin = k.neg(k.reg(), dmin);
            k.guarded(k.eq(upper, 0u32), |k| {
                k.st_v2(Store::SHARED, s.rowf_at(k, hr), [d, neg_dmin]);
            });
        });
        for j in 0..4u32 {
            let words: [Reg<U32>; 4] = std::array::from_fn(|w| {
                let q2 = k.shr(k.reg(), q[w], 2 * j);
                k.and(q2, q2, 0x0303_0303u32)
            });
            k.st_v4(Store::SHARED, r.dst.at(32 * i64::from(j)), words);
        }
    }
}

#[cfg(test)]
mod tests {
    /// `q3_value`'s arithmetic on whole words: every 2-bit quant with its bit set and
    /// clear, in every byte, with junk above the quant bits.
    #[test]
    fn third_bit_makes_signed_values() {
        for q in 0u32..4 {
            for h in 0u32..2 {
                for byte in 0..4 {
                    let q2 = (0xFCu32 | q) << (8 * byte);
                    let hbit = (h | 0xFE) << (8 * byte);
                    let clear = ((hbit & 0x0101_0101) ^ 0x0101_0101).wrapping_mul(0xFC);
                    let v = (q2 & 0x0303_0303) | clear;
                    let got: Vec<i32> = v.to_le_bytes().iter().map(|&b| b as i8 as i32).collect();
                    for (i, &g) in got.iter().enumerate() {
                        let want = if i == byte {
                            q as i32 - if h == 1 { 0 } else { 4 }
                        } else {
                            -4
                        };
                        assert_eq!(g, want, "q {q} h {h} byte {byte}");
                    }
                }
            }
        }
    }
}
