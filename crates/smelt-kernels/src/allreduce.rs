//! The one-shot all-reduce of tensor parallelism over peer-to-peer GPU memory (NVLink):
//! a decode step's all-reduces are 8-16 KB each, two per layer, and NCCL spends ~8 us on
//! each (bench/RESULTS.md, issue 19), most of a 2-GPU step's gain. vLLM's and TensorRT-LLM's
//! custom all-reduces answer with one kernel that moves the data and synchronises through
//! flags in peer memory; this is smelt's, written from the same idea (no code shared).
//!
//! Every rank owns, in its device memory, registered once when the group starts:
//! - a staging area `[2 parities][n_ranks sources][cap floats]` its peers write into;
//! - a signal area: `flags[BLOCKS][MAX_RANKS]` u32 its peers write (block `b` of rank `r`
//!   writes `flags[b][r]`), then `counters[BLOCKS]`, its own per-block call counters.
//!
//! One call, in every block `b` of a fixed grid of [`BLOCKS`] (the same grid every call:
//! a block's index set and its counter are then the same from call to call):
//! 1. `flag = counters[b] + 1`, `parity = flag & 1`;
//! 2. push: the block's grid-stride share of `x` is stored into every peer's staging
//!    `[parity][my rank]` (remote stores over NVLink);
//! 3. barrier: `bar.sync`, then thread `p` (for each peer `p`) stores `flag` into peer
//!    `p`'s `flags[b][my rank]` with `st.release.sys` (the block's pushes become visible
//!    before the flag) and spins with `ld.acquire.sys` on its own `flags[b][p]` until it
//!    holds at least `flag` (wrapping compare: a peer may already be one call ahead);
//!    `bar.sync`;
//! 4. reduce: `x[i] = sum over ranks 0, 1, ... in that order` of the rank's value (its own
//!    from `x`, the others' from its staging), so every rank gets the same bits;
//! 5. thread 0 stores `counters[b] = flag`.
//!
//! A peer that never arrives makes the kernel fault after [`SPIN_LIMIT`] polls (the step
//! then fails with a launch error) instead of hanging the GPU.
//!
//! No barrier at the end: the two parities let a rank run one call ahead of a peer (it
//! writes the other parity); it cannot run two ahead, since the next call's barrier waits
//! for the peer, and the peer's next kernel starts only after its previous one ended.
//! Everything that changes per call lives in device memory, so the kernel can be captured
//! in a CUDA graph and replayed. No NVLink multicast anywhere.

use smelt_ptx::{Cmp, Kernel, Load, LoadCache, Reg, Scope, Sem, Store, F32, S32, U32, U64};

use crate::catalog::Entry;
use crate::ops::{kernel_params, Launch};

/// Most ranks a group may have (the flag rows are this wide).
pub const MAX_RANKS: usize = 8;
/// Blocks of every launch (fixed: see the module doc).
pub const BLOCKS: u32 = 32;
/// Threads per block.
pub const THREADS: u32 = 512;
/// u32 words of a rank's signal area: the flags, then the counters.
pub const SIGNAL_WORDS: usize = BLOCKS as usize * MAX_RANKS + BLOCKS as usize;
/// Polls of a peer's flag before the kernel gives up with a fault (`trap`): about 2^25
/// system-scope loads, seconds, far beyond any real wait (a step takes milliseconds).
pub const SPIN_LIMIT: u32 = 1 << 25;
/// Group sizes a kernel is emitted for.
pub const RANKS: [usize; 3] = [2, 4, 8];

/// Largest message (bytes) the one-shot kernel takes by default for `n_ranks` ranks; larger
/// ones go to NCCL. Each rank reads `n_ranks - 1` remote copies' worth through its links,
/// so the crossover falls as the group grows (vLLM's one-shot limits fall the same way).
/// The engine's default (the peer path is on unless `SMELT_TP_PEER=0`);
/// `SMELT_TP_PEER_MAX` overrides it.
pub fn default_max_bytes(n_ranks: usize) -> usize {
    match n_ranks {
        0 | 1 => 0,
        2 => 1 << 20,
        3 | 4 => 512 << 10,
        _ => 256 << 10,
    }
}

/// Floats of a rank's staging area for messages of up to `cap` floats.
pub fn staging_floats(n_ranks: usize, cap: usize) -> usize {
    2 * n_ranks * cap
}

/// The kernel's name for a group of `n_ranks`; `None` for sizes without one.
pub fn name(n_ranks: usize) -> Option<String> {
    RANKS
        .contains(&n_ranks)
        .then(|| format!("allreduce_oneshot_r{n_ranks}"))
}

/// Whether the kernel can take a tensor of `n` floats at address `ptr` with staging for
/// `cap` floats: whole 16-byte vectors, aligned, fitting the staging.
pub fn eligible(n: usize, ptr: u64, cap: usize) -> bool {
    n > 0 && n % 4 == 0 && ptr % 16 == 0 && n <= cap && cap % 4 == 0
}

/// The launch (fixed for every size).
pub fn launch() -> Launch {
    Launch::new((BLOCKS, 1, 1), (THREADS, 1, 1))
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    RANKS
        .iter()
        .filter_map(|&n| {
            let name = name(n)?;
            Some((
                name,
                Box::new(move |k: &Kernel| kernel(k, n)) as Box<dyn Fn(&Kernel)>,
            ))
        })
        .collect()
}

kernel_params! {
    /// Arguments of [`kernel`].
    AllReduceArgs, AllReduceRegs {
        /// The tensor, summed in place (16-byte aligned).
        x: Ptr,
        /// Its length in 16-byte vectors (floats / 4), at most `cap4`.
        n4: U32,
        /// `u64[2 * n_ranks]`: every rank's staging address, then every rank's signal address.
        table: Ptr,
        /// This rank's signal area.
        signal: Ptr,
        /// This rank's index in the group.
        rank: U32,
        /// Each staging slot's length in 16-byte vectors.
        cap4: U32,
    }
}

/// What one block of a one-shot call knows after [`begin`]: its call's flag and parity,
/// where its counter lives, and the byte length of a staging slot.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    pub flag: Reg<U32>,
    pub parity: Reg<U32>,
    pub slot_bytes: Reg<U32>,
    ctr: Reg<U64>,
}

/// Byte offset of the counters in a signal area.
const COUNTERS: i64 = (BLOCKS as usize * MAX_RANKS * 4) as i64;

/// Step 1 of the module doc for this block: its call counter, the call's flag and parity.
pub(crate) fn begin(k: &Kernel, signal: Reg<U64>, cap4: Reg<U32>) -> Call {
    let b = k.ctaid_x();
    let ctr = k.elem_addr(signal, b, 4);
    let count = k.load::<U32>(Load::GLOBAL.cache(LoadCache::Cg), ctr.at(COUNTERS));
    let flag = k.add(k.reg(), count, 1u32);
    let parity = k.and(k.reg(), flag, 1u32);
    let slot_bytes = k.shl(k.reg(), cap4, 4u32);
    Call {
        flag,
        parity,
        slot_bytes,
        ctr,
    }
}

/// Where this rank's share lands in every peer's staging (slot `[parity][rank]`), one
/// address per rank of the group (this rank's own entry unused).
pub(crate) fn push_targets(
    k: &Kernel,
    call: &Call,
    table: Reg<U64>,
    rank: Reg<U32>,
    n_ranks: usize,
) -> Vec<Reg<U64>> {
    let my_slot = k.mad(k.reg(), call.parity, n_ranks as u32, rank);
    let my_off = k.mul_wide(k.reg::<U64>(), my_slot, call.slot_bytes);
    // `p == rank` is tested where it is used: eight predicates live across the loops would
    // not fit the hardware's seven (ptxas spills them).
    (0..n_ranks)
        .map(|p| {
            let base = k.load::<U64>(Load::GLOBAL_NC, table.at(8 * p as i64));
            k.add(base, base, my_off)
        })
        .collect()
}

/// Stores the 16-byte vector `v` (vector index `i` of the message) into every peer's slot.
pub(crate) fn push_vec(
    k: &Kernel,
    dst: &[Reg<U64>],
    rank: Reg<U32>,
    i: Reg<U32>,
    v: [Reg<F32>; 4],
) {
    let off = k.mul_wide(k.reg::<U64>(), i, 16u32);
    for (p, &d) in dst.iter().enumerate() {
        let a = k.add(k.reg::<U64>(), d, off);
        let peer = k.cmp(Cmp::Ne, rank, p as u32);
        k.guarded(peer, |k| k.st_v4(Store::GLOBAL, a, v));
    }
}

/// Step 3 of the module doc: the block's pushes are released to every peer with its flag,
/// and every peer's flag of this call is acquired; the block's threads meet before and
/// after.
pub(crate) fn handshake(
    k: &Kernel,
    call: &Call,
    table: Reg<U64>,
    signal: Reg<U64>,
    rank: Reg<U32>,
    n_ranks: usize,
) {
    let n = n_ranks as u32;
    let tid = k.tid_x();
    let b = k.ctaid_x();
    let flag = call.flag;
    k.bar_sync();
    k.comment("barrier: thread p releases our flag into peer p and acquires p's flag");
    let peer = k.lt(tid, n);
    let not_me = k.cmp(Cmp::Ne, tid, rank);
    let waiter = k.and(k.reg(), peer, not_me);
    k.if_(waiter, |k| {
        let slot = k.elem_addr(table, tid, 8);
        let peer_signal = k.load::<U64>(Load::GLOBAL_NC, slot.at(8 * n as i64));
        let word = k.mad(k.reg(), b, MAX_RANKS as u32, rank);
        let remote = k.elem_addr(peer_signal, word, 4);
        k.st_sync(Sem::Release, Scope::Sys, remote, flag);
        let mine = k.mad(k.reg(), b, MAX_RANKS as u32, tid);
        let local = k.elem_addr(signal, mine, 4);
        let spin = k.label();
        let tries = k.u32(0);
        k.place(spin);
        let got = k.ld_sync(Sem::Acquire, Scope::Sys, k.reg::<U32>(), local);
        let d = k.sub(k.reg(), got, flag);
        // A peer that never comes (its process died, a bug) ends in a fault after
        // SPIN_LIMIT tries (seconds) rather than a GPU that hangs for good.
        k.add(tries, tries, 1u32);
        let stuck = k.cmp(Cmp::Ge, tries, SPIN_LIMIT);
        k.guarded(stuck, |k| k.raw("trap"));
        let behind = k.cmp(Cmp::Lt, d.cast::<S32>(), 0i32);
        k.bra_if(behind, spin);
    });
    k.bar_sync();
}

/// Where rank `p`'s share of this call lies in this rank's own staging, for every `p`
/// (this rank's own entry unused: its share is the input itself).
pub(crate) fn sources(
    k: &Kernel,
    call: &Call,
    table: Reg<U64>,
    rank: Reg<U32>,
    n_ranks: usize,
) -> Vec<Reg<U64>> {
    let own = {
        let slot = k.elem_addr(table, rank, 8);
        k.load::<U64>(Load::GLOBAL_NC, slot)
    };
    (0..n_ranks as u32)
        .map(|p| {
            let s = k.mad(k.reg(), call.parity, n_ranks as u32, p);
            let off = k.mul_wide(k.reg::<U64>(), s, call.slot_bytes);
            k.add(off, off, own)
        })
        .collect()
}

/// Step 5 of the module doc: thread 0 keeps the call's flag as the block's counter.
pub(crate) fn end(k: &Kernel, call: &Call) {
    let t0 = k.eq(k.tid_x(), 0u32);
    k.guarded(t0, |k| {
        k.st(Store::GLOBAL, call.ctr.at(COUNTERS), call.flag)
    });
}

/// The one-shot all-reduce for a group of `n_ranks` (module doc). Parameters:
/// [`AllReduceArgs`]. Launch: [`launch`].
pub fn kernel(k: &Kernel, n_ranks: usize) {
    k.max_threads(THREADS, 1, 1);
    let AllReduceRegs {
        x,
        n4,
        table,
        signal,
        rank,
        cap4,
    } = AllReduceRegs::declare(k);
    let tid = k.tid_x();
    let b = k.ctaid_x();
    let call = begin(k, signal, cap4);
    let dst = push_targets(k, &call, table, rank, n_ranks);
    let first = k.mad(k.reg(), b, THREADS, tid);
    let stride = BLOCKS * THREADS;
    k.comment("push: this block's share of x into every peer's staging [parity][rank]");
    k.stride_loop(first, n4, stride, |k, i| {
        let src = k.elem_addr(x, i, 16);
        let v = k.regs::<F32, 4>();
        k.ld_v4(Load::GLOBAL, v, src);
        push_vec(k, &dst, rank, i, v);
    });
    handshake(k, &call, table, signal, rank, n_ranks);
    k.comment("reduce: ranks summed in rank order, the same bits on every rank");
    let src = sources(k, &call, table, rank, n_ranks);
    k.stride_loop(first, n4, stride, |k, i| {
        let xa = k.elem_addr(x, i, 16);
        let off = k.mul_wide(k.reg::<U64>(), i, 16u32);
        let vals: Vec<[Reg<F32>; 4]> = src
            .iter()
            .enumerate()
            .map(|(p, &s)| {
                let a = k.add(k.reg::<U64>(), s, off);
                let me = k.eq(rank, p as u32);
                k.selp(a, xa, a, me);
                let v = k.regs::<F32, 4>();
                k.ld_v4(Load::GLOBAL.cache(LoadCache::Cg), v, a);
                v
            })
            .collect();
        let acc = vals[0];
        for v in &vals[1..] {
            for c in 0..4 {
                k.add(acc[c], acc[c], v[c]);
            }
        }
        k.st_v4(Store::GLOBAL, xa, acc);
    });
    end(k, &call);
}

/// What every rank holds after the all-reduce (the kernel's CPU twin): each element summed
/// over the ranks in rank order, one f32 rounding per add.
pub fn twin(inputs: &[&[f32]]) -> Vec<f32> {
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let mut out = first.to_vec();
    for x in &inputs[1..] {
        for (o, v) in out.iter_mut().zip(x.iter()) {
            *o += *v;
        }
    }
    out
}

/// A CPU model of the protocol (module doc), one thread per rank running its blocks in
/// order with the kernel's indexing, parities, flags and counters (atomics with release and
/// acquire): `calls[c][r]` is rank `r`'s input of call `c`; returns every rank's outputs.
/// Tests check it against [`twin`], so the layout the kernel and the host share is pinned.
pub fn protocol_twin(n_ranks: usize, cap: usize, calls: &[Vec<Vec<f32>>]) -> Vec<Vec<Vec<f32>>> {
    protocol_twin_with(n_ranks, cap, calls, &|_, b, n4| plain_share(b, n4))
}

/// The 16-byte vectors block `b` of the plain kernel moves of a message of `n4` vectors
/// (its grid-stride share).
pub fn plain_share(b: usize, n4: usize) -> Vec<usize> {
    let stride = (BLOCKS * THREADS) as usize;
    (b * THREADS as usize..n4)
        .step_by(stride)
        .fold(Vec::new(), |mut v, start| {
            v.extend(start..(start + THREADS as usize).min(n4));
            v
        })
}

/// [`protocol_twin`] with each call's blocks moving the vectors `share(call, block, n4)`
/// gives them: calls of the plain kernel and of kernels that share its staging, flags and
/// counters with another split of the message (`crate::allreduce_norm`: one row a block),
/// in any order.
pub fn protocol_twin_with(
    n_ranks: usize,
    cap: usize,
    calls: &[Vec<Vec<f32>>],
    share: &(dyn Fn(usize, usize, usize) -> Vec<usize> + Sync),
) -> Vec<Vec<Vec<f32>>> {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let staging: Arc<Vec<Vec<AtomicU32>>> = Arc::new(
        (0..n_ranks)
            .map(|_| {
                (0..staging_floats(n_ranks, cap))
                    .map(|_| AtomicU32::new(0))
                    .collect()
            })
            .collect(),
    );
    let signal: Arc<Vec<Vec<AtomicU32>>> = Arc::new(
        (0..n_ranks)
            .map(|_| (0..SIGNAL_WORDS).map(|_| AtomicU32::new(0)).collect())
            .collect(),
    );
    let calls = calls.to_vec();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n_ranks)
            .map(|rank| {
                let (staging, signal, calls) = (staging.clone(), signal.clone(), &calls);
                scope.spawn(move || {
                    let mut outs = Vec::new();
                    let counters = BLOCKS as usize * MAX_RANKS;
                    for (c, call) in calls.iter().enumerate() {
                        let mut x = call[rank].clone();
                        let n4 = x.len() / 4;
                        for b in 0..BLOCKS as usize {
                            let flag = signal[rank][counters + b].load(Ordering::Relaxed) + 1;
                            let parity = (flag & 1) as usize;
                            let idx = share(c, b, n4);
                            for &i in &idx {
                                for (p, peer) in staging.iter().enumerate() {
                                    if p == rank {
                                        continue;
                                    }
                                    let slot = (parity * n_ranks + rank) * cap;
                                    for c in 0..4 {
                                        peer[slot + 4 * i + c]
                                            .store(x[4 * i + c].to_bits(), Ordering::Relaxed);
                                    }
                                }
                            }
                            for (p, peer) in signal.iter().enumerate() {
                                if p != rank {
                                    peer[b * MAX_RANKS + rank].store(flag, Ordering::Release);
                                }
                            }
                            for p in (0..n_ranks).filter(|&p| p != rank) {
                                let w = &signal[rank][b * MAX_RANKS + p];
                                while (w.load(Ordering::Acquire).wrapping_sub(flag) as i32) < 0 {
                                    std::thread::yield_now();
                                }
                            }
                            for &i in &idx {
                                for c in 0..4 {
                                    let e = 4 * i + c;
                                    let mut acc = 0f32;
                                    for p in 0..n_ranks {
                                        let v = if p == rank {
                                            x[e]
                                        } else {
                                            let slot = (parity * n_ranks + p) * cap;
                                            f32::from_bits(
                                                staging[rank][slot + e].load(Ordering::Relaxed),
                                            )
                                        };
                                        acc = if p == 0 { v } else { acc + v };
                                    }
                                    x[e] = acc;
                                }
                            }
                            signal[rank][counters + b].store(flag, Ordering::Relaxed);
                        }
                        outs.push(x);
                    }
                    outs
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(n_ranks: usize, n: usize, seed: u32) -> Vec<Vec<f32>> {
        (0..n_ranks)
            .map(|r| {
                (0..n)
                    .map(|i| {
                        let h = (i as u32 ^ seed)
                            .wrapping_mul(2_654_435_761)
                            .wrapping_add(r as u32 * 97);
                        (h % 2001) as f32 / 1000.0 - 1.0
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_protocol_model_gives_every_rank_the_rank_order_sum_call_after_call() {
        for n_ranks in [2, 4] {
            let cap = 2 * THREADS as usize * BLOCKS as usize;
            // Sizes that change from call to call (one token, a batch, a ragged tail).
            let sizes = [2048, 8192, 4100, cap, 16, 2048, cap - 4];
            let calls: Vec<Vec<Vec<f32>>> = sizes
                .iter()
                .enumerate()
                .map(|(c, &n)| inputs(n_ranks, n, c as u32))
                .collect();
            let outs = protocol_twin(n_ranks, cap, &calls);
            for (c, call) in calls.iter().enumerate() {
                let refs: Vec<&[f32]> = call.iter().map(Vec::as_slice).collect();
                let want = twin(&refs);
                for (r, out) in outs.iter().enumerate() {
                    assert!(
                        out[c]
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "ranks {n_ranks}, call {c}, rank {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_twin_adds_in_rank_order() {
        let a = [1e8f32, 1.0];
        let b = [1.0f32, 1e8];
        let c = [-1e8f32, -1e8];
        let s = twin(&[&a, &b, &c]);
        // (1e8 + 1) - 1e8 rounds the 1 away; (1 + 1e8) - 1e8 as well, in this order.
        assert_eq!(s, vec![(1e8f32 + 1.0) - 1e8, (1.0f32 + 1e8) - 1e8]);
    }

    #[test]
    fn sizes_names_and_limits() {
        assert_eq!(name(2).as_deref(), Some("allreduce_oneshot_r2"));
        assert!(name(3).is_none());
        assert!(eligible(4096, 256, 1 << 18));
        assert!(!eligible(4098, 256, 1 << 18));
        assert!(!eligible(4096, 8, 1 << 18));
        assert!(!eligible(1 << 19, 256, 1 << 18));
        assert!(default_max_bytes(2) >= 64 << 10 && default_max_bytes(1) == 0);
        assert!(default_max_bytes(8) <= default_max_bytes(4));
    }

    #[test]
    fn the_kernel_orders_its_flags_at_system_scope() {
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        m.kernel("ar", |k| kernel(k, 2)).expect("builds");
        let ptx = m.to_ptx();
        let release = ptx.find("st.release.sys.global.u32").expect("release");
        let acquire = ptx.find("ld.acquire.sys.global.u32").expect("acquire");
        let push = ptx.find("st.global.v4.f32").expect("push");
        assert!(push < release && release < acquire, "{ptx}");
        assert!(!ptx.contains("multimem"), "no NVLink multicast");
    }
}
