//! A typed PTX builder: GPU kernels are Rust functions that emit PTX text, which the CUDA
//! driver compiles at load time. No CUDA C++, nvcc or NVRTC is involved anywhere.
//!
//! A kernel takes a [`Kernel`] and calls one method per instruction. Registers are typed
//! ([`Reg<U32>`], [`Reg<F32>`], [`Reg<Pred>`] ...), so feeding a float to an integer
//! instruction, or converting without the rounding mode PTX demands, does not compile.
//! Rust loops around calls unroll at generation time and Rust generics specialise a
//! kernel per type; runtime loops and branches come from [`Kernel::stride_loop`],
//! [`Kernel::if_`] and friends.
//!
//! ```
//! use smelt_ptx::{Load, Module, Store, Target, F32};
//!
//! let mut module = Module::new(Target::Sm90);
//! module.kernel("vector_add", |k| {
//!     let (a, b, c) = (k.param_ptr("a"), k.param_ptr("b"), k.param_ptr("c"));
//!     let n = k.param_u32("n");
//!     let i = k.global_id_x();
//!     k.exit_if(k.ge(i, n));
//!     let x = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(a, i, 4));
//!     let y = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(b, i, 4));
//!     let sum = k.add(k.reg(), x, y); // add.rn.f32: never contracted into an FMA
//!     k.st(Store::GLOBAL, k.elem_addr(c, i, 4), sum);
//! })?;
//! let ptx = module.to_ptx();
//! assert!(ptx.contains(".target sm_90"));
//! # Ok::<(), smelt_ptx::PtxError>(())
//! ```
//!
//! What the builder cannot express yet goes through [`Kernel::raw`].
//!
//! # What the types catch
//!
//! Each block below fails to compile, each for the reason its comment gives; the first
//! compiles, to show the rest fail for that reason and not a typo.
//!
//! ```
//! # use smelt_ptx::*;
//! # let mut m = Module::new(Target::Sm80);
//! m.kernel("k", |k| {
//!     let (f, u) = (k.reg::<F32>(), k.reg::<U32>());
//!     k.add(f, f, 1.0);
//!     k.cvt(f, u, FloatRound::Rn);
//! })?;
//! # Ok::<(), PtxError>(())
//! ```
//! ```compile_fail
//! # use smelt_ptx::*;
//! # let mut m = Module::new(Target::Sm80);
//! m.kernel("k", |k| {
//!     let (f, u) = (k.reg::<F32>(), k.reg::<U32>());
//!     k.add(f, f, u); // a u32 operand in a float add
//! });
//! ```
//! ```compile_fail
//! # use smelt_ptx::*;
//! # let mut m = Module::new(Target::Sm80);
//! m.kernel("k", |k| {
//!     let (f, u) = (k.reg::<F32>(), k.reg::<U32>());
//!     k.cvt(f, u, Exact); // int -> float needs a float rounding mode
//! });
//! ```
//! ```compile_fail
//! # use smelt_ptx::*;
//! # let mut m = Module::new(Target::Sm80);
//! m.kernel("k", |k| {
//!     let p = k.reg::<U64>();
//!     k.load::<Pred>(Load::GLOBAL, p); // predicates have no memory form
//! });
//! ```
//! ```compile_fail
//! # use smelt_ptx::*;
//! # let mut m = Module::new(Target::Sm80);
//! m.kernel("k", |k| {
//!     let d = k.reg::<U64>();
//!     k.prmt(d, d, d, 0x5410); // prmt works on 32-bit words
//! });
//! ```

#![warn(missing_docs)]

pub mod demo;
mod error;
mod kernel;
mod module;
mod ops;
pub mod ptxas;
mod reg;
pub mod types;

#[cfg(test)]
mod testing;
pub mod timeline;

pub use error::PtxError;
pub use kernel::{Kernel, Label, Shared};
pub use module::{GridDep, Module, PtxVersion, Target};
pub use ops::arith::Cmp;
pub use ops::bits::{Lut, PrmtMode};
pub use ops::convert::{CvtFrom, Exact, FloatRound, IntRound, Rounding};
pub use ops::dot::Bytes;
pub use ops::memory::{L2Prefetch, Load, LoadCache, Narrow, Sem, Space, Store, StoreCache};
pub use ops::special::{Dim, Special};
pub use ops::tensor::{CpAsyncCache, MmaFloat};
pub use ops::warp::{Scope, Shfl, FULL_WARP};
pub use reg::{Addr, Cond, Reg, Reinterpret, Src};
pub use types::{Bf16, Pred, B16, B32, B64, F16, F32, F64, S16, S32, S64, U16, U32, U64};
