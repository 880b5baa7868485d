//! ggml's per-group scale searches, run on all groups of a super-block at once.
//!
//! The searches are long chains of dependent f32 sums, so one group at a time leaves
//! the CPU waiting on add latency. Here lane `k` of every `[_; L]` array is group `k`,
//! and each lane performs exactly the operations ggml performs for that group, in the
//! same order; data-dependent branches become per-lane selects. The arithmetic per lane
//! is unchanged, so the results are bit-identical to the one-group-at-a-time C code
//! (the tests check that against the scalar transcriptions in `reference.rs`), while
//! the compiler turns the lane loops into SIMD.
//!
//! Inputs are transposed: `x[i][k]` is element `i` of group `k`.

use super::common::{nearest_int, GROUP_MAX_EPS};

/// Lane-wise `make_qkx2_quants`: fits `x ~ scale * l - min` with `l` in `0..=nmax` and
/// `min >= 0`, trying the candidate scales `(nmax + rmin + rdelta * is) / (max - min)`
/// for `is` in `0..=nstep` and keeping the lowest weighted error; `MAD` selects absolute
/// instead of squared error. Writes levels to `out` and returns per-group `(scale, min)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants<const N: usize, const L: usize, const MAD: bool>(
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    x: &[[f32; L]; N],
    w: &[[f32; L]; N],
    out: &mut [[u8; L]; N],
) -> ([f32; L], [f32; L]) {
    let err = |diff: f32| if MAD { diff.abs() } else { diff * diff };
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(0, nmax);
    let nmaxf = nmax as f32;

    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = [0.0f32; L];
    for k in 0..L {
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for i in 1..N {
        for k in 0..L {
            let v = x[i][k];
            min[k] = if v < min[k] { v } else { min[k] };
            max[k] = if v > max[k] { v } else { max[k] };
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * v;
        }
    }
    let mut flat = [false; L];
    let mut iscale = [0.0f32; L];
    let mut scale = [0.0f32; L];
    for k in 0..L {
        if min[k] > 0.0 {
            min[k] = 0.0;
        }
        // A flat group computes garbage below (division by zero) that is never taken.
        flat[k] = max[k] == min[k];
        iscale[k] = nmaxf / (max[k] - min[k]);
        scale[k] = 1.0 / iscale[k];
    }
    // Levels are kept as f32 (exact for 0..=31) so no lane loop converts types.
    let mut best = [[0.0f32; L]; N];
    let mut best_error = [0.0f32; L];
    for i in 0..N {
        for k in 0..L {
            let l = level(iscale[k], x[i][k] - min[k]) as f32;
            best[i][k] = l;
            best_error[k] += w[i][k] * err(scale[k] * l + min[k] - x[i][k]);
        }
    }

    let mut aux = [[0.0f32; L]; N];
    for is in 0..=nstep {
        let mut sum_l = [0.0f32; L];
        let mut sum_l2 = [0.0f32; L];
        let mut sum_xl = [0.0f32; L];
        for k in 0..L {
            iscale[k] = (rmin + rdelta * is as f32 + nmaxf) / (max[k] - min[k]);
        }
        for i in 0..N {
            for k in 0..L {
                let l = level(iscale[k], x[i][k] - min[k]) as f32;
                aux[i][k] = l;
                let wl = w[i][k] * l;
                sum_l[k] += wl;
                sum_l2[k] += wl * l;
                sum_xl[k] += wl * x[i][k];
            }
        }
        let mut d = [0.0f32; L];
        let mut this_scale = [0.0f32; L];
        let mut this_min = [0.0f32; L];
        for k in 0..L {
            d[k] = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            let s = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / d[k];
            let m = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / d[k];
            let clip = m > 0.0;
            this_min[k] = if clip { 0.0 } else { m };
            this_scale[k] = if clip { sum_xl[k] / sum_l2[k] } else { s };
        }
        let mut cur_error = [0.0f32; L];
        for i in 0..N {
            for k in 0..L {
                cur_error[k] += w[i][k] * err(this_scale[k] * aux[i][k] + this_min[k] - x[i][k]);
            }
        }
        let take: [bool; L] =
            std::array::from_fn(|k| !flat[k] & (d[k] > 0.0) & (cur_error[k] < best_error[k]));
        if take.iter().any(|&t| t) {
            for i in 0..N {
                for k in 0..L {
                    best[i][k] = if take[k] { aux[i][k] } else { best[i][k] };
                }
            }
            for k in 0..L {
                best_error[k] = if take[k] { cur_error[k] } else { best_error[k] };
                scale[k] = if take[k] { this_scale[k] } else { scale[k] };
                min[k] = if take[k] { this_min[k] } else { min[k] };
            }
        }
    }
    for i in 0..N {
        for k in 0..L {
            out[i][k] = if flat[k] { 0 } else { best[i][k] as u8 };
        }
    }
    let mut neg_min = [0.0f32; L];
    for k in 0..L {
        scale[k] = if flat[k] { 0.0 } else { scale[k] };
        neg_min[k] = -min[k];
    }
    (scale, neg_min)
}

/// The outcome of [`make_qx_scales`]: each group's scale and the candidate `iscale` that
/// won it, from which the group's levels follow. Q6_K overwrites the levels of every group
/// whose rounded scale is non-zero, so carrying the winner (and computing levels only
/// where they survive) replaces writing all 256 levels for each accepted candidate.
pub(crate) struct QxScales<const L: usize> {
    pub scale: [f32; L],
    iscale: [f32; L],
    zero: [bool; L],
    nmax: i32,
}

impl<const L: usize> QxScales<L> {
    /// The level (`l + nmax`) `make_qx_quants` writes for value `v` of group `k`.
    #[inline(always)]
    pub fn level(&self, k: usize, v: f32) -> i8 {
        if self.zero[k] {
            return 0;
        }
        (nearest_int(self.iscale[k] * v).clamp(-self.nmax, self.nmax - 1) + self.nmax) as i8
    }
}

/// Lane-wise `make_qx_quants` with `rmse_type == 1` and no importance weights, on
/// 16-element groups: per group the scale and the winning candidate (see [`QxScales`]).
#[inline(always)]
pub(crate) fn make_qx_scales<const L: usize>(nmax: i32, x: &[[f32; L]; 16]) -> QxScales<L> {
    let nmaxf = nmax as f32;
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut max = [0.0f32; L];
    let mut amax = [0.0f32; L];
    for row in x {
        for k in 0..L {
            let ax = row[k].abs();
            if ax > amax[k] {
                amax[k] = ax;
                max[k] = row[k];
            }
        }
    }
    let zero: [bool; L] = std::array::from_fn(|k| amax[k] < GROUP_MAX_EPS);
    let mut w = [[0.0f32; L]; 16];
    let mut wx = [[0.0f32; L]; 16];
    for i in 0..16 {
        for k in 0..L {
            w[i][k] = x[i][k] * x[i][k];
            wx[i][k] = w[i][k] * x[i][k];
        }
    }
    // Candidate 0 is -nmax / max, then -(nmax + 0.1 * is) / max for is in -9..=9, is != 0;
    // a later candidate wins when its fit is strictly better.
    let mut won: [f32; L] = std::array::from_fn(|k| -nmaxf / max[k]);
    let mut sumlx = [0.0f32; L];
    let mut suml2 = [0.0f32; L];
    for i in 0..16 {
        for k in 0..L {
            let lf = level(won[k], x[i][k]) as f32;
            sumlx[k] += wx[i][k] * lf;
            suml2[k] += w[i][k] * lf * lf;
        }
    }
    let mut scale = [0.0f32; L];
    let mut best = [0.0f32; L];
    for k in 0..L {
        scale[k] = if suml2[k] != 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        };
        best[k] = scale[k] * sumlx[k];
    }
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale: [f32; L] = std::array::from_fn(|k| -(nmaxf + 0.1f32 * is as f32) / max[k]);
        let mut sumlx = [0.0f32; L];
        let mut suml2 = [0.0f32; L];
        for i in 0..16 {
            for k in 0..L {
                let lf = level(iscale[k], x[i][k]) as f32;
                sumlx[k] += wx[i][k] * lf;
                suml2[k] += w[i][k] * lf * lf;
            }
        }
        for k in 0..L {
            if suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k] {
                won[k] = iscale[k];
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
    }
    for k in 0..L {
        if zero[k] {
            scale[k] = 0.0;
        }
    }
    QxScales {
        scale,
        iscale: won,
        zero,
        nmax,
    }
}

/// Lane-wise `make_q3_quants` with `do_rmse`, on 16-element groups. Writes levels
/// `l + nmax` and returns the scales.
#[inline(always)]
pub(crate) fn make_q3_quants<const L: usize>(
    nmax: i32,
    x: &[[f32; L]; 16],
    out: &mut [[i8; L]; 16],
) -> [f32; L] {
    let nmaxf = nmax as f32;
    let mut max = [0.0f32; L];
    let mut amax = [0.0f32; L];
    for row in x {
        for k in 0..L {
            let ax = row[k].abs();
            if ax > amax[k] {
                amax[k] = ax;
                max[k] = row[k];
            }
        }
    }
    let zero: [bool; L] = std::array::from_fn(|k| amax[k] < GROUP_MAX_EPS);
    let mut w = [[0.0f32; L]; 16];
    let mut wx = [[0.0f32; L]; 16];
    for i in 0..16 {
        for k in 0..L {
            w[i][k] = x[i][k] * x[i][k];
            wx[i][k] = w[i][k] * x[i][k];
        }
    }
    let iscale: [f32; L] = std::array::from_fn(|k| -nmaxf / max[k]);
    let mut l = [[0i32; L]; 16];
    let mut sumlx = [0.0f32; L];
    let mut suml2 = [0.0f32; L];
    for i in 0..16 {
        for k in 0..L {
            let li = nearest_int(iscale[k] * x[i][k]).clamp(-nmax, nmax - 1);
            l[i][k] = li;
            let lf = li as f32;
            sumlx[k] += wx[i][k] * lf;
            suml2[k] += w[i][k] * lf * lf;
        }
    }
    // ggml stops a group after a pass that changes nothing; another pass from the same
    // state would change nothing again, so running passes until no lane changes is
    // the same computation.
    for _ in 0..5 {
        let mut changed = [false; L];
        for i in 0..16 {
            for k in 0..L {
                let li = l[i][k] as f32;
                let slx = sumlx[k] - wx[i][k] * li;
                let sl2 = suml2[k] - w[i][k] * li * li;
                let new_l = nearest_int(x[i][k] * sl2 / slx).clamp(-nmax, nmax - 1);
                let nf = new_l as f32;
                let slx2 = slx + wx[i][k] * nf;
                let sl22 = sl2 + w[i][k] * nf * nf;
                // Non-short-circuit `&` keeps this a select the compiler can vectorize.
                let take = (slx > 0.0)
                    & (new_l != l[i][k])
                    & (sl22 > 0.0)
                    & (slx2 * slx2 * suml2[k] > sumlx[k] * sumlx[k] * sl22);
                l[i][k] = if take { new_l } else { l[i][k] };
                sumlx[k] = if take { slx2 } else { sumlx[k] };
                suml2[k] = if take { sl22 } else { suml2[k] };
                changed[k] |= take;
            }
        }
        if !changed.iter().any(|&c| c) {
            break;
        }
    }
    let mut scale = [0.0f32; L];
    for k in 0..L {
        scale[k] = if suml2[k] > 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        };
        if zero[k] {
            scale[k] = 0.0;
        }
    }
    for i in 0..16 {
        for k in 0..L {
            out[i][k] = if zero[k] { 0 } else { (l[i][k] + nmax) as i8 };
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Groups meant to reach every branch: Gaussian at several scales, all positive,
    /// all zero, constant, near-zero, a lone outlier, few distinct values.
    fn group<const N: usize>(rng: &mut StdRng) -> [f32; N] {
        let kind = rng.gen_range(0..8);
        let scale = 10f32.powi(rng.gen_range(-12..6));
        std::array::from_fn(|i| match kind {
            0 => 0.0,
            1 => scale,
            2 => rng.gen_range(0.1..1.0) * scale,
            3 if i == 5 => 1e4 * scale,
            4 => rng.gen_range(-2..3) as f32 * scale,
            5 => rng.gen_range(-1.0..1.0) * 1e-16,
            _ => (rng.gen::<f32>() - 0.5) * scale,
        })
    }

    fn lanes_of<const N: usize, const L: usize>(groups: &[[f32; N]; L]) -> [[f32; L]; N] {
        std::array::from_fn(|i| std::array::from_fn(|k| groups[k][i]))
    }

    fn check_qkx2<const N: usize, const L: usize, const MAD: bool>(
        nmax: i32,
        rmin: f32,
        nstep: i32,
    ) {
        let p = reference::Qkx2Search {
            nmax,
            rmin,
            rdelta: 0.1,
            nstep,
            use_mad: MAD,
        };
        let mut rng = StdRng::seed_from_u64(nmax as u64);
        for _ in 0..200 {
            let groups: [[f32; N]; L] = std::array::from_fn(|_| group(&mut rng));
            let x = lanes_of(&groups);
            let w: [[f32; L]; N] = std::array::from_fn(|i| {
                std::array::from_fn(|k| {
                    if MAD {
                        x[i][k].abs()
                    } else {
                        0.3 + x[i][k].abs()
                    }
                })
            });
            let mut out = [[0u8; L]; N];
            let (scale, min) =
                super::make_qkx2_quants::<N, L, MAD>(nmax, rmin, 0.1, nstep, &x, &w, &mut out);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY (both calls): the CPU was just checked for AVX2.
                let (got, out_avx2): (Vec<(f32, f32)>, Vec<Vec<u8>>) = if L == 8 {
                    let x8: [[f32; 8]; N] =
                        std::array::from_fn(|i| std::array::from_fn(|k| x[i][k]));
                    let w8: [[f32; 8]; N] =
                        std::array::from_fn(|i| std::array::from_fn(|k| w[i][k]));
                    let mut o = [[0u8; 8]; N];
                    let (s, m) = unsafe {
                        super::avx2::make_qkx2_quants::<N, 8, 1, MAD>(
                            nmax, rmin, 0.1, nstep, &x8, &w8, &mut o,
                        )
                    };
                    (
                        s.into_iter().zip(m).collect(),
                        o.iter().map(|r| r.to_vec()).collect(),
                    )
                } else {
                    let x16: [[f32; 16]; N] =
                        std::array::from_fn(|i| std::array::from_fn(|k| x[i][k]));
                    let w16: [[f32; 16]; N] =
                        std::array::from_fn(|i| std::array::from_fn(|k| w[i][k]));
                    let mut o = [[0u8; 16]; N];
                    let (s, m) = unsafe {
                        super::avx2::make_qkx2_quants::<N, 16, 2, MAD>(
                            nmax, rmin, 0.1, nstep, &x16, &w16, &mut o,
                        )
                    };
                    (
                        s.into_iter().zip(m).collect(),
                        o.iter().map(|r| r.to_vec()).collect(),
                    )
                };
                for (k, (s, m)) in got.into_iter().enumerate() {
                    assert_eq!(
                        (s.to_bits(), m.to_bits()),
                        (scale[k].to_bits(), min[k].to_bits())
                    );
                    assert!((0..N).all(|i| out_avx2[i][k] == out[i][k]));
                }
            }
            for k in 0..L {
                let wk: [f32; N] = std::array::from_fn(|i| w[i][k]);
                let mut want = [0u8; N];
                let (s, m) = reference::make_qkx2_quants(&p, &groups[k], &wk, &mut want);
                assert_eq!(
                    (scale[k].to_bits(), min[k].to_bits()),
                    (s.to_bits(), m.to_bits()),
                    "{:?}",
                    groups[k]
                );
                assert!((0..N).all(|i| out[i][k] == want[i]), "{:?}", groups[k]);
            }
        }
    }

    #[test]
    fn qkx2_matches_the_scalar_search() {
        check_qkx2::<16, 16, true>(3, -0.5, 15);
        check_qkx2::<16, 8, true>(3, -0.5, 15);
        check_qkx2::<32, 16, false>(15, -1.0, 20);
        check_qkx2::<32, 8, false>(15, -1.0, 20);
        check_qkx2::<32, 8, false>(31, -0.5, 15);
    }

    #[test]
    fn qx_and_q3_match_the_scalar_searches() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let groups: [[f32; 16]; 16] = std::array::from_fn(|_| group(&mut rng));
            let x = lanes_of(&groups);
            let mut q3 = [[0i8; 16]; 16];
            let sx = super::make_qx_scales::<16>(32, &x);
            let s3 = super::make_q3_quants::<16>(4, &x, &mut q3);
            for k in 0..16 {
                let (mut wx, mut w3) = ([0i8; 16], [0i8; 16]);
                assert_eq!(
                    sx.scale[k].to_bits(),
                    reference::make_qx_quants(32, &groups[k], &mut wx).to_bits()
                );
                assert_eq!(
                    s3[k].to_bits(),
                    reference::make_q3_quants(4, &groups[k], &mut w3).to_bits()
                );
                // The winner's levels are the scalar search's levels.
                assert!(
                    (0..16).all(|i| sx.level(k, x[i][k]) == wx[i] && q3[i][k] == w3[i]),
                    "{:?}",
                    groups[k]
                );
            }
        }
    }
}

/// [`make_qkx2_quants`] for eight groups at a time, written with AVX2 intrinsics (the
/// compiler keeps the generic version's per-lane sums in memory, one lane at a time).
/// Every intrinsic is the IEEE operation the generic code performs, in the same order;
/// selects are blends on comparison masks, so signed zeros come out the same too.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Lane-wise `nearest_int(iscale * (x - min)).clamp(0, nmax)`, as f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn level(iscale: __m256, x: __m256, min: __m256, nmax: __m256i) -> __m256 {
        let v = _mm256_add_ps(
            _mm256_mul_ps(iscale, _mm256_sub_ps(x, min)),
            _mm256_set1_ps(12_582_912.0),
        );
        let bits = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x007f_ffff));
        let l = _mm256_sub_epi32(bits, _mm256_set1_epi32(0x0040_0000));
        _mm256_cvtepi32_ps(_mm256_min_epi32(
            _mm256_max_epi32(l, _mm256_setzero_si256()),
            nmax,
        ))
    }

    /// `|diff|` or `diff^2`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn err<const MAD: bool>(diff: __m256) -> __m256 {
        if MAD {
            _mm256_and_ps(diff, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)))
        } else {
            _mm256_mul_ps(diff, diff)
        }
    }

    /// `make_qkx2_quants` on `L = 8 * W` groups: `W` independent eight-lane searches
    /// interleaved in one loop, so that one search's additions fill the latency of the
    /// other's (each search's sums are long dependent chains). Same contract as the
    /// generic version.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn make_qkx2_quants<
        const N: usize,
        const L: usize,
        const W: usize,
        const MAD: bool,
    >(
        nmax: i32,
        rmin: f32,
        rdelta: f32,
        nstep: i32,
        x: &[[f32; L]; N],
        w: &[[f32; L]; N],
        out: &mut [[u8; L]; N],
    ) -> ([f32; L], [f32; L]) {
        const { assert!(L == 8 * W) };
        let ld = |a: &[f32; L], v: usize| _mm256_loadu_ps(a.as_ptr().add(8 * v));
        let zero = _mm256_setzero_ps();
        let nmax_i = _mm256_set1_epi32(nmax);
        let nmaxf = nmax as f32;

        let mut min = [zero; W];
        let mut max = [zero; W];
        let mut sum_w = [zero; W];
        let mut sum_x = [zero; W];
        for v in 0..W {
            min[v] = ld(&x[0], v);
            max[v] = min[v];
            sum_w[v] = ld(&w[0], v);
            sum_x[v] = _mm256_mul_ps(sum_w[v], min[v]);
        }
        for i in 1..N {
            for v in 0..W {
                let (xi, wi) = (ld(&x[i], v), ld(&w[i], v));
                min[v] = _mm256_min_ps(xi, min[v]);
                max[v] = _mm256_max_ps(xi, max[v]);
                sum_w[v] = _mm256_add_ps(sum_w[v], wi);
                sum_x[v] = _mm256_add_ps(sum_x[v], _mm256_mul_ps(wi, xi));
            }
        }
        let mut flat = [zero; W];
        let mut iscale = [zero; W];
        let mut scale = [zero; W];
        for v in 0..W {
            min[v] = _mm256_blendv_ps(min[v], zero, _mm256_cmp_ps::<_CMP_GT_OQ>(min[v], zero));
            flat[v] = _mm256_cmp_ps::<_CMP_EQ_OQ>(max[v], min[v]);
            iscale[v] = _mm256_div_ps(_mm256_set1_ps(nmaxf), _mm256_sub_ps(max[v], min[v]));
            scale[v] = _mm256_div_ps(_mm256_set1_ps(1.0), iscale[v]);
        }

        let mut best = [[zero; W]; N];
        let mut best_error = [zero; W];
        for i in 0..N {
            for v in 0..W {
                let xi = ld(&x[i], v);
                let l = level(iscale[v], xi, min[v], nmax_i);
                best[i][v] = l;
                let diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale[v], l), min[v]), xi);
                best_error[v] =
                    _mm256_add_ps(best_error[v], _mm256_mul_ps(ld(&w[i], v), err::<MAD>(diff)));
            }
        }

        let mut aux = [[zero; W]; N];
        for is in 0..=nstep {
            let num = _mm256_set1_ps(rmin + rdelta * is as f32 + nmaxf);
            let mut sum_l = [zero; W];
            let mut sum_l2 = [zero; W];
            let mut sum_xl = [zero; W];
            for v in 0..W {
                iscale[v] = _mm256_div_ps(num, _mm256_sub_ps(max[v], min[v]));
            }
            for i in 0..N {
                for v in 0..W {
                    let xi = ld(&x[i], v);
                    let l = level(iscale[v], xi, min[v], nmax_i);
                    aux[i][v] = l;
                    let wl = _mm256_mul_ps(ld(&w[i], v), l);
                    sum_l[v] = _mm256_add_ps(sum_l[v], wl);
                    sum_l2[v] = _mm256_add_ps(sum_l2[v], _mm256_mul_ps(wl, l));
                    sum_xl[v] = _mm256_add_ps(sum_xl[v], _mm256_mul_ps(wl, xi));
                }
            }
            let mut d = [zero; W];
            let mut this_scale = [zero; W];
            let mut this_min = [zero; W];
            for v in 0..W {
                d[v] = _mm256_sub_ps(
                    _mm256_mul_ps(sum_w[v], sum_l2[v]),
                    _mm256_mul_ps(sum_l[v], sum_l[v]),
                );
                let s = _mm256_div_ps(
                    _mm256_sub_ps(
                        _mm256_mul_ps(sum_w[v], sum_xl[v]),
                        _mm256_mul_ps(sum_x[v], sum_l[v]),
                    ),
                    d[v],
                );
                let m = _mm256_div_ps(
                    _mm256_sub_ps(
                        _mm256_mul_ps(sum_l2[v], sum_x[v]),
                        _mm256_mul_ps(sum_l[v], sum_xl[v]),
                    ),
                    d[v],
                );
                let clip = _mm256_cmp_ps::<_CMP_GT_OQ>(m, zero);
                this_min[v] = _mm256_blendv_ps(m, zero, clip);
                this_scale[v] = _mm256_blendv_ps(s, _mm256_div_ps(sum_xl[v], sum_l2[v]), clip);
            }
            let mut cur_error = [zero; W];
            for i in 0..N {
                for v in 0..W {
                    let xi = ld(&x[i], v);
                    let diff = _mm256_sub_ps(
                        _mm256_add_ps(_mm256_mul_ps(this_scale[v], aux[i][v]), this_min[v]),
                        xi,
                    );
                    cur_error[v] =
                        _mm256_add_ps(cur_error[v], _mm256_mul_ps(ld(&w[i], v), err::<MAD>(diff)));
                }
            }
            for v in 0..W {
                let better = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GT_OQ>(d[v], zero),
                    _mm256_cmp_ps::<_CMP_LT_OQ>(cur_error[v], best_error[v]),
                );
                let take = _mm256_andnot_ps(flat[v], better);
                if _mm256_movemask_ps(take) != 0 {
                    for (b, a) in best.iter_mut().zip(&aux) {
                        b[v] = _mm256_blendv_ps(b[v], a[v], take);
                    }
                    best_error[v] = _mm256_blendv_ps(best_error[v], cur_error[v], take);
                    scale[v] = _mm256_blendv_ps(scale[v], this_scale[v], take);
                    min[v] = _mm256_blendv_ps(min[v], this_min[v], take);
                }
            }
        }
        let mut scale_out = [0.0f32; L];
        let mut neg_min = [0.0f32; L];
        for v in 0..W {
            for i in 0..N {
                let l = _mm256_cvttps_epi32(_mm256_andnot_ps(flat[v], best[i][v]));
                let mut lanes = [0i32; 8];
                _mm256_storeu_si256(lanes.as_mut_ptr().cast(), l);
                for (o, l) in out[i][8 * v..8 * v + 8].iter_mut().zip(lanes) {
                    *o = l as u8;
                }
            }
            _mm256_storeu_ps(
                scale_out.as_mut_ptr().add(8 * v),
                _mm256_andnot_ps(flat[v], scale[v]),
            );
            _mm256_storeu_ps(
                neg_min.as_mut_ptr().add(8 * v),
                _mm256_xor_ps(min[v], _mm256_set1_ps(-0.0)),
            );
        }
        (scale_out, neg_min)
    }
}
