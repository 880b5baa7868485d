//! The host side of the one-shot all-reduce over peer GPU memory
//! (`smelt_kernels::allreduce`): peer access between the group's devices, each rank's
//! staging and signal areas allocated and exchanged once when the group starts, and the
//! launch. NCCL stays for the large messages and wherever peer access is missing.
//!
//! The ranks are threads of one process (one per device, [`Gpu`] each), so a device address
//! of one rank is an address the others' kernels can use once peer access is on: nothing
//! is exported or mapped. The ranks meet twice in a [`Rendezvous`]: after each has enabled
//! peer access and allocated (zeroed, synchronised) its areas, and after each has uploaded
//! the table of everyone's addresses. A rank that failed anywhere still takes part in both,
//! saying why, and then no rank uses the peer path (the choice must be the same on every
//! rank, or one would wait for an NCCL call the other never makes).
//!
//! Never NVLink multicast (`cuMulticastCreate`): plain peer loads and stores only.

use std::sync::{Arc, Barrier, Mutex};

use cudarc::driver::{sys, CudaContext, CudaSlice, LaunchConfig};
use smelt_kernels::allreduce as ar;
use smelt_kernels::allreduce_norm as arn;

use crate::{CudaError, Gpu, KernelParam};

/// What a rank tells the others at start-up.
#[derive(Clone, Debug, Default)]
struct Posted {
    /// Why this rank cannot take part (none: it can).
    refused: Option<String>,
    staging: u64,
    signal: u64,
}

/// Where the ranks of one group meet at start-up: made once, shared by every rank's thread.
pub struct Rendezvous {
    n: usize,
    barrier: Barrier,
    posted: Mutex<Vec<Posted>>,
}

impl Rendezvous {
    pub fn new(n_ranks: usize) -> Arc<Rendezvous> {
        Arc::new(Rendezvous {
            n: n_ranks,
            barrier: Barrier::new(n_ranks),
            posted: Mutex::new(vec![Posted::default(); n_ranks]),
        })
    }

    fn post(&self, rank: usize, p: Posted) {
        if let Ok(mut v) = self.posted.lock() {
            if let Some(slot) = v.get_mut(rank) {
                *slot = p;
            }
        }
    }

    fn all(&self) -> Vec<Posted> {
        self.posted.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// One meeting: posts `p` as `rank`'s and returns every rank's post, after every rank
    /// has read them. The second barrier matters: without it a fast rank went on to the
    /// next meeting and overwrote its slot (addresses zeroed) before a slower rank had read
    /// it, whose table then sent its kernel to address 0 (`CUDA_ERROR_ILLEGAL_ADDRESS` on
    /// 4 GPUs and inside the engine on 2, 4x H100 run of 2026-11-27 04:05).
    fn meet(&self, rank: usize, p: Posted) -> Vec<Posted> {
        self.post(rank, p);
        self.barrier.wait();
        let all = self.all();
        self.barrier.wait();
        all
    }
}

/// Zeroed device memory from `cuMemAlloc`, for the areas the peers write. cudarc allocates
/// from the device's stream-ordered pool (`cuMemAllocAsync`), and `cuCtxEnablePeerAccess`
/// does not open pool memory to peers (that takes `cuMemPoolSetAccess`): the first run on
/// two H100s faulted with `CUDA_ERROR_ILLEGAL_ADDRESS` on its first flag
/// (bench/RESULTS.md, 2026-11-27).
struct PeerBuf {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl PeerBuf {
    fn zeroed(gpu: &Gpu, bytes: usize) -> Result<PeerBuf, String> {
        let ctx = gpu.context().clone();
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: the context is current; the allocation is freed once, on drop.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes) }
            .map_err(|e| format!("cuMemAlloc of {bytes} bytes: {e}"))?;
        let buf = PeerBuf { ptr, ctx };
        // SAFETY: `ptr` holds `bytes` bytes on this context's device.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0, bytes) }
            .map_err(|e| format!("cuMemsetD8: {e}"))?;
        Ok(buf)
    }
}

impl Drop for PeerBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `cuMemAlloc` in this context, freed only here. Any kernel
            // using it was launched on a stream the owner synchronises before dropping.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

/// One rank's part of a peer all-reduce group.
pub struct PeerReduce {
    gpu: Arc<Gpu>,
    pub rank: usize,
    pub n_ranks: usize,
    /// Largest message in floats.
    pub cap: usize,
    name: String,
    /// The fused all-reduce + add + norm + quantize kernel's name (`arn::kernel`).
    norm_name: String,
    _staging: PeerBuf,
    signal: PeerBuf,
    table: CudaSlice<u64>,
    /// The peers' contexts, kept while peer access to them is in use.
    _peers: Vec<Arc<CudaContext>>,
}

// SAFETY: the buffers are device allocations owned here, used only through their addresses
// on the owning rank's stream; the contexts are driver handles cudarc shares across threads.
unsafe impl Send for PeerReduce {}
// SAFETY: as above; nothing here is mutated after start-up.
unsafe impl Sync for PeerReduce {}

/// Turns on access from `gpu`'s context to every other device of `ordinals`.
fn enable_peer_access(gpu: &Gpu, ordinals: &[usize]) -> Result<Vec<Arc<CudaContext>>, String> {
    let me = gpu.context();
    let mut peers = Vec::new();
    for &o in ordinals.iter().filter(|&&o| o != gpu.ordinal()) {
        let at = crate::visible::driver_ordinal(o).map_err(|e| format!("cuda:{o}: {e}"))?;
        let peer = CudaContext::new(at).map_err(|e| format!("cuda:{o}: {e}"))?;
        let mut can = 0;
        // SAFETY: both are valid device handles of this driver.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, me.cu_device(), peer.cu_device()) }
            .result()
            .map_err(|e| format!("cuDeviceCanAccessPeer: {e}"))?;
        if can == 0 {
            return Err(format!(
                "cuda:{} cannot access cuda:{o}'s memory (no peer path between them)",
                gpu.ordinal()
            ));
        }
        me.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: the current context is this rank's; `peer` is a live primary context.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            return Err(format!(
                "cuCtxEnablePeerAccess cuda:{} -> cuda:{o}: {r:?}",
                gpu.ordinal()
            ));
        }
        peers.push(peer);
    }
    me.bind_to_thread().map_err(|e| e.to_string())?;
    Ok(peers)
}

impl PeerReduce {
    /// Starts rank `rank` of a group over the devices `ordinals` (rank order) for messages
    /// of up to `cap` floats; every rank's thread calls it, at the same point, with the same
    /// `rv`. `gpu` is `None` for a rank that failed before it had a device: it takes part
    /// only to refuse. `Err(why)`: the group runs without the peer path (no peer
    /// access between some two devices, a group size without a kernel, ...).
    pub fn start(
        gpu: Option<&Arc<Gpu>>,
        rank: usize,
        ordinals: &[usize],
        cap: usize,
        rv: &Rendezvous,
    ) -> Result<PeerReduce, String> {
        let n = rv.n;
        let cap = cap.div_ceil(4) * 4;
        let local = (|| -> Result<_, String> {
            let gpu = gpu.ok_or_else(|| format!("rank {rank} did not load"))?;
            let name = ar::name(n).ok_or_else(|| format!("no one-shot kernel for {n} ranks"))?;
            let norm_name = arn::name(n).ok_or_else(|| format!("no fused kernel for {n} ranks"))?;
            if n > ar::MAX_RANKS || ordinals.len() != n {
                return Err(format!("{n} ranks over {} devices", ordinals.len()));
            }
            gpu.function(&name).map_err(|e| e.to_string())?;
            gpu.function(&norm_name).map_err(|e| e.to_string())?;
            let peers = enable_peer_access(gpu, ordinals)?;
            let staging = PeerBuf::zeroed(gpu, 4 * ar::staging_floats(n, cap))?;
            let signal = PeerBuf::zeroed(gpu, 4 * ar::SIGNAL_WORDS)?;
            // The zeros are in place before any peer may write a flag.
            gpu.synchronize().map_err(|e| e.to_string())?;
            Ok((gpu.clone(), (name, norm_name), peers, staging, signal))
        })();
        let all = rv.meet(
            rank,
            match &local {
                Ok((_, _, _, staging, signal)) => Posted {
                    refused: None,
                    staging: staging.ptr,
                    signal: signal.ptr,
                },
                Err(why) => Posted {
                    refused: Some(why.clone()),
                    ..Posted::default()
                },
            },
        );
        let refused = all
            .iter()
            .enumerate()
            .find_map(|(r, p)| p.refused.as_ref().map(|w| format!("rank {r}: {w}")));
        // An address of 0 would send the kernel there: never start with one.
        let refused = refused.or_else(|| {
            all.iter()
                .position(|p| p.staging == 0 || p.signal == 0)
                .map(|r| format!("rank {r} posted no address"))
        });
        let made = match (local, refused) {
            (Ok((gpu, (name, norm_name), peers, staging, signal)), None) => {
                let mut table: Vec<u64> = all.iter().map(|p| p.staging).collect();
                table.extend(all.iter().map(|p| p.signal));
                gpu.upload(&table)
                    .and_then(|t| gpu.synchronize().map(|_| t))
                    .map(|table| PeerReduce {
                        gpu,
                        rank,
                        n_ranks: n,
                        cap,
                        name,
                        norm_name,
                        _staging: staging,
                        signal,
                        table,
                        _peers: peers,
                    })
                    .map_err(|e| e.to_string())
            }
            (_, Some(why)) => Err(why),
            (Err(why), None) => Err(why),
        };
        // Second meeting: every table is uploaded (or the group knows one failed).
        let late = rv
            .meet(
                rank,
                Posted {
                    refused: made.as_ref().err().cloned(),
                    ..Posted::default()
                },
            )
            .iter()
            .enumerate()
            .find_map(|(r, p)| p.refused.as_ref().map(|w| format!("rank {r}: {w}")));
        match (made, late) {
            (Ok(p), None) => Ok(p),
            (_, Some(why)) => Err(why),
            (Err(why), None) => Err(why),
        }
    }

    /// Whether the kernel takes `n` floats at `ptr`.
    pub fn can_take(&self, n: usize, ptr: u64) -> bool {
        ar::eligible(n, ptr, self.cap)
    }

    /// The kernel's name (the group size's).
    pub fn kernel_name(&self) -> &str {
        &self.name
    }

    /// The kernel's arguments for a tensor of `n` floats at `x` (check [`Self::can_take`]).
    pub fn args(&self, x: u64, n: usize) -> ar::AllReduceArgs {
        ar::AllReduceArgs {
            x,
            n4: (n / 4) as u32,
            table: self.gpu.ptr(&self.table),
            signal: self.signal.ptr,
            rank: self.rank as u32,
            cap4: (self.cap / 4) as u32,
        }
    }

    /// The fused kernel's name (`smelt_kernels::allreduce_norm`, the group size's).
    pub fn norm_kernel_name(&self) -> &str {
        &self.norm_name
    }

    /// Whether the fused kernel takes `rows` rows of `n` floats with partials at `y`.
    pub fn can_take_rows(&self, rows: usize, n: usize, y: u64) -> bool {
        arn::eligible(rows, n, y, self.cap)
    }

    /// The fused kernel's arguments: `rows` partial rows of `n` floats at `y` summed over
    /// the group (in place), added into the residual `x`, normalised with weights `w` into
    /// `out` and quantized into `q` (check [`Self::can_take_rows`]).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_args(
        &self,
        y: u64,
        x: u64,
        w: u64,
        out: u64,
        q: u64,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> arn::AllReduceNormArgs {
        arn::AllReduceNormArgs {
            y,
            x,
            w,
            out,
            q,
            n: n as u32,
            ntiles: n.div_ceil(smelt_kernels::TILE) as u32,
            eps,
            rows: rows as u32,
            table: self.gpu.ptr(&self.table),
            signal: self.signal.ptr,
            rank: self.rank as u32,
            cap4: (self.cap / 4) as u32,
        }
    }

    /// The fused kernel on this rank's stream (the check binary's way; the engine launches
    /// through its backend).
    ///
    /// # Safety
    /// The pointers must hold what [`Self::norm_args`] says on this rank's device, `out`
    /// apart from `x` and `y`, and every rank must make the same sequence of calls.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_add_norm(
        &self,
        y: u64,
        x: u64,
        w: u64,
        out: u64,
        q: u64,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        if !self.can_take_rows(rows, n, y) {
            return Err(CudaError::BadLength {
                what: "fused peer all-reduce (rows per block, whole q8_1 blocks, aligned, within the staging)",
                got: rows * n,
                want: self.cap,
            });
        }
        let f = self.gpu.function(&self.norm_name)?;
        let params: Vec<KernelParam> = self
            .norm_args(y, x, w, out, q, rows, n, eps)
            .values()
            .into_iter()
            .map(KernelParam::from)
            .collect();
        // SAFETY: the parameters are the kernel's; the caller vouches for the pointers.
        unsafe { self.launch_params(&f, arn::launch(n), params) }
    }

    /// Launches `f` with `params` (and the timeline slot when the module has one).
    unsafe fn launch_params(
        &self,
        f: &cudarc::driver::CudaFunction,
        l: smelt_kernels::ops::Launch,
        mut params: Vec<KernelParam>,
    ) -> Result<(), CudaError> {
        if self.gpu.timeline() {
            params.push(KernelParam::P(0));
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_bytes,
        };
        // SAFETY: the caller passes the kernel's parameters.
        unsafe { self.gpu.launch(f, cfg, &params) }
    }

    /// Sums `n` floats at `x` over the group, in place, on this rank's stream (the check
    /// binary's way; the engine launches through its backend).
    ///
    /// # Safety
    /// `x` must hold `n` floats on this rank's device, and every rank must make the same
    /// sequence of calls (each waits for the others).
    pub unsafe fn all_reduce(&self, x: u64, n: usize) -> Result<(), CudaError> {
        if !self.can_take(n, x) {
            return Err(CudaError::BadLength {
                what:
                    "peer all-reduce (16-byte aligned, a multiple of 4 floats, within the staging)",
                got: n,
                want: self.cap,
            });
        }
        let f = self.gpu.function(&self.name)?;
        let l = ar::launch();
        let mut params: Vec<KernelParam> = self
            .args(x, n)
            .values()
            .into_iter()
            .map(KernelParam::from)
            .collect();
        if self.gpu.timeline() {
            params.push(KernelParam::P(0));
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_bytes,
        };
        // SAFETY: the parameters are the kernel's (`AllReduceArgs`, then the timeline slot
        // when the module has one); the caller vouches for `x`.
        unsafe { self.gpu.launch(&f, cfg, &params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meeting_returns_every_ranks_post_even_when_the_next_one_follows_at_once() {
        // Each rank meets twice back to back, as `PeerReduce::start` does; the first
        // meeting's addresses must reach every rank whole. Before `meet` had its second
        // barrier, a fast rank's second post could zero its slot before a slow rank read
        // the first: 8 threads, 200 rounds found it.
        for _ in 0..200 {
            let n = 8;
            let rv = Rendezvous::new(n);
            let got: Vec<Vec<u64>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let rv = rv.clone();
                        s.spawn(move || {
                            let first = rv.meet(
                                r,
                                Posted {
                                    refused: None,
                                    staging: 100 + r as u64,
                                    signal: 200 + r as u64,
                                },
                            );
                            let second = rv.meet(r, Posted::default());
                            assert!(second.iter().all(|p| p.staging == 0));
                            first.iter().map(|p| p.staging).collect::<Vec<u64>>()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("rank")).collect()
            });
            let want: Vec<u64> = (0..n as u64).map(|r| 100 + r).collect();
            for (r, g) in got.iter().enumerate() {
                assert_eq!(g, &want, "rank {r} read another meeting's posts");
            }
        }
    }
}
