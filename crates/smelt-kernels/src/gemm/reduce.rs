//! The split reduce: the kernel that sums a split-K launch's workspace of partial outputs
//! into the real output, in split order ([`reduce_kernel`], launched from `Args::reduce`),
//! and that sum itself ([`sum_splits`]), which the member GEMMs' reduces share. Kept apart
//! from the GEMM bodies: it is a kernel of its own, the one the split fix-up (`fixup.rs`)
//! replaces when the launch passes counters.

use smelt_ptx::{Kernel, Load, Reg, Store, F32, U32, U64};

use crate::ops::kernel_params;

/// Name of the split reduce kernel.
pub const REDUCE: &str = "gemm_reduce";
kernel_params! {
    /// Arguments of [`reduce_kernel`].
    ReduceArgs, ReduceRegs {
        part: Ptr,
        y: Ptr,
        n: U32,
        splits: U32,
    }
}
/// Threads per block of [`reduce_kernel`].
pub const REDUCE_THREADS: u32 = 256;

/// `y[i] = sum_z part[z][i]` for `i < n`, `z = 0..splits` in order (a fixed summation
/// order, so the result is the same for any batch). Parameters [`ReduceArgs`].
pub fn reduce_kernel(k: &Kernel) {
    let ReduceRegs { part, y, n, splits } = ReduceRegs::declare(k);
    let i = k.global_id_x();
    k.grid_dep_wait();
    k.exit_if(k.ge(i, n));
    let sum = sum_splits(k, part, i, n, splits);
    k.st(Store::GLOBAL, k.elem_addr(y, i, 4), sum);
}

/// `sum_z part[z][i]` over `z = 0..splits` in order, slices of `n` floats: the split
/// reduces' sum ([`reduce_kernel`], [`members::reduce_kernel`]).
///
/// [`members::reduce_kernel`]: super::members::reduce_kernel
pub(crate) fn sum_splits(
    k: &Kernel,
    part: Reg<U64>,
    i: Reg<U32>,
    n: Reg<U32>,
    splits: Reg<U32>,
) -> Reg<F32> {
    let at = k.elem_addr(part, i, 4);
    let stride = k.mul_wide(k.reg::<U64>(), n, 4u32);
    let sum = k.ld(Load::GLOBAL, k.reg::<F32>(), at);
    k.for_count(k.sub(k.reg(), splits, 1u32), |k, _| {
        k.add(at, at, stride);
        let v = k.ld(Load::GLOBAL, k.reg::<F32>(), at);
        k.add(sum, sum, v);
    });
    sum
}
