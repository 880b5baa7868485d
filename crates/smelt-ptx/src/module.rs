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

/// How a module's kernels take part in programmatic dependent launch (Hopper, sm_90+): a
/// kernel launched with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` may start
/// while the kernel before it on the stream is still running, so it must wait
/// (`griddepcontrol.wait`) before it reads anything an earlier kernel wrote, or writes
/// anything an earlier kernel reads. The default is off; targets older than sm_90 are always
/// off (their PTX never holds `griddepcontrol`). Kernels that never call
/// [`Kernel::grid_dep_wait`] wait at entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GridDep {
    /// Kernels wait for the grids they depend on; without it, no `griddepcontrol` at all.
    pub wait: bool,
    /// Kernels let the next kernel launch at entry (`griddepcontrol.launch_dependents`), so
    /// its blocks are scheduled and waiting when this one ends. Without it, the next kernel
    /// launches when this one has ended.
    pub early_launch: bool,
    /// Kernels may do work that reads nothing an earlier grid wrote (a GEMV's first loads of
    /// its weights) before they wait; see [`Kernel::grid_dep`].
    pub early_work: bool,
    /// With `early_launch`: the next kernel launches once this one has passed its wait
    /// rather than at entry, so at most one kernel waits ahead of the running one (a
    /// kernel launched at entry lets its successor launch at entry too, and a chain of
    /// them fills the SMs with waiting blocks placed around the running kernel's).
    pub launch_after_wait: bool,
}

impl GridDep {
    /// Everything on.
    pub const ALL: GridDep = GridDep {
        wait: true,
        early_launch: true,
        early_work: true,
        launch_after_wait: false,
    };

    /// `self` where `target` has `griddepcontrol` (sm_90 and later), else off.
    pub fn for_target(self, target: Target) -> GridDep {
        if target >= Target::Sm90 && self.wait {
            self
        } else {
            GridDep::default()
        }
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
    grid_dep: GridDep,
    timeline: bool,
}

impl Module {
    /// An empty module for `target` at [`PtxVersion::DEFAULT`].
    pub fn new(target: Target) -> Self {
        Self {
            version: PtxVersion::DEFAULT,
            target,
            kernels: Vec::new(),
            grid_dep: GridDep::default(),
            timeline: false,
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
            grid_dep: GridDep::default(),
            timeline: false,
        })
    }

    /// Sets how kernels added from now on take part in programmatic dependent launch
    /// (off on targets older than sm_90, whatever `grid_dep` says).
    pub fn set_grid_dep(&mut self, grid_dep: GridDep) -> &mut Self {
        self.grid_dep = grid_dep.for_target(self.target);
        self
    }

    /// Instruments the kernels added from here on with [`crate::timeline`]'s timestamps
    /// (profiling only: one more parameter, last, and a few atomics per block).
    pub fn set_timeline(&mut self, on: bool) -> &mut Self {
        self.timeline = on;
        self
    }

    /// The module's [`GridDep`].
    pub fn grid_dep(&self) -> GridDep {
        self.grid_dep
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
        k.set_grid_dep(self.grid_dep);
        k.set_timeline(self.timeline);
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

    #[test]
    fn grid_dependence_is_sm90_only_and_waits_at_entry_unless_placed() {
        let build = |target, g: GridDep, explicit: bool| {
            let mut m = Module::new(target);
            m.set_grid_dep(g);
            m.kernel("k", |k| {
                let x = k.param_u32("x");
                if explicit {
                    k.comment("early");
                    k.grid_dep_wait();
                }
                k.exit_if(k.eq(x, 0u32));
            })
            .unwrap();
            m.to_ptx()
        };
        assert!(!build(Target::Sm80, GridDep::ALL, false).contains("griddepcontrol"));
        assert!(!build(Target::Sm90, GridDep::default(), true).contains("griddepcontrol"));
        let entry = build(Target::Sm90, GridDep::ALL, false);
        let body = &entry[entry.find("\n\n\t").unwrap()..];
        assert!(
            body.starts_with("\n\n\tgriddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;\n"),
            "{entry}"
        );
        let placed = build(Target::Sm90, GridDep::ALL, true);
        assert_eq!(placed.matches("griddepcontrol.wait").count(), 1, "{placed}");
        assert!(placed.find("// early").unwrap() < placed.find("griddepcontrol.wait").unwrap());
        let no_launch = GridDep {
            early_launch: false,
            ..GridDep::ALL
        };
        let waits = build(Target::Sm90, no_launch, false);
        assert!(waits.contains("griddepcontrol.wait") && !waits.contains("launch_dependents"));
        let after = GridDep {
            launch_after_wait: true,
            ..GridDep::ALL
        };
        for explicit in [false, true] {
            let t = build(Target::Sm90, after, explicit);
            let (w, l) = (t.find("griddepcontrol.wait;"), t.find("launch_dependents;"));
            assert!(w.is_some() && l.is_some() && w < l, "{t}");
            assert_eq!(t.matches("launch_dependents").count(), 1, "{t}");
        }
    }
}
