//! Split K without a reduce launch: the last block of each output tile sums the splits.
//!
//! With the K range cut into `splits` slices (`Args::splits`), every block used to store
//! its partial outputs to a workspace and a second launch, [`super::reduce_kernel`],
//! summed them. In a 32-sequence decode step of the Llama-3-8B-shape Q4_K on an H100 the
//! 64 reduce launches cost ~1.25 ms of 9.6 (~10.8 us each, mostly launch and dependency
//! latency, not bytes). Here each block still stores its partials, then counts itself in
//! on its tile's counter (one `u32` per (token block, row block) of the grid); the block
//! that arrives last reads the tile's `splits` partials back through L2 and sums them,
//! `sum = p0; sum += p1; ...` in f32 in split order, exactly as the reduce kernel does, so
//! the output is the same to the bit whichever block is last. It resets the counter, so
//! the buffer is zero again for the next launch (and for every graph replay).
//!
//! **Ordering.** Stores, `membar.gl` in every thread, a block barrier, then one thread's
//! `atom.add` (the CUDA sample's `threadFenceReduction`); the last block fences again
//! before its `ld.global.cg` reads. Each thread reduces exactly the outputs it stored
//! itself (the `mma` C layout of [`super::store_outputs`]), so no other indexing.
//!
//! **Counters between launches.** Every GEMM of the engine uses the same counter buffer.
//! The kernels count in only after their `griddepcontrol.wait`, which returns once every
//! grid they depend on has ended and its writes are visible; a kernel that never waits
//! explicitly waits at entry (`smelt_ptx::Kernel::grid_dep_wait`). So even with
//! programmatic dependent launch, where the next GEMM's blocks are placed while this one
//! runs, none of them touches a counter before this GEMM's last block has reset it.
//!
//! **Where it applies: nowhere by default.** It measured slower than the reduce launch it
//! replaces (H100, Llama-3-8B-shape Q4_K, 2026-11-27 14:00 UTC, bench/RESULTS.md: 16, 32
//! and 64 sequences 3,542 / 5,602 / 7,380 tok/s without, 3,260 / 4,945 / 6,993 with; the
//! narrow GEMMs' launches 5-6 us longer each): the last block's thread reads its 16
//! outputs' `splits` partials one split after the other, so the tail is `splits` L2
//! round trips, where the reduce kernel's thousand blocks keep them all in flight. With
//! `SMELT_CUDA_SPLIT_FIXUP=1` the engine passes the counters (`Args::fixup`) when the
//! launch has more than one split and its grid fits [`counter_slots`]; otherwise the
//! counters are 0 and the kernel leaves the workspace to the reduce launch. The gathered-slots GEMM ([`super::grouped`]) never splits.

use smelt_ptx::{Dim, Kernel, Load, LoadCache, Pred, Reg, Special, Store, F32, U32, U64};

use super::Out;
use crate::ops::kernel_params;

kernel_params! {
    /// The split fix-up's parameters, after [`super::GemmArgs`]: the real output `out`
    /// (`ntok x nrows` f32) and the per-tile `counters` (zero between launches), both 0
    /// when the launch leaves the workspace to the reduce kernel.
    SplitArgs, SplitRegs {
        out: MaybePtr,
        counters: MaybePtr,
    }
}

/// Where the last block of a tile writes and counts: the launch's real output and its
/// per-tile counters ([`counter_slots`] of them, zero between launches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixup {
    pub out: u64,
    pub counters: u64,
}

/// Counters the engine allocates (zeroed once) for the split GEMMs on a GPU of `sm_count`
/// multiprocessors: one per block of the largest (token block x row block) grid a split
/// launch of the engine's split rules makes. Those rules split only grids that fill the
/// GPU's block slots badly: the int8 and f16 GEMMs ([`super::splits_for_blocks`]) grids
/// of fewer than `2 sm_count` blocks, the narrow GEMM ([`super::narrow::splits`]) grids
/// filling their last wave of `blocks_per_sm sm_count` slots (at most two an SM) to under 80%, which four
/// whole waves always exceed. A launch with a larger grid (the batch-invariant int8 GEMM
/// splits by shape alone, whatever the prompt's token blocks) takes the reduce launch.
pub fn counter_slots(sm_count: usize) -> usize {
    let narrow = 4 * 2 * sm_count.max(1);
    narrow.max(2 * sm_count.max(1))
}

/// [`super::store_outputs`] for the split GEMMs (parameters [`super::GemmArgs`] then
/// [`SplitArgs`]): stores the warp's accumulators to `o.y` (split z of the workspace when
/// the launch has several), then, when the launch passes counters and has more than one
/// split, the last block of the tile sums the splits into `out` (see the module doc).
/// Every thread of the block must call it (it has barriers).
pub(super) fn store_split_outputs<const NI: usize>(
    k: &Kernel,
    acc: &[[[Reg<F32>; 4]; NI]],
    o: Out,
) {
    let (y, row_t, tok_t, nrows, ntok) = (o.y, o.row, o.tok, o.nrows, o.ntok);
    debug_assert!(o.slots.is_none(), "gathered outputs never split");
    super::store_outputs(k, acc, o);
    let SplitRegs { out, counters } = SplitRegs::declare(k);
    let splits = k.special(Special::Nctaid(Dim::Z));
    let on = k.cmp(smelt_ptx::Cmp::Ne, counters, 0u64);
    let several = k.cmp(smelt_ptx::Cmp::Gt, splits, 1u32);
    k.and(on, on, several);
    k.if_(on, |k| {
        // Both may be 0 (no fix-up), so declared as plain words: global addresses here.
        for p in [out, counters] {
            k.raw(format!("cvta.to.global.u64 {p}, {p}"));
        }
        // Every thread's partials visible at GPU scope before the block counts in.
        k.membar(smelt_ptx::Scope::Gpu);
        k.bar_sync();
        let flag = k.u32(0);
        let tile = k.mad(k.reg(), k.ctaid_y(), k.nctaid_x(), k.ctaid_x());
        let at = k.elem_addr(counters, tile, 4);
        k.if_(k.eq(k.tid_x(), 0u32), |k| {
            let old = k.atom_add(smelt_ptx::Space::Global, k.reg::<U32>(), at, 1u32);
            let n1 = k.sub(k.reg(), splits, 1u32);
            let is_last = k.eq(old, n1);
            k.selp(flag, 1u32, 0u32, is_last);
            // Every block of the tile has counted in: zero for the next launch.
            k.guarded(is_last, |k| k.st(Store::GLOBAL, at, k.u32(0)));
        });
        // The thread's word to the whole block (a barrier that also ORs a predicate).
        let mine = k.cmp(smelt_ptx::Cmp::Ne, flag, 0u32);
        let last = k.reg::<Pred>();
        k.raw(format!("bar.red.or.pred {last}, 0, {mine}"));
        k.if_(last, |k| {
            k.membar(smelt_ptx::Scope::Gpu);
            reduce_own::<NI>(
                k,
                acc.len(),
                (y, out),
                (row_t, tok_t),
                (nrows, ntok),
                splits,
            );
        });
    });
}

/// The last block's sums: for each output the thread stored (accumulator order of
/// [`super::store_outputs`]: `mi` tiles of `acc`, rows `row + 16 mi + 8 h`, tokens `tok +
/// 8 ni + j`), `sum = p_0; sum += p_z` for `z = 1..splits` read from the workspace (split
/// z at `part` moved back from this block's `y`), then stored to `out`.
///
/// One `m16` tile at a time (at most 16 sums, their loads in flight together, so the
/// registers stay well under the GEMMs' 128 a thread): a 64-bit address per token column
/// (its token clamped into the matrix), the tile's rows at immediate offsets from it;
/// rows past the matrix are not read, and nothing outside it is stored.
fn reduce_own<const NI: usize>(
    k: &Kernel,
    mi_tiles: usize,
    (y, out): (Reg<U64>, Reg<U64>),
    (row_t, tok_t): (Reg<U32>, Reg<U32>),
    (nrows, ntok): (Reg<U32>, Reg<U32>),
    splits: Reg<U32>,
) {
    // Workspace split 0: this block's `y` less z splits of `ntok x nrows` floats.
    let n = k.mul(k.reg(), ntok, nrows);
    let stride = k.mul_wide(k.reg::<U64>(), n, 4u32);
    let z = k.special(Special::Ctaid(Dim::Z));
    let part = k.sub(
        k.reg(),
        y,
        k.mul_wide(k.reg::<U64>(), k.mul(k.reg(), n, z), 4u32),
    );
    let last_tok = k.sub(k.reg(), ntok, 1u32);
    // Token column (ni, j): its offset from split 0 (bytes) at row `row`.
    let cols: Vec<Reg<U64>> = (0..NI)
        .flat_map(|ni| (0..2u32).map(move |j| (ni, j)))
        .map(|(ni, j)| {
            let tok = k.add(k.reg(), tok_t, 8 * ni as u32 + j);
            k.min(tok, tok, last_tok);
            let i = k.mad(k.reg(), tok, nrows, row_t);
            k.mul_wide(k.reg::<U64>(), i, 4u32)
        })
        .collect();
    let cg = Load::GLOBAL.cache(LoadCache::Cg);
    for mi in 0..mi_tiles {
        let rows: [(i64, Reg<Pred>); 2] = std::array::from_fn(|h| {
            let d = 16 * mi as u32 + 8 * h as u32;
            let row = k.add(k.reg(), row_t, d);
            (4 * i64::from(d), k.lt(row, nrows))
        });
        // Split `z`'s values of the tile at `base` (split 0's address moved by `zoff`).
        let load = |k: &Kernel, base: Reg<U64>| -> Vec<Reg<F32>> {
            let mut v = Vec::with_capacity(4 * NI);
            for &c in &cols {
                let at = k.add(k.reg::<U64>(), base, c);
                for &(off, ok) in &rows {
                    let r = k.reg::<F32>();
                    k.guarded(ok, |k| {
                        k.ld(cg, r, at.at(off));
                    });
                    v.push(r);
                }
            }
            v
        };
        let sums = load(k, part);
        let at = k.mov(k.reg::<U64>(), part);
        k.for_count(k.sub(k.reg(), splits, 1u32), |k, _| {
            k.add(at, at, stride);
            for (&s, v) in sums.iter().zip(load(k, at)) {
                k.add(s, s, v);
            }
        });
        let mut s = sums.iter();
        for (ci, &c) in cols.iter().enumerate() {
            let tok = k.add(k.reg(), tok_t, 8 * (ci / 2) as u32 + (ci % 2) as u32);
            let tok_ok = k.lt(tok, ntok);
            let dst = k.add(k.reg::<U64>(), out, c);
            for &(off, row_ok) in &rows {
                let ok = k.reg::<Pred>();
                k.raw(format!("and.pred {ok}, {tok_ok}, {row_ok}"));
                let v = *s.next().expect("a sum per output");
                k.guarded(ok, |k| k.st(Store::GLOBAL, dst.at(off), v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    #[test]
    fn every_split_gemm_counts_after_its_wait_and_stores_and_sums_in_split_order() {
        let split_gemm = |n: &str| {
            [
                "gemm_narrow",
                "gemm_f16s",
                "gemm_f16_q",
                "gemm_q",
                "gemm_iq",
            ]
            .iter()
            .any(|p| n.starts_with(p))
        };
        let mut checked = 0;
        // The engine's programmatic-launch settings, and every instruction the runtime can
        // be asked for (early launch, work before the wait).
        for grid_dep in [crate::catalog::GRID_DEPS.0, smelt_ptx::GridDep::ALL] {
            for (name, build) in crate::catalog::all() {
                if !split_gemm(&name) {
                    continue;
                }
                let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
                m.set_grid_dep(grid_dep);
                m.kernel(&name, |k| build(k)).unwrap();
                let ptx = m.to_ptx();
                let at = |s: &str| ptx.find(s).unwrap_or_else(|| panic!("{name}: {s} missing"));
                // The wait (every grid before has ended, its last block's counter reset
                // visible), the partial stores, the fence, the count, the sums' reads.
                assert!(
                    at("griddepcontrol.wait") < at("atom.global.add.u32"),
                    "{name}"
                );
                assert!(at("st.global.f32") < at("membar.gl"), "{name}");
                assert!(at("membar.gl") < at("atom.global.add.u32"), "{name}");
                assert!(at("atom.global.add.u32") < at("bar.red.or.pred"), "{name}");
                assert!(at("bar.red.or.pred") < at("ld.global.cg.f32"), "{name}");
                assert_eq!(ptx.matches("atom.global").count(), 1, "{name}");
                // The parameters: the GEMM's, then the fix-up's.
                assert!(at(".param .u32 kslice") < at(".param .u64 out"), "{name}");
                assert!(at(".param .u64 out") < at(".param .u64 counters"), "{name}");
                checked += 1;
            }
        }
        let narrow = super::super::narrow::catalog().len();
        assert_eq!(
            narrow, 36,
            "Q4_K, Q6_K and Q8_0, three layouts, four widths"
        );
        let f16 = super::super::f16::TYPES.len();
        assert_eq!(f16, 3, "Q4_K, Q6_K and Q8_0");
        assert_eq!(checked, 2 * (narrow + 2 + f16 + 12));
    }

    #[test]
    fn counters_cover_every_split_launch_of_the_split_rules() {
        // Every family's split rule on H100- and A100-sized GPUs, for the shapes of the
        // models we run and any token count of batched decode: a launch with more than
        // one split has a grid of at most `counter_slots` (token block x row block).
        for sms in [108usize, 132] {
            let cap = counter_slots(sms);
            for nrows in (128..=160_000)
                .step_by(896)
                .chain([1024, 4096, 14336, 128_256])
            {
                for ntiles in [16usize, 20, 56, 112] {
                    for (ntok, ty) in (8..=64usize).flat_map(|n| {
                        [
                            (n, GgmlType::Q4_K),
                            (n, GgmlType::Q6_K),
                            (n, GgmlType::Q8_0),
                        ]
                    }) {
                        let narrow = super::super::narrow::splits(ty, nrows, ntiles, ntok, sms);
                        let a = super::super::Args {
                            splits: narrow as u32,
                            ..super::super::Args::q4_k_for_test(
                                nrows as u32,
                                ntok as u32,
                                ntiles as u32,
                            )
                        };
                        let l = super::super::narrow::launch(
                            ty,
                            &a,
                            super::super::narrow::Layout::Rows16,
                        );
                        if l.grid.2 > 1 {
                            assert!(
                                (l.grid.0 * l.grid.1) as usize <= cap,
                                "narrow {nrows} {ntiles} {ntok}"
                            );
                        }
                        let s = super::super::f16_small::splits(nrows, ntiles, ntok, sms);
                        let a = super::super::Args {
                            splits: s as u32,
                            ..a
                        };
                        let l = super::super::f16_small::launch(&a);
                        if l.grid.2 > 1 {
                            assert!(
                                (l.grid.0 * l.grid.1) as usize <= cap,
                                "small {nrows} {ntiles} {ntok}"
                            );
                        }
                        let s = super::super::splits(nrows, ntiles, Some(ntok), sms);
                        let a = super::super::Args {
                            splits: s as u32,
                            ..a
                        };
                        let l = a.launch();
                        if l.grid.2 > 1 {
                            assert!(
                                (l.grid.0 * l.grid.1) as usize <= cap,
                                "int8 {nrows} {ntiles} {ntok}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(counter_slots(132), 1056);
    }
}
