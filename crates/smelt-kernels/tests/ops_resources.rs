//! CI's check that every op kernel, and every fused GEMV (`gemv::Fuse`: larger blocks,
//! register caps), can launch with the largest block its launch helper asks for: each
//! declares that block size (`.maxntid`), and ptxas's register count for it fits the
//! 64K-register file of a block without spilling. A kernel that needs more
//! registers than a 1024-thread block can have fails only at launch on the GPU
//! (LAUNCH_OUT_OF_RESOURCES; the sampler did, once), so this catches it without one.
//!
//! ptxas comes from `SMELT_PTXAS`, else from `scripts/ptxas.sh`; neither working is a
//! failure, never a skip.

use std::path::Path;

use smelt_kernels::{catalog, ops};
use smelt_ptx::ptxas::Ptxas;
use smelt_ptx::{Module, Target};

/// The op kernels and the fused GEMVs.
fn kernels() -> Vec<catalog::Entry> {
    let mut v = ops::catalog();
    v.extend(catalog::all().into_iter().filter(|(n, _)| {
        n.ends_with("_resnorm") || n.ends_with("_rmsin") || n.ends_with("_ropekv")
    }));
    v
}

/// Registers of a block of `threads` threads using `regs` each (allocated per warp in
/// units of 256).
fn block_registers(regs: u32, threads: u32) -> u32 {
    let per_warp = (regs * 32).div_ceil(256) * 256;
    threads.div_ceil(32) * per_warp
}

#[test]
fn every_op_kernel_fits_its_largest_block_without_spills() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ptxas.sh");
    let ptxas = Ptxas::locate(&script).unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    let mut checked = 0;
    for target in [Target::Sm80, Target::Sm90] {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("smelt-kernels-ops")
            .join(target.to_string());
        for (name, build) in kernels() {
            let mut m = Module::new(target);
            if let Err(e) = m.kernel(&name, |k| build(k)) {
                failures.push(format!("{name}: {e}"));
                continue;
            }
            let ptx = m.to_ptx();
            let Some(threads) = ptx.lines().find_map(|l| {
                let rest = l.trim().strip_prefix(".maxntid ")?;
                Some(
                    rest.split(',')
                        .map(|n| n.trim().parse::<u32>().unwrap_or(0))
                        .product::<u32>(),
                )
            }) else {
                failures.push(format!("{name} ({target}): no .maxntid"));
                continue;
            };
            let report = match ptxas.assemble(&dir, target, &name, &ptx) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            let regs = report
                .split("Used ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u32>().ok());
            let Some(regs) = regs else {
                failures.push(format!("{name} ({target}): no register count in\n{report}"));
                continue;
            };
            if block_registers(regs, threads) > 65536 {
                failures.push(format!(
                    "{name} ({target}): {regs} registers x {threads} threads do not fit a block"
                ));
            }
            if !report.contains(" 0 bytes spill stores") {
                failures.push(format!("{name} ({target}) spills:\n{report}"));
            }
            println!("{name:28} {target}: {regs:3} registers, up to {threads} threads");
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(checked, 2 * kernels().len());
    assert!(kernels().len() >= ops::catalog().len() + 24);
}

#[test]
fn register_file_arithmetic() {
    assert_eq!(block_registers(64, 1024), 65536);
    assert_eq!(block_registers(65, 1024), 65536 + 8192);
    assert!(block_registers(72, 1024) > 65536);
    assert_eq!(block_registers(40, 128), 4 * 40 * 32);
}
