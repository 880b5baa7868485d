//! Scalar transcriptions of ggml's scale searches, one group at a time, exactly as
//! `ggml-quants.c` writes them. The quantizers run the lane-parallel versions in
//! `lanes.rs`; these are the specification the tests hold those to.

use super::common::{nearest_int, GROUP_MAX_EPS};

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
