//! Batched (prefill) matmul kernels in register tiles, with exactly the per-output float
//! operations of the one-output kernels in [`crate::backend::cpu::ggml_dot`] (so llama.cpp's bits).
//!
//! Why tiles: ggml's batch kernels (tinyBLAS, the repacked Q4_K gemm, the tiled K-quant
//! matmul) reuse each unpacked weight block for several tokens and each activation block for
//! several rows. Here each rayon task takes a few weight rows, unpacks them once into a
//! scratch layout made for `maddubs` (nibbles widened to bytes, scales widened to the
//! 16-bit vectors `madd` wants, block scales as f32), and then walks every token over them
//! in small tiles of rows x tokens whose accumulators stay in registers.
//!
//! What stays exact: every integer sum is exact whatever its grouping (no overflow in these
//! ranges), and every float operation of an output happens in ggml's order, lane for lane:
//! - Q4_1, Q5_0, Q8_0 (`vec_dot`/tinyBLAS order): eight lanes per output, one fused
//!   multiply-add per block with `d_w * d_a`, `hsum_float_8` at the end (Q4_1 adds its
//!   `m * s` chain after it);
//! - Q4_K (`gemm_q4_K_8x8` per pair of sub-blocks for each whole group of four tokens, the
//!   gemv per super-block for the rest): the pair's (or super-block's) exact integer sum
//!   fused-multiply-added with `d_w * d_a`, the mins likewise, one lane per output;
//! - Q6_K (tiled K-quant matmul, eight tokens or more): the super-block's exact integer sum
//!   times `d_w`, fused-multiply-added with `d_a`, one lane per output.

use std::arch::x86_64::*;
use std::cell::RefCell;

use rayon::prelude::*;
use smelt_quant::fp::f16_to_f32;

use crate::backend::cpu::ggml_dot::x86::{bytes_from_bits_32, bytes_from_nibbles_32, hsum_float_8};
use smelt_quant::kquants::{BlockQ4K, BlockQ6K, BlockQ8K};
use smelt_quant::legacy::{BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};

/// Weight rows per rayon task: their unpacked blocks stay in L1/L2 while every token of the
/// batch passes over them.
const ROWS_PER_TASK: usize = 16;

/// The output matrix `[token][row]`, written by several tasks at disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr {
    ptr: *mut f32,
    rows: usize,
}
// SAFETY: tasks write disjoint elements (each owns a range of rows).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `t * rows + r` is inside the output and no other task writes row `r`.
    #[inline(always)]
    unsafe fn put(self, t: usize, r: usize, v: f32) {
        *self.ptr.add(t * self.rows + r) = v;
    }
}

thread_local! {
    /// Per-thread scratch for unpacked weights (grown, never shrunk: no allocation per task).
    static SCRATCH: RefCell<Vec<__m256i>> = const { RefCell::new(Vec::new()) };
}

/// Runs `task(rows r0..r1, scratch)` over row chunks on rayon's threads.
fn for_row_chunks(rows: usize, task: impl Fn(usize, usize, &mut Vec<__m256i>) + Sync) {
    let n_chunks = rows.div_ceil(ROWS_PER_TASK);
    (0..n_chunks).into_par_iter().for_each(|c| {
        let r0 = c * ROWS_PER_TASK;
        let r1 = (r0 + ROWS_PER_TASK).min(rows);
        SCRATCH.with(|s| task(r0, r1, &mut s.borrow_mut()));
    });
}

/// Reserves `n` zeroed 32-byte units of scratch and views them as `T`s.
fn scratch_as<T: bytemuck::Pod>(s: &mut Vec<__m256i>, n_bytes: usize) -> &mut [T] {
    let n = n_bytes.div_ceil(32);
    if s.len() < n {
        // SAFETY: an all-zero __m256i is valid.
        s.resize(n, unsafe { _mm256_setzero_si256() });
    }
    // SAFETY: __m256i is plain bytes, 32-byte aligned; T is Pod with alignment <= 32.
    let bytes: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), n * 32) };
    bytemuck::cast_slice_mut(&mut bytes[..n_bytes - n_bytes % std::mem::size_of::<T>()])
}

/// Eight vectors of i32 lanes to one vector of their eight lane sums (exact).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn reduce8(a: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(a[0], a[1]);
    let h23 = _mm256_hadd_epi32(a[2], a[3]);
    let h45 = _mm256_hadd_epi32(a[4], a[5]);
    let h67 = _mm256_hadd_epi32(a[6], a[7]);
    let q0 = _mm256_hadd_epi32(h01, h23);
    let q1 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(q0, q1, 0x20),
        _mm256_permute2x128_si256(q0, q1, 0x31),
    )
}

// ---------------------------------------------------------------------------------------
// Q4_1, Q5_0, Q8_0: eight f32 lanes per output, one FMA per 32-weight block.
// ---------------------------------------------------------------------------------------

/// One unpacked legacy block of one row: the weights as bytes for `maddubs` (Q4_1: the
/// nibbles; signed formats: `|x|`, with the signs in `sx`), its scale and Q4_1's min.
pub(super) struct LegacyBlk {
    /// `maddubs`'s unsigned operand.
    ux: __m256i,
    /// Signed formats: the weights themselves (their signs go to the activations).
    sx: __m256i,
    d: f32,
    m: f32,
}

/// The same block of `LRM` rows side by side, as a tile reads them.
#[repr(C, align(32))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct LegacyGrp {
    ux: [[u8; 32]; LRM],
    sx: [[i8; 32]; LRM],
    d: [f32; LRM],
    m: [f32; LRM],
    _pad: [f32; 8 - 2 * LRM],
}

/// Rows per legacy tile and tokens per legacy tile (eight outputs).
const LRM: usize = 4;
const LRN: usize = 2;
/// Blocks whose `d_w * d_a` a tile computes ahead at once (a stack table).
const LCHUNK: usize = 64;

/// Legacy weight formats handled by [`legacy_batch`].
pub(super) trait LegacyTiled: Sized + Sync {
    /// The activation block (Q8_0 or Q8_1).
    type Act: Sync;
    /// Q4_1: unsigned weights and an `m * s` term; Q5_0/Q8_0: signed weights.
    const UNSIGNED: bool;
    /// # Safety
    /// AVX2 and F16C are available.
    unsafe fn unpack(&self) -> LegacyBlk;
    fn act_qs(a: &Self::Act) -> &[i8; 32];
    fn act_d(a: &Self::Act) -> f32;
    /// Q8_1's `s` (f32), 0 for Q8_0.
    fn act_s(a: &Self::Act) -> f32;
}

impl LegacyTiled for BlockQ4_1 {
    type Act = BlockQ8_1;
    const UNSIGNED: bool = true;
    #[inline(always)]
    unsafe fn unpack(&self) -> LegacyBlk {
        LegacyBlk {
            ux: bytes_from_nibbles_32(&self.qs),
            sx: _mm256_setzero_si256(),
            d: f16_to_f32(self.d),
            m: f16_to_f32(self.m),
        }
    }
    fn act_qs(a: &BlockQ8_1) -> &[i8; 32] {
        &a.qs
    }
    fn act_d(a: &BlockQ8_1) -> f32 {
        f16_to_f32(a.d)
    }
    fn act_s(a: &BlockQ8_1) -> f32 {
        f16_to_f32(a.s)
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn signed_blk(x: __m256i, d: half::f16) -> LegacyBlk {
    LegacyBlk {
        ux: _mm256_sign_epi8(x, x),
        sx: x,
        d: f16_to_f32(d),
        m: 0.0,
    }
}

impl LegacyTiled for BlockQ5_0 {
    type Act = BlockQ8_0;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack(&self) -> LegacyBlk {
        // The nibble minus 16 where the fifth bit is clear (as ggml's Q5_0 dot forms it).
        let hi = _mm256_andnot_si256(bytes_from_bits_32(self.qh), _mm256_set1_epi8(0xF0u8 as i8));
        signed_blk(_mm256_or_si256(bytes_from_nibbles_32(&self.qs), hi), self.d)
    }
    fn act_qs(a: &BlockQ8_0) -> &[i8; 32] {
        &a.qs
    }
    fn act_d(a: &BlockQ8_0) -> f32 {
        f16_to_f32(a.d)
    }
    fn act_s(_: &BlockQ8_0) -> f32 {
        0.0
    }
}

impl LegacyTiled for BlockQ8_0 {
    type Act = BlockQ8_0;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack(&self) -> LegacyBlk {
        signed_blk(_mm256_loadu_si256(self.qs.as_ptr().cast()), self.d)
    }
    fn act_qs(a: &BlockQ8_0) -> &[i8; 32] {
        &a.qs
    }
    fn act_d(a: &BlockQ8_0) -> f32 {
        f16_to_f32(a.d)
    }
    fn act_s(_: &BlockQ8_0) -> f32 {
        0.0
    }
}

/// Unpacks rows `r0..r1` (padded to whole groups by repeating the last) into `grp`.
#[target_feature(enable = "avx2,f16c")]
unsafe fn legacy_unpack<B: LegacyTiled>(
    w: &[B],
    w_per_row: usize,
    nb: usize,
    r0: usize,
    r1: usize,
    grp: &mut [LegacyGrp],
) {
    for g in 0..(r1 - r0).div_ceil(LRM) {
        for i in 0..LRM {
            let r = (r0 + g * LRM + i).min(r1 - 1);
            for (l, b) in w[r * w_per_row..r * w_per_row + nb].iter().enumerate() {
                let u = b.unpack();
                let d = &mut grp[g * nb + l];
                _mm256_store_si256(d.ux[i].as_mut_ptr().cast(), u.ux);
                _mm256_store_si256(d.sx[i].as_mut_ptr().cast(), u.sx);
                d.d[i] = u.d;
                d.m[i] = u.m;
            }
        }
    }
}

/// `out[t * rows + r] = w[r] · act[t]` for every token, in `vec_dot`'s order.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` holds `rows` rows of `w_per_row` blocks, `act`
/// `n_tok` rows of `a_per_row` blocks, the first `nb` of which are used; `out` has
/// `n_tok * rows` elements.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn legacy_batch<B: LegacyTiled>(
    w: &[B],
    rows: usize,
    w_per_row: usize,
    act: &[B::Act],
    a_per_row: usize,
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= n_tok * rows && w.len() >= rows * w_per_row);
    assert!(act.len() >= n_tok * a_per_row && nb <= w_per_row.min(a_per_row));
    // Activation scales (and Q8_1 sums) widened once: [token][block].
    let ad: Vec<f32> = (0..n_tok * nb)
        .map(|i| B::act_d(&act[(i / nb) * a_per_row + i % nb]))
        .collect();
    let asum: Vec<f32> = (0..if B::UNSIGNED { n_tok * nb } else { 0 })
        .map(|i| B::act_s(&act[(i / nb) * a_per_row + i % nb]))
        .collect();
    let o = OutPtr {
        ptr: out.as_mut_ptr(),
        rows,
    };
    for_row_chunks(rows, |r0, r1, scratch| {
        let n_grp = (r1 - r0).div_ceil(LRM);
        // [group][block], each the block of the group's rows side by side.
        let grp: &mut [LegacyGrp] =
            scratch_as(scratch, n_grp * nb * std::mem::size_of::<LegacyGrp>());
        legacy_unpack(w, w_per_row, nb, r0, r1, grp);
        let n_act = (act, a_per_row, &ad[..], &asum[..], n_tok);
        legacy_sweep::<B>(grp, nb, n_act, r0, r1, o);
    });
}

/// Every token over the unpacked groups of rows `r0..r1`, two at a time (one function, so
/// the tiles inline and cost no call each).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_sweep<B: LegacyTiled>(
    grp: &[LegacyGrp],
    nb: usize,
    (act, a_per_row, ad, asum, n_tok): (&[B::Act], usize, &[f32], &[f32], usize),
    r0: usize,
    r1: usize,
    o: OutPtr,
) {
    let n_grp = (r1 - r0).div_ceil(LRM);
    for t0 in (0..n_tok).step_by(LRN) {
        let tok: [usize; LRN] = std::array::from_fn(|j| (t0 + j).min(n_tok - 1));
        let acts = tok.map(|t| act.get_unchecked(t * a_per_row..t * a_per_row + nb));
        let ads = tok.map(|t| ad.get_unchecked(t * nb..(t + 1) * nb));
        let asums = tok.map(|t| {
            if B::UNSIGNED {
                asum.get_unchecked(t * nb..(t + 1) * nb)
            } else {
                &[][..]
            }
        });
        let n_t = (n_tok - t0).min(LRN);
        for g in 0..n_grp {
            let res = legacy_tile::<B>(grp.get_unchecked(g * nb..(g + 1) * nb), acts, ads, asums);
            let n_r = (r1 - r0 - g * LRM).min(LRM);
            for (i, res) in res.iter().enumerate().take(n_r) {
                for (j, &v) in res.iter().enumerate().take(n_t) {
                    o.put(t0 + j, r0 + g * LRM + i, v);
                }
            }
        }
    }
}

/// One tile: a group of `LRM` unpacked rows (`[block]`) times `LRN` tokens. Lane `4 j + i`
/// of the scale table and of Q4_1's `m * s` chains is row `i`, token `j`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn legacy_tile<B: LegacyTiled>(
    grp: &[LegacyGrp],
    act: [&[B::Act]; LRN],
    ad: [&[f32]; LRN],
    asum: [&[f32]; LRN],
) -> [[f32; LRN]; LRM] {
    const { assert!(LRM == 4 && LRN == 2) };
    let nb = grp.len();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); LRN]; LRM];
    let mut summs = _mm256_setzero_ps();
    // Written before read, block by block: no zeroing per tile.
    let mut dd = std::mem::MaybeUninit::<[[f32; 8]; LCHUNK]>::uninit();
    let dd = &mut *dd.as_mut_ptr();
    for c0 in (0..nb).step_by(LCHUNK) {
        let c1 = (c0 + LCHUNK).min(nb);
        // `d_w * d_a` of every output and block of the chunk, eight at once (each lane the
        // same f32 product ggml forms before broadcasting it).
        for l in c0..c1 {
            let g = grp.get_unchecked(l);
            let dw = _mm256_broadcast_ps(&*g.d.as_ptr().cast::<__m128>());
            let da = _mm256_set_m128(
                _mm_set1_ps(*ad[1].get_unchecked(l)),
                _mm_set1_ps(*ad[0].get_unchecked(l)),
            );
            _mm256_storeu_ps(dd[l - c0].as_mut_ptr(), _mm256_mul_ps(dw, da));
            if B::UNSIGNED {
                let m = _mm256_broadcast_ps(&*g.m.as_ptr().cast::<__m128>());
                let s = _mm256_set_m128(
                    _mm_set1_ps(*asum[1].get_unchecked(l)),
                    _mm_set1_ps(*asum[0].get_unchecked(l)),
                );
                summs = _mm256_fmadd_ps(m, s, summs);
            }
        }
        for l in c0..c1 {
            let g = grp.get_unchecked(l);
            let qy: [__m256i; LRN] = std::array::from_fn(|j| {
                _mm256_loadu_si256(B::act_qs(act[j].get_unchecked(l)).as_ptr().cast())
            });
            let ddl = dd.get_unchecked(l - c0);
            for (i, acc) in acc.iter_mut().enumerate() {
                let ux = _mm256_load_si256(g.ux[i].as_ptr().cast());
                for (j, acc) in acc.iter_mut().enumerate() {
                    let sy = if B::UNSIGNED {
                        qy[j]
                    } else {
                        _mm256_sign_epi8(qy[j], _mm256_load_si256(g.sx[i].as_ptr().cast()))
                    };
                    let p = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ux, sy));
                    let d = _mm256_broadcast_ss(ddl.get_unchecked(4 * j + i));
                    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
                }
            }
        }
    }
    let mut sm = [0f32; 8];
    _mm256_storeu_ps(sm.as_mut_ptr(), summs);
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            let v = hsum_float_8(acc[i][j]);
            if B::UNSIGNED {
                v + sm[4 * j + i]
            } else {
                v
            }
        })
    })
}

// ---------------------------------------------------------------------------------------
// K-quants: one lane per output (2 rows x 4 tokens), integer sums reduced across lanes.
// ---------------------------------------------------------------------------------------

/// Rows and tokens per K-quant tile (8 outputs: one f32 lane each).
const KRM: usize = 2;
const KRN: usize = 4;

/// One unpacked Q4_K super-block: sub-block `j`'s 32 weights as bytes (matching the
/// activation's `qs[32 j..]`), its scale as eight i16 (broadcast to both halves for
/// `madd`), the mins paired for `madd` with the activation's 16 `bsums`, and the f32 scales.
#[repr(C, align(32))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Q4kBlk {
    q: [[u8; 32]; 8],
    sc: [[i16; 8]; 8],
    mins: [i16; 16],
    d: f32,
    dmin: f32,
    _pad: [f32; 6],
}

fn scale_min_k4(j: usize, q: &[u8; 12]) -> (i16, i16) {
    if j < 4 {
        ((q[j] & 63) as i16, (q[j + 4] & 63) as i16)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i16,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i16,
        )
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q4k(a: &BlockQ4K, b: &mut Q4kBlk) {
    let m4 = _mm256_set1_epi8(15);
    for p in 0..4 {
        let v = _mm256_loadu_si256(a.qs.as_ptr().add(32 * p).cast());
        _mm256_store_si256(b.q[2 * p].as_mut_ptr().cast(), _mm256_and_si256(v, m4));
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        _mm256_store_si256(b.q[2 * p + 1].as_mut_ptr().cast(), hi);
    }
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &a.scales);
        b.sc[j] = [s; 8];
        b.mins[2 * j] = m;
        b.mins[2 * j + 1] = m;
    }
    b.d = f16_to_f32(a.d);
    b.dmin = f16_to_f32(a.dmin);
}

/// One unpacked Q6_K super-block: weights `32 c..32 c + 32` as bytes `0..64` (the -32 is
/// applied through the activation sums), each 32's two group scales as i16 for `madd`,
/// the sixteen scales again for the sums, and the f32 scale.
#[repr(C, align(32))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Q6kBlk {
    q: [[u8; 32]; 8],
    sc: [[i16; 16]; 8],
    sc16: [i16; 16],
    d: f32,
    _pad: [f32; 7],
}

/// Weights in their natural order as ggml's AVX2 Q6_K dot unpacks them (`q4_0..q4_3` of
/// each 128-weight half).
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q6k(a: &BlockQ6K, b: &mut Q6kBlk) {
    let m15 = _mm256_set1_epi8(15);
    for h in 0..2 {
        let l1 = _mm256_loadu_si256(a.ql.as_ptr().add(64 * h).cast());
        let l2 = _mm256_loadu_si256(a.ql.as_ptr().add(64 * h + 32).cast());
        let qh = _mm256_loadu_si256(a.qh.as_ptr().add(32 * h).cast());
        let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4);
        let h1 = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(12)), 2);
        let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(48));
        let h3 = _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(-64)), 2);
        let q = [
            _mm256_or_si256(_mm256_and_si256(l1, m15), h0),
            _mm256_or_si256(_mm256_and_si256(l2, m15), h1),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15), h2),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m15), h3),
        ];
        for (k, q) in q.into_iter().enumerate() {
            _mm256_store_si256(b.q[4 * h + k].as_mut_ptr().cast(), q);
        }
    }
    for c in 0..8 {
        let (s0, s1) = (a.scales[2 * c] as i16, a.scales[2 * c + 1] as i16);
        let v = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
        _mm256_store_si256(b.sc[c].as_mut_ptr().cast(), v);
    }
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast()));
    _mm256_store_si256(b.sc16.as_mut_ptr().cast(), sc16);
    b.d = f16_to_f32(a.d);
}

/// Which K-quant float order a tile uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KOrder {
    /// Q4_K gemm: one FMA per pair of sub-blocks.
    Q4kPair,
    /// Q4_K gemv: one FMA per super-block.
    Q4kBlock,
    /// Q6_K tiled: `(d_w * isum)` fused-multiply-added with `d_a`.
    Q6kTiled,
}

/// `out[t * rows + r]` for Q4_K weights: tokens `0..n_tok - n_tok % 4` in the repacked
/// gemm's order, the rest in the gemv's.
///
/// # Safety
/// AVX2, FMA and F16C are available; shapes as for [`legacy_batch`] in super-blocks.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn q4_k_batch(
    w: &[BlockQ4K],
    rows: usize,
    w_per_row: usize,
    act: &[BlockQ8K],
    a_per_row: usize,
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    k_batch(
        w,
        rows,
        w_per_row,
        act,
        a_per_row,
        nb,
        n_tok,
        out,
        unpack_q4k,
        |t| {
            if t < n_tok - n_tok % 4 {
                KOrder::Q4kPair
            } else {
                KOrder::Q4kBlock
            }
        },
    )
}

/// `out[t * rows + r]` for Q6_K weights in the tiled K-quant matmul's order (ggml takes it
/// for eight tokens or more).
///
/// # Safety
/// As [`q4_k_batch`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn q6_k_batch(
    w: &[BlockQ6K],
    rows: usize,
    w_per_row: usize,
    act: &[BlockQ8K],
    a_per_row: usize,
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    k_batch(
        w,
        rows,
        w_per_row,
        act,
        a_per_row,
        nb,
        n_tok,
        out,
        unpack_q6k,
        |_| KOrder::Q6kTiled,
    )
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn k_batch<B: Sync, U: bytemuck::Pod + Send + KBlk>(
    w: &[B],
    rows: usize,
    w_per_row: usize,
    act: &[BlockQ8K],
    a_per_row: usize,
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
    unpack: unsafe fn(&B, &mut U),
    order: impl Fn(usize) -> KOrder + Sync,
) {
    assert!(out.len() >= n_tok * rows && w.len() >= rows * w_per_row);
    assert!(act.len() >= n_tok * a_per_row && nb <= w_per_row.min(a_per_row));
    let o = OutPtr {
        ptr: out.as_mut_ptr(),
        rows,
    };
    for_row_chunks(rows, |r0, r1, scratch| {
        let n_rows = (r1 - r0).div_ceil(KRM) * KRM;
        let blk: &mut [U] = scratch_as(scratch, n_rows * nb * std::mem::size_of::<U>());
        for i in 0..n_rows {
            let r = (r0 + i).min(r1 - 1);
            for l in 0..nb {
                unpack(&w[r * w_per_row + l], &mut blk[i * nb + l]);
            }
        }
        let mut t0 = 0;
        while t0 < n_tok {
            // Tiles never mix the gemm and gemv tokens of Q4_K.
            let ord = order(t0);
            let tok: [usize; KRN] = std::array::from_fn(|j| {
                let t = (t0 + j).min(n_tok - 1);
                if order(t) == ord {
                    t
                } else {
                    t0
                }
            });
            let n_here = (0..KRN)
                .take_while(|&j| t0 + j < n_tok && order(t0 + j) == ord)
                .count();
            for g in 0..n_rows / KRM {
                let rows_g: [&[U]; KRM] =
                    std::array::from_fn(|i| &blk[(g * KRM + i) * nb..(g * KRM + i + 1) * nb]);
                let acts = tok.map(|t| &act[t * a_per_row..t * a_per_row + nb]);
                let res = U::tile(rows_g, acts, ord);
                for i in 0..KRM {
                    let r = r0 + g * KRM + i;
                    if r >= r1 {
                        break;
                    }
                    for j in 0..n_here {
                        o.put(t0 + j, r, res[j * KRM + i]);
                    }
                }
            }
            t0 += n_here;
        }
    });
}

/// An unpacked K-quant super-block and its 2x4 tile.
trait KBlk: Sized {
    /// Lane `KRM * j + i`: row `i` times token `j`.
    unsafe fn tile(w: [&[Self]; KRM], act: [&[BlockQ8K]; KRN], ord: KOrder) -> [f32; 8];
}

impl KBlk for Q4kBlk {
    #[inline(always)]
    unsafe fn tile(w: [&[Self]; KRM], act: [&[BlockQ8K]; KRN], ord: KOrder) -> [f32; 8] {
        if ord == KOrder::Q4kPair {
            q4k_tile::<true>(w, act)
        } else {
            q4k_tile::<false>(w, act)
        }
    }
}

impl KBlk for Q6kBlk {
    #[inline(always)]
    unsafe fn tile(w: [&[Self]; KRM], act: [&[BlockQ8K]; KRN], _: KOrder) -> [f32; 8] {
        q6k_tile(w, act)
    }
}

/// Lane vectors of the weight scale (`[d_r0, d_r1] x 4`) and the activation scale
/// (`d_t` twice each) for one super-block.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lane_scales(w: [f32; KRM], act: [&BlockQ8K; KRN]) -> (__m256, __m256) {
    let wv = _mm256_setr_ps(w[0], w[1], w[0], w[1], w[0], w[1], w[0], w[1]);
    let (a0, a1, a2, a3) = (act[0].d, act[1].d, act[2].d, act[3].d);
    let av = _mm256_setr_ps(a0, a0, a1, a1, a2, a2, a3, a3);
    (wv, av)
}

/// Per-pair min sums for the 8 outputs: `[p]` has lane `o` = `m_{2p} bs(2p) + m_{2p+1}
/// bs(2p+1)` of output `o` (from eight vectors whose lane `k` is `m_k bs(k)`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pair_sums(mv: &[__m256i; 8]) -> [__m256i; 4] {
    let h01 = _mm256_hadd_epi32(mv[0], mv[1]);
    let h23 = _mm256_hadd_epi32(mv[2], mv[3]);
    let h45 = _mm256_hadd_epi32(mv[4], mv[5]);
    let h67 = _mm256_hadd_epi32(mv[6], mv[7]);
    let sh = |a: __m256i, b: __m256i, odd: bool| {
        let (a, b) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
        _mm256_castps_si256(if odd {
            _mm256_shuffle_ps::<0b11_01_11_01>(a, b)
        } else {
            _mm256_shuffle_ps::<0b10_00_10_00>(a, b)
        })
    };
    // [o0..o3 of p0 | o0..o3 of p2] and so on.
    let e03 = sh(h01, h23, false);
    let o03 = sh(h01, h23, true);
    let e47 = sh(h45, h67, false);
    let o47 = sh(h45, h67, true);
    [
        _mm256_permute2x128_si256(e03, e47, 0x20),
        _mm256_permute2x128_si256(o03, o47, 0x20),
        _mm256_permute2x128_si256(e03, e47, 0x31),
        _mm256_permute2x128_si256(o03, o47, 0x31),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_tile<const PER_PAIR: bool>(w: [&[Q4kBlk]; KRM], act: [&[BlockQ8K]; KRN]) -> [f32; 8] {
    let nb = w[0].len();
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for l in 0..nb {
        let wb: [&Q4kBlk; KRM] = std::array::from_fn(|i| w[i].get_unchecked(l));
        let ab: [&BlockQ8K; KRN] = std::array::from_fn(|j| act[j].get_unchecked(l));
        let (dw, da) = lane_scales(wb.map(|b| b.d), ab);
        let (mw, _) = lane_scales(wb.map(|b| b.dmin), ab);
        let d = _mm256_mul_ps(dw, da);
        let dmin = _mm256_mul_ps(mw, da);
        let mut isum = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            for h in 0..2 {
                let jb = 2 * p + h;
                for i in 0..KRM {
                    let q = _mm256_load_si256(wb[i].q[jb].as_ptr().cast());
                    let sc =
                        _mm256_broadcastsi128_si256(_mm_load_si128(wb[i].sc[jb].as_ptr().cast()));
                    for j in 0..KRN {
                        let y = _mm256_loadu_si256(ab[j].qs.as_ptr().add(32 * jb).cast());
                        let v = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sc);
                        isum[KRM * j + i] = _mm256_add_epi32(isum[KRM * j + i], v);
                    }
                }
            }
            if PER_PAIR {
                let s = _mm256_cvtepi32_ps(reduce8(&isum));
                acc = _mm256_fmadd_ps(s, d, acc);
                isum = [_mm256_setzero_si256(); 8];
            }
        }
        if !PER_PAIR {
            let s = _mm256_cvtepi32_ps(reduce8(&isum));
            acc = _mm256_fmadd_ps(s, d, acc);
        }
        // Mins: lane k of mv[o] is m_k * bs(k) for output o.
        let mv: [__m256i; 8] = std::array::from_fn(|o| {
            let (i, j) = (o % KRM, o / KRM);
            _mm256_madd_epi16(
                _mm256_loadu_si256(ab[j].bsums.as_ptr().cast()),
                _mm256_load_si256(wb[i].mins.as_ptr().cast()),
            )
        });
        if PER_PAIR {
            for m in pair_sums(&mv) {
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dmin, acc_min);
            }
        } else {
            let m = _mm256_cvtepi32_ps(reduce8(&mv));
            acc_min = _mm256_fmadd_ps(m, dmin, acc_min);
        }
    }
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), _mm256_sub_ps(acc, acc_min));
    r
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_tile(w: [&[Q6kBlk]; KRM], act: [&[BlockQ8K]; KRN]) -> [f32; 8] {
    let nb = w[0].len();
    let mut acc = _mm256_setzero_ps();
    for l in 0..nb {
        let wb: [&Q6kBlk; KRM] = std::array::from_fn(|i| w[i].get_unchecked(l));
        let ab: [&BlockQ8K; KRN] = std::array::from_fn(|j| act[j].get_unchecked(l));
        let (dw, da) = lane_scales(wb.map(|b| b.d), ab);
        // The -32 offset: 32 * sum over groups of scale * bsum, per output.
        let mut isum: [__m256i; 8] = std::array::from_fn(|o| {
            let (i, j) = (o % KRM, o / KRM);
            let m = _mm256_madd_epi16(
                _mm256_loadu_si256(ab[j].bsums.as_ptr().cast()),
                _mm256_load_si256(wb[i].sc16.as_ptr().cast()),
            );
            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(m, 5))
        });
        for c in 0..8 {
            for i in 0..KRM {
                let q = _mm256_load_si256(wb[i].q[c].as_ptr().cast());
                let sc = _mm256_load_si256(wb[i].sc[c].as_ptr().cast());
                for j in 0..KRN {
                    let y = _mm256_loadu_si256(ab[j].qs.as_ptr().add(32 * c).cast());
                    let v = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sc);
                    isum[KRM * j + i] = _mm256_add_epi32(isum[KRM * j + i], v);
                }
            }
        }
        let res = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(reduce8(&isum)));
        acc = _mm256_fmadd_ps(res, da, acc);
    }
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), acc);
    r
}
