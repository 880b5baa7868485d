//! Which kernel multiplies a matrix: one pure function of the weight type, the matrix's
//! shape and the token count, over the measured crossovers in [`MatmulOptions`] (read once
//! when the backend opens) and the shape rules of the kernel modules, each of which cites
//! the H100 measurement it came from (`gemm::f16::preferred`, `gemm::f16_small::preferred`,
//! `gemm::narrow::MAX_TOKENS`, `gemm::MIN_TOKENS`).
//!
//! Why apart from the launch code: the choice was an if-chain inside the matmul, so what a
//! shape runs on could only be seen on a GPU. Here it is data the CPU tests check for the
//! shapes of the models we measure, and one place to change when a new kernel wins.

use smelt_gguf::GgmlType;
use smelt_kernels::fused::Sink;
use smelt_kernels::gemm;

use super::options::MatmulOptions;

/// A tensor-core GEMM family (they differ in block shape, activation format and K splits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// `gemm::narrow`: weights straight into `mma` fragments, batches of a few dozen, in
    /// its warp layout and blocks of its token width.
    Narrow(gemm::narrow::Layout, u32),
    /// `gemm::f16_small`: the f16 GEMM in blocks as wide as the batch.
    F16Small,
    /// `gemm::f16`: the f16 GEMM of prompts, 128 x 128 blocks.
    F16,
    /// The int8 GEMM (`gemm::kernel`), on q8_1 or the GEMM's own tiles.
    Int8,
}

/// What a matmul of many tokens reads as its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Activations {
    /// f16 rows (`gemm::f16::act_kernel`).
    F16Rows,
    /// The GEMV's q8_1 tiles (float group scales: a scale per 32, as ggml-cpu's dot
    /// products for those formats take).
    Q8_1Tiles,
    /// The int8 GEMM's own tiles (the K-quants: a scale per 256, as ggml-cpu's Q8_K).
    GemmTiles,
}

/// The kernel a matmul runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Choice {
    /// The GEMV, at most `gemv::MAX_TOKENS` tokens a launch.
    Gemv,
    /// A tensor-core GEMM: its family and kernel name.
    Gemm { family: Family, name: &'static str },
}

impl Family {
    /// The activations this family reads for weights of type `ty`.
    pub(super) fn activations(self, ty: GgmlType) -> Activations {
        match self {
            Family::Narrow(..) | Family::F16Small | Family::F16 => Activations::F16Rows,
            Family::Int8 if gemm::reads_q8_1_tiles(ty) => Activations::Q8_1Tiles,
            Family::Int8 => Activations::GemmTiles,
        }
    }

    /// K splits for `rows` x `ntiles` tiles and `n` tokens on `sm_count` SMs; with
    /// `batch_invariant` the int8 GEMM splits by shape only (the other families are off
    /// in that mode).
    pub(super) fn splits(
        self,
        ty: GgmlType,
        rows: usize,
        ntiles: usize,
        n: usize,
        sm_count: usize,
        batch_invariant: bool,
    ) -> usize {
        match self {
            Family::Narrow(layout, width) => {
                gemm::narrow::splits_for(ty, rows, ntiles, n, sm_count, (width, layout))
            }
            Family::F16Small => gemm::f16_small::splits(rows, ntiles, n, sm_count),
            Family::F16 => gemm::f16::splits(rows, ntiles, Some(n), sm_count),
            Family::Int8 => gemm::splits(rows, ntiles, (!batch_invariant).then_some(n), sm_count),
        }
    }

    /// The launch shape of `a` (weights of type `ty`) on this family's kernels.
    pub(super) fn launch(self, ty: GgmlType, a: &gemm::Args) -> smelt_kernels::ops::Launch {
        match self {
            Family::Narrow(layout, width) => gemm::narrow::launch_width(ty, a, layout, width),
            Family::F16Small => gemm::f16_small::launch(a),
            Family::F16 => gemm::f16::launch(a),
            Family::Int8 => a.launch(),
        }
    }
}

/// What the norms and the GLU write beside their f32 output for the matmuls of `n`
/// tokens that read it (when `f16_rows`, `FuseOptions::f16_rows`): the narrow GEMM's f16
/// rows where some weight type takes it at that count (every type with a narrow GEMM from
/// [`gemm::narrow::MIN_TOKENS`], Q6_K from 16, to `gemm_narrow_max_tokens`), else the
/// GEMV's q8_1 tiles. A matmul that wants the other form makes it from the f32 output, as
/// it did before this choice (one launch).
pub(super) fn fused_sink(m: &MatmulOptions, f16_rows: bool, n: usize) -> Sink {
    let min = m.gemm_narrow_min_tokens.unwrap_or(gemm::narrow::MIN_TOKENS);
    if f16_rows && (min..=m.gemm_narrow_max_tokens).contains(&n) {
        Sink::F16Rows
    } else {
        Sink::Q8_1
    }
}

/// The kernel for `n` tokens times a `rows` x `cols` matrix of type `ty`. `split_norm`: the
/// input is a split norm's q8_1 tiles standing for an output not written yet, which only
/// the GEMV reads (asked only when a GEMM is otherwise possible: it takes a lock, and
/// single-token matmuls never need it). In order: fewer than `gemm_min_tokens` tokens, a type without a GEMM or
/// a split norm take the GEMV; else the narrow GEMM from `gemm_narrow_min_tokens` (which
/// may be under `gemm_min_tokens`) up to `gemm_narrow_max_tokens`, the
/// batch-wide f16 blocks up to `gemm_small_max_tokens` where their shape rule says, the f16
/// GEMM where its rule (or `gemm_f16_min_tokens`) says, the int8 GEMM otherwise.
pub(super) fn choose(
    m: &MatmulOptions,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    split_norm: impl FnOnce() -> bool,
) -> Choice {
    let Some(int8) = gemm::name(ty) else {
        return Choice::Gemv;
    };
    let width = gemm::narrow::block_tokens_up_to(n, m.narrow_max_width);
    let layout = m
        .narrow_layout
        .unwrap_or_else(|| gemm::narrow::default_layout_for(ty, width));
    let narrow_min = m
        .gemm_narrow_min_tokens
        .unwrap_or_else(|| gemm::narrow::min_tokens(ty));
    let narrow = gemm::narrow::name_for(ty, width, layout)
        .filter(|_| (narrow_min..=m.gemm_narrow_max_tokens).contains(&n));
    // The narrow GEMM may take over from the GEMV earlier than the other GEMMs.
    let min = match narrow {
        Some(_) => m.gemm_min_tokens.min(narrow_min),
        None => m.gemm_min_tokens,
    };
    if n < min || split_norm() {
        return Choice::Gemv;
    }
    let gemm = |family, name| Choice::Gemm { family, name };
    if let Some(name) = narrow {
        return gemm(Family::Narrow(layout, width), name);
    }
    if let Some(name) = gemm::f16_small::name(ty, n)
        .filter(|_| n <= m.gemm_small_max_tokens && gemm::f16_small::preferred(rows, cols, n))
    {
        return gemm(Family::F16Small, name);
    }
    let f16_wins = match m.gemm_f16_min_tokens {
        Some(min) => n >= min,
        None => gemm::f16::preferred(rows, n),
    };
    if let Some(name) = gemm::f16::name(ty).filter(|_| f16_wins) {
        return gemm(Family::F16, name);
    }
    gemm(Family::Int8, int8)
}

#[cfg(test)]
mod tests {
    use super::super::options::CudaOptions;
    use super::*;

    fn family(c: Choice) -> Option<Family> {
        match c {
            Choice::Gemv => None,
            Choice::Gemm { family, .. } => Some(family),
        }
    }

    /// The defaults on the Llama-3-8B shape's matrices (rows x cols) at the token counts of
    /// decode, batched decode and prompts: what bench/RESULTS.md measured fastest.
    #[test]
    fn defaults_pick_the_measured_kernels_for_llama3_8b() {
        let o = CudaOptions::from_vars(|_| None, false);
        let m = &o.matmul;
        let q4 = GgmlType::Q4_K;
        let pick = |rows, cols, n| family(choose(m, q4, rows, cols, n, || false));
        // Q4_K's 16- and 32-token blocks: 16-row warps, a two-tile ring (21:25 UTC).
        let narrow = gemm::narrow::Layout::Rows16Pair;
        assert_eq!(gemm::narrow::default_layout_for(q4, 16), narrow);
        for (rows, cols) in [(14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096)] {
            // One token, and batches under the narrow GEMM's crossover: the GEMV.
            assert_eq!(pick(rows, cols, 1), None);
            assert_eq!(pick(rows, cols, 7), None);
            // 8-64 tokens: the narrow GEMM (its ring, 2026-11-27 13:35 UTC).
            let n8 = gemm::narrow::DEFAULT_LAYOUT[0];
            assert_eq!(pick(rows, cols, 8), Some(Family::Narrow(n8, 8)));
            assert_eq!(pick(rows, cols, 16), Some(Family::Narrow(narrow, 16)));
            assert_eq!(pick(rows, cols, 32), Some(Family::Narrow(narrow, 32)));
            // 33-64 tokens: one 64-token block (2026-11-27 19:20 UTC).
            let n64 = gemm::narrow::DEFAULT_LAYOUT[3];
            assert_eq!(pick(rows, cols, 48), Some(Family::Narrow(n64, 64)));
            assert_eq!(pick(rows, cols, 64), Some(Family::Narrow(n64, 64)));
        }
        // 65-127 tokens: the batch-wide f16 blocks on the MLP's matrices, the int8 GEMM on
        // the small ones (2026-11-27 00:35 UTC).
        assert_eq!(pick(14336, 4096, 96), Some(Family::Int8));
        assert_eq!(pick(1024, 4096, 96), Some(Family::Int8));
        // Prompts: the f16 GEMM from 128 tokens on 4096+ rows, from 256 on every shape.
        assert_eq!(pick(4096, 4096, 128), Some(Family::F16));
        assert_eq!(pick(1024, 4096, 128), Some(Family::Int8));
        assert_eq!(pick(1024, 4096, 512), Some(Family::F16));
    }

    /// Every split launch of a Llama-3-8B-shape batched decode step (Q4_K matrices, the
    /// Q6_K head; 16, 32 and 64 sequences on an H100) has a counter per tile, so the
    /// GEMMs' last blocks sum the splits and the step makes no reduce launch.
    #[test]
    fn batched_decode_split_launches_all_take_the_fixup_on_llama3_8b() {
        let o = CudaOptions::from_vars(|_| None, false);
        let slots = gemm::fixup::counter_slots(132);
        let mut split = 0;
        for (ty, rows, cols) in [
            (GgmlType::Q4_K, 4096, 4096),
            (GgmlType::Q4_K, 1024, 4096),
            (GgmlType::Q4_K, 14336, 4096),
            (GgmlType::Q4_K, 4096, 14336),
            (GgmlType::Q6_K, 128_256, 4096),
            (GgmlType::Q6_K, 1024, 4096),
            (GgmlType::Q6_K, 4096, 14336),
            (GgmlType::Q8_0, 4096, 4096),
            (GgmlType::Q8_0, 14336, 4096),
        ] {
            for n in [8, 16, 32, 64] {
                let Choice::Gemm { family, .. } = choose(&o.matmul, ty, rows, cols, n, || false)
                else {
                    // Only 8 tokens of a type whose narrow GEMM starts at 16 stay on the GEMV.
                    assert!(n < 16, "{rows}x{cols} at {n} tokens is not a GEMM");
                    continue;
                };
                let ntiles = cols / smelt_kernels::TILE;
                let a = gemm::Args {
                    w: 0,
                    x: 0,
                    y: 0,
                    nrows: rows as u32,
                    ntok: n as u32,
                    ntiles: ntiles as u32,
                    row_bytes: 0,
                    splits: family.splits(ty, rows, ntiles, n, 132, false) as u32,
                    fixup: None,
                };
                let l = family.launch(ty, &a);
                if l.grid.2 > 1 {
                    split += 1;
                    let f = a.with_fixup(l.grid, 1, 2, slots);
                    assert!(f.fixed_up() && f.reduce(1).is_none(), "{rows}x{cols} x {n}");
                }
            }
        }
        // Most of them split (the brief's 64 reduce launches a step at 32 sequences).
        assert!(split >= 10, "{split} split launches");
    }

    #[test]
    fn types_without_a_gemm_and_split_norms_stay_on_the_gemv() {
        let o = CudaOptions::from_vars(|_| None, false);
        let m = &o.matmul;
        assert_eq!(
            choose(m, GgmlType::Q4_K, 4096, 4096, 512, || true),
            Choice::Gemv
        );
        // Q6_K (Q4_K_M's attn_v, ffn_down and head) and Q8_0 have narrow GEMMs: 16-64
        // tokens take them, Q8_0 from 8 (measured against the GEMV; Q6_K not), more the
        // int8 GEMM; Q5_K has none: batches take the int8 GEMM, 8 tokens the GEMV.
        let pick = |ty, n| family(choose(m, ty, 4096, 4096, n, || false));
        let narrow = |ty, n| {
            let w = gemm::narrow::block_tokens(n);
            Some(Family::Narrow(gemm::narrow::default_layout_for(ty, w), w))
        };
        assert_eq!(pick(GgmlType::Q6_K, 8), None);
        assert_eq!(pick(GgmlType::Q8_0, 8), narrow(GgmlType::Q8_0, 8));
        for ty in [GgmlType::Q6_K, GgmlType::Q8_0] {
            // Their 16- and 32-token blocks keep the three-tile ring (Q8_0's two-tile ring
            // measured 3% slower at 32 sequences).
            let r16 = Some(Family::Narrow(gemm::narrow::Layout::Rows16, 16));
            assert_eq!(pick(ty, 16), r16);
            assert_eq!(pick(ty, 16), narrow(ty, 16));
            assert_eq!(pick(ty, 32), narrow(ty, 32));
            assert_eq!(pick(ty, 96), Some(Family::Int8));
            // Prompts: the f16 GEMM (measured faster, 2026-11-28).
            assert_eq!(pick(ty, 512), Some(Family::F16));
        }
        assert_eq!(pick(GgmlType::Q5_K, 32), Some(Family::Int8));
        assert_eq!(pick(GgmlType::Q5_K, 512), Some(Family::Int8));
        assert_eq!(pick(GgmlType::Q5_K, 8), None);
        assert_eq!(
            choose(m, GgmlType::F32, 4096, 4096, 512, || false),
            Choice::Gemv
        );
    }

    #[test]
    fn the_block_width_cap_decides_how_many_blocks_a_batch_takes() {
        let mut o = CudaOptions::from_vars(|_| None, false);
        assert_eq!(o.matmul.narrow_max_width, 64);
        let pick =
            |o: &CudaOptions, n| family(choose(&o.matmul, GgmlType::Q4_K, 4096, 4096, n, || false));
        let r16 = gemm::narrow::Layout::Rows16;
        let pair = gemm::narrow::Layout::Rows16Pair;
        assert_eq!(pick(&o, 32), Some(Family::Narrow(pair, 32)));
        assert_eq!(pick(&o, 33), Some(Family::Narrow(r16, 64)));
        assert_eq!(pick(&o, 64), Some(Family::Narrow(r16, 64)));
        let Choice::Gemm { name, .. } = choose(&o.matmul, GgmlType::Q8_0, 4096, 4096, 50, || false)
        else {
            panic!("50 tokens of Q8_0 take a GEMM");
        };
        assert_eq!(name, "gemm_narrow64_r16_q8_0");
        o.matmul.narrow_max_width = 32;
        assert_eq!(pick(&o, 64), Some(Family::Narrow(pair, 32)));
        let o = CudaOptions::from_vars(
            |v| (v == "SMELT_CUDA_GEMM_NARROW_WIDTH").then(|| "32".to_string()),
            false,
        );
        assert_eq!(o.matmul.narrow_max_width, 32);
    }

    #[test]
    fn batch_invariant_mode_uses_one_kernel_for_every_batch() {
        let o = CudaOptions::from_vars(|_| None, true);
        let m = &o.matmul;
        for n in [1, 2, 16, 32, 64, 512] {
            assert_eq!(
                family(choose(m, GgmlType::Q4_K, 4096, 4096, n, || false)),
                Some(Family::Int8),
                "{n} tokens"
            );
        }
    }

    #[test]
    fn each_family_reads_its_activations() {
        assert_eq!(
            Family::Narrow(gemm::narrow::Layout::Rows32, 32).activations(GgmlType::Q4_K),
            Activations::F16Rows
        );
        assert_eq!(
            Family::Int8.activations(GgmlType::Q4_K),
            Activations::GemmTiles
        );
        assert_eq!(
            Family::Int8.activations(GgmlType::Q4_0),
            Activations::Q8_1Tiles
        );
    }

    /// The norms write the f16 rows exactly where a Q4_K matmul after them takes the
    /// narrow GEMM, and q8_1 tiles where it takes the GEMV; never in batch-invariant mode
    /// (no narrow GEMM) or with the fusion off.
    #[test]
    fn the_fused_sink_follows_the_narrow_gemm() {
        let o = CudaOptions::from_vars(|_| None, false);
        let m = &o.matmul;
        assert!(o.fuse.f16_rows);
        for n in [1, 2, 7, 8, 16, 33, 64, 65, 512] {
            let narrow = matches!(
                family(choose(m, GgmlType::Q4_K, 4096, 4096, n, || false)),
                Some(Family::Narrow(..))
            );
            let sink = fused_sink(m, true, n);
            assert_eq!(sink == Sink::F16Rows, narrow, "{n} tokens");
            if n < 8 {
                assert_eq!(
                    choose(m, GgmlType::Q4_K, 4096, 4096, n, || false),
                    Choice::Gemv
                );
            }
            assert_eq!(fused_sink(m, false, n), Sink::Q8_1);
        }
        let inv = CudaOptions::from_vars(|_| None, true);
        assert_eq!(fused_sink(&inv.matmul, true, 16), Sink::Q8_1);
        let off = CudaOptions::from_vars(
            |v| (v == "SMELT_CUDA_FUSE_F16_ROWS").then(|| "0".to_string()),
            false,
        );
        assert!(!off.fuse.f16_rows);
    }
}
