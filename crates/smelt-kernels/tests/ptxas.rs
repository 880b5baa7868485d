//! CI's check of the GPU kernels without a GPU: every kernel's PTX is generated and
//! assembled with ptxas (CUDA 13.0, the generation of the GPU machine's driver) for sm_80
//! and sm_90, failing on any error or warning, and ptxas's resource report is checked for
//! spills (a spilled GEMV is several times slower).
//!
//! ptxas comes from `SMELT_PTXAS`, else from `scripts/ptxas.sh` (which installs it once).
//! Neither working is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use smelt_kernels::catalog;
use smelt_ptx::{Module, Target};

fn ptxas() -> &'static Path {
    static PTXAS: OnceLock<PathBuf> = OnceLock::new();
    PTXAS.get_or_init(|| {
        if let Some(p) = std::env::var_os("SMELT_PTXAS") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "SMELT_PTXAS={} is not a file; unset it or point it at ptxas",
                p.display()
            );
            return p;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ptxas.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}: {e}; set SMELT_PTXAS to a ptxas binary",
                    script.display()
                )
            });
        assert!(
            out.status.success(),
            "{} failed ({}); set SMELT_PTXAS to a ptxas binary or fix the install:\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            path.is_file(),
            "scripts/ptxas.sh printed `{}`, which is not a file",
            path.display()
        );
        path
    })
}

/// Assembles one kernel's module; `Err` holds ptxas's message, `Ok` its resource report.
fn assemble(target: Target, name: &str, ptx: &str) -> Result<String, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("smelt-kernels")
        .join(target.to_string());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = dir.join(format!("{name}.ptx"));
    std::fs::write(&file, ptx).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = Command::new(ptxas())
        .arg(format!("-arch={target}"))
        .arg("--warning-as-error")
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.join(format!("{name}.cubin")))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas().display()))?;
    let message = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lower = message.to_lowercase();
    if out.status.success() && !lower.contains("warning") && !lower.contains("error") {
        Ok(message)
    } else {
        Err(format!(
            "ptxas {target} on {} ({}):\n{message}",
            file.display(),
            out.status
        ))
    }
}

#[test]
fn every_kernel_assembles_for_sm80_and_sm90_without_spills() {
    let mut failures = Vec::new();
    let mut assembled = 0;
    let mut strict = vec![catalog::QUANTIZE.to_string()];
    for ty in catalog::GEMV_TYPES {
        strict.push(catalog::gemv_name(ty, 1).unwrap_or_else(|e| panic!("{e}")));
    }
    for target in [Target::Sm80, Target::Sm90] {
        for (name, build) in catalog::all() {
            let mut m = Module::new(target);
            if let Err(e) = m.kernel(&name, |k| build(k)) {
                failures.push(format!("{name} ({target}) did not build: {e}"));
                continue;
            }
            match assemble(target, &name, &m.to_ptx()) {
                Ok(report) => {
                    assembled += 1;
                    let spills = !report.contains(" 0 bytes spill stores");
                    // The kernels decode runs (1 token, default configuration) and the
                    // quantize kernel must not spill; ptxas's own register budget leaves
                    // a few bytes in some many-token variants, which are shown.
                    if spills && strict.contains(&name) {
                        failures.push(format!("{name} ({target}) spills:\n{report}"));
                    } else if spills {
                        eprintln!("note: {name} ({target}) spills:\n{report}");
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed:\n\n{}",
        failures.len(),
        failures.len() + assembled,
        failures.join("\n\n")
    );
}

#[test]
fn the_whole_module_assembles() {
    for target in [Target::Sm80, Target::Sm90] {
        let m = catalog::module(target).unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = assemble(target, "all", &m.to_ptx()) {
            panic!("{e}");
        }
    }
}
