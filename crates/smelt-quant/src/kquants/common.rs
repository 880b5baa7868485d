//! Helpers shared by the K-quant formats: ggml's rounding trick, the packed 6-bit
//! scale layout, the transposes feeding `lanes`, and the one scalar order in which dot
//! products fold their integer sums.
//!
//! Every float operation here follows ggml's reference C in operation order and
//! precision (f32 throughout, no fused multiply-add), because quantized bytes must be
//! identical to ggml's: a different rounding in a sum can flip a scale choice.

/// Weights per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Below this magnitude a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Rounds to the nearest integer, ties to even, the way ggml does: adding 1.5 * 2^23
/// moves the integer part into the low mantissa bits. Exact for |fval| < 2^22; for
/// larger, infinite or NaN inputs it returns the same garbage ggml returns (callers
/// clamp it), which is what keeps the bytes identical on degenerate blocks.
#[inline(always)]
pub fn nearest_int(fval: f32) -> i32 {
    let bits = (fval + 12_582_912.0f32).to_bits();
    (bits & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Exact f16 -> f32, inlinable (half's conversion checks the CPU on every call, which
/// shows in dot products that convert two scales per 256 weights). Normal halves are
/// rebiased in the integer domain and subnormals converted from their integer mantissa,
/// so no f32 denormal is ever an operand (those cost a microcode assist per use).
#[inline(always)]
pub fn f16_to_f32(h: half::f16) -> f32 {
    let h = h.to_bits() as u32;
    let mag = h & 0x7fff;
    let bits = if mag >= 0x7c00 {
        0x7f80_0000 | (mag << 13)
    } else if mag >= 0x0400 {
        (mag << 13) + 0x3800_0000
    } else {
        (mag as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

/// Packs eight 6-bit scales and eight 6-bit mins into Q4_K/Q5_K's 12 bytes: the first
/// four of each whole in bytes 0..8, the last four split into low nibbles (bytes 8..12)
/// and top two bits (the spare bits 6-7 of bytes 0..8).
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    s[..4].copy_from_slice(&ls[..4]);
    s[4..8].copy_from_slice(&lm[..4]);
    for j in 4..8 {
        s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
        s[j - 4] |= (ls[j] >> 4) << 6;
        s[j] |= (lm[j] >> 4) << 6;
    }
    s
}

/// Unpacks the 12 bytes written by [`pack_scale_min_k4`] into (scales, mins).
#[inline(always)]
pub(crate) fn unpack_scale_min_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    (sc, m)
}

/// Transposes a super-block into `L` groups of `N` weights, `t[i][k] = x[N * k + i]`:
/// the layout `lanes` works on.
#[inline(always)]
pub(crate) fn to_lanes<const N: usize, const L: usize>(x: &[f32; QK_K]) -> [[f32; L]; N] {
    std::array::from_fn(|i| std::array::from_fn(|k| x[N * k + i]))
}

/// Undoes [`to_lanes`] for per-weight levels.
#[inline(always)]
pub(crate) fn from_lanes<T: Copy, const N: usize, const L: usize>(
    t: &[[T; L]; N],
    out: &mut [T; QK_K],
) {
    for (i, row) in t.iter().enumerate() {
        for (k, &v) in row.iter().enumerate() {
            out[N * k + i] = v;
        }
    }
}

/// `sum_g scales[g] * (q_g . y_g)` over consecutive groups of `G` weights: the exact
/// integer part of a portable dot product, written as plain fixed-size loops so the
/// compiler vectorizes them. Wrapping adds match the AVX2 lanes on arbitrary input
/// (valid blocks never come near i32's range).
#[inline(always)]
pub(crate) fn group_sums<const G: usize>(q: &[u8; QK_K], y: &[i8; QK_K], scales: &[i32]) -> i32 {
    let mut isum = 0i32;
    for ((qg, yg), &s) in q.chunks_exact(G).zip(y.chunks_exact(G)).zip(scales) {
        let d: i32 = qg.iter().zip(yg).map(|(&a, &b)| a as i32 * b as i32).sum();
        isum = isum.wrapping_add(s.wrapping_mul(d));
    }
    isum
}

/// Folds one super-block into a dot product's running sum: `dd * isum - dm * msum`,
/// where `isum`/`msum` are the block's exact integer sums and `dd`/`dm` its float
/// scales times the activation scale. The portable and AVX2 paths both end here, so
/// their results agree bit for bit.
#[inline(always)]
pub(crate) fn fold(acc: f32, dd: f32, isum: i32, dm: f32, msum: i32) -> f32 {
    acc + (dd * isum as f32 - dm * msum as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-0.49), 0);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-37.6), -38);
    }

    #[test]
    fn f16_conversion_matches_half_everywhere() {
        for bits in 0..=u16::MAX {
            let h = half::f16::from_bits(bits);
            if h.is_nan() {
                assert!(f16_to_f32(h).is_nan());
            } else {
                assert_eq!(f16_to_f32(h).to_bits(), h.to_f32().to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn scale_min_packing_round_trips() {
        let ls = [0, 1, 17, 63, 32, 5, 63, 40];
        let lm = [63, 0, 2, 33, 1, 62, 48, 16];
        let packed = pack_scale_min_k4(&ls, &lm);
        assert_eq!(unpack_scale_min_k4(&packed), (ls, lm));
    }
}
