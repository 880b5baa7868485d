//! Control flow: branches, structured `if`, counted loops, early exit, barriers. The
//! structured helpers emit the label/branch pattern so kernels never juggle labels by hand.

use crate::kernel::{Kernel, Label};
use crate::reg::{Cond, Src};
use crate::types::{Pred, U32};
use crate::Reg;

use super::arith::Cmp;

impl Kernel {
    /// Jumps to `label` (`bra.uni`: every thread of the warp takes it together).
    pub fn bra(&self, label: Label) {
        self.target_label(label);
        if self.in_guard() {
            self.nested_guard(&format!("bra.uni {label}"));
            return;
        }
        self.emit(format!("bra.uni {label}"));
    }

    /// Jumps to `label` where `cond` holds (`@p bra`); threads may diverge.
    pub fn bra_if(&self, cond: impl Into<Cond>, label: Label) {
        self.target_label(label);
        self.emit_guarded(cond.into(), &format!("bra {label}"));
    }

    /// Ends the thread (`exit`).
    pub fn exit(&self) {
        self.emit("exit");
    }

    /// Ends the threads where `cond` holds: the bounds check at the top of a kernel.
    /// Threads that exit no longer take part in `bar.sync` or `shfl.sync`, so exit only
    /// whole warps before those, or guard the work instead.
    pub fn exit_if(&self, cond: impl Into<Cond>) {
        self.emit_guarded(cond.into(), "exit");
    }

    /// Runs `then` only where `cond` holds (a branch around it).
    pub fn if_(&self, cond: impl Into<Cond>, then: impl FnOnce(&Kernel)) {
        let skip = self.label();
        self.bra_if(!cond.into(), skip);
        then(self);
        self.place(skip);
    }

    /// Runs `then` where `cond` holds and `otherwise` elsewhere.
    pub fn if_else(
        &self,
        cond: impl Into<Cond>,
        then: impl FnOnce(&Kernel),
        otherwise: impl FnOnce(&Kernel),
    ) {
        let (else_, end) = (self.label(), self.label());
        self.bra_if(!cond.into(), else_);
        then(self);
        self.bra(end);
        self.place(else_);
        otherwise(self);
        self.place(end);
    }

    /// A runtime loop `for i in (start..end).step_by(step)` over `u32`, zero trips when
    /// `start >= end`: the grid-stride loop (`start = global thread id`, `step = grid
    /// size`) and the lane-stride loop (`start = lane`, `step = 32`). The body gets `i`,
    /// which it must not write. For loops with a trip count known at generation time,
    /// use a Rust loop: it unrolls.
    pub fn stride_loop(
        &self,
        start: impl Src<U32>,
        end: impl Src<U32>,
        step: impl Src<U32>,
        body: impl FnOnce(&Kernel, Reg<U32>),
    ) {
        let (top, done) = (self.label(), self.label());
        let i = self.reg::<U32>();
        self.mov(i, start);
        let end = end.operand();
        let p = self.reg::<Pred>();
        self.emit(format!("setp.ge.u32 {p}, {i}, {end}"));
        self.bra_if(p, done);
        self.place(top);
        body(self, i);
        self.add(i, i, step);
        self.emit(format!("setp.lt.u32 {p}, {i}, {end}"));
        self.bra_if(p, top);
        self.place(done);
    }

    /// A runtime loop that runs `body` `count` times with `i = 0, 1, ...`.
    pub fn for_count(&self, count: impl Src<U32>, body: impl FnOnce(&Kernel, Reg<U32>)) {
        self.stride_loop(0u32, count, 1u32, body);
    }

    /// Waits for every thread of the block at barrier 0 (`bar.sync 0`), after which shared
    /// memory written before it is visible.
    pub fn bar_sync(&self) {
        self.emit("bar.sync 0");
    }

    /// Waits at barrier `id` for `threads` threads (a multiple of 32): named barriers let
    /// groups of warps synchronise without the whole block.
    pub fn bar_sync_count(&self, id: u32, threads: u32) {
        if id > 15 || threads % 32 != 0 {
            self.fail(format!(
                "bar.sync {id}, {threads}: barrier ids are 0-15 and thread counts multiples of 32"
            ));
        }
        self.emit(format!("bar.sync {id}, {threads}"));
    }

    /// A new predicate `a < b` (unsigned), the usual bounds test.
    pub fn lt(&self, a: Reg<U32>, b: impl Src<U32>) -> Reg<Pred> {
        self.cmp(Cmp::Lt, a, b)
    }

    /// A new predicate `a >= b` (unsigned), the usual out-of-bounds test.
    pub fn ge(&self, a: Reg<U32>, b: impl Src<U32>) -> Reg<Pred> {
        self.cmp(Cmp::Ge, a, b)
    }

    /// A new predicate `a == b`.
    pub fn eq(&self, a: Reg<U32>, b: impl Src<U32>) -> Reg<Pred> {
        self.cmp(Cmp::Eq, a, b)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::PtxError;
    use crate::module::{Module, Target};
    use crate::testing::body;
    use crate::types::{F32, U32};
    use crate::{Load, Store};

    #[test]
    fn branches_and_labels() {
        let text = body(|k| {
            let l = k.label();
            let n = k.reg::<U32>();
            let p = k.ge(n, 10u32);
            k.bra_if(p, l);
            k.bra_if(!p, l);
            k.bra(l);
            k.place(l);
            k.exit_if(k.reg::<crate::types::Pred>());
            k.exit();
            k.bar_sync();
            k.bar_sync_count(1, 128);
        });
        assert_eq!(
            text,
            [
                "setp.ge.u32 %p0, %r0, 10;",
                "@%p0 bra $L__0;",
                "@!%p0 bra $L__0;",
                "bra.uni $L__0;",
                "$L__0:",
                "@%p1 exit;",
                "exit;",
                "bar.sync 0;",
                "bar.sync 1, 128;",
            ]
        );
    }

    #[test]
    fn structured_if_and_else() {
        let text = body(|k| {
            let n = k.reg::<U32>();
            let p = k.eq(n, 0u32);
            k.if_(p, |k| {
                k.add(n, n, 1u32);
            });
            k.if_else(
                !p,
                |k| {
                    k.add(n, n, 2u32);
                },
                |k| {
                    k.add(n, n, 3u32);
                },
            );
        });
        assert_eq!(
            text,
            [
                "setp.eq.u32 %p0, %r0, 0;",
                "@!%p0 bra $L__0;",
                "add.u32 %r0, %r0, 1;",
                "$L__0:",
                "@%p0 bra $L__1;",
                "add.u32 %r0, %r0, 2;",
                "bra.uni $L__2;",
                "$L__1:",
                "add.u32 %r0, %r0, 3;",
                "$L__2:",
            ]
        );
    }

    #[test]
    fn stride_loop_skips_empty_ranges_and_tests_at_the_bottom() {
        let text = body(|k| {
            let (start, end) = (k.reg::<U32>(), k.reg::<U32>());
            let acc = k.reg::<F32>();
            k.stride_loop(start, end, 32u32, |k, i| {
                k.add(k.reg::<U32>(), i, 1u32);
                k.add(acc, acc, 1.0f32);
            });
        });
        assert_eq!(
            text,
            [
                "mov.u32 %r2, %r0;",
                "setp.ge.u32 %p0, %r2, %r1;",
                "@%p0 bra $L__1;",
                "$L__0:",
                "add.u32 %r3, %r2, 1;",
                "add.rn.f32 %f0, %f0, 0f3F800000;",
                "add.u32 %r2, %r2, 32;",
                "setp.lt.u32 %p0, %r2, %r1;",
                "@%p0 bra $L__0;",
                "$L__1:",
            ]
        );
    }

    #[test]
    fn predicated_blocks_prefix_every_instruction() {
        let text = body(|k| {
            let p = k.reg::<crate::types::Pred>();
            let a = k.reg::<crate::types::U64>();
            let x = k.reg::<F32>();
            k.guarded(!p, |k| {
                k.ld(Load::GLOBAL, x, a);
                k.st(Store::GLOBAL, a.at(4), x);
            });
        });
        assert_eq!(
            text,
            [
                "@!%p0 ld.global.f32 %f0, [%rd0];",
                "@!%p0 st.global.f32 [%rd0+4], %f0;"
            ]
        );
    }

    #[test]
    fn label_misuse_is_reported() {
        let mut m = Module::new(Target::Sm80);
        let r = m.kernel("unplaced", |k| {
            let l = k.label();
            k.bra(l);
        });
        assert!(matches!(r, Err(PtxError::LabelNotPlaced { .. })), "{r:?}");
        let r = m.kernel("twice", |k| {
            let l = k.label();
            k.place(l);
            k.place(l);
        });
        assert!(matches!(r, Err(PtxError::LabelPlacedTwice { .. })), "{r:?}");
        let r = m.kernel("nested", |k| {
            let p = k.reg::<crate::types::Pred>();
            k.guarded(p, |k| k.exit_if(p));
        });
        assert!(matches!(r, Err(PtxError::NestedGuard { .. })), "{r:?}");
    }
}
