//! A group's matrices (a layer's Q, K and V; gate and up) multiplied by one GEMM launch,
//! each member's output still a tensor of its own.
//!
//! Why: at 8-64 tokens the narrow GEMM ([`super::narrow`]) of a small matrix is mostly
//! its fixed costs. The Llama-3-8B shape's K and V (1,024 rows each) are 8 row blocks: to
//! fill the GPU they run 8 splits of 2 tiles, each block filling its ring and draining it
//! again, 9 us a launch for 2.4 MB (H100, Nsight Compute 2026-11-27), and each has its own
//! split reduce. The loader already places a group's members one after the other in
//! weight memory (`load_weight_group`), so one launch over all their rows reads them as
//! one matrix; its split workspace holds the rows of all members, and the reduce that
//! sums the splits ([`reduce_kernel`]) writes row `r` of token `t` to the member `m` that
//! owns it, at `y_m + t * rows_m + (r - off_m)`, so the members' outputs keep the layout
//! every other op reads (`[ntok][rows_m]`, contiguous).
//!
//! A grouped launch always splits K (at least two splits), so the members' outputs are
//! only ever written by the reduce; the GEMM kernels themselves are unchanged.

use smelt_ptx::{Kernel, Store, U32, U64};

use crate::ops::elementwise::{gelu, silu, Glu};
use crate::ops::{kernel_params, Launch};

/// The most members a grouped launch takes (Q, K, V).
pub const MAX_MEMBERS: usize = 3;

/// Name of [`reduce_kernel`].
pub const REDUCE: &str = "gemm_reduce_members";

/// Threads per block of [`reduce_kernel`].
pub const REDUCE_THREADS: u32 = 256;

kernel_params! {
    /// Arguments of [`reduce_kernel`]: the workspace `part` of `splits` slices of `ntok x
    /// nrows` floats; member outputs `y0`, `y1`, `y2` (unused ones 0), member `m` owning
    /// rows `off_m..off_{m+1}` (`off_0 = 0`, `off_3 = nrows`; a member past the last has
    /// `off1` or `off2` equal to `nrows`).
    ReduceArgs, ReduceRegs {
        part: Ptr,
        y0: Ptr,
        y1: Ptr,
        y2: Ptr,
        off1: U32,
        off2: U32,
        nrows: U32,
        ntok: U32,
        splits: U32,
    }
}

impl ReduceArgs {
    /// The reduce of workspace `part` (`splits` slices of `ntok` rows of all members' rows)
    /// into the members `(output address, rows)`, in order; `None` for an empty group or
    /// more than [`MAX_MEMBERS`].
    pub fn new(part: u64, members: &[(u64, u32)], ntok: u32, splits: u32) -> Option<ReduceArgs> {
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return None;
        }
        let mut ys = [0u64; MAX_MEMBERS];
        let mut ends = [0u32; MAX_MEMBERS];
        let mut end = 0u32;
        for (i, &(y, rows)) in members.iter().enumerate() {
            ys[i] = y;
            end += rows;
            ends[i] = end;
        }
        for e in ends.iter_mut().skip(members.len()) {
            *e = end;
        }
        Some(ReduceArgs {
            part,
            y0: ys[0],
            y1: ys[1],
            y2: ys[2],
            off1: ends[0],
            off2: ends[1],
            nrows: end,
            ntok,
            splits,
        })
    }

    /// The reduce of split GEMM launch `a` (its workspace at `a.y`) into the members
    /// `(output address, rows)`: `None` unless the launch really splits K (at least two
    /// slices: otherwise its blocks store their outputs themselves, in one matrix) and the
    /// members' rows are its rows.
    pub fn for_gemm(a: &super::Args, members: &[(u64, u32)]) -> Option<ReduceArgs> {
        let rows: u32 = members.iter().map(|m| m.1).sum();
        if a.split_count() < 2 || a.fixup.is_some() || rows != a.nrows {
            return None;
        }
        ReduceArgs::new(a.y, members, a.ntok, a.split_count())
    }

    /// One thread an output.
    pub fn launch(&self) -> Launch {
        thread_an_output(self.ntok * self.nrows)
    }
}

/// The launch of a reduce of `n` outputs: one thread each, [`REDUCE_THREADS`] a block.
fn thread_an_output(n: u32) -> Launch {
    Launch::new(
        (n.div_ceil(REDUCE_THREADS).max(1), 1, 1),
        (REDUCE_THREADS, 1, 1),
    )
}

/// `y_m[t][r - off_m] = sum_z part[z][t][r]` for member `m` of row `r`, `z = 0..splits` in
/// order (the plain reduce's order, so each member's values are those its own launch
/// would have summed, split for split, given the same splits). Parameters [`ReduceArgs`].
pub fn reduce_kernel(k: &Kernel) {
    let ReduceRegs {
        part,
        y0,
        y1,
        y2,
        off1,
        off2,
        nrows,
        ntok,
        splits,
    } = ReduceRegs::declare(k);
    let i = k.global_id_x();
    k.grid_dep_wait();
    let n = k.mul(k.reg(), ntok, nrows);
    k.exit_if(k.ge(i, n));
    let sum = super::sum_splits(k, part, i, n, splits);
    // Token t, row r; the member's first row `off` and row count `rows`.
    let t = k.div_int(k.reg(), i, nrows);
    let r = k.sub(k.reg(), i, k.mul(k.reg(), t, nrows));
    let y = k.mov(k.reg::<U64>(), y0);
    let off = k.u32(0);
    let end = k.mov(k.reg::<U32>(), off1);
    let second = k.ge(r, off1);
    k.selp(y, y1, y, second);
    k.selp(off, off1, off, second);
    k.selp(end, off2, end, second);
    let third = k.ge(r, off2);
    k.selp(y, y2, y, third);
    k.selp(off, off2, off, third);
    k.selp(end, nrows, end, third);
    let rows = k.sub(k.reg(), end, off);
    let local = k.sub(k.reg(), r, off);
    let idx = k.mad(k.reg(), t, rows, local);
    k.st(Store::GLOBAL, k.elem_addr(y, idx, 4), sum);
}

/// CPU twin of [`reduce_kernel`]: the members' outputs (`ntok x rows_m` each) of workspace
/// `part` (`splits` slices of `ntok x sum(rows)`).
pub fn reduce_cpu(part: &[f32], rows: &[usize], ntok: usize, splits: usize) -> Vec<Vec<f32>> {
    let nrows: usize = rows.iter().sum();
    let n = ntok * nrows;
    let mut outs: Vec<Vec<f32>> = rows.iter().map(|&r| vec![0f32; ntok * r]).collect();
    for i in 0..n.min(part.len()) {
        let mut sum = part[i];
        for z in 1..splits {
            sum += part[z * n + i];
        }
        let (t, mut r) = (i / nrows, i % nrows);
        for (m, &rm) in rows.iter().enumerate() {
            if r < rm {
                outs[m][t * rm + r] = sum;
                break;
            }
            r -= rm;
        }
    }
    outs
}

/// Name of [`reduce_glu_kernel`] for `act`.
pub const fn reduce_glu_name(act: Glu) -> &'static str {
    match act {
        Glu::Silu => "gemm_reduce_members_glu_silu",
        Glu::Gelu => "gemm_reduce_members_glu_gelu",
    }
}

kernel_params! {
    /// Arguments of [`reduce_glu_kernel`]: the workspace `part` of a gate|up launch
    /// (`splits` slices of `ntok x 2 rows` floats: gate's `rows` rows, then up's), the
    /// gate output `gate` (`ntok x rows` floats) and its f16 rows `h` (`ntok x rows`
    /// halves; `rows` a multiple of 256).
    GluReduceArgs, GluReduceRegs {
        part: Ptr,
        gate: Ptr,
        h: Ptr,
        rows: U32,
        ntok: U32,
        splits: U32,
    }
}

impl GluReduceArgs {
    /// One thread an output.
    pub fn launch(&self) -> Launch {
        thread_an_output(self.ntok * self.rows)
    }
}

/// The gate|up group's split reduce and the GLU after it in one launch: `gate[t][r] =
/// act(g) * u`, `g` and `u` the sums of gate's and up's row `r` over the splits in order
/// ([`reduce_kernel`]'s sums), the product as `fused::glu_kernel` computes it, and its
/// f16 rows for the down projection's narrow GEMM (`fused::Sink::F16Rows`). So the same
/// bits as the reduce, then the GLU, with one launch and up's output never written.
/// Parameters [`GluReduceArgs`].
pub fn reduce_glu_kernel(k: &Kernel, act: Glu) {
    let GluReduceRegs {
        part,
        gate,
        h,
        rows,
        ntok,
        splits,
    } = GluReduceRegs::declare(k);
    let i = k.global_id_x();
    k.grid_dep_wait();
    let n_out = k.mul(k.reg(), ntok, rows);
    k.exit_if(k.ge(i, n_out));
    let t = k.div_int(k.reg(), i, rows);
    let r = k.sub(k.reg(), i, k.mul(k.reg(), t, rows));
    let two = k.shl(k.reg(), rows, 1u32);
    let n = k.mul(k.reg(), ntok, two);
    let ig = k.mad(k.reg(), t, two, r);
    let iu = k.add(k.reg(), ig, rows);
    let g = super::sum_splits(k, part, ig, n, splits);
    let u = super::sum_splits(k, part, iu, n, splits);
    let y = match act {
        Glu::Silu => silu(k, g),
        Glu::Gelu => gelu(k, g),
    };
    let v = k.mul(k.reg(), y, u);
    k.st(Store::GLOBAL, k.elem_addr(gate, i, 4), v);
    crate::fused::store_f16_row_value(k, v, i, h);
}

/// CPU twin of [`reduce_glu_kernel`]: [`reduce_cpu`]'s gate and up sums of workspace
/// `part` (`splits` slices of `ntok x 2 rows`), then the GLU's twin
/// (`ops::elementwise::glu_cpu`); the f16 rows are `gemm::f16::act_cpu` of the result.
pub fn reduce_glu_cpu(part: &[f32], rows: usize, ntok: usize, splits: usize, act: Glu) -> Vec<f32> {
    let mut outs = reduce_cpu(part, &[rows, rows], ntok, splits);
    let up = outs.pop().unwrap_or_default();
    let mut gate = outs.pop().unwrap_or_default();
    crate::ops::elementwise::glu_cpu(&mut gate, &up, act);
    gate
}

/// The kernels of this module, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    vec![
        (REDUCE.to_string(), Box::new(reduce_kernel)),
        (
            reduce_glu_name(Glu::Silu).to_string(),
            Box::new(|k: &Kernel| reduce_glu_kernel(k, Glu::Silu)),
        ),
        (
            reduce_glu_name(Glu::Gelu).to_string(),
            Box::new(|k: &Kernel| reduce_glu_kernel(k, Glu::Gelu)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_their_rows_and_the_last_offsets_close_the_group() {
        let a = ReduceArgs::new(8, &[(100, 4096), (200, 1024), (300, 1024)], 16, 8).unwrap();
        assert_eq!((a.off1, a.off2, a.nrows), (4096, 5120, 6144));
        assert_eq!((a.y0, a.y1, a.y2), (100, 200, 300));
        assert_eq!(a.launch().grid.0, (16 * 6144u32).div_ceil(REDUCE_THREADS));
        // Two members (gate | up): the third is empty, its offset the end.
        let b = ReduceArgs::new(8, &[(100, 14336), (200, 14336)], 64, 2).unwrap();
        assert_eq!((b.off1, b.off2, b.nrows, b.y2), (14336, 28672, 28672, 0));
        assert!(ReduceArgs::new(8, &[], 1, 2).is_none());
        assert!(ReduceArgs::new(8, &[(1, 1); 4], 1, 2).is_none());
        // From a GEMM launch: its real split count (3 tiles in slices of 2: two), none
        // unsplit or with other rows.
        let mut g = super::super::Args::q4_k_for_test(6, 16, 3);
        g.splits = 2;
        let r = ReduceArgs::for_gemm(&g, &[(1, 4), (2, 1), (3, 1)]).unwrap();
        assert_eq!((r.splits, r.nrows, r.ntok), (2, 6, 16));
        assert!(ReduceArgs::for_gemm(&g, &[(1, 4), (2, 1)]).is_none());
        g.splits = 1;
        assert!(ReduceArgs::for_gemm(&g, &[(1, 4), (2, 1), (3, 1)]).is_none());
    }

    #[test]
    fn the_glu_twin_is_the_reduce_then_the_glu() {
        // Two tokens of gate|up rows of 2, two splits.
        let (rows, ntok, splits) = (2usize, 2usize, 2usize);
        let n = ntok * 2 * rows;
        let part: Vec<f32> = (0..splits * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let y = reduce_glu_cpu(&part, rows, ntok, splits, Glu::Silu);
        for t in 0..ntok {
            for r in 0..rows {
                let at = |m: usize| t * 2 * rows + m * rows + r;
                let g = part[at(0)] + part[n + at(0)];
                let u = part[at(1)] + part[n + at(1)];
                assert_eq!(y[t * rows + r], g / (1.0 + (-g).exp()) * u, "{t} {r}");
            }
        }
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        for act in [Glu::Silu, Glu::Gelu] {
            m.kernel(reduce_glu_name(act), |k| reduce_glu_kernel(k, act))
                .unwrap();
        }
        assert!(m.to_ptx().contains("ex2.approx"));
    }

    #[test]
    fn the_twin_sums_splits_in_order_into_each_member() {
        let (rows, ntok, splits) = ([3usize, 2, 1], 2usize, 3usize);
        let n = ntok * 6;
        let part: Vec<f32> = (0..splits * n).map(|i| i as f32).collect();
        let outs = reduce_cpu(&part, &rows, ntok, splits);
        let sum = |i: usize| part[i] + part[n + i] + part[2 * n + i];
        // Token 1, global row 4: member 1, its row 1.
        assert_eq!(outs[1][2 + 1], sum(6 + 4));
        assert_eq!(outs[0][0], sum(0));
        assert_eq!(outs[2][1], sum(6 + 5));
        assert_eq!(outs.iter().map(Vec::len).collect::<Vec<_>>(), vec![6, 4, 2]);
    }

    #[test]
    fn the_kernel_builds() {
        crate::catalog::assert_builds(catalog, &[REDUCE]);
    }
}
