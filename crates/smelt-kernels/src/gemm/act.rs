//! The GEMM's activation format: int8 quants with ONE f32 scale per 256-value tile (as
//! ggml-cpu's Q8_K, which its K-quant dot products use), not q8_1's scale per 32 values.
//!
//! Why not q8_1: with a scale per 32 activations every 32-weight group's exact int32 dot
//! product must be converted to float and scaled on its own (`cvt` runs at a quarter of the
//! FMA rate: that, not the tensor cores, bounded the first GEMM). With one scale per tile,
//! a tile's group products are summed in integers (`sum_g sc_g * isum_g`, and the K-quant
//! minima as a second chained `mma`), and floats enter once per tile.
//!
//! ```text
//! tile = [ 256 x i8 quants, in weight order ][ f32 d ][ 12 bytes of zeros ]   (272 bytes)
//! ```
//!
//! `d = amax / 127`, `q = round(x / d)` half away from zero (`x * (1 / d)`, both IEEE
//! divisions, as the q8_1 quantizer): the kernel and its twin do the same f32 operations, so
//! their bytes are equal. A row of `k` values (a multiple of 32) is `ceil(k / 256)` tiles,
//! the last one padded with zeros.

/// The quantize kernel takes the q8_1 quantizer's parameters (`x`, `q`, `k`, `ntiles`).
pub use crate::act::QuantizeArgs;
use crate::act::QuantizeRegs;
use smelt_ptx::{Cmp, Kernel, L2Prefetch, Load, Reg, Shfl, Store, F32, FULL_WARP, S32, U64};

use crate::{padded_tiles, KernelError, TILE};

/// Bytes of one tile.
pub const TILE_BYTES: usize = TILE + 16;
/// Offset of the tile's f32 scale.
pub const D_OFFSET: usize = TILE;

/// Name of the quantize kernel.
pub const QUANTIZE: &str = "quantize_q8_tile";
/// Warps per block of the quantize kernel (one warp a tile).
pub const QUANTIZE_WARPS: u32 = 4;

/// Bytes of one token's tiles for rows of `k` values.
pub fn row_bytes(k: usize) -> Result<usize, KernelError> {
    Ok(padded_tiles(k, "q8 activation tiles")? * TILE_BYTES)
}

/// The quantize kernel's launch for `ntok` rows of `k` values: grid and block.
pub fn quantize_launch(k: usize, ntok: usize) -> crate::ops::Launch {
    let ntiles = k.div_ceil(TILE) as u32;
    crate::ops::Launch::new(
        (ntiles.div_ceil(QUANTIZE_WARPS), ntok.max(1) as u32, 1),
        (32, QUANTIZE_WARPS, 1),
    )
}

/// CPU twin of [`quantize_kernel`]: the same tiles, byte for byte.
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
    let ntiles = per_row / TILE_BYTES;
    let mut out = vec![0u8; x.len() / k * per_row];
    for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(per_row)) {
        for t in 0..ntiles {
            let vals = &row[t * TILE..((t + 1) * TILE).min(k)];
            let amax = vals.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let tile = &mut dst[t * TILE_BYTES..(t + 1) * TILE_BYTES];
            for (i, &v) in vals.iter().enumerate() {
                tile[i] = ((v * id).round() as i32) as i8 as u8;
            }
            tile[D_OFFSET..D_OFFSET + 4].copy_from_slice(&d.to_le_bytes());
        }
    }
    Ok(out)
}

/// The values of one tile (`d * q`), for the GEMM's CPU twin.
pub fn dequantize_tile(tile: &[u8]) -> [f64; TILE] {
    let d = f32::from_le_bytes([
        tile[D_OFFSET],
        tile[D_OFFSET + 1],
        tile[D_OFFSET + 2],
        tile[D_OFFSET + 3],
    ]);
    std::array::from_fn(|i| f64::from(d) * f64::from(tile[i] as i8))
}

/// `q = quantize(x)` for `ntok` rows of `k` floats (`k` a multiple of 32). Parameters `x`,
/// `q`, `k`, `ntiles`; launch [`quantize_launch`]. One warp per tile, eight values a lane.
pub fn quantize_kernel(k: &Kernel) {
    let QuantizeRegs {
        x,
        q,
        k: len,
        ntiles,
    } = QuantizeRegs::declare(k);
    let crate::act::LaneTile {
        lane,
        dst,
        inside,
        first,
    } = crate::act::lane_tile(k, q, len, ntiles, TILE_BYTES as u32);
    let src = k.elem_addr(x, first, 4);
    let load = Load::GLOBAL_NC.prefetch(L2Prefetch::B256);
    let v: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    k.grid_dep_wait();
    k.guarded(inside, |k| {
        k.ld_v4(load, [v[0], v[1], v[2], v[3]], src);
        k.ld_v4(load, [v[4], v[5], v[6], v[7]], src.at(16));
    });
    let amax = k.abs(k.reg(), v[0]);
    for &x in &v[1..] {
        let a = k.abs(k.reg(), x);
        k.max(amax, amax, a);
    }
    for offset in [1u32, 2, 4, 8, 16] {
        let other = k.shfl_sync(Shfl::Bfly, k.reg(), amax, offset, FULL_WARP);
        k.max(amax, amax, other);
    }
    let d = k.div_rn(k.reg(), amax, 127.0f32);
    let id = k.div_rn(k.reg(), 1.0f32, d);
    let zero = k.cmp(Cmp::Eq, d, 0.0f32);
    k.selp(id, 0.0f32, id, zero);
    let quants: [Reg<S32>; 8] =
        std::array::from_fn(|i| crate::act::round_away(k, k.mul(k.reg(), v[i], id)));
    let words = crate::act::pack_quants(k, &quants);
    let qdst = k.add(k.reg(), dst, k.mul_wide(k.reg::<U64>(), lane, 8u32));
    k.st_v2(Store::GLOBAL, qdst, words);
    // The scale and the tile's zero padding, so the tile's bytes are all defined.
    let lead = k.eq(lane, 0u32);
    let z = k.f32(0.0);
    k.guarded(lead, |k| {
        k.st_v4(Store::GLOBAL, dst.at(D_OFFSET as i64), [d, z, z, z]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_hold_quants_and_one_scale() {
        let k = 320;
        let x: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.13)
            .collect();
        let q = quantize_cpu(&x, k).unwrap();
        assert_eq!(q.len(), 2 * 2 * TILE_BYTES);
        for (row, tiles) in x.chunks(k).zip(q.chunks(2 * TILE_BYTES)) {
            for (t, tile) in tiles.chunks(TILE_BYTES).enumerate() {
                let deq = dequantize_tile(tile);
                let vals = &row[t * TILE..((t + 1) * TILE).min(k)];
                let amax = vals.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (i, &v) in vals.iter().enumerate() {
                    assert!((deq[i] - f64::from(v)).abs() <= f64::from(amax) / 254.0 + 1e-6);
                }
                // The padding of the last tile is zeros.
                assert!(deq[vals.len()..].iter().all(|&v| v == 0.0));
                assert!(tile[D_OFFSET + 4..].iter().all(|&b| b == 0));
            }
        }
        assert!(quantize_cpu(&x[..100], 64).is_err());
    }

    #[test]
    fn an_all_zero_tile_has_zero_scale() {
        let q = quantize_cpu(&[0.0; 256], 256).unwrap();
        assert!(q.iter().all(|&b| b == 0));
    }
}
