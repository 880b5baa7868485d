//! Warp-level data exchange: `shfl.sync` and the butterfly reductions built on it.

use crate::kernel::Kernel;
use crate::reg::{Cond, Src};
use crate::types::{Arith, Pred, Word, U32};
use crate::Reg;

/// Every lane of a full warp: the member mask of warp-wide `shfl.sync`.
pub const FULL_WARP: u32 = 0xFFFF_FFFF;

/// How `shfl.sync` picks the source lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shfl {
    /// From lane `lane ^ b`: butterfly, every lane ends with the full reduction.
    Bfly,
    /// From lane `lane + b` (lanes past 31 keep their own value).
    Down,
    /// From lane `lane - b` (lanes below 0 keep their own value).
    Up,
    /// From lane `b`: broadcast.
    Idx,
}

impl Shfl {
    fn name(self) -> &'static str {
        match self {
            Shfl::Bfly => "bfly",
            Shfl::Down => "down",
            Shfl::Up => "up",
            Shfl::Idx => "idx",
        }
    }

    /// The `c` operand for a whole 32-lane warp: the clamp lane (31) for down, bfly and
    /// idx, 0 for up.
    fn clamp(self) -> u32 {
        match self {
            Shfl::Up => 0,
            _ => 0x1F,
        }
    }
}

/// A memory barrier's scope (`membar.cta`, `.gl`, `.sys`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The block.
    Cta,
    /// The whole GPU: what a kernel that hands results between blocks needs.
    Gpu,
    /// The GPU and the host.
    Sys,
}

impl Kernel {
    /// A bit per lane of `mask`: set where `p` holds (`vote.sync.ballot.b32`).
    pub fn ballot(&self, d: Reg<U32>, p: impl Into<Cond>, mask: u32) -> Reg<U32> {
        self.emit(format!(
            "vote.sync.ballot.b32 {d}, {}, {}",
            p.into(),
            Src::<U32>::operand(&mask)
        ));
        d
    }

    /// `d` = whether `p` holds in any lane of `mask` (`vote.sync.any.pred`).
    pub fn vote_any(&self, d: Reg<Pred>, p: impl Into<Cond>, mask: u32) -> Reg<Pred> {
        self.emit(format!(
            "vote.sync.any.pred {d}, {}, {}",
            p.into(),
            Src::<U32>::operand(&mask)
        ));
        d
    }

    /// `d` = whether `p` holds in every lane of `mask` (`vote.sync.all.pred`).
    pub fn vote_all(&self, d: Reg<Pred>, p: impl Into<Cond>, mask: u32) -> Reg<Pred> {
        self.emit(format!(
            "vote.sync.all.pred {d}, {}, {}",
            p.into(),
            Src::<U32>::operand(&mask)
        ));
        d
    }

    /// The lanes executing this instruction together (`activemask.b32`).
    pub fn activemask(&self, d: Reg<U32>) -> Reg<U32> {
        self.emit(format!("activemask.b32 {d}"));
        d
    }

    /// Orders this thread's memory accesses as seen by others in `scope` (`membar`).
    pub fn membar(&self, scope: Scope) {
        self.emit(match scope {
            Scope::Cta => "membar.cta",
            Scope::Gpu => "membar.gl",
            Scope::Sys => "membar.sys",
        });
    }

    /// `d = a` of another lane (`shfl.sync.bfly.b32 d, a, b, 0x1f, mask`) over the whole
    /// warp; every lane in `mask` must execute it.
    pub fn shfl_sync<T: Word>(
        &self,
        mode: Shfl,
        d: Reg<T>,
        a: Reg<T>,
        b: impl Src<U32>,
        mask: u32,
    ) -> Reg<T> {
        self.emit(format!(
            "shfl.sync.{}.b32 {d}, {a}, {}, {}, {}",
            mode.name(),
            b.operand(),
            Src::<U32>::operand(&mode.clamp()),
            Src::<U32>::operand(&mask)
        ));
        d
    }

    /// Reduces `v` over the full warp with a butterfly, `combine(k, acc, other)` updating
    /// `acc` in place; every lane ends with the result. The combination order is fixed, so
    /// the float result is the same on every run.
    pub fn warp_reduce<T: Word>(
        &self,
        v: Reg<T>,
        combine: impl FnMut(&Kernel, Reg<T>, Reg<T>),
    ) -> Reg<T> {
        self.group_reduce(v, 32, combine)
    }

    /// [`Kernel::warp_reduce`] within each group of `width` consecutive lanes (a power of
    /// two, at most 32): the butterfly's offsets `width / 2 .. 1` only, so each group
    /// ends with its own result, combined in the order the full warp's last steps use.
    /// Every lane of the warp must execute it.
    pub fn group_reduce<T: Word>(
        &self,
        v: Reg<T>,
        width: u32,
        mut combine: impl FnMut(&Kernel, Reg<T>, Reg<T>),
    ) -> Reg<T> {
        assert!(
            width.is_power_of_two() && width <= 32,
            "lane group of {width}"
        );
        let acc = self.copy(v);
        let mut offset = width / 2;
        while offset > 0 {
            let other = self.reg::<T>();
            self.shfl_sync(Shfl::Bfly, other, acc, offset, FULL_WARP);
            combine(self, acc, other);
            offset /= 2;
        }
        acc
    }

    /// The sum of `v` over the warp, in every lane (`add.rn` for floats).
    pub fn warp_sum<T: Word + Arith>(&self, v: Reg<T>) -> Reg<T> {
        self.group_sum(v, 32)
    }

    /// The sum of `v` over each group of `width` lanes ([`Kernel::group_reduce`]).
    pub fn group_sum<T: Word + Arith>(&self, v: Reg<T>, width: u32) -> Reg<T> {
        self.group_reduce(v, width, |k, acc, other| {
            k.add(acc, acc, other);
        })
    }

    /// The maximum of `v` over the warp, in every lane.
    pub fn warp_max<T: Word + Arith>(&self, v: Reg<T>) -> Reg<T> {
        self.warp_reduce(v, |k, acc, other| {
            k.max(acc, acc, other);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::body;
    use crate::types::{F32, S32};

    #[test]
    fn shuffles() {
        let text = body(|k| {
            let (a, d) = (k.reg::<F32>(), k.reg::<F32>());
            k.shfl_sync(Shfl::Bfly, d, a, 16u32, FULL_WARP);
            k.shfl_sync(Shfl::Down, d, a, 1u32, FULL_WARP);
            k.shfl_sync(Shfl::Up, d, a, 1u32, FULL_WARP);
            let lane = k.reg::<U32>();
            k.shfl_sync(Shfl::Idx, d, a, lane, 0x0000_FFFF);
        });
        assert_eq!(
            text,
            [
                "shfl.sync.bfly.b32 %f1, %f0, 16, 31, 0xFFFFFFFF;",
                "shfl.sync.down.b32 %f1, %f0, 1, 31, 0xFFFFFFFF;",
                "shfl.sync.up.b32 %f1, %f0, 1, 0, 0xFFFFFFFF;",
                "shfl.sync.idx.b32 %f1, %f0, %r0, 31, 0xFFFF;",
            ]
        );
    }

    #[test]
    fn warp_sum_is_a_butterfly_of_rounded_adds() {
        let text = body(|k| {
            let v = k.reg::<F32>();
            k.warp_sum(v);
        });
        let mut want = vec!["mov.f32 %f1, %f0;".to_string()];
        for (i, off) in [16, 8, 4, 2, 1].iter().enumerate() {
            let o = i + 2;
            want.push(format!(
                "shfl.sync.bfly.b32 %f{o}, %f1, {off}, 31, 0xFFFFFFFF;"
            ));
            want.push(format!("add.rn.f32 %f1, %f1, %f{o};"));
        }
        assert_eq!(text, want);
    }

    #[test]
    fn votes_and_fences() {
        let text = body(|k| {
            let p = k.reg::<Pred>();
            let d = k.reg::<U32>();
            k.ballot(d, p, FULL_WARP);
            k.vote_any(p, !p, FULL_WARP);
            k.vote_all(p, p, 0xFFu32);
            k.activemask(d);
            k.membar(Scope::Cta);
            k.membar(Scope::Gpu);
            k.membar(Scope::Sys);
        });
        assert_eq!(
            text,
            [
                "vote.sync.ballot.b32 %r0, %p0, 0xFFFFFFFF;",
                "vote.sync.any.pred %p0, !%p0, 0xFFFFFFFF;",
                "vote.sync.all.pred %p0, %p0, 255;",
                "activemask.b32 %r0;",
                "membar.cta;",
                "membar.gl;",
                "membar.sys;",
            ]
        );
    }

    #[test]
    fn warp_max_on_integers() {
        let text = body(|k| {
            let v = k.reg::<S32>();
            k.warp_max(v);
        });
        assert_eq!(text.len(), 11);
        assert_eq!(text[2], "max.s32 %s1, %s1, %s2;");
    }
}
