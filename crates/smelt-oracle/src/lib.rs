//! The oracle every parity test compares against: llama.cpp and ggml through
//! `llama-cpp-python` 0.3.36 and gguf-py, installed by `scripts/oracles.sh`.
//!
//! The CPU engine reproduces the bits of llama.cpp's AVX-512 build (its dot products and
//! reductions run in that build's order). That build dies with SIGILL on a CPU without
//! AVX-512, and an AVX2 build answers with different low bits, so tests whose answer depends
//! on the build go through [`run_recorded`]: on an AVX-512 host the oracle runs and its
//! answer must equal the one committed under `records/` (written there with
//! `SMELT_ORACLE_RECORD=1`); anywhere else the committed answer is replayed. Answers that do
//! not depend on the build (quantizers, tokenizers, gguf-py) run live everywhere through
//! [`python`], which is the host's build.

mod record;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub use record::{run_live, run_recorded, Answer, Keep, Output};

/// Which llama.cpp build the oracle is: the one `scripts/oracles.sh` makes for this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// `-DGGML_AVX512=ON`: the bits the CPU engine reproduces.
    Avx512,
    /// `-DGGML_AVX512=OFF`, for CPUs without AVX-512: quantizers and tokenizers agree with
    /// the AVX-512 build byte for byte, dot products do not.
    Avx2,
}

impl Flavour {
    /// This CPU's flavour: AVX-512 needs the subsets ggml's `GGML_AVX512` compiles for.
    pub fn host() -> Flavour {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512cd")
            {
                return Flavour::Avx512;
            }
        }
        Flavour::Avx2
    }

    /// The suffix of the venv `scripts/oracles.sh` builds for this flavour.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Avx512 => "avx512",
            Flavour::Avx2 => "avx2",
        }
    }
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The Python with the oracles: `SMELT_PYTHON`, else the venv `scripts/oracles.sh` makes for
/// this CPU under `$SMELT_CACHE` (default `~/.cache/smelt`). Missing, or unable to import
/// llama_cpp, is a failure, never a skip: these tests are the proof of parity.
pub fn python() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    CHECKED.get_or_init(find_python).clone()
}

fn find_python() -> PathBuf {
    let path = match std::env::var_os("SMELT_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("SMELT_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let home = std::env::var_os("HOME").unwrap_or_default();
                    PathBuf::from(home).join(".cache/smelt")
                });
            cache.join(format!(
                "venv-llcpp-0.3.36-{}/bin/python",
                Flavour::host().name()
            ))
        }
    };
    assert!(
        path.is_file(),
        "the oracle Python {} is missing: run scripts/oracles.sh (and set SMELT_PYTHON to the \
         path it prints if it is not the default)",
        path.display()
    );
    let probe = Command::new(&path)
        .args(["-c", "import llama_cpp, numpy, gguf"])
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
    assert!(
        probe.status.success(),
        "{} cannot import llama_cpp, numpy and gguf (its build may still be running): run \
         scripts/oracles.sh\n{}",
        path.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    path
}
