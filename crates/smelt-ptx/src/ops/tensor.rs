//! Asynchronous copies and warp-wide matrix instructions: the building blocks of tensor-core
//! GEMM for prefill. Fragments are arrays of registers in the layouts the PTX ISA documents
//! for each shape (`mma.sync.m16n8k16`: A is 4 x `.b32` of packed halves per thread, B 2,
//! C and D 4 floats).

use crate::kernel::Kernel;
use crate::reg::Addr;
use crate::types::{RegType, B32, F32, S32};
use crate::Reg;

/// Which caches an asynchronous copy fills: `.ca` L1 and L2, `.cg` L2 only (16-byte
/// copies only), the usual choice for GEMM tiles read once per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpAsyncCache {
    /// L1 and L2 (`.ca`).
    Ca,
    /// L2 only (`.cg`).
    Cg,
}

/// The input types of a float `mma.sync`: both operands f16 or both bf16, accumulating in
/// f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaFloat {
    /// IEEE half inputs.
    F16,
    /// bfloat16 inputs.
    Bf16,
}

fn list<T: RegType>(regs: &[Reg<T>]) -> String {
    let names: Vec<String> = regs.iter().map(|r| r.to_string()).collect();
    format!("{{{}}}", names.join(", "))
}

impl Kernel {
    /// Starts copying `bytes` (4, 8 or 16) from global `src` to shared `dst` without
    /// holding registers (`cp.async`); complete with [`Kernel::cp_async_commit`] and
    /// [`Kernel::cp_async_wait`].
    pub fn cp_async(
        &self,
        cache: CpAsyncCache,
        dst: impl Into<Addr>,
        src: impl Into<Addr>,
        bytes: u32,
    ) {
        if !matches!(bytes, 4 | 8 | 16) || (cache == CpAsyncCache::Cg && bytes != 16) {
            self.fail(format!(
                "cp.async copies 4, 8 or 16 bytes (16 only with .cg), not {bytes}"
            ));
        }
        let cache = match cache {
            CpAsyncCache::Ca => "ca",
            CpAsyncCache::Cg => "cg",
        };
        self.emit(format!(
            "cp.async.{cache}.shared.global {}, {}, {bytes}",
            dst.into(),
            src.into()
        ));
    }

    /// Closes the current group of `cp.async` copies (`cp.async.commit_group`).
    pub fn cp_async_commit(&self) {
        self.emit("cp.async.commit_group");
    }

    /// Waits until at most `pending` committed groups are still in flight
    /// (`cp.async.wait_group`); 0 waits for all. A `bar.sync` must follow before other
    /// threads read the data.
    pub fn cp_async_wait(&self, pending: u32) {
        self.emit(format!("cp.async.wait_group {pending}"));
    }

    /// Loads `N` (1, 2 or 4) 8x8 matrices of 16-bit elements from shared memory into the
    /// warp's `mma` fragment layout (`ldmatrix.sync.aligned.m8n8.x4.shared.b16`), each
    /// lane giving one row address; `trans` transposes each matrix.
    pub fn ldmatrix<const N: usize>(&self, d: [Reg<B32>; N], addr: impl Into<Addr>, trans: bool) {
        if !matches!(N, 1 | 2 | 4) {
            self.fail(format!("ldmatrix loads 1, 2 or 4 matrices, not {N}"));
        }
        let trans = if trans { ".trans" } else { "" };
        self.emit(format!(
            "ldmatrix.sync.aligned.m8n8.x{N}{trans}.shared.b16 {}, {}",
            list(&d),
            addr.into()
        ));
    }

    /// `D = A * B + C` for a 16x8x16 tile on the tensor cores, f16 or bf16 inputs and f32
    /// accumulation (`mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`).
    pub fn mma_m16n8k16(
        &self,
        inputs: MmaFloat,
        d: [Reg<F32>; 4],
        a: [Reg<B32>; 4],
        b: [Reg<B32>; 2],
        c: [Reg<F32>; 4],
    ) {
        let t = match inputs {
            MmaFloat::F16 => "f16",
            MmaFloat::Bf16 => "bf16",
        };
        self.emit(format!(
            "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {}, {}, {}, {}",
            list(&d),
            list(&a),
            list(&b),
            list(&c)
        ));
    }

    /// `D = A * B + C` for a 16x8x32 int8 tile, s32 accumulation
    /// (`mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`): quantized prefill.
    pub fn mma_m16n8k32_s8(
        &self,
        d: [Reg<S32>; 4],
        a: [Reg<B32>; 4],
        b: [Reg<B32>; 2],
        c: [Reg<S32>; 4],
    ) {
        self.emit(format!(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {}, {}, {}, {}",
            list(&d),
            list(&a),
            list(&b),
            list(&c)
        ));
    }
}

impl Kernel {
    /// `D = A * B + C` for a 16x8x16 int8 tile, s32 accumulation
    /// (`mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32`): A is 2 x `.b32` per thread
    /// (rows `g` and `g + 8`, bytes `4t..4t+4`), B one (`k = 4t..4t+4`, column `g`), for
    /// weight formats whose scales cover 16 weights.
    pub fn mma_m16n8k16_s8(
        &self,
        d: [Reg<S32>; 4],
        a: [Reg<B32>; 2],
        b: Reg<B32>,
        c: [Reg<S32>; 4],
    ) {
        self.emit(format!(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {}, {}, {{{b}}}, {}",
            list(&d),
            list(&a),
            list(&c)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PtxError;
    use crate::module::{Module, Target};
    use crate::testing::body;
    use crate::types::{U32, U64};

    #[test]
    fn async_copies() {
        let text = body(|k| {
            let (s, g) = (k.reg::<U32>(), k.reg::<U64>());
            k.cp_async(CpAsyncCache::Cg, s, g.at(16), 16);
            k.cp_async(CpAsyncCache::Ca, s.at(4), g, 4);
            k.cp_async_commit();
            k.cp_async_wait(1);
        });
        assert_eq!(
            text,
            [
                "cp.async.cg.shared.global [%r0], [%rd0+16], 16;",
                "cp.async.ca.shared.global [%r0+4], [%rd0], 4;",
                "cp.async.commit_group;",
                "cp.async.wait_group 1;",
            ]
        );
    }

    #[test]
    fn matrix_fragments() {
        let text = body(|k| {
            let s = k.reg::<U32>();
            let a = k.regs::<B32, 4>();
            let b = k.regs::<B32, 2>();
            k.ldmatrix(a, s, false);
            k.ldmatrix(b, s.at(512), true);
            let acc = k.regs::<F32, 4>();
            k.mma_m16n8k16(MmaFloat::F16, acc, a, b, acc);
            k.mma_m16n8k16(MmaFloat::Bf16, acc, a, b, acc);
            let iacc = k.regs::<S32, 4>();
            k.mma_m16n8k32_s8(iacc, a, b, iacc);
            k.mma_m16n8k16_s8(iacc, [a[0], a[1]], b[0], iacc);
        });
        assert_eq!(
            text,
            [
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%b0, %b1, %b2, %b3}, [%r0];",
                "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%b4, %b5}, [%r0+512];",
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, \
                 {%b0, %b1, %b2, %b3}, {%b4, %b5}, {%f0, %f1, %f2, %f3};",
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f0, %f1, %f2, %f3}, \
                 {%b0, %b1, %b2, %b3}, {%b4, %b5}, {%f0, %f1, %f2, %f3};",
                "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%s0, %s1, %s2, %s3}, \
                 {%b0, %b1, %b2, %b3}, {%b4, %b5}, {%s0, %s1, %s2, %s3};",
                "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%s0, %s1, %s2, %s3}, \
                 {%b0, %b1}, {%b4}, {%s0, %s1, %s2, %s3};",
            ]
        );
    }

    #[test]
    fn bad_sizes_are_refused() {
        let mut m = Module::new(Target::Sm80);
        let r = m.kernel("k", |k| {
            k.cp_async(CpAsyncCache::Cg, k.reg::<U32>(), k.reg::<U64>(), 8)
        });
        assert!(matches!(r, Err(PtxError::Invalid { .. })), "{r:?}");
        let r = m.kernel("k", |k| {
            k.ldmatrix(k.regs::<B32, 3>(), k.reg::<U32>(), false)
        });
        assert!(matches!(r, Err(PtxError::Invalid { .. })), "{r:?}");
    }
}
