//! Only the devices a process uses, visible to the driver: its start (`cuInit`, on the
//! first CUDA call) sets up every GPU the process can see, so on a 4-GPU host a one-GPU
//! `smelt quantize` paid 1.0-1.2 s to reach "cuda:0 ready" against 0.31 s on a one-GPU host
//! (bench/RESULTS.md, 2026-11-27 06:30 UTC). Smelt itself opens one context and loads its
//! module on that device alone ([`crate::Gpu::open`]); the rest was the driver's.
//!
//! [`use_only`], called before the first CUDA call, sets `CUDA_VISIBLE_DEVICES` to the
//! ordinals given (when the user has not set it, and `SMELT_CUDA_ALL_DEVICES` is not `1`).
//! Ordinals keep their meaning for the rest of smelt: `cuda:2` stays "cuda:2" in every
//! message, and [`driver_ordinal`] turns it into the driver's index among the visible ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::CudaError;

/// Whether a CUDA call has started the driver (after which the variable has no effect).
static STARTED: AtomicBool = AtomicBool::new(false);
/// The ordinals [`use_only`] made visible, in the driver's order.
static ONLY: OnceLock<Vec<usize>> = OnceLock::new();

/// Called by every driver entry point before the driver starts.
pub(crate) fn driver_starts() {
    STARTED.store(true, Ordering::Release);
}

/// Makes only `ordinals` (in ascending order, no repeats) visible to this process's driver,
/// when nothing has started the driver yet, `CUDA_VISIBLE_DEVICES` is unset and
/// `SMELT_CUDA_ALL_DEVICES` is not `1`. Returns whether it did. Call it before any thread
/// that might start the driver exists (it sets an environment variable).
pub fn use_only(ordinals: &[usize]) -> bool {
    let sorted = ordinals.windows(2).all(|w| w[0] < w[1]);
    if ordinals.is_empty()
        || !sorted
        || STARTED.load(Ordering::Acquire)
        || ONLY.get().is_some()
        || std::env::var_os("CUDA_VISIBLE_DEVICES").is_some()
        || std::env::var("SMELT_CUDA_ALL_DEVICES").is_ok_and(|v| v == "1")
    {
        return false;
    }
    let list: Vec<String> = ordinals.iter().map(usize::to_string).collect();
    std::env::set_var("CUDA_VISIBLE_DEVICES", list.join(","));
    ONLY.set(ordinals.to_vec()).is_ok()
}

/// The ordinals [`use_only`] restricted this process to, if it did.
pub fn restricted() -> Option<&'static [usize]> {
    ONLY.get().map(Vec::as_slice)
}

/// The driver's index of smelt's device `ordinal`: itself, or its place among the visible
/// devices after [`use_only`]; an error naming the restriction when it is not among them.
pub fn driver_ordinal(ordinal: usize) -> Result<usize, CudaError> {
    match ONLY.get() {
        None => Ok(ordinal),
        Some(only) => only.iter().position(|&o| o == ordinal).ok_or_else(|| {
            CudaError::Init(format!(
                "CUDA device {ordinal} is not visible to this process (smelt set \
                 CUDA_VISIBLE_DEVICES={} for the devices it uses)",
                only.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ))
        }),
    }
}

/// Checks that device `ordinal` is there, after any [`use_only`]: the error names the
/// ordinal asked for and what the driver reports.
pub fn check(ordinal: usize) -> Result<(), CudaError> {
    let count = crate::device_count()?;
    let at = driver_ordinal(ordinal)?;
    if at < count {
        return Ok(());
    }
    Err(match ONLY.get() {
        None => CudaError::NoDevice { ordinal, count },
        Some(_) => CudaError::Init(format!(
            "no CUDA device {ordinal}: with only it visible (CUDA_VISIBLE_DEVICES={}) the \
             driver reports {count} device(s)",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unrestricted, ordinals are the driver's; a list out of order or empty is refused.
    #[test]
    fn ordinals_are_the_drivers_until_restricted() {
        if ONLY.get().is_none() {
            assert_eq!(driver_ordinal(3).ok(), Some(3));
        }
        assert!(!use_only(&[]));
        assert!(!use_only(&[2, 1]));
        assert!(!use_only(&[1, 1]));
    }

    /// The restriction is one-way and process-wide, so it runs in a child process (this
    /// test binary, this test alone): with `CUDA_VISIBLE_DEVICES` unset it sets it and maps
    /// ordinals; with the user's own value it changes nothing.
    #[test]
    fn a_restriction_sets_the_variable_and_maps_ordinals() {
        const CHILD: &str = "SMELT_TEST_VISIBLE_CHILD";
        match std::env::var(CHILD).as_deref() {
            Ok("restrict") => {
                assert!(use_only(&[2, 5]));
                assert_eq!(std::env::var("CUDA_VISIBLE_DEVICES").as_deref(), Ok("2,5"));
                assert_eq!(restricted(), Some(&[2, 5][..]));
                assert_eq!(driver_ordinal(2).ok(), Some(0));
                assert_eq!(driver_ordinal(5).ok(), Some(1));
                let e = driver_ordinal(0).expect_err("0 is hidden").to_string();
                assert!(e.contains("CUDA_VISIBLE_DEVICES=2,5"), "{e}");
                assert!(!use_only(&[1]), "a second restriction");
                return;
            }
            Ok("kept") => {
                assert!(!use_only(&[1]));
                assert_eq!(std::env::var("CUDA_VISIBLE_DEVICES").as_deref(), Ok("7"));
                assert_eq!(driver_ordinal(1).ok(), Some(1));
                return;
            }
            _ => {}
        }
        let exe = std::env::current_exe().expect("test binary");
        for (mode, user) in [("restrict", None), ("kept", Some("7"))] {
            let mut c = std::process::Command::new(&exe);
            c.args([
                "--exact",
                "visible::tests::a_restriction_sets_the_variable_and_maps_ordinals",
                "--test-threads=1",
            ])
            .env(CHILD, mode)
            .env_remove("SMELT_CUDA_ALL_DEVICES");
            match user {
                Some(v) => c.env("CUDA_VISIBLE_DEVICES", v),
                None => c.env_remove("CUDA_VISIBLE_DEVICES"),
            };
            let out = c.output().expect("runs the child");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "{mode}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
