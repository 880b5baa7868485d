//! Why a kernel or module could not be built. Type errors are caught by rustc; these are the
//! mistakes only visible when the whole kernel is known (labels, names, options that do not
//! combine), reported before any PTX reaches ptxas or the driver.

use crate::module::{PtxVersion, Target};

/// A kernel or module that would not assemble, with what was wrong. Every variant names
/// the kernel (`kernel`) so a module of many kernels points at the one to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    /// The driver we ship for would refuse the module.
    #[error("PTX ISA {0} is newer than 9.0, the newest the CUDA 13.0 driver (580) accepts")]
    VersionTooNew(PtxVersion),
    /// The ISA version predates the target architecture.
    #[error("PTX ISA {version} is too old for {target}, which needs {min} or later")]
    VersionTooOld {
        /// The version asked for.
        version: PtxVersion,
        /// The architecture asked for.
        target: Target,
        /// The oldest version that knows `target`.
        min: PtxVersion,
    },
    /// A kernel, parameter or shared array name PTX would not parse.
    #[error("kernel `{kernel}`: {what} name `{name}` is not a PTX identifier")]
    BadName {
        /// The kernel being built.
        kernel: String,
        /// What was being named.
        what: &'static str,
        /// The offending name.
        name: String,
    },
    /// Two kernels, or two names inside one kernel, collide.
    #[error("kernel `{kernel}`: `{name}` is declared twice")]
    Duplicate {
        /// The kernel being built.
        kernel: String,
        /// The repeated name.
        name: String,
    },
    /// A branch targets a label that was never placed.
    #[error("kernel `{kernel}`: label {label} is branched to but never placed")]
    LabelNotPlaced {
        /// The kernel being built.
        kernel: String,
        /// The label.
        label: String,
    },
    /// A label was placed at two points.
    #[error("kernel `{kernel}`: label {label} is placed twice")]
    LabelPlacedTwice {
        /// The kernel being built.
        kernel: String,
        /// The label.
        label: String,
    },
    /// Something that carries its own predicate (a branch, a label, another guarded block)
    /// inside a guarded block.
    #[error("kernel `{kernel}`: `{instr}` inside a predicated block (guards do not nest)")]
    NestedGuard {
        /// The kernel being built.
        kernel: String,
        /// The instruction that cannot be guarded twice.
        instr: String,
    },
    /// Options that do not combine, sizes PTX does not have, or a generator's own
    /// [`crate::Kernel::reject`].
    #[error("kernel `{kernel}`: {reason}")]
    Invalid {
        /// The kernel being built.
        kernel: String,
        /// What was wrong.
        reason: String,
    },
}
