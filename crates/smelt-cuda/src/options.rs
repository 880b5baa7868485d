//! The settings that shape a device's kernel module and launches, read from the
//! environment in one place ([`GpuOptions::from_vars`]) when a [`crate::Gpu`] opens.
//!
//! They are measurement switches for the scripts under `bench/gpu/` (launch dependencies,
//! shared-memory carveouts, per-block timestamps); the defaults are what those scripts
//! measured. The engine's `CudaOptions` reads them with its own settings and opens the
//! device with them ([`crate::Gpu::open_with`]); [`crate::Gpu::open`] reads them itself.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `SMELT_CUDA_PDL` | `pdl` | `smelt_kernels::catalog::GRID_DEPS` (`hoist`) |
//! | `SMELT_CUDA_PDL_AFTER` | `pdl_after` | `smelt_kernels::catalog::LAUNCH_AFTER_WAIT` |
//! | `SMELT_CUDA_EARLY_SKIP` | `early_skip` | `smelt_kernels::catalog::NO_EARLY_WORK` |
//! | `SMELT_CUDA_CARVEOUT` | `carveout` | `smelt_kernels::catalog::CARVEOUT_BYTES` of each SM |
//! | `SMELT_CUDA_TIMELINE=1` | `timeline` | off |
//! | `SMELT_CUDA_LOAD_LOG=1` | `load_log` | off |

/// How a device's kernels are generated and launched (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// Programmatic dependent launch, by preset name (`0`, `wait`, `launch`, `gemv`,
    /// `small`, `chain`, `chain-gemv`, `prefetch`, `early`, `early-prefetch`, `hoist`);
    /// `None` or an unknown name: the catalog's default. Off before sm_90.
    pub pdl: Option<String>,
    /// Kernels besides the GEMVs that let their successor launch after their own wait
    /// (name prefixes, `/`-separated, `none`: empty); `None`: the catalog's list.
    pub pdl_after: Option<String>,
    /// GEMVs that do no early work (name parts, as `pdl_after`); `None`: the catalog's.
    pub early_skip: Option<String>,
    /// Shared-memory carveouts: `25` for every kernel, `attention=14/gemv_=0` by name
    /// prefix, `driver` for the driver's choice; `None`: the catalog's bytes per SM.
    pub carveout: Option<String>,
    /// Kernels stamp per-block start and end times (`Gpu::timeline`).
    pub timeline: bool,
    /// Print how the kernel module was made and how long it took.
    pub load_log: bool,
}

impl GpuOptions {
    /// The settings from the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The settings from `var` (a variable's value, if set).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| var(name).is_some_and(|v| v == "1");
        Self {
            pdl: var("SMELT_CUDA_PDL"),
            pdl_after: var("SMELT_CUDA_PDL_AFTER"),
            early_skip: var("SMELT_CUDA_EARLY_SKIP"),
            carveout: var("SMELT_CUDA_CARVEOUT"),
            timeline: set("SMELT_CUDA_TIMELINE"),
            load_log: set("SMELT_CUDA_LOAD_LOG"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_means_the_catalog_defaults() {
        assert_eq!(GpuOptions::from_vars(|_| None), GpuOptions::default());
        let o = GpuOptions::from_vars(|n| match n {
            "SMELT_CUDA_PDL" => Some("chain".into()),
            "SMELT_CUDA_TIMELINE" => Some("1".into()),
            "SMELT_CUDA_LOAD_LOG" => Some("0".into()),
            _ => None,
        });
        assert_eq!(o.pdl.as_deref(), Some("chain"));
        assert!(o.timeline && !o.load_log);
    }
}
