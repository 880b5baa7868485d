//! Assembling generated PTX with NVIDIA's `ptxas`, so machines without a GPU (CI) still
//! catch a malformed instruction, a warning or a register spill.
//!
//! `ptxas` comes from the PyPI package `nvidia-cuda-nvcc` (the CUDA 13.0 build matching
//! driver 580), installed by the project's `scripts/ptxas.sh`; `SMELT_PTXAS` overrides it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Target;

/// A located `ptxas` binary.
#[derive(Debug, Clone)]
pub struct Ptxas {
    path: PathBuf,
}

impl Ptxas {
    /// `SMELT_PTXAS` when set, else the last line `install_script` (bash) prints. Either
    /// not yielding a file is an error saying how to fix it.
    pub fn locate(install_script: &Path) -> Result<Ptxas, String> {
        if let Some(p) = std::env::var_os("SMELT_PTXAS") {
            let path = PathBuf::from(p);
            if !path.is_file() {
                return Err(format!(
                    "SMELT_PTXAS={} is not a file; unset it or point it at ptxas",
                    path.display()
                ));
            }
            return Ok(Ptxas { path });
        }
        let out = Command::new("bash")
            .arg(install_script)
            .output()
            .map_err(|e| {
                format!(
                    "cannot run {}: {e}; set SMELT_PTXAS to a ptxas binary",
                    install_script.display()
                )
            })?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}); set SMELT_PTXAS to a ptxas binary or fix the install:\n{}",
                install_script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        if !path.is_file() {
            return Err(format!(
                "{} printed `{}`, which is not a file",
                install_script.display(),
                path.display()
            ));
        }
        Ok(Ptxas { path })
    }

    /// The binary's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `ptx` to `<dir>/<name>.ptx` (kept, so a failure can be read afterwards) and
    /// assembles it for `target` with warnings as errors. `Ok` holds ptxas's resource report
    /// (`-v`: registers, spills); `Err` its message with the PTX lines it points at.
    pub fn assemble(
        &self,
        dir: &Path,
        target: Target,
        name: &str,
        ptx: &str,
    ) -> Result<String, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let file = dir.join(format!("{name}.ptx"));
        std::fs::write(&file, ptx).map_err(|e| format!("{}: {e}", file.display()))?;
        let out = Command::new(&self.path)
            .arg(format!("-arch={target}"))
            .arg("--warning-as-error")
            .arg("-v")
            .arg(&file)
            .arg("-o")
            .arg(dir.join(format!("{name}.cubin")))
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.path.display()))?;
        let message = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let lower = message.to_lowercase();
        if out.status.success() && !lower.contains("warning") && !lower.contains("error") {
            return Ok(message);
        }
        Err(format!(
            "ptxas {target} on {} ({}):\n{message}{}",
            file.display(),
            out.status,
            offending_lines(&message, ptx)
        ))
    }
}

/// The PTX lines a ptxas message names (`..., line 42; error : ...`), with a line of
/// context either side.
fn offending_lines(message: &str, ptx: &str) -> String {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut out = String::new();
    for part in message.split("line ").skip(1) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        let Ok(n) = digits.parse::<usize>() else {
            continue;
        };
        out.push_str(&format!("  PTX around line {n}:\n"));
        let first = n.saturating_sub(2);
        for (i, line) in lines.iter().enumerate().skip(first).take(3) {
            let mark = if i + 1 == n { ">>" } else { "  " };
            out.push_str(&format!("  {mark} {:5} | {line}\n", i + 1));
        }
    }
    out
}
