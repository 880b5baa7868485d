//! NaN and infinities are refused, for every type smelt quantizes, with an error that names
//! the offending element: ggml would quantize them into garbage (or NaN scales) silently.

mod common;

use common::{catch, Report, QUANTIZABLE};
use smelt_quant::{check_finite, quantize_row, quantize_tensor, GgmlType, QuantError};

const BAD: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

fn is_nonfinite_at(err: &QuantError, row: usize, col: usize, value: f32) -> bool {
    match *err {
        QuantError::NonFinite {
            row: r,
            col: c,
            value: v,
        } => {
            r == row
                && c == col
                && (v.to_bits() == value.to_bits() || (v.is_nan() && value.is_nan()))
        }
        _ => false,
    }
}

/// Row length for `ty`: two blocks (so the bad value is not always in block 0).
fn row_len(ty: GgmlType) -> usize {
    2 * ty.block_size().max(32)
}

fn row(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 10.0)
        .collect()
}

#[test]
fn quantize_row_rejects_nonfinite() {
    let mut report = Report::new("quantize_row");
    for ty in QUANTIZABLE {
        let stage = format!("{} rejects NaN/Inf", ty.name());
        report.stage(&stage);
        let n = row_len(ty);
        for bad in BAD {
            for col in [0, 1, n / 2 + 3, n - 1] {
                let mut src = row(n);
                src[col] = bad;
                let mut dst = vec![0u8; n / ty.block_size() * ty.type_size()];
                match catch(|| quantize_row(ty, &src, &mut dst)) {
                    Ok(Err(e)) if is_nonfinite_at(&e, 0, col, bad) => {}
                    other => report.fail(&stage, || format!("{bad} at col {col}: got {other:?}")),
                }
            }
        }
        // Two bad values: the first one is named.
        let mut src = row(n);
        src[5] = f32::INFINITY;
        src[9] = f32::NAN;
        let mut dst = vec![0u8; n / ty.block_size() * ty.type_size()];
        match catch(|| quantize_row(ty, &src, &mut dst)) {
            Ok(Err(e)) if is_nonfinite_at(&e, 0, 5, f32::INFINITY) => {}
            other => report.fail(&stage, || format!("inf at 5 then NaN at 9: got {other:?}")),
        }
    }
    report.finish();
}

#[test]
fn quantize_tensor_rejects_nonfinite() {
    let mut report = Report::new("quantize_tensor");
    for ty in QUANTIZABLE {
        let stage = format!("{} rejects NaN/Inf", ty.name());
        report.stage(&stage);
        let n = row_len(ty);
        let rows = 40;
        for bad in BAD {
            for (r, c) in [(0, 0), (3, n - 1), (17, 7), (rows - 1, n / 2)] {
                let mut src: Vec<f32> = (0..rows).flat_map(|_| row(n)).collect();
                src[r * n + c] = bad;
                for threads in [Some(1), Some(3), None] {
                    match catch(|| quantize_tensor(ty, &src, n, threads)) {
                        Ok(Err(e)) if is_nonfinite_at(&e, r, c, bad) => {}
                        other => report.fail(&stage, || {
                            let got = other.map(|res| res.map(|b| format!("{} bytes", b.len())));
                            format!("{bad} at row {r} col {c}, {threads:?} threads: got {got:?}")
                        }),
                    }
                }
            }
        }
    }
    report.finish();
}

#[test]
fn check_finite_names_row_and_column() {
    let mut src = vec![0.0f32; 3 * 64];
    assert_eq!(check_finite(&src, 64), Ok(()));
    src[2 * 64 + 10] = f32::NEG_INFINITY;
    let err = check_finite(&src, 64).unwrap_err();
    assert!(is_nonfinite_at(&err, 2, 10, f32::NEG_INFINITY), "{err:?}");
    assert!(err.to_string().contains("row 2, column 10"), "{err}");
}

/// Finite extremes are not refused: the largest finite floats and subnormals quantize.
#[test]
fn finite_extremes_are_accepted() {
    let mut report = Report::new("finite extremes");
    for ty in QUANTIZABLE {
        let stage = format!("{} accepts f32::MAX and subnormals", ty.name());
        report.stage(&stage);
        let n = row_len(ty);
        let mut src = row(n);
        src[0] = f32::MAX;
        src[1] = f32::MIN;
        src[2] = f32::from_bits(1);
        src[3] = -f32::MIN_POSITIVE / 2.0;
        let mut dst = vec![0u8; n / ty.block_size() * ty.type_size()];
        match catch(|| quantize_row(ty, &src, &mut dst)) {
            Ok(Ok(())) => {}
            other => report.fail(&stage, || format!("got {other:?}")),
        }
    }
    report.finish();
}
