//! smelt-quant against ggml, byte for byte, on the reference data ggml itself made
//! (`tests/ggml/`, written by `scripts/oracle/ggml_refs.py`; `oracle_live.rs` proves it is
//! still ggml's output).
//!
//! One test per type, so a failing format never hides another. Each test checks, and
//! reports separately: `quantize_row` on every input row; `quantize_tensor` on 1, 2 and 3
//! threads; `dequantize_row` of ggml's quantized rows; `dequantize_row` of random valid
//! blocks. Quantized bytes must be identical and dequantized floats identical bit for bit.

mod common;

use common::{catch, floats, hex, load_refs, Report, TypeRefs};
use smelt_quant::{dequantize_row, quantize_row, quantize_tensor, GgmlType};

/// Rows stacked into each `quantize_tensor` call: enough for every thread to get several
/// of smelt's 16-row tasks.
const TENSOR_ROWS: usize = 70;

fn block_detail(refs: &TypeRefs, row: usize, ours: &[u8]) -> Option<String> {
    let (ty, size, weights) = (refs.ty, refs.ty.type_size(), refs.ty.block_size());
    let want = &refs.rows[row].quant;
    let off = ours.iter().zip(want).position(|(a, b)| a != b)?;
    let block = off / size;
    let bad_blocks = ours
        .chunks(size)
        .zip(want.chunks(size))
        .filter(|(a, b)| a != b)
        .count();
    let input = &refs.inputs[row];
    Some(format!(
        "{} case {:?} row {row} (n={}): block {block} differs at byte {} of the row ({} of the block); {bad_blocks} of {} blocks differ\n  ggml : {}\n  smelt: {}\n  input: {}",
        ty.name(),
        input.case,
        input.values.len(),
        off,
        off % size,
        want.len() / size,
        hex(&want[block * size..(block + 1) * size]),
        hex(&ours[block * size..(block + 1) * size]),
        floats(&input.values[block * weights..(block + 1) * weights]),
    ))
}

fn float_detail(ty: GgmlType, what: &str, src: &[u8], want: &[f32], got: &[f32]) -> Option<String> {
    let i = want
        .iter()
        .zip(got)
        .position(|(a, b)| a.to_bits() != b.to_bits())?;
    let (size, weights) = (ty.type_size(), ty.block_size());
    let block = i / weights;
    let bad = want
        .iter()
        .zip(got)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    Some(format!(
        "{} {what}: weight {i} (block {block}, weight {} of it) differs; {bad} of {} weights differ\n  block: {}\n  ggml : {}\n  smelt: {}",
        ty.name(),
        i % weights,
        want.len(),
        hex(&src[block * size..(block + 1) * size]),
        floats(&want[block * weights..(block + 1) * weights]),
        floats(&got[block * weights..(block + 1) * weights]),
    ))
}

/// Every row through `quantize_row`, into buffers alternately aligned and misaligned (the
/// API promises to handle both).
fn check_quantize_rows(refs: &TypeRefs, report: &mut Report) {
    const STAGE: &str = "quantize_row == ggml";
    report.stage(STAGE);
    for (i, (input, want)) in refs.inputs.iter().zip(&refs.rows).enumerate() {
        let mut buf = vec![0xAAu8; want.quant.len() + 1];
        let dst = &mut buf[i % 2..i % 2 + want.quant.len()];
        match catch(|| quantize_row(refs.ty, &input.values, dst)) {
            Err(panic) => {
                report.fail(STAGE, || format!("row {i} ({:?}): {panic}", input.case));
                return;
            }
            Ok(Err(e)) => report.fail(STAGE, || format!("row {i} ({:?}): error {e}", input.case)),
            Ok(Ok(())) => {
                if let Some(d) = block_detail(refs, i, dst) {
                    report.fail(STAGE, || d);
                }
            }
        }
    }
}

/// Rows of each length stacked into a tensor and quantized on 1, 2 and 3 threads: every
/// thread count must give ggml's bytes.
fn check_quantize_tensor(refs: &TypeRefs, report: &mut Report) {
    let mut lengths: Vec<usize> = refs.inputs.iter().map(|r| r.values.len()).collect();
    lengths.sort_unstable();
    lengths.dedup();
    for threads in [1, 2, 3] {
        let stage = format!("quantize_tensor on {threads} thread(s) == ggml");
        report.stage(&stage);
        for &n in &lengths {
            let same: Vec<usize> = (0..refs.inputs.len())
                .filter(|&i| refs.inputs[i].values.len() == n)
                .collect();
            let picks: Vec<usize> = same
                .iter()
                .copied()
                .cycle()
                .take(TENSOR_ROWS.max(same.len()))
                .collect();
            let src: Vec<f32> = picks
                .iter()
                .flat_map(|&i| refs.inputs[i].values.iter().copied())
                .collect();
            match catch(|| quantize_tensor(refs.ty, &src, n, Some(threads))) {
                Err(panic) => {
                    report.fail(&stage, || format!("rows of {n}: {panic}"));
                    break;
                }
                Ok(Err(e)) => report.fail(&stage, || format!("rows of {n}: error {e}")),
                Ok(Ok(out)) => {
                    let row_bytes = n / refs.ty.block_size() * refs.ty.type_size();
                    if out.len() != picks.len() * row_bytes {
                        report.fail(&stage, || {
                            format!(
                                "rows of {n}: {} bytes, want {}",
                                out.len(),
                                picks.len() * row_bytes
                            )
                        });
                        continue;
                    }
                    for (k, (&i, got)) in picks.iter().zip(out.chunks(row_bytes)).enumerate() {
                        if let Some(d) = block_detail(refs, i, got) {
                            // The quantize_row stage shows the blocks when it fails too;
                            // here the first line says enough.
                            let first = d.lines().next().unwrap_or_default().to_string();
                            report.fail(&stage, || {
                                format!("tensor row {k} of {}: {first}", picks.len())
                            });
                        }
                    }
                }
            }
        }
    }
}

/// smelt's dequantization of ggml's quantized rows against ggml's.
fn check_dequantize_rows(refs: &TypeRefs, report: &mut Report) {
    const STAGE: &str = "dequantize_row(ggml's bytes) == ggml";
    report.stage(STAGE);
    for (i, (input, want)) in refs.inputs.iter().zip(&refs.rows).enumerate() {
        let mut buf = vec![0u8; want.quant.len() + 1];
        buf[i % 2..i % 2 + want.quant.len()].copy_from_slice(&want.quant);
        let src = &buf[i % 2..i % 2 + want.quant.len()];
        let mut got = vec![f32::NAN; input.values.len()];
        match catch(|| dequantize_row(refs.ty, src, &mut got)) {
            Err(panic) => {
                report.fail(STAGE, || format!("row {i} ({:?}): {panic}", input.case));
                return;
            }
            Ok(Err(e)) => report.fail(STAGE, || format!("row {i} ({:?}): error {e}", input.case)),
            Ok(Ok(())) => {
                let what = format!("case {:?} row {i} (n={})", input.case, input.values.len());
                if let Some(d) = float_detail(refs.ty, &what, src, &want.dequant, &got) {
                    report.fail(STAGE, || d);
                }
            }
        }
    }
}

/// smelt's dequantization of random valid blocks against ggml's.
fn check_dequantize_random(refs: &TypeRefs, report: &mut Report) {
    const STAGE: &str = "dequantize_row(random valid blocks) == ggml";
    report.stage(STAGE);
    let mut got = vec![f32::NAN; refs.random_dequant.len()];
    match catch(|| dequantize_row(refs.ty, &refs.random_blocks, &mut got)) {
        Err(panic) => report.fail(STAGE, || panic),
        Ok(Err(e)) => report.fail(STAGE, || format!("error {e}")),
        Ok(Ok(())) => {
            if let Some(d) = float_detail(
                refs.ty,
                "random blocks",
                &refs.random_blocks,
                &refs.random_dequant,
                &got,
            ) {
                report.fail(STAGE, || d);
            }
        }
    }
}

fn parity(ty: GgmlType) {
    let refs = load_refs(ty);
    let mut report = Report::new(ty.name());
    if !refs.rows.is_empty() {
        check_quantize_rows(&refs, &mut report);
        check_quantize_tensor(&refs, &mut report);
        check_dequantize_rows(&refs, &mut report);
    }
    check_dequantize_random(&refs, &mut report);
    report.finish();
}

macro_rules! parity_tests {
    ($($name:ident => $ty:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                parity(GgmlType::$ty);
            }
        )*
    };
}

parity_tests! {
    f32 => F32,
    f16 => F16,
    bf16 => BF16,
    q4_0 => Q4_0,
    q4_1 => Q4_1,
    q5_0 => Q5_0,
    q5_1 => Q5_1,
    q8_0 => Q8_0,
    q8_1 => Q8_1,
    q2_k => Q2_K,
    q3_k => Q3_K,
    q4_k => Q4_K,
    q5_k => Q5_K,
    q6_k => Q6_K,
    q8_k => Q8_K,
    iq4_nl => IQ4_NL,
    iq4_xs => IQ4_XS,
}

/// The reference data covers what the task promises: every type smelt handles has a file,
/// quantizable types have rows at every length of 1..=16 blocks (1..=8 for 256-wide types)
/// plus a 4096-long row, and the adversarial cases are all there.
#[test]
fn reference_data_is_complete() {
    for ty in common::DEQUANTIZABLE {
        let refs = load_refs(ty);
        assert_eq!(
            refs.rows.is_empty(),
            !common::QUANTIZABLE.contains(&ty),
            "{}",
            ty.name()
        );
        assert!(
            refs.random_blocks.len() >= 16 * ty.type_size(),
            "{}",
            ty.name()
        );
        let block = if ty.block_size() == 256 { 256 } else { 32 };
        let max = if block == 256 { 8 } else { 16 };
        for k in 1..=max {
            assert!(
                refs.inputs.iter().any(|r| r.values.len() == k * block),
                "{}: no row of {k} blocks",
                ty.name()
            );
        }
        assert!(
            refs.inputs.iter().any(|r| r.values.len() == 4096),
            "{}",
            ty.name()
        );
        for case in [
            "zeros",
            "const_pos",
            "const_neg",
            "outlier_pos",
            "tiny_1e-30",
            "subnormal",
            "huge_1e30",
        ] {
            assert!(
                refs.inputs.iter().any(|r| r.case == case),
                "{}: no {case} rows",
                ty.name()
            );
        }
    }
}

/// The whole suite again with `SMELT_NO_SIMD=1`, in a child process (the choice of path is
/// made once per process): the portable path must be as exact as the AVX2 one.
#[test]
fn portable_path_matches_ggml_too() {
    if std::env::var_os("SMELT_NO_SIMD").is_some() {
        return; // we are the child, or the whole run is already portable
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--skip",
            "portable_path_matches_ggml_too",
            "--test-threads",
            "2",
        ])
        .env("SMELT_NO_SIMD", "1")
        .output()
        .expect("re-running the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("test ") && (l.ends_with("FAILED") || l.contains("result")))
        .collect();
    assert!(
        out.status.success(),
        "with SMELT_NO_SIMD=1 the parity suite fails:\n{}",
        summary.join("\n")
    );
}
