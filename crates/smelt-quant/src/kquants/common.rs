//! Helpers shared by the K-quant formats: ggml's rounding trick, its scale searches
//! (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`), the packed 6-bit scale
//! layouts, and the one scalar order in which dot products fold their integer sums.
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

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (weight
/// `x^2`), the only form the reference quantizers use (Q6_K, `nmax = 32`).
///
/// Writes levels `l + nmax` (in `0..2*nmax`) to `out` and returns the group's scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32; 16], out: &mut [i8; 16]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        *out = [0; 16];
        return 0.0;
    }
    // `w * x` is formed before `* l` in ggml, so precomputing it keeps every rounding.
    let mut wx = [0.0f32; 16];
    let mut w = [0.0f32; 16];
    for i in 0..16 {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    let nmaxf = nmax as f32;
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);

    let iscale = -nmaxf / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..16 {
        let l = level(iscale, x[i]);
        out[i] = (l + nmax) as i8;
        let lf = l as f32;
        sumlx += wx[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmaxf + 0.1f32 * is as f32) / max;
        let mut ls = [0i32; 16];
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..16 {
            let l = level(iscale, x[i]);
            ls[i] = l;
            let lf = l as f32;
            sumlx += wx[i] * lf;
            suml2 += w[i] * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..16 {
                out[i] = (ls[i] + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse` (the form Q3_K's reference uses): a first
/// guess from the max, then up to five rounds of moving single levels while that
/// lowers the weighted error. Writes levels `l + nmax` and returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32; 16], out: &mut [i8; 16]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        *out = [0; 16];
        return 0.0;
    }
    let mut w = [0.0f32; 16];
    let mut wx = [0.0f32; 16];
    for i in 0..16 {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..16 {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = li;
        let lf = li as f32;
        sumlx += wx[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..16 {
            let li = l[i] as f32;
            let mut slx = sumlx - wx[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w[i] * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] {
                    let nf = new_l as f32;
                    slx += wx[i] * nf;
                    sl2 += w[i] * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for i in 0..16 {
        out[i] = (l[i] + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// How `make_qkx2_quants` searches: ggml passes these per format.
pub(crate) struct Qkx2Search {
    /// Largest level (3, 15 or 31).
    pub nmax: i32,
    /// First offset tried on `nmax` when scanning scales.
    pub rmin: f32,
    /// Step between offsets.
    pub rdelta: f32,
    /// Offsets tried: `0..=nstep`.
    pub nstep: i32,
    /// Absolute instead of squared error.
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: fits `x ~ scale * l - min` with `l` in `0..=nmax` and
/// `min >= 0`, scanning `nstep + 1` candidate scales and keeping the one with the
/// lowest weighted error (each candidate's scale and min solved by least squares).
///
/// Writes the levels to `out` and returns `(scale, min)`.
pub(crate) fn make_qkx2_quants<const N: usize>(
    p: &Qkx2Search,
    x: &[f32; N],
    weights: &[f32; N],
    out: &mut [u8; N],
) -> (f32, f32) {
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        *out = [0; N];
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..N {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    let mut aux = [0u8; N];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..N {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let wl = weights[i] * l as f32;
            sum_l += wl;
            sum_l2 += wl * l as f32;
            sum_xl += wl * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..N {
                cur_error += weights[i] * err(this_scale * aux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                *out = aux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
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
    fn scale_min_packing_round_trips() {
        let ls = [0, 1, 17, 63, 32, 5, 63, 40];
        let lm = [63, 0, 2, 33, 1, 62, 48, 16];
        let packed = pack_scale_min_k4(&ls, &lm);
        assert_eq!(unpack_scale_min_k4(&packed), (ls, lm));
    }
}
