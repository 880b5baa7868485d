//! The non-GEMV operations of a transformer step on the GPU: norms, rope, the gated
//! activation and element-wise ops, embedding lookup and dequantization, the paged KV
//! cache append, flash-decoding attention (`attention`) and tensor-core prompt attention
//! (`flash`), and the per-row softmax / argmax / sampling.
//!
//! Every kernel here has, in its own module:
//! - a name constant (or a name function for families generated per type or shape);
//! - an emitter `fn(&Kernel)` whose doc comment lists the parameters in the order the
//!   host passes them (pointers are device addresses, `u32`/`f32` are by value);
//! - a host helper returning its [`Launch`] dimensions for a given shape;
//! - a CPU twin with the same semantics, on plain slices, which the GPU check
//!   (`examples/gpu_ops`) compares the kernel against.
//!
//! Following the GPU contract (`DESIGN.md`, and the CUDA backend that calls these), what
//! changes from one decode step to the next (token ids, positions, sequence descriptors,
//! block tables) is read from device memory, so a decode step can be captured once as a
//! CUDA graph and replayed; scalar parameters are only shapes and constants, and no grid
//! depends on a sequence's length.
//!
//! Activations are f32, row-major `[rows][cols]`, one row per token.
//!
//! Every kernel declares the largest block its launch helper asks for (`.maxntid`), so
//! ptxas budgets registers for it; `tests/ops_resources.rs` checks that each fits that
//! block without spills, `tests/twins_vs_engine.rs` ties the twins to the engine's CPU
//! backend, and `bench/gpu/ops.sh` checks the kernels against the twins on a GPU (results
//! in `bench/RESULTS.md`).

pub mod attention;
mod attention_any;
mod attention_reduce;
pub mod elementwise;
pub mod embed;
pub mod flash;
pub mod kv;
pub mod norm;
pub mod rope;
pub mod sample;

use smelt_ptx::{Kernel, Reg, Shared, Shfl, Store, F32, FULL_WARP};

use crate::catalog::Entry;

/// Grid and block dimensions of one launch, and its dynamic shared memory (0 but for the
/// kernels whose shared memory is over the 48 KB a static array may take:
/// [`crate::catalog::max_dynamic_shared_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
}

impl Launch {
    /// A launch of `grid` blocks of `block` threads, no dynamic shared memory.
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Self {
        Self {
            grid,
            block,
            shared_bytes: 0,
        }
    }
}

/// A kernel argument value, as the host passes it (kernels declared with
/// [`kernel_params!`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// A device address.
    Ptr(u64),
    /// A `u32` scalar.
    U32(u32),
    /// An `f32` scalar.
    F32(f32),
}

/// Declares a kernel's parameters once, for both sides of a launch: a host struct
/// (`$args`, public fields) whose `values()` are the arguments in order, and a kernel-side
/// struct (`$regs`) whose `declare` emits the `.param`s in that same order and holds their
/// registers. Kinds: `Ptr` (a device address, `u64`), `MaybePtr` (an address that may be 0,
/// kept as the raw parameter for the kernel to test), `U32`, `F32`. Adding, removing or
/// reordering a field changes both sides together, so the host's packing and the kernel's
/// declaration cannot drift apart.
macro_rules! kernel_params {
    ($(#[$m:meta])* $args:ident, $regs:ident {
        $($(#[$fm:meta])* $f:ident: $kind:ident),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $args {
            $($(#[$fm])* pub $f: kernel_params!(@host $kind),)*
        }

        impl $args {
            /// Parameter names, in the order the kernel declares them.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($f)),*];

            /// The argument values, in the order the kernel declares them.
            pub fn values(&self) -> Vec<$crate::ops::ArgValue> {
                vec![$(kernel_params!(@value $kind, self.$f)),*]
            }
        }

        /// The kernel's registers for the parameters of the host struct of the same
        /// declaration.
        #[derive(Clone, Copy)]
        pub(crate) struct $regs {
            $(pub(crate) $f: kernel_params!(@reg $kind),)*
        }

        impl $regs {
            /// Declares every parameter, in order.
            pub(crate) fn declare(k: &smelt_ptx::Kernel) -> Self {
                Self {
                    $($f: kernel_params!(@declare $kind, k, stringify!($f)),)*
                }
            }
        }
    };
    (@host Ptr) => { u64 };
    (@host MaybePtr) => { u64 };
    (@host U32) => { u32 };
    (@host F32) => { f32 };
    (@reg Ptr) => { smelt_ptx::Reg<smelt_ptx::U64> };
    (@reg MaybePtr) => { smelt_ptx::Reg<smelt_ptx::U64> };
    (@reg U32) => { smelt_ptx::Reg<smelt_ptx::U32> };
    (@reg F32) => { smelt_ptx::Reg<smelt_ptx::F32> };
    (@value Ptr, $v:expr) => { $crate::ops::ArgValue::Ptr($v) };
    (@value MaybePtr, $v:expr) => { $crate::ops::ArgValue::Ptr($v) };
    (@value U32, $v:expr) => { $crate::ops::ArgValue::U32($v) };
    (@value F32, $v:expr) => { $crate::ops::ArgValue::F32($v) };
    (@declare Ptr, $k:expr, $n:expr) => { $k.param_ptr($n) };
    (@declare MaybePtr, $k:expr, $n:expr) => { $k.param::<smelt_ptx::U64>($n) };
    (@declare U32, $k:expr, $n:expr) => { $k.param_u32($n) };
    (@declare F32, $k:expr, $n:expr) => { $k.param::<smelt_ptx::F32>($n) };
}
pub(crate) use kernel_params;

/// `n` as a launch dimension: grids and blocks are 32-bit on the GPU, and a zero
/// dimension is an invalid launch, so empty shapes become one block of idle threads.
pub(crate) fn dim(n: usize) -> u32 {
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// Threads of the one-block-per-row kernels (norms, softmax, argmax, sampling).
pub const ROW_THREADS: u32 = 256;

/// Every kernel of this module: name and emitter, for `catalog::all()`.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    v.extend(norm::catalog());
    v.extend(rope::catalog());
    v.extend(elementwise::catalog());
    v.extend(embed::catalog());
    v.extend(kv::catalog());
    v.extend(attention::catalog());
    v.extend(flash::catalog());
    v.extend(sample::catalog());
    v
}

/// The sum of `v` over the whole block (at most 32 warps, `tid.x` only), in every thread.
/// `scratch` is a shared f32 array of at least 33 elements. Ends with every thread past a
/// barrier, so `scratch` can be reused after the call.
pub(crate) fn block_sum(k: &Kernel, v: Reg<F32>, scratch: &Shared) -> Reg<F32> {
    block_reduce(k, v, scratch, 0.0, |k, a, b| {
        k.add(a, a, b);
    })
}

/// The maximum of `v` over the whole block, in every thread (see [`block_sum`]).
pub(crate) fn block_max(k: &Kernel, v: Reg<F32>, scratch: &Shared) -> Reg<F32> {
    block_reduce(k, v, scratch, f32::NEG_INFINITY, |k, a, b| {
        k.max(a, a, b);
    })
}

/// A block-wide reduction in a fixed order (warp butterflies, then warp 0 over the warp
/// results in warp order), so the float result is the same on every run.
fn block_reduce(
    k: &Kernel,
    v: Reg<F32>,
    scratch: &Shared,
    identity: f32,
    combine: impl Fn(&Kernel, Reg<F32>, Reg<F32>) + Copy,
) -> Reg<F32> {
    let acc = k.warp_reduce(v, combine);
    let tid = k.tid_x();
    let lane = k.and(k.reg(), tid, 31u32);
    let warp = k.shr(k.reg(), tid, 5u32);
    let base = k.shared_base(scratch);
    let first = k.eq(lane, 0u32);
    let slot = k.mad(k.reg(), warp, 4u32, base);
    k.guarded(first, |k| k.st(Store::SHARED, slot, acc));
    k.bar_sync();
    // Warp 0 reduces the per-warp results; lanes past the warp count bring the identity.
    let nwarps = k.shr(k.reg(), k.ntid_x(), 5u32);
    let w = k.f32(identity);
    let has = k.lt(lane, nwarps);
    let src = k.mad(k.reg(), lane, 4u32, base);
    k.guarded(has, |k| {
        k.ld(smelt_ptx::Load::SHARED, w, src);
    });
    let total = k.warp_reduce(w, combine);
    let w0 = k.eq(warp, 0u32);
    let first0 = k.and(k.reg(), first, w0);
    k.guarded(first0, |k| k.st(Store::SHARED, scratch.at(128), total));
    k.bar_sync();
    let out = k.load::<F32>(smelt_ptx::Load::SHARED, scratch.at(128));
    // A second barrier so a following reduction may overwrite the scratch.
    k.bar_sync();
    out
}

/// The lane shuffle `d = a` from lane `lane ^ offset`, for reductions of pairs.
pub(crate) fn bfly<T: smelt_ptx::types::Word>(k: &Kernel, a: Reg<T>, offset: u32) -> Reg<T> {
    k.shfl_sync(Shfl::Bfly, k.reg(), a, offset, FULL_WARP)
}

/// Shared scratch for [`block_sum`] / [`block_max`]: 32 warp slots and one result.
pub(crate) fn reduce_scratch(k: &Kernel, name: &str) -> Shared {
    k.shared::<F32>(name, 33, 16)
}

/// `1.0 / ln(2)`: `exp(x) = 2^(x * LOG2E)`.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
