//! How each weight format's tile becomes the GEMM's shared-memory operands: int8 weights
//! (weight `i` of the tile at byte `i` of the row) and group scales ([`Scales`]). One
//! `impl` per format, over the GPU row layouts of `crate::formats`.

use smelt_ptx::{CpAsyncCache, Exact, Kernel, Load, Narrow, Reg, Store, S32, U32, U64};

use super::{GemmFormat, Scales, Stage, A_STRIDE, THREADS};
use crate::act::and_or;
use crate::formats::{halves_to_f32, Q4K, Q5K, Q6K, Q8_0};

/// `x & mask` of each word.
fn masked<const N: usize>(k: &Kernel, v: [Reg<U32>; N], mask: u32) -> [Reg<U32>; N] {
    v.map(|w| k.and(k.reg(), w, mask))
}

/// Four words of a 16-byte load.
type Words = [Reg<U32>; 4];

/// Threads that stage the scales: two per row, each taking half of the row's groups.
const SCALE_THREADS: u32 = 2 * super::BM;

/// Stores row `hr`'s eight signed group scales (groups `8 upper..+8`) and, from the
/// `upper == 0` thread, its `d` (f16 bits `dbits`) beside a zero `-dmin`: the scale staging
/// of the formats with 16-weight groups and no minima (Q6_K, Q3_K).
pub(super) fn store_int_scales(
    k: &Kernel,
    s: &Stage,
    hr: Reg<U32>,
    upper: Reg<U32>,
    scs: [Reg<S32>; 8],
    dbits: Reg<U32>,
) {
    let sdst = s.asc_at(k, hr);
    k.mad(sdst, upper, 32u32, sdst);
    k.st_v4(Store::SHARED, sdst, [scs[0], scs[1], scs[2], scs[3]]);
    k.st_v4(Store::SHARED, sdst.at(16), [scs[4], scs[5], scs[6], scs[7]]);
    let [d, _] = halves_to_f32(k, dbits);
    let z = k.f32(0.0);
    k.guarded(k.eq(upper, 0u32), |k| {
        k.st_v2(Store::SHARED, s.rowf_at(k, hr), [d, z]);
    });
}

/// Stages the scales, minima and `d`, `-dmin` of a Q4_K/Q5_K super-block header (the
/// block's first 16 bytes, at `tile_off` from the row start): threads below
/// [`SCALE_THREADS`], row `tid % 64`, groups `4 (tid / 64) .. +4`.
fn stage_k_header(k: &Kernel, s: &Stage, tile_off: Reg<U64>) {
    k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
        let hr = k.and(k.reg(), s.tid, 63u32);
        let upper = k.shr(k.reg(), s.tid, 6u32);
        let hsrc = k.add(k.reg(), s.row(k, hr), tile_off);
        let h = k.regs::<U32, 4>();
        k.ld_v4(Load::GLOBAL_NC, h, hsrc);
        // Groups 0..4: bytes 0..4 & 63 (minima 4..8); 4..8: the low (minima: high)
        // nibble of bytes 8..12 with the top two bits of bytes 0..4 (minima 4..8).
        let sc_lo = k.and(k.reg(), h[1], 0x3F3F_3F3Fu32);
        let m_lo = k.and(k.reg(), h[2], 0x3F3F_3F3Fu32);
        let top = |w: Reg<U32>| {
            let t = k.shr(k.reg(), w, 2u32);
            k.and(t, t, 0x3030_3030u32)
        };
        let sc_hi = k.and(k.reg(), h[3], 0x0F0F_0F0Fu32);
        k.or(sc_hi, sc_hi, top(h[1]));
        let m_hi = k.shr(k.reg(), h[3], 4u32);
        k.and(m_hi, m_hi, 0x0F0F_0F0Fu32);
        k.or(m_hi, m_hi, top(h[2]));
        let up = k.cmp(smelt_ptx::Cmp::Ne, upper, 0u32);
        let sc = k.selp(k.reg::<U32>(), sc_hi, sc_lo, up);
        let m = k.selp(k.reg::<U32>(), m_hi, m_lo, up);
        let scs: [Reg<U32>; 4] = std::array::from_fn(|i| k.bfe(k.reg(), sc, 8 * i as u32, 8u32));
        // Each minimum in all four bytes: the A operand of the minima's `mma`.
        let mins: [Reg<U32>; 4] =
            std::array::from_fn(|i| k.prmt(k.reg(), m, 0u32, 0x1111 * i as u32));
        let sdst = s.asc_at(k, hr);
        k.mad(sdst, upper, 16u32, sdst);
        k.st_v4(Store::SHARED, sdst, scs);
        k.st_v4(Store::SHARED, sdst.at(32), mins);
        let [d, dmin] = halves_to_f32(k, h[0]);
        let neg_dmin = k.neg(k.reg(), dmin);
        k.st_v2(Store::SHARED, s.rowf_at(k, hr), [d, neg_dmin]);
    });
}

impl GemmFormat for Q4K {
    const GEMM_NAME: &'static str = "gemm_q4_k";
    const GROUP: u32 = 32;
    const SCALES: Scales = Scales::Int { min: true };

    /// ggml's 144-byte super-blocks: 16 bytes of header (d, dmin, twelve bytes of 6-bit
    /// scales and minima), then 128 bytes of nibbles; bytes `32j..32j+32` hold weights
    /// `64j + l` (low nibbles) and `64j + 32 + l` (high).
    fn stage(k: &Kernel, s: &Stage) {
        // Quants: thread takes 16-byte chunk `tid % 8` of rows `tid / 8 + 32 i`.
        let ch = k.and(k.reg(), s.tid, 7u32);
        let r0 = k.shr(k.reg(), s.tid, 3u32);
        let tile_off = k.mul_wide(k.reg::<U64>(), s.tile, 144u32);
        let qoff = k.mul_wide(k.reg::<U64>(), ch, 16u32);
        k.add(qoff, qoff, tile_off);
        k.add(qoff, qoff, 16u64);
        // Low nibbles go to weights 64 j + 16 (ch % 2), high ones 32 further.
        let j = k.shr(k.reg(), ch, 1u32);
        let col = k.and(k.reg(), ch, 1u32);
        k.shl(col, col, 4u32);
        k.mad(col, j, 64u32, col);
        let dst = s.aq_at(k, r0, col);
        let per = super::BM * 8 / THREADS;
        let loads: Vec<[Reg<U32>; 4]> = (0..per)
            .map(|i| {
                let r = k.add(k.reg(), r0, THREADS / 8 * i);
                let src = k.add(k.reg(), s.row(k, r), qoff);
                let q = k.regs::<U32, 4>();
                k.ld_v4(Load::GLOBAL_NC, q, src);
                q
            })
            .collect();
        stage_k_header(k, s, tile_off);
        for (i, q) in loads.iter().enumerate() {
            let down = i as i64 * (THREADS / 8) as i64 * A_STRIDE as i64;
            k.st_v4(Store::SHARED, dst.at(down), masked(k, *q, 0x0F0F_0F0F));
            let hi = q.map(|w| k.shr(k.reg(), w, 4u32));
            k.st_v4(Store::SHARED, dst.at(down + 32), masked(k, hi, 0x0F0F_0F0F));
        }
    }
}

impl GemmFormat for Q5K {
    const GEMM_NAME: &'static str = "gemm_q5_k";
    const GROUP: u32 = 32;
    const SCALES: Scales = Scales::Int { min: true };

    /// ggml's 176-byte super-blocks: Q4_K's 16-byte header, 32 bytes of fifth bits `qh`,
    /// 128 bytes of nibbles as Q4_K's. Weight `64j + l` is the low nibble of byte `32j + l`
    /// with bit `2j` of `qh[l]` as its fifth bit, weight `64j + 32 + l` the high nibble
    /// with bit `2j + 1`: 0..32, as int8.
    fn stage(k: &Kernel, s: &Stage) {
        // Quants: thread takes 16-byte chunk `tid % 8` of rows `tid / 8 + 32 i` (bytes
        // `16 ch..`, weights `64 j + 16 (ch % 2)..` and 32 further) and `qh` bytes
        // `16 (ch % 2)..+16`.
        let ch = k.and(k.reg(), s.tid, 7u32);
        let r0 = k.shr(k.reg(), s.tid, 3u32);
        let tile_off = k.mul_wide(k.reg::<U64>(), s.tile, 176u32);
        let qoff = k.mul_wide(k.reg::<U64>(), ch, 16u32);
        k.add(qoff, qoff, tile_off);
        k.add(qoff, qoff, 48u64);
        let j = k.shr(k.reg(), ch, 1u32);
        let col = k.and(k.reg(), ch, 1u32);
        k.shl(col, col, 4u32);
        let hoff = k.cvt(k.reg::<U64>(), col, Exact);
        k.add(hoff, hoff, tile_off);
        k.add(hoff, hoff, 16u64);
        k.mad(col, j, 64u32, col);
        let dst = s.aq_at(k, r0, col);
        // `qh` bit 2j at bit 0 of each byte (bit 2j + 1 at bit 1).
        let shift = k.shl(k.reg(), j, 1u32);
        let per = super::BM * 8 / THREADS;
        let loads: Vec<(Words, Words)> = (0..per)
            .map(|i| {
                let r = k.add(k.reg(), r0, THREADS / 8 * i);
                let row = s.row(k, r);
                let (q, h) = (k.regs::<U32, 4>(), k.regs::<U32, 4>());
                k.ld_v4(Load::GLOBAL_NC, q, k.add(k.reg(), row, qoff));
                k.ld_v4(Load::GLOBAL_NC, h, k.add(k.reg(), row, hoff));
                (q, h)
            })
            .collect();
        stage_k_header(k, s, tile_off);
        for (i, (q, h)) in loads.iter().enumerate() {
            let down = i as i64 * (THREADS / 8) as i64 * A_STRIDE as i64;
            let bits = h.map(|w| k.shr(k.reg(), w, shift));
            let lo: [Reg<U32>; 4] = std::array::from_fn(|w| {
                let top = k.and(k.reg(), bits[w], 0x0101_0101u32);
                k.shl(top, top, 4u32);
                k.lop3(k.reg(), q[w], 0x0F0F_0F0Fu32, top, and_or())
            });
            k.st_v4(Store::SHARED, dst.at(down), lo);
            let hi: [Reg<U32>; 4] = std::array::from_fn(|w| {
                let top = k.and(k.reg(), bits[w], 0x0202_0202u32);
                k.shl(top, top, 3u32);
                let nib = k.shr(k.reg(), q[w], 4u32);
                k.lop3(k.reg(), nib, 0x0F0F_0F0Fu32, top, and_or())
            });
            k.st_v4(Store::SHARED, dst.at(down + 32), hi);
        }
    }
}

impl GemmFormat for Q8_0 {
    const GEMM_NAME: &'static str = "gemm_q8_0";
    const GROUP: u32 = 32;
    const SCALES: Scales = Scales::Float;

    /// Repacked rows (`crate::formats::q8_0`): all quants (256 bytes a tile, already int8),
    /// then all f16 scales (16 bytes a tile).
    fn stage(k: &Kernel, s: &Stage) {
        // Quants: thread copies 16-byte chunk `tid % 16` of rows `tid / 16 + 16 i`.
        let ch = k.and(k.reg(), s.tid, 15u32);
        let r0 = k.shr(k.reg(), s.tid, 4u32);
        let qoff = k.mul_wide(k.reg::<U64>(), s.tile, 256u32);
        k.add(qoff, qoff, k.mul_wide(k.reg::<U64>(), ch, 16u32));
        let col = k.shl(k.reg(), ch, 4u32);
        let dst = s.aq_at(k, r0, col);
        for i in 0..super::BM * 16 / THREADS {
            let r = k.add(k.reg(), r0, THREADS / 16 * i);
            let src = k.add(k.reg(), s.row(k, r), qoff);
            let down = i64::from(THREADS / 16 * i * A_STRIDE);
            k.cp_async(CpAsyncCache::Cg, dst.at(down), src, 16);
        }
        // Scales: row `tid % 64`, blocks 4 (tid / 64) .. +4.
        k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
            let hr = k.and(k.reg(), s.tid, 63u32);
            let upper = k.shr(k.reg(), s.tid, 6u32);
            let soff = k.mul(k.reg(), s.ntiles, 256u32);
            k.mad(soff, s.tile, 16u32, soff);
            k.mad(soff, upper, 8u32, soff);
            let src = k.add(k.reg(), s.row(k, hr), k.cvt(k.reg::<U64>(), soff, Exact));
            let h = k.regs::<U32, 2>();
            k.ld_v2(Load::GLOBAL_NC, h, src);
            let [d0, d1] = halves_to_f32(k, h[0]);
            let [d2, d3] = halves_to_f32(k, h[1]);
            let sdst = s.asc_at(k, hr);
            k.mad(sdst, upper, 16u32, sdst);
            k.st_v4(Store::SHARED, sdst, [d0, d1, d2, d3]);
        });
    }
}

/// `q - 32` of each 6-bit byte of `q` (0..64), as int8: flip bit 5, then copy it into bits
/// 6 and 7 (a sign extension from six bits).
fn centered6(k: &Kernel, q: Reg<U32>) -> Reg<U32> {
    let x = k.xor(k.reg(), q, 0x2020_2020u32);
    let s = k.and(k.reg(), x, 0x2020_2020u32);
    let s1 = k.shl(k.reg(), s, 1u32);
    let s2 = k.shl(k.reg(), s, 2u32);
    k.or(x, x, s1);
    k.or(x, x, s2)
}

impl GemmFormat for Q6K {
    const GEMM_NAME: &'static str = "gemm_q6_k";
    const GROUP: u32 = 16;
    const SCALES: Scales = Scales::Int { min: false };

    /// Repacked rows (`crate::formats::q6_k`): all `ql` (128 bytes a tile), all `qh` (64),
    /// all int8 scales (16), all f16 `d` (2). In half `n` of a tile, `ql` bytes `64n + l`
    /// and `64n + 32 + l` and `qh` byte `32n + l` make weights `128n + l + 32 q` (q = 0..4),
    /// each `q6 - 32`, scaled by the scale of its 16-weight group.
    fn stage(k: &Kernel, s: &Stage) {
        // Thread: positions `l = 16 (tid % 2)..+16` of half `(tid / 2) % 2` of row `tid / 4`.
        let l16 = k.and(k.reg(), s.tid, 1u32);
        let half = k.bfe(k.reg(), s.tid, 1u32, 1u32);
        let r0 = k.shr(k.reg(), s.tid, 2u32);
        let ql = k.mul(k.reg(), s.tile, 128u32);
        k.mad(ql, half, 64u32, ql);
        k.mad(ql, l16, 16u32, ql);
        let qh = k.mul(k.reg(), s.ntiles, 128u32);
        k.mad(qh, s.tile, 64u32, qh);
        k.mad(qh, half, 32u32, qh);
        k.mad(qh, l16, 16u32, qh);
        let col = k.mul(k.reg(), half, 128u32);
        k.mad(col, l16, 16u32, col);
        let dst = s.aq_at(k, r0, col);
        let row = s.row(k, r0);
        let lo = k.add(k.reg(), row, k.cvt(k.reg::<U64>(), ql, Exact));
        let hb = k.add(k.reg(), row, k.cvt(k.reg::<U64>(), qh, Exact));
        let [ql0, ql1, qhv] = [k.regs::<U32, 4>(), k.regs::<U32, 4>(), k.regs::<U32, 4>()];
        k.ld_v4(Load::GLOBAL_NC, ql0, lo);
        k.ld_v4(Load::GLOBAL_NC, ql1, lo.at(32));
        k.ld_v4(Load::GLOBAL_NC, qhv, hb);
        // Scales: threads below SCALE_THREADS, row `tid % 64`, groups 8 (tid / 64) .. +8.
        k.if_(k.lt(s.tid, SCALE_THREADS), |k| {
            let hr = k.and(k.reg(), s.tid, 63u32);
            let upper = k.shr(k.reg(), s.tid, 6u32);
            let row = s.row(k, hr);
            let soff = k.mul(k.reg(), s.ntiles, 192u32);
            k.mad(soff, s.tile, 16u32, soff);
            k.mad(soff, upper, 8u32, soff);
            let doff = k.mul(k.reg(), s.ntiles, 208u32);
            k.mad(doff, s.tile, 2u32, doff);
            let sw = k.regs::<U32, 2>();
            k.ld_v2(
                Load::GLOBAL_NC,
                sw,
                k.add(k.reg(), row, k.cvt(k.reg::<U64>(), soff, Exact)),
            );
            let dbits = k.ld_narrow(
                Load::GLOBAL_NC,
                Narrow::U16,
                k.reg::<U32>(),
                k.add(k.reg(), row, k.cvt(k.reg::<U64>(), doff, Exact)),
            );
            let scs: [Reg<S32>; 8] = std::array::from_fn(|i| {
                let w = sw[i / 4].cast::<S32>();
                k.bfe(k.reg::<S32>(), w, 8 * (i % 4) as u32, 8u32)
            });
            store_int_scales(k, s, hr, upper, scs, dbits);
        });
        let nib = |v: Reg<U32>, shift: u32| {
            let t = k.shr(k.reg(), v, shift);
            k.and(t, t, 0x0F0F_0F0Fu32)
        };
        // The two top bits of q for sub-block q of each byte of `qh`, at bits 4-5.
        let top = |w: Reg<U32>, q: u32| {
            let t = match q {
                0 => k.shl(k.reg(), w, 4u32),
                1 => k.shl(k.reg(), w, 2u32),
                2 => k.copy(w),
                _ => k.shr(k.reg(), w, 2u32),
            };
            k.and(t, t, 0x3030_3030u32)
        };
        for q in 0..4u32 {
            let (src, shift) = match q {
                0 => (ql0, 0),
                1 => (ql1, 0),
                2 => (ql0, 4),
                _ => (ql1, 4),
            };
            let words: [Reg<U32>; 4] = std::array::from_fn(|w| {
                let v = k.or(k.reg(), nib(src[w], shift), top(qhv[w], q));
                centered6(k, v)
            });
            k.st_v4(Store::SHARED, dst.at(32 * i64::from(q)), words);
        }
    }
}

#[cfg(test)]
mod tests {
    /// `centered6`'s arithmetic, checked on the host for every 6-bit value.
    #[test]
    fn six_bit_values_center_to_int8() {
        for q in 0u32..64 {
            let x = q ^ 0x20;
            let s = x & 0x20;
            let v = x | (s << 1) | (s << 2);
            assert_eq!(v as u8 as i8, q as i8 - 32, "{q}");
        }
    }

    /// The prmt selector that repeats byte i of a word in all four bytes.
    #[test]
    fn byte_broadcast_selectors() {
        for i in 0..4u32 {
            let sel = 0x1111 * i;
            let word = 0x4433_2211u32;
            let out: u32 = (0..4)
                .map(|b| {
                    let nib = (sel >> (4 * b)) & 7;
                    ((word >> (8 * nib)) & 0xFF) << (8 * b)
                })
                .sum();
            assert_eq!(out, ((i + 1) * 0x11) * 0x0101_0101);
        }
    }
}
