//! The int8 GEMM's launch on the host side: its kernel parameters ([`GemmArgs`]), how many
//! slices the K range is cut into ([`splits`]), and [`Args`], which packs one launch's
//! arguments and gives its grid, split workspace and reduce launch. Every GEMM family (int8,
//! f16, narrow) launches from an [`Args`]; the kernel body that reads these parameters is
//! `int8.rs`, the reduce it may need `reduce.rs`.

use super::fixup;
use super::reduce::{ReduceArgs, REDUCE_THREADS};
use super::{BM, BN, THREADS};
use crate::ops::{kernel_params, ArgValue};

kernel_params! {
    /// The kernel's parameters, declared once for [`kernel`] and packed by [`Args::values`].
    ///
    /// [`kernel`]: super::kernel
    GemmArgs, GemmRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        nrows: U32,
        ntok: U32,
        ntiles: U32,
        row_bytes: U32,
        kslice: U32,
    }
}

/// Splits of the K range (`Args::splits`) for a matrix of `nrows` rows and `ntiles` tiles
/// and `ntok` tokens on a GPU of `sm_count` multiprocessors: enough blocks x splits to fill
/// every SM twice, each split at least four tiles. With `ntok` None the count is that of
/// one token block whatever the batch: it then depends on the matrix and the GPU only, so
/// an output is summed in the same order however many tokens share the launch
/// (`--batch-invariant`); with the token count, large batches skip the split workspace and
/// its reduce (8% of a 512-token prompt's GPU time on an H100).
pub fn splits(nrows: usize, ntiles: usize, ntok: Option<usize>, sm_count: usize) -> usize {
    splits_for_blocks((BM, BN), nrows, ntiles, ntok, sm_count)
}

/// [`splits`] for a GEMM whose blocks are `block.0` rows x `block.1` tokens.
pub fn splits_for_blocks(
    block: (u32, u32),
    nrows: usize,
    ntiles: usize,
    ntok: Option<usize>,
    sm_count: usize,
) -> usize {
    let token_blocks = ntok.map_or(1, |n| n.div_ceil(block.1 as usize).max(1));
    let blocks = nrows.div_ceil(block.0 as usize).max(1) * token_blocks;
    let want = (2 * sm_count).div_ceil(blocks);
    want.clamp(1, (ntiles / 4).max(1))
}

/// One GEMM launch: weights `w` (`nrows` rows of `row_bytes` in the GPU layout), activation
/// tiles `x` ([`act`], `ntok` rows of `ntiles` tiles), output `y` (`ntok x nrows` f32), the
/// K range cut into `splits` slices of `ceil(ntiles / splits)` tiles. With more than one
/// split, `y` is a workspace of `splits` outputs, summed in split order into the real
/// output by the last block of each tile ([`fixup`], with `fixup`) or else by
/// [`reduce_kernel`] ([`Args::reduce`]).
///
/// [`act`]: super::act
/// [`reduce_kernel`]: super::reduce_kernel
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub nrows: u32,
    pub ntok: u32,
    pub ntiles: u32,
    pub row_bytes: u32,
    pub splits: u32,
    /// The split fix-up's output and counters ([`Args::with_fixup`] sets it only for a
    /// launch with several splits whose grid has a counter per tile).
    pub fixup: Option<fixup::Fixup>,
}

impl Args {
    /// Test fixture: Q4_K rows of `ntiles` tiles, no addresses, four splits.
    #[cfg(test)]
    pub(crate) fn q4_k_for_test(nrows: u32, ntok: u32, ntiles: u32) -> Args {
        Args {
            w: 0,
            x: 0,
            y: 0,
            nrows,
            ntok,
            ntiles,
            row_bytes: ntiles * 144,
            splits: 4,
            fixup: None,
        }
    }

    /// Tiles per split.
    pub fn kslice(&self) -> u32 {
        self.ntiles.div_ceil(self.splits.max(1)).max(1)
    }

    /// Slices of the K range the launch really makes (`grid.2` of every family's launch):
    /// whole slices of [`Args::kslice`] tiles, so at most `splits`.
    pub fn split_count(&self) -> u32 {
        self.ntiles.div_ceil(self.kslice()).max(1)
    }

    /// Whether the launch's last blocks sum its splits ([`fixup`]): a fix-up set and more
    /// than one split. Then there is no reduce launch ([`Args::reduce`] is `None`).
    pub fn fixed_up(&self) -> bool {
        self.fixup.is_some() && self.split_count() > 1
    }

    /// `self` with the split fix-up into `out` on `counters` (`capacity` of them), for a
    /// launch of grid `grid` (the family's launch shape): set only when the launch has
    /// more than one split and a counter for each (token block, row block) of its grid;
    /// else unchanged (the reduce launch sums the splits).
    pub fn with_fixup(
        self,
        grid: (u32, u32, u32),
        out: u64,
        counters: u64,
        capacity: usize,
    ) -> Args {
        let tiles = grid.0 as usize * grid.1 as usize;
        if self.split_count() > 1 && grid.2 == self.split_count() && tiles <= capacity {
            Args {
                fixup: Some(fixup::Fixup { out, counters }),
                ..self
            }
        } else {
            self
        }
    }

    /// The kernel's arguments ([`GemmArgs`], then [`fixup::SplitArgs`]: zeros unless
    /// [`Args::fixed_up`]), in its order.
    pub fn values(&self) -> Vec<ArgValue> {
        let f = self.fixup.filter(|_| self.fixed_up());
        let mut v = GemmArgs {
            w: self.w,
            x: self.x,
            y: self.y,
            nrows: self.nrows,
            ntok: self.ntok,
            ntiles: self.ntiles,
            row_bytes: self.row_bytes,
            kslice: self.kslice(),
        }
        .values();
        v.extend(
            fixup::SplitArgs {
                out: f.map_or(0, |f| f.out),
                counters: f.map_or(0, |f| f.counters),
            }
            .values(),
        );
        v
    }

    /// Grid (token blocks fastest, so the blocks that share rows run together and read the
    /// weights from L2; splits last) and block size.
    pub fn launch(&self) -> crate::ops::Launch {
        crate::ops::Launch::new(
            (
                self.ntok.div_ceil(BN).max(1),
                self.nrows.div_ceil(BM).max(1),
                self.split_count(),
            ),
            (THREADS, 1, 1),
        )
    }

    /// Floats of the split workspace (0 with one split: the GEMM writes `y` itself).
    pub fn workspace_floats(&self) -> usize {
        let splits = self.split_count() as usize;
        if splits > 1 {
            splits * self.ntok as usize * self.nrows as usize
        } else {
            0
        }
    }

    /// The reduce launch that sums the workspace `y` into `out`, if there is more than one
    /// split and the GEMM's last blocks do not sum them ([`Args::fixed_up`]): its
    /// arguments and launch shape.
    pub fn reduce(&self, out: u64) -> Option<(ReduceArgs, crate::ops::Launch)> {
        let splits = self.split_count();
        if splits <= 1 || self.fixed_up() {
            return None;
        }
        let n = self.ntok * self.nrows;
        Some((
            ReduceArgs {
                part: self.y,
                y: out,
                n,
                splits,
            },
            crate::ops::Launch::new(
                (n.div_ceil(REDUCE_THREADS).max(1), 1, 1),
                (REDUCE_THREADS, 1, 1),
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{f16, f16_small, narrow};
    use super::*;
    use crate::GgmlType;

    #[test]
    fn launch_covers_ragged_shapes() {
        let a = Args {
            w: 0,
            x: 0,
            y: 0,
            nrows: 65,
            ntok: 3,
            ntiles: 1,
            row_bytes: 144,
            splits: 1,
            fixup: None,
        };
        let l = a.launch();
        assert_eq!(l.grid, (1, 2, 1));
        assert_eq!(l.block, (THREADS, 1, 1));
        assert_eq!(
            a.values().len(),
            GemmArgs::NAMES.len() + fixup::SplitArgs::NAMES.len()
        );
        assert_eq!(a.workspace_floats(), 0);
        assert!(a.reduce(0).is_none());
        // 56 tiles in 5 splits: 12 tiles each, the last 8; a workspace of 5 outputs.
        let b = Args {
            ntiles: 56,
            splits: 5,
            ..a
        };
        assert_eq!(b.kslice(), 12);
        assert_eq!(b.launch().grid.2, 5);
        assert_eq!(b.workspace_floats(), 5 * 3 * 65);
        let (vals, l) = b.reduce(7).unwrap();
        assert_eq!(vals.splits, 5);
        assert_eq!(l.grid.0, 1);
        // 16 tiles in 5 asked splits: 4 tiles each, so 4 splits.
        let c = Args {
            ntiles: 16,
            splits: 5,
            ..a
        };
        assert_eq!(c.launch().grid.2, 4);
    }

    #[test]
    fn the_fixup_replaces_the_reduce_only_for_split_launches_that_have_counters() {
        let a = Args {
            y: 0x1000,
            ntiles: 56,
            splits: 5,
            ..Args::q4_k_for_test(4096, 32, 56)
        };
        let l = a.launch();
        assert_eq!(l.grid, (1, 64, 5));
        // Unset: the kernel gets zeros for the fix-up and the reduce follows.
        let zeros = |a: &Args| a.values()[GemmArgs::NAMES.len()..].to_vec();
        assert_eq!(zeros(&a), vec![ArgValue::Ptr(0), ArgValue::Ptr(0)]);
        assert!(a.reduce(0x2000).is_some() && !a.fixed_up());
        // Set: the output and counters follow the GEMM's arguments, no reduce.
        let f = a.with_fixup(l.grid, 0x2000, 0x3000, 64);
        assert!(f.fixed_up());
        assert_eq!(
            zeros(&f),
            vec![ArgValue::Ptr(0x2000), ArgValue::Ptr(0x3000)]
        );
        assert!(f.reduce(0x2000).is_none());
        assert_eq!(
            f.values()[..GemmArgs::NAMES.len()],
            a.values()[..GemmArgs::NAMES.len()]
        );
        // The workspace is the same: the partials still go there.
        assert_eq!(f.workspace_floats(), a.workspace_floats());
        // Too few counters for the grid (64 tiles), or a grid of other splits: the reduce.
        assert_eq!(a.with_fixup(l.grid, 0x2000, 0x3000, 63), a);
        assert_eq!(a.with_fixup((1, 64, 4), 0x2000, 0x3000, 64), a);
        // One split: nothing to sum, the GEMM writes the output itself.
        let one = Args { splits: 1, ..a };
        assert_eq!(one.with_fixup(one.launch().grid, 0x2000, 0x3000, 64), one);
        assert!(one.reduce(0x2000).is_none());
        // A fix-up set on a one-split launch passes zeros (nothing to sum).
        let forced = Args {
            fixup: f.fixup,
            ..one
        };
        assert!(!forced.fixed_up());
        assert_eq!(zeros(&forced), vec![ArgValue::Ptr(0), ArgValue::Ptr(0)]);
        // Every family's grid has the same split count.
        assert_eq!(
            narrow::launch(GgmlType::Q4_K, &a, narrow::Layout::Rows16)
                .grid
                .2,
            a.split_count()
        );
        assert_eq!(f16_small::launch(&a).grid.2, a.split_count());
        assert_eq!(f16::launch(&a).grid.2, a.split_count());
    }

    #[test]
    fn splits_fill_the_gpu_from_the_shape_alone() {
        // H100: 132 SMs. 4096 rows (64 blocks) x 56 tiles: 5 splits of >= 4 tiles.
        assert_eq!(splits(4096, 56, None, 132), 5);
        assert_eq!(splits(4096, 16, None, 132), 4);
        assert_eq!(splits(14336, 16, None, 132), 2);
        assert_eq!(splits(128256, 16, None, 132), 1);
        assert_eq!(splits(64, 2, None, 132), 1);
        // By token count: one block of 64 tokens as None; 512 tokens fill the GPU unsplit.
        assert_eq!(splits(4096, 56, Some(64), 132), 5);
        assert_eq!(splits(4096, 56, Some(512), 132), 1);
        assert_eq!(splits(4096, 56, Some(128), 132), 3);
    }
}
