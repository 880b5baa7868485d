//! The grouped (expert-batched) f16 GEMM for mixture-of-experts prompts: every selected
//! expert of a step multiplied by the tokens routed to it, on the tensor cores, in one
//! launch per projection. The grouped GEMV (`crate::moe`) reads an expert's weights once
//! per eight tokens, so a 512-token prompt of Qwen3-30B-A3B (128 experts, 8 a token: about
//! 32 tokens an expert) read every expert four times, through the GEMV's instruction-heavy
//! dot products; here each block stages its 128 rows of one expert once, as f16, for up to
//! 128 of that expert's tokens.
//!
//! The work list is the MoE plan (`moe::plan_kernel`) made with [`TILE_TOKENS`] tokens a
//! tile: tile `j` is `[expert, count, slot_0 .. slot_127]`, slot `s = t * k + i` being the
//! output row of token `t`'s `i`-th expert; a count of 0 is an unused tile. The grid is
//! row blocks x tiles (x 2 for the paired gate and up arrays, as the GEMV's): a block
//! reads its tile's expert and slots, gathers the slots' f16 activation rows (`slot /
//! x_div`: one row per token, or one per slot for the down projection) straight into
//! shared memory with `cp.async`, and stores its outputs to the slots' rows. Everything
//! between is the dense f16 GEMM's body (`f16::multiply`: staging, `ldmatrix`, `mma`), and
//! the weights are the same repacked rows, expert `e` at `w + e * expert_bytes`.
//!
//! Each output is one f32 `mma` chain over K in a fixed order, whatever else shares its
//! tile, so where the plan puts a slot does not change its bits.
//!
//! CPU twin: [`cpu_with_magnitude`] (per expert, the f16 GEMM's twin on the gathered rows).

use smelt_ptx::{Dim, Kernel, Load, Reg, Special, U32, U64};

use super::f16::{self, GemmF16Format};
use super::{store_outputs, Out, Rows, THREADS};
use crate::formats::{Q4K, Q6K};
use crate::ops::{kernel_params, Launch};
use crate::{GgmlType, KernelError};

/// Tokens (slots) per tile of the plan the kernel reads: a block's tokens.
pub const TILE_TOKENS: usize = f16::BN as usize;
/// Words of one tile of that plan (`moe::tile_words`).
const TILE_WORDS: u32 = f16::BN + 2;

/// Average tokens an expert at and above which a step's expert matmuls take the grouped
/// GEMM instead of the grouped GEMV (whose largest tile is eight tokens), as measured on an
/// H100 (`bench/gpu/moe.sh`, bench/RESULTS.md 2026-11-27; one Qwen3-30B-A3B layer, Q4_K):
/// GEMM / GEMV time 1.17 at 2 an expert, 0.66 at 4, 0.33 at 8, 0.11 at 32; a 512-token
/// prompt of the whole model 19,109 tok/s against 2,152 on the GEMV (llama.cpp 10,348).
/// `SMELT_CUDA_MOE_GEMM_MIN` overrides it.
pub const MIN_PER_EXPERT: usize = 4;

/// Whether a step of `n_slots` (token, expert) slots over `n_expert` experts takes the
/// grouped GEMM: at least `min_per_expert` slots an expert on average (0: always,
/// `usize::MAX`: never).
pub fn preferred(n_slots: usize, n_expert: usize, min_per_expert: usize) -> bool {
    n_slots >= min_per_expert.saturating_mul(n_expert.max(1))
}

/// Formats with a grouped GEMM, and their kernels.
pub const TYPES: [(GgmlType, &str); 2] = [
    (GgmlType::Q4_K, Q4K::GROUPED_NAME),
    (GgmlType::Q6_K, Q6K::GROUPED_NAME),
];

/// The grouped GEMM's kernel name for `ty`, if it has one.
pub fn name(ty: GgmlType) -> Option<&'static str> {
    TYPES.iter().find(|(t, _)| *t == ty).map(|(_, n)| *n)
}

/// The grouped GEMMs, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    vec![
        (Q4K::GROUPED_NAME.to_string(), Box::new(kernel::<Q4K>)),
        (Q6K::GROUPED_NAME.to_string(), Box::new(kernel::<Q6K>)),
    ]
}

kernel_params! {
    /// Arguments of the grouped GEMM ([`kernel`]): expert weights `w` (`nrows` rows of
    /// `row_bytes` each, experts `expert_bytes` apart), the f16 activation rows `x`
    /// (`f16::act_kernel`, `ntiles` 256-value tiles a row), outputs `y` (one row of `nrows`
    /// floats per slot), the plan's `tiles`, `x_div` (the plan's `k` for one activation row
    /// per token, 1 for one per slot), and the second array `w2`/`y2` of a paired launch
    /// (the same as `w`/`y` when unpaired).
    GroupedArgs, GroupedRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        tiles: Ptr,
        nrows: U32,
        ntiles: U32,
        row_bytes: U32,
        expert_bytes: U32,
        x_div: U32,
        w2: Ptr,
        y2: Ptr,
    }
}

/// The launch of the grouped GEMM: `nrows` rows an expert, the plan's `max_tiles` tiles,
/// `pair`: two weight arrays of the same shape in one launch.
pub fn launch(nrows: usize, max_tiles: usize, pair: bool) -> Launch {
    Launch::new(
        (
            crate::ops::dim(nrows.div_ceil(f16::BM as usize)),
            crate::ops::dim(max_tiles),
            1 + pair as u32,
        ),
        (THREADS, 1, 1),
    )
}

/// `y[s][r] = W[e][r] . x[s / x_div]` for every slot `s` of every used tile (expert `e`),
/// on f16 tensor cores: see the module doc. Parameters [`GroupedArgs`]; launch [`launch`].
pub fn kernel<F: GemmF16Format>(k: &Kernel) {
    f16::attributes(k, F::BLOCKS_PER_SM);
    let a = GroupedRegs::declare(k);
    let smem = f16::Smem::declare(k, f16::PROMPT);
    let tid = k.tid_x();
    // Blocks of z = 1 multiply the second array (its output chosen after the loop, so
    // no register holds it through the loop).
    let second = |k: &Kernel| k.eq(k.special(Special::Ctaid(Dim::Z)), 1u32);
    let wz = k.selp(k.reg(), a.w2, a.w, second(k));
    let row0 = k.mul(k.reg(), k.ctaid_x(), f16::BM);
    let last_row = k.sub(k.reg(), a.nrows, 1u32);
    let tok_stride = k.mul(k.reg(), a.ntiles, (crate::TILE * 2) as u32);
    let desc = k.elem_addr(a.tiles, k.mul(k.reg(), k.ctaid_y(), TILE_WORDS), 4);
    // The tiles are the plan kernel's output: wait for it before reading them.
    k.grid_dep_wait();
    let expert = k.load::<U32>(Load::GLOBAL, desc);
    let count = k.load::<U32>(Load::GLOBAL, desc.at(4));
    k.exit_if(k.eq(count, 0u32));
    let slots = k.add(k.reg::<U64>(), desc, 8u64);
    let last = k.sub(k.reg(), count, 1u32);
    let w = k.add(
        k.reg(),
        wz,
        k.mul_wide(k.reg::<U64>(), expert, a.expert_bytes),
    );
    let rows = Rows {
        w,
        row0,
        last_row,
        row_bytes: a.row_bytes,
    };
    // Token `local` of the block is slot `slots[local]`; past the count, the last slot's
    // row is addressed but not copied.
    let token = |k: &Kernel, local: Reg<U32>| {
        let valid = k.lt(local, count);
        let i = k.min(k.reg(), local, last);
        let s = k.load::<U32>(Load::GLOBAL, k.elem_addr(slots, i, 4));
        (k.div_int(k.reg(), s, a.x_div), valid)
    };
    let tokens = f16::Tokens {
        x: a.x,
        stride: tok_stride,
        hold: false,
    };
    let zero = k.u32(0);
    let p = f16::multiply::<F, 4, 4>(
        k,
        &smem,
        f16::PROMPT,
        tid,
        rows,
        (tokens, token),
        (zero, a.ntiles),
        false,
    );
    // The tile's count and slots read again rather than kept in registers through the
    // loop (at two blocks an SM, 128 registers a thread, they spilled on sm_90).
    let desc = k.elem_addr(a.tiles, k.mul(k.reg(), k.ctaid_y(), TILE_WORDS), 4);
    let count = k.load::<U32>(Load::GLOBAL, desc.at(4));
    let row0 = k.mul(k.reg(), k.ctaid_x(), f16::BM);
    store_outputs(
        k,
        &p.acc,
        Out {
            y: k.selp(k.reg(), a.y2, a.y, second(k)),
            row: k.add(k.reg(), row0, p.arow),
            tok: p.ctok,
            nrows: a.nrows,
            ntok: count,
            slots: Some(k.add(k.reg::<U64>(), desc, 8u64)),
        },
    );
}

/// CPU twin of the grouped GEMM: for every slot `s` (expert `ids[s]`), `y[s][r] =
/// W16[ids[s]][r] . x16[s / x_div]` in f64 ([`f16::cpu_with_magnitude`] per expert on the
/// gathered rows), with each output's `sum |w x|`. `ggml` holds the `n_expert` experts'
/// `nrows` rows each (ggml bytes), `xh` the f16 rows of `f16::act_cpu`.
#[allow(clippy::too_many_arguments)]
pub fn cpu_with_magnitude(
    ty: GgmlType,
    ggml: &[u8],
    n_expert: usize,
    nrows: usize,
    k: usize,
    xh: &[u16],
    ids: &[u32],
    x_div: usize,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let width = f16::act_row_bytes(k) / 2;
    let bad = |what, got, want| KernelError::BadLength { what, got, want };
    if n_expert == 0 || ggml.len() % n_expert != 0 {
        return Err(bad("grouped GEMM experts", ggml.len(), n_expert));
    }
    if x_div == 0 || xh.len() % width != 0 || ids.len().div_ceil(x_div) > xh.len() / width {
        return Err(bad("grouped GEMM activation rows", xh.len(), width));
    }
    let expert_bytes = ggml.len() / n_expert;
    let mut y = vec![0f32; ids.len() * nrows];
    let mut mag = vec![0f64; ids.len() * nrows];
    for e in 0..n_expert {
        let slots: Vec<usize> = (0..ids.len()).filter(|&s| ids[s] as usize == e).collect();
        if slots.is_empty() {
            continue;
        }
        let rows: Vec<u16> = slots
            .iter()
            .flat_map(|&s| {
                xh[s / x_div * width..(s / x_div + 1) * width]
                    .iter()
                    .copied()
            })
            .collect();
        let w = &ggml[e * expert_bytes..(e + 1) * expert_bytes];
        let (ye, me) = f16::cpu_with_magnitude(ty, w, nrows, k, &rows, slots.len())?;
        for (j, &s) in slots.iter().enumerate() {
            y[s * nrows..(s + 1) * nrows].copy_from_slice(&ye[j * nrows..(j + 1) * nrows]);
            mag[s * nrows..(s + 1) * nrows].copy_from_slice(&me[j * nrows..(j + 1) * nrows]);
        }
    }
    if let Some(&e) = ids.iter().find(|&&e| e as usize >= n_expert) {
        return Err(bad("grouped GEMM expert id", e as usize, n_expert));
    }
    Ok((y, mag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_is_each_slots_own_dense_product() {
        let (ne, nrows, k, n, topk) = (3, 5, 256, 4, 2);
        let rb = 144;
        let w: Vec<f32> = (0..ne * nrows * k)
            .map(|i| ((i * 29) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let mut ggml = vec![0u8; ne * nrows * rb];
        for (src, dst) in w.chunks(k).zip(ggml.chunks_mut(rb)) {
            smelt_quant::quantize_row(GgmlType::Q4_K, src, dst).unwrap();
        }
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.7)
            .collect();
        let xh = f16::act_cpu(&x, k).unwrap();
        let ids = [2u32, 0, 0, 1, 2, 1, 0, 2];
        let (y, mag) =
            cpu_with_magnitude(GgmlType::Q4_K, &ggml, ne, nrows, k, &xh, &ids, topk).unwrap();
        let width = f16::act_row_bytes(k) / 2;
        for (s, &e) in ids.iter().enumerate() {
            let t = s / topk;
            let we = &ggml[e as usize * nrows * rb..(e as usize + 1) * nrows * rb];
            let row = &xh[t * width..(t + 1) * width];
            let (want, wm) = f16::cpu_with_magnitude(GgmlType::Q4_K, we, nrows, k, row, 1).unwrap();
            assert_eq!(&y[s * nrows..(s + 1) * nrows], &want[..], "slot {s}");
            assert_eq!(&mag[s * nrows..(s + 1) * nrows], &wm[..]);
        }
        // One activation row per slot (the down projection's shape).
        let xs: Vec<f32> = (0..ids.len() * k).map(|i| (i % 11) as f32 * 0.1).collect();
        let xsh = f16::act_cpu(&xs, k).unwrap();
        let (y1, _) =
            cpu_with_magnitude(GgmlType::Q4_K, &ggml, ne, nrows, k, &xsh, &ids, 1).unwrap();
        let we = &ggml[2 * nrows * rb..3 * nrows * rb];
        let (want, _) =
            f16::cpu_with_magnitude(GgmlType::Q4_K, we, nrows, k, &xsh[4 * width..5 * width], 1)
                .unwrap();
        assert_eq!(&y1[4 * nrows..5 * nrows], &want[..]);
        assert!(cpu_with_magnitude(GgmlType::Q4_K, &ggml, ne, nrows, k, &xh, &[3], 1).is_err());
        assert!(cpu_with_magnitude(GgmlType::Q4_K, &ggml, ne, nrows, k, &xh, &ids, 1).is_err());
    }

    #[test]
    fn launch_rule_and_names() {
        let l = launch(768, 160, true);
        assert_eq!(l.grid, (6, 160, 2));
        assert_eq!(l.block, (THREADS, 1, 1));
        assert_eq!(launch(2048, 0, false).grid, (16, 1, 1));
        // Qwen3-30B-A3B: 128 experts, 8 a token: a 512-token prompt (32 an expert) and
        // 64 decoding sequences (4) take the GEMM, 32 decoding sequences (2) the GEMV.
        assert!(preferred(512 * 8, 128, MIN_PER_EXPERT));
        assert!(preferred(64 * 8, 128, MIN_PER_EXPERT));
        assert!(!preferred(32 * 8, 128, MIN_PER_EXPERT));
        assert!(preferred(1, 128, 0) && !preferred(1 << 40, 128, usize::MAX));
        assert_eq!(name(GgmlType::Q4_K), Some("gemm_f16_moe_q4_k"));
        assert_eq!(name(GgmlType::Q8_0), None);
        // The plan's tiles are the block's tokens.
        assert_eq!(crate::moe::tile_words(TILE_TOKENS), TILE_WORDS as usize);
    }

    #[test]
    fn grouped_gemms_build_for_both_targets() {
        crate::catalog::assert_builds(catalog, &TYPES.map(|(_, n)| n));
    }
}
