//! Q8_1: Q8_0 plus `s = d * sum(q)`, the activation format of Q4_1 and Q5_1 (the sum
//! lets their minimum be applied once per block instead of once per weight).

use super::q8_0::{q8_block, quantize_q8};
use super::scan::{blocks32, vectorized};
use crate::fp::f32_to_f16;
use crate::Quantize;
use half::f16;

/// ggml's `block_q8_1`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

q8_block!(BlockQ8_1, Q8_1);

impl Quantize for BlockQ8_1 {
    /// `quantize_row_q8_1_ref`: as Q8_0, plus `s = f16(d * sum of quants)`.
    fn quantize_row(src: &[f32], dst: &mut [Self]) {
        vectorized(|| {
            for (b, x) in dst.iter_mut().zip(blocks32(src)) {
                let d = quantize_q8(x, &mut b.qs);
                b.d = f32_to_f16(d);
                // ggml sums the stored bytes (what a block of tiny values wraps to included).
                let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
                b.s = f32_to_f16(sum as f32 * d);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::testutil::*;
    use bytemuck::Zeroable;

    #[test]
    fn known_blocks() {
        let mut b = [BlockQ8_1::zeroed()];
        BlockQ8_1::quantize_row(&[0.0; 32], &mut b);
        assert_eq!(
            (b[0].d.to_bits(), b[0].s.to_bits(), b[0].qs),
            (0, 0, [0; 32])
        );

        // d = 1: s is the plain sum of the quants.
        let x: [f32; 32] = std::array::from_fn(|i| if i == 0 { 127.0 } else { i as f32 - 20.4 });
        BlockQ8_1::quantize_row(&x, &mut b);
        assert_eq!(b[0].d, f16::ONE);
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b[0].s, f16::from_f32(sum as f32));
        assert_eq!(b[0].qs[1], -19);
    }

    #[test]
    fn round_trip_error() {
        check_round_trip::<BlockQ8_1>(1.0 / 254.0);
    }

    #[test]
    fn dot_paths() {
        check_dot::<BlockQ8_1>(BlockQ8_1::vec_dot_portable, avx2!(BlockQ8_1));
    }
}
