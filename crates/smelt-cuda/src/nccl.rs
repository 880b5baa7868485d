//! NCCL, loaded at run time: the all-reduce (and gather, broadcast) of tensor parallelism.
//!
//! The types are cudarc's (`cudarc::nccl::sys`); the library is opened here rather than by
//! cudarc's loader, which looks only for `libnccl.so` and `libnccl.so.<CUDA major>` and so
//! never finds the `libnccl.so.2` that PyTorch's environment ships (the `nvidia-nccl-cu13`
//! wheel: `site-packages/nvidia/nccl/lib/libnccl.so.2`). Nothing is needed to build.
//!
//! Where the library is looked for, in order (the first that loads wins):
//! 1. `SMELT_NCCL`: the library file, or a folder holding `libnccl.so.2`;
//! 2. each folder of `LD_LIBRARY_PATH`;
//! 3. the system's search (`ldconfig`'s cache, `/usr/lib/...`);
//! 4. the `nvidia/nccl/lib` (and `torch/lib`) folders of Python environments: `VIRTUAL_ENV`,
//!    `CONDA_PREFIX`, `/usr/local/lib/python3*`, `/usr/lib/python3*`, `/opt/conda`,
//!    `~/.local/lib/python3*`.
//!
//! NVLink multicast (NVLS) stays off: `NCCL_NVLS_ENABLE=0` is set before the library is
//! opened (whatever the caller's environment says), and nothing here calls
//! `cuMulticastCreate`: a program that uses multicast can take a shared host's GPUs out of
//! service.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};

use crate::CudaError;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
type CommInitAll = unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> ncclResult_t;
type CommInitRank =
    unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t;
type CommDestroy = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type ErrorString = unsafe extern "C" fn(ncclResult_t) -> *const c_char;

/// The loaded library and the entry points smelt uses.
pub struct Nccl {
    /// Where it was loaded from.
    pub path: PathBuf,
    /// `ncclGetVersion`: major * 10000 + minor * 100 + patch.
    pub version: i32,
    get_unique_id: GetUniqueId,
    comm_init_all: CommInitAll,
    comm_init_rank: CommInitRank,
    comm_destroy: CommDestroy,
    all_reduce: AllReduce,
    all_gather: AllGather,
    broadcast: Broadcast,
    error_string: ErrorString,
    _lib: libloading::Library,
}

/// The file name NCCL's packages install.
pub const LIB_NAME: &str = "libnccl.so.2";

/// Candidate paths of the library, in the order they are tried (see the module docs).
pub fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("SMELT_NCCL") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.push(p.join(LIB_NAME));
        } else {
            out.push(p);
        }
    }
    if let Some(lp) = std::env::var_os("LD_LIBRARY_PATH") {
        for dir in std::env::split_paths(&lp) {
            if !dir.as_os_str().is_empty() {
                out.push(dir.join(LIB_NAME));
            }
        }
    }
    // A bare name: the system's own search.
    out.push(PathBuf::from(LIB_NAME));
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(v));
        }
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    prefixes.push("/opt/conda".into());
    if let Some(h) = std::env::var_os("HOME") {
        prefixes.push(Path::new(&h).join(".local"));
    }
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        // Newest Python first.
        for py in pys.iter().rev() {
            for site in ["site-packages", "dist-packages"] {
                out.push(py.join(site).join("nvidia/nccl/lib").join(LIB_NAME));
                out.push(py.join(site).join("torch/lib").join(LIB_NAME));
            }
        }
    }
    out
}

fn is_bare(p: &Path) -> bool {
    p.components().count() == 1
}

/// NCCL, loaded once per process; the error lists every place that was tried.
pub fn nccl() -> Result<&'static Nccl, CudaError> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::Init(e.clone()))
}

fn load() -> Result<Nccl, String> {
    // Before any NCCL call (and before the rank threads start): NVLS must be off.
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let mut tried = Vec::new();
    for path in candidates() {
        if !is_bare(&path) && !path.is_file() {
            continue;
        }
        // SAFETY: NCCL's initialisers are safe to run.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return bind(lib, path),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "NCCL ({LIB_NAME}) not found: set SMELT_NCCL to the library (PyTorch's environment \
         has it under site-packages/nvidia/nccl/lib), or add its folder to LD_LIBRARY_PATH. \
         Tried: {}",
        if tried.is_empty() {
            "the system's search path and Python environments".to_string()
        } else {
            tried.join(", ")
        }
    ))
}

fn bind(lib: libloading::Library, path: PathBuf) -> Result<Nccl, String> {
    // SAFETY: the signatures are NCCL's (nccl.h, 2.18 and later).
    unsafe {
        fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
            // SAFETY: the caller names the symbol's type.
            unsafe {
                lib.get::<T>(name.as_bytes())
                    .map(|s| *s)
                    .map_err(|e| format!("NCCL has no {name}: {e}"))
            }
        }
        let get_version: GetVersion = sym(&lib, "ncclGetVersion")?;
        let mut version = 0;
        let r = get_version(&mut version);
        if r != ncclResult_t::ncclSuccess {
            return Err(format!("ncclGetVersion failed: {r:?}"));
        }
        Ok(Nccl {
            version,
            get_unique_id: sym(&lib, "ncclGetUniqueId")?,
            comm_init_all: sym(&lib, "ncclCommInitAll")?,
            comm_init_rank: sym(&lib, "ncclCommInitRank")?,
            comm_destroy: sym(&lib, "ncclCommDestroy")?,
            all_reduce: sym(&lib, "ncclAllReduce")?,
            all_gather: sym(&lib, "ncclAllGather")?,
            broadcast: sym(&lib, "ncclBroadcast")?,
            error_string: sym(&lib, "ncclGetErrorString")?,
            path,
            _lib: lib,
        })
    }
}

impl Nccl {
    fn check(&self, what: &str, r: ncclResult_t) -> Result<(), CudaError> {
        if r == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string.
        let msg = unsafe {
            let p = (self.error_string)(r);
            if p.is_null() {
                format!("{r:?}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(CudaError::Init(format!("{what}: {msg}")))
    }

    /// The version as `2.27.3`.
    pub fn version_string(&self) -> String {
        let v = self.version;
        let (major, rest) = if v >= 10000 {
            (v / 10000, v % 10000)
        } else {
            (v / 1000, v % 1000)
        };
        format!("{major}.{}.{}", rest / 100, rest % 100)
    }

    /// A fresh id for [`Comm::init_rank`] (one per group, shared by its ranks).
    pub fn unique_id(&self) -> Result<ncclUniqueId, CudaError> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: id is a valid out pointer.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }
}

/// One rank's communicator. Each rank's thread uses its own; calls enqueue on the given
/// stream (and are captured into a CUDA graph like any launch).
pub struct Comm {
    raw: ncclComm_t,
    pub rank: usize,
    pub n_ranks: usize,
    nccl: &'static Nccl,
}

// SAFETY: a communicator may be used from any thread, one at a time (NCCL's rule); smelt
// gives each to one rank thread.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    /// Communicators for the devices `ordinals` of this process, rank `i` on `ordinals[i]`
    /// (`ncclCommInitAll`).
    pub fn init_all(ordinals: &[usize]) -> Result<Vec<Comm>, CudaError> {
        let nccl = nccl()?;
        let n = ordinals.len();
        let devs: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut raw: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
        // SAFETY: arrays of n elements.
        nccl.check("ncclCommInitAll", unsafe {
            (nccl.comm_init_all)(raw.as_mut_ptr(), n as c_int, devs.as_ptr())
        })?;
        Ok(raw
            .into_iter()
            .enumerate()
            .map(|(rank, raw)| Comm {
                raw,
                rank,
                n_ranks: n,
                nccl,
            })
            .collect())
    }

    /// Joins a group of `n` ranks as `rank` (`ncclCommInitRank`; blocks until all have
    /// joined). The calling thread's current CUDA context picks the device.
    pub fn init_rank(id: ncclUniqueId, rank: usize, n: usize) -> Result<Comm, CudaError> {
        let nccl = nccl()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: raw is a valid out pointer.
        nccl.check("ncclCommInitRank", unsafe {
            (nccl.comm_init_rank)(&mut raw, n as c_int, id, rank as c_int)
        })?;
        Ok(Comm {
            raw,
            rank,
            n_ranks: n,
            nccl,
        })
    }

    /// In-place sum of `count` f32 at device address `ptr` over the ranks, on `stream`.
    ///
    /// # Safety
    /// `ptr` must hold `count` f32 on this rank's device, valid until the stream reaches it.
    pub unsafe fn all_reduce_f32(
        &self,
        ptr: u64,
        count: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        let p = ptr as *mut c_void;
        // SAFETY: as the caller promises.
        self.nccl.check("ncclAllReduce", unsafe {
            (self.nccl.all_reduce)(
                p,
                p,
                count,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                self.raw,
                stream as cudaStream_t,
            )
        })
    }

    /// Every rank's `count` f32 at `send` into `recv` (`n_ranks * count`, rank order).
    ///
    /// # Safety
    /// Device addresses of this rank, of the sizes said.
    pub unsafe fn all_gather_f32(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: as the caller promises.
        self.nccl.check("ncclAllGather", unsafe {
            (self.nccl.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                ncclDataType_t::ncclFloat32,
                self.raw,
                stream as cudaStream_t,
            )
        })
    }

    /// `count` 32-bit words at `ptr` from rank `root` to every rank.
    ///
    /// # Safety
    /// `ptr` holds `count` words on this rank's device.
    pub unsafe fn broadcast_u32(
        &self,
        ptr: u64,
        count: usize,
        root: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        let p = ptr as *mut c_void;
        // SAFETY: as the caller promises.
        self.nccl.check("ncclBroadcast", unsafe {
            (self.nccl.broadcast)(
                p,
                p,
                count,
                ncclDataType_t::ncclUint32,
                root as c_int,
                self.raw,
                stream as cudaStream_t,
            )
        })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator is ours and used no more.
        unsafe { (self.nccl.comm_destroy)(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_honour_the_override_and_ld_library_path_first() {
        // Read-only checks on the list's order (no library is loaded).
        let c = candidates();
        let bare = c.iter().position(|p| is_bare(p)).expect("bare name");
        assert!(c[..bare]
            .iter()
            .all(|p| p.file_name().is_some_and(|n| n == LIB_NAME)
                || std::env::var_os("SMELT_NCCL").is_some()));
        assert!(c[bare + 1..]
            .iter()
            .all(|p| p.to_string_lossy().contains("/lib/python3")));
    }

    #[test]
    fn missing_library_is_an_error_not_a_panic() {
        // On a machine without NCCL (CI), loading fails with the advice; with it, loads.
        match nccl() {
            Ok(n) => assert!(n.version >= 21800, "NCCL {}", n.version_string()),
            Err(e) => assert!(e.to_string().contains("SMELT_NCCL"), "{e}"),
        }
        assert_eq!(
            std::env::var("NCCL_NVLS_ENABLE").as_deref(),
            Ok("0"),
            "NVLS must be off once NCCL was looked for"
        );
    }
}
