//! The pipelined quantizer: a model's tensors cut into chunks of whole rows, read ahead in
//! large parallel pieces into a few reused staging slots while earlier chunks are being
//! quantized (on all CPU cores, or on a GPU through its own slots and streams) and written
//! out in order. Memory stays at the slots (a few chunks), whatever the model's size, and
//! the output bytes are the per-tensor quantizer's: every ggml format quantizes each row on
//! its own, so cutting between rows changes nothing.
//!
//! Four actors: a reader thread (fills a free slot, then [`Stage::submit`]s it), the
//! caller's thread ([`Stage::complete`]s slots in job order), the writers (a [`Sink`]: the
//! caller's thread writing in order into a stream, or writer threads putting each chunk at
//! its own offset of a file already at its size, while the caller completes the next
//! chunks), and the stage (CPU: quantizes in `complete`, so reading the next chunks and
//! writing the last ones overlap it; GPU: copies and kernels run on the slot's stream
//! between `submit` and `complete`). Each actor's busy and idle time is kept ([`Stages`]):
//! `smelt quantize -v` prints where the time went.
//!
//! Fixed costs stay off the critical path: slots can be made as the run goes ([`Grow`]: a
//! GPU's pinned slots take tens of milliseconds each, so the first chunk starts once one
//! exists), and slots are freed by the reader after its last read, as they come back, not
//! by the writer that is the bound of a run to a file.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
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
    /// Byte offset of the chunk's output in the tensor's output data, and its length.
    pub dst_offset: u64,
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
                dst_offset: 0,
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
                    dst_offset: (r * dst_row) as u64,
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
                    dst_offset: off as u64,
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
    /// Called in job order for converted jobs: finish the job (waiting for it as needed).
    fn complete(&self, slot: &mut Self::Slot, job: &Job) -> Result<(), QuantizeError>;
    /// The job's output bytes once complete; a copied job's are its input's first
    /// `src_len` bytes. Called on a writer thread, or in order on the completing one.
    fn output<'a>(&self, slot: &'a Self::Slot, job: &Job) -> &'a [u8];
}

/// The stage of any [`TensorQuantizer`] that quantizes host bytes (the CPU's: all cores of
/// rayon's pool): it quantizes in `complete`, so the reader thread fills the next slots
/// meanwhile (and writer threads write the previous ones).
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
    fn complete(&self, slot: &mut HostSlot, job: &Job) -> Result<(), QuantizeError> {
        slot.out = convert_with(self.0, job, &slot.input[..job.src_len])?;
        Ok(())
    }
    fn output<'a>(&self, slot: &'a HostSlot, job: &Job) -> &'a [u8] {
        if job.convert {
            &slot.out
        } else {
            &slot.input[..job.src_len]
        }
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

/// Slots the host stage keeps: one being read, one being quantized, one ready (plus one
/// per writer thread, [`Sink::extra_slots`]).
pub const HOST_SLOTS: usize = 3;

/// Where each actor of a run spent its time (wall time of each thread; the writers' summed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stages {
    /// Before the first read: the caller's staging memory (a GPU's pinned slots).
    pub setup: Duration,
    /// Making [`Grow`]'s slots on a thread of their own while the run goes, and how many.
    pub grow: Duration,
    pub grown: usize,
    /// Reader thread, after its last read: freeing slots as they come back.
    pub free: Duration,
    /// Reader thread: reading source bytes into slots.
    pub read: Duration,
    /// Reader thread: starting converted jobs (a GPU's uploads and kernels queued).
    pub submit: Duration,
    /// Reader thread: waiting for a free slot (the stage or the writers were behind).
    pub read_idle: Duration,
    /// Completing thread: waiting for the reader's next slot.
    pub complete_idle: Duration,
    /// Completing thread: completing jobs (CPU: quantizing; GPU: waiting for the kernel and
    /// the download, checking the rows).
    pub complete: Duration,
    /// Completing thread: writing in order, or handing slots to the writer threads.
    pub hand_off: Duration,
    /// Writer threads: writing (summed over them; in-order runs write in `hand_off`).
    pub write: Duration,
    /// Writer threads the run had (0: written in order).
    pub writers: usize,
}

/// What a pipelined run moved, for the summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub read: u64,
    pub written: u64,
    pub elapsed: Duration,
    /// Time the completing thread spent waiting for chunks (the reader or the stage was
    /// behind).
    pub waited: Duration,
    pub stages: Stages,
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

    /// Where the time went, one line (`SMELT_CUDA_LOAD_LOG=1` or `smelt quantize -v`):
    /// `stages: setup 0.05 s, 4 more slots 0.20 s meanwhile | reader: read 1.80 s, submit
    /// 0.05 s, idle 0.90 s, freeing slots 0.10 s | completer: idle 0.10 s, complete 0.30 s,
    /// hand-off 2.20 s | 1 writer: wrote 2.60 s (2.33 GB/s)`.
    pub fn stages_line(&self) -> String {
        let t = &self.stages;
        let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        let writers = if t.writers == 0 {
            "written in order by the completer (in its hand-off)".to_string()
        } else {
            let w = t.write.as_secs_f64();
            let rate = if w > 0.0 {
                self.written as f64 / 1e9 / (w / t.writers as f64)
            } else {
                0.0
            };
            format!(
                "{} writer{}: wrote {} ({rate:.2} GB/s each busy second)",
                t.writers,
                if t.writers == 1 { "" } else { "s" },
                s(t.write)
            )
        };
        let grow = if t.grown > 0 {
            format!(", {} more slots {} meanwhile", t.grown, s(t.grow))
        } else {
            String::new()
        };
        format!(
            "stages: setup {}{grow} | reader: read {}, submit {}, idle {}, freeing slots {} | \
             completer: idle {}, complete {}, hand-off {} | {writers}",
            s(t.setup),
            s(t.read),
            s(t.submit),
            s(t.read_idle),
            s(t.free),
            s(t.complete_idle),
            s(t.complete),
            s(t.hand_off),
        )
    }
}

/// Takes each job's output bytes, in job order.
pub type WriteFn<'a> = dyn FnMut(&Job, &[u8]) -> Result<(), LoadError> + 'a;

/// Puts a job's output bytes where they belong (any job, any order, any thread).
pub type PlaceFn<'a> = dyn Fn(&Job, &[u8]) -> Result<(), LoadError> + Sync + 'a;

/// Fills `buf` with the job's source bytes.
pub type ReadFn<'a> = dyn Fn(&Job, &mut [u8]) -> Result<(), LoadError> + Sync + 'a;

/// Counts source bytes of finished jobs (called from any thread).
pub type ProgressFn<'a> = dyn Fn(u64) + Sync + 'a;

/// Where a run's output goes.
pub enum Sink<'a, 'f> {
    /// In job order on the completing thread (a stream: [`smelt_gguf::GgufWriter`]).
    InOrder(&'a mut WriteFn<'f>),
    /// From `threads` writer threads, as jobs complete: the completing thread hands a slot
    /// over and goes on to the next job (a file written at known offsets,
    /// [`smelt_gguf::GgufPlacedWriter`]).
    Placed {
        write: &'a PlaceFn<'f>,
        threads: usize,
    },
}

impl Sink<'_, '_> {
    /// Slots to add to a stage's own: one per writer thread, each holding a chunk being
    /// written.
    pub fn extra_slots(&self) -> usize {
        match self {
            Sink::InOrder(_) => 0,
            Sink::Placed { threads, .. } => (*threads).max(1),
        }
    }
}

/// Nanoseconds per [`Stages`] field, added to from several threads.
#[derive(Default)]
struct Clock {
    read: AtomicU64,
    submit: AtomicU64,
    read_idle: AtomicU64,
    complete_idle: AtomicU64,
    complete: AtomicU64,
    hand_off: AtomicU64,
    write: AtomicU64,
    grow: AtomicU64,
    grown: AtomicU64,
    free: AtomicU64,
    read_bytes: AtomicU64,
    written: AtomicU64,
}

impl Clock {
    fn add(field: &AtomicU64, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        field.fetch_add(ns, Ordering::Relaxed);
    }
    fn get(field: &AtomicU64) -> Duration {
        Duration::from_nanos(field.load(Ordering::Relaxed))
    }
}

/// The first error of any thread of a run; once set, every thread stops at its next job.
#[derive(Default)]
struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<LoadError>>,
}

impl Failure {
    fn set(&self, e: LoadError) {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }
    fn is_set(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
    fn take(&self) -> Option<LoadError> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The reader's loop: fills a free slot with each job's bytes, submits it, and sends it on;
/// stops at the first error (its own, sent on, or another thread's). `done` is dropped on
/// return, so the completing thread's wait ends.
#[allow(clippy::too_many_arguments)]
fn read_all<S: Stage>(
    stage: &S,
    jobs: &[Job],
    read: &ReadFn<'_>,
    free: &mpsc::Receiver<S::Slot>,
    done: mpsc::SyncSender<Result<S::Slot, LoadError>>,
    clock: &Clock,
    failure: &Failure,
    quant_err: &(dyn Fn(&Job, QuantizeError) -> LoadError + Sync),
) {
    for job in jobs {
        if failure.is_set() {
            return;
        }
        let t = Instant::now();
        let Ok(mut slot) = free.recv() else { return };
        Clock::add(&clock.read_idle, t);
        let r = (|| {
            let buf = stage.input(&mut slot);
            let buf = buf.get_mut(..job.src_len).ok_or_else(|| LoadError::Plan {
                why: format!("a {} byte chunk does not fit its slot", job.src_len),
            })?;
            let t = Instant::now();
            read(job, buf)?;
            Clock::add(&clock.read, t);
            if job.convert {
                let t = Instant::now();
                stage
                    .submit(&mut slot, job)
                    .map_err(|e| quant_err(job, e))?;
                Clock::add(&clock.submit, t);
            }
            Ok(())
        })();
        let failed = r.is_err();
        if done.send(r.map(|()| slot)).is_err() || failed {
            return;
        }
    }
}

/// Slots a run makes as it goes: `n` more, each by `make`, on a thread of their own; each
/// joins the run as soon as it exists.
pub struct Grow<'a, T> {
    pub n: usize,
    pub make: &'a (dyn Fn() -> Result<T, LoadError> + Sync),
}

/// Runs `jobs` through `stage` with `slots` (two or more keep reading and quantizing
/// overlapped; a placed sink needs [`Sink::extra_slots`] more to keep its writers busy),
/// sending each job's output to `sink` and calling `progress` with the source bytes of
/// each written job. The first error of any thread stops every thread and is returned.
pub fn run<S: Stage>(
    stage: &S,
    slots: Vec<S::Slot>,
    tensors: &[SourceTensor],
    jobs: &[Job],
    read: &ReadFn<'_>,
    sink: &mut Sink<'_, '_>,
    progress: &ProgressFn<'_>,
) -> Result<Summary, LoadError> {
    run_growing(stage, slots, None, tensors, jobs, read, sink, progress)
}

/// [`run`] starting with `slots` (at least one) while `grow` makes the rest.
#[allow(clippy::too_many_arguments)]
pub fn run_growing<S: Stage>(
    stage: &S,
    slots: Vec<S::Slot>,
    grow: Option<Grow<'_, S::Slot>>,
    tensors: &[SourceTensor],
    jobs: &[Job],
    read: &ReadFn<'_>,
    sink: &mut Sink<'_, '_>,
    progress: &ProgressFn<'_>,
) -> Result<Summary, LoadError> {
    let start = Instant::now();
    if slots.is_empty() {
        return Err(LoadError::Plan {
            why: "a pipeline needs at least one slot".into(),
        });
    }
    let n_slots = slots.len() + grow.as_ref().map_or(0, |g| g.n);
    let clock = Clock::default();
    let failure = Failure::default();
    let quant_err = |job: &Job, e: QuantizeError| LoadError::Quantize {
        name: tensors
            .get(job.tensor)
            .map_or_else(|| format!("#{}", job.tensor), |t| t.name.clone()),
        from: job.src_ty,
        to: job.dst_ty,
        source: e,
    };
    // Set once the reader has read its last job: slots made after it would never be used.
    let read_done = AtomicBool::new(false);
    let (clock, failure, quant_err, read_done) = (&clock, &failure, &quant_err, &read_done);
    let (writers, placed): (usize, Option<&PlaceFn<'_>>) = match sink {
        Sink::InOrder(_) => (0, None),
        Sink::Placed { write, threads } => ((*threads).max(1), Some(*write)),
    };
    std::thread::scope(|scope| {
        // Every channel end lives in this scope, so each actor's end is dropped when it
        // stops and the others' waits end (no thread hangs on a failed run).
        let (free_tx, free_rx) = mpsc::sync_channel::<S::Slot>(n_slots);
        let (done_tx, done_rx) = mpsc::sync_channel::<Result<S::Slot, LoadError>>(n_slots);
        for s in slots {
            // The receiver is alive and the channel has room for every slot.
            let _ = free_tx.send(s);
        }
        if let Some(Grow { n, make }) = grow {
            let free_tx = free_tx.clone();
            scope.spawn(move || {
                for _ in 0..n {
                    if failure.is_set() || read_done.load(Ordering::Acquire) {
                        return;
                    }
                    let t = Instant::now();
                    match make() {
                        Ok(s) => {
                            Clock::add(&clock.grow, t);
                            clock.grown.fetch_add(1, Ordering::Relaxed);
                            if free_tx.send(s).is_err() {
                                return;
                            }
                        }
                        Err(e) => return failure.set(e),
                    }
                }
            });
        }
        scope.spawn(move || {
            read_all(
                stage, jobs, read, &free_rx, done_tx, clock, failure, quant_err,
            );
            read_done.store(true, Ordering::Release);
            // Slots come back as the last chunks are written; each is freed here (a GPU's
            // pinned memory takes a while to go back), until every other actor has stopped.
            while let Ok(slot) = free_rx.recv() {
                let t = Instant::now();
                drop(slot);
                Clock::add(&clock.free, t);
            }
        });
        let (write_tx, write_rx) = mpsc::sync_channel::<(usize, S::Slot)>(n_slots);
        let write_rx = Arc::new(Mutex::new(write_rx));
        if let Some(write) = placed {
            for _ in 0..writers {
                let free_tx = free_tx.clone();
                let write_rx = write_rx.clone();
                scope.spawn(move || loop {
                    let msg = write_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok((j, slot)) = msg else { return };
                    let job = &jobs[j];
                    if !failure.is_set() {
                        let t = Instant::now();
                        match write(job, stage.output(&slot, job)) {
                            Ok(()) => {
                                Clock::add(&clock.write, t);
                                clock
                                    .read_bytes
                                    .fetch_add(job.src_len as u64, Ordering::Relaxed);
                                clock
                                    .written
                                    .fetch_add(job.out_len as u64, Ordering::Relaxed);
                                progress(job.src_len as u64);
                            }
                            Err(e) => failure.set(e),
                        }
                    }
                    // The reader may have stopped already: a failed send is fine.
                    let _ = free_tx.send(slot);
                });
            }
        }
        let completed = (|| -> Result<(), LoadError> {
            for (j, job) in jobs.iter().enumerate() {
                if failure.is_set() {
                    return Ok(());
                }
                let t = Instant::now();
                let msg = done_rx.recv().map_err(|_| LoadError::Plan {
                    why: "the reader stopped".into(),
                });
                Clock::add(&clock.complete_idle, t);
                let mut slot = msg??;
                if job.convert {
                    let t = Instant::now();
                    stage
                        .complete(&mut slot, job)
                        .map_err(|e| quant_err(job, e))?;
                    Clock::add(&clock.complete, t);
                }
                let t = Instant::now();
                match sink {
                    Sink::InOrder(write) => {
                        write(job, stage.output(&slot, job))?;
                        clock
                            .read_bytes
                            .fetch_add(job.src_len as u64, Ordering::Relaxed);
                        clock
                            .written
                            .fetch_add(job.out_len as u64, Ordering::Relaxed);
                        progress(job.src_len as u64);
                        let _ = free_tx.send(slot);
                    }
                    Sink::Placed { .. } => {
                        if write_tx.send((j, slot)).is_err() {
                            return Ok(());
                        }
                    }
                }
                Clock::add(&clock.hand_off, t);
            }
            Ok(())
        })();
        if let Err(e) = completed {
            failure.set(e);
        }
        drop((write_tx, write_rx, free_tx, done_rx));
    });
    if let Some(e) = failure.take() {
        return Err(e);
    }
    let read = clock.read_bytes.load(Ordering::Relaxed);
    let want: u64 = jobs.iter().map(|j| j.src_len as u64).sum();
    if read != want {
        return Err(LoadError::Plan {
            why: format!("the pipeline stopped after {read} of {want} bytes"),
        });
    }
    Ok(Summary {
        read,
        written: clock.written.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
        waited: Clock::get(&clock.complete_idle),
        stages: Stages {
            setup: Duration::ZERO,
            grow: Clock::get(&clock.grow),
            grown: clock.grown.load(Ordering::Relaxed) as usize,
            free: Clock::get(&clock.free),
            read: Clock::get(&clock.read),
            submit: Clock::get(&clock.submit),
            read_idle: Clock::get(&clock.read_idle),
            complete_idle: Clock::get(&clock.complete_idle),
            complete: Clock::get(&clock.complete),
            hand_off: Clock::get(&clock.hand_off),
            write: Clock::get(&clock.write),
            writers,
        },
    })
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
            ..Summary::default()
        };
        assert_eq!(
            s.line(),
            "read 15.01 GB, wrote 6.16 GB in 4.2 s (3.57 GB/s)"
        );
    }
}
