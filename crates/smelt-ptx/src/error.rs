//! Why a kernel or module could not be built. Type errors are caught by rustc; these are the
//! mistakes only visible when the whole kernel is known (labels, names, options that do not
//! combine), reported before any PTX reaches ptxas or the driver.

use crate::module::{PtxVersion, Target};

/// A kernel or module that would not assemble, with what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    #[error("PTX ISA {0} is newer than 9.0, the newest the CUDA 13.0 driver (580) accepts")]
    VersionTooNew(PtxVersion),
    #[error("PTX ISA {version} is too old for {target}, which needs {min} or later")]
    VersionTooOld {
        version: PtxVersion,
        target: Target,
        min: PtxVersion,
    },
    #[error("kernel `{kernel}`: {what} name `{name}` is not a PTX identifier")]
    BadName {
        kernel: String,
        what: &'static str,
        name: String,
    },
    #[error("kernel `{kernel}`: `{name}` is declared twice")]
    Duplicate { kernel: String, name: String },
    #[error("kernel `{kernel}`: label {label} is branched to but never placed")]
    LabelNotPlaced { kernel: String, label: String },
    #[error("kernel `{kernel}`: label {label} is placed twice")]
    LabelPlacedTwice { kernel: String, label: String },
    #[error("kernel `{kernel}`: `{instr}` inside a predicated block (guards do not nest)")]
    NestedGuard { kernel: String, instr: String },
    #[error("kernel `{kernel}`: {reason}")]
    Invalid { kernel: String, reason: String },
}
