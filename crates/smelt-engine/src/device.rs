//! Where an engine runs: `--device auto|cpu|cuda|cuda:N`.

use std::fmt;
use std::str::FromStr;

use crate::EngineError;

/// The device an engine computes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host threads (SIMD + rayon).
    #[default]
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(usize),
}

/// What `auto` chose and why, for the user (the CLI prints `note` on stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub device: Device,
    /// Said once when `auto` picked the device (which one, or why not the GPU).
    pub note: Option<String>,
}

impl Device {
    /// Resolves a `--device` argument. `auto` picks CUDA device 0 when a driver and a device
    /// are present and says which, else the CPU and says why; explicit names are taken as
    /// they are (a missing GPU is reported when the engine opens it).
    pub fn select(spec: &str) -> Result<Selected, EngineError> {
        if spec.trim().eq_ignore_ascii_case("auto") {
            return Ok(Self::auto());
        }
        Ok(Selected {
            device: spec.parse()?,
            note: None,
        })
    }

    /// Checks that the device is there: the CPU always is; a CUDA device needs the driver
    /// and that ordinal (a clear error naming what is missing, never a panic).
    pub fn check(&self) -> Result<(), EngineError> {
        match *self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => Ok(smelt_cuda::visible::check(ordinal)?),
        }
    }

    /// `auto`: the first GPU when one is usable, else the CPU, with a note saying which.
    pub fn auto() -> Selected {
        Self::auto_from(smelt_cuda::device_count())
    }

    /// `auto` given what the driver answered (split out so both answers are testable on a
    /// machine that has only one of them).
    pub fn auto_from(count: Result<usize, smelt_cuda::CudaError>) -> Selected {
        match count {
            Ok(n) if n > 0 => Selected {
                device: Device::Cuda(0),
                note: Some(format!(
                    "device auto: using CUDA device 0 ({n} GPU{} found)",
                    if n == 1 { "" } else { "s" }
                )),
            },
            Ok(_) => Selected {
                device: Device::Cpu,
                note: Some("device auto: the CUDA driver reports no GPU; using the CPU".into()),
            },
            Err(e) => Selected {
                device: Device::Cpu,
                note: Some(format!("device auto: no usable GPU ({e}); using the CPU")),
            },
        }
    }
}

impl FromStr for Device {
    type Err = EngineError;

    /// `cpu`, `cuda` (device 0) or `cuda:N`; `auto` resolves as [`Device::auto`] does.
    fn from_str(s: &str) -> Result<Self, EngineError> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            EngineError::BadOptions(format!(
                "unknown device {s:?} (expected auto, cpu, cuda or cuda:N)"
            ))
        };
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            "auto" => Ok(Self::auto().device),
            _ => {
                let n = t
                    .strip_prefix("cuda:")
                    .or_else(|| t.strip_prefix("gpu:"))
                    .ok_or_else(bad)?;
                n.parse::<usize>().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("CPU".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:0".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert_eq!(" cuda:1 ".parse::<Device>().unwrap(), Device::Cuda(1));
        for bad in ["", "cuda:", "cuda:x", "cuda:-1", "tpu", "cuda0", "cuda:1:2"] {
            let e = bad.parse::<Device>().unwrap_err().to_string();
            assert!(
                e.contains("expected auto, cpu, cuda or cuda:N"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn displays_as_parsed() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
    }

    #[test]
    fn explicit_devices_carry_no_note() {
        let s = Device::select("cuda:2").unwrap();
        assert_eq!(s.device, Device::Cuda(2));
        assert!(s.note.is_none());
        assert!(Device::select("nope").is_err());
    }

    #[test]
    fn auto_picks_the_gpu_when_present_and_says_so() {
        let s = Device::auto_from(Ok(2));
        assert_eq!(s.device, Device::Cuda(0));
        assert!(s.note.unwrap().contains("CUDA device 0"));
    }

    #[test]
    fn auto_falls_back_to_the_cpu_with_the_reason() {
        let s = Device::auto_from(Err(smelt_cuda::CudaError::NoDriver));
        assert_eq!(s.device, Device::Cpu);
        let note = s.note.unwrap();
        assert!(
            note.contains("using the CPU") && note.contains("no CUDA driver"),
            "{note}"
        );
        let s = Device::auto_from(Ok(0));
        assert_eq!(s.device, Device::Cpu);
        assert!(s.note.unwrap().contains("no GPU"));
    }

    /// Without a driver, an explicit CUDA device is an error that says so.
    #[test]
    fn explicit_cuda_is_checked() {
        assert!(Device::Cpu.check().is_ok());
        match smelt_cuda::device_count() {
            Ok(n) => {
                let e = Device::Cuda(n).check().unwrap_err().to_string();
                assert!(e.contains(&format!("no CUDA device {n}")), "{e}");
            }
            Err(_) => {
                let e = Device::Cuda(0).check().unwrap_err().to_string();
                assert!(e.contains("CUDA"), "{e}");
            }
        }
    }

    /// On this machine, whatever it has: `auto` answers without panicking and agrees with
    /// the driver.
    #[test]
    fn auto_here_agrees_with_the_driver() {
        let s = Device::select("auto").unwrap();
        assert!(s.note.is_some());
        assert_eq!(s.device == Device::Cuda(0), smelt_cuda::available());
    }
}
