//! Quantized matrix times activations, as ggml does it: each activation row is quantized
//! once to the weight format's paired type (Q8_0, Q8_1, Q8_K, or the float type itself),
//! then every output is one `vec_dot` of a weight row with an activation row.
//!
//! The batched path walks the weights in chunks of rows spread over rayon's threads, and
//! each chunk meets every token while it is hot in cache, so a prefill reads each weight
//! row from memory once for the whole batch.

use bytemuck::Zeroable;
use rayon::prelude::*;
use smelt_quant::{fp, iq4, kquants, legacy, Block, GgmlType};

use super::act_quant::quantize_act;
use super::ggml_dot::GgmlDot;
use super::ggml_math;
use super::spin_pool;

use crate::EngineError;

// A child of this module (its only user), so the backend's module list stays as it is.
#[cfg(target_arch = "x86_64")]
#[path = "gemm.rs"]
mod gemm;

/// Weight rows per rayon task: enough work to amortize the task, small enough that the
/// rows stay in L1/L2 while every token of the batch passes over them.
const ROWS_PER_TASK: usize = 16;
/// Tokens per pass over a chunk of rows, so the activations touched also stay in cache.
const TOKENS_PER_TILE: usize = 64;

/// `out[t * rows + r] = w[r] · x[t]` for a weight of `ty` with `rows` rows of `cols`,
/// stored `stride` weights apart (zero blocks past `cols`).
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    stride: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), EngineError> {
    matmul_ordered(ty, w, rows, cols, stride, x, out, false)
}

/// [`matmul`], or with `invariant` every token in the one-token order whatever the batch
/// (`Cpu::batch_invariant`): ggml's batch orders (repacked Q4_K's gemm for whole groups
/// of four tokens, Q6_K's tiled matmul from eight, tinyBLAS for float weights) depend on
/// how many tokens the step has.
#[allow(clippy::too_many_arguments)]
pub fn matmul_ordered(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    stride: usize,
    x: &[f32],
    out: &mut [f32],
    invariant: bool,
) -> Result<(), EngineError> {
    let how = How {
        tiles: tiles_on(),
        id: false,
        invariant,
    };
    matmul_dispatch(ty, w, rows, cols, stride, x, out, how)
}

/// Which kernels a matmul may take: the tiled batch kernels (`tiles`, the same bits either
/// way), a `MUL_MAT_ID` expert's orders (`id`: ggml computes it with the single-token
/// order except where its tiled K-quant matmul takes the expert's rows, Q6_K from eight
/// rows on; repacked Q4_K experts always take the gemv), or the one-token order for every
/// token (`invariant`).
#[derive(Clone, Copy)]
struct How {
    tiles: bool,
    id: bool,
    invariant: bool,
}

#[allow(clippy::too_many_arguments)]
fn matmul_dispatch(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    stride: usize,
    x: &[f32],
    out: &mut [f32],
    how: How,
) -> Result<(), EngineError> {
    macro_rules! go {
        ($B:ty) => {
            matmul_typed::<$B>(w, rows, cols, stride, x, out, how)
        };
    }
    match ty {
        GgmlType::F32 => go!(fp::F32),
        GgmlType::F16 => go!(fp::F16),
        GgmlType::BF16 => go!(fp::BF16),
        GgmlType::Q4_0 => go!(legacy::BlockQ4_0),
        GgmlType::Q4_1 => go!(legacy::BlockQ4_1),
        GgmlType::Q5_0 => go!(legacy::BlockQ5_0),
        GgmlType::Q5_1 => go!(legacy::BlockQ5_1),
        GgmlType::Q8_0 => go!(legacy::BlockQ8_0),
        GgmlType::Q2_K => go!(kquants::BlockQ2K),
        GgmlType::Q3_K => go!(kquants::BlockQ3K),
        GgmlType::Q4_K => go!(kquants::BlockQ4K),
        GgmlType::Q5_K => go!(kquants::BlockQ5K),
        GgmlType::Q6_K => go!(kquants::BlockQ6K),
        GgmlType::IQ4_NL => go!(iq4::BlockIQ4NL),
        GgmlType::IQ4_XS => go!(iq4::BlockIQ4XS),
        _ => Err(EngineError::UnsupportedType {
            name: "matmul weight".into(),
            ty,
        }),
    }
}

/// Whether [`matmul`] takes weights of this type.
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | IQ4_NL
            | IQ4_XS
    )
}

/// `out[s] = W[ids[s]] x[row(s)]` for every slot `s` of a step's expert choices
/// (`ids.len()` slots, `k` per token): `w` holds `n_expert` matrices of `rows` x `cols`,
/// `x` has one row per token (`row(s) = s / k`) or one per slot (`row(s) = s`). As ggml's
/// `MUL_MAT_ID`, the slots are grouped by expert and each expert multiplies its rows in one
/// call (the weights read once per step), in ggml's per-expert order.
#[allow(clippy::too_many_arguments)]
pub fn matmul_id(
    ty: GgmlType,
    w: &[u8],
    n_expert: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    ids: &[usize],
    k: usize,
    out: &mut [f32],
    invariant: bool,
) -> Result<(), EngineError> {
    let per_slot = x.len() == ids.len() * cols;
    let expert_bytes = rows * ty.type_size() * cols / ty.block_size();
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (s, &e) in ids.iter().enumerate() {
        if e >= n_expert {
            return Err(EngineError::BadMetadata {
                key: "matmul_id".into(),
                why: format!("expert {e} of {n_expert}"),
            });
        }
        by_expert[e].push(s);
    }
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for (e, slots) in by_expert.iter().enumerate() {
        if slots.is_empty() {
            continue;
        }
        xs.clear();
        for &s in slots {
            let r = if per_slot { s } else { s / k.max(1) };
            xs.extend_from_slice(&x[r * cols..(r + 1) * cols]);
        }
        ys.clear();
        ys.resize(slots.len() * rows, 0.0);
        let we = &w[e * expert_bytes..(e + 1) * expert_bytes];
        let how = How {
            tiles: tiles_on(),
            id: true,
            invariant,
        };
        matmul_dispatch(ty, we, rows, cols, cols, &xs, &mut ys, how)?;
        for (&s, y) in slots.iter().zip(ys.chunks(rows)) {
            out[s * rows..(s + 1) * rows].copy_from_slice(y);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn matmul_typed<B: GgmlDot>(
    w: &[u8],
    rows: usize,
    cols: usize,
    stride: usize,
    x: &[f32],
    out: &mut [f32],
    how: How,
) -> Result<(), EngineError> {
    // ggml's MUL_MAT_ID runs repacked Q4_K experts through the gemv, and float experts
    // through vec_dot (never tinyBLAS), for every row; the invariant mode every type.
    let single = how.invariant || how.id && matches!(B::TYPE, GgmlType::Q4_K | GgmlType::F32);
    // The legacy formats' tiles keep the one-token order (see `gemm`); the K-quants' do not.
    let tiles = how.tiles
        && (!single || matches!(B::TYPE, GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0));
    let n_tok = x.len() / cols.max(1);
    if n_tok == 0 || rows == 0 {
        return Ok(());
    }
    let w_per_row = stride / B::WEIGHTS;
    let a_per_row = stride / <B::Act as Block>::WEIGHTS;
    let a_used = cols / <B::Act as Block>::WEIGHTS;
    // Loaded weights were checked for size and alignment; a failure here is a misaligned
    // buffer (e.g. from an unaligned in-memory file), which we copy once rather than reject.
    let owned;
    let w: &[B] = match bytemuck::try_cast_slice(w) {
        Ok(w) => w,
        Err(_) => {
            owned = bytemuck::pod_collect_to_vec::<u8, B>(w);
            &owned
        }
    };
    let mut act = vec![<B::Act as Zeroable>::zeroed(); n_tok * a_per_row];
    if n_tok == 1 {
        quantize_act::<B::Act>(x, &mut act[..a_used]);
        // A few tasks per thread: enough to balance, few enough that the per-task cost
        // stays small next to a short row. On the engine's spinning pool (decode).
        let per_task = rows
            .div_ceil(4 * spin_pool::current_threads())
            .max(ROWS_PER_TASK);
        let dst = spin_pool::Disjoint::new(&mut out[..rows]);
        spin_pool::par_for(rows.div_ceil(per_task), |c| {
            let r0 = c * per_task;
            // SAFETY: task c owns rows [r0, r0 + per_task).
            let o = unsafe { dst.range(r0, r0 + per_task) };
            if ggml_math::fma_ok() {
                // SAFETY: AVX2 and FMA were detected at run time.
                unsafe { decode_rows_fma(o, r0, w, w_per_row, &act) }
            } else {
                decode_rows(o, r0, w, w_per_row, &act)
            }
        });
        return Ok(());
    }
    act.par_chunks_mut(a_per_row.max(1))
        .zip(x.par_chunks(cols))
        .for_each(|(a, x)| quantize_act::<B::Act>(x, &mut a[..a_used]));

    #[cfg(target_arch = "x86_64")]
    if super::ggml_dot::simd() && tiles {
        let nb = a_used * <B::Act as Block>::WEIGHTS / B::WEIGHTS;
        // SAFETY: AVX2, FMA and F16C were detected at run time; the shapes are the ones
        // checked above (w: rows x w_per_row, act: n_tok x a_per_row, out: n_tok x rows).
        if unsafe { tiled::<B>(w, rows, w_per_row, &act, a_per_row, nb, n_tok, out) } {
            return Ok(());
        }
    }

    // Row-major per weight row first ([rows, n_tok]) so each task owns a contiguous slice,
    // then transposed into token rows.
    let mut by_row = vec![0f32; rows * n_tok];
    let job = BatchJob {
        w,
        w_per_row,
        act: &act,
        a_per_row,
        n_tok,
        single,
    };
    by_row
        .par_chunks_mut(ROWS_PER_TASK * n_tok)
        .enumerate()
        .for_each(|(c, o)| {
            let r0 = c * ROWS_PER_TASK;
            if ggml_math::fma_ok() {
                // SAFETY: AVX2 and FMA were detected at run time.
                unsafe { batch_rows_fma(&job, o, r0) }
            } else {
                batch_rows(&job, o, r0)
            }
        });
    out.par_chunks_mut(rows).enumerate().for_each(|(t, o)| {
        for (r, y) in o.iter_mut().enumerate() {
            *y = by_row[r * n_tok + t];
        }
    });
    Ok(())
}

/// Fewest tokens for which the legacy formats take the tiled kernels.
#[cfg(target_arch = "x86_64")]
const LEGACY_MIN_TOKENS: usize = 6;

/// Whether the tiled batch kernels run (`SMELT_NO_TILES=1` turns them off, for A/B runs:
/// the bits are the same either way).
fn tiles_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SMELT_NO_TILES").is_none_or(|v| v.is_empty() || v == "0"))
}

/// The register-tiled batch kernels of [`gemm`] for the formats that have one (Q6_K from
/// eight tokens on, as ggml switches to its tiled matmul there); false for the others.
///
/// # Safety
/// AVX2, FMA and F16C are available; shapes as [`gemm::legacy_batch`] documents.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled<B: GgmlDot>(
    w: &[B],
    rows: usize,
    w_per_row: usize,
    act: &[B::Act],
    a_per_row: usize,
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) -> bool {
    use smelt_quant::kquants::{BlockQ4K, BlockQ6K};
    use smelt_quant::legacy::{BlockQ4_1, BlockQ5_0, BlockQ8_0};
    let (wb, ab): (&[u8], &[u8]) = (bytemuck::cast_slice(w), bytemuck::cast_slice(act));
    macro_rules! go {
        ($f:path, $W:ty) => {{
            $f(
                bytemuck::cast_slice::<u8, $W>(wb),
                rows,
                w_per_row,
                bytemuck::cast_slice(ab),
                a_per_row,
                nb,
                n_tok,
                out,
            );
            true
        }};
    }
    match B::TYPE {
        // Unpacking a legacy row costs about what a few tokens' dots cost: small batches
        // (several sequences decoding) stay on the packed 4x2 kernels.
        _ if n_tok < LEGACY_MIN_TOKENS && B::BATCH_IS_SINGLE => false,
        GgmlType::Q4_1 => go!(gemm::legacy_batch::<BlockQ4_1>, BlockQ4_1),
        GgmlType::Q5_0 => go!(gemm::legacy_batch::<BlockQ5_0>, BlockQ5_0),
        GgmlType::Q8_0 => go!(gemm::legacy_batch::<BlockQ8_0>, BlockQ8_0),
        GgmlType::Q4_K => go!(gemm::q4_k_batch, BlockQ4K),
        GgmlType::Q6_K if n_tok >= 8 => go!(gemm::q6_k_batch, BlockQ6K),
        _ => false,
    }
}

/// One task of the decode path: rows `r0..` into `o`, one at a time. (Four rows per pass,
/// as the batched path does, measured 2x slower here on Gemma's 262144-row output matrix:
/// four weight streams at once lose to one when the weights come from memory.)
#[inline(always)]
fn decode_rows<B: GgmlDot>(o: &mut [f32], r0: usize, w: &[B], w_per_row: usize, act: &[B::Act]) {
    for (i, y) in o.iter_mut().enumerate() {
        let r = r0 + i;
        *y = B::ggml_dot(&w[r * w_per_row..(r + 1) * w_per_row], act);
    }
}

/// [`decode_rows`] compiled for AVX2 + FMA, so kernels written as plain Rust (K-quants)
/// vectorize and `mul_add` is one instruction; the bits are the same either way.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn decode_rows_fma<B: GgmlDot>(
    o: &mut [f32],
    r0: usize,
    w: &[B],
    w_per_row: usize,
    act: &[B::Act],
) {
    decode_rows(o, r0, w, w_per_row, act)
}

/// The operands of the batched path.
struct BatchJob<'a, B: GgmlDot> {
    w: &'a [B],
    w_per_row: usize,
    act: &'a [B::Act],
    a_per_row: usize,
    n_tok: usize,
    /// Every output in the single-token order ([`GgmlDot::ggml_dot`]).
    single: bool,
}

/// One task of the batched path: weight rows `r0..` against every token, into `o`
/// (`[row][token]`), in tiles of tokens that stay in cache.
#[inline(always)]
fn batch_rows<B: GgmlDot>(job: &BatchJob<'_, B>, o: &mut [f32], r0: usize) {
    let BatchJob {
        w,
        w_per_row,
        act,
        a_per_row,
        n_tok,
        single,
    } = *job;
    let nr = o.len() / n_tok;
    for t0 in (0..n_tok).step_by(TOKENS_PER_TILE) {
        let t1 = (t0 + TOKENS_PER_TILE).min(n_tok);
        let mut i = 0;
        // Four rows per pass where the batch kernel is the single-token one: four
        // independent accumulation chains, each in ggml's order.
        while B::BATCH_IS_SINGLE && i + 4 <= nr {
            let wr: [&[B]; 4] = std::array::from_fn(|k| {
                let r = r0 + i + k;
                &w[r * w_per_row..(r + 1) * w_per_row]
            });
            let tok = |t: usize| &act[t * a_per_row..(t + 1) * a_per_row];
            let mut t = t0;
            while t + 2 <= t1 {
                let v = B::ggml_dot4x2(wr, tok(t), tok(t + 1));
                for (dt, v) in v.into_iter().enumerate() {
                    for (k, v) in v.into_iter().enumerate() {
                        o[(i + k) * n_tok + t + dt] = v;
                    }
                }
                t += 2;
            }
            for t in t..t1 {
                for (k, v) in B::ggml_dot4(wr, tok(t)).into_iter().enumerate() {
                    o[(i + k) * n_tok + t] = v;
                }
            }
            i += 4;
        }
        for i in i..nr {
            let r = r0 + i;
            let wr = &w[r * w_per_row..(r + 1) * w_per_row];
            for t in t0..t1 {
                let a = &act[t * a_per_row..(t + 1) * a_per_row];
                o[i * n_tok + t] = if single {
                    B::ggml_dot(wr, a)
                } else {
                    B::ggml_dot_in_batch(wr, a, t, n_tok)
                };
            }
        }
    }
}

/// [`batch_rows`] compiled for AVX2 + FMA.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn batch_rows_fma<B: GgmlDot>(job: &BatchJob<'_, B>, o: &mut [f32], r0: usize) {
    batch_rows(job, o, r0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows` rows of `cols` weights quantized to `ty`, row `r` taken from `wf` at
    /// `r * cols` (wrapping, so one row of `wf` makes a matrix of equal rows).
    pub(super) fn quantized_rows(ty: GgmlType, wf: &[f32], rows: usize, cols: usize) -> Vec<u8> {
        let rb = ty.type_size() * cols / ty.block_size();
        let mut w = vec![0u8; rows * rb];
        for (r, out) in w.chunks_exact_mut(rb).enumerate() {
            let at = r * cols % wf.len();
            smelt_quant::quantize_row(ty, &wf[at..at + cols], out).unwrap();
        }
        w
    }

    /// The batched path gives each token exactly what a one-token call gives it, for the
    /// formats whose batch kernel in ggml has the single-token order (repacked Q4_K and
    /// tiled Q6_K batches have their own, checked against ggml in tests/ggml_kernels.rs).
    #[test]
    fn batched_equals_one_at_a_time() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (rows, cols, n_tok) = (37, 256, 70);
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for ty in [
            GgmlType::Q5_K,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            let rb = ty.type_size() * cols / ty.block_size();
            let w = quantized_rows(ty, &wf, rows, cols);
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let mut all = vec![0f32; n_tok * rows];
            matmul(ty, &w, rows, cols, cols, &x, &mut all).unwrap();
            for t in 0..n_tok {
                let mut one = vec![0f32; rows];
                matmul(
                    ty,
                    &w,
                    rows,
                    cols,
                    cols,
                    &x[t * cols..(t + 1) * cols],
                    &mut one,
                )
                .unwrap();
                assert_eq!(one, all[t * rows..(t + 1) * rows], "{ty} token {t}");
            }
            // And each output is the library's vec_dot of the quantized activations (Q8_K
            // and float activations use the reference quantizer; Q8_0/Q8_1 ggml-cpu's own).
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
                continue;
            }
            let act = smelt_quant::act_type(ty).unwrap();
            let ab = act.type_size() * cols / act.block_size();
            let mut xq = vec![0u8; ab];
            smelt_quant::quantize_row(act, &x[..cols], &mut xq).unwrap();
            let want = smelt_quant::vec_dot(ty, cols, &w[..rb], &xq).unwrap();
            assert_eq!(all[0], want, "{ty}");
        }
    }

    /// The K-quant batches give each output what ggml's batch kernels give it (repacked
    /// Q4_K: gemm order for whole groups of four tokens, gemv order for the rest; Q6_K: the
    /// tiled order from eight tokens on), for ragged rows and every tail of tokens; and the
    /// legacy formats' tiles the one-token `vec_dot`.
    #[test]
    fn tiled_batches_keep_each_outputs_order() {
        use rand::{Rng, SeedableRng};
        use smelt_quant::kquants::{BlockQ4K, BlockQ6K, BlockQ8K};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let (rows, cols) = (37, 512);
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_1,
        ] {
            let rb = ty.type_size() * cols / ty.block_size();
            let w = quantized_rows(ty, &wf, rows, cols);
            for n_tok in (1..=13).chain([70]) {
                let x: Vec<f32> = (0..n_tok * cols)
                    .map(|_| rng.gen_range(-2.0..2.0))
                    .collect();
                let mut all = vec![f32::NAN; n_tok * rows];
                matmul(ty, &w, rows, cols, cols, &x, &mut all).unwrap();
                for t in 0..n_tok {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let want: Vec<f32> = match ty {
                        GgmlType::Q4_K | GgmlType::Q6_K => {
                            let mut a = vec![BlockQ8K::zeroed(); cols / 256];
                            quantize_act(xt, &mut a);
                            (0..rows)
                                .map(|r| {
                                    let wr = &w[r * rb..(r + 1) * rb];
                                    if ty == GgmlType::Q6_K {
                                        let wr: &[BlockQ6K] = bytemuck::cast_slice(wr);
                                        if n_tok >= 8 {
                                            super::super::ggml_dot::q6_k_tiled(wr, &a)
                                        } else {
                                            BlockQ6K::ggml_dot(wr, &a)
                                        }
                                    } else {
                                        let wr: &[BlockQ4K] = bytemuck::cast_slice(wr);
                                        if t < n_tok - n_tok % 4 {
                                            super::super::ggml_dot::q4_k_gemm(wr, &a)
                                        } else {
                                            BlockQ4K::ggml_dot(wr, &a)
                                        }
                                    }
                                })
                                .collect()
                        }
                        _ => {
                            let mut one = vec![0f32; rows];
                            matmul(ty, &w, rows, cols, cols, xt, &mut one).unwrap();
                            one
                        }
                    };
                    let got = &all[t * rows..(t + 1) * rows];
                    for r in 0..rows {
                        assert_eq!(
                            got[r].to_bits(),
                            want[r].to_bits(),
                            "{ty} n_tok {n_tok} token {t} row {r}: {} vs {}",
                            got[r],
                            want[r]
                        );
                    }
                }
            }
        }
    }

    /// Zero blocks padding rows to whole groups of eight change no result bit.
    #[test]
    fn padded_rows_give_identical_results() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (rows, cols, n_tok) = (9, 640, 5);
        for ty in [GgmlType::Q4_0, GgmlType::Q5_1] {
            let stride = crate::backend::cpu::padded_cols(ty, cols);
            assert_eq!(stride, 768);
            let (rb, pb) = (ty.type_size() * cols / 32, ty.type_size() * stride / 32);
            let mut w = vec![0u8; rows * rb];
            let mut wp = vec![0u8; rows * pb];
            for r in 0..rows {
                let wf: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
                smelt_quant::quantize_row(ty, &wf, &mut w[r * rb..(r + 1) * rb]).unwrap();
                wp[r * pb..r * pb + rb].copy_from_slice(&w[r * rb..(r + 1) * rb]);
            }
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|_| rng.gen_range(-3.0..3.0))
                .collect();
            let (mut a, mut b) = (vec![0f32; n_tok * rows], vec![0f32; n_tok * rows]);
            matmul(ty, &w, rows, cols, cols, &x, &mut a).unwrap();
            matmul(ty, &wp, rows, cols, stride, &x, &mut b).unwrap();
            assert_eq!(a, b, "{ty}");
        }
    }
}

/// Kernel timing on one thread, CPU time (robust to a busy machine):
/// `cargo test --release -p smelt-engine --lib matmul_speed -- --ignored --nocapture`.
#[cfg(test)]
mod speed {
    use super::tests::quantized_rows;
    use super::*;

    fn cpu_time() -> f64 {
        let mut ts = libc_timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid pointer to a timespec.
        unsafe { clock_gettime(3, &mut ts) }; // CLOCK_THREAD_CPUTIME_ID
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    #[repr(C)]
    struct libc_timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clk: i32, ts: *mut libc_timespec) -> i32;
    }

    /// The tiled batch kernels give the packed path's bits at prefill shapes, and (the reason
    /// this runs at all sizes) their speed: one rep by default, `SMELT_MATMUL_REPS=5` for
    /// numbers worth recording (CPU time, one thread, best of the reps, paths alternating).
    #[test]
    fn matmul_speed() {
        let reps: usize = std::env::var("SMELT_MATMUL_REPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        use rand::{Rng, SeedableRng};
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let n_tok = 512;
        for (ty, rows, cols) in [
            (GgmlType::Q4_1, 1536, 576),
            (GgmlType::Q5_0, 2048, 640),
            (GgmlType::Q4_K, 640, 2048),
            (GgmlType::Q6_K, 640, 2048),
        ] {
            let wf: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w = quantized_rows(ty, &wf, rows, cols);
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let mut outs = [vec![0f32; n_tok * rows], vec![0f32; n_tok * rows]];
            // Packed (pre-tile) path and tiles alternating, best of the reps each.
            let mut best = [f64::MAX; 2];
            for _ in 0..reps.max(1) {
                for (k, tiles) in [false, true].into_iter().enumerate() {
                    let out = &mut outs[k];
                    let t = pool.install(|| {
                        let t0 = cpu_time();
                        let how = How {
                            tiles,
                            id: false,
                            invariant: false,
                        };
                        matmul_dispatch(ty, &w, rows, cols, cols, &x, out, how).unwrap();
                        cpu_time() - t0
                    });
                    best[k] = best[k].min(t);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&outs[0]) == bits(&outs[1]),
                "{ty}: tiled batch differs from the packed path"
            );
            let macs = (rows * cols * n_tok) as f64;
            eprintln!(
                "{ty} {rows}x{cols} x {n_tok} tokens, 1 thread: packed {:.1} ms ({:.1} GMAC/s), tiled {:.1} ms ({:.1} GMAC/s), {:.2}x",
                best[0] * 1e3,
                macs / best[0] * 1e-9,
                best[1] * 1e3,
                macs / best[1] * 1e-9,
                best[0] / best[1]
            );
        }
    }
}
