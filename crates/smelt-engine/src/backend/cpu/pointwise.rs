//! The row kernels of the CPU backend's element-wise ops, in ggml's operations and order
//! so their bits match llama.cpp's: the RMS-norm scale, SwiGLU and GeGLU (GELU from ggml's
//! f16 table), and the RoPE rotation of each head. [`super`]'s `Backend` ops call them
//! over rows.

use std::sync::OnceLock;

use smelt_quant::fp::{f16_to_f32, f32_to_f16};

use super::ggml_math;
#[cfg(target_arch = "x86_64")]
use super::ggml_simd;
use crate::backend::RopeStyle;

/// `gate = silu(gate) * up` over one row as ggml's `ggml_vec_swiglu_f32` (AVX-512 build):
/// whole chunks of 16 through its vector exp, the rest through libm's.
#[inline(always)]
pub(super) fn silu_row(g: &mut [f32], u: &[f32]) {
    let whole = g.len() - g.len() % 16;
    for (g, &u) in g[..whole].iter_mut().zip(&u[..whole]) {
        *g = ggml_math::silu(*g) * u;
    }
    for (g, &u) in g[whole..].iter_mut().zip(&u[whole..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn silu_row_fma(g: &mut [f32], u: &[f32]) {
    silu_row(g, u)
}

/// [`silu_row`] with its whole chunks of 16 eight lanes at a time where the CPU allows
/// (same bits: [`ggml_simd::silu8`] is the scalar lane's twin).
pub(super) fn silu_row_best(g: &mut [f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if ggml_simd::ok() {
        // SAFETY: AVX2, FMA and F16C were detected at run time.
        unsafe {
            let whole = ggml_simd::swiglu_whole16(g, u);
            return silu_row_fma(&mut g[whole..], &u[whole..]);
        }
    }
    if ggml_math::fma_ok() {
        // SAFETY: AVX2 and FMA were detected at run time.
        unsafe { silu_row_fma(g, u) }
    } else {
        silu_row(g, u)
    }
}

/// Rotates each head of one row: ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`, as GCC
/// contracts them (-ffp-contract=fast): the first product fused, the second rounded.
#[inline(always)]
pub(super) fn rotate_heads(
    row: &mut [f32],
    head_dim: usize,
    cs: &[(f32, f32)],
    style: RopeStyle,
    n_rot: usize,
) {
    for head in row.chunks_mut(head_dim) {
        for (i, &(cos, sin)) in cs.iter().enumerate() {
            let (a, b) = match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + n_rot / 2),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(cos, -(x1 * sin));
            head[b] = x0.mul_add(sin, x1 * cos);
        }
    }
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn rotate_heads_fma(
    row: &mut [f32],
    head_dim: usize,
    cs: &[(f32, f32)],
    style: RopeStyle,
    n_rot: usize,
) {
    rotate_heads(row, head_dim, cs, style, n_rot)
}

/// `gelu(x) * u` as ggml's `ggml_vec_geglu_f32` computes it (`GGML_GELU_FP16`): GELU with
/// the tanh approximation looked up by the input rounded to f16, so activations match
/// llama.cpp's bit for bit; `x * u` itself past 10, 0 below -10.
pub(super) fn gelu_times(x: f32, u: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x * u;
    }
    gelu(x) * u
}

/// GELU with the tanh approximation, looked up by the input rounded to f16 (ggml's table).
fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    gelu_table()[f32_to_f16(x).to_bits() as usize]
}

/// ggml's `ggml_table_gelu_f16`, widened: GELU of every f16 input, rounded to f16.
pub(super) fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16_to_f32(f32_to_f16(gelu_exact(f16_to_f32(half::f16::from_bits(b))))))
            .collect()
    })
}

/// ggml's `ggml_gelu_f32` as GCC compiles it (`-ffp-contract=fast` fuses
/// `1 + GELU_COEF_A*x*x` into one FMA); the table of f16 results equals ggml's for every
/// input (checked against libggml-cpu).
fn gelu_exact(x: f32) -> f32 {
    #[allow(clippy::excessive_precision)]
    const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_355_879_892_119_868_76;
    const COEF_A: f32 = 0.044715;
    let inner = (SQRT_2_OVER_PI * x) * (COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + inner.tanh())
}

/// `1 / sqrt(mean(x^2) + eps)` of one norm chunk, the sum in f64 (as ggml-cpu's
/// `ggml_compute_forward_rms_norm`), for [`Backend::rms_norm`] and its in-place form.
///
/// [`Backend::rms_norm`]: crate::backend::Backend::rms_norm
pub(super) fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_formula_within_f16() {
        for x in [-3.0f32, -0.5, 0.0, 0.1, 1.0, 2.5] {
            assert!(
                (gelu(x) - gelu_exact(x)).abs() <= 2e-3 * (1.0 + x.abs()),
                "{x}"
            );
        }
        assert_eq!(gelu(-11.0), 0.0);
        assert_eq!(gelu(12.0), 12.0);
    }
}
