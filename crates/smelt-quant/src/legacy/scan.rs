//! Per-block scans and conversions shared by the reference quantizers.
//!
//! ggml scans a block element by element; these helpers scan in eight lanes so the
//! compiler can vectorize them, and then repair the one thing lanes could change: which of
//! several equal candidates is picked. ggml keeps the *first* element that reaches the
//! final extreme, which only matters for the sign of the result (±0.0, or ±amax).

/// Runs `f` compiled for AVX2 when the CPU has it, else as is. The scans and conversions
/// here are exact IEEE operations (Rust never fuses a multiply and an add), so the wider
/// code gives the same bytes; it only lets the compiler use 8-lane vectors where the
/// baseline x86_64 target has 4.
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { avx2(f) };
    }
    f()
}

/// Splits a row into 32-weight blocks (the trailing partial block, which callers never
/// pass, is dropped).
#[inline(always)]
pub(crate) fn blocks32(src: &[f32]) -> impl Iterator<Item = &[f32; 32]> {
    src.chunks_exact(32).filter_map(|c| c.try_into().ok())
}

/// Splits an output row into 32-float blocks as arrays, so loops over a block have a
/// length the compiler knows.
#[inline(always)]
pub(crate) fn blocks32_mut(dst: &mut [f32]) -> impl Iterator<Item = &mut [f32; 32]> {
    dst.chunks_exact_mut(32).filter_map(|c| c.try_into().ok())
}

/// Packs 32 four-bit quants as ggml does: weight `j` in the low nibble of byte `j`,
/// weight `j + 16` in its high nibble.
#[inline(always)]
pub(crate) fn pack4(q: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| (q[j] & 0x0F) | (q[j + 16] << 4))
}

/// Packs 32 five-bit quants: the low four bits as [`pack4`], the fifth bit of weight `j`
/// as bit `j` of a little-endian u32.
#[inline(always)]
pub(crate) fn pack5(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    // Eight quants at a time as a u64: bit 4 of each byte moved to bit 0, then one
    // multiply gathers the eight bits into the top byte (no partial products collide).
    let qh: [u8; 4] = std::array::from_fn(|k| {
        let w = u64::from_le_bytes(std::array::from_fn(|i| q[8 * k + i]));
        (((w >> 4) & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
    });
    (pack4(q), qh)
}

/// Largest magnitude in `x` (ggml's `amax`), as a non-negative value, for finite `x`
/// (callers reject NaN and infinities before quantizing).
#[inline(always)]
pub(crate) fn abs_max(x: &[f32; 32]) -> f32 {
    // Magnitudes of finite floats order exactly as their bit patterns do, and integer max
    // vectorizes where LLVM leaves a float compare-and-select scalar.
    let mut lanes = [0u32; 8];
    for k in 0..4 {
        for (l, m) in lanes.iter_mut().enumerate() {
            *m = (*m).max(x[8 * k + l].to_bits() & 0x7FFF_FFFF);
        }
    }
    f32::from_bits(lanes.into_iter().fold(0, u32::max))
}

/// The first element of largest magnitude, with its sign (ggml's `max` in q4_0/q5_0,
/// whose sign becomes the scale's); `+0.0` for an all-zero block.
#[inline(always)]
pub(crate) fn signed_abs_max(x: &[f32; 32]) -> f32 {
    let amax = abs_max(x);
    if amax == 0.0 {
        return 0.0;
    }
    // A bit mask of the elements reaching `amax` compiles to packed compares; its lowest
    // set bit is ggml's pick.
    let hits = x
        .iter()
        .enumerate()
        .fold(0u32, |m, (i, v)| m | (((v.abs() == amax) as u32) << i));
    x.get(hits.trailing_zeros() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// The minimum and maximum of `x` as ggml's `if (v < min) min = v; if (v > max) max = v;`
/// scan finds them, down to the sign of a zero extreme (the first zero seen wins).
#[inline(always)]
pub(crate) fn min_max(x: &[f32; 32]) -> (f32, f32) {
    // Compared as integer keys, which order finite floats exactly as `<` does except that
    // -0.0 sorts below +0.0 (fixed below); integer min/max vectorizes, float select does not.
    let key = |v: f32| {
        let b = v.to_bits() as i32;
        b ^ (((b >> 31) as u32) >> 1) as i32
    };
    let unkey = |k: i32| f32::from_bits((k ^ (((k >> 31) as u32) >> 1) as i32) as u32);
    let mut lo = [i32::MAX; 8];
    let mut hi = [i32::MIN; 8];
    for k in 0..4 {
        for l in 0..8 {
            let v = key(x[8 * k + l]);
            lo[l] = lo[l].min(v);
            hi[l] = hi[l].max(v);
        }
    }
    let mut min = unkey(lo.into_iter().fold(i32::MAX, i32::min));
    let mut max = unkey(hi.into_iter().fold(i32::MIN, i32::max));
    // ggml keeps the first zero it meets when the extreme is zero.
    let first_zero = || x.iter().copied().find(|&v| v == 0.0).unwrap_or(0.0);
    if min == 0.0 {
        min = first_zero();
    }
    if max == 0.0 {
        max = first_zero();
    }
    (min, max)
}

/// `1/d`, or 0 when `d` is zero (ggml's `d ? 1.0f/d : 0.0f`).
#[inline(always)]
pub(crate) fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// C's float -> int conversion as x86 executes it (`cvttss2si`): truncation toward zero,
/// and the "integer indefinite" `i32::MIN` for NaN and anything out of range. ggml hits
/// the latter for real: a block of tiny values has a subnormal scale whose inverse is
/// infinite, and its quants come out of converting infinities and NaNs.
#[inline(always)]
pub(crate) fn cvtt(v: f32) -> i32 {
    // Written as select-convert-select rather than `v as i32` (which saturates, and which
    // LLVM leaves scalar): this form compiles to one packed conversion plus blends.
    let in_range = v.abs() < 2_147_483_648.0; // false for NaN
    let safe = if in_range { v } else { 0.0 };
    // SAFETY: `safe` is finite and truncates to a value inside i32.
    let t = unsafe { safe.to_int_unchecked::<i32>() };
    if in_range {
        t
    } else {
        i32::MIN
    }
}

/// C's `(int8_t)v` (or `(uint8_t)v`) for a float as x86 compilers emit it: [`cvtt`], then
/// keep the low byte.
#[inline(always)]
pub(crate) fn trunc_i8(v: f32) -> i8 {
    cvtt(v) as i8
}

/// C's `(int8_t)roundf(v)` as x86 executes it (round half away from zero, then [`cvtt`]'s
/// conversion). Unlike `f32::round` this vectorizes: truncate, then step away from zero
/// when the exact remainder reaches one half (only below 2^23, where a remainder exists).
#[inline(always)]
pub(crate) fn round_away(v: f32) -> i32 {
    let t = cvtt(v);
    let frac = v - t as f32;
    let step = (frac >= 0.5) as i32 - (frac <= -0.5) as i32;
    t + (step & -((v.abs() < 8_388_608.0) as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_away_matches_roundf() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            assert_eq!(round_away(v), v.round() as i32, "{v}");
            v += 0.0625;
        }
        for v in [
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            1.5,
            -2.5,
            126.5,
            -126.50001,
            8388607.5,
        ] {
            assert_eq!(round_away(v), v.round() as i32, "{v}");
        }
    }

    #[test]
    fn extremes_keep_ggml_first_choice() {
        let mut x = [0.0f32; 32];
        x[3] = -2.0;
        x[9] = 2.0;
        assert_eq!(signed_abs_max(&x), -2.0);
        x[3] = 2.0;
        x[9] = -2.0;
        assert_eq!(signed_abs_max(&x), 2.0);
        assert_eq!(signed_abs_max(&[0.0; 32]).to_bits(), 0.0f32.to_bits());
        let mut last = [0.5f32; 32];
        last[31] = -3.0;
        assert_eq!(signed_abs_max(&last), -3.0);

        // ggml keeps the first zero: here -0.0 at index 1 for both extremes.
        let mut z = [1.0f32; 32];
        z[1] = -0.0;
        z[2] = 0.0;
        let (min, _) = min_max(&z);
        assert_eq!(min.to_bits(), (-0.0f32).to_bits());
        let mut z = [-1.0f32; 32];
        z[5] = 0.0;
        z[20] = -0.0;
        let (_, max) = min_max(&z);
        assert_eq!(max.to_bits(), 0.0f32.to_bits());
        let mut r: [f32; 32] = std::array::from_fn(|i| i as f32 - 7.5);
        r[31] = 100.0;
        assert_eq!(min_max(&r), (-7.5, 100.0));
        assert_eq!(abs_max(&r), 100.0);
    }

    #[test]
    fn conversions_follow_x86_for_out_of_range_values() {
        for v in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            3e9,
            -2147483904.0,
        ] {
            assert_eq!(cvtt(v), i32::MIN, "{v}");
            assert_eq!(round_away(v), i32::MIN, "{v}");
            assert_eq!(trunc_i8(v), 0, "{v}");
        }
        assert_eq!(cvtt(-2147483648.0), i32::MIN);
        assert_eq!(cvtt(-2147483520.0), -2147483520);
        assert_eq!(cvtt(-7.9), -7);
        assert_eq!(trunc_i8(200.7), -56);
        assert_eq!(round_away(1e9 + 0.0), 1_000_000_000);
    }

    #[test]
    fn pack5_puts_fifth_bits_in_weight_order() {
        for seed in 0..64u32 {
            let q: [u8; 32] = std::array::from_fn(|i| ((i as u32 * 7 + seed * 13) % 32) as u8);
            let (qs, qh) = pack5(&q);
            let qh = u32::from_le_bytes(qh);
            for j in 0..32 {
                let low = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
                assert_eq!(
                    low | ((((qh >> j) & 1) as u8) << 4),
                    q[j],
                    "seed {seed} j {j}"
                );
            }
        }
    }

    /// ggml's sequential scans, for comparison.
    fn ggml_min_max(x: &[f32; 32]) -> (f32, f32) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        (min, max)
    }

    fn ggml_signed_abs_max(x: &[f32; 32]) -> f32 {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        max
    }

    #[test]
    fn scans_match_ggml_bit_for_bit() {
        let pool = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            1e-45,
            -1e-45,
            1e-39,
            -1e-39,
            f32::MAX,
            -f32::MAX,
            3.5,
            -3.5,
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..20_000 {
            let x: [f32; 32] = std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                pool[(state % pool.len() as u64) as usize]
            });
            let (min, max) = min_max(&x);
            let (gmin, gmax) = ggml_min_max(&x);
            assert_eq!(
                (min.to_bits(), max.to_bits()),
                (gmin.to_bits(), gmax.to_bits()),
                "{x:?}"
            );
            assert_eq!(
                signed_abs_max(&x).to_bits(),
                ggml_signed_abs_max(&x).to_bits(),
                "{x:?}"
            );
            let amax = x
                .iter()
                .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            assert_eq!(abs_max(&x).to_bits(), amax.to_bits());
        }
    }
}
