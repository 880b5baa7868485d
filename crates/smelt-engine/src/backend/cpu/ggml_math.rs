//! The float kernels of ggml's CPU backend that llama.cpp's attention and activations go
//! through, in ggml's exact order and rounding (AVX-512 build: `GGML_AVX512` sets
//! `__AVX512F__`/`__AVX512DQ__`, so `vec.h` takes its 16-lane paths):
//!
//! - [`expf`]: `ggml_v_expf`, the polynomial exp of the softmax and SiLU (not libm's);
//! - [`reduce16`]: `_mm512_reduce_add_ps` as GCC defines it (halves, then quarters, then
//!   `(t0+t2) + (t1+t3)`);
//! - [`dot_vec`]: `ggml_vec_dot_f16` (decode: four 16-lane FMA accumulators over chunks of
//!   64, leftovers added in f64);
//! - [`dot_gemm`]: llamafile's tinyBLAS F16 kernel (batches of two or more tokens: one
//!   16-lane FMA accumulator).
//!
//! Each is written lane by lane with `f32::mul_add`, so compiled for AVX2 + FMA it
//! vectorizes and compiled without it gives the same bits.

/// `ggml_v_expf` of one lane (AVX-512 variant: `scalef` for the exponent, exact flush to
/// 0 / infinity past |n| > 192).
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(
            u,
            f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0), // 0x1.ffffecp-1
        );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `j * 2^n` for an integral `n` with |n| <= 192, rounded once (as `vscalefps`).
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    let n = n as i32;
    if (-126..=127).contains(&n) {
        j * f32::from_bits(((n + 127) as u32) << 23)
    } else {
        (j as f64 * 2f64.powi(n)) as f32
    }
}

/// `ggml_v_silu`: `x / (1 + expf(-x))`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// `_mm512_reduce_add_ps` (GCC 12's definition).
#[inline(always)]
pub fn reduce16(v: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| v[i + 8] + v[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// The part of ggml's f16/f32 vector dots over whole chunks of 64 (the first `np`
/// elements): element `i` into accumulator `(i / 16) % 4`, lane `i % 16`, the accumulators
/// added `(s0+s2) + (s1+s3)` and reduced ([`reduce16`]).
#[inline(always)]
fn chunks64(a: &[f32], b: &[f32], np: usize) -> f32 {
    let mut acc = [[0f32; 16]; 4];
    for (ca, cb) in a[..np].chunks_exact(64).zip(b[..np].chunks_exact(64)) {
        for (j, s) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                s[l] = ca[16 * j + l].mul_add(cb[16 * j + l], s[l]);
            }
        }
    }
    let s02: [f32; 16] = std::array::from_fn(|l| acc[0][l] + acc[2][l]);
    let s13: [f32; 16] = std::array::from_fn(|l| acc[1][l] + acc[3][l]);
    let s: [f32; 16] = std::array::from_fn(|l| s02[l] + s13[l]);
    reduce16(&s)
}

/// `ggml_vec_dot_f16` of two rows (f16 values held in f32): element `i` goes to
/// accumulator `(i / 16) % 4`, lane `i % 16`, over whole chunks of 64; the accumulators are
/// added `(s0+s2) + (s1+s3)` and reduced; the leftovers are added one by one in f64.
#[inline(always)]
pub fn dot_vec(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n - n % 64;
    let mut sum = chunks64(a, b, np) as f64;
    for i in np..n {
        sum += (a[i] * b[i]) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_f32` of two rows: [`dot_vec`]'s four 16-lane accumulators over chunks of
/// 64, but the leftovers accumulate in f32, each fused into the sum (GCC contracts
/// `sumf += x[i]*y[i]`).
#[inline(always)]
pub fn dot_vec_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n - n % 64;
    let mut sum = chunks64(a, b, np);
    for i in np..n {
        sum = a[i].mul_add(b[i], sum);
    }
    sum
}

/// tinyBLAS's F16 dot (AVX-512: `KN = 16`): element `i` into lane `i % 16` of one
/// accumulator, then [`reduce16`]. Only for lengths that are a multiple of 16 (tinyBLAS
/// declines others and ggml falls back to [`dot_vec`]).
#[inline(always)]
pub fn dot_gemm(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// [`dot_vec`] of four rows `a` with one row `b` (four independent chains, interleaved).
#[inline(always)]
pub fn dot_vec4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let n = a.iter().map(|a| a.len()).min().unwrap_or(0).min(b.len());
    let np = n - n % 64;
    let mut acc = [[[0f32; 16]; 4]; 4];
    for c in (0..np).step_by(64) {
        let cb = &b[c..c + 64];
        for (r, acc) in acc.iter_mut().enumerate() {
            let ca = &a[r][c..c + 64];
            for (j, s) in acc.iter_mut().enumerate() {
                for l in 0..16 {
                    s[l] = ca[16 * j + l].mul_add(cb[16 * j + l], s[l]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        let acc = &acc[r];
        let s02: [f32; 16] = std::array::from_fn(|l| acc[0][l] + acc[2][l]);
        let s13: [f32; 16] = std::array::from_fn(|l| acc[1][l] + acc[3][l]);
        let s: [f32; 16] = std::array::from_fn(|l| s02[l] + s13[l]);
        let mut sum = reduce16(&s) as f64;
        for i in np..n {
            sum += (a[r][i] * b[i]) as f64;
        }
        sum as f32
    })
}

/// [`dot_gemm`] of four rows `a` with one row `b` (four independent chains, interleaved).
#[inline(always)]
pub fn dot_gemm4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let n = a.iter().map(|a| a.len()).min().unwrap_or(0).min(b.len());
    let mut acc = [[0f32; 16]; 4];
    for c in (0..n - n % 16).step_by(16) {
        let cb = &b[c..c + 16];
        for (r, s) in acc.iter_mut().enumerate() {
            let ca = &a[r][c..c + 16];
            for l in 0..16 {
                s[l] = ca[l].mul_add(cb[l], s[l]);
            }
        }
    }
    acc.map(|s| reduce16(&s))
}

/// Whether the AVX2 + FMA variants may run (`SMELT_NO_SIMD` turns them off): callers keep
/// a `#[target_feature(enable = "avx2,fma")]` twin of each hot function that calls the
/// `#[inline(always)]` generic code, so `mul_add` is one instruction and the lane loops
/// vectorize; without them `mul_add` is libm's `fmaf`, slower but the same bits.
#[inline(always)]
pub fn fma_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        smelt_quant::simd::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Test helper: `f` inside a function compiled for AVX2 + FMA when present.
#[cfg(test)]
fn with_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if fma_ok() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { fast(f) };
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm_and_flushes() {
        for i in -1000..=1000 {
            let x = i as f32 * 0.087;
            let (a, b) = (expf(x), x.exp());
            assert!((a - b).abs() <= 4e-7 * b, "{x}: {a} vs {b}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
        assert_eq!(expf(0.0), 1.0);
    }

    #[test]
    fn dots_sum_in_their_lanes() {
        let a: Vec<f32> = (0..200).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..200).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot_vec(&a, &b) as f64 - exact).abs() < 1e-4);
        let exact192: f64 = a[..192]
            .iter()
            .zip(&b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum();
        assert!((dot_gemm(&a[..192], &b[..192]) as f64 - exact192).abs() < 1e-4);
        assert_eq!(with_fma(|| dot_vec(&a, &b)), dot_vec(&a, &b));
        let rows: Vec<Vec<f32>> = (0..4)
            .map(|r| {
                (0..200)
                    .map(|i| ((i * (r + 2)) as f32 * 0.13).sin())
                    .collect()
            })
            .collect();
        let four: [&[f32]; 4] = std::array::from_fn(|r| &rows[r][..]);
        let v4 = with_fma(|| dot_vec4(four, &b));
        let g4 = with_fma(|| dot_gemm4(four.map(|r| &r[..192]), &b[..192]));
        for r in 0..4 {
            assert_eq!(v4[r].to_bits(), dot_vec(&rows[r], &b).to_bits());
            assert_eq!(
                g4[r].to_bits(),
                dot_gemm(&rows[r][..192], &b[..192]).to_bits()
            );
        }
        assert_eq!(with_fma(|| expf(-3.3)), expf(-3.3));
    }
}
