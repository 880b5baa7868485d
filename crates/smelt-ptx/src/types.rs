//! PTX fundamental types as Rust marker types, so an operand of the wrong type is a Rust
//! compile error instead of a ptxas error found later (or never, on a machine without one).
//!
//! The traits mirror PTX's own rules: a register has one declared type ([`RegType`]); an
//! instruction of type `.bN` accepts any N-bit register (see [`crate::Src`]); arithmetic,
//! comparisons and conversions exist only for the types PTX defines them for.

mod sealed {
    pub trait Sealed {}
}

/// A PTX type that registers can be declared with.
pub trait RegType: sealed::Sealed + Copy + Default + std::fmt::Debug + 'static {
    /// The type's suffix in an instruction, without the dot (`u32`).
    const NAME: &'static str;
    /// Register name prefix; one declared register set per type.
    const PREFIX: &'static str;
    /// Width in bits (predicates count as 1).
    const BITS: u32;
    /// Index of this type's register counter inside a kernel.
    #[doc(hidden)]
    const CLASS: usize;
    /// The type named in `ld`/`st`/`mov` and in the register declaration: those have no
    /// `.f16`/`.bf16` form, so half types travel as `.b16` (which PTX lets any 16-bit
    /// instruction read).
    const MOVE_NAME: &'static str = Self::NAME;
    /// The untyped bit type of the same width (`b32` for `u32`), used by bitwise instructions.
    type Bits: RegType;
}

/// Number of register classes, the length of a kernel's counter array.
pub(crate) const CLASSES: usize = 14;

/// Declared type and name prefix of each register class, indexed by [`RegType::CLASS`].
pub(crate) const CLASS_DECLS: [(&str, &str); CLASSES] = [
    (Pred::MOVE_NAME, Pred::PREFIX),
    (B16::MOVE_NAME, B16::PREFIX),
    (U16::MOVE_NAME, U16::PREFIX),
    (S16::MOVE_NAME, S16::PREFIX),
    (F16::MOVE_NAME, F16::PREFIX),
    (B32::MOVE_NAME, B32::PREFIX),
    (U32::MOVE_NAME, U32::PREFIX),
    (S32::MOVE_NAME, S32::PREFIX),
    (F32::MOVE_NAME, F32::PREFIX),
    (B64::MOVE_NAME, B64::PREFIX),
    (U64::MOVE_NAME, U64::PREFIX),
    (S64::MOVE_NAME, S64::PREFIX),
    (F64::MOVE_NAME, F64::PREFIX),
    (Bf16::MOVE_NAME, Bf16::PREFIX),
];

macro_rules! reg_type {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $prefix:literal, $bits:literal, $class:literal, $b:ident $(, move = $mv:literal)?) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $ty;
        impl sealed::Sealed for $ty {}
        impl RegType for $ty {
            const NAME: &'static str = $name;
            const PREFIX: &'static str = $prefix;
            const BITS: u32 = $bits;
            const CLASS: usize = $class;
            $(const MOVE_NAME: &'static str = $mv;)?
            type Bits = $b;
        }
    };
}

reg_type!(
    /// A predicate (`.pred`): the result of `setp`, the guard of predicated execution.
    Pred, "pred", "%p", 1, 0, Pred
);
reg_type!(
    /// 16 untyped bits.
    B16, "b16", "%bh", 16, 1, B16
);
reg_type!(
    /// Unsigned 16-bit integer.
    U16, "u16", "%rh", 16, 2, B16
);
reg_type!(
    /// Signed 16-bit integer.
    S16, "s16", "%sh", 16, 3, B16
);
reg_type!(
    /// IEEE half precision; loaded, stored and moved as `.b16`.
    F16, "f16", "%h", 16, 4, B16, move = "b16"
);
reg_type!(
    /// 32 untyped bits: packed bytes, packed halves, bit patterns.
    B32, "b32", "%b", 32, 5, B32
);
reg_type!(
    /// Unsigned 32-bit integer: indices, counts, packed quants.
    U32, "u32", "%r", 32, 6, B32
);
reg_type!(
    /// Signed 32-bit integer: `dp4a` accumulators.
    S32, "s32", "%s", 32, 7, B32
);
reg_type!(
    /// IEEE single precision.
    F32, "f32", "%f", 32, 8, B32
);
reg_type!(
    /// 64 untyped bits.
    B64, "b64", "%bd", 64, 9, B64
);
reg_type!(
    /// Unsigned 64-bit integer: addresses.
    U64, "u64", "%rd", 64, 10, B64
);
reg_type!(
    /// Signed 64-bit integer.
    S64, "s64", "%sd", 64, 11, B64
);
reg_type!(
    /// IEEE double precision.
    F64, "f64", "%fd", 64, 12, B64
);
reg_type!(
    /// 16-bit bfloat, held in its own register set; PTX stores it as `.b16`.
    Bf16, "bf16", "%bf", 16, 13, B16, move = "b16"
);

/// Types that live in memory: everything but predicates, which have no memory form
/// (loads, stores, parameters, shared arrays, `selp`).
pub trait Data: RegType {}
impl Data for B16 {}
impl Data for U16 {}
impl Data for S16 {}
impl Data for F16 {}
impl Data for Bf16 {}
impl Data for B32 {}
impl Data for U32 {}
impl Data for S32 {}
impl Data for F32 {}
impl Data for B64 {}
impl Data for U64 {}
impl Data for S64 {}
impl Data for F64 {}

/// Integer types: `add`/`mul.lo`/`mad.lo`, shifts by sign, `bfe`.
pub trait Int: RegType {
    /// Whether the integer is signed (selects arithmetic or logical right shift).
    const SIGNED: bool;
}
impl Int for U16 {
    const SIGNED: bool = false;
}
impl Int for S16 {
    const SIGNED: bool = true;
}
impl Int for U32 {
    const SIGNED: bool = false;
}
impl Int for S32 {
    const SIGNED: bool = true;
}
impl Int for U64 {
    const SIGNED: bool = false;
}
impl Int for S64 {
    const SIGNED: bool = true;
}

/// Floating-point types with IEEE arithmetic that takes a rounding mode.
pub trait Float: RegType {}
impl Float for F16 {}
impl Float for F32 {}
impl Float for F64 {}

/// Types with `add`, `sub`, `mul`, `min`, `max`: integers and floats. Floats always carry an
/// explicit `.rn`, which is what keeps ptxas from contracting `mul` + `add` into an FMA and
/// so keeps bit-exact kernels bit-exact.
pub trait Arith: RegType {
    /// The rounding modifier float arithmetic carries (`.rn`), empty for integers.
    #[doc(hidden)]
    const ROUND: &'static str;
    /// The `mul` flavour: `.lo` keeps the low half for integers, `.rn` rounds floats.
    #[doc(hidden)]
    const MUL: &'static str;
}
macro_rules! arith {
    ($($ty:ident: $round:literal, $mul:literal;)*) => {$(
        impl Arith for $ty {
            const ROUND: &'static str = $round;
            const MUL: &'static str = $mul;
        }
    )*};
}
arith! {
    U16: "", ".lo"; S16: "", ".lo"; U32: "", ".lo"; S32: "", ".lo"; U64: "", ".lo"; S64: "", ".lo";
    F16: ".rn", ".rn"; F32: ".rn", ".rn"; F64: ".rn", ".rn";
}

/// Types that `neg` and `abs` accept: signed integers and floats.
pub trait Signed: Arith {}
impl Signed for S16 {}
impl Signed for S32 {}
impl Signed for S64 {}
impl Signed for F16 {}
impl Signed for F32 {}
impl Signed for F64 {}

/// Types `setp` compares: integers, floats and bit patterns (equality only for bits).
pub trait Compare: RegType {
    /// Whether only `eq`/`ne` apply (untyped bits have no order).
    #[doc(hidden)]
    const EQUALITY_ONLY: bool = false;
}
impl Compare for U16 {}
impl Compare for S16 {}
impl Compare for U32 {}
impl Compare for S32 {}
impl Compare for U64 {}
impl Compare for S64 {}
impl Compare for F16 {}
impl Compare for F32 {}
impl Compare for F64 {}
impl Compare for B16 {
    const EQUALITY_ONLY: bool = true;
}
impl Compare for B32 {
    const EQUALITY_ONLY: bool = true;
}
impl Compare for B64 {
    const EQUALITY_ONLY: bool = true;
}

/// Types shifts accept; `shr` is arithmetic on signed types and logical otherwise.
pub trait Shift: RegType {}
impl Shift for B16 {}
impl Shift for U16 {}
impl Shift for S16 {}
impl Shift for B32 {}
impl Shift for U32 {}
impl Shift for S32 {}
impl Shift for B64 {}
impl Shift for U64 {}
impl Shift for S64 {}

/// Integer types whose `mul.wide` doubles the width: `u32 x u32 -> u64`.
pub trait Widen: Int {
    /// The double-width result type.
    type Wide: Int;
}
impl Widen for U16 {
    type Wide = U32;
}
impl Widen for S16 {
    type Wide = S32;
}
impl Widen for U32 {
    type Wide = U64;
}
impl Widen for S32 {
    type Wide = S64;
}

/// 32-bit integer types `bfe` extracts from (`bfe.u32` zero-fills, `bfe.s32` sign-fills).
pub trait BitField: Int {}
impl BitField for U32 {}
impl BitField for S32 {}
impl BitField for U64 {}
impl BitField for S64 {}

/// Types `atom.add`/`red.add` take.
pub trait AtomAdd: RegType {}
impl AtomAdd for U32 {}
impl AtomAdd for S32 {}
impl AtomAdd for U64 {}
impl AtomAdd for F32 {}
impl AtomAdd for F64 {}

/// 32-bit types, the only ones `shfl.sync`, `prmt` and `lop3` move.
pub trait Word: RegType<Bits = B32> {}
impl<T: RegType<Bits = B32>> Word for T {}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: RegType>() {
        assert_eq!(
            CLASS_DECLS[T::CLASS],
            (T::MOVE_NAME, T::PREFIX),
            "{}",
            T::NAME
        );
    }

    #[test]
    fn class_table_matches_every_type() {
        check::<Pred>();
        check::<B16>();
        check::<U16>();
        check::<S16>();
        check::<F16>();
        check::<B32>();
        check::<U32>();
        check::<S32>();
        check::<F32>();
        check::<B64>();
        check::<U64>();
        check::<S64>();
        check::<F64>();
        check::<Bf16>();
    }
}
