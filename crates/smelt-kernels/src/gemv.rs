//! `y[t][r] = W[r] . x[t]` for quantized weights `W` (rows of `k`) and 1 to 8 tokens of
//! activations already quantized by [`crate::act::quantize_kernel`]: the decode-time
//! matrix-vector product.
//!
//! One warp per row; four threads per 256-weight tile, so a warp covers eight tiles per
//! step. Each step issues all of its loads (weights once, activations per token) before any
//! arithmetic, unpacks the weights once and dots them with every token's activations, so
//! 2..8 tokens read the weights once. The warp's partial sums meet in a butterfly.

use smelt_ptx::{Kernel, Store, U64};

use crate::act::{self, ActSlots};
use crate::formats::GpuFormat;
use crate::{tiles, GgmlType, KernelError, TILE};

/// Rows per block: blocks are `(32, ROWS_PER_CTA)` threads, one warp per row.
pub const ROWS_PER_CTA: u32 = 4;

/// Most tokens one launch handles.
pub const MAX_TOKENS: usize = 8;

/// The kernel's name for format `F` and `ntok` tokens.
pub fn name<F: GpuFormat>(ntok: usize) -> String {
    format!("gemv_{}_t{ntok}", F::NAME)
}

/// Emits the GEMV for `ntok` tokens. Parameters, in order: `w` (rows in `F`'s GPU layout),
/// `x` (`ntok` rows of quantized activations), `y` (`ntok x nrows` floats), `nrows`,
/// `ntiles` (`k / 256`), `row_bytes` (`F::row_bytes(k)`). Grid: `ceil(nrows / ROWS_PER_CTA)`.
pub fn kernel<F: GpuFormat>(k: &Kernel, ntok: usize) {
    if ntok == 0 || ntok > MAX_TOKENS {
        k.reject(format!("{ntok} tokens: the GEMV takes 1 to {MAX_TOKENS}"));
        return;
    }
    k.max_threads(32, ROWS_PER_CTA, 1);
    let w = k.param_ptr("w");
    let x = k.param_ptr("x");
    let y = k.param_ptr("y");
    let nrows = k.param_u32("nrows");
    let ntiles = k.param_u32("ntiles");
    let row_bytes = k.param_u32("row_bytes");

    let row = k.mad(k.reg(), k.ctaid_x(), ROWS_PER_CTA, k.tid_y());
    k.exit_if(k.ge(row, nrows));
    let lane = k.tid_x();
    let part = k.and(k.reg(), lane, 3u32);
    let first = k.shr(k.reg(), lane, 2u32);
    let wrow = k.add(k.reg(), w, k.mul_wide(k.reg::<U64>(), row, row_bytes));
    let setup = F::setup(k, part, ntiles);
    let (b0, b1) = F::act_blocks(k, part);
    let slots = ActSlots::new(k, b0, b1);
    let token_stride = k.mul_wide(k.reg::<U64>(), ntiles, act::TILE_BYTES as u32);
    let accs: Vec<_> = (0..ntok).map(|_| k.f32(0.0)).collect();

    k.stride_loop(first, ntiles, 8u32, |k, tile| {
        let weights = F::load(k, &setup, wrow, tile);
        let xtile = k.add(
            k.reg(),
            x,
            k.mul_wide(k.reg::<U64>(), tile, act::TILE_BYTES as u32),
        );
        let xs: Vec<_> = (0..ntok)
            .map(|t| {
                let at = if t == 0 {
                    xtile
                } else {
                    k.add(xtile, xtile, token_stride)
                };
                act::load_tile(k, at, &slots)
            })
            .collect();
        let decoded = F::decode(k, &setup, &weights);
        for (x, acc) in xs.iter().zip(&accs) {
            F::dot(k, &setup, &decoded, x, *acc);
        }
    });

    let sums: Vec<_> = accs.iter().map(|&a| k.warp_sum(a)).collect();
    k.if_(k.eq(lane, 0u32), |k| {
        let mut out = k.elem_addr(y, row, 4);
        let stride = k.mul_wide(k.reg::<U64>(), nrows, 4u32);
        for (t, s) in sums.iter().enumerate() {
            if t > 0 {
                out = k.add(out, out, stride);
            }
            k.st(Store::GLOBAL, out, *s);
        }
    });
}

/// CPU twin of [`kernel`]: `y[t][r] = sum_i W[r][i] * x[t][i]` in f64, with `W` dequantized
/// from its ggml bytes by `smelt_quant` and `x` dequantized from the activation tiles.
pub fn cpu(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<Vec<f32>, KernelError> {
    let ntiles = tiles(k, "GEMV")?;
    let want_x = ntok * ntiles * act::TILE_BYTES;
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
        .chunks_exact(act::TILE_BYTES)
        .flat_map(act::dequantize_tile)
        .collect();
    let mut y = vec![0f32; ntok * nrows];
    let mut w = vec![0f32; k];
    for r in 0..nrows {
        smelt_quant::dequantize_row(ty, &ggml[r * row_ggml..(r + 1) * row_ggml], &mut w)?;
        for t in 0..ntok {
            let xt = &xs[t * ntiles * TILE..(t + 1) * ntiles * TILE];
            let dot: f64 = w.iter().zip(xt).map(|(&a, &b)| f64::from(a) * b).sum();
            y[t * nrows + r] = dot as f32;
        }
    }
    Ok(y)
}
