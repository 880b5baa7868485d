//! A PTX module: the header (ISA version, target, address size) and its kernels.

use std::fmt;

use crate::error::PtxError;
use crate::kernel::Kernel;

/// The GPU architecture a module is assembled for. The driver JIT-compiles PTX for any
/// newer GPU too, so this is the oldest GPU the kernels must run on (and the features they
/// may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Ampere A100: the floor for `cp.async`, `.L2::256B` hints and bf16 `mma`.
    Sm80,
    /// Ampere consumer cards.
    Sm86,
    /// Ada.
    Sm89,
    /// Hopper, portable subset.
    Sm90,
    /// Hopper with the architecture-specific features (`wgmma`, `setmaxnreg`); such PTX
    /// runs only on sm_90 itself.
    Sm90a,
}

impl Target {
    /// The oldest PTX ISA that knows this target.
    pub fn min_version(self) -> PtxVersion {
        match self {
            Target::Sm80 => PtxVersion::new(7, 0),
            Target::Sm86 => PtxVersion::new(7, 1),
            Target::Sm89 | Target::Sm90 => PtxVersion::new(7, 8),
            Target::Sm90a => PtxVersion::new(8, 0),
        }
    }

    /// The compute capability as a number (`80`, `90`), for kernels that specialise.
    pub fn sm(self) -> u32 {
        match self {
            Target::Sm80 => 80,
            Target::Sm86 => 86,
            Target::Sm89 => 89,
            Target::Sm90 | Target::Sm90a => 90,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Sm80 => "sm_80",
            Target::Sm86 => "sm_86",
            Target::Sm89 => "sm_89",
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
        })
    }
}

/// A PTX ISA version (`.version 8.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PtxVersion {
    /// Major version (8 in 8.0).
    pub major: u32,
    /// Minor version (0 in 8.0).
    pub minor: u32,
}

impl PtxVersion {
    /// The default: new enough for sm_90a and every instruction this crate emits, and well
    /// inside what driver 580 accepts, so modules load on older drivers too.
    pub const DEFAULT: PtxVersion = PtxVersion::new(8, 0);
    /// The newest ISA the CUDA 13.0 driver (580) JIT-compiles.
    pub const NEWEST: PtxVersion = PtxVersion::new(9, 0);

    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for PtxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A PTX module under construction: kernels are added one by one and the text is the
/// input of `cuModuleLoadData` (or of ptxas in CI).
#[derive(Debug, Clone)]
pub struct Module {
    version: PtxVersion,
    target: Target,
    kernels: Vec<(String, String)>,
}

impl Module {
    /// An empty module for `target` at [`PtxVersion::DEFAULT`].
    pub fn new(target: Target) -> Self {
        Self {
            version: PtxVersion::DEFAULT,
            target,
            kernels: Vec::new(),
        }
    }

    /// An empty module at a chosen ISA version, refused when the version is newer than the
    /// driver we ship for accepts or older than the target needs.
    pub fn with_version(target: Target, version: PtxVersion) -> Result<Self, PtxError> {
        if version > PtxVersion::NEWEST {
            return Err(PtxError::VersionTooNew(version));
        }
        if version < target.min_version() {
            return Err(PtxError::VersionTooOld {
                version,
                target,
                min: target.min_version(),
            });
        }
        Ok(Self {
            version,
            target,
            kernels: Vec::new(),
        })
    }

    /// The architecture this module is for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The module's ISA version.
    pub fn version(&self) -> PtxVersion {
        self.version
    }

    /// Adds a kernel (`.visible .entry name`) whose body `build` emits. The kernel is
    /// checked as a whole (labels, names, option combinations) before it is added.
    pub fn kernel(
        &mut self,
        name: &str,
        build: impl FnOnce(&Kernel),
    ) -> Result<&mut Self, PtxError> {
        if self.kernels.iter().any(|(n, _)| n == name) {
            return Err(PtxError::Duplicate {
                kernel: name.to_string(),
                name: name.to_string(),
            });
        }
        let k = Kernel::new(name, self.target)?;
        build(&k);
        let text = k.finish()?;
        self.kernels.push((name.to_string(), text));
        Ok(self)
    }

    /// Names of the kernels added so far, in order.
    pub fn kernel_names(&self) -> impl Iterator<Item = &str> {
        self.kernels.iter().map(|(n, _)| n.as_str())
    }

    /// The complete module text.
    pub fn to_ptx(&self) -> String {
        let mut out = format!(
            "//\n// Generated by smelt-ptx\n//\n\n.version {}\n.target {}\n.address_size 64\n",
            self.version, self.target
        );
        for (_, text) in &self.kernels {
            out.push('\n');
            out.push_str(text);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_version_target_and_address_size() {
        let m = Module::new(Target::Sm90);
        assert_eq!(
            m.to_ptx(),
            "//\n// Generated by smelt-ptx\n//\n\n.version 8.0\n.target sm_90\n.address_size 64\n"
        );
    }

    #[test]
    fn versions_are_bounded_by_driver_and_target() {
        assert!(Module::with_version(Target::Sm80, PtxVersion::new(9, 0)).is_ok());
        assert_eq!(
            Module::with_version(Target::Sm80, PtxVersion::new(9, 1)).err(),
            Some(PtxError::VersionTooNew(PtxVersion::new(9, 1)))
        );
        assert!(matches!(
            Module::with_version(Target::Sm90, PtxVersion::new(7, 5)),
            Err(PtxError::VersionTooOld { .. })
        ));
        assert!(Module::with_version(Target::Sm90a, PtxVersion::new(8, 0)).is_ok());
    }

    #[test]
    fn kernel_names_are_unique() {
        let mut m = Module::new(Target::Sm80);
        assert!(m.kernel("k", |_| {}).is_ok());
        assert!(matches!(
            m.kernel("k", |_| {}),
            Err(PtxError::Duplicate { .. })
        ));
        assert_eq!(m.kernel_names().collect::<Vec<_>>(), ["k"]);
    }
}
