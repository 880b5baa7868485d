//! A rank's model file: the [`ShardPlan`]'s slices of every tensor of the source GGUF,
//! with the head and row counts in the metadata changed to the rank's, written to memory.
//! Any backend then loads a rank like a whole model (the weight loaders, repacking and
//! ISQ run on the rank's slices, so ISQ shards before it quantizes); only the forward
//! pass differs, by the all-reduce after each row-parallel matmul.

// A row's kept columns are a list of runs, usually of one: `vec![a..b]` is meant.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use smelt_gguf::{Gguf, GgufWriter, TensorInfo, TensorSpec, Value};

use super::plan::{Placement, ShardPlan, Slice};
use crate::EngineError;

/// The bytes of `s` of tensor `t` (whose data is `data`).
pub fn slice_bytes(t: &TensorInfo, data: &[u8], s: &Slice) -> Result<Vec<u8>, EngineError> {
    let (bs, ts) = (t.ty.block_size() as u64, t.ty.type_size() as u64);
    let bad = |why: String| EngineError::BadOptions(format!("{}: {why}", t.name));
    if t.shape.len() <= 1 {
        // A vector: rows are elements of a float type.
        if bs != 1 {
            return Err(bad(format!("a {} vector cannot be split", t.ty.name())));
        }
        let mut out = Vec::new();
        for r in &s.rows {
            out.extend_from_slice(&data[r.start * ts as usize..r.end * ts as usize]);
        }
        return Ok(out);
    }
    let row_bytes = (t.row_len() / bs * ts) as usize;
    // Byte ranges of a row kept, in order.
    let runs: Vec<Range<usize>> = match &s.cols {
        Some(cs) => cs
            .iter()
            .map(|c| {
                let (start, end) = (c.start as u64, c.end as u64);
                if !start.is_multiple_of(bs) || (!end.is_multiple_of(bs) && end != t.row_len()) {
                    return Err(bad(format!(
                        "columns {}..{} cut a {}-wide block",
                        c.start, c.end, bs
                    )));
                }
                Ok((start / bs * ts) as usize..end.div_ceil(bs) as usize * ts as usize)
            })
            .collect::<Result<_, _>>()?,
        None => vec![0..row_bytes],
    };
    let n_rows: usize = s.rows.iter().map(|r| r.len()).sum();
    let kept: usize = runs.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(n_rows * kept);
    for r in &s.rows {
        for row in r.clone() {
            let base = row * row_bytes;
            for c in &runs {
                out.extend_from_slice(&data[base + c.start..base + c.end]);
            }
        }
    }
    Ok(out)
}

/// Rank `rank`'s model file under `plan`, in memory.
pub fn rank_gguf(src: &Gguf, plan: &ShardPlan, rank: usize) -> Result<Gguf, EngineError> {
    let mut meta = src.metadata().clone();
    for (key, v) in plan.rank_counts(rank) {
        meta.insert(key, Value::U32(v as u32));
    }
    meta.insert("smelt.tp.rank", Value::U32(rank as u32));
    meta.insert("smelt.tp.ranks", Value::U32(plan.n_ranks() as u32));
    let mut specs = Vec::with_capacity(src.tensors().len());
    let mut places = Vec::with_capacity(src.tensors().len());
    for t in src.tensors() {
        let p = plan.placement(&t.name, &t.shape)?;
        let shape = match &p {
            Placement::Replicated => t.shape.clone(),
            Placement::Split(s) => s[rank].shape.clone(),
        };
        specs.push(TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape,
        });
        places.push(p);
    }
    let total: u64 = specs.iter().map(|s| s.n_bytes() + 64).sum();
    let buf = Vec::with_capacity(total as usize + (1 << 20));
    let mut w = GgufWriter::new(buf, &meta, specs)?;
    for (t, p) in src.tensors().iter().zip(&places) {
        let data = src.tensor_data(t);
        match p {
            Placement::Replicated => w.write_tensor(&t.name, data)?,
            Placement::Split(s) => w.write_tensor(&t.name, &slice_bytes(t, data, &s[rank])?)?,
        }
    }
    Ok(Gguf::from_bytes(w.finish()?)?)
}
