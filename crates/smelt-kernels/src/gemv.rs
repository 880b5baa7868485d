//! `y[t][r] = W[r] . x[t]` for quantized weights `W` (rows of `k`) and 1 to 8 tokens of
//! activations already quantized by [`crate::act::quantize_kernel`]: the decode-time
//! matrix-vector product.
//!
//! One warp per row; four threads per 256-weight tile, so a warp covers eight tiles per
//! step. Each step issues all of its loads (weights once, activations per token) before any
//! arithmetic, unpacks the weights once and dots them with every token's activations, so
//! 2..8 tokens read the weights once. The warp's partial sums meet in a butterfly.

use smelt_ptx::{Cmp, Kernel, Store, U32, U64};

use crate::act::{self, ActSlots};
use crate::formats::{GpuFormat, WeightLoad};
use crate::{padded_tiles, GgmlType, KernelError, TILE};

/// Warps per block: blocks are `(32, WARPS_PER_CTA)` threads.
pub const WARPS_PER_CTA: u32 = 4;

/// Most tokens one launch handles.
pub const MAX_TOKENS: usize = 8;

/// The shape of one GEMV kernel: what is fixed when its PTX is generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tokens (activation rows) per launch, 1..=8.
    pub ntok: usize,
    /// Weight rows per warp: more rows put more loads in flight per thread and share the
    /// activation loads between rows.
    pub rows_per_warp: u32,
    /// Ends each step's loads with a branch that depends on all of them and is never taken,
    /// so ptxas issues every load before the first use instead of interleaving them.
    pub pin_loads: bool,
    /// Weight loads skip L1 (`.L1::no_allocate`), keeping it for the activations.
    pub no_l1: bool,
    /// Tokens whose activations are loaded (and pinned) with the weights; the others are
    /// loaded one at a time just before their dot products, which keeps fewer registers
    /// live when there are many tokens.
    pub act_ahead: usize,
}

impl Config {
    /// The default for `ntok` tokens: the fastest measured (H200, 2026-11-22, CUDA-graph
    /// replays: two rows per warp with pinned loads took Q4_K at 14336x4096 from 68% to 77%
    /// of the device copy rate, Q6_K from 54% to 79%, and 2-token Q4_K from 51% to 67%).
    pub fn new(ntok: usize) -> Self {
        Self {
            ntok,
            rows_per_warp: 2,
            pin_loads: true,
            no_l1: false,
            act_ahead: ntok,
        }
    }

    /// Rows one block covers: the grid is `ceil(nrows / rows_per_cta())`.
    pub fn rows_per_cta(&self) -> u32 {
        WARPS_PER_CTA * self.rows_per_warp
    }

    /// The kernel's name for format `F`.
    pub fn name<F: GpuFormat>(&self) -> String {
        let mut n = format!("gemv_{}_t{}", F::NAME, self.ntok);
        if *self != Config::new(self.ntok) {
            n.push_str(&format!("_r{}", self.rows_per_warp));
        } else {
            return n;
        }
        if !self.pin_loads {
            n.push_str("_nopin");
        }
        if self.no_l1 {
            n.push_str("_nol1");
        }
        if self.act_ahead != self.ntok {
            n.push_str(&format!("_a{}", self.act_ahead));
        }
        n
    }
}

/// The default kernel's name for format `F` and `ntok` tokens.
pub fn name<F: GpuFormat>(ntok: usize) -> String {
    Config::new(ntok).name::<F>()
}

/// Emits the GEMV. Parameters, in order: `w` (rows in `F`'s GPU layout), `x` (`ntok` rows
/// of quantized activations), `y` (`ntok x nrows` floats), `nrows`, `ntiles` (`ceil(k / 256)`),
/// `row_bytes` (`F::row_bytes(k)`), `never` (0: the pinning branch's operand). Blocks of
/// `(32, WARPS_PER_CTA)`, grid `ceil(nrows / cfg.rows_per_cta())`.
pub fn kernel<F: GpuFormat>(k: &Kernel, cfg: Config) {
    let ntok = cfg.ntok;
    if ntok == 0 || ntok > MAX_TOKENS {
        k.reject(format!("{ntok} tokens: the GEMV takes 1 to {MAX_TOKENS}"));
        return;
    }
    if cfg.act_ahead == 0 || cfg.act_ahead > ntok {
        k.reject(format!("{} tokens ahead of {ntok}", cfg.act_ahead));
        return;
    }
    if !(1..=4).contains(&cfg.rows_per_warp) {
        k.reject(format!("{} rows per warp: 1 to 4", cfg.rows_per_warp));
        return;
    }
    k.max_threads(32, WARPS_PER_CTA, 1);
    let w = k.param_ptr("w");
    let x = k.param_ptr("x");
    let y = k.param_ptr("y");
    let nrows = k.param_u32("nrows");
    let ntiles = k.param_u32("ntiles");
    let row_bytes = k.param_u32("row_bytes");
    let never = k.param_u32("never");

    let nr = cfg.rows_per_warp as usize;
    let warp = k.mad(k.reg(), k.ctaid_x(), WARPS_PER_CTA, k.tid_y());
    let first_row = k.mul(k.reg(), warp, cfg.rows_per_warp);
    k.exit_if(k.ge(first_row, nrows));
    let last = k.sub(k.reg(), nrows, 1u32);
    // Rows past the end read the last row again and store nothing.
    let rows: Vec<_> = (0..nr)
        .map(|r| {
            let row = k.add(k.reg(), first_row, r as u32);
            k.min(row, row, last)
        })
        .collect();
    let lane = k.tid_x();
    let part = k.and(k.reg(), lane, 3u32);
    let first = k.shr(k.reg(), lane, 2u32);
    let wrows: Vec<_> = rows
        .iter()
        .map(|&row| k.add(k.reg(), w, k.mul_wide(k.reg::<U64>(), row, row_bytes)))
        .collect();
    if k.grid_dep().early_work {
        // Launched ahead of its input (programmatic dependent launch), the warp pulls its
        // weight rows into L2 while the kernel before it runs: the weights are written by
        // no kernel, so they may be read before the wait; the activations only after it.
        let lines = k.shr(k.reg(), k.add(k.reg(), row_bytes, 127u32), 7u32);
        for &wr in &wrows {
            k.stride_loop(lane, lines, 32u32, |k, line| {
                let at = k.add(k.reg(), wr, k.mul_wide(k.reg::<U64>(), line, 128u32));
                k.raw(format!("prefetch.global.L2 [{at}]"));
            });
        }
    }
    k.grid_dep_wait();
    let setup = F::setup(k, part, ntiles);
    let (b0, b1) = F::act_blocks(k, part);
    let slots = ActSlots::new(k, b0, b1);
    let token_stride = k.mul_wide(k.reg::<U64>(), ntiles, act::TILE_BYTES as u32);
    let accs: Vec<Vec<_>> = (0..nr)
        .map(|_| (0..ntok).map(|_| k.f32(0.0)).collect())
        .collect();
    let sink = k.label();

    k.stride_loop(first, ntiles, 8u32, |k, tile| {
        let how = WeightLoad { no_l1: cfg.no_l1 };
        let weights: Vec<_> = wrows
            .iter()
            .map(|&wr| F::load(k, &setup, wr, tile, how))
            .collect();
        let xtile = k.add(
            k.reg(),
            x,
            k.mul_wide(k.reg::<U64>(), tile, act::TILE_BYTES as u32),
        );
        let token_at = |t: usize| {
            if t == 0 {
                xtile
            } else {
                k.add(xtile, xtile, token_stride)
            }
        };
        let xs: Vec<_> = (0..cfg.act_ahead)
            .map(|t| act::load_tile(k, token_at(t), &slots))
            .collect();
        if cfg.pin_loads {
            let all = k.u32(0);
            for wl in &weights {
                for word in F::load_words(wl) {
                    k.xor(all, all, word);
                }
            }
            for xa in &xs {
                k.xor(all, all, xa.q[0]);
                k.xor(all, all, xa.q[8]);
                k.xor(all, all, xa.sum[0].cast::<U32>());
                k.xor(all, all, xa.sum[1].cast::<U32>());
            }
            // `never` is 0, so this is never taken; ptxas cannot know, and so issues
            // every load before it.
            let hit = k.cmp(Cmp::Eq, all, never);
            let armed = k.cmp(Cmp::Ne, never, 0u32);
            k.and(hit, hit, armed);
            k.bra_if(hit, sink);
        }
        let decoded: Vec<_> = weights.iter().map(|wl| F::decode(k, &setup, wl)).collect();
        for t in 0..ntok {
            let later;
            let xa = match xs.get(t) {
                Some(xa) => xa,
                None => {
                    later = act::load_tile(k, token_at(t), &slots);
                    &later
                }
            };
            for (dw, acc_r) in decoded.iter().zip(&accs) {
                F::dot(k, &setup, dw, xa, acc_r[t]);
            }
        }
    });

    for (r, acc_r) in accs.iter().enumerate() {
        let sums: Vec<_> = acc_r.iter().map(|&a| k.warp_sum(a)).collect();
        let row = k.add(k.reg(), first_row, r as u32);
        let store = k.lt(row, nrows);
        let lane0 = k.eq(lane, 0u32);
        k.and(store, store, lane0);
        k.if_(store, |k| {
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
    if cfg.pin_loads {
        k.exit();
    }
    k.place(sink);
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
    let ntiles = padded_tiles(k, "GEMV")?;
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
    let mut mag = vec![0f64; ntok * nrows];
    let mut w = vec![0f32; k];
    for r in 0..nrows {
        smelt_quant::dequantize_row(ty, &ggml[r * row_ggml..(r + 1) * row_ggml], &mut w)?;
        for t in 0..ntok {
            let xt = &xs[t * ntiles * TILE..t * ntiles * TILE + k];
            let (mut dot, mut abs) = (0f64, 0f64);
            for (&a, &b) in w.iter().zip(xt) {
                let p = f64::from(a) * b;
                dot += p;
                abs += p.abs();
            }
            let tiles = &x[t * ntiles * act::TILE_BYTES..(t + 1) * ntiles * act::TILE_BYTES];
            let shift = crate::formats::legacy::cpu_min_term_shift(
                ty,
                &ggml[r * row_ggml..(r + 1) * row_ggml],
                tiles,
                k,
            );
            y[t * nrows + r] = (dot + shift) as f32;
            mag[t * nrows + r] = abs;
        }
    }
    Ok((y, mag))
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

    #[test]
    fn twin_checks_its_inputs() {
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 256, &[0; 10], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 100], 1, 256, &[0; act::TILE_BYTES], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 100, &[0; act::TILE_BYTES], 1).is_err());
    }
}
