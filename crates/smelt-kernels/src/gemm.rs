//! Many-token matrix multiply of quantized weights on the tensor cores: `y[t][r] = W[r] ·
//! x[t]` for prompt chunks and batched decode, where the GEMV would read the weights again
//! for every eight tokens. The idea is ggml's MMQ (int8 `mma.sync` on unpacked weights and
//! q8_1 activations, block scales applied in f32); the layout and code are ours.
//!
//! A block of [`THREADS`] threads owns [`BM`] rows x [`BN`] tokens. For each 256-weight
//! tile of the rows it stages into shared memory:
//! - the rows' weights unpacked to int8, one f32 scale `dA` (and for formats with minima
//!   one f32 offset `mA`) per group of 16 or 32 weights ([`GemmFormat::stage`]);
//! - the tokens' q8_1 quants as they are (`cp.async`), and per 32-value block their scale
//!   `dB` and `sB = dB * sum(q)` as f32.
//!
//! Each warp then computes 32 rows x 32 tokens with int8 `mma.sync` (m16n8k32 for 32-weight
//! groups, m16n8k16 for 16) and folds each group's exact int32 dot products into f32,
//! `acc += cvt(isum) * (dA * dB) + mA * sB`, group after group in one fixed order. So an
//! output never depends on which other tokens share its launch or where a prompt was cut
//! into chunks: the GEMM is batch-invariant by construction.
//!
//! CPU twin: [`crate::gemv::cpu`] (the same product, in f64, from ggml's dequantized
//! weights and the activation tiles).

use smelt_ptx::{
    CpAsyncCache, Exact, FloatRound, Kernel, Load, Narrow, Pred, Reg, Store, B32, F32, S32, U32,
    U64,
};

use crate::act::{self, TILE_BYTES};
use crate::formats::{halves_to_f32, GpuFormat, Q4K, Q6K, Q8_0};
use crate::{GgmlType, TILE};

/// Rows of W per block.
pub const BM: u32 = 64;
/// Tokens per block.
pub const BN: u32 = 64;
/// Threads per block: four warps, each 32 rows x 32 tokens.
pub const THREADS: u32 = 128;
/// Bytes of one row's 256 int8 weights in shared memory: 16 more than 256, so the eight
/// rows an `mma` fragment load touches fall in different banks.
const A_STRIDE: u32 = TILE as u32 + 16;
/// Bytes of one token's 256 int8 quants in shared memory (padded as [`A_STRIDE`]).
const B_STRIDE: u32 = TILE as u32 + 16;
/// Bytes of one row's scales in shared memory: 8 (dA, mA) pairs, or 16 / 8 dA values.
const SC_STRIDE: u32 = 64;
/// Bytes of one token's eight (dB, sB) pairs in shared memory.
const BSC_STRIDE: u32 = 64;

/// Static shared memory of a GEMM block (over the decode kernels' 32 KB carveout: the
/// GEMMs get a carveout of their own, `smelt_cuda`).
pub const SHARED_BYTES: usize =
    (BM * A_STRIDE + BN * B_STRIDE + BM * SC_STRIDE + BN * BSC_STRIDE) as usize;

/// Fewest tokens for which a matmul takes the GEMM instead of the GEMV (which reads the
/// weights once per eight tokens). A first guess until measured on the card
/// (`SMELT_CUDA_GEMM_MIN` moves it for that measurement).
pub const MIN_TOKENS: usize = 16;

/// The kernel parameters, in order: the kernel declares them from this list and the host
/// packs [`Args`] in the same order, so the two cannot drift apart.
pub const PARAMS: [&str; 7] = ["w", "x", "y", "nrows", "ntok", "ntiles", "row_bytes"];

/// A kernel argument value, as the host passes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// A device address.
    Ptr(u64),
    /// A `u32` scalar.
    U32(u32),
}

/// One GEMM launch: weights `w` (`nrows` rows of `row_bytes` in the GPU layout), q8_1
/// activation tiles `x` (`ntok` rows of `ntiles` tiles), output `y` (`ntok x nrows` f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub nrows: u32,
    pub ntok: u32,
    pub ntiles: u32,
    pub row_bytes: u32,
}

impl Args {
    /// The values in [`PARAMS`] order.
    pub fn values(&self) -> [ArgValue; 7] {
        [
            ArgValue::Ptr(self.w),
            ArgValue::Ptr(self.x),
            ArgValue::Ptr(self.y),
            ArgValue::U32(self.nrows),
            ArgValue::U32(self.ntok),
            ArgValue::U32(self.ntiles),
            ArgValue::U32(self.row_bytes),
        ]
    }

    /// Grid (token blocks fastest, so the blocks that share rows run together and read the
    /// weights from L2) and block size.
    pub fn launch(&self) -> crate::ops::Launch {
        crate::ops::Launch::new(
            (
                self.ntok.div_ceil(BN).max(1),
                self.nrows.div_ceil(BM).max(1),
                1,
            ),
            (THREADS, 1, 1),
        )
    }
}

/// What a format's staging code works with: the block's rows, the tile, its thread index
/// and where in shared memory the unpacked weights and scales go.
#[derive(Clone, Copy)]
pub struct Stage {
    /// Thread index in the block (0..[`THREADS`]).
    pub tid: Reg<U32>,
    /// Tile index (256 weights) along the rows.
    pub tile: Reg<U32>,
    /// Tiles per row.
    pub ntiles: Reg<U32>,
    /// Shared address of row 0's int8 weights (rows [`A_STRIDE`] bytes apart, weight `i`
    /// of the tile at byte `i`).
    pub aq: Reg<U32>,
    /// Shared address of row 0's scales ([`SC_STRIDE`] bytes a row: `(dA, mA)` f32 pairs
    /// by group with minima, else `dA` by group).
    pub asc: Reg<U32>,
    w: Reg<U64>,
    row0: Reg<U32>,
    last_row: Reg<U32>,
    row_bytes: Reg<U32>,
}

impl Stage {
    /// Global address of the block's row `local` (clamped to the last row: rows past the
    /// end are read again and never stored).
    pub fn row(&self, k: &Kernel, local: Reg<U32>) -> Reg<U64> {
        let r = k.add(k.reg(), self.row0, local);
        k.min(r, r, self.last_row);
        k.add(
            k.reg(),
            self.w,
            k.mul_wide(k.reg::<U64>(), r, self.row_bytes),
        )
    }

    /// Shared address of byte `col` of row `local`'s weights.
    pub fn aq_at(&self, k: &Kernel, local: Reg<U32>, col: Reg<U32>) -> Reg<U32> {
        let a = k.mad(k.reg(), local, A_STRIDE, self.aq);
        k.add(a, a, col)
    }

    /// Shared address of row `local`'s scales.
    pub fn asc_at(&self, k: &Kernel, local: Reg<U32>) -> Reg<U32> {
        k.mad(k.reg(), local, SC_STRIDE, self.asc)
    }
}

/// A weight format the GEMM reads: how a tile of [`BM`] rows becomes int8 weights and
/// group scales in shared memory.
pub trait GemmFormat: GpuFormat {
    /// The kernel's name.
    const GEMM_NAME: &'static str;
    /// Weights per scale group: 32, or 16 for formats with 16-weight scales.
    const GROUP: u32;
    /// Whether a group has an offset (`w = dA q + mA`), taken with the activations' sums.
    const MIN: bool;
    /// Stages tile `s.tile` of the block's rows (all [`THREADS`] threads take part).
    fn stage(k: &Kernel, s: &Stage);
}

/// `x & mask` of each word.
fn masked<const N: usize>(k: &Kernel, v: [Reg<U32>; N], mask: u32) -> [Reg<U32>; N] {
    v.map(|w| k.and(k.reg(), w, mask))
}

impl GemmFormat for Q4K {
    const GEMM_NAME: &'static str = "gemm_q4_k";
    const GROUP: u32 = 32;
    const MIN: bool = true;

    /// ggml's 144-byte super-blocks: 16 bytes of header (d, dmin, twelve 6-bit scale and
    /// min bytes), then 128 bytes of nibbles; bytes `32j..32j+32` hold weights `64j + l`
    /// (low nibbles) and `64j + 32 + l` (high).
    fn stage(k: &Kernel, s: &Stage) {
        // Quants: thread takes 16-byte chunk `tid % 8` of rows `tid / 8 + 16 i`.
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
        let loads: Vec<[Reg<U32>; 4]> = (0..4u32)
            .map(|i| {
                let r = k.add(k.reg(), r0, 16 * i);
                let src = k.add(k.reg(), s.row(k, r), qoff);
                let q = k.regs::<U32, 4>();
                k.ld_v4(Load::GLOBAL_NC, q, src);
                q
            })
            .collect();
        // Header: row `tid % 64`, groups 4 (tid / 64) .. +4.
        let hr = k.and(k.reg(), s.tid, 63u32);
        let upper = k.shr(k.reg(), s.tid, 6u32);
        let hsrc = k.add(k.reg(), s.row(k, hr), tile_off);
        let h = k.regs::<U32, 4>();
        k.ld_v4(Load::GLOBAL_NC, h, hsrc);
        for (i, q) in loads.iter().enumerate() {
            let at = dst.at(i as i64 * 16 * A_STRIDE as i64);
            k.st_v4(Store::SHARED, at, masked(k, *q, 0x0F0F_0F0F));
            let hi = q.map(|w| k.shr(k.reg(), w, 4u32));
            let at = dst.at(i as i64 * 16 * A_STRIDE as i64 + 32);
            k.st_v4(Store::SHARED, at, masked(k, hi, 0x0F0F_0F0F));
        }
        let [d, dmin] = halves_to_f32(k, h[0]);
        let neg_dmin = k.neg(k.reg(), dmin);
        // Scales of groups 0..4 are bytes 0..4 & 63 (mins 4..8); of 4..8 the low or high
        // nibble of bytes 8..12 with the top two bits of bytes 0..8.
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
        let vals: Vec<Reg<F32>> = (0..4u32)
            .flat_map(|i| {
                let scf = k.cvt(
                    k.reg::<F32>(),
                    k.bfe(k.reg(), sc, 8 * i, 8u32),
                    FloatRound::Rn,
                );
                let mf = k.cvt(
                    k.reg::<F32>(),
                    k.bfe(k.reg(), m, 8 * i, 8u32),
                    FloatRound::Rn,
                );
                [k.mul(k.reg(), d, scf), k.mul(k.reg(), neg_dmin, mf)]
            })
            .collect();
        let sdst = s.asc_at(k, hr);
        k.mad(sdst, upper, 32u32, sdst);
        k.st_v4(Store::SHARED, sdst, [vals[0], vals[1], vals[2], vals[3]]);
        k.st_v4(
            Store::SHARED,
            sdst.at(16),
            [vals[4], vals[5], vals[6], vals[7]],
        );
    }
}

impl GemmFormat for Q8_0 {
    const GEMM_NAME: &'static str = "gemm_q8_0";
    const GROUP: u32 = 32;
    const MIN: bool = false;

    /// Repacked rows (`formats::q8_0`): all quants (256 bytes a tile, already int8), then
    /// all f16 scales (16 bytes a tile).
    fn stage(k: &Kernel, s: &Stage) {
        // Quants: thread copies 16-byte chunk `tid % 16` of rows `tid / 16 + 8 i`.
        let ch = k.and(k.reg(), s.tid, 15u32);
        let r0 = k.shr(k.reg(), s.tid, 4u32);
        let qoff = k.mul_wide(k.reg::<U64>(), s.tile, 256u32);
        k.add(qoff, qoff, k.mul_wide(k.reg::<U64>(), ch, 16u32));
        let col = k.shl(k.reg(), ch, 4u32);
        let dst = s.aq_at(k, r0, col);
        for i in 0..8u32 {
            let r = k.add(k.reg(), r0, 8 * i);
            let src = k.add(k.reg(), s.row(k, r), qoff);
            k.cp_async(
                CpAsyncCache::Cg,
                dst.at(i64::from(8 * i * A_STRIDE)),
                src,
                16,
            );
        }
        // Scales: row `tid % 64`, blocks 4 (tid / 64) .. +4.
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
    const MIN: bool = false;

    /// Repacked rows (`formats::q6_k`): all `ql` (128 bytes a tile), all `qh` (64), all
    /// int8 scales (16), all f16 `d` (2). In half `n` of a tile, `ql` bytes `64n + l` and
    /// `64n + 32 + l` and `qh` byte `32n + l` make weights `128n + l + 32 q` (q = 0..4).
    fn stage(k: &Kernel, s: &Stage) {
        // Thread: 16 positions `l = 16 (tid % 2)..` of half `(tid / 2) % 2` of rows
        // `tid / 4 + 32 i`.
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
        let ql = k.cvt(k.reg::<U64>(), ql, Exact);
        let qh = k.cvt(k.reg::<U64>(), qh, Exact);
        let col = k.mul(k.reg(), half, 128u32);
        k.mad(col, l16, 16u32, col);
        let dst = s.aq_at(k, r0, col);
        let loads: Vec<[[Reg<U32>; 4]; 3]> = (0..2u32)
            .map(|i| {
                let r = k.add(k.reg(), r0, 32 * i);
                let row = s.row(k, r);
                let lo = k.add(k.reg(), row, ql);
                let hb = k.add(k.reg(), row, qh);
                let v = [k.regs::<U32, 4>(), k.regs::<U32, 4>(), k.regs::<U32, 4>()];
                k.ld_v4(Load::GLOBAL_NC, v[0], lo);
                k.ld_v4(Load::GLOBAL_NC, v[1], lo.at(32));
                k.ld_v4(Load::GLOBAL_NC, v[2], hb);
                v
            })
            .collect();
        // Scales: row `tid % 64`, groups 8 (tid / 64) .. +8, and the row's d.
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
        for (i, [ql0, ql1, qh]) in loads.iter().enumerate() {
            let words = |f: &dyn Fn(usize) -> Reg<U32>| -> [Reg<U32>; 4] {
                std::array::from_fn(|w| centered6(k, f(w)))
            };
            let nib = |v: Reg<U32>, shift: u32| {
                let t = if shift == 0 {
                    k.copy(v)
                } else {
                    k.shr(k.reg(), v, shift)
                };
                k.and(t, t, 0x0F0F_0F0Fu32)
            };
            let top = |w: usize, q: u32| {
                let t = match q {
                    0 => k.shl(k.reg(), qh[w], 4u32),
                    1 => k.shl(k.reg(), qh[w], 2u32),
                    2 => k.copy(qh[w]),
                    _ => k.shr(k.reg(), qh[w], 2u32),
                };
                k.and(t, t, 0x3030_3030u32)
            };
            let q1 = words(&|w| k.or(k.reg(), nib(ql0[w], 0), top(w, 0)));
            let q2 = words(&|w| k.or(k.reg(), nib(ql1[w], 0), top(w, 1)));
            let q3 = words(&|w| k.or(k.reg(), nib(ql0[w], 4), top(w, 2)));
            let q4 = words(&|w| k.or(k.reg(), nib(ql1[w], 4), top(w, 3)));
            let base = i as i64 * 32 * A_STRIDE as i64;
            for (q, v) in [q1, q2, q3, q4].into_iter().enumerate() {
                k.st_v4(Store::SHARED, dst.at(base + 32 * q as i64), v);
            }
        }
        let [d, _] = halves_to_f32(k, dbits);
        let vals: Vec<Reg<F32>> = (0..8u32)
            .map(|i| {
                let sc = k.bfe(
                    k.reg::<S32>(),
                    sw[(i / 4) as usize].cast(),
                    8 * (i % 4),
                    8u32,
                );
                let f = k.cvt(k.reg::<F32>(), sc, FloatRound::Rn);
                k.mul(f, f, d)
            })
            .collect();
        let sdst = s.asc_at(k, hr);
        k.mad(sdst, upper, 32u32, sdst);
        k.st_v4(Store::SHARED, sdst, [vals[0], vals[1], vals[2], vals[3]]);
        k.st_v4(
            Store::SHARED,
            sdst.at(16),
            [vals[4], vals[5], vals[6], vals[7]],
        );
    }
}

/// `y = W x` for `ntok` tokens: see the module doc. Parameters [`PARAMS`]; launch
/// [`Args::launch`].
pub fn kernel<F: GemmFormat>(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
    let [w, x, y] = [PARAMS[0], PARAMS[1], PARAMS[2]].map(|n| k.param_ptr(n));
    let [nrows, ntok, ntiles, row_bytes] =
        [PARAMS[3], PARAMS[4], PARAMS[5], PARAMS[6]].map(|n| k.param_u32(n));
    let aq_s = k.shared::<U32>("gemm_aq", BM * A_STRIDE / 4, 16);
    let bq_s = k.shared::<U32>("gemm_bq", BN * B_STRIDE / 4, 16);
    let asc_s = k.shared::<F32>("gemm_asc", BM * SC_STRIDE / 4, 16);
    let bsc_s = k.shared::<F32>("gemm_bsc", BN * BSC_STRIDE / 4, 16);
    let aq = k.shared_base(&aq_s);
    let bq = k.shared_base(&bq_s);
    let asc = k.shared_base(&asc_s);
    let bsc = k.shared_base(&bsc_s);

    let tid = k.tid_x();
    let tok0 = k.mul(k.reg(), k.ctaid_x(), BN);
    let row0 = k.mul(k.reg(), k.ctaid_y(), BM);
    let last_row = k.sub(k.reg(), nrows, 1u32);
    let last_tok = k.sub(k.reg(), ntok, 1u32);
    let tok_stride = k.mul(k.reg(), ntiles, TILE_BYTES as u32);
    // The address of token `tok0 + local` (clamped: tokens past the end are read again and
    // never stored).
    let token = |local: Reg<U32>| {
        let t = k.add(k.reg(), tok0, local);
        k.min(t, t, last_tok);
        k.add(k.reg(), x, k.mul_wide(k.reg::<U64>(), t, tok_stride))
    };
    // B quants: thread copies 16-byte chunk `tid % 16` of tokens `tid / 16 + 8 i`.
    let bch = k.and(k.reg(), tid, 15u32);
    let bt0 = k.shr(k.reg(), tid, 4u32);
    let bsrc: Vec<Reg<U64>> = (0..8u32)
        .map(|i| {
            let src = token(k.add(k.reg(), bt0, 8 * i));
            k.add(src, src, k.mul_wide(k.reg::<U64>(), bch, 16u32))
        })
        .collect();
    let bdst = k.mad(k.reg(), bt0, B_STRIDE, bq);
    k.mad(bdst, bch, 16u32, bdst);
    // B scales: token `tid / 2`, blocks 4 (tid % 2) .. +4.
    let stok = k.shr(k.reg(), tid, 1u32);
    let shalf = k.and(k.reg(), tid, 1u32);
    let ssrc = token(stok);
    k.add(
        ssrc,
        ssrc,
        k.mad(
            k.reg::<U64>(),
            k.cvt(k.reg::<U64>(), shalf, Exact),
            8u64,
            act::D_OFFSET as u64,
        ),
    );
    let sdst = k.mad(k.reg(), stok, BSC_STRIDE, bsc);
    k.mad(sdst, shalf, 32u32, sdst);

    // Warp geometry: warp (wm, wn) computes rows 32 wm.. and tokens 32 wn..; lane (g, t).
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane = k.and(k.reg(), tid, 31u32);
    let g = k.shr(k.reg(), lane, 2u32);
    let t = k.and(k.reg(), lane, 3u32);
    let wm = k.and(k.reg(), warp, 1u32);
    let wn = k.shr(k.reg(), warp, 1u32);
    let arow = k.mad(k.reg(), wm, 32u32, g);
    let btok = k.mad(k.reg(), wn, 32u32, g);
    let afrag = k.mad(k.reg(), arow, A_STRIDE, aq);
    k.mad(afrag, t, 4u32, afrag);
    let bfrag = k.mad(k.reg(), btok, B_STRIDE, bq);
    k.mad(bfrag, t, 4u32, bfrag);
    let ascale = k.mad(k.reg(), arow, SC_STRIDE, asc);
    // Tokens 2t, 2t + 1 of each n-tile are the thread's accumulator columns.
    let ctok = k.mad(k.reg(), wn, 32u32, k.shl(k.reg(), t, 1u32));
    let bscale = k.mad(k.reg(), ctok, BSC_STRIDE, bsc);

    let stage = Stage {
        tid,
        tile: k.u32(0),
        ntiles,
        aq,
        asc,
        w,
        row0,
        last_row,
        row_bytes,
    };
    let acc: [[[Reg<F32>; 4]; 4]; 2] =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));
    let zero: [Reg<S32>; 4] = std::array::from_fn(|_| k.s32(0));

    k.grid_dep_wait();
    k.for_count(ntiles, |k, tile| {
        let stage = Stage { tile, ..stage };
        // Every warp is done with the previous tile's shared memory.
        k.bar_sync();
        let toff = k.mul_wide(k.reg::<U64>(), tile, TILE_BYTES as u32);
        for (i, &src) in bsrc.iter().enumerate() {
            let src = k.add(k.reg(), src, toff);
            k.cp_async(
                CpAsyncCache::Cg,
                bdst.at(i as i64 * 8 * B_STRIDE as i64),
                src,
                16,
            );
        }
        let src = k.add(k.reg(), ssrc, toff);
        let dw = k.regs::<U32, 2>();
        let sw = k.regs::<U32, 2>();
        k.ld_v2(Load::GLOBAL_NC, dw, src);
        k.ld_v2(
            Load::GLOBAL_NC,
            sw,
            src.at((act::SUM_OFFSET - act::D_OFFSET) as i64),
        );
        F::stage(k, &stage);
        let pairs: Vec<Reg<F32>> = (0..4usize)
            .flat_map(|i| {
                let [d0, d1] = halves_to_f32(k, dw[i / 2]);
                let db = if i % 2 == 0 { d0 } else { d1 };
                let sum = k.bfe(k.reg::<S32>(), sw[i / 2].cast(), 16 * (i as u32 % 2), 16u32);
                let sf = k.cvt(k.reg::<F32>(), sum, FloatRound::Rn);
                [db, k.mul(k.reg(), db, sf)]
            })
            .collect();
        k.st_v4(
            Store::SHARED,
            sdst,
            [pairs[0], pairs[1], pairs[2], pairs[3]],
        );
        k.st_v4(
            Store::SHARED,
            sdst.at(16),
            [pairs[4], pairs[5], pairs[6], pairs[7]],
        );
        k.cp_async_commit();
        k.cp_async_wait(0);
        k.bar_sync();
        compute_tile::<F>(k, afrag, bfrag, ascale, bscale, &acc, zero);
    });

    // Outputs: accumulator e of (mi, ni) is row arow + 16 mi + 8 (e / 2), token
    // ctok + 8 ni + e % 2.
    for (mi, per_n) in acc.iter().enumerate() {
        for h in 0..2u32 {
            let row = k.add(k.reg(), row0, arow);
            k.add(row, row, 16 * mi as u32 + 8 * h);
            let row_ok = k.lt(row, nrows);
            for (ni, c) in per_n.iter().enumerate() {
                for j in 0..2u32 {
                    let tok = k.add(k.reg(), tok0, ctok);
                    k.add(tok, tok, 8 * ni as u32 + j);
                    let ok = k.reg::<Pred>();
                    k.raw(format!("setp.lt.and.u32 {ok}, {tok}, {ntok}, {row_ok}"));
                    let idx = k.mad(k.reg(), tok, nrows, row);
                    let at = k.elem_addr(y, idx, 4);
                    k.guarded(ok, |k| {
                        k.st(Store::GLOBAL, at, c[(2 * h + j) as usize]);
                    });
                }
            }
        }
    }
}

/// The dot products of one staged tile: per scale group, each warp's 2 x 4 `mma` tiles,
/// then `acc += cvt(isum) * (dA * dB) (+ mA * sB)`.
fn compute_tile<F: GemmFormat>(
    k: &Kernel,
    afrag: Reg<U32>,
    bfrag: Reg<U32>,
    ascale: Reg<U32>,
    bscale: Reg<U32>,
    acc: &[[[Reg<F32>; 4]; 4]; 2],
    zero: [Reg<S32>; 4],
) {
    let groups = TILE as u32 / F::GROUP;
    for grp in 0..groups {
        let kb = i64::from(grp * F::GROUP);
        let blk = i64::from(grp * F::GROUP / 32);
        let lds = |at: smelt_ptx::Addr| k.ld(Load::SHARED, k.reg::<B32>(), at);
        let a: Vec<Vec<Reg<B32>>> = (0..2i64)
            .map(|mi| {
                let base = mi * 16 * A_STRIDE as i64 + kb;
                let down = 8 * A_STRIDE as i64;
                let mut v = vec![lds(afrag.at(base)), lds(afrag.at(base + down))];
                if F::GROUP == 32 {
                    v.push(lds(afrag.at(base + 16)));
                    v.push(lds(afrag.at(base + down + 16)));
                }
                v
            })
            .collect();
        let b: Vec<Vec<Reg<B32>>> = (0..4i64)
            .map(|ni| {
                let base = ni * 8 * B_STRIDE as i64 + kb;
                let mut v = vec![lds(bfrag.at(base))];
                if F::GROUP == 32 {
                    v.push(lds(bfrag.at(base + 16)));
                }
                v
            })
            .collect();
        // (dA, mA) of rows g and g + 8 of each m-tile.
        let sa: Vec<[(Reg<F32>, Option<Reg<F32>>); 2]> = (0..2i64)
            .map(|mi| {
                std::array::from_fn(|h| {
                    let at = mi * 16 * SC_STRIDE as i64 + h as i64 * 8 * SC_STRIDE as i64;
                    if F::MIN {
                        let v = k.regs::<F32, 2>();
                        k.ld_v2(Load::SHARED, v, ascale.at(at + 8 * i64::from(grp)));
                        (v[0], Some(v[1]))
                    } else {
                        let v = k.ld(
                            Load::SHARED,
                            k.reg::<F32>(),
                            ascale.at(at + 4 * i64::from(grp)),
                        );
                        (v, None)
                    }
                })
            })
            .collect();
        // (dB, sB) of tokens 2t and 2t + 1 of each n-tile.
        let sb: Vec<[[Reg<F32>; 2]; 2]> = (0..4i64)
            .map(|ni| {
                std::array::from_fn(|j| {
                    let v = k.regs::<F32, 2>();
                    let at = (ni * 8 + j as i64) * BSC_STRIDE as i64 + 8 * blk;
                    k.ld_v2(Load::SHARED, v, bscale.at(at));
                    v
                })
            })
            .collect();
        for mi in 0..2 {
            for ni in 0..4 {
                let c = k.regs::<S32, 4>();
                if F::GROUP == 32 {
                    k.mma_m16n8k32_s8(
                        c,
                        [a[mi][0], a[mi][1], a[mi][2], a[mi][3]],
                        [b[ni][0], b[ni][1]],
                        zero,
                    );
                } else {
                    k.mma_m16n8k16_s8(c, [a[mi][0], a[mi][1]], b[ni][0], zero);
                }
                for e in 0..4 {
                    let (h, j) = (e / 2, e % 2);
                    let (da, ma) = sa[mi][h];
                    let [db, sbv] = sb[ni][j];
                    let cf = k.cvt(k.reg::<F32>(), c[e], FloatRound::Rn);
                    let p = k.mul(k.reg(), da, db);
                    let dst = acc[mi][ni][e];
                    k.fma(dst, cf, p, dst);
                    if let Some(ma) = ma {
                        k.fma(dst, ma, sbv, dst);
                    }
                }
            }
        }
    }
}

/// Weight types with a GEMM, and their kernel names.
pub const TYPES: [(GgmlType, &str); 3] = [
    (GgmlType::Q4_K, Q4K::GEMM_NAME),
    (GgmlType::Q6_K, Q6K::GEMM_NAME),
    (GgmlType::Q8_0, Q8_0::GEMM_NAME),
];

/// The GEMM kernel's name for `ty`, if it has one.
pub fn name(ty: GgmlType) -> Option<&'static str> {
    TYPES.iter().find(|(t, _)| *t == ty).map(|(_, n)| *n)
}

/// Every GEMM kernel, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    vec![
        (Q4K::GEMM_NAME.to_string(), Box::new(kernel::<Q4K>)),
        (Q6K::GEMM_NAME.to_string(), Box::new(kernel::<Q6K>)),
        (Q8_0::GEMM_NAME.to_string(), Box::new(kernel::<Q8_0>)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn every_gemm_builds_and_fits_static_shared_memory() {
        assert!(SHARED_BYTES <= 48 * 1024, "{SHARED_BYTES}");
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k)).unwrap();
            }
            let ptx = m.to_ptx();
            for (_, name) in TYPES {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
            }
        }
    }

    #[test]
    fn launch_covers_ragged_shapes() {
        let a = Args {
            w: 0,
            x: 0,
            y: 0,
            nrows: 65,
            ntok: 3,
            ntiles: 1,
            row_bytes: 144,
        };
        let l = a.launch();
        assert_eq!(l.grid, (1, 2, 1));
        assert_eq!(l.block, (THREADS, 1, 1));
        assert_eq!(a.values().len(), PARAMS.len());
    }

    #[test]
    fn types_have_gemv_layouts() {
        for (ty, name) in TYPES {
            assert!(crate::catalog::row_bytes(ty, 256).is_ok(), "{name}");
            assert_eq!(super::name(ty), Some(name));
        }
        assert_eq!(super::name(GgmlType::Q4_0), None);
    }
}
