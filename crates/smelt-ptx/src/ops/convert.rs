//! `cvt` with the rounding PTX demands, checked by the type system: integer to float and
//! float narrowing take a float rounding ([`FloatRound`]), float to integer takes an integer
//! rounding ([`IntRound`]), widening and integer resizing take none ([`Exact`]). A missing
//! or wrong rounding mode is a compile error here, not a ptxas error later.

use crate::kernel::Kernel;
use crate::types::{Bf16, RegType, B32, F16, F32, F64, S16, S32, S64, U16, U32, U64};
use crate::Reg;

/// A rounding modifier of `cvt`.
pub trait Rounding: Copy {
    /// The modifier with its dot (`.rn`), or empty.
    fn suffix(self) -> &'static str;
}

/// No rounding: the conversion is exact (widening) or defined as truncation (integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Exact;

impl Rounding for Exact {
    fn suffix(self) -> &'static str {
        ""
    }
}

/// Rounding to a float result: to nearest even, toward zero, down, up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatRound {
    /// To nearest, ties to even (`.rn`).
    Rn,
    /// Toward zero (`.rz`).
    Rz,
    /// Toward minus infinity (`.rm`).
    Rm,
    /// Toward plus infinity (`.rp`).
    Rp,
}

impl Rounding for FloatRound {
    fn suffix(self) -> &'static str {
        match self {
            FloatRound::Rn => ".rn",
            FloatRound::Rz => ".rz",
            FloatRound::Rm => ".rm",
            FloatRound::Rp => ".rp",
        }
    }
}

/// Rounding to an integer result: to nearest even (ggml's `roundf` is *not* this: it
/// rounds halves away from zero), toward zero (C's cast), down, up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntRound {
    /// To nearest integer, ties to even (`.rni`).
    Rni,
    /// Toward zero, as C casts (`.rzi`).
    Rzi,
    /// Down, floor (`.rmi`).
    Rmi,
    /// Up, ceiling (`.rpi`).
    Rpi,
}

impl Rounding for IntRound {
    fn suffix(self) -> &'static str {
        match self {
            IntRound::Rni => ".rni",
            IntRound::Rzi => ".rzi",
            IntRound::Rmi => ".rmi",
            IntRound::Rpi => ".rpi",
        }
    }
}

/// `Self` can be produced from `S` by `cvt`, with rounding of kind `Mode`.
pub trait CvtFrom<S: RegType>: RegType {
    /// The rounding this conversion takes.
    type Mode: Rounding;
}

macro_rules! cvt_pairs {
    ($mode:ident: $($d:ident <- [$($s:ident),*];)*) => {$($(
        impl CvtFrom<$s> for $d {
            type Mode = $mode;
        }
    )*)*};
}

cvt_pairs!(Exact:
    U16 <- [U16, S16, U32, S32, U64, S64];
    S16 <- [U16, S16, U32, S32, U64, S64];
    U32 <- [U16, S16, U32, S32, U64, S64];
    S32 <- [U16, S16, U32, S32, U64, S64];
    U64 <- [U16, S16, U32, S32, U64, S64];
    S64 <- [U16, S16, U32, S32, U64, S64];
    F32 <- [F16];
    F64 <- [F16, F32];
);
cvt_pairs!(FloatRound:
    F16 <- [U16, S16, U32, S32, U64, S64, F32, F64];
    F32 <- [U16, S16, U32, S32, U64, S64, F64];
    F64 <- [U16, S16, U32, S32, U64, S64];
    Bf16 <- [F32];
);
cvt_pairs!(IntRound:
    U16 <- [F16, F32, F64];
    S16 <- [F16, F32, F64];
    U32 <- [F16, F32, F64];
    S32 <- [F16, F32, F64];
    U64 <- [F16, F32, F64];
    S64 <- [F16, F32, F64];
    F16 <- [F16];
    F32 <- [F32];
    F64 <- [F64];
);

impl Kernel {
    /// `d = convert(a)` (`cvt.rn.f32.s32`, `cvt.f32.f16`, `cvt.rni.s32.f32`).
    pub fn cvt<D: CvtFrom<S>, S: RegType>(&self, d: Reg<D>, a: Reg<S>, mode: D::Mode) -> Reg<D> {
        self.emit(format!(
            "cvt{}.{}.{} {d}, {a}",
            mode.suffix(),
            D::NAME,
            S::NAME
        ));
        d
    }

    /// Like [`Kernel::cvt`], clamping to the destination's range (`.sat`): floats to
    /// [0, 1], integers to their min and max.
    pub fn cvt_sat<D: CvtFrom<S>, S: RegType>(
        &self,
        d: Reg<D>,
        a: Reg<S>,
        mode: D::Mode,
    ) -> Reg<D> {
        self.emit(format!(
            "cvt{}.sat.{}.{} {d}, {a}",
            mode.suffix(),
            D::NAME,
            S::NAME
        ));
        d
    }

    /// A new register holding `a` converted to `D`.
    pub fn to<D: CvtFrom<S>, S: RegType>(&self, a: Reg<S>, mode: D::Mode) -> Reg<D> {
        let d = self.reg::<D>();
        self.cvt(d, a, mode)
    }

    /// Packs two floats into one word of halves, each rounded to nearest
    /// (`cvt.rn.f16x2.f32 d, hi, lo`): `lo` in the low half, which is the element of the
    /// lower index in an `mma` f16 fragment, `hi` in the high half. sm_80 and later.
    pub fn cvt_f16x2(&self, d: Reg<B32>, hi: Reg<F32>, lo: Reg<F32>) -> Reg<B32> {
        self.emit(format!("cvt.rn.f16x2.f32 {d}, {hi}, {lo}"));
        d
    }

    /// `d = a - b` on two packed halves at once (`sub.rn.f16x2`; PTX takes no
    /// immediate halves: constants go through a register), words as [`Kernel::cvt_f16x2`]
    /// packs them: exact for the small integers a weight unpacks to
    /// (`1024 + q` less 1024). sm_80 and later.
    pub fn sub_f16x2(&self, d: Reg<B32>, a: Reg<B32>, b: Reg<B32>) -> Reg<B32> {
        self.emit(format!("sub.rn.f16x2 {d}, {a}, {b}"));
        d
    }

    /// `d = a * b + c` on two packed halves at once, one rounding each (`fma.rn.f16x2`):
    /// a group's scale and minimum applied to two weights. sm_80 and later.
    pub fn fma_f16x2(&self, d: Reg<B32>, a: Reg<B32>, b: Reg<B32>, c: Reg<B32>) -> Reg<B32> {
        self.emit(format!("fma.rn.f16x2 {d}, {a}, {b}, {c}"));
        d
    }

    /// Sign-extends the low byte of `a` (`cvt.s32.s8`): one int8 of packed quants.
    pub fn sext_i8(&self, d: Reg<S32>, a: Reg<U32>) -> Reg<S32> {
        self.emit(format!("cvt.s32.s8 {d}, {a}"));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;

    #[test]
    fn two_floats_pack_into_halves_high_operand_first() {
        let text = body(|k| {
            let (hi, lo) = (k.reg::<F32>(), k.reg::<F32>());
            k.cvt_f16x2(k.reg::<B32>(), hi, lo);
        });
        assert_eq!(text, ["cvt.rn.f16x2.f32 %b0, %f0, %f1;"]);
    }

    #[test]
    fn packed_half_arithmetic_rounds_to_nearest() {
        let text = body(|k| {
            let (a, b, c) = (k.reg::<B32>(), k.reg::<B32>(), k.reg::<B32>());
            k.sub_f16x2(a, b, c);
            k.fma_f16x2(a, a, b, c);
        });
        assert_eq!(
            text,
            [
                "sub.rn.f16x2 %b0, %b1, %b2;",
                "fma.rn.f16x2 %b0, %b0, %b1, %b2;"
            ]
        );
    }

    #[test]
    fn conversions_carry_the_rounding_ptx_requires() {
        let text = body(|k| {
            let (f, s, u, h) = (
                k.reg::<F32>(),
                k.reg::<S32>(),
                k.reg::<U32>(),
                k.reg::<F16>(),
            );
            k.cvt(f, s, FloatRound::Rn);
            k.cvt(s, f, IntRound::Rni);
            k.cvt(u, f, IntRound::Rzi);
            k.cvt(f, h, Exact);
            k.cvt(h, f, FloatRound::Rn);
            k.cvt(f, f, IntRound::Rmi);
            k.cvt(k.reg::<U64>(), u, Exact);
            k.cvt(u, k.reg::<U64>(), Exact);
            k.cvt(k.reg::<Bf16>(), f, FloatRound::Rn);
            k.cvt_sat(s, f, IntRound::Rni);
            let d: Reg<F64> = k.to(f, Exact);
            k.to::<F32, _>(d, FloatRound::Rz);
            k.sext_i8(s, u);
        });
        assert_eq!(
            text,
            [
                "cvt.rn.f32.s32 %f0, %s0;",
                "cvt.rni.s32.f32 %s0, %f0;",
                "cvt.rzi.u32.f32 %r0, %f0;",
                "cvt.f32.f16 %f0, %h0;",
                "cvt.rn.f16.f32 %h0, %f0;",
                "cvt.rmi.f32.f32 %f0, %f0;",
                "cvt.u64.u32 %rd0, %r0;",
                "cvt.u32.u64 %r0, %rd1;",
                "cvt.rn.bf16.f32 %bf0, %f0;",
                "cvt.rni.sat.s32.f32 %s0, %f0;",
                "cvt.f64.f32 %fd0, %f0;",
                "cvt.rz.f32.f64 %f1, %fd0;",
                "cvt.s32.s8 %s0, %r0;",
            ]
        );
    }
}
