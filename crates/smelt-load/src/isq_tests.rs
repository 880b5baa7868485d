//! Tests of in-situ quantization's plumbing (`isq.rs`): whole-model assembly, the chunked
//! pipeline against whole-tensor quantization (in-order and placed writers alike), errors
//! stopping every thread, and reading overlapped with quantizing.

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
            let out = GgufPlacedWriter::create(&path, &md, specs.clone()).expect("placed writer");
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

/// A host slot that counts the slots alive (made and not yet freed).
struct Counted {
    slot: pipeline::HostSlot,
    alive: std::sync::Arc<std::sync::atomic::AtomicIsize>,
}
impl Drop for Counted {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
/// The CPU's stage over [`Counted`] slots; its first completion waits `first_wait`.
struct CountedStage {
    first_wait: std::time::Duration,
    waited: std::sync::atomic::AtomicBool,
}
impl pipeline::Stage for CountedStage {
    type Slot = Counted;
    fn input<'a>(&self, s: &'a mut Counted) -> &'a mut [u8] {
        HostStage(&CpuQuantizer).input(&mut s.slot)
    }
    fn submit(&self, s: &mut Counted, job: &Job) -> Result<(), QuantizeError> {
        HostStage(&CpuQuantizer).submit(&mut s.slot, job)
    }
    fn complete(&self, s: &mut Counted, job: &Job) -> Result<(), QuantizeError> {
        if !self.waited.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(self.first_wait);
        }
        HostStage(&CpuQuantizer).complete(&mut s.slot, job)
    }
    fn output<'a>(&self, s: &'a Counted, job: &Job) -> &'a [u8] {
        HostStage(&CpuQuantizer).output(&s.slot, job)
    }
}

/// A run that starts with one slot and makes the others as it goes (how a GPU's pinned
/// slots are made) writes the bytes of a run with every slot from the start, frees every
/// slot it had (the reader frees them after its last read), and a slot that cannot be made
/// ends the run with that error instead of hanging.
#[test]
fn slots_made_during_a_run_give_the_same_bytes_and_are_all_freed() {
    use std::sync::atomic::{AtomicIsize, Ordering};
    use std::sync::Arc;
    let src = Mem(
        vec![SourceTensor {
            name: "blk.0.ffn_up.weight".into(),
            shape: vec![64, 48],
            ty: GgmlType::F32,
        }],
        vec![f32_bytes(&vals(64 * 48, 9))],
    );
    let jobs = pipeline::plan_jobs(src.tensors(), &[GgmlType::Q8_0], true, 512).expect("plan");
    assert!(jobs.len() > 20, "{} jobs", jobs.len());
    let cap = pipeline::max_src(&jobs);
    let alive = Arc::new(AtomicIsize::new(0));
    let make = || -> Result<Counted, LoadError> {
        alive.fetch_add(1, Ordering::SeqCst);
        Ok(Counted {
            slot: HostStage::slots(1, cap).pop().expect("one"),
            alive: alive.clone(),
        })
    };
    let fail = || -> Result<Counted, LoadError> {
        Err(LoadError::Plan {
            why: "no pinned memory left".into(),
        })
    };
    let run_with = |first: usize, grow: usize, failing: bool| {
        let mut out = Vec::new();
        let mut write = |_: &Job, b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        };
        let stage = CountedStage {
            // The failing maker runs before the reader can finish: the first
            // completion waits (only when the failure is not set yet, so it costs nothing).
            first_wait: std::time::Duration::from_millis(if failing { 2000 } else { 0 }),
            waited: Default::default(),
        };
        let slots = (0..first).map(|_| make().expect("slot")).collect();
        let maker: &(dyn Fn() -> Result<Counted, LoadError> + Sync) =
            if failing { &fail } else { &make };
        let r = pipeline::run_growing(
            &stage,
            slots,
            Some(pipeline::Grow {
                n: grow,
                make: maker,
            }),
            src.tensors(),
            &jobs,
            &|job, buf| src.read(job.tensor, job.src_offset, buf),
            &mut Sink::InOrder(&mut write),
            &|_| {},
        );
        (r, out)
    };
    let (all, want) = run_with(4, 0, false);
    assert_eq!(all.expect("runs").stages.grown, 0);
    assert_eq!(alive.load(Ordering::SeqCst), 0, "every slot freed");
    let (grown, got) = run_with(1, 3, false);
    let grown = grown.expect("runs");
    assert!(grown.stages.grown <= 3);
    assert!(got == want, "bytes differ with slots made during the run");
    assert_eq!(alive.load(Ordering::SeqCst), 0, "every slot freed");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(run_with(1, 3, true).0.map(|_| ()));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("returns instead of hanging")
            .expect_err("a slot that cannot be made fails the run")
            .to_string();
        assert!(e.contains("no pinned memory left"), "{e}");
    });
    assert_eq!(alive.load(Ordering::SeqCst), 0, "every slot freed");
}
