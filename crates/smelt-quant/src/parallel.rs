//! Quantizing a whole tensor on all cores.
//!
//! Rows are independent in every GGML format, so splitting them across threads cannot
//! change a byte: the output is identical whatever the thread count.

use crate::{check_finite, quantize_checked_row, GgmlType, QuantError};
use rayon::prelude::*;

/// Rows handed to a thread at a time: big enough to amortise scheduling, small enough to
/// balance a few thousand rows over many cores.
const ROWS_PER_TASK: usize = 16;

/// Quantizes `src` (row-major, rows of `n_per_row`) to `ty`, on `threads` threads (all
/// cores when `None`). NaN/Inf anywhere is an error naming the element.
pub fn quantize_tensor(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    threads: Option<usize>,
) -> Result<Vec<u8>, QuantError> {
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(QuantError::BadShape {
            len: src.len(),
            n_per_row,
        });
    }
    let block = ty.block_size();
    if !n_per_row.is_multiple_of(block) {
        return Err(QuantError::RaggedRow {
            ty,
            n: n_per_row,
            block,
        });
    }
    if !crate::can_quantize(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "quantization",
        });
    }
    let row_bytes = n_per_row / block * ty.type_size();
    let mut out = vec![0u8; src.len() / n_per_row * row_bytes];
    let work = |out: &mut Vec<u8>| {
        out.par_chunks_mut(row_bytes * ROWS_PER_TASK)
            .zip(src.par_chunks(n_per_row * ROWS_PER_TASK))
            .enumerate()
            .try_for_each(|(task, (dst, src))| {
                // Each task checks its own rows, so the NaN/Inf scan runs on all cores too,
                // and only once: the rows then go straight to the quantizer.
                check_finite(src, n_per_row).map_err(|e| offset_row(e, task * ROWS_PER_TASK))?;
                dst.chunks_mut(row_bytes)
                    .zip(src.chunks(n_per_row))
                    .try_for_each(|(d, s)| quantize_checked_row(ty, s, d))
            })
    };
    match threads {
        None => work(&mut out)?,
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build()
            .map_err(|_| QuantError::Unsupported {
                ty,
                op: "a thread pool",
            })?
            .install(|| work(&mut out))?,
    }
    Ok(out)
}

/// Moves a [`QuantError::NonFinite`] found in a task's slice to the tensor's row numbering.
fn offset_row(e: QuantError, first_row: usize) -> QuantError {
    match e {
        QuantError::NonFinite { row, col, value } => QuantError::NonFinite {
            row: row + first_row,
            col,
            value,
        },
        other => other,
    }
}
