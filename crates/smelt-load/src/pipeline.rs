//! The pipelined quantizer: a model's tensors cut into chunks of whole rows, read ahead in
//! large parallel pieces into a few reused staging slots while earlier chunks are being
//! quantized (on all CPU cores, or on a GPU through its own slots and streams) and written
//! out in order. Memory stays at the slots (a few chunks), whatever the model's size, and
//! the output bytes are the per-tensor quantizer's: every ggml format quantizes each row on
//! its own, so cutting between rows changes nothing.
//!
//! Three actors: a reader thread (fills a free slot, then [`Stage::submit`]s it), the
//! caller's thread ([`Stage::complete`]s slots in job order and hands the bytes to the
//! writer), and the stage (CPU: quantizes in `complete`, so reading the next chunks overlaps
//! it; GPU: copies and kernels run on the slot's stream between `submit` and `complete`).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use smelt_gguf::GgmlType;
use smelt_quant::QuantError;

use crate::error::QuantizeError;
use crate::isq::{SourceTensor, TensorQuantizer};
use crate::LoadError;

/// Source bytes per chunk: large enough that copies and kernels run at full speed, small
/// enough that a few slots are a few hundred megabytes.
pub const CHUNK_BYTES: usize = 64 << 20;

/// One chunk of one tensor: `rows` whole rows (or raw bytes, when the tensor is copied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Index of the tensor in the source.
    pub tensor: usize,
    /// Byte offset of the chunk in the tensor's source data, and its length.
    pub src_offset: u64,
    pub src_len: usize,
    /// Rows of `cols` elements (for copies: the bytes as one row).
    pub rows: usize,
    pub cols: usize,
    pub src_ty: GgmlType,
    pub dst_ty: GgmlType,
    /// Output bytes of the chunk.
    pub out_len: usize,
    /// Whether the chunk is converted (else its bytes are copied as they are).
    pub convert: bool,
    /// Whether this chunk ends its tensor.
    pub last: bool,
}

/// Whether a tensor of `src` type written as `dst` goes through the quantizer: always when
/// the types differ; a quantized tensor kept in its type is requantized from its values
/// when `requantize` is set (what `smelt quantize` and `--isq` do), else copied.
pub fn converts(src: GgmlType, dst: GgmlType, requantize: bool) -> bool {
    src != dst || (requantize && src.is_quantized())
}

/// Cuts every tensor into jobs of at most `chunk` source bytes (at least one row each);
/// `types[i]` is tensor `i`'s output type (see [`converts`] for `requantize`). A tensor of
/// no elements is one empty job, so every tensor gets its `last` job.
pub fn plan_jobs(
    tensors: &[SourceTensor],
    types: &[GgmlType],
    requantize: bool,
    chunk: usize,
) -> Result<Vec<Job>, LoadError> {
    let mut jobs = Vec::new();
    for (i, (t, &dst)) in tensors.iter().zip(types).enumerate() {
        let n: u64 = t.shape.iter().product();
        let cols = t.shape.first().copied().unwrap_or(1).max(1);
        let bad = |what: &str| LoadError::Plan {
            why: format!("tensor {}: {what}", t.name),
        };
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| bad("too large for this machine"));
        let src_row = to_usize(
            t.ty.row_bytes(cols)
                .ok_or_else(|| bad("rows are not whole blocks"))?,
        )?;
        let convert = converts(t.ty, dst, requantize);
        let dst_row = if convert {
            to_usize(
                dst.row_bytes(cols)
                    .ok_or_else(|| bad("rows are not whole blocks of the output type"))?,
            )?
        } else {
            src_row
        };
        let rows = to_usize(n / cols)?;
        if n == 0 || rows == 0 {
            jobs.push(Job {
                tensor: i,
                src_offset: 0,
                src_len: 0,
                rows: 0,
                cols: to_usize(cols)?,
                src_ty: t.ty,
                dst_ty: dst,
                out_len: 0,
                convert: false,
                last: true,
            });
            continue;
        }
        if convert {
            let per = (chunk / src_row).max(1);
            let mut r = 0;
            while r < rows {
                let k = per.min(rows - r);
                jobs.push(Job {
                    tensor: i,
                    src_offset: (r * src_row) as u64,
                    src_len: k * src_row,
                    rows: k,
                    cols: to_usize(cols)?,
                    src_ty: t.ty,
                    dst_ty: dst,
                    out_len: k * dst_row,
                    convert: true,
                    last: r + k == rows,
                });
                r += k;
            }
        } else {
            let total = rows * src_row;
            let mut off = 0;
            while off < total {
                let k = chunk.min(total - off);
                jobs.push(Job {
                    tensor: i,
                    src_offset: off as u64,
                    src_len: k,
                    rows: 1,
                    cols: k,
                    src_ty: t.ty,
                    dst_ty: dst,
                    out_len: k,
                    convert: false,
                    last: off + k == total,
                });
                off += k;
            }
        }
    }
    Ok(jobs)
}

/// Where chunks are quantized. A slot owns one chunk's staging memory (host, and device
/// for a GPU); the pipeline moves slots between its threads.
pub trait Stage: Sync {
    type Slot: Send;
    /// The slot's input staging area (at least the largest job's `src_len`).
    fn input<'a>(&self, slot: &'a mut Self::Slot) -> &'a mut [u8];
    /// Called on the reader thread once `input` holds a converted job's bytes: start it.
    fn submit(&self, slot: &mut Self::Slot, job: &Job) -> Result<(), QuantizeError>;
    /// Called in job order: the job's output bytes (waiting for them as needed).
    fn complete<'a>(&self, slot: &'a mut Self::Slot, job: &Job) -> Result<&'a [u8], QuantizeError>;
}

/// The stage of any [`TensorQuantizer`] that quantizes host bytes (the CPU's: all cores of
/// rayon's pool): it quantizes in `complete`, so the reader thread fills the next slots
/// meanwhile.
pub struct HostStage<'q>(pub &'q dyn TensorQuantizer);

/// A host slot: the chunk's source bytes and its output.
pub struct HostSlot {
    input: Vec<u8>,
    out: Vec<u8>,
}

impl HostStage<'_> {
    /// `n` slots of `cap` input bytes.
    pub fn slots(n: usize, cap: usize) -> Vec<HostSlot> {
        (0..n)
            .map(|_| HostSlot {
                input: vec![0; cap],
                out: Vec::new(),
            })
            .collect()
    }
}

impl Stage for HostStage<'_> {
    type Slot = HostSlot;
    fn input<'a>(&self, slot: &'a mut HostSlot) -> &'a mut [u8] {
        &mut slot.input
    }
    fn submit(&self, _: &mut HostSlot, _: &Job) -> Result<(), QuantizeError> {
        Ok(())
    }
    fn complete<'a>(&self, slot: &'a mut HostSlot, job: &Job) -> Result<&'a [u8], QuantizeError> {
        slot.out = convert_with(self.0, job, &slot.input[..job.src_len])?;
        Ok(&slot.out)
    }
}

/// One converted job through `q`'s per-tensor entry point (on the chunk's rows).
pub fn convert_with(
    q: &dyn TensorQuantizer,
    job: &Job,
    src: &[u8],
) -> Result<Vec<u8>, QuantizeError> {
    let shape = [job.cols as u64, job.rows as u64];
    let out = q.quantize(job.src_ty, src, &shape, job.dst_ty, &|_| {})?;
    if out.len() != job.out_len {
        return Err(QuantError::BadShape {
            len: out.len(),
            n_per_row: job.cols,
        }
        .into());
    }
    Ok(out)
}

/// Source bytes of the largest job (the slots' input size).
pub fn max_src(jobs: &[Job]) -> usize {
    jobs.iter().map(|j| j.src_len).max().unwrap_or(0)
}

/// Slots the host stage keeps: one being read, one being quantized, one ready.
pub const HOST_SLOTS: usize = 3;

/// What a pipelined run moved, for the summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub read: u64,
    pub written: u64,
    pub elapsed: Duration,
    /// Time the writer spent waiting for chunks (the reader or the stage was behind).
    pub waited: Duration,
}

impl Summary {
    /// `read 15.01 GB, wrote 6.16 GB in 4.2 s (3.57 GB/s)`: decimal gigabytes, the rate of
    /// what was read.
    pub fn line(&self) -> String {
        let s = self.elapsed.as_secs_f64();
        let gb = |b: u64| b as f64 / 1e9;
        let rate = if s > 0.0 { gb(self.read) / s } else { 0.0 };
        format!(
            "read {:.2} GB, wrote {:.2} GB in {s:.1} s ({rate:.2} GB/s)",
            gb(self.read),
            gb(self.written)
        )
    }
}

/// Takes each job's output bytes, in job order.
pub type WriteFn<'a> = dyn FnMut(&Job, &[u8]) -> Result<(), LoadError> + 'a;

/// Fills `buf` with the job's source bytes.
pub type ReadFn<'a> = dyn Fn(&Job, &mut [u8]) -> Result<(), LoadError> + Sync + 'a;

/// Runs `jobs` through `stage` with `slots` (two or more keep reading and quantizing
/// overlapped), calling `write` with each job's output in job order and `progress` with
/// the source bytes of each finished job.
pub fn run<S: Stage>(
    stage: &S,
    slots: Vec<S::Slot>,
    tensors: &[SourceTensor],
    jobs: &[Job],
    read: &ReadFn<'_>,
    write: &mut WriteFn<'_>,
    progress: &dyn Fn(u64),
) -> Result<Summary, LoadError> {
    let start = Instant::now();
    let mut summary = Summary::default();
    if slots.is_empty() {
        return Err(LoadError::Plan {
            why: "a pipeline needs at least one slot".into(),
        });
    }
    let n_slots = slots.len();
    let (free_tx, free_rx) = mpsc::sync_channel::<S::Slot>(n_slots);
    let (done_tx, done_rx) = mpsc::sync_channel::<Result<S::Slot, LoadError>>(n_slots);
    for s in slots {
        free_tx.send(s).map_err(|_| LoadError::Plan {
            why: "pipeline slots".into(),
        })?;
    }
    let quant_err = |job: &Job, e: QuantizeError| LoadError::Quantize {
        name: tensors
            .get(job.tensor)
            .map_or_else(|| format!("#{}", job.tensor), |t| t.name.clone()),
        from: job.src_ty,
        to: job.dst_ty,
        source: e,
    };
    std::thread::scope(|scope| -> Result<(), LoadError> {
        scope.spawn(move || {
            for job in jobs {
                let Ok(mut slot) = free_rx.recv() else { return };
                let r = (|| {
                    let buf = stage.input(&mut slot);
                    let buf = buf.get_mut(..job.src_len).ok_or_else(|| LoadError::Plan {
                        why: format!("a {} byte chunk does not fit its slot", job.src_len),
                    })?;
                    read(job, buf)?;
                    if job.convert {
                        stage
                            .submit(&mut slot, job)
                            .map_err(|e| quant_err(job, e))?;
                    }
                    Ok(())
                })();
                let failed = r.is_err();
                if done_tx.send(r.map(|()| slot)).is_err() || failed {
                    return;
                }
            }
        });
        for job in jobs {
            let t = Instant::now();
            let msg = done_rx.recv().map_err(|_| LoadError::Plan {
                why: "the reader stopped".into(),
            });
            summary.waited += t.elapsed();
            let mut slot = msg??;
            let out: &[u8] = if job.convert {
                stage
                    .complete(&mut slot, job)
                    .map_err(|e| quant_err(job, e))?
            } else {
                &stage.input(&mut slot)[..job.src_len]
            };
            write(job, out)?;
            summary.read += job.src_len as u64;
            summary.written += job.out_len as u64;
            progress(job.src_len as u64);
            // The reader may have finished already: a failed send is fine.
            let _ = free_tx.send(slot);
        }
        Ok(())
    })?;
    summary.elapsed = start.elapsed();
    Ok(summary)
}

/// Parallel positional reads, shared with the CUDA backend's in-situ quantization.
pub use smelt_gguf::pread_parallel;

/// Copies `src` into `dst` with up to `threads` threads (a mapped file's pages fault in
/// in parallel).
pub fn copy_parallel(dst: &mut [u8], src: &[u8], threads: usize, piece: usize) {
    let n = dst.len().div_ceil(piece.max(1)).clamp(1, threads.max(1));
    if n == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let per = dst.len().div_ceil(n);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// Reader threads for a machine: a few more than the cores (reads wait on the disk), at
/// least 4, at most 16.
pub fn read_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4)
        .clamp(4, 16)
}

/// Bytes per parallel read piece.
pub const READ_PIECE: usize = 4 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: &[u64], ty: GgmlType) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shape: shape.to_vec(),
            ty,
        }
    }

    #[test]
    fn jobs_cut_whole_rows_and_end_every_tensor() {
        let ts = [
            t("w", &[256, 10], GgmlType::BF16),
            t("n", &[256], GgmlType::F32),
            t("e", &[0, 4], GgmlType::F32),
        ];
        let jobs = plan_jobs(
            &ts,
            &[GgmlType::Q4_K, GgmlType::F32, GgmlType::F32],
            true,
            1500,
        )
        .expect("plans");
        // 512-byte rows, 2 rows (1024 bytes) per chunk of at most 1500: 5 jobs.
        let w: Vec<_> = jobs.iter().filter(|j| j.tensor == 0).collect();
        assert_eq!(w.len(), 5);
        assert!(w
            .iter()
            .all(|j| j.rows == 2 && j.src_len == 1024 && j.out_len == 288));
        assert_eq!(w.iter().filter(|j| j.last).count(), 1);
        assert!(w[4].last && w[4].src_offset == 4096);
        // The copied vector: 1024 bytes in one job of raw bytes.
        let n: Vec<_> = jobs.iter().filter(|j| j.tensor == 1).collect();
        assert_eq!(n.len(), 1);
        assert!(!n[0].convert && n[0].src_len == 1024 && n[0].last);
        // An empty tensor still ends.
        let e: Vec<_> = jobs.iter().filter(|j| j.tensor == 2).collect();
        assert_eq!(e.len(), 1);
        assert!(e[0].last && e[0].src_len == 0);
    }

    #[test]
    fn a_row_larger_than_a_chunk_is_one_job() {
        let jobs = plan_jobs(
            &[t("w", &[256, 3], GgmlType::F32)],
            &[GgmlType::Q8_0],
            true,
            100,
        )
        .expect("plans");
        assert_eq!(jobs.len(), 3);
        assert!(jobs.iter().all(|j| j.rows == 1));
    }

    #[test]
    fn parallel_reads_and_copies_give_the_bytes() {
        let dir = std::env::temp_dir().join(format!("smelt-pread-{}", std::process::id()));
        let data: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&dir, &data).expect("writes");
        let f = std::fs::File::open(&dir).expect("opens");
        let mut buf = vec![0u8; 90_000];
        pread_parallel(&f, 77, &mut buf, 7, 1000).expect("reads");
        assert_eq!(&buf[..], &data[77..90_077]);
        let mut c = vec![0u8; 99_999];
        copy_parallel(&mut c, &data[4..100_003], 5, 333);
        assert_eq!(&c[..], &data[4..]);
        std::fs::remove_file(&dir).ok();
    }

    #[test]
    fn summary_line_says_gb_read_written_seconds_and_rate() {
        let s = Summary {
            read: 15_010_000_000,
            written: 6_160_000_000,
            elapsed: Duration::from_millis(4200),
            waited: Duration::ZERO,
        };
        assert_eq!(
            s.line(),
            "read 15.01 GB, wrote 6.16 GB in 4.2 s (3.57 GB/s)"
        );
    }
}
