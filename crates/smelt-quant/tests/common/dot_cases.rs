//! Weight and activation rows for dot-product tests, and the tolerance a dot product of
//! them must meet.
//!
//! Weights of quantizable types come from smelt's quantizer on random data (what a model
//! holds); IQ4 weights, which smelt cannot produce, are random valid blocks with a sane
//! scale. Activations are random data quantized with smelt's quantizer for the type's
//! [`act_type`], as a matmul would do.

use super::{catch, Rng};
use smelt_quant::{act_type, can_quantize, dequantize_row, quantize_row, GgmlType};

pub struct DotCase {
    pub label: String,
    pub n: usize,
    /// `n` weights of the tested type.
    pub x: Vec<u8>,
    /// `n` activations of its act type.
    pub y: Vec<u8>,
}

/// Row lengths: a single block, a few, and a realistic 4096 (plus odd lengths for the
/// one-weight float types).
pub fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        1 => vec![1, 7, 33, 100, 4096],
        b => vec![b, 3 * b, 4096],
    }
}

fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; src.len() / ty.block_size() * ty.type_size()];
    match catch(|| quantize_row(ty, src, &mut out)) {
        Ok(Ok(())) => Ok(out),
        Ok(Err(e)) => Err(format!("quantize_row({}) failed: {e}", ty.name())),
        Err(p) => Err(format!("quantize_row({}) {p}", ty.name())),
    }
}

pub fn dequantize(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; n];
    match catch(|| dequantize_row(ty, src, &mut out)) {
        Ok(Ok(())) => Ok(out),
        Ok(Err(e)) => Err(format!("dequantize_row({}) failed: {e}", ty.name())),
        Err(p) => Err(format!("dequantize_row({}) {p}", ty.name())),
    }
}

/// Random data of `n` values in a named shape.
fn data(kind: usize, n: usize, rng: &mut Rng) -> (&'static str, Vec<f32>) {
    match kind {
        0 => ("normal", (0..n).map(|_| rng.normal()).collect()),
        1 => (
            "normal*0.02+0.01",
            (0..n).map(|_| rng.normal() * 0.02 + 0.01).collect(),
        ),
        _ => {
            // Each 16 values at its own magnitude, as in real weight matrices' rows.
            let mut scale = 1.0;
            let v = (0..n)
                .map(|i| {
                    if i % 16 == 0 {
                        scale = 10f32.powf(rng.unit() * 4.0 - 2.0);
                    }
                    rng.normal() * scale
                })
                .collect();
            ("mixed scales", v)
        }
    }
}

/// IQ4 weights: random nibbles (and IQ4_XS sub-block scales) under a small f16 scale.
fn iq4_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let size = ty.type_size();
    let mut out: Vec<u8> = (0..n / ty.block_size() * size)
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in out.chunks_exact_mut(size) {
        let d = half::f16::from_f32(
            (0.001 + rng.unit() * 0.02) * if rng.below(2) == 0 { 1.0 } else { -1.0 },
        );
        block[..2].copy_from_slice(&d.to_bits().to_le_bytes());
    }
    out
}

/// The dot cases of `ty`, or why they cannot be built (a quantizer still missing).
pub fn cases(ty: GgmlType, rng: &mut Rng) -> Result<Vec<DotCase>, String> {
    let act = act_type(ty).map_err(|e| format!("act_type({}): {e}", ty.name()))?;
    let mut out = Vec::new();
    for n in lengths(ty) {
        for kind in 0..3 {
            let (label, w) = data(kind, n, rng);
            let x = if can_quantize(ty) {
                quantize(ty, &w)?
            } else {
                iq4_weights(ty, n, rng)
            };
            let (_, a) = data(0, n, rng);
            let y = quantize(act, &a)?;
            out.push(DotCase {
                label: format!("n={n} weights {label}"),
                n,
                x,
                y,
            });
        }
    }
    Ok(out)
}

/// The exact dot of the dequantized rows, and how far a correct f32 implementation may be
/// from it.
///
/// ggml's dots multiply exactly in integers and accumulate block results in f32, so they
/// are off by a few f32 roundings of the magnitudes involved, which are bounded by
/// `sum (|x_i| + M_b) |y_i|`, M_b being the largest |weight| of x_i's block: that covers
/// the separate scale and min terms of the `_1` and K formats (a min is one of its
/// block's weights). 2e-6 of it is about 32 f32 ulps, some 100 times the error measured
/// on these rows (a wrong block or scale is off by far more). Q4_1 and Q5_1 dot against
/// Q8_1, whose precomputed block sum `s` is stored as f16: that term carries a relative
/// error of up to 2^-11, hence the wider 2^-10 for them.
pub fn reference(ty: GgmlType, case: &DotCase) -> Result<(f64, f64), String> {
    let act = act_type(ty).map_err(|e| e.to_string())?;
    let x = dequantize(ty, &case.x, case.n)?;
    let y = dequantize(act, &case.y, case.n)?;
    let exact: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
    let block = ty.block_size().max(32).min(case.n);
    let mut magnitude = 0.0f64;
    for (xb, yb) in x.chunks(block).zip(y.chunks(block)) {
        let m = xb.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        magnitude += xb
            .iter()
            .zip(yb)
            .map(|(&a, &b)| ((a as f64).abs() + m) * (b as f64).abs())
            .sum::<f64>();
    }
    let rel = if act == GgmlType::Q8_1 {
        1.0 / 1024.0
    } else {
        2e-6
    };
    Ok((exact, rel * magnitude + 1e-30))
}
