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

/// Largest magnitude in `x` (ggml's `amax`), as a non-negative value.
#[inline(always)]
pub(crate) fn abs_max(x: &[f32; 32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for k in 0..4 {
        for (l, m) in lanes.iter_mut().enumerate() {
            let a = x[8 * k + l].abs();
            *m = if a > *m { a } else { *m };
        }
    }
    // max of non-negative non-NaN values: any order gives the same bits.
    let m4: [f32; 4] = std::array::from_fn(|l| lanes[l].max(lanes[l + 4]));
    m4[0].max(m4[2]).max(m4[1].max(m4[3]))
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
    let mut lo = [f32::MAX; 8];
    let mut hi = [-f32::MAX; 8];
    for k in 0..4 {
        for l in 0..8 {
            let v = x[8 * k + l];
            lo[l] = if v < lo[l] { v } else { lo[l] };
            hi[l] = if v > hi[l] { v } else { hi[l] };
        }
    }
    let mut min = lo
        .into_iter()
        .fold(f32::MAX, |m, v| if v < m { v } else { m });
    let mut max = hi
        .into_iter()
        .fold(-f32::MAX, |m, v| if v > m { v } else { m });
    // Only zeros compare equal with different bits; take the first one, as ggml does.
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
}
