//! Packed integer dot products: `dp4a` multiplies four byte pairs and accumulates in 32
//! bits in one instruction, the core of every quantized matrix-vector kernel.

use crate::kernel::Kernel;
use crate::reg::Src;
use crate::types::{B32, S32};
use crate::Reg;

/// Whether the packed bytes of a `dp4a` operand are signed (int8) or unsigned (uint8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bytes {
    /// int8 lanes (`.s32`).
    Signed,
    /// uint8 lanes (`.u32`).
    Unsigned,
}

impl Bytes {
    fn name(self) -> &'static str {
        match self {
            Bytes::Signed => "s32",
            Bytes::Unsigned => "u32",
        }
    }
}

impl Kernel {
    /// `d = c + sum(a.byte[i] * b.byte[i])` over four int8 pairs (`dp4a.s32.s32`): what
    /// ggml's `__dp4a` is. Quants in 0..15 or 0..63 are fine as signed bytes.
    pub fn dp4a(
        &self,
        d: Reg<S32>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        c: impl Src<S32>,
    ) -> Reg<S32> {
        self.dp4a_with(Bytes::Signed, Bytes::Signed, d, a, b, c)
    }

    /// `dp4a` with each operand's byte signedness chosen (`dp4a.u32.s32`). The result
    /// is an `s32` unless both sides are unsigned, which PTX still lets an `s32` register
    /// hold.
    pub fn dp4a_with(
        &self,
        a_bytes: Bytes,
        b_bytes: Bytes,
        d: Reg<S32>,
        a: impl Src<B32>,
        b: impl Src<B32>,
        c: impl Src<S32>,
    ) -> Reg<S32> {
        self.emit(format!(
            "dp4a.{}.{} {d}, {}, {}, {}",
            a_bytes.name(),
            b_bytes.name(),
            a.operand(),
            b.operand(),
            c.operand()
        ));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;
    use crate::types::U32;

    #[test]
    fn dp4a_forms() {
        let text = body(|k| {
            let (a, b) = (k.reg::<U32>(), k.reg::<U32>());
            let acc = k.reg::<S32>();
            k.dp4a(acc, a, b, acc);
            k.dp4a(acc, a, 0x01010101u32, 0i32);
            k.dp4a_with(Bytes::Unsigned, Bytes::Signed, acc, a, b, acc);
        });
        assert_eq!(
            text,
            [
                "dp4a.s32.s32 %s0, %r0, %r1, %s0;",
                "dp4a.s32.s32 %s0, %r0, 0x1010101, 0;",
                "dp4a.u32.s32 %s0, %r0, %r1, %s0;",
            ]
        );
    }
}
