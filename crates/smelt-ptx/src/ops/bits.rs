//! Bit manipulation: logic, shifts, byte permutes, three-input logic, bit fields. These are
//! how quantized weights are unpacked: a nibble mask is one `lop3`, a byte shuffle one
//! `prmt`, a 6-bit scale one `bfe`.

use crate::kernel::Kernel;
use crate::reg::Src;
use crate::types::{BitField, RegType, Shift, Word, B32, B64, U32};
use crate::Reg;

/// The truth table of a `lop3`, an 8-bit immediate. Build it from the expression you mean
/// with [`Lut::from_fn`] instead of working the bits out by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lut(pub u8);

impl Lut {
    /// The table of `f(a, b, c)`, where `f` uses only bitwise operators: PTX defines the
    /// table as `f(0xF0, 0xCC, 0xAA)`.
    pub fn from_fn(f: impl Fn(u8, u8, u8) -> u8) -> Lut {
        Lut(f(0xF0, 0xCC, 0xAA))
    }
}

/// A `prmt` mode other than the default byte-select (PTX `.f4e`, `.b4e`, `.rc8`, `.ecl`,
/// `.ecr`, `.rc16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrmtMode {
    /// Forward 4 extract.
    F4e,
    /// Backward 4 extract.
    B4e,
    /// Replicate 8 bits.
    Rc8,
    /// Edge clamp left.
    Ecl,
    /// Edge clamp right.
    Ecr,
    /// Replicate 16 bits.
    Rc16,
}

impl PrmtMode {
    fn name(self) -> &'static str {
        match self {
            PrmtMode::F4e => "f4e",
            PrmtMode::B4e => "b4e",
            PrmtMode::Rc8 => "rc8",
            PrmtMode::Ecl => "ecl",
            PrmtMode::Ecr => "ecr",
            PrmtMode::Rc16 => "rc16",
        }
    }
}

impl Kernel {
    fn logic2<T: RegType>(&self, op: &str, d: Reg<T>, a: String, b: String) -> Reg<T> {
        self.emit(format!("{op}.{} {d}, {a}, {b}", T::Bits::NAME));
        d
    }

    /// `d = a & b` (`and.b32`, `and.pred`); any type of the width.
    pub fn and<T: RegType>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T::Bits>) -> Reg<T> {
        self.logic2("and", d, a.to_string(), b.operand())
    }

    /// `d = a | b`.
    pub fn or<T: RegType>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T::Bits>) -> Reg<T> {
        self.logic2("or", d, a.to_string(), b.operand())
    }

    /// `d = a ^ b`.
    pub fn xor<T: RegType>(&self, d: Reg<T>, a: Reg<T>, b: impl Src<T::Bits>) -> Reg<T> {
        self.logic2("xor", d, a.to_string(), b.operand())
    }

    /// `d = !a` (bitwise, or predicate negation).
    pub fn not<T: RegType>(&self, d: Reg<T>, a: Reg<T>) -> Reg<T> {
        self.emit(format!("not.{} {d}, {a}", T::Bits::NAME));
        d
    }

    /// `d = a << n` (`shl.b32`); `n` of 32 or more gives zero.
    pub fn shl<T: Shift>(&self, d: Reg<T>, a: Reg<T>, n: impl Src<U32>) -> Reg<T> {
        self.emit(format!("shl.{} {d}, {}, {}", T::Bits::NAME, a, n.operand()));
        d
    }

    /// `d = a >> n`: arithmetic on signed types (`shr.s32`), logical otherwise.
    pub fn shr<T: Shift>(&self, d: Reg<T>, a: Reg<T>, n: impl Src<U32>) -> Reg<T> {
        self.emit(format!("shr.{} {d}, {}, {}", T::NAME, a, n.operand()));
        d
    }

    /// Byte permute (`prmt.b32`): each selector nibble picks one of the 8 bytes of
    /// `{b, a}` (0-3 from `a`, 4-7 from `b`; bit 3 set replicates its sign). `0x5410`
    /// joins the low halves of `a` and `b`.
    pub fn prmt<T: Word>(
        &self,
        d: Reg<T>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        selector: impl Src<B32>,
    ) -> Reg<T> {
        self.emit(format!(
            "prmt.b32 {d}, {}, {}, {}",
            a.operand(),
            b.operand(),
            selector.operand()
        ));
        d
    }

    /// `prmt` with one of its special modes.
    pub fn prmt_mode<T: Word>(
        &self,
        mode: PrmtMode,
        d: Reg<T>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        selector: impl Src<B32>,
    ) -> Reg<T> {
        self.emit(format!(
            "prmt.b32.{} {d}, {}, {}, {}",
            mode.name(),
            a.operand(),
            b.operand(),
            selector.operand()
        ));
        d
    }

    /// Any bitwise function of three words in one instruction (`lop3.b32`).
    pub fn lop3<T: Word>(
        &self,
        d: Reg<T>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        c: impl Src<B32>,
        lut: Lut,
    ) -> Reg<T> {
        self.emit(format!(
            "lop3.b32 {d}, {}, {}, {}, 0x{:02X}",
            a.operand(),
            b.operand(),
            c.operand(),
            lut.0
        ));
        d
    }

    /// Extracts `len` bits of `a` from bit `pos` (`bfe.u32` zero-extends, `bfe.s32`
    /// sign-extends).
    pub fn bfe<T: BitField>(
        &self,
        d: Reg<T>,
        a: Reg<T>,
        pos: impl Src<U32>,
        len: impl Src<U32>,
    ) -> Reg<T> {
        self.emit(format!(
            "bfe.{} {d}, {}, {}, {}",
            T::NAME,
            a,
            pos.operand(),
            len.operand()
        ));
        d
    }

    /// Inserts the low `len` bits of `a` into `b` at bit `pos` (`bfi.b32`).
    pub fn bfi<T: Word>(
        &self,
        d: Reg<T>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        pos: impl Src<U32>,
        len: impl Src<U32>,
    ) -> Reg<T> {
        self.emit(format!(
            "bfi.b32 {d}, {}, {}, {}, {}",
            a.operand(),
            b.operand(),
            pos.operand(),
            len.operand()
        ));
        d
    }

    /// Number of set bits (`popc.b32`).
    pub fn popc(&self, d: Reg<U32>, a: impl Src<B32>) -> Reg<U32> {
        self.emit(format!("popc.b32 {d}, {}", a.operand()));
        d
    }

    /// Number of leading zeros (`clz.b32`).
    pub fn clz(&self, d: Reg<U32>, a: impl Src<B32>) -> Reg<U32> {
        self.emit(format!("clz.b32 {d}, {}", a.operand()));
        d
    }

    /// Bit reverse (`brev.b32`).
    pub fn brev<T: Word>(&self, d: Reg<T>, a: impl Src<B32>) -> Reg<T> {
        self.emit(format!("brev.b32 {d}, {}", a.operand()));
        d
    }

    /// Bit reverse of 64 bits (`brev.b64`).
    pub fn brev64(&self, d: Reg<B64>, a: impl Src<B64>) -> Reg<B64> {
        self.emit(format!("brev.b64 {d}, {}", a.operand()));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;
    use crate::types::{Pred, F32, S32, U64};

    #[test]
    fn logic_uses_bit_types() {
        let text = body(|k| {
            let (a, b) = (k.reg::<U32>(), k.reg::<U32>());
            k.and(a, a, 0xF0F0F0F0u32);
            k.or(b, a, b);
            k.xor(b, b, a);
            k.not(b, b);
            let f = k.reg::<F32>();
            k.and(f, f, 0x7FFF_FFFFu32);
            let p = k.reg::<Pred>();
            k.and(p, p, p);
            let w = k.reg::<U64>();
            k.or(w, w, 1u64);
        });
        assert_eq!(
            text,
            [
                "and.b32 %r0, %r0, 0xF0F0F0F0;",
                "or.b32 %r1, %r0, %r1;",
                "xor.b32 %r1, %r1, %r0;",
                "not.b32 %r1, %r1;",
                "and.b32 %f0, %f0, 0x7FFFFFFF;",
                "and.pred %p0, %p0, %p0;",
                "or.b64 %rd0, %rd0, 1;",
            ]
        );
    }

    #[test]
    fn shifts_follow_signedness() {
        let text = body(|k| {
            let (u, s) = (k.reg::<U32>(), k.reg::<S32>());
            k.shl(u, u, 4u32);
            k.shr(u, u, 4u32);
            k.shr(s, s, u);
        });
        assert_eq!(
            text,
            [
                "shl.b32 %r0, %r0, 4;",
                "shr.u32 %r0, %r0, 4;",
                "shr.s32 %s0, %s0, %r0;",
            ]
        );
    }

    #[test]
    fn permutes_and_fields() {
        let text = body(|k| {
            let (a, b) = (k.reg::<U32>(), k.reg::<U32>());
            let d = k.prmt(k.reg::<U32>(), a, b, 0x5410u32);
            k.prmt_mode(PrmtMode::Ecl, d, a, b, 0u32);
            let lut = Lut::from_fn(|a, b, c| (a & b) | c);
            k.lop3(d, a, 0x0F0F_0F0Fu32, b, lut);
            k.bfe(d, a, 8u32, 6u32);
            let s = k.reg::<S32>();
            k.bfe(s, s, b, 4u32);
            k.bfi(d, a, b, 4u32, 4u32);
            k.popc(d, a);
            k.clz(d, s);
            k.brev(d, a);
        });
        assert_eq!(
            text,
            [
                "prmt.b32 %r2, %r0, %r1, 0x5410;",
                "prmt.b32.ecl %r2, %r0, %r1, 0;",
                "lop3.b32 %r2, %r0, 0xF0F0F0F, %r1, 0xEA;",
                "bfe.u32 %r2, %r0, 8, 6;",
                "bfe.s32 %s0, %s0, %r1, 4;",
                "bfi.b32 %r2, %r0, %r1, 4, 4;",
                "popc.b32 %r2, %r0;",
                "clz.b32 %r2, %s0;",
                "brev.b32 %r2, %r0;",
            ]
        );
    }

    #[test]
    fn lut_matches_ptx_definition() {
        assert_eq!(Lut::from_fn(|a, _, _| a).0, 0xF0);
        assert_eq!(Lut::from_fn(|a, b, c| a ^ b ^ c).0, 0x96);
        assert_eq!(Lut::from_fn(|a, b, _| a & !b).0, 0x30);
    }
}
