//! Element-wise kernels: the gated activations (SwiGLU, GeGLU), the residual add, scaling
//! and the per-row bias add. Grid-stride loops: any grid is correct, [`launch`] picks one.

use smelt_ptx::{Cmp, FloatRound, Kernel, Load, Reg, Store, F16, F32, U32};

use super::{dim, kernel_params, Launch, LOG2E};
use crate::catalog::Entry;

/// The gated activation `gate = act(gate) * up` (the engine's `Glu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// SiLU (SwiGLU): `x / (1 + e^-x)`.
    Silu,
    /// GELU, tanh approximation (GeGLU), with the CPU backend's f16 rounding.
    Gelu,
}

/// Name of the GLU kernel for `act`.
pub fn glu_name(act: Glu) -> &'static str {
    match act {
        Glu::Silu => "glu_silu",
        Glu::Gelu => "glu_gelu",
    }
}

/// Name of [`add_kernel`].
pub const ADD: &str = "add_f32";
/// Name of [`scale_kernel`].
pub const SCALE: &str = "scale_f32";
/// Name of [`add_bias_kernel`].
pub const ADD_BIAS: &str = "add_bias_f32";

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = [Glu::Silu, Glu::Gelu]
        .into_iter()
        .map(|a| -> Entry {
            (
                glu_name(a).to_string(),
                Box::new(move |k: &Kernel| glu_kernel(k, a)),
            )
        })
        .collect();
    v.push((ADD.to_string(), Box::new(add_kernel)));
    v.push((SCALE.to_string(), Box::new(scale_kernel)));
    v.push((ADD_BIAS.to_string(), Box::new(add_bias_kernel)));
    v
}

/// Threads per block of the element-wise kernels.
pub const THREADS: u32 = 256;

/// Launch of the grid-stride kernels (GLU, add, scale) over `n` values.
pub fn launch(n: usize) -> Launch {
    Launch::new(
        (dim(n.div_ceil(THREADS as usize).min(8192)), 1, 1),
        (THREADS, 1, 1),
    )
}

/// Launch of [`add_bias_kernel`] over `rows` rows of `cols` values.
pub fn launch_bias(rows: usize, cols: usize) -> Launch {
    Launch::new(
        (dim(cols.div_ceil(THREADS as usize)), dim(rows), 1),
        (THREADS, 1, 1),
    )
}

fn grid_stride(k: &Kernel, n: Reg<U32>, body: impl FnOnce(&Kernel, Reg<U32>)) {
    k.stride_loop(k.global_id_x(), n, k.grid_size_x(), body);
}

kernel_params! {
    /// Arguments of [`glu_kernel`] (every activation).
    GluArgs, GluRegs {
        gate: Ptr,
        up: Ptr,
        n: U32,
    }
}

/// `gate[i] = act(gate[i]) * up[i]` for `i < n`.
///
/// Parameters: `gate: *mut f32, up: *const f32, n: u32`. Launch: [`launch`].
///
/// SiLU is `x / (1 + 2^(-x·log2 e))` with an IEEE division. GELU follows the CPU backend,
/// which follows ggml's CPU table: 0 at or below -10, `x` at or above 10, else the tanh
/// formula of `x` rounded to f16, its result rounded to f16 (`0.5·x·(1 + tanh u)` is
/// computed as `x / (1 + e^(-2u))`, the same function).
pub fn glu_kernel(k: &Kernel, act: Glu) {
    k.max_threads(THREADS, 1, 1);
    let GluRegs { gate, up, n } = GluRegs::declare(k);
    grid_stride(k, n, |k, i| {
        let ga = k.elem_addr(gate, i, 4);
        let x = k.load::<F32>(Load::GLOBAL, ga);
        let u = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(up, i, 4));
        let y = match act {
            Glu::Silu => silu(k, x),
            Glu::Gelu => gelu(k, x),
        };
        k.mul(y, y, u);
        k.st(Store::GLOBAL, ga, y);
    });
}

pub(crate) fn silu(k: &Kernel, x: Reg<F32>) -> Reg<F32> {
    let e = k.mul(k.reg(), x, -LOG2E);
    k.ex2_approx(e, e);
    k.add(e, e, 1.0f32);
    k.div_rn(k.reg(), x, e)
}

pub(crate) fn gelu(k: &Kernel, x: Reg<F32>) -> Reg<F32> {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let h = k.cvt(k.reg::<F16>(), x, FloatRound::Rn);
    let xh = k.cvt(k.reg::<F32>(), h, smelt_ptx::Exact);
    // u = (c·x)·fma(a·x, x, 1), the CPU backend's order (ggml's as GCC contracts it).
    let t = k.mul(k.reg(), xh, COEF_A);
    k.fma(t, t, xh, 1.0f32);
    let u = k.mul(k.reg(), xh, SQRT_2_OVER_PI);
    k.mul(u, u, t);
    let e = k.mul(k.reg(), u, -2.0 * LOG2E);
    k.ex2_approx(e, e);
    k.add(e, e, 1.0f32);
    let g = k.div_rn(k.reg(), xh, e);
    let gh = k.cvt(k.reg::<F16>(), g, FloatRound::Rn);
    let y = k.cvt(k.reg::<F32>(), gh, smelt_ptx::Exact);
    let low = k.cmp(Cmp::Le, x, -10.0f32);
    k.selp(y, 0.0f32, y, low);
    let high = k.cmp(Cmp::Ge, x, 10.0f32);
    k.selp(y, x, y, high);
    y
}

kernel_params! {
    /// Arguments of [`add_kernel`].
    AddArgs, AddRegs {
        x: Ptr,
        y: Ptr,
        n: U32,
    }
}

/// `x[i] += y[i]` for `i < n`.
///
/// Parameters: `x: *mut f32, y: *const f32, n: u32`. Launch: [`launch`].
pub fn add_kernel(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
    let AddRegs { x, y, n } = AddRegs::declare(k);
    grid_stride(k, n, |k, i| {
        let xa = k.elem_addr(x, i, 4);
        let a = k.load::<F32>(Load::GLOBAL, xa);
        let b = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(y, i, 4));
        k.add(a, a, b);
        k.st(Store::GLOBAL, xa, a);
    });
}

kernel_params! {
    /// Arguments of [`scale_kernel`].
    ScaleArgs, ScaleRegs {
        x: Ptr,
        n: U32,
        s: F32,
    }
}

/// `x[i] *= s` for `i < n`.
///
/// Parameters: `x: *mut f32, n: u32, s: f32`. Launch: [`launch`].
pub fn scale_kernel(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
    let ScaleRegs { x, n, s } = ScaleRegs::declare(k);
    grid_stride(k, n, |k, i| {
        let xa = k.elem_addr(x, i, 4);
        let a = k.load::<F32>(Load::GLOBAL, xa);
        k.mul(a, a, s);
        k.st(Store::GLOBAL, xa, a);
    });
}

kernel_params! {
    /// Arguments of [`add_bias_kernel`].
    AddBiasArgs, AddBiasRegs {
        x: Ptr,
        bias: Ptr,
        cols: U32,
    }
}

/// `x[r][c] += bias[c]` for every row.
///
/// Parameters: `x: *mut f32, bias: *const f32, cols: u32`. Launch: [`launch_bias`]
/// (grid y = rows).
pub fn add_bias_kernel(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
    let AddBiasRegs { x, bias, cols } = AddBiasRegs::declare(k);
    let c = k.global_id_x();
    k.exit_if(k.ge(c, cols));
    let row = k.ctaid_y();
    let i = k.mad(k.reg(), row, cols, c);
    let xa = k.elem_addr(x, i, 4);
    let a = k.load::<F32>(Load::GLOBAL, xa);
    let b = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(bias, c, 4));
    k.add(a, a, b);
    k.st(Store::GLOBAL, xa, a);
}

/// CPU twin of [`glu_kernel`] (the CPU backend's `glu`).
pub fn glu_cpu(gate: &mut [f32], up: &[f32], act: Glu) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let y = match act {
            Glu::Silu => *g / (1.0 + (-*g).exp()),
            Glu::Gelu => gelu_cpu(*g),
        };
        *g = y * u;
    }
}

/// The CPU backend's GELU: the tanh formula on the input rounded to f16, its result
/// rounded to f16 (ggml's `GGML_GELU_FP16` table), 0 at or below -10 and `x` at or
/// above 10.
pub fn gelu_cpu(x: f32) -> f32 {
    use smelt_quant::fp::{f16_to_f32, f32_to_f16};
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let x = f16_to_f32(f32_to_f16(x));
    let inner = (SQRT_2_OVER_PI * x) * (COEF_A * x).mul_add(x, 1.0);
    let g = 0.5 * x * (1.0 + inner.tanh());
    f16_to_f32(f32_to_f16(g))
}

/// CPU twin of [`add_kernel`].
pub fn add_cpu(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}

/// CPU twin of [`scale_kernel`].
pub fn scale_cpu(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// CPU twin of [`add_bias_kernel`].
pub fn add_bias_cpu(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len().max(1)) {
        row.iter_mut().zip(bias).for_each(|(a, &b)| *a += b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build_with_exact_float_ops() {
        let mut m = Module::new(Target::Sm80);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        assert!(ptx.contains("ex2.approx.f32"));
        assert!(ptx.contains("cvt.rn.f16.f32"));
        assert!(ptx.contains("add.rn.f32"));
        // The one fused op is GELU's `fma(a·x, x, 1)`, as in the CPU backend.
        assert_eq!(ptx.matches("fma.rn.f32").count(), 1);
    }

    #[test]
    fn twins() {
        let mut g = vec![0.0, 1.0, -20.0, 12.0];
        glu_cpu(&mut g, &[1.0, 2.0, 1.0, 0.5], Glu::Gelu);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 * 0.841_192).abs() < 2e-3);
        assert_eq!(g[2], 0.0);
        assert_eq!(g[3], 6.0);
        let mut s = vec![1.0f32];
        glu_cpu(&mut s, &[3.0], Glu::Silu);
        assert!((s[0] - 3.0 * 0.731_058_6).abs() < 1e-6);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        add_bias_cpu(&mut x, &[10.0, 20.0]);
        assert_eq!(x, vec![11.0, 22.0, 13.0, 24.0]);
        add_cpu(&mut x, &[1.0; 4]);
        scale_cpu(&mut x, 2.0);
        assert_eq!(x, vec![24.0, 46.0, 28.0, 50.0]);
    }
}
