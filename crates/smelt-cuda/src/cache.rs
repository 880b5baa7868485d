//! The kernel module across runs. A process that opens a GPU needs the catalog's PTX (every
//! kernel, about 25 MB, half a second to generate) compiled for the device. The PTX is kept
//! on disk under a key of this binary and the settings that shape it, so a start skips
//! generating it; the driver compiles it (`cuModuleLoadData`, whole-program) and keeps the
//! machine code in its own JIT cache (`~/.nv/ComputeCache`, the `CUDA_CACHE_*` variables),
//! so a later start compiles nothing either.
//!
//! Why no cubin of our own: the driver makes one only through its linker (`cuLink*`), which
//! compiles PTX as relocatable code, and relocatable code takes more registers (`ptxas -c`
//! against whole-program: the Q4_K GEMV 64 -> 90, its split-norm consumer 80 -> 96, the
//! Q|K|V GEMV with rope 72 -> 104), so fewer warps an SM: single-stream decode was 5%
//! slower on an H200 with the linked cubin (529 against 559 tok/s, bench/RESULTS.md
//! 2026-11-28).
//!
//! Where: `$SMELT_KERNEL_CACHE` (a folder; `0` or `off` turns the cache off), else
//! `$XDG_CACHE_HOME/smelt/kernels`, else `~/.cache/smelt/kernels`. A file that cannot be
//! read or written is only a miss: generating the PTX always works.

use std::hash::Hasher;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::CudaError;

/// Where a module's PTX came from, for the start-up log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// Read from the cache at this path.
    Hit(PathBuf),
    /// Generated and stored at this path.
    Stored(PathBuf),
    /// Generated; not cached (off, or the cache folder is not writable).
    Uncached,
}

/// The cache folder, or `None` when it is turned off or no home is known.
pub fn dir() -> Option<PathBuf> {
    match std::env::var("SMELT_KERNEL_CACHE") {
        Ok(v) if v == "0" || v.eq_ignore_ascii_case("off") => return None,
        Ok(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("smelt").join("kernels"))
}

/// 128 bits of two independent 64-bit hashes (FNV-1a and SipHash with fixed keys) of
/// `text` (a binary's identity and settings, [`binary_key`]), the driver and the device.
fn key(text: &str, driver: i32, device: &str, cc: (i32, i32)) -> String {
    let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
    let mut sip = std::hash::DefaultHasher::new();
    let meta = format!("{driver}|{device}|{}.{}|{}|", cc.0, cc.1, text.len());
    for part in [meta.as_bytes(), text.as_bytes()] {
        for &b in part {
            fnv = (fnv ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        sip.write(part);
    }
    format!("sm{}{}-{fnv:016x}{:016x}", cc.0, cc.1, sip.finish())
}

/// The driver's version (`12080` for 12.8), 0 if it cannot say.
pub fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}

/// This binary's identity (path, size, modification time, inode) and `settings` (whatever
/// else decides the generated PTX): the key of the PTX this binary generates, so a start
/// need not generate it (about half a second for the whole catalog). `None` when the
/// binary cannot be found.
pub fn binary_key(settings: &str, driver: i32, device: &str, cc: (i32, i32)) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::env::current_exe().ok()?;
    let m = std::fs::metadata(&exe).ok()?;
    let id = format!(
        "{}|{}|{}.{}|{}|{}",
        exe.display(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino(),
        settings
    );
    Some(format!("bin-{}", key(&id, driver, device, cc)))
}

/// Loads the module whose PTX `generate` makes into `ctx`: the PTX from the cache when an
/// entry for this binary and `settings` exists, else generated (and stored when the cache
/// is on); compiled by the driver either way (its JIT cache makes that fast after the first
/// time).
pub fn load(
    ctx: &Arc<CudaContext>,
    device: &str,
    cc: (i32, i32),
    settings: &str,
    generate: impl FnOnce() -> Result<String, CudaError>,
) -> Result<(Arc<CudaModule>, Loaded), CudaError> {
    let path = dir().and_then(|d| {
        binary_key(settings, driver_version(), device, cc).map(|k| d.join(format!("{k}.ptx")))
    });
    // A new build (or no cache) is what the driver has not compiled: say so before the
    // wait, which is about a minute for the whole catalog.
    let compile = |ptx: String| {
        let kept = if std::env::var_os("CUDA_CACHE_DISABLE").is_some_and(|v| v == "1") {
            "CUDA_CACHE_DISABLE=1 turns the driver's JIT cache off, so every start compiles"
        } else {
            "the driver keeps them for later starts"
        };
        eprintln!(
            "compiling the GPU kernels for {device}: about a minute at a build's first start ({kept})"
        );
        ctx.load_module(Ptx::from_src(ptx))
    };
    let Some(path) = path else {
        return Ok((compile(generate()?)?, Loaded::Uncached));
    };
    if let Ok(ptx) = std::fs::read_to_string(&path) {
        if let Ok(m) = ctx.load_module(Ptx::from_src(ptx)) {
            return Ok((m, Loaded::Hit(path)));
        }
    }
    let ptx = generate()?;
    let stored = path
        .parent()
        .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
        && {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &ptx).is_ok() && std::fs::rename(&tmp, &path).is_ok()
        };
    if stored {
        if let Some(d) = path.parent() {
            prune(d, KEEP);
        }
    }
    let m = compile(ptx)?;
    Ok((
        m,
        if stored {
            Loaded::Stored(path)
        } else {
            Loaded::Uncached
        },
    ))
}

/// Entries the cache keeps: a build's PTX is about 25 MB, and every rebuild (or setting
/// that shapes the PTX) makes a new one.
const KEEP: usize = 8;

/// Keeps the `keep` most recently written PTX entries in `dir` and removes the rest, and
/// the cubins of older smelt versions. Best effort: what cannot be read or removed stays.
fn prune(dir: &std::path::Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut ptx = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".cubin") {
            let _ = std::fs::remove_file(&p);
        } else if name.starts_with("bin-") && name.ends_with(".ptx") {
            let written = e.metadata().and_then(|m| m.modified()).ok();
            ptx.push((written, p));
        }
    }
    ptx.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, p) in ptx.into_iter().skip(keep) {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_every_input() {
        let k = key("ptx", 13000, "NVIDIA H100", (9, 0));
        assert!(k.starts_with("sm90-") && k.len() == 5 + 32, "{k}");
        assert_eq!(k, key("ptx", 13000, "NVIDIA H100", (9, 0)));
        for other in [
            key("ptx ", 13000, "NVIDIA H100", (9, 0)),
            key("ptx", 13010, "NVIDIA H100", (9, 0)),
            key("ptx", 13000, "NVIDIA H200", (9, 0)),
            key("ptx", 13000, "NVIDIA H100", (8, 9)),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn pruning_keeps_the_newest_ptx_and_drops_old_cubins() {
        let d = std::env::temp_dir().join(format!("smelt-cache-prune-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let t0 = std::time::SystemTime::now();
        for i in 0..5u64 {
            let f = std::fs::File::create(d.join(format!("bin-{i}.ptx"))).unwrap();
            f.set_modified(t0 - std::time::Duration::from_secs(100 - i))
                .unwrap();
        }
        std::fs::write(d.join("sm90-old.cubin"), b"x").unwrap();
        std::fs::write(d.join("notes.txt"), b"x").unwrap();
        prune(&d, 2);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["bin-3.ptx", "bin-4.ptx", "notes.txt"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_folder_follows_the_environment() {
        // One test, so the variables are not raced by another.
        std::env::set_var("SMELT_KERNEL_CACHE", "off");
        assert_eq!(dir(), None);
        std::env::set_var("SMELT_KERNEL_CACHE", "/x/k");
        assert_eq!(dir(), Some(PathBuf::from("/x/k")));
        std::env::remove_var("SMELT_KERNEL_CACHE");
        std::env::set_var("XDG_CACHE_HOME", "/c");
        assert_eq!(dir(), Some(PathBuf::from("/c/smelt/kernels")));
        std::env::remove_var("XDG_CACHE_HOME");
    }

    /// How long generating the whole catalog's PTX takes (what the cache saves a start).
    #[test]
    fn catalog_ptx_generation_time() {
        let t = std::time::Instant::now();
        let m = smelt_kernels::catalog::module_with(
            smelt_ptx::Target::Sm90,
            smelt_kernels::catalog::GRID_DEPS.0,
            smelt_kernels::catalog::GRID_DEPS.1,
            smelt_kernels::catalog::LAUNCH_AFTER_WAIT,
            smelt_kernels::catalog::NO_EARLY_WORK,
            false,
        )
        .expect("module");
        let ptx = m.to_ptx();
        eprintln!(
            "catalog PTX: {} bytes, generated in {:?}",
            ptx.len(),
            t.elapsed()
        );
        assert!(ptx.len() > 1000);
    }
}
