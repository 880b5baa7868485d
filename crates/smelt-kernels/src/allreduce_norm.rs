//! The decode step's all-reduce fused with what follows it: the one-shot peer all-reduce
//! ([`crate::allreduce`]) of a row-parallel layer's output, the residual add, the RMS norm
//! of the next block and the q8_1 tiles of the next matmul's input, in one launch.
//!
//! At TP=2 a Llama-3-8B decode step makes 64 all-reduces, and each showed up as
//! `add_rms_norm_q8_1` at 14.5 us a launch: NCCL's ~10 us, then a 4 us add + norm +
//! quantize that one GPU folds into the GEMV before it (bench/RESULTS.md, "Tensor
//! parallelism, after the 4-GPU run"). Here the peers' partial rows arrive in this rank's
//! staging (the one-shot protocol: push, flag, acquire) and the block that owns a row sums
//! them, adds the sum into the residual and normalises it, with no global round trip and no
//! second launch.
//!
//! One block per row (the norm needs the whole row in one block) of the fixed one-shot grid
//! ([`crate::allreduce::BLOCKS`] blocks: every block takes part in every call's handshake,
//! so each block's call counter, and with it the staging parity, stays the same on every
//! block as the plain kernel's; a block past the last row only takes part). The message is
//! laid out in the staging exactly as the plain kernel lays it (element `e` at `e * 4` of
//! a slot), and the two may follow each other in any order.
//!
//! Every float is the unfused path's: the sum in rank order as the plain kernel adds it,
//! then `add_rms_norm_q8_1`'s loop, block reduction (the same block size:
//! [`crate::fused::launch`]) and tiles. So every rank gets the same bits, and the fused
//! step the same bits as the unfused one ([`twin`] is the two twins one after the other).

use smelt_ptx::{Kernel, Load, LoadCache, Reg, Store, F32, U64};

use crate::allreduce::{self as ar, BLOCKS, MAX_RANKS};
use crate::catalog::Entry;
use crate::fused::{norm_quantize_row, rms_scale};
use crate::ops::{block_sum, kernel_params, reduce_scratch, Launch};
use crate::KernelError;

/// Most threads a block may have (the norm's block size for a 4096-float row).
pub const MAX_THREADS: u32 = 1024;

/// The kernel's name for a group of `n_ranks`; `None` for sizes without one.
pub fn name(n_ranks: usize) -> Option<String> {
    ar::RANKS
        .contains(&n_ranks)
        .then(|| format!("allreduce_add_norm_q8_1_r{n_ranks}"))
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    ar::RANKS
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

/// Whether the kernel takes `rows` rows of `n` floats (partials at `y`) with staging for
/// `cap` floats: at most one row per block of the grid, rows of whole q8_1 blocks, the
/// message aligned and in the staging.
pub fn eligible(rows: usize, n: usize, y: u64, cap: usize) -> bool {
    rows >= 1 && rows <= BLOCKS as usize && n % 32 == 0 && ar::eligible(rows * n, y, cap)
}

/// The launch for rows of `n` floats: the one-shot grid, the norm's block size (so the
/// norm's float order is `add_rms_norm_q8_1`'s).
pub fn launch(n: usize) -> Launch {
    Launch::new((BLOCKS, 1, 1), crate::fused::launch(1, n).block)
}

kernel_params! {
    /// Arguments of [`kernel`].
    AllReduceNormArgs, AllReduceNormRegs {
        /// This rank's partial rows (`rows x n`), replaced by their sum over the ranks.
        y: Ptr,
        /// The residual stream (`rows x n`), plus the sum.
        x: Ptr,
        /// The norm's weights (`n`).
        w: Ptr,
        /// The norm's output (`rows x n`), not aliasing `x` or `y`.
        out: Ptr,
        /// Its q8_1 tiles (`rows x ntiles` tiles).
        q: Ptr,
        n: U32,
        ntiles: U32,
        eps: F32,
        rows: U32,
        /// As [`crate::allreduce::AllReduceArgs`]: every rank's staging, then signal address.
        table: Ptr,
        signal: Ptr,
        rank: U32,
        cap4: U32,
    }
}

/// `y = sum over ranks (rank order) of y; x += y; out = x / sqrt(mean(x²) + eps) * w;
/// q = quantize_q8_1(out)` per row, for a group of `n_ranks` (module doc). Parameters:
/// [`AllReduceNormArgs`]. Launch: [`launch`].
pub fn kernel(k: &Kernel, n_ranks: usize) {
    assert!(n_ranks <= MAX_RANKS);
    k.max_threads(MAX_THREADS, 1, 1);
    let AllReduceNormRegs {
        y,
        x,
        w,
        out,
        q,
        n,
        ntiles,
        eps,
        rows,
        table,
        signal,
        rank,
        cap4,
    } = AllReduceNormRegs::declare(k);
    let scratch = reduce_scratch(k, "arnorm_red");
    let tid = k.tid_x();
    let step = k.ntid_x();
    let row = k.ctaid_x();
    let has_row = k.lt(row, rows);
    let call = ar::begin(k, signal, cap4);
    let n4 = k.shr(k.reg(), n, 2u32);
    // The row's first element and vector in the message.
    let first_e = k.mul(k.reg(), row, n);
    let first4 = k.mul(k.reg(), row, n4);
    k.if_(has_row, |k| {
        k.comment("push: this block's row into every peer's staging [parity][rank]");
        let dst = ar::push_targets(k, &call, table, rank, n_ranks);
        let ys = k.elem_addr(y, first4, 16);
        k.stride_loop(tid, n4, step, |k, i| {
            let v = k.regs::<F32, 4>();
            k.ld_v4(Load::GLOBAL, v, k.elem_addr(ys, i, 16));
            let e4 = k.add(k.reg(), first4, i);
            ar::push_vec(k, &dst, rank, e4, v);
        });
    });
    ar::handshake(k, &call, table, signal, rank, n_ranks);
    k.if_(has_row, |k| {
        k.comment("reduce in rank order, add into the residual, sum of squares (as the norm)");
        let src = ar::sources(k, &call, table, rank, n_ranks);
        let xs = k.elem_addr(x, first_e, 4);
        let ys = k.elem_addr(y, first_e, 4);
        let os = k.elem_addr(out, first_e, 4);
        let sum = k.f32(0.0);
        k.stride_loop(tid, n, step, |k, i| {
            let e = k.add(k.reg(), first_e, i);
            let off = k.mul_wide(k.reg::<U64>(), e, 4u32);
            let ya = k.elem_addr(ys, i, 4);
            let vals: Vec<Reg<F32>> = src
                .iter()
                .enumerate()
                .map(|(p, &s)| {
                    let a = k.add(k.reg::<U64>(), s, off);
                    let me = k.eq(rank, p as u32);
                    k.selp(a, ya, a, me);
                    // Peers' stores came over the links: past L1 (`.cg`), as the plain
                    // kernel reads them.
                    k.load::<F32>(Load::GLOBAL.cache(LoadCache::Cg), a)
                })
                .collect();
            let acc = vals[0];
            for &v in &vals[1..] {
                k.add(acc, acc, v);
            }
            k.st(Store::GLOBAL, ya, acc);
            let xa = k.elem_addr(xs, i, 4);
            let v = k.load::<F32>(Load::GLOBAL, xa);
            k.add(v, v, acc);
            k.st(Store::GLOBAL, xa, v);
            k.fma(sum, v, v, sum);
        });
        // The reduction's barriers also make every thread's `x` writes visible to the block.
        let total = block_sum(k, sum, &scratch);
        let scale = rms_scale(k, total, n, eps);
        norm_quantize_row(k, xs, os, w, q, row, n, ntiles, scale);
    });
    ar::end(k, &call);
}

/// The 16-byte vectors block `b` moves for `rows` rows of `n` floats: its row's, or none
/// past the last row (it takes part in the handshake only). For
/// [`crate::allreduce::protocol_twin_with`].
pub fn row_share(rows: usize, n: usize, b: usize) -> Vec<usize> {
    if b < rows {
        (b * n / 4..(b + 1) * n / 4).collect()
    } else {
        Vec::new()
    }
}

/// What one rank holds after a call (see [`twin`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TwinOut {
    /// The partials' sum (the kernel writes it over `y`).
    pub y: Vec<f32>,
    /// The norm's output.
    pub out: Vec<f32>,
    /// Its q8_1 tiles.
    pub q: Vec<u8>,
}

/// CPU twin of [`kernel`] on one rank: `partials[r]` is rank `r`'s `y`; `x` (rows of
/// `w.len()`) is updated in place. The plain all-reduce's twin, then
/// [`crate::fused::cpu`] with the add, so the same bits on every rank and the same bits as
/// the unfused path.
pub fn twin(
    partials: &[&[f32]],
    x: &mut [f32],
    w: &[f32],
    eps: f32,
) -> Result<TwinOut, KernelError> {
    let sum = ar::twin(partials);
    if sum.len() != x.len() {
        return Err(KernelError::BadLength {
            what: "all-reduce partials",
            got: sum.len() * 4,
            want: x.len() * 4,
        });
    }
    let (out, q) = crate::fused::cpu(x, Some(&sum), w, eps)?;
    Ok(TwinOut { y: sum, out, q })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    fn rows_of(r: usize, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((((i * 7919 + r * 104_729) % 2001) as f32) / 1000.0 - 1.0) * scale)
            .collect()
    }

    #[test]
    fn the_twin_is_the_unfused_path_bit_for_bit_on_every_rank() {
        let n = 512;
        let rows = 3;
        for n_ranks in [2, 4] {
            let partials: Vec<Vec<f32>> = (0..n_ranks).map(|r| rows_of(r, rows * n, 0.3)).collect();
            let refs: Vec<&[f32]> = partials.iter().map(Vec::as_slice).collect();
            let x0 = rows_of(9, rows * n, 2.0);
            let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 / 10.0).collect();
            // Unfused: the plain all-reduce's twin, then add + norm + quantize.
            let sum = ar::twin(&refs);
            let mut xu = x0.clone();
            let (out_u, q_u) = crate::fused::cpu(&mut xu, Some(&sum), &w, 1e-5).unwrap();
            // Every rank's fused call (the same inputs in rank order on every rank).
            for _rank in 0..n_ranks {
                let mut x = x0.clone();
                let TwinOut { y, out, q } = twin(&refs, &mut x, &w, 1e-5).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&sum));
                assert_eq!(bits(&x), bits(&xu));
                assert_eq!(bits(&out), bits(&out_u));
                assert_eq!(q, q_u);
            }
            // The sum's order is the rank order, not any other.
            let mut rev: Vec<&[f32]> = refs.clone();
            rev.reverse();
            let mut x = x0.clone();
            let y_rev = twin(&rev, &mut x, &w, 1e-5).unwrap().y;
            if n_ranks == 4 {
                assert_ne!(
                    y_rev.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                    sum.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                    "inputs whose sum order shows in the bits"
                );
            }
        }
        let mut x = vec![0f32; 64];
        assert!(twin(&[&[0f32; 32], &[0f32; 32]], &mut x, &[1f32; 64], 1e-5).is_err());
    }

    #[test]
    fn fused_and_plain_calls_share_the_staging_in_any_order() {
        // The protocol model with the fused kernel's split (a row a block, the blocks past
        // the last row only meeting) between plain calls: every rank gets the rank-order
        // sum of every call, whatever the order of the two kernels and the row counts.
        let n = 512;
        let cap = 32 * n;
        for n_ranks in [2, 4] {
            // (rows of n, or 0 for a plain call of `plain` floats)
            let shape: [(usize, usize); 8] = [
                (1, 0),
                (0, 4096),
                (1, 0),
                (1, 0),
                (32, 0),
                (0, cap),
                (3, 0),
                (0, 16),
            ];
            let calls: Vec<Vec<Vec<f32>>> = shape
                .iter()
                .enumerate()
                .map(|(c, &(rows, plain))| {
                    let len = if rows > 0 { rows * n } else { plain };
                    (0..n_ranks)
                        .map(|r| rows_of(r + 10 * c, len, 0.7))
                        .collect()
                })
                .collect();
            let outs = ar::protocol_twin_with(n_ranks, cap, &calls, &|c, b, n4| match shape[c] {
                (0, _) => ar::plain_share(b, n4),
                (rows, _) => row_share(rows, n, b),
            });
            for (c, call) in calls.iter().enumerate() {
                let refs: Vec<&[f32]> = call.iter().map(Vec::as_slice).collect();
                let want: Vec<u32> = ar::twin(&refs).iter().map(|f| f.to_bits()).collect();
                for (r, out) in outs.iter().enumerate() {
                    let got: Vec<u32> = out[c].iter().map(|f| f.to_bits()).collect();
                    assert_eq!(got, want, "ranks {n_ranks}, call {c}, rank {r}");
                }
            }
        }
    }

    #[test]
    fn every_group_size_builds_with_the_protocol_and_the_norm() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k)).unwrap();
            }
            let ptx = m.to_ptx();
            for n in ar::RANKS {
                assert!(ptx.contains(&format!(".entry allreduce_add_norm_q8_1_r{n}(")));
            }
            assert!(ptx.contains("st.release.sys.global.u32"));
            assert!(ptx.contains("ld.acquire.sys.global.u32"));
            assert!(ptx.contains("sqrt.rn.f32"));
            assert!(ptx.contains("ld.global.cg.f32"));
            assert!(!ptx.contains("multimem"), "no NVLink multicast");
        }
    }

    #[test]
    fn what_it_takes_and_how_it_launches() {
        assert_eq!(name(4).as_deref(), Some("allreduce_add_norm_q8_1_r4"));
        assert!(name(3).is_none());
        let l = launch(4096);
        assert_eq!(l.grid.0, BLOCKS);
        // The norm's own block size, so its sum is ordered as `add_rms_norm_q8_1`'s.
        assert_eq!(l.block, crate::fused::launch(1, 4096).block);
        assert!(eligible(1, 4096, 256, 1 << 18));
        assert!(eligible(32, 4096, 256, 1 << 18));
        assert!(!eligible(33, 4096, 256, 1 << 20), "one row per block");
        assert!(!eligible(0, 4096, 256, 1 << 18));
        assert!(!eligible(1, 4100, 256, 1 << 18), "whole q8_1 blocks");
        assert!(!eligible(1, 4096, 8, 1 << 18), "aligned");
        assert!(!eligible(8, 4096, 256, 4096 * 4), "within the staging");
        assert!(
            eligible(1, 8192, 256, 1 << 18),
            "a block strides over a long row"
        );
    }
}
