//! The activation format of the GEMV kernels: q8_1 quantization, laid out in tiles.
//!
//! ggml's CUDA matrix-vector path (MMVQ) pairs every weight type with q8_1: 32 int8 quants
//! per block, a f16 scale `d` and a f16 `s = d * sum(q)`. Stored as ggml stores it (36-byte
//! blocks) a thread's quants sit at 4-byte alignment between headers, so it cannot load
//! them 16 bytes at a time. Here the same blocks are stored by tiles of 256 weights:
//!
//! ```text
//! tile = [ 256 x i8 quants, in weight order ][ 8 x f16 d ][ 8 x i16 sum(q) ][ 8 x f16 s ]
//!                                                                             (304 bytes)
//! ```
//!
//! The quants, `d` and `s` are byte-identical to ggml's `quantize_row_q8_1_ref` (and so to
//! `smelt_quant`'s Q8_1): `s = f16(d * sum(q))` with `d = amax / 127` the unrounded f32.
//! The Q4_1/Q5_1 minimum term is ggml-cpu's `m * s`, so it rounds as the CPU backend does
//! (bench/RESULTS.md, H5: on SmolLM2 this cut the attention path's CUDA-vs-CPU difference by
//! a quarter to a third; the rest of that difference has other causes). The tile also holds the exact integer sum: the K-quant minima
//! and the Q4_0/Q5_0 offsets need it, and ggml's CUDA kernels recompute it exactly with
//! `dp4a` for the same reason. A row of `k` activations (k a multiple of 256) is `k / 256`
//! tiles; 304 bytes keep every tile 16-byte aligned.

use crate::ops::kernel_params;
use smelt_ptx::{
    Cmp, FloatRound, IntRound, Kernel, L2Prefetch, Load, Lut, Narrow, Pred, Reg, Shfl, Store, F16,
    F32, FULL_WARP, S32, U32, U64,
};
use smelt_quant::legacy::BlockQ8_1;
use smelt_quant::{GgmlType, Quantize};

use crate::{padded_tiles, KernelError, TILE};

/// Bytes of one tile of quantized activations.
pub const TILE_BYTES: usize = TILE + 3 * 8 * 2;
/// Offset of the eight f16 scales in a tile.
pub const D_OFFSET: usize = TILE;
/// Offset of the eight i16 quant sums in a tile.
pub const SUM_OFFSET: usize = TILE + 16;
/// Offset of the eight f16 `s = d * sum(q)` (ggml's Q8_1 `s`) in a tile.
pub const S_OFFSET: usize = TILE + 32;

/// Bytes of one token's quantized activations of length `k`.
pub fn row_bytes(k: usize) -> Result<usize, KernelError> {
    Ok(padded_tiles(k, "q8_1 activation tiles")? * TILE_BYTES)
}

/// CPU twin of [`quantize_kernel`]: quantizes `x` (rows of `k` floats, one per token) with
/// `smelt_quant`'s Q8_1 quantizer and lays the blocks out in tiles.
pub fn quantize_cpu(x: &[f32], k: usize) -> Result<Vec<u8>, KernelError> {
    let per_row = row_bytes(k)?;
    if x.len() % k != 0 {
        return Err(KernelError::BadLength {
            what: "activations",
            got: x.len() * 4,
            want: x.len().div_ceil(k) * k * 4,
        });
    }
    smelt_quant::check_finite(x, k)?;
    let padded = per_row / TILE_BYTES * TILE;
    let mut xp = vec![0f32; x.len() / k * padded];
    for (src, dst) in x.chunks_exact(k).zip(xp.chunks_exact_mut(padded)) {
        dst[..k].copy_from_slice(src);
    }
    let mut blocks = vec![<BlockQ8_1 as bytemuck::Zeroable>::zeroed(); xp.len() / 32];
    BlockQ8_1::quantize_row(&xp, &mut blocks);
    let mut out = vec![0u8; x.len() / k * per_row];
    for (b, block) in blocks.iter().enumerate() {
        let (tile, slot) = (b / 8, b % 8);
        let t = &mut out[tile * TILE_BYTES..(tile + 1) * TILE_BYTES];
        let quants: &[u8] = bytemuck::cast_slice(&block.qs);
        t[32 * slot..32 * slot + 32].copy_from_slice(quants);
        let d = D_OFFSET + 2 * slot;
        t[d..d + 2].copy_from_slice(&block.d.to_bits().to_le_bytes());
        let sum: i32 = block.qs.iter().map(|&q| i32::from(q)).sum();
        let s = SUM_OFFSET + 2 * slot;
        // |sum| <= 32 * 128: always an i16.
        t[s..s + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        let s = S_OFFSET + 2 * slot;
        t[s..s + 2].copy_from_slice(&block.s.to_bits().to_le_bytes());
    }
    Ok(out)
}

/// The activations of one tile as floats (`d * q`), for the CPU twins of the GEMVs.
pub fn dequantize_tile(tile: &[u8]) -> [f64; TILE] {
    std::array::from_fn(|i| {
        let slot = i / 32;
        let d = u16::from_le_bytes([tile[D_OFFSET + 2 * slot], tile[D_OFFSET + 2 * slot + 1]]);
        let d = half::f16::from_bits(d).to_f64();
        d * f64::from(tile[i] as i8)
    })
}

/// The ggml type whose quants and scales these are.
pub const GGML_TYPE: GgmlType = GgmlType::Q8_1;

/// Threads per block of [`quantize_kernel`] along y: one warp quantizes one tile.
pub const QUANTIZE_WARPS: u32 = 4;

kernel_params! {
    /// Arguments of [`quantize_kernel`], and of the GEMM's tile quantizer
    /// (`gemm::act::quantize_kernel`), which takes the same.
    QuantizeArgs, QuantizeRegs {
        x: Ptr,
        q: Ptr,
        k: U32,
        ntiles: U32,
    }
}

/// `q = quantize(x)` for `ntok` rows of `k` floats (`k` a multiple of 32, `ntiles =
/// ceil(k / 256)`; a partial last tile is written as zero blocks). Launch with blocks of
/// `(32, QUANTIZE_WARPS)` and a grid of `(ceil(ntiles / QUANTIZE_WARPS), ntok)`.
///
/// One warp per tile, eight floats per lane, four lanes per 32-weight block. Each step is
/// ggml's reference in the same float operations: `d = amax / 127` and `1 / d` as IEEE
/// divisions, `x * id` rounded half away from zero (truncate, then step by one when the
/// exact remainder is at least a half, as `smelt_quant` does), so the bytes match.
pub fn quantize_kernel(k: &Kernel) {
    let QuantizeRegs {
        x,
        q,
        k: len,
        ntiles,
    } = QuantizeRegs::declare(k);
    let LaneTile {
        lane,
        dst,
        inside,
        first,
    } = lane_tile(k, q, len, ntiles, TILE_BYTES as u32);
    let src = k.elem_addr(x, first, 4);

    let load = Load::GLOBAL_NC.prefetch(L2Prefetch::B256);
    let v: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    k.guarded(inside, |k| {
        k.ld_v4(load, [v[0], v[1], v[2], v[3]], src);
        k.ld_v4(load, [v[4], v[5], v[6], v[7]], src.at(16));
    });

    quantize_lane(k, &v, lane, dst);
}

/// Quantizes a lane's eight values (lanes 4b..4b+3 hold block b of the tile) into the tile
/// at `dst`: the block's `amax` and quant sum over its four lanes by shuffles, `d` and `1/d`
/// as IEEE divisions, quants rounded half away from zero. Shared by [`quantize_kernel`] and
/// the fused kernels that end in the same quantize.
pub(crate) fn quantize_lane(k: &Kernel, v: &[Reg<F32>; 8], lane: Reg<U32>, dst: Reg<U64>) {
    let amax = k.abs(k.reg(), v[0]);
    for &x in &v[1..] {
        let a = k.abs(k.reg(), x);
        k.max(amax, amax, a);
    }
    for offset in [1u32, 2] {
        let other = k.shfl_sync(Shfl::Bfly, k.reg(), amax, offset, FULL_WARP);
        k.max(amax, amax, other);
    }
    let d = k.div_rn(k.reg(), amax, 127.0f32);
    let id = k.div_rn(k.reg(), 1.0f32, d);
    let zero = k.cmp(Cmp::Eq, d, 0.0f32);
    k.selp(id, 0.0f32, id, zero);

    let quants: [Reg<S32>; 8] = std::array::from_fn(|i| round_away(k, k.mul(k.reg(), v[i], id)));
    let sum = k.add(k.reg(), quants[0], quants[1]);
    for &qv in &quants[2..] {
        k.add(sum, sum, qv);
    }
    for offset in [1u32, 2] {
        let other = k.shfl_sync(Shfl::Bfly, k.reg(), sum, offset, FULL_WARP);
        k.add(sum, sum, other);
    }
    let words = pack_quants(k, &quants);
    let qdst = k.add(k.reg(), dst, k.mul_wide(k.reg::<U64>(), lane, 8u32));
    k.st_v2(Store::GLOBAL, qdst, words);

    let slot = k.shr(k.reg(), lane, 2u32);
    let first = k.cmp(Cmp::Eq, k.and(k.reg(), lane, 3u32), 0u32);
    let hdst = k.add(k.reg(), dst, k.mul_wide(k.reg::<U64>(), slot, 2u32));
    store_header(k, first, hdst, d, sum);
}

/// What a lane of a tile-quantizing kernel (one warp a 256-value tile, eight values a lane,
/// blocks of `(32, QUANTIZE_WARPS)`, grid `(ceil(ntiles / QUANTIZE_WARPS), ntok)`) works on.
pub(crate) struct LaneTile {
    pub lane: Reg<U32>,
    /// The tile's address in the output (`tile_bytes` a tile).
    pub dst: Reg<U64>,
    /// Whether the lane's eight values are inside the row (all or none: rows are whole
    /// blocks of 32).
    pub inside: Reg<Pred>,
    /// Index of the lane's first value in the input rows (`len` apart).
    pub first: Reg<U32>,
}

/// The lane's tile, for the q8_1 quantizer, the fused GLU and the GEMM's tile quantizer;
/// warps past the last tile exit.
pub(crate) fn lane_tile(
    k: &Kernel,
    q: Reg<U64>,
    len: Reg<U32>,
    ntiles: Reg<U32>,
    tile_bytes: u32,
) -> LaneTile {
    let lane = k.tid_x();
    let tile = k.mad(k.reg(), k.ctaid_x(), QUANTIZE_WARPS, k.tid_y());
    k.exit_if(k.ge(tile, ntiles));
    let tok = k.ctaid_y();
    let index = k.mad(k.reg(), tok, ntiles, tile);
    let dst = k.elem_addr(q, index, tile_bytes);
    let col = k.shl(k.reg(), lane, 3u32);
    k.mad(col, tile, TILE as u32, col);
    let inside = k.lt(col, len);
    let first = k.mad(k.reg(), tok, len, col);
    LaneTile {
        lane,
        dst,
        inside,
        first,
    }
}

/// A lane's eight quants (each in the low byte of its register) as two words, first quant
/// in the lowest byte.
pub(crate) fn pack_quants(k: &Kernel, quants: &[Reg<S32>; 8]) -> [Reg<U32>; 2] {
    std::array::from_fn(|w| {
        let q4 = &quants[4 * w..4 * w + 4];
        let lo = k.prmt(
            k.reg::<U32>(),
            q4[0].cast::<U32>(),
            q4[1].cast::<U32>(),
            0x0040u32,
        );
        let hi = k.prmt(
            k.reg::<U32>(),
            q4[2].cast::<U32>(),
            q4[3].cast::<U32>(),
            0x0040u32,
        );
        k.prmt(k.reg::<U32>(), lo, hi, 0x5410u32)
    })
}

/// Stores a block's header at `hdst` (the tile's address plus twice the block's slot) from
/// the lane where `first` holds: `f16(d)`, the exact quant sum, and ggml's `s = f16(d *
/// sum)` from the unrounded f32 `d` (the sum, at most 32 * 128 in magnitude, converts
/// exactly), as `quantize_row_q8_1_ref` rounds it. Shared by every q8_1 tile writer.
pub(crate) fn store_header(
    k: &Kernel,
    first: Reg<Pred>,
    hdst: Reg<U64>,
    d: Reg<F32>,
    sum: Reg<S32>,
) {
    let dh = k.cvt(k.reg::<F16>(), d, FloatRound::Rn);
    let sf = k.cvt(k.reg::<F32>(), sum, FloatRound::Rn);
    let s = k.mul(k.reg(), sf, d);
    let sh = k.cvt(k.reg::<F16>(), s, FloatRound::Rn);
    k.guarded(first, |k| {
        k.st(Store::GLOBAL, hdst.at(D_OFFSET as i64), dh);
        k.st_narrow(Store::GLOBAL, Narrow::U16, hdst.at(SUM_OFFSET as i64), sum);
        k.st(Store::GLOBAL, hdst.at(S_OFFSET as i64), sh);
    });
}

/// `roundf(v)` as an integer: truncate, then step away from zero when the (exact)
/// remainder is at least one half.
pub(crate) fn round_away(k: &Kernel, v: Reg<F32>) -> Reg<S32> {
    let t = k.cvt(k.reg::<F32>(), v, IntRound::Rzi);
    let frac = k.sub(k.reg(), v, t);
    let up = k.cmp(Cmp::Ge, frac, 0.5f32);
    let down = k.cmp(Cmp::Le, frac, -0.5f32);
    let q = k.cvt(k.reg::<S32>(), t, IntRound::Rzi);
    let stepped = k.add(k.reg(), q, 1i32);
    k.selp(q, stepped, q, up);
    let lowered = k.sub(k.reg(), q, 1i32);
    k.selp(q, lowered, q, down);
    q
}

/// What one thread holds of one token's tile: the quants of two 32-weight blocks (eight
/// words each), their scales as f32, their quant sums and ggml's `s` as f32.
pub struct ActRegs {
    /// Quants of the first block (words 0..8) and the second (8..16).
    pub q: [Reg<U32>; 16],
    /// `d` of the two blocks.
    pub d: [Reg<F32>; 2],
    /// `sum(q)` of the two blocks.
    pub sum: [Reg<S32>; 2],
    /// ggml's `s = f16(d * sum(q))` of the two blocks, widened (the Q4_1/Q5_1 minimum
    /// term). Formats that do not read it leave its load dead, and ptxas drops it.
    pub s: [Reg<F32>; 2],
}

/// Byte offsets inside a tile of the two blocks a thread reads, computed once per thread.
#[derive(Clone, Copy)]
pub struct ActSlots {
    /// Offsets of the two blocks' quants.
    pub quants: [Reg<U64>; 2],
    /// Offsets of the two blocks' scales (the sum is 16 bytes further, `s` 32).
    pub header: [Reg<U64>; 2],
}

impl ActSlots {
    /// The slots of blocks `b0` and `b1` of a tile (0..8).
    pub fn new(k: &Kernel, b0: Reg<U32>, b1: Reg<U32>) -> Self {
        let quants = [b0, b1].map(|b| k.mul_wide(k.reg::<U64>(), b, 32u32));
        let header = [b0, b1].map(|b| {
            let off = k.mad(k.reg(), b, 2u32, D_OFFSET as u32);
            k.cvt(k.reg::<U64>(), off, smelt_ptx::Exact)
        });
        Self { quants, header }
    }
}

/// Issues the loads of a thread's share of `tile` (the tile's address) and converts the
/// scales; all loads are issued before the conversions.
pub fn load_tile(k: &Kernel, tile: Reg<U64>, slots: &ActSlots) -> ActRegs {
    let load = Load::GLOBAL_NC;
    let q = k.regs::<U32, 16>();
    let mut dh = [k.reg::<F16>(), k.reg::<F16>()];
    let mut sh = [k.reg::<F16>(), k.reg::<F16>()];
    let sum = [k.reg::<S32>(), k.reg::<S32>()];
    for b in 0..2 {
        let base = k.add(k.reg(), tile, slots.quants[b]);
        k.ld_v4(
            load,
            [q[8 * b], q[8 * b + 1], q[8 * b + 2], q[8 * b + 3]],
            base,
        );
        k.ld_v4(
            load,
            [q[8 * b + 4], q[8 * b + 5], q[8 * b + 6], q[8 * b + 7]],
            base.at(16),
        );
        let head = k.add(k.reg(), tile, slots.header[b]);
        dh[b] = k.ld(load, dh[b], head);
        k.ld_narrow(load, Narrow::S16, sum[b], head.at(16));
        sh[b] = k.ld(load, sh[b], head.at(32));
    }
    let d = dh.map(|h| k.cvt(k.reg::<F32>(), h, smelt_ptx::Exact));
    let s = sh.map(|h| k.cvt(k.reg::<F32>(), h, smelt_ptx::Exact));
    ActRegs { q, d, sum, s }
}

/// A `lop3` table: `(a & b) | c`.
pub fn and_or() -> Lut {
    Lut::from_fn(|a, b, c| (a & b) | c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn tiles_hold_ggml_quants_scales_s_and_exact_sums() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let k = 512;
        let x: Vec<f32> = (0..2 * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let tiles = quantize_cpu(&x, k).unwrap();
        // A row of 288 floats pads to two tiles; the padding is zero blocks.
        let short = quantize_cpu(&x[..2 * 288], 288).unwrap();
        assert_eq!(short.len(), 2 * 2 * TILE_BYTES);
        assert_eq!(&short[..TILE_BYTES], &tiles[..TILE_BYTES]);
        let pad = &short[TILE_BYTES..2 * TILE_BYTES];
        assert!(pad[32..TILE].iter().all(|&b| b == 0));
        assert!(pad[D_OFFSET + 2..SUM_OFFSET].iter().all(|&b| b == 0));
        assert!(pad[SUM_OFFSET + 2..S_OFFSET].iter().all(|&b| b == 0));
        assert!(pad[S_OFFSET + 2..].iter().all(|&b| b == 0));
        assert_eq!(tiles.len(), 2 * 2 * TILE_BYTES);
        let mut ggml = vec![0u8; 2 * k / 32 * 36];
        smelt_quant::quantize_row(GgmlType::Q8_1, &x, &mut ggml).unwrap();
        for b in 0..2 * k / 32 {
            let block = &ggml[36 * b..36 * b + 36];
            let tile = &tiles[(b / 8) * TILE_BYTES..];
            let slot = b % 8;
            assert_eq!(&tile[32 * slot..32 * slot + 32], &block[4..]);
            assert_eq!(
                &tile[D_OFFSET + 2 * slot..D_OFFSET + 2 * slot + 2],
                &block[..2]
            );
            let sum: i32 = block[4..].iter().map(|&q| i32::from(q as i8)).sum();
            let s =
                i16::from_le_bytes([tile[SUM_OFFSET + 2 * slot], tile[SUM_OFFSET + 2 * slot + 1]]);
            assert_eq!(i32::from(s), sum);
            // ggml's s = f16(d * sum): bytes 2..4 of its block.
            assert_eq!(
                &tile[S_OFFSET + 2 * slot..S_OFFSET + 2 * slot + 2],
                &block[2..4]
            );
        }
    }

    #[test]
    fn bad_shapes_and_values_are_errors() {
        assert!(quantize_cpu(&[0.0; 100], 100).is_err());
        assert!(quantize_cpu(&[0.0; 300], 256).is_err());
        assert!(quantize_cpu(&[0.0; 0], 0).is_err());
        let mut x = vec![0.0; 256];
        x[3] = f32::NAN;
        assert!(quantize_cpu(&x, 256).is_err());
    }
}
