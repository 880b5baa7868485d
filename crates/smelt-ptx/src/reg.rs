//! Registers, immediates and the operand rules that tie them to instruction types.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Not;

use crate::types::{
    Bf16, Pred, RegType, B16, B32, B64, CLASS_DECLS, F16, F32, F64, S16, S32, S64, U16, U32, U64,
};

/// A virtual register of PTX type `T`. Cheap to copy; ptxas does the real allocation, so a
/// kernel may use as many as reads well.
pub struct Reg<T> {
    id: u32,
    /// The register set it was declared in, which a [`Reg::cast`] view keeps.
    class: u8,
    ty: PhantomData<T>,
}

impl<T> Clone for Reg<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Reg<T> {}
impl<T> PartialEq for Reg<T> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.class == other.class
    }
}
impl<T> Eq for Reg<T> {}

impl<T: RegType> Reg<T> {
    pub(crate) fn new(id: u32) -> Self {
        Self {
            id,
            class: T::CLASS as u8,
            ty: PhantomData,
        }
    }

    /// The same register seen as another type of PTX's compatible set (integers of one
    /// width among themselves, bit types with anything of their width). PTX reinterprets
    /// such operands for free, so this emits nothing; float <-> integer needs
    /// [`crate::Kernel::bitcast`], which emits a `mov`.
    pub fn cast<U: RegType>(self) -> Reg<U>
    where
        T: Reinterpret<U>,
    {
        Reg {
            id: self.id,
            class: self.class,
            ty: PhantomData,
        }
    }
}

impl<T: RegType> fmt::Display for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (_, prefix) = CLASS_DECLS[usize::from(self.class)];
        write!(f, "{prefix}{}", self.id)
    }
}

impl<T: RegType> fmt::Debug for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reg<{}>({self})", T::NAME)
    }
}

/// Pairs of types PTX lets one register stand for without a conversion: integers of the
/// same width, and a bit type with any type of its width (PTX ISA, "Operand Type
/// Information"). Floats and integers are not interchangeable.
pub trait Reinterpret<U> {}
macro_rules! reinterpret {
    ($($a:ident <-> $b:ident),* $(,)?) => {$(
        impl Reinterpret<$b> for $a {}
        impl Reinterpret<$a> for $b {}
    )*};
}
reinterpret!(
    U16 <-> S16, U16 <-> B16, S16 <-> B16, F16 <-> B16, Bf16 <-> B16,
    U32 <-> S32, U32 <-> B32, S32 <-> B32, F32 <-> B32,
    U64 <-> S64, U64 <-> B64, S64 <-> B64, F64 <-> B64,
);

/// Something an instruction of type `T` can read: a register of a compatible type or an
/// immediate of `T`'s Rust counterpart.
pub trait Src<T: RegType> {
    /// The operand as PTX text.
    fn operand(&self) -> String;
}

impl<T: RegType> Src<T> for Reg<T> {
    fn operand(&self) -> String {
        self.to_string()
    }
}

macro_rules! bits_src {
    ($bits:ident: $($ty:ident),*) => {$(
        impl Src<$bits> for Reg<$ty> {
            fn operand(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
bits_src!(B16: U16, S16, F16, Bf16);
bits_src!(B32: U32, S32, F32);
bits_src!(B64: U64, S64, F64);

/// Integers print in decimal when small and in hex otherwise, so masks and `prmt`
/// selectors read the way they are written.
fn fmt_unsigned(v: u64) -> String {
    if v < 256 {
        v.to_string()
    } else {
        format!("0x{v:X}")
    }
}

macro_rules! unsigned_imm {
    ($rust:ty => $($ty:ident),*) => {$(
        impl Src<$ty> for $rust {
            fn operand(&self) -> String {
                fmt_unsigned(u64::from(*self))
            }
        }
    )*};
}
unsigned_imm!(u16 => U16, B16);
unsigned_imm!(u32 => U32, B32);
unsigned_imm!(u64 => U64, B64);

macro_rules! signed_imm {
    ($rust:ty => $ty:ident) => {
        impl Src<$ty> for $rust {
            fn operand(&self) -> String {
                self.to_string()
            }
        }
    };
}
signed_imm!(i16 => S16);
signed_imm!(i32 => S32);
signed_imm!(i64 => S64);

/// Floats are written as their exact bit pattern (`0f3F800000`): a decimal literal would
/// round through PTX's parser.
impl Src<F32> for f32 {
    fn operand(&self) -> String {
        format!("0f{:08X}", self.to_bits())
    }
}
impl Src<F64> for f64 {
    fn operand(&self) -> String {
        format!("0d{:016X}", self.to_bits())
    }
}

/// A predicate, possibly negated: the guard of a branch or of predicated execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cond {
    pub(crate) reg: Reg<Pred>,
    pub(crate) negated: bool,
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negated {
            write!(f, "!{}", self.reg)
        } else {
            write!(f, "{}", self.reg)
        }
    }
}

impl From<Reg<Pred>> for Cond {
    fn from(reg: Reg<Pred>) -> Self {
        Cond {
            reg,
            negated: false,
        }
    }
}

impl Not for Reg<Pred> {
    type Output = Cond;
    fn not(self) -> Cond {
        Cond {
            reg: self,
            negated: true,
        }
    }
}

impl Not for Cond {
    type Output = Cond;
    fn not(self) -> Cond {
        Cond {
            reg: self.reg,
            negated: !self.negated,
        }
    }
}

/// A memory address operand: a 64-bit (generic or global) or 32-bit (shared window)
/// register, or a named shared array, plus a constant byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addr {
    base: String,
    offset: i64,
}

impl Addr {
    /// The same address moved by `bytes`; offsets fold into the instruction for free.
    pub fn offset(mut self, bytes: i64) -> Self {
        self.offset += bytes;
        self
    }

    pub(crate) fn symbol(name: &str) -> Self {
        Addr {
            base: name.to_string(),
            offset: 0,
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            0 => write!(f, "[{}]", self.base),
            off => write!(f, "[{}+{off}]", self.base),
        }
    }
}

impl From<Reg<U64>> for Addr {
    fn from(r: Reg<U64>) -> Self {
        Addr {
            base: r.to_string(),
            offset: 0,
        }
    }
}

impl From<Reg<U32>> for Addr {
    fn from(r: Reg<U32>) -> Self {
        Addr {
            base: r.to_string(),
            offset: 0,
        }
    }
}

impl Reg<U64> {
    /// The address this register holds, `bytes` further on.
    pub fn at(self, bytes: i64) -> Addr {
        Addr::from(self).offset(bytes)
    }
}

impl Reg<U32> {
    /// The shared-window address this register holds, `bytes` further on.
    pub fn at(self, bytes: i64) -> Addr {
        Addr::from(self).offset(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_print_with_their_type_prefix() {
        assert_eq!(Reg::<U32>::new(3).to_string(), "%r3");
        assert_eq!(Reg::<F32>::new(0).to_string(), "%f0");
        assert_eq!(Reg::<U64>::new(7).to_string(), "%rd7");
        assert_eq!(Reg::<Pred>::new(1).to_string(), "%p1");
        assert_eq!(Reg::<S32>::new(2).cast::<U32>().to_string(), "%s2");
    }

    #[test]
    fn immediates_are_exact() {
        assert_eq!(Src::<F32>::operand(&1.0f32), "0f3F800000");
        assert_eq!(Src::<F32>::operand(&-0.0f32), "0f80000000");
        assert_eq!(Src::<F64>::operand(&1.0f64), "0d3FF0000000000000");
        assert_eq!(Src::<U32>::operand(&31u32), "31");
        assert_eq!(Src::<B32>::operand(&0x5410u32), "0x5410");
        assert_eq!(Src::<U32>::operand(&u32::MAX), "0xFFFFFFFF");
        assert_eq!(Src::<S32>::operand(&-4i32), "-4");
    }

    #[test]
    fn conditions_negate() {
        let p = Reg::<Pred>::new(2);
        assert_eq!(Cond::from(p).to_string(), "%p2");
        assert_eq!((!p).to_string(), "!%p2");
        assert_eq!((!!p).to_string(), "%p2");
    }

    #[test]
    fn addresses_fold_offsets() {
        let r = Reg::<U64>::new(4);
        assert_eq!(Addr::from(r).to_string(), "[%rd4]");
        assert_eq!(r.at(16).to_string(), "[%rd4+16]");
        assert_eq!(r.at(16).offset(-20).to_string(), "[%rd4+-4]");
        assert_eq!(Addr::symbol("smem").offset(8).to_string(), "[smem+8]");
    }
}
