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
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = at
            .checked_add(buf.len())
            .and_then(|end| d.get(at..end))
            .ok_or_else(|| LoadError::Plan {
                why: format!("tensor #{i}: bytes {offset}.. past its {} bytes", d.len()),
            })?;
        pipeline::copy_parallel(buf, src, pipeline::read_threads(), pipeline::READ_PIECE);
        Ok(())
    }
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
mod tests {
    use super::*;

    struct Mem(Vec<SourceTensor>, Vec<Vec<u8>>);
    impl TensorSource for Mem {
        fn tensors(&self) -> &[SourceTensor] {
            &self.0
        }
        fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError> {
            Ok(Cow::Borrowed(&self.1[i]))
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn assembles_in_one_allocation_and_quantizes_like_smelt_quant() {
        let w: Vec<f32> = (0..64 * 3)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let norm = vec![1.0f32; 64];
        let src = Mem(
            vec![
                SourceTensor {
                    name: "w".into(),
                    shape: vec![64, 3],
                    ty: GgmlType::F32,
                },
                SourceTensor {
                    name: "n".into(),
                    shape: vec![64],
                    ty: GgmlType::F32,
                },
            ],
            vec![f32_bytes(&w), f32_bytes(&norm)],
        );
        let md = Metadata::new();
        let types = [GgmlType::Q8_0, GgmlType::F32];
        let bytes = assemble(
            &md,
            &src,
            Some(&types),
            &CpuQuantizer,
            &ProgressBar::hidden(),
        )
        .expect("assembles");
        assert_eq!(
            bytes.len(),
            bytes.capacity(),
            "allocated once at its final size"
        );
        let g = Gguf::from_bytes(bytes).expect("parses");
        let t = g.tensor("w").expect("w");
        assert_eq!(t.ty, GgmlType::Q8_0);
        let want = smelt_quant::quantize_tensor(GgmlType::Q8_0, &w, 64, Some(1)).expect("q");
        assert_eq!(g.tensor_data(t), &want[..]);
        let n = g.tensor("n").expect("n");
        assert_eq!(g.tensor_data(n), &f32_bytes(&norm)[..]);
    }

    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect()
    }

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    }

    fn vals(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 2_654_435_761usize) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// A model cut into chunks of a few rows (many per tensor, a ragged last one) streams
    /// to the very file a whole-tensor quantizer writes: every tensor quantized at once by
    /// smelt-quant from its values, copies copied.
    #[test]
    fn chunked_stream_is_the_whole_tensor_file() {
        let (a, b, c, n) = (
            vals(256 * 7, 1),
            vals(64 * 5, 2),
            vals(32 * 9, 3),
            vals(64, 4),
        );
        let src = Mem(
            vec![
                SourceTensor {
                    name: "a".into(),
                    shape: vec![256, 7],
                    ty: GgmlType::BF16,
                },
                SourceTensor {
                    name: "b".into(),
                    shape: vec![64, 5],
                    ty: GgmlType::F32,
                },
                SourceTensor {
                    name: "n".into(),
                    shape: vec![64],
                    ty: GgmlType::F32,
                },
                SourceTensor {
                    name: "c".into(),
                    shape: vec![32, 9],
                    ty: GgmlType::F16,
                },
            ],
            vec![bf16_bytes(&a), f32_bytes(&b), f32_bytes(&n), f16_bytes(&c)],
        );
        let types = [
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::F32,
            GgmlType::Q4_0,
        ];
        let specs: Vec<TensorSpec> = src
            .0
            .iter()
            .zip(types)
            .map(|(t, ty)| TensorSpec {
                name: t.name.clone(),
                ty,
                shape: t.shape.clone(),
            })
            .collect();
        let md = Metadata::new();
        // The reference: whole tensors, values widened the way the quantizer reads them.
        let wide = |ty: GgmlType, bytes: &[u8], n: usize| {
            let mut v = vec![0f32; n];
            smelt_quant::dequantize_row(ty, bytes, &mut v).expect("widens");
            v
        };
        let mut want = GgufWriter::new(Vec::new(), &md, specs.clone()).expect("writer");
        let q = |ty, v: &[f32], row| smelt_quant::quantize_tensor(ty, v, row, Some(1)).expect("q");
        want.write_tensor(
            "a",
            &q(
                GgmlType::Q6_K,
                &wide(GgmlType::BF16, &src.1[0], a.len()),
                256,
            ),
        )
        .expect("a");
        want.write_tensor("b", &q(GgmlType::Q8_0, &b, 64))
            .expect("b");
        want.write_tensor("n", &src.1[2]).expect("n");
        want.write_tensor(
            "c",
            &q(GgmlType::Q4_0, &wide(GgmlType::F16, &src.1[3], c.len()), 32),
        )
        .expect("c");
        let want = want.finish().expect("finish");
        for chunk in [1, 300, 1100, 1 << 20] {
            let mut got = Vec::new();
            {
                let w = GgufWriter::new(&mut got, &md, specs.clone()).expect("writer");
                let s = stream_chunked(
                    &src,
                    &types,
                    true,
                    &CpuQuantizer,
                    w,
                    &ProgressBar::hidden(),
                    chunk,
                )
                .expect("streams");
                let read: usize = src.1.iter().map(Vec::len).sum();
                assert_eq!(s.read, read as u64, "chunk {chunk}");
            }
            assert!(got == want, "chunk {chunk}: bytes differ");
            // The same chunks written at their offsets by writer threads, in whatever order
            // they finish, into a file created at its size.
            let dir = tempfile::tempdir().expect("tempdir");
            for writers in [1, 3] {
                let path = dir.path().join(format!("placed-{writers}.gguf"));
                let out =
                    GgufPlacedWriter::create(&path, &md, specs.clone()).expect("placed writer");
                let s = stream_placed_chunked(
                    &src,
                    &types,
                    true,
                    &CpuQuantizer,
                    out,
                    writers,
                    &ProgressBar::hidden(),
                    chunk,
                )
                .expect("streams");
                assert_eq!(s.stages.writers, writers);
                assert!(
                    std::fs::read(&path).expect("reads") == want,
                    "chunk {chunk}, {writers} writers: bytes differ"
                );
            }
        }
    }

    /// A quantizer that fails on one chunk of a tensor (its rows' first value is 7.0).
    struct FailOn7;
    impl TensorQuantizer for FailOn7 {
        fn name(&self) -> &str {
            "fail-on-7"
        }
        fn quantize(
            &self,
            src_ty: GgmlType,
            src: &[u8],
            shape: &[u64],
            dst: GgmlType,
            progress: &dyn Fn(u64),
        ) -> Result<Vec<u8>, QuantizeError> {
            if src.get(..4) == Some(&7.0f32.to_le_bytes()[..]) {
                return Err(QuantError::BadShape {
                    len: 7,
                    n_per_row: 7,
                }
                .into());
            }
            CpuQuantizer.quantize(src_ty, src, shape, dst, progress)
        }
    }

    /// An early chunk's failure, among many chunks, ends the run with its error whichever
    /// way it writes: the reader and the writers stop instead of waiting on each other
    /// (the in-order run used to hang here once the reader filled every slot).
    #[test]
    fn an_early_failure_among_many_chunks_stops_every_thread() {
        let mut v = vals(32 * 64, 6);
        v[32 * 2] = 7.0;
        let src = Mem(
            vec![SourceTensor {
                name: "blk.0.ffn_up.weight".into(),
                shape: vec![32, 64],
                ty: GgmlType::F32,
            }],
            vec![f32_bytes(&v)],
        );
        let specs = vec![TensorSpec {
            name: "blk.0.ffn_up.weight".into(),
            ty: GgmlType::Q8_0,
            shape: vec![32, 64],
        }];
        let dir = tempfile::tempdir().expect("tempdir");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let w = GgufWriter::new(Vec::new(), &Metadata::new(), specs.clone()).expect("w");
            let a = stream_chunked(
                &src,
                &[GgmlType::Q8_0],
                true,
                &FailOn7,
                w,
                &ProgressBar::hidden(),
                128,
            )
            .map(|_| ())
            .unwrap_err()
            .to_string();
            let out = GgufPlacedWriter::create(dir.path().join("x.gguf"), &Metadata::new(), specs)
                .expect("placed");
            let b = stream_placed_chunked(
                &src,
                &[GgmlType::Q8_0],
                true,
                &FailOn7,
                out,
                2,
                &ProgressBar::hidden(),
                128,
            )
            .map(|_| ())
            .unwrap_err()
            .to_string();
            let _ = tx.send((a, b));
        });
        let (a, b) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the failed runs return instead of hanging");
        for e in [a, b] {
            assert!(e.contains("blk.0.ffn_up.weight"), "{e}");
        }
    }

    /// The CPU quantizer's stage reads ahead: the quantizer of chunk 0 waits until the
    /// source has been asked for chunk 1, which only happens if reading runs beside
    /// quantizing (a serial read-quantize-write loop fails here: its quantizer waits in
    /// vain).
    #[test]
    fn reading_overlaps_quantizing() {
        use std::sync::{Condvar, Mutex};
        struct Gate {
            asked: Mutex<usize>,
            cv: Condvar,
        }
        struct Src<'g>(Mem, &'g Gate);
        impl TensorSource for Src<'_> {
            fn tensors(&self) -> &[SourceTensor] {
                self.0.tensors()
            }
            fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError> {
                self.0.data(i)
            }
            fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
                *self.1.asked.lock().expect("lock") += 1;
                self.1.cv.notify_all();
                self.0.read(i, offset, buf)
            }
        }
        struct Waits<'g>(&'g Gate);
        impl TensorQuantizer for Waits<'_> {
            fn name(&self) -> &str {
                "waits"
            }
            fn quantize(
                &self,
                src_ty: GgmlType,
                src: &[u8],
                shape: &[u64],
                dst: GgmlType,
                progress: &dyn Fn(u64),
            ) -> Result<Vec<u8>, QuantizeError> {
                let asked = self.0.asked.lock().expect("lock");
                let (asked, timeout) = self
                    .0
                    .cv
                    .wait_timeout_while(asked, std::time::Duration::from_secs(10), |n| *n < 2)
                    .expect("wait");
                assert!(
                    !timeout.timed_out(),
                    "the next chunk was not read while this one was quantized ({} reads)",
                    *asked
                );
                drop(asked);
                CpuQuantizer.quantize(src_ty, src, shape, dst, progress)
            }
        }
        let gate = Gate {
            asked: Mutex::new(0),
            cv: Condvar::new(),
        };
        let v = vals(32 * 8, 7);
        let src = Src(
            Mem(
                vec![SourceTensor {
                    name: "w".into(),
                    shape: vec![32, 8],
                    ty: GgmlType::F32,
                }],
                vec![f32_bytes(&v)],
            ),
            &gate,
        );
        let specs = vec![TensorSpec {
            name: "w".into(),
            ty: GgmlType::Q8_0,
            shape: vec![32, 8],
        }];
        let mut got = Vec::new();
        let w = GgufWriter::new(&mut got, &Metadata::new(), specs).expect("writer");
        let s = stream_chunked(
            &src,
            &[GgmlType::Q8_0],
            true,
            &Waits(&gate),
            w,
            &ProgressBar::hidden(),
            128,
        )
        .expect("streams");
        assert_eq!(s.read, 32 * 8 * 4);
    }

    /// A bad value in a late chunk stops the pipeline with the tensor's name (the reader
    /// thread does not hang on a full queue).
    #[test]
    fn a_failing_late_chunk_names_its_tensor_and_stops() {
        let mut v = vals(32 * 40, 5);
        v[32 * 39 + 3] = f32::INFINITY;
        let src = Mem(
            vec![SourceTensor {
                name: "blk.9.ffn_up.weight".into(),
                shape: vec![32, 40],
                ty: GgmlType::F32,
            }],
            vec![f32_bytes(&v)],
        );
        let specs = vec![TensorSpec {
            name: "blk.9.ffn_up.weight".into(),
            ty: GgmlType::Q8_0,
            shape: vec![32, 40],
        }];
        let w = GgufWriter::new(Vec::new(), &Metadata::new(), specs).expect("writer");
        let e = stream_chunked(
            &src,
            &[GgmlType::Q8_0],
            true,
            &CpuQuantizer,
            w,
            &ProgressBar::hidden(),
            128,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("blk.9.ffn_up.weight"), "{e}");
    }

    #[test]
    fn a_non_finite_weight_names_the_tensor() {
        let src = Mem(
            vec![SourceTensor {
                name: "blk.0.w".into(),
                shape: vec![32, 1],
                ty: GgmlType::F32,
            }],
            vec![f32_bytes(&[f32::NAN; 32])],
        );
        let e = assemble(
            &Metadata::new(),
            &src,
            Some(&[GgmlType::Q4_0]),
            &CpuQuantizer,
            &ProgressBar::hidden(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("blk.0.w") && e.contains("q4_0"), "{e}");
    }
}
