//! Checks every K-quant format's unit tests share.

use super::{BlockQ8K, QK_K};
use crate::{Block, Quantize};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// A dot product over a row of blocks.
pub type DotFn<B> = fn(&[B], &[BlockQ8K]) -> f32;

/// The AVX2 path of a format as a [`DotFn`], or `None` where this CPU (or target)
/// has no AVX2.
macro_rules! avx2_fn {
    ($f:path) => {{
        #[cfg(target_arch = "x86_64")]
        let f: Option<DotFn<_>> = if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU was just checked for AVX2 and FMA.
            Some(|x, y| unsafe { $f(x, y) })
        } else {
            None
        };
        #[cfg(not(target_arch = "x86_64"))]
        let f: Option<DotFn<_>> = None;
        f
    }};
}
pub(crate) use avx2_fn;

/// Gaussian values with standard deviation `sigma`, plus an occasional outlier.
pub fn random_row(seed: u64, n: usize, sigma: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, sigma).unwrap();
    (0..n)
        .map(|_| {
            let v = normal.sample(&mut rng);
            if rng.gen_ratio(1, 64) {
                v * 6.0
            } else {
                v
            }
        })
        .collect()
}

/// Rows of random blocks shaped to stress each path: one block, a few, many.
fn shapes() -> impl Iterator<Item = (u64, usize)> {
    [(1u64, 1usize), (2, 3), (3, 8), (4, 17)].into_iter()
}

pub fn quantize<B: Quantize>(x: &[f32]) -> Vec<B> {
    let mut out = vec![<B as bytemuck::Zeroable>::zeroed(); x.len() / B::WEIGHTS];
    B::quantize_row(x, &mut out);
    out
}

pub fn dequantize<B: Block>(b: &[B]) -> Vec<f32> {
    let mut out = vec![0.0; b.len() * B::WEIGHTS];
    B::dequantize_row(b, &mut out);
    out
}

/// The AVX2 path equals the portable one bit for bit, the dispatched `vec_dot` equals
/// them, and the result is within `rel_tol * sum|x_i y_i|` of an f64 dot product of the
/// dequantized operands (the only error left is f32 rounding of the fold).
pub fn check_dot<B: Quantize<Act = BlockQ8K>>(
    portable: DotFn<B>,
    avx2: Option<DotFn<B>>,
    rel_tol: f64,
) {
    for (seed, blocks) in shapes() {
        let n = blocks * QK_K;
        let xb = quantize::<B>(&random_row(seed, n, 1.0));
        let yb = quantize::<BlockQ8K>(&random_row(seed + 100, n, 2.0));
        let (xf, yf) = (dequantize(&xb), dequantize(&yb));
        let exact: f64 = xf.iter().zip(&yf).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = xf
            .iter()
            .zip(&yf)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let got = portable(&xb, &yb);
        assert!(
            (got as f64 - exact).abs() <= 1e-5 * scale,
            "{:?} portable {got} vs f64 {exact} ({blocks} blocks)",
            B::TYPE
        );
        if let Some(avx2) = avx2 {
            let fast = avx2(&xb, &yb);
            assert_eq!(
                fast.to_bits(),
                got.to_bits(),
                "{:?} avx2 {fast} vs portable {got}",
                B::TYPE
            );
        }
        assert_eq!(B::vec_dot(&xb, &yb).to_bits(), got.to_bits());

        // Against the unquantized activations the error is the quantization's own.
        let x = random_row(seed, n, 1.0);
        let y = random_row(seed + 100, n, 2.0);
        let real: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let norm = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>()
            * y.iter().map(|&v| v as f64 * v as f64).sum::<f64>())
        .sqrt();
        assert!(
            (got as f64 - real).abs() <= rel_tol * norm,
            "{:?} dot {got} vs real {real} (norm {norm})",
            B::TYPE
        );
    }
}

/// Arbitrary bytes (any quant, scale bytes, -128 activations, sums that disagree with
/// the quants) still give bit-identical AVX2 and portable results: both paths compute
/// the same exact integers. Only the f16/f32 scales are kept finite, so that results
/// are numbers and compare by bits.
pub fn check_dot_raw<B: Block<Act = BlockQ8K>>(portable: DotFn<B>, avx2: Option<DotFn<B>>) {
    let Some(avx2) = avx2 else { return };
    let mut rng = StdRng::seed_from_u64(99);
    for blocks in [1usize, 4, 7, 9] {
        let mut xb = vec![0u8; blocks * std::mem::size_of::<B>()];
        let mut yb = vec![0u8; blocks * std::mem::size_of::<BlockQ8K>()];
        for _ in 0..20 {
            rng.fill(&mut xb[..]);
            rng.fill(&mut yb[..]);
            let mut x: Vec<B> = bytemuck::pod_collect_to_vec(&xb);
            let mut y: Vec<BlockQ8K> = bytemuck::pod_collect_to_vec(&yb);
            for b in &mut y {
                b.d = rng.gen_range(-1.0..1.0);
            }
            for b in &mut x {
                sanitize_f16_scales(bytemuck::bytes_of_mut(b), B::TYPE);
            }
            let (p, f) = (portable(&x, &y), avx2(&x, &y));
            assert_eq!(
                p.to_bits(),
                f.to_bits(),
                "{:?}: portable {p} vs avx2 {f}",
                B::TYPE
            );
        }
    }
}

/// Clears the top exponent bit of every f16 field of a block so that none is
/// infinite or NaN.
fn sanitize_f16_scales(b: &mut [u8], ty: crate::GgmlType) {
    use crate::GgmlType::*;
    let offsets: &[usize] = match ty {
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q4_K | Q5_K => &[0, 2],
        Q6_K => &[208],
        _ => &[],
    };
    for &o in offsets {
        b[o + 1] &= 0xBF;
    }
}

/// Quantize -> dequantize keeps the RMS error under `rel_rms` times the data's RMS,
/// across several scales of data (the format has no absolute scale).
pub fn check_round_trip<B: Quantize>(rel_rms: f64) {
    for (seed, sigma) in [(10u64, 1.0f32), (11, 1e-3), (12, 300.0), (13, 0.05)] {
        let x = random_row(seed, 8 * QK_K, sigma);
        let back = dequantize(&quantize::<B>(&x));
        let err: f64 = x
            .iter()
            .zip(&back)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
        let rel = (err / norm).sqrt();
        assert!(
            rel <= rel_rms,
            "{:?} relative RMS error {rel} at sigma {sigma}",
            B::TYPE
        );
    }
}

/// An all-zero row quantizes to all-zero bytes and back to zeros.
pub fn check_zero_row<B: Quantize>() {
    let b = quantize::<B>(&[0.0; 2 * QK_K]);
    assert!(
        bytemuck::cast_slice::<B, u8>(&b).iter().all(|&v| v == 0),
        "{:?}",
        B::TYPE
    );
    assert!(dequantize(&b).iter().all(|&v| v == 0.0));
}
