//! Special registers: where a thread is in the grid.

use std::fmt;

use crate::kernel::Kernel;
use crate::types::U32;
use crate::Reg;

/// A grid or block dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// `.x`, the fastest-varying.
    X,
    /// `.y`.
    Y,
    /// `.z`.
    Z,
}

/// A read-only special register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// Thread index in the block (`%tid`).
    Tid(Dim),
    /// Block size (`%ntid`).
    Ntid(Dim),
    /// Block index in the grid (`%ctaid`).
    Ctaid(Dim),
    /// Grid size in blocks (`%nctaid`).
    Nctaid(Dim),
    /// Lane in the warp, 0-31 (`%laneid`).
    LaneId,
    /// Warp slot on the SM (`%warpid`); not the warp's index in the block, which is
    /// `tid.x / 32`.
    WarpId,
    /// SM the thread runs on (`%smid`).
    SmId,
}

impl fmt::Display for Special {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dim = |d: &Dim| match d {
            Dim::X => "x",
            Dim::Y => "y",
            Dim::Z => "z",
        };
        match self {
            Special::Tid(d) => write!(f, "%tid.{}", dim(d)),
            Special::Ntid(d) => write!(f, "%ntid.{}", dim(d)),
            Special::Ctaid(d) => write!(f, "%ctaid.{}", dim(d)),
            Special::Nctaid(d) => write!(f, "%nctaid.{}", dim(d)),
            Special::LaneId => f.write_str("%laneid"),
            Special::WarpId => f.write_str("%warpid"),
            Special::SmId => f.write_str("%smid"),
        }
    }
}

impl Kernel {
    /// A new register holding special register `s`.
    pub fn special(&self, s: Special) -> Reg<U32> {
        let d = self.reg::<U32>();
        self.emit(format!("mov.u32 {d}, {s}"));
        d
    }

    /// `%tid.x`.
    pub fn tid_x(&self) -> Reg<U32> {
        self.special(Special::Tid(Dim::X))
    }

    /// `%tid.y`.
    pub fn tid_y(&self) -> Reg<U32> {
        self.special(Special::Tid(Dim::Y))
    }

    /// `%ntid.x`.
    pub fn ntid_x(&self) -> Reg<U32> {
        self.special(Special::Ntid(Dim::X))
    }

    /// `%ntid.y`.
    pub fn ntid_y(&self) -> Reg<U32> {
        self.special(Special::Ntid(Dim::Y))
    }

    /// `%ctaid.x`.
    pub fn ctaid_x(&self) -> Reg<U32> {
        self.special(Special::Ctaid(Dim::X))
    }

    /// `%ctaid.y`.
    pub fn ctaid_y(&self) -> Reg<U32> {
        self.special(Special::Ctaid(Dim::Y))
    }

    /// `%nctaid.x`.
    pub fn nctaid_x(&self) -> Reg<U32> {
        self.special(Special::Nctaid(Dim::X))
    }

    /// `%laneid`.
    pub fn lane(&self) -> Reg<U32> {
        self.special(Special::LaneId)
    }

    /// `ctaid.x * ntid.x + tid.x`: this thread's index in a 1-D grid.
    pub fn global_id_x(&self) -> Reg<U32> {
        let (block, size, thread) = (self.ctaid_x(), self.ntid_x(), self.tid_x());
        self.mad(self.reg(), block, size, thread)
    }

    /// `nctaid.x * ntid.x`: the number of threads in a 1-D grid, a grid-stride loop's step.
    pub fn grid_size_x(&self) -> Reg<U32> {
        let (blocks, size) = (self.nctaid_x(), self.ntid_x());
        self.mul(self.reg(), blocks, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;

    #[test]
    fn special_registers() {
        let text = body(|k| {
            k.tid_x();
            k.tid_y();
            k.ntid_x();
            k.ctaid_x();
            k.ctaid_y();
            k.nctaid_x();
            k.lane();
            k.special(Special::Tid(Dim::Z));
            k.special(Special::WarpId);
            k.special(Special::SmId);
        });
        assert_eq!(
            text,
            [
                "mov.u32 %r0, %tid.x;",
                "mov.u32 %r1, %tid.y;",
                "mov.u32 %r2, %ntid.x;",
                "mov.u32 %r3, %ctaid.x;",
                "mov.u32 %r4, %ctaid.y;",
                "mov.u32 %r5, %nctaid.x;",
                "mov.u32 %r6, %laneid;",
                "mov.u32 %r7, %tid.z;",
                "mov.u32 %r8, %warpid;",
                "mov.u32 %r9, %smid;",
            ]
        );
    }

    #[test]
    fn grid_helpers() {
        let text = body(|k| {
            k.global_id_x();
            k.grid_size_x();
        });
        assert_eq!(
            text,
            [
                "mov.u32 %r0, %ctaid.x;",
                "mov.u32 %r1, %ntid.x;",
                "mov.u32 %r2, %tid.x;",
                "mad.lo.u32 %r3, %r0, %r1, %r2;",
                "mov.u32 %r4, %nctaid.x;",
                "mov.u32 %r5, %ntid.x;",
                "mul.lo.u32 %r6, %r4, %r5;",
            ]
        );
    }
}
