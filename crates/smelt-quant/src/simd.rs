//! Run-time choice between the AVX2 and portable paths.
//!
//! Both paths give bit-identical results; `SMELT_NO_SIMD=1` forces the portable one
//! (useful for checking that claim, or on a CPU whose AVX2 misbehaves).

use std::sync::OnceLock;

/// Whether the AVX2 (+FMA) paths may be used on this CPU. Inlined: the engine asks once per
/// dot product (1.3% of a decode step when it was a call into this crate).
#[inline]
pub fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(detect_avx2)
}

#[cold]
fn detect_avx2() -> bool {
    if std::env::var_os("SMELT_NO_SIMD").is_some_and(|v| v != "0") {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
