//! The GEMV's CPU twins: the f64 product of the dequantized weights with the dequantized
//! activation tiles ([`cpu`], [`cpu_with_magnitude`]; [`dot_twin`], which the GEMM's twin
//! shares with its own tiles), and the twins of the fused residual norm's tiles, partial
//! sums and scale. What a GPU check compares the kernels against; no PTX here.

use super::NORM_ROWS_PER_CTA;
use crate::act;
use crate::{padded_tiles, GgmlType, KernelError, TILE};

/// CPU twin of [`kernel`]: `y[t][r] = sum_i W[r][i] * x[t][i]` in f64, with `W` dequantized
/// from its ggml bytes by `smelt_quant` and `x` dequantized from the activation tiles.
///
/// [`kernel`]: super::kernel
pub fn cpu(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<Vec<f32>, KernelError> {
    Ok(cpu_with_magnitude(ty, ggml, nrows, k, x, ntok)?.0)
}

/// [`cpu`], plus each output's `sum_i |W[r][i] * x[t][i]|`: the scale that float rounding
/// errors of a dot product grow with, so a parity check can bound the error by it instead
/// of by the result (which cancellation can make arbitrarily small).
pub fn cpu_with_magnitude(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let tiles = TwinTiles {
        tile_bytes: act::TILE_BYTES,
        dequantize: act::dequantize_tile,
        // The Q4_1/Q5_1 minimum term as ggml-cpu rounds it (`m * s`).
        shift: &|row: &[u8], tiles: &[u8]| {
            crate::formats::legacy::cpu_min_term_shift(ty, row, tiles, k)
        },
    };
    dot_twin(ty, ggml, nrows, k, x, ntok, &tiles)
}

/// How a twin reads one token's activation tiles.
pub(crate) struct TwinTiles<'a> {
    /// Bytes of one tile.
    pub tile_bytes: usize,
    /// The tile's 256 values.
    pub dequantize: fn(&[u8]) -> [f64; TILE],
    /// What to add to a row's product with one token's tiles (`ggml` row, tiles).
    pub shift: &'a dyn Fn(&[u8], &[u8]) -> f64,
}

/// `y[t][r] = sum_i W[r][i] * x[t][i]` in f64 and each output's `sum_i |W[r][i] x[t][i]|`,
/// `W` dequantized from its ggml bytes by `smelt_quant`, `x` from `ntok` rows of tiles: the
/// CPU twin of the GEMV and of the GEMM (which differ in their activation tiles).
pub(crate) fn dot_twin(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
    tiles: &TwinTiles<'_>,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let ntiles = padded_tiles(k, "matmul twin")?;
    let want_x = ntok * ntiles * tiles.tile_bytes;
    if x.len() != want_x {
        return Err(KernelError::BadLength {
            what: "quantized activations",
            got: x.len(),
            want: want_x,
        });
    }
    let row_ggml = k / ty.block_size() * ty.type_size();
    if ggml.len() != nrows * row_ggml {
        return Err(KernelError::BadLength {
            what: "ggml weights",
            got: ggml.len(),
            want: nrows * row_ggml,
        });
    }
    let xs: Vec<f64> = x
        .chunks_exact(tiles.tile_bytes)
        .flat_map(tiles.dequantize)
        .collect();
    let mut y = vec![0f32; ntok * nrows];
    let mut mag = vec![0f64; ntok * nrows];
    let mut w = vec![0f32; k];
    for r in 0..nrows {
        let row = &ggml[r * row_ggml..(r + 1) * row_ggml];
        smelt_quant::dequantize_row(ty, row, &mut w)?;
        for t in 0..ntok {
            let xt = &xs[t * ntiles * TILE..t * ntiles * TILE + k];
            let (mut dot, mut abs) = (0f64, 0f64);
            for (&a, &b) in w.iter().zip(xt) {
                let p = f64::from(a) * b;
                dot += p;
                abs += p.abs();
            }
            let own = &x[t * ntiles * tiles.tile_bytes..(t + 1) * ntiles * tiles.tile_bytes];
            y[t * nrows + r] = (dot + (tiles.shift)(row, own)) as f32;
            mag[t * nrows + r] = abs;
        }
    }
    Ok((y, mag))
}

/// CPU twin of a [`Fuse::ResidualNorm`] GEMV's tiles: the q8_1 tiles of `res * g` (f32
/// products, as the kernel forms them) for the updated `res`, padded with zero blocks.
///
/// [`Fuse::ResidualNorm`]: super::Fuse::ResidualNorm
pub fn residual_norm_tiles(res: &[f32], g: &[f32]) -> Result<Vec<u8>, KernelError> {
    if res.len() != g.len() || res.is_empty() || res.len() % 32 != 0 {
        return Err(KernelError::BadLength {
            what: "residual row (a multiple of 32, as long as the norm's weights)",
            got: res.len(),
            want: g.len().div_ceil(32).max(1) * 32,
        });
    }
    let v: Vec<f32> = res.iter().zip(g).map(|(&r, &w)| r * w).collect();
    act::quantize_cpu(&v, v.len())
}

/// CPU twin of a [`Fuse::ResidualNorm`] GEMV's partial sums: `sum(res²)` over each block's
/// [`NORM_ROWS_PER_CTA`] rows of the updated `res`, in f64.
///
/// [`Fuse::ResidualNorm`]: super::Fuse::ResidualNorm
pub fn residual_norm_partials(res: &[f32]) -> Vec<f64> {
    res.chunks(NORM_ROWS_PER_CTA as usize)
        .map(|c| c.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
        .collect()
}

/// CPU twin of a [`Fuse::RmsInput`] GEMV's scale: `1 / sqrt(sum(partials) / n + eps)`.
///
/// [`Fuse::RmsInput`]: super::Fuse::RmsInput
pub fn rms_input_scale(partials: &[f64], n: usize, eps: f32) -> f64 {
    let total: f64 = partials.iter().sum();
    1.0 / (total / n as f64 + f64::from(eps)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The twin computes what it says: the dot of the dequantized weights with the
    /// dequantized activations, close to the dot of the original floats.
    #[test]
    fn twin_is_close_to_the_float_product() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (nrows, k, ntok) = (5, 512, 2);
        let w: Vec<f32> = (0..nrows * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..ntok * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let q = act::quantize_cpu(&x, k).unwrap();
        // smelt-quant has no IQ4 quantizer; the GPU check covers those with random blocks.
        for ty in crate::catalog::GEMV_TYPES
            .into_iter()
            .filter(|&t| smelt_quant::can_quantize(t))
        {
            let row = k / ty.block_size() * ty.type_size();
            let mut ggml = vec![0u8; nrows * row];
            for (src, dst) in w.chunks_exact(k).zip(ggml.chunks_exact_mut(row)) {
                smelt_quant::quantize_row(ty, src, dst).unwrap();
            }
            let (y, mag) = cpu_with_magnitude(ty, &ggml, nrows, k, &q, ntok).unwrap();
            for t in 0..ntok {
                for r in 0..nrows {
                    let exact: f64 = (0..k)
                        .map(|i| f64::from(w[r * k + i]) * f64::from(x[t * k + i]))
                        .sum();
                    let got = f64::from(y[t * nrows + r]);
                    // Quantization error: a few percent of the magnitude at most.
                    assert!((got - exact).abs() < 0.05 * mag[t * nrows + r], "{ty:?}");
                }
            }
        }
    }

    /// The split residual norm computes the unfused one: a GEMV over the unscaled tiles of
    /// `res * g`, scaled by `1 / rms` from the partial sums, is the GEMV over the tiles of
    /// `rms_norm(res) * g` up to quantization rounding, for a row that does not fill its
    /// last tile (576) and one that does.
    #[test]
    fn split_residual_norm_is_the_norm_then_the_gemv() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [576, 1024] {
            let nrows = 6;
            let res: Vec<f32> = (0..n).map(|_| rng.gen_range(-30.0..30.0)).collect();
            let g: Vec<f32> = (0..n).map(|_| rng.gen_range(0.5..1.5)).collect();
            let w: Vec<f32> = (0..nrows * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let ty = GgmlType::Q8_0;
            let row = n / ty.block_size() * ty.type_size();
            let mut ggml = vec![0u8; nrows * row];
            for (src, dst) in w.chunks_exact(n).zip(ggml.chunks_exact_mut(row)) {
                smelt_quant::quantize_row(ty, src, dst).unwrap();
            }
            let eps = 1e-5;
            let mut x = res.clone();
            let (_, normed_q) = crate::fused::cpu(&mut x, None, &g, eps).unwrap();
            let want = cpu(ty, &ggml, nrows, n, &normed_q, 1).unwrap();
            let tiles = residual_norm_tiles(&res, &g).unwrap();
            assert_eq!(tiles.len(), normed_q.len());
            let parts = residual_norm_partials(&res);
            assert_eq!(parts.len(), n / 32);
            let inv = rms_input_scale(&parts, n, eps);
            let exact: f64 = res.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            assert!((inv - 1.0 / (exact + 1e-5).sqrt()).abs() < 1e-12);
            let got = cpu(ty, &ggml, nrows, n, &tiles, 1).unwrap();
            for (g, w) in got.iter().zip(&want) {
                let scaled = f64::from(*g) * inv;
                assert!((scaled - f64::from(*w)).abs() < 0.02 * f64::from(w.abs()).max(1.0));
            }
        }
        assert!(residual_norm_tiles(&[1.0; 40], &[1.0; 40]).is_err());
        assert!(residual_norm_tiles(&[1.0; 32], &[1.0; 64]).is_err());
    }

    #[test]
    fn twin_checks_its_inputs() {
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 256, &[0; 10], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 100], 1, 256, &[0; act::TILE_BYTES], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 100, &[0; act::TILE_BYTES], 1).is_err());
    }
}
