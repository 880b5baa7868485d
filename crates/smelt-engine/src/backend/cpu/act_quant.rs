//! Activation quantization as ggml's CPU backend does it on x86, which is not ggml's
//! reference quantizer: for Q8_0 and Q8_1 it scales by `127 / amax` (not `1 / (amax / 127)`)
//! and rounds halves to even (`_mm256_round_ps`), not away from zero. Matching it keeps our
//! matmul inputs identical to llama.cpp's; Q8_K (and the float types) use the reference
//! code on x86, which `smelt-quant` already reproduces.

use smelt_quant::fp::f32_to_f16;
use smelt_quant::legacy::{BlockQ8_0, BlockQ8_1};
use smelt_quant::{Block, GgmlType, Quantize};

/// Quantizes one activation row to `A`, the weight format's paired type.
pub fn quantize_act<A: Block + Quantize>(x: &[f32], dst: &mut [A]) {
    match A::TYPE {
        GgmlType::Q8_0 => {
            if let Ok(d) = bytemuck::try_cast_slice_mut::<A, BlockQ8_0>(dst) {
                for (b, x) in d.iter_mut().zip(x.chunks_exact(32)) {
                    let (d, _) = q8_block(x, &mut b.qs);
                    b.d = f32_to_f16(d);
                }
                return;
            }
        }
        GgmlType::Q8_1 => {
            if let Ok(d) = bytemuck::try_cast_slice_mut::<A, BlockQ8_1>(dst) {
                for (b, x) in d.iter_mut().zip(x.chunks_exact(32)) {
                    let (d, sum) = q8_block(x, &mut b.qs);
                    b.d = f32_to_f16(d);
                    b.s = f32_to_f16(d * sum as f32);
                }
                return;
            }
        }
        _ => {}
    }
    A::quantize_row(x, dst);
}

/// One 32-value block: returns the f32 scale (stored rounded to f16) and the sum of the
/// quants. Q8_1's `s` is the sum times the f32 `d` in ggml, not the rounded f16 one.
fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = round_ties_even(v * id) as i32;
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}

/// Rounds half to even like `_mm256_round_ps(_MM_ROUND_NEAREST)`; `f32::round_ties_even`
/// is a libm call without SSE4.1, and adding and removing 1.5 * 2^23 does the same rounding
/// in two additions for the |x| <= 127 this is used on.
#[inline(always)]
fn round_ties_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn q8_1_sum_uses_unrounded_scale() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.3) * 0.37).collect();
        let mut b = [BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }];
        quantize_act(&x, &mut b);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(b[0].d, f32_to_f16(amax / 127.0));
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b[0].s, f32_to_f16(amax / 127.0 * sum as f32));

        assert!(b[0].qs.iter().any(|&q| q == 127 || q == -127));
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.0, 3.49, -3.51] {
            assert_eq!(round_ties_even(x), x.round_ties_even(), "{x}");
        }
    }
}
