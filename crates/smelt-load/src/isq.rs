//! In-situ quantization: a model's tensors, one at a time, into an in-memory GGUF whose
//! weights are in the types a plan picked. Peak memory is the result plus one tensor's
//! working set, however large the model.
//!
//! The quantizer is a trait so the GPU one (smelt-cuda's kernels, byte-identical to the CPU)
//! plugs in without touching the plumbing; [`CpuQuantizer`] is smelt-quant on all cores.

use std::borrow::Cow;
use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;

use indicatif::ProgressBar;
use rayon::prelude::*;
use smelt_gguf::{GgmlType, Gguf, GgufPlacedWriter, GgufWriter, Metadata, TensorSpec, Value};
use smelt_quant::QuantError;

use crate::error::QuantizeError;
use crate::pipeline::{self, HostStage, Job, ProgressFn, Sink, Summary};
use crate::LoadError;

/// One tensor of the model being assembled: its GGUF name and shape (ggml order: row
/// length first) and the type its source bytes are in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub ty: GgmlType,
}

/// Where tensor bytes come from. Data is asked for one tensor at a time, in order, so a
/// source can read (or permute) a tensor only when it is needed.
pub trait TensorSource: Sync {
    fn tensors(&self) -> &[SourceTensor];
    /// The bytes of tensor `i`, in `tensors()[i].ty`.
    fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError>;
    /// Bytes `offset..offset + buf.len()` of tensor `i` into `buf` (the pipelined
    /// quantizer's reads; called from a reader thread, chunk by chunk in order).
    fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        let d = self.data(i)?;
        let src = byte_range(&d, i, offset, buf.len())?;
        pipeline::copy_parallel(buf, src, pipeline::read_threads(), pipeline::READ_PIECE);
        Ok(())
    }
}

/// Bytes `offset..offset + len` of tensor `i`'s bytes `d`, or the error that says they run
/// past its end (the pipelined quantizer's reads of a source's tensor).
pub(crate) fn byte_range(d: &[u8], i: usize, offset: u64, len: usize) -> Result<&[u8], LoadError> {
    let at = usize::try_from(offset).unwrap_or(usize::MAX);
    at.checked_add(len)
        .and_then(|end| d.get(at..end))
        .ok_or_else(|| LoadError::Plan {
            why: format!("tensor #{i}: bytes {offset}.. past its {} bytes", d.len()),
        })
}

/// A GGUF file's own tensors as a source (ISQ of a GGUF).
pub struct GgufSource<'a> {
    gguf: &'a Gguf,
    tensors: Vec<SourceTensor>,
    /// The file, for large parallel reads (mapped page faults come one page group at a
    /// time); `None` for an in-memory GGUF, read from its bytes.
    file: Option<std::fs::File>,
}

impl<'a> GgufSource<'a> {
    pub fn new(gguf: &'a Gguf) -> Self {
        let tensors = gguf
            .tensors()
            .iter()
            .map(|t| SourceTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ty: t.ty,
            })
            .collect();
        let file = gguf.path().and_then(|p| std::fs::File::open(p).ok());
        Self {
            gguf,
            tensors,
            file,
        }
    }
}

impl TensorSource for GgufSource<'_> {
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError> {
        let info = &self.gguf.tensors()[i];
        Ok(Cow::Borrowed(self.gguf.tensor_data(info)))
    }

    fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        let info = &self.gguf.tensors()[i];
        if offset + buf.len() as u64 > info.n_bytes() {
            return Err(LoadError::Plan {
                why: format!("tensor {}: bytes {offset}.. past its end", info.name),
            });
        }
        match &self.file {
            Some(f) => pipeline::pread_parallel(
                f,
                self.gguf.data_offset() + info.offset + offset,
                buf,
                pipeline::read_threads(),
                pipeline::READ_PIECE,
            )
            .map_err(|e| LoadError::Plan {
                why: format!("reading tensor {}: {e}", info.name),
            }),
            None => {
                let d = self.gguf.tensor_data(info);
                let at = offset as usize;
                pipeline::copy_parallel(
                    buf,
                    &d[at..at + buf.len()],
                    pipeline::read_threads(),
                    pipeline::READ_PIECE,
                );
                Ok(())
            }
        }
    }
}

/// Turns one tensor's bytes into another GGML type. Implementations must give the same
/// bytes as [`smelt_quant::quantize_tensor`] on the tensor's values as f32 (ggml's bytes).
pub trait TensorQuantizer: Send + Sync {
    /// For messages: "cpu", "cuda:0" ...
    fn name(&self) -> &str;
    /// `src` holds `shape`'s elements in `src_ty` (rows of `shape[0]`); returns them in
    /// `dst`. `progress` gets output bytes as they are done.
    fn quantize(
        &self,
        src_ty: GgmlType,
        src: &[u8],
        shape: &[u64],
        dst: GgmlType,
        progress: &dyn Fn(u64),
    ) -> Result<Vec<u8>, QuantizeError>;

    /// Runs a model's chunks (see [`pipeline`]) into `sink`, or `None` to let [`run`]
    /// overlap reading with [`TensorQuantizer::quantize`] on each chunk (the default); a GPU
    /// quantizer runs them on its own staging slots and streams.
    fn run_pipelined(
        &self,
        _source: &dyn TensorSource,
        _jobs: &[Job],
        _sink: &mut Sink<'_, '_>,
        _progress: &ProgressFn<'_>,
    ) -> Option<Result<Summary, LoadError>> {
        None
    }
}

/// Runs `jobs` through `q`: its own pipeline when it has one, else [`run_on_host`].
pub fn run(
    q: &dyn TensorQuantizer,
    source: &dyn TensorSource,
    jobs: &[Job],
    sink: &mut Sink<'_, '_>,
    progress: &ProgressFn<'_>,
) -> Result<Summary, LoadError> {
    match q.run_pipelined(source, jobs, sink, progress) {
        Some(r) => r,
        None => run_on_host(q, source, jobs, sink, progress),
    }
}

/// Reading overlapped with `q`'s per-chunk quantization (and with writing, for a placed
/// sink): [`pipeline::HostStage`] over `q`.
pub fn run_on_host(
    q: &dyn TensorQuantizer,
    source: &dyn TensorSource,
    jobs: &[Job],
    sink: &mut Sink<'_, '_>,
    progress: &ProgressFn<'_>,
) -> Result<Summary, LoadError> {
    let t = std::time::Instant::now();
    let slots = HostStage::slots(
        pipeline::HOST_SLOTS + sink.extra_slots(),
        pipeline::max_src(jobs),
    );
    let setup = t.elapsed();
    let mut s = pipeline::run(
        &HostStage(q),
        slots,
        source.tensors(),
        jobs,
        &|job, buf| source.read(job.tensor, job.src_offset, buf),
        sink,
        progress,
    )?;
    s.stages.setup = setup;
    Ok(s)
}

/// smelt-quant on the CPU, all cores of rayon's current pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuQuantizer;

/// f32 staged per slice of rows: bounds the working memory to the output tensor plus this,
/// however large the tensor (a 152k-token embedding is 3 GiB as f32).
const SLICE_F32_BYTES: usize = 64 << 20;

impl TensorQuantizer for CpuQuantizer {
    fn name(&self) -> &str {
        "cpu"
    }

    fn quantize(
        &self,
        src_ty: GgmlType,
        src: &[u8],
        shape: &[u64],
        dst: GgmlType,
        progress: &dyn Fn(u64),
    ) -> Result<Vec<u8>, QuantizeError> {
        let n: u64 = shape.iter().product();
        if n == 0 {
            return Ok(Vec::new());
        }
        let row = shape.first().copied().unwrap_or(1) as usize;
        let rows = n as usize / row;
        let bad = || QuantError::BadShape {
            len: src.len(),
            n_per_row: row,
        };
        let src_row = src_ty.row_bytes(row as u64).ok_or_else(bad)? as usize;
        let dst_row = dst.row_bytes(row as u64).ok_or_else(bad)? as usize;
        if src_row * rows != src.len() {
            return Err(bad().into());
        }
        let rows_per_slice = (SLICE_F32_BYTES / (row * 4)).max(1);
        let mut out = Vec::with_capacity(dst_row * rows);
        let mut f32s = vec![0f32; rows_per_slice.min(rows) * row];
        for slice in src.chunks(src_row * rows_per_slice) {
            let vals = &mut f32s[..slice.len() / src_row * row];
            vals.par_chunks_mut(row)
                .zip(slice.par_chunks(src_row))
                .try_for_each(|(d, s)| smelt_quant::dequantize_row(src_ty, s, d))?;
            let q = smelt_quant::quantize_tensor(dst, vals, row, None)?;
            progress(q.len() as u64);
            out.extend_from_slice(&q);
        }
        Ok(out)
    }
}

/// What ISQ does to each tensor: its output type, and the `general.file_type` to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsqPlan {
    pub types: Vec<GgmlType>,
    pub file_type: u32,
}

/// Picks the output type of every tensor (llama.cpp's rules live with the CLI's quantize
/// plan, which both `smelt quantize` and `--isq` use, so their outputs are the same bytes).
pub trait Planner {
    fn plan(&self, metadata: &Metadata, tensors: &[SourceTensor]) -> Result<IsqPlan, String>;
}

/// The metadata `smelt quantize` writes for a plan: the input's, with the file type and
/// quantization version llama.cpp writes and without split keys (the output is one file).
pub fn planned_metadata(input: &Metadata, plan: &IsqPlan) -> Metadata {
    let mut md = input.clone();
    for key in ["split.no", "split.count", "split.tensors.count"] {
        md.remove(key);
    }
    md.insert("general.quantization_version", Value::U32(2));
    md.insert("general.file_type", Value::U32(plan.file_type));
    md
}

/// Counts what a writer would write (the header's size, before allocating the output).
struct Counter(Rc<Cell<u64>>);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.set(self.0.get() + buf.len() as u64);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `metadata` and every tensor of `source` (in the types `types` names, quantized
/// tensors requantized as `smelt quantize` does, or as they are when `types` is `None`)
/// into one GGUF in memory, allocated once at its final size.
pub fn assemble(
    metadata: &Metadata,
    source: &dyn TensorSource,
    types: Option<&[GgmlType]>,
    quantizer: &dyn TensorQuantizer,
    bar: &ProgressBar,
) -> Result<Vec<u8>, LoadError> {
    let tensors = source.tensors();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| TensorSpec {
            name: t.name.clone(),
            ty: types.and_then(|ts| ts.get(i).copied()).unwrap_or(t.ty),
            shape: t.shape.clone(),
        })
        .collect();
    let requantize = types.is_some();
    for (t, s) in tensors.iter().zip(&specs) {
        let convert = pipeline::converts(t.ty, s.ty, requantize);
        if convert && !smelt_quant::can_dequantize(t.ty) {
            return Err(LoadError::Plan {
                why: format!(
                    "tensor {} is {}, which smelt cannot read as numbers",
                    t.name, t.ty
                ),
            });
        }
        if convert && !smelt_quant::can_quantize(s.ty) {
            return Err(LoadError::Plan {
                why: format!(
                    "tensor {} would need {}, which smelt cannot write",
                    t.name, s.ty
                ),
            });
        }
    }
    let count = Rc::new(Cell::new(0u64));
    drop(GgufWriter::new(
        Counter(count.clone()),
        metadata,
        specs.clone(),
    )?);
    let align = match metadata.get("general.alignment") {
        Some(Value::U32(a)) => u64::from(*a),
        _ => 32,
    };
    let data: u64 = specs
        .iter()
        .map(|s| s.n_bytes().next_multiple_of(align))
        .sum();
    let total = count.get() + data;
    let mut out = Vec::with_capacity(usize::try_from(total).map_err(|_| LoadError::Plan {
        why: format!("{total} bytes do not fit this machine's memory"),
    })?);
    let w = GgufWriter::new(&mut out, metadata, specs.clone())?;
    let types: Vec<GgmlType> = specs.iter().map(|s| s.ty).collect();
    stream(source, &types, requantize, quantizer, w, bar)?;
    Ok(out)
}

/// Streams every tensor of `source` through `quantizer` into `w` (created with the output
/// specs: `types[i]` for tensor `i`; `requantize` as [`pipeline::converts`] takes it),
/// chunk by chunk, reading ahead in parallel while earlier chunks are quantized and
/// written. `bar` counts source bytes; the summary says what moved.
pub fn stream<W: Write>(
    source: &dyn TensorSource,
    types: &[GgmlType],
    requantize: bool,
    quantizer: &dyn TensorQuantizer,
    w: GgufWriter<W>,
    bar: &ProgressBar,
) -> Result<Summary, LoadError> {
    stream_chunked(
        source,
        types,
        requantize,
        quantizer,
        w,
        bar,
        pipeline::CHUNK_BYTES,
    )
}

/// [`stream`] with chunks of at most `chunk` source bytes (tests cut tiny models into
/// many chunks with it).
pub fn stream_chunked<W: Write>(
    source: &dyn TensorSource,
    types: &[GgmlType],
    requantize: bool,
    quantizer: &dyn TensorQuantizer,
    mut w: GgufWriter<W>,
    bar: &ProgressBar,
    chunk: usize,
) -> Result<Summary, LoadError> {
    let tensors = source.tensors();
    let jobs = pipeline::plan_jobs(tensors, types, requantize, chunk)?;
    bar.set_length(jobs.iter().map(|j| j.src_len as u64).sum());
    let mut write = |job: &Job, bytes: &[u8]| {
        let name = &tensors[job.tensor].name;
        if job.src_offset == 0 {
            bar.set_message(name.clone());
        }
        Ok(w.write_part(name, bytes, job.last)?)
    };
    let summary = run(
        quantizer,
        source,
        &jobs,
        &mut Sink::InOrder(&mut write),
        &|b| bar.inc(b),
    )?;
    w.finish()?;
    bar.finish_and_clear();
    Ok(summary)
}

/// [`stream`] into a file at known offsets ([`GgufPlacedWriter`], created with the output
/// specs): `writers` threads write chunks as they complete while the next ones are
/// quantized. Same bytes as [`stream`]'s.
pub fn stream_placed(
    source: &dyn TensorSource,
    types: &[GgmlType],
    requantize: bool,
    quantizer: &dyn TensorQuantizer,
    out: GgufPlacedWriter,
    writers: usize,
    bar: &ProgressBar,
) -> Result<Summary, LoadError> {
    stream_placed_chunked(
        source,
        types,
        requantize,
        quantizer,
        out,
        writers,
        bar,
        pipeline::CHUNK_BYTES,
    )
}

/// [`stream_placed`] with chunks of at most `chunk` source bytes.
#[allow(clippy::too_many_arguments)]
pub fn stream_placed_chunked(
    source: &dyn TensorSource,
    types: &[GgmlType],
    requantize: bool,
    quantizer: &dyn TensorQuantizer,
    out: GgufPlacedWriter,
    writers: usize,
    bar: &ProgressBar,
    chunk: usize,
) -> Result<Summary, LoadError> {
    let tensors = source.tensors();
    let jobs = pipeline::plan_jobs(tensors, types, requantize, chunk)?;
    bar.set_length(jobs.iter().map(|j| j.src_len as u64).sum());
    let write = |job: &Job, bytes: &[u8]| {
        if job.src_offset == 0 {
            bar.set_message(tensors[job.tensor].name.clone());
        }
        Ok(out.write_at(job.tensor, job.dst_offset, bytes)?)
    };
    let summary = run(
        quantizer,
        source,
        &jobs,
        &mut Sink::Placed {
            write: &write,
            threads: writers,
        },
        &|b| bar.inc(b),
    )?;
    out.finish()?;
    bar.finish_and_clear();
    Ok(summary)
}

#[cfg(test)]
#[path = "isq_tests.rs"]
mod tests;
