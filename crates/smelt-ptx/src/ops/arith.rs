//! Integer and floating-point arithmetic, moves, selects and comparisons.
//!
//! Float arithmetic always carries `.rn`: PTX without a rounding mode lets ptxas fuse a
//! `mul` and a dependent `add` into an `fma`, which changes results in the last bit; with
//! `.rn` each instruction rounds exactly as written, which bit-exact kernels rely on.

use crate::kernel::Kernel;
use crate::reg::{Reinterpret, Src};
use crate::types::{
    Arith, Compare, Data, Float, Int, Pred, RegType, Signed, Widen, B32, F16, F32, S32, U32, U64,
};
use crate::Reg;

/// A `setp` comparison. On unsigned integers the orderings compare unsigned. On floats
/// each is PTX's ordered form, false when either side is NaN — `Ne` included, unlike C's
/// `!=`; negate an `Eq` for "not equal or NaN".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

impl Cmp {
    fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
    }
}

impl Kernel {
    /// `d = a + b` (`add.u32`, `add.rn.f32`).
    pub fn add<T: Arith>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!(
            "add{}.{} {d}, {}, {}",
            T::ROUND,
            T::NAME,
            a,
            b.operand()
        ));
        d
    }

    /// `d = a - b` (`sub.s32`, `sub.rn.f32`).
    pub fn sub<T: Arith>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!(
            "sub{}.{} {d}, {}, {}",
            T::ROUND,
            T::NAME,
            a,
            b.operand()
        ));
        d
    }

    /// `d = a * b`: the low half for integers (`mul.lo.u32`), rounded for floats
    /// (`mul.rn.f32`).
    pub fn mul<T: Arith>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!(
            "mul{}.{} {d}, {}, {}",
            T::MUL,
            T::NAME,
            a,
            b.operand()
        ));
        d
    }

    /// The high half of an integer product (`mul.hi.u32`), for division by constants.
    pub fn mul_hi<T: Int>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!("mul.hi.{} {d}, {}, {}", T::NAME, a, b.operand()));
        d
    }

    /// The full double-width product (`mul.wide.u32`): 32-bit index times stride as a
    /// 64-bit byte offset in one instruction.
    pub fn mul_wide<T: Widen>(&self, d: Reg<T::Wide>, a: Reg<T>, b: impl Src<T>) -> Reg<T::Wide> {
        self.emit(format!("mul.wide.{} {d}, {a}, {}", T::NAME, b.operand()));
        d
    }

    /// `d = a * b + c` on integers, low half (`mad.lo.u32`).
    pub fn mad<T: Int>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>, c: impl Src<T>) -> Reg<T> {
        self.emit(format!(
            "mad.lo.{} {d}, {}, {}, {}",
            T::NAME,
            a,
            b.operand(),
            c.operand()
        ));
        d
    }

    /// `d = a * b + c` with a single rounding (`fma.rn.f32`), the only way this crate
    /// emits a fused multiply-add: explicitly.
    pub fn fma<T: Float>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>, c: impl Src<T>) -> Reg<T> {
        self.emit(format!(
            "fma.rn.{} {d}, {}, {}, {}",
            T::NAME,
            a,
            b.operand(),
            c.operand()
        ));
        d
    }

    /// `d = min(a, b)`.
    pub fn min<T: Arith>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!("min.{} {d}, {}, {}", T::NAME, a, b.operand()));
        d
    }

    /// `d = max(a, b)`.
    pub fn max<T: Arith>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!("max.{} {d}, {}, {}", T::NAME, a, b.operand()));
        d
    }

    /// `d = -a`.
    pub fn neg<T: Signed>(&self, d: Reg<T>, a: Reg<T>) -> Reg<T> {
        self.emit(format!("neg.{} {d}, {}", T::NAME, a));
        d
    }

    /// `d = |a|`.
    pub fn abs<T: Signed>(&self, d: Reg<T>, a: Reg<T>) -> Reg<T> {
        self.emit(format!("abs.{} {d}, {}", T::NAME, a));
        d
    }

    /// Integer quotient, rounded toward zero (`div.u32`). Slow on the GPU: prefer shifts
    /// or `mul_hi` by a reciprocal for constants.
    pub fn div_int<T: Int>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!("div.{} {d}, {}, {}", T::NAME, a, b.operand()));
        d
    }

    /// Integer remainder (`rem.u32`).
    pub fn rem<T: Int>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T>) -> Reg<T> {
        self.emit(format!("rem.{} {d}, {}, {}", T::NAME, a, b.operand()));
        d
    }

    /// IEEE division, correctly rounded (`div.rn.f32`).
    pub fn div_rn(&self, d: Reg<F32>, a: impl Src<F32>, b: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("div.rn.f32 {d}, {}, {}", a.operand(), b.operand()));
        d
    }

    /// Fast reciprocal, within 1 ulp (`rcp.approx.f32`).
    pub fn rcp_approx(&self, d: Reg<F32>, a: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("rcp.approx.f32 {d}, {}", a.operand()));
        d
    }

    /// Correctly rounded square root (`sqrt.rn.f32`).
    pub fn sqrt_rn(&self, d: Reg<F32>, a: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("sqrt.rn.f32 {d}, {}", a.operand()));
        d
    }

    /// Fast `1/sqrt(a)` (`rsqrt.approx.f32`), what RMSNorm uses.
    pub fn rsqrt_approx(&self, d: Reg<F32>, a: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("rsqrt.approx.f32 {d}, {}", a.operand()));
        d
    }

    /// Fast `2^a` (`ex2.approx.f32`), the base of softmax's `exp`.
    pub fn ex2_approx(&self, d: Reg<F32>, a: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("ex2.approx.f32 {d}, {}", a.operand()));
        d
    }

    /// Fast `log2(a)` (`lg2.approx.f32`).
    pub fn lg2_approx(&self, d: Reg<F32>, a: impl Src<F32>) -> Reg<F32> {
        self.emit(format!("lg2.approx.f32 {d}, {}", a.operand()));
        d
    }

    /// `d = a` (`mov`): copies a register or loads an immediate.
    pub fn mov<T: RegType>(&self, d: Reg<T>, a: impl Src<T>) -> Reg<T> {
        self.emit(format!("mov.{} {d}, {}", T::MOVE_NAME, a.operand()));
        d
    }

    /// A new register holding the `u32` constant `v`.
    pub fn u32(&self, v: u32) -> Reg<U32> {
        let d = self.reg();
        self.mov(d, v)
    }

    /// A new register holding the `s32` constant `v`.
    pub fn s32(&self, v: i32) -> Reg<S32> {
        let d = self.reg();
        self.mov(d, v)
    }

    /// A new register holding the `u64` constant `v`.
    pub fn u64(&self, v: u64) -> Reg<U64> {
        let d = self.reg();
        self.mov(d, v)
    }

    /// A new register holding the `f32` constant `v` (bit-exact).
    pub fn f32(&self, v: f32) -> Reg<F32> {
        let d = self.reg();
        self.mov(d, v)
    }

    /// A new register holding the half with bit pattern `bits` (PTX has no f16 literal).
    pub fn f16_bits(&self, bits: u16) -> Reg<F16> {
        let d = self.reg::<F16>();
        self.emit(format!("mov.b16 {d}, 0x{bits:04X}"));
        d
    }

    /// Reinterprets the bits of `a` as another type of the same width (`mov.b32`): the
    /// float <-> integer bitcast; same-width integer views need no instruction
    /// ([`Reg::cast`]).
    pub fn bitcast<D: RegType, S: RegType<Bits = D::Bits>>(&self, a: Reg<S>) -> Reg<D> {
        let d = self.reg::<D>();
        self.emit(format!("mov.{} {d}, {a}", D::Bits::NAME));
        d
    }

    /// Packs two halves into 32 bits, `lo` in the low half (`mov.b32 d, {lo, hi}`).
    pub fn pack_f16x2(&self, lo: Reg<F16>, hi: Reg<F16>) -> Reg<B32> {
        let d = self.reg::<B32>();
        self.emit(format!("mov.b32 {d}, {{{lo}, {hi}}}"));
        d
    }

    /// `d = p ? a : b` without a branch (`selp`).
    pub fn selp<T: Data>(&self, d: Reg<T>, a: impl Src<T>, b: impl Src<T>, p: Reg<Pred>) -> Reg<T> {
        self.emit(format!(
            "selp.{} {d}, {}, {}, {p}",
            T::MOVE_NAME,
            a.operand(),
            b.operand()
        ));
        d
    }

    /// `p = a <cmp> b` (`setp.lt.u32`).
    pub fn setp<T: Compare>(&self, cmp: Cmp, p: Reg<Pred>, a: Reg<T>, b: impl Src<T>) {
        if T::EQUALITY_ONLY && !matches!(cmp, Cmp::Eq | Cmp::Ne) {
            self.fail(format!(
                "setp.{}.{}: untyped bits compare only for equality",
                cmp.name(),
                T::NAME
            ));
        }
        self.emit(format!(
            "setp.{}.{} {p}, {a}, {}",
            cmp.name(),
            T::NAME,
            b.operand()
        ));
    }

    /// A new predicate holding `a <cmp> b`.
    pub fn cmp<T: Compare>(&self, cmp: Cmp, a: Reg<T>, b: impl Src<T>) -> Reg<Pred> {
        let p = self.reg::<Pred>();
        self.setp(cmp, p, a, b);
        p
    }

    /// A new register with a copy of `a`, for values a loop will update in place.
    pub fn copy<T: RegType>(&self, a: Reg<T>) -> Reg<T> {
        let d = self.reg();
        self.mov(d, a)
    }

    /// `d = a` where `a` is any type PTX lets stand for `T` (a `u32` into a `b32`).
    pub fn mov_from<T: RegType, S: RegType + Reinterpret<T>>(
        &self,
        d: Reg<T>,
        a: Reg<S>,
    ) -> Reg<T> {
        self.mov(d, a.cast::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;
    use crate::types::{F64, S64};

    #[test]
    fn float_arithmetic_always_rounds_to_nearest() {
        let text = body(|k| {
            let (a, b, c) = (k.reg::<F32>(), k.reg::<F32>(), k.reg::<F32>());
            k.add(c, a, b);
            k.sub(c, a, 1.5f32);
            k.mul(c, a, b);
            k.fma(c, a, b, c);
            k.min(c, a, b);
            k.max(c, a, 0.0f32);
            k.neg(c, a);
            k.abs(c, a);
            let h = k.reg::<F16>();
            k.add(h, h, h);
            k.fma(h, h, h, h);
            let x = k.reg::<F64>();
            k.mul(x, x, 2.0f64);
        });
        assert_eq!(
            text,
            [
                "add.rn.f32 %f2, %f0, %f1;",
                "sub.rn.f32 %f2, %f0, 0f3FC00000;",
                "mul.rn.f32 %f2, %f0, %f1;",
                "fma.rn.f32 %f2, %f0, %f1, %f2;",
                "min.f32 %f2, %f0, %f1;",
                "max.f32 %f2, %f0, 0f00000000;",
                "neg.f32 %f2, %f0;",
                "abs.f32 %f2, %f0;",
                "add.rn.f16 %h0, %h0, %h0;",
                "fma.rn.f16 %h0, %h0, %h0, %h0;",
                "mul.rn.f64 %fd0, %fd0, 0d4000000000000000;",
            ]
        );
    }

    #[test]
    fn integer_arithmetic() {
        let text = body(|k| {
            let (a, b) = (k.reg::<U32>(), k.reg::<U32>());
            let d = k.add(k.reg(), a, 1u32);
            k.sub(d, d, b);
            k.mul(d, a, b);
            k.mul_hi(d, a, b);
            k.mad(d, a, 34u32, b);
            let w = k.mul_wide(k.reg::<U64>(), a, 34u32);
            k.add(w, w, 8u64);
            let s = k.reg::<S32>();
            k.mul_wide(k.reg::<S64>(), s, -2i32);
            k.div_int(d, a, b);
            k.rem(d, a, 32u32);
            k.min(s, s, 0i32);
        });
        assert_eq!(
            text,
            [
                "add.u32 %r2, %r0, 1;",
                "sub.u32 %r2, %r2, %r1;",
                "mul.lo.u32 %r2, %r0, %r1;",
                "mul.hi.u32 %r2, %r0, %r1;",
                "mad.lo.u32 %r2, %r0, 34, %r1;",
                "mul.wide.u32 %rd0, %r0, 34;",
                "add.u64 %rd0, %rd0, 8;",
                "mul.wide.s32 %sd0, %s0, -2;",
                "div.u32 %r2, %r0, %r1;",
                "rem.u32 %r2, %r0, 32;",
                "min.s32 %s0, %s0, 0;",
            ]
        );
    }

    #[test]
    fn special_functions() {
        let text = body(|k| {
            let (a, d) = (k.reg::<F32>(), k.reg::<F32>());
            k.div_rn(d, a, 3.0f32);
            k.rcp_approx(d, a);
            k.sqrt_rn(d, a);
            k.rsqrt_approx(d, a);
            k.ex2_approx(d, a);
            k.lg2_approx(d, a);
        });
        assert_eq!(
            text,
            [
                "div.rn.f32 %f1, %f0, 0f40400000;",
                "rcp.approx.f32 %f1, %f0;",
                "sqrt.rn.f32 %f1, %f0;",
                "rsqrt.approx.f32 %f1, %f0;",
                "ex2.approx.f32 %f1, %f0;",
                "lg2.approx.f32 %f1, %f0;",
            ]
        );
    }

    #[test]
    fn moves_selects_and_comparisons() {
        let text = body(|k| {
            let one = k.f32(1.0);
            let n = k.u32(4096);
            k.s32(-1);
            k.u64(1 << 40);
            let h = k.f16_bits(0x3C00);
            k.pack_f16x2(h, h);
            let bits = k.bitcast::<U32, F32>(one);
            k.bitcast::<F32, U32>(bits);
            let p = k.cmp(Cmp::Lt, n, 100u32);
            k.setp(Cmp::Ge, p, one, 0.5f32);
            k.selp(k.reg::<F32>(), one, 0.0f32, p);
            let b = k.reg::<B32>();
            k.mov_from(b, n);
            k.copy(one);
        });
        assert_eq!(
            text,
            [
                "mov.f32 %f0, 0f3F800000;",
                "mov.u32 %r0, 0x1000;",
                "mov.s32 %s0, -1;",
                "mov.u64 %rd0, 0x10000000000;",
                "mov.b16 %h0, 0x3C00;",
                "mov.b32 %b0, {%h0, %h0};",
                "mov.b32 %r1, %f0;",
                "mov.b32 %f1, %r1;",
                "setp.lt.u32 %p0, %r0, 100;",
                "setp.ge.f32 %p0, %f0, 0f3F000000;",
                "selp.f32 %f2, %f0, 0f00000000, %p0;",
                "mov.b32 %b1, %r0;",
                "mov.f32 %f3, %f0;",
            ]
        );
    }

    #[test]
    fn bits_compare_only_for_equality() {
        let mut m = crate::Module::new(crate::Target::Sm80);
        assert!(m
            .kernel("eq", |k| {
                k.cmp(Cmp::Ne, k.reg::<B32>(), 0);
            })
            .is_ok());
        let r = m.kernel("lt", |k| {
            k.cmp(Cmp::Lt, k.reg::<B32>(), 0);
        });
        assert!(matches!(r, Err(crate::PtxError::Invalid { .. })), "{r:?}");
    }
}

#[cfg(test)]
mod literal_tests {
    use crate::testing::body;
    use crate::types::{B32, F32, S32, U32, U64};

    #[test]
    fn bare_literals_take_the_instruction_type() {
        let text = body(|k| {
            let (u, s, f, b, w) = (
                k.reg::<U32>(),
                k.reg::<S32>(),
                k.reg::<F32>(),
                k.reg::<B32>(),
                k.reg::<U64>(),
            );
            k.add(u, u, 1);
            k.add(s, s, -1);
            k.mul(f, f, 0.5);
            k.and(b, b, 0xFF);
            k.add(w, w, 8);
            k.exit_if(k.ge(u, 10));
        });
        assert_eq!(
            text,
            [
                "add.u32 %r0, %r0, 1;",
                "add.s32 %s0, %s0, -1;",
                "mul.rn.f32 %f0, %f0, 0f3F000000;",
                "and.b32 %b0, %b0, 255;",
                "add.u64 %rd0, %rd0, 8;",
                "setp.ge.u32 %p0, %r0, 10;",
                "@%p0 exit;",
            ]
        );
    }
}
