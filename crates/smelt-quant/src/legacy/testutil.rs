//! Test helpers shared by the block formats' unit tests.

use crate::{Block, Quantize};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// A dot-product path as a plain function pointer.
pub(crate) type DotFn<B> = unsafe fn(&[B], &[<B as Block>::Act]) -> f32;

/// `Some(B::vec_dot_avx2)` when this CPU can run it.
macro_rules! avx2 {
    ($B:ty) => {{
        #[cfg(target_arch = "x86_64")]
        let path: Option<$crate::legacy::testutil::DotFn<$B>> =
            $crate::legacy::dot::avx2_ready().then_some(<$B>::vec_dot_avx2 as _);
        #[cfg(not(target_arch = "x86_64"))]
        let path: Option<$crate::legacy::testutil::DotFn<$B>> = None;
        path
    }};
}
pub(crate) use avx2;

pub(crate) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A row of `n` weights: Gaussian, with an occasional outlier.
pub(crate) fn gaussian_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let normal = Normal::new(0.0f32, 1.0).unwrap_or_else(|_| unreachable!());
    (0..n)
        .map(|_| {
            let v = normal.sample(rng);
            if rng.gen_ratio(1, 50) {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

pub(crate) fn quantized<B: Quantize>(src: &[f32]) -> Vec<B> {
    let mut out = vec![B::zeroed(); src.len() / B::WEIGHTS];
    B::quantize_row(src, &mut out);
    out
}

pub(crate) fn dequantized<B: Block>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0.0; blocks.len() * B::WEIGHTS];
    B::dequantize_row(blocks, &mut out);
    out
}

/// Blocks of uniformly random bytes: every quant pattern, including ones no quantizer
/// writes (such as -128 in an 8-bit block), with possibly absurd scales.
pub(crate) fn random_blocks<B: Block>(rng: &mut StdRng, n: usize) -> Vec<B> {
    let mut out = vec![B::zeroed(); n];
    rng.fill(bytemuck::cast_slice_mut::<B, u8>(&mut out));
    out
}

/// Quantize -> dequantize stays within `rel` of each block's largest magnitude (plus a
/// little for the f16 scale), on Gaussian rows, constant rows and tiny rows.
pub(crate) fn check_round_trip<B: Quantize>(rel: f32) {
    let mut rng = rng(1);
    let mut rows = vec![gaussian_row(&mut rng, B::WEIGHTS * 16)];
    rows.push(vec![0.75; B::WEIGHTS * 2]);
    rows.push(vec![-3.0; B::WEIGHTS * 2]);
    rows.push(
        gaussian_row(&mut rng, B::WEIGHTS * 4)
            .iter()
            .map(|v| v * 1e-3)
            .collect(),
    );
    for row in rows {
        let back = dequantized(&quantized::<B>(&row));
        for (block, out) in row.chunks(B::WEIGHTS).zip(back.chunks(B::WEIGHTS)) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b) in block.iter().zip(out) {
                let err = (a - b).abs();
                assert!(err <= amax * (rel + 2e-3), "{a} -> {b} (amax {amax})");
            }
        }
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The portable path matches an f64 dot of the dequantized rows, the AVX2 path (when
/// given) matches the portable one bit for bit, and `Block::vec_dot` matches both, for
/// many row lengths; on random bytes the paths must still agree exactly.
pub(crate) fn check_dot_with<B: Block>(
    make_x: impl Fn(&mut StdRng, usize) -> Vec<B>,
    portable: fn(&[B], &[B::Act]) -> f32,
    avx2: Option<DotFn<B>>,
) {
    let mut rng = rng(2);
    for nb in (0..=40).chain([63, 100, 257]) {
        let x = make_x(&mut rng, nb);
        let y = quantized::<B::Act>(&gaussian_row(&mut rng, nb * B::WEIGHTS));
        let got = portable(&x, &y);
        let (xf, yf) = (dequantized(&x), dequantized(&y));
        let exact: f64 = xf.iter().zip(&yf).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = xf
            .iter()
            .zip(&yf)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        // Q8_1 carries `s = d * sum(q)` rounded to f16, which the minimum of Q4_1/Q5_1
        // multiplies: allow that rounding per block.
        let s_rounding: f64 = if <B::Act as Block>::TYPE == crate::GgmlType::Q8_1 {
            xf.chunks(32)
                .zip(yf.chunks(32))
                .map(|(xb, yb)| {
                    let amax = xb.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
                    amax * yb.iter().map(|&v| v.abs() as f64).sum::<f64>() / 1024.0
                })
                .sum()
        } else {
            0.0
        };
        assert!(
            (got as f64 - exact).abs() <= 1e-5 * scale + s_rounding + 1e-6,
            "{:?} nb={nb}: {got} vs {exact}",
            B::TYPE
        );
        assert!(
            same(B::vec_dot(&x, &y), got),
            "{:?} nb={nb}: dispatch differs",
            B::TYPE
        );
        if let Some(fast_path) = avx2 {
            // SAFETY: the caller only passes the AVX2 path when the CPU has AVX2.
            let fast = unsafe { fast_path(&x, &y) };
            assert!(
                same(fast, got),
                "{:?} nb={nb}: avx2 {fast} vs portable {got}",
                B::TYPE
            );
            let (rx, ry) = (
                random_blocks::<B>(&mut rng, nb),
                random_blocks::<B::Act>(&mut rng, nb),
            );
            // SAFETY: as above.
            let fast = unsafe { fast_path(&rx, &ry) };
            let slow = portable(&rx, &ry);
            assert!(
                same(fast, slow),
                "{:?} nb={nb}: random bytes {fast} vs {slow}",
                B::TYPE
            );
        }
    }
}

/// [`check_dot_with`] on weights quantized from Gaussian rows.
pub(crate) fn check_dot<B: Quantize>(portable: fn(&[B], &[B::Act]) -> f32, avx2: Option<DotFn<B>>) {
    check_dot_with(
        |rng, nb| quantized::<B>(&gaussian_row(rng, nb * B::WEIGHTS)),
        portable,
        avx2,
    );
}
