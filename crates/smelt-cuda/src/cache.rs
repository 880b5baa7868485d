//! Compiled kernel modules cached across runs: the driver JIT-compiles smelt's PTX (every
//! kernel of the catalog) when a process opens a GPU, which costs seconds at every start.
//! The first run links the PTX into a cubin with the driver's own linker (`cuLink*`, the
//! same JIT `cuModuleLoadData` runs on PTX) and stores it; later runs load the cubin, which
//! takes milliseconds. The key is a hash of the PTX text, the driver version and the device
//! (name and compute capability), so a new driver, another GPU or any kernel change makes a
//! new entry and never loads a stale one. A second entry keyed by the binary itself (path,
//! size, modification time, inode) and the settings that shape the PTX lets a start skip
//! generating the PTX as well.
//!
//! Where: `$SMELT_KERNEL_CACHE` (a folder; `0` or `off` turns the cache off), else
//! `$XDG_CACHE_HOME/smelt/kernels`, else `~/.cache/smelt/kernels`. A file that cannot be
//! read, written or loaded is only a miss: the PTX path always works.

use std::hash::Hasher;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::CudaError;

/// How a module was loaded, for the start-up log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// From a cached cubin at this path.
    Hit(PathBuf),
    /// Compiled from PTX and stored at this path.
    Stored(PathBuf),
    /// Compiled from PTX; not cached (off, or the cache folder is not writable).
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
/// everything that decides the compiled code.
pub fn key(ptx: &str, driver: i32, device: &str, cc: (i32, i32)) -> String {
    let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
    let mut sip = std::hash::DefaultHasher::new();
    let meta = format!("{driver}|{device}|{}.{}|{}|", cc.0, cc.1, ptx.len());
    for part in [meta.as_bytes(), ptx.as_bytes()] {
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
/// else decides the generated PTX): the key of a cubin that can be loaded without
/// generating the PTX at all (about half a second for the whole catalog). `None` when the
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

/// Loads the module whose PTX `generate` makes into `ctx`: from the cache when an entry
/// for this binary and `settings`, or for the PTX's own hash, exists; else compiled from
/// the PTX (and stored when the cache is on).
pub fn load(
    ctx: &Arc<CudaContext>,
    device: &str,
    cc: (i32, i32),
    settings: &str,
    generate: impl FnOnce() -> Result<String, CudaError>,
) -> Result<(Arc<CudaModule>, Loaded), CudaError> {
    let Some(dir) = dir() else {
        return Ok((
            ctx.load_module(Ptx::from_src(generate()?))?,
            Loaded::Uncached,
        ));
    };
    let driver = driver_version();
    let try_load = |path: &PathBuf| {
        let bytes = std::fs::read(path).ok()?;
        ctx.load_module(Ptx::from_binary(bytes)).ok()
    };
    let by_binary =
        binary_key(settings, driver, device, cc).map(|k| dir.join(format!("{k}.cubin")));
    if let Some(p) = &by_binary {
        if let Some(m) = try_load(p) {
            return Ok((m, Loaded::Hit(p.clone())));
        }
    }
    let ptx = generate()?;
    let path = dir.join(format!("{}.cubin", key(&ptx, driver, device, cc)));
    let store = |cubin: &[u8], at: &PathBuf| {
        let tmp = at.with_extension(format!("tmp{}", std::process::id()));
        std::fs::create_dir_all(&dir).is_ok()
            && std::fs::write(&tmp, cubin).is_ok()
            && std::fs::rename(&tmp, at).is_ok()
    };
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(m) = ctx.load_module(Ptx::from_binary(bytes.clone())) {
            if let Some(b) = &by_binary {
                store(&bytes, b);
            }
            return Ok((m, Loaded::Hit(path)));
        }
    }
    ctx.bind_to_thread()?;
    let cubin = match link(&ptx) {
        Ok(c) => c,
        // The linker refused what the loader may take: load the PTX as before.
        Err(_) => return Ok((ctx.load_module(Ptx::from_src(ptx))?, Loaded::Uncached)),
    };
    let m = ctx.load_module(Ptx::from_binary(cubin.clone()))?;
    let stored = store(&cubin, &path);
    if let Some(b) = &by_binary {
        store(&cubin, b);
    }
    Ok((
        m,
        if stored {
            Loaded::Stored(path)
        } else {
            Loaded::Uncached
        },
    ))
}

/// PTX to a cubin for the current context's device with the driver's linker.
fn link(ptx: &str) -> Result<Vec<u8>, CudaError> {
    let src =
        std::ffi::CString::new(ptx).map_err(|_| CudaError::Init("PTX with a NUL byte".into()))?;
    let name = c"smelt.ptx";
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: no options; `state` is written by the driver and destroyed below; the cubin
    // it returns belongs to `state` and is copied out before the destroy.
    unsafe {
        sys::cuLinkCreate_v2(0, std::ptr::null_mut(), std::ptr::null_mut(), &mut state).result()?;
        let r = (|| {
            sys::cuLinkAddData_v2(
                state,
                sys::CUjitInputType::CU_JIT_INPUT_PTX,
                src.as_ptr() as *mut std::ffi::c_void,
                src.as_bytes_with_nul().len(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .result()?;
            let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
            let mut size = 0usize;
            sys::cuLinkComplete(state, &mut out, &mut size).result()?;
            Ok(std::slice::from_raw_parts(out.cast::<u8>(), size).to_vec())
        })();
        let _ = sys::cuLinkDestroy(state);
        r
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

    /// How long generating the whole catalog's PTX takes (the part of a start-up the cache
    /// cannot skip, since the key hashes it).
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
        let gen = t.elapsed();
        let t = std::time::Instant::now();
        let k = key(&ptx, 13000, "NVIDIA H100", (9, 0));
        eprintln!(
            "catalog PTX: {} bytes, generated in {:?}, hashed in {:?} ({k})",
            ptx.len(),
            gen,
            t.elapsed()
        );
        assert!(ptx.len() > 1000);
    }
}
