//! Helpers for the unit tests: build a throwaway kernel and look at its instructions.

use crate::kernel::Kernel;
use crate::module::Target;

/// The instruction lines `build` emits, trimmed.
pub(crate) fn body(build: impl FnOnce(&Kernel)) -> Vec<String> {
    let k = match Kernel::new("test", Target::Sm80) {
        Ok(k) => k,
        Err(e) => panic!("test kernel: {e}"),
    };
    build(&k);
    k.body_lines()
}
