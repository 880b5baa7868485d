//! Where a decode step's GPU time goes with its graph and programmatic dependent launch as
//! they run (`SMELT_CUDA_TIMELINE=1`; profiling only). `SMELT_CUDA_PROFILE` times kernels
//! one by one (graphs off), which shows no overlap; leaving kernels out
//! (`SMELT_CUDA_SKIP`) moves their neighbours. Here every block of every kernel stamps
//! `%globaltimer` ([`smelt_ptx::timeline`]) and each decode step's stamps are read back.
//!
//! For launch `i` of a step (in launch order, so in dependency order): *adds* is how far
//! its last warp's end lies past launch `i-1`'s (its share of the step: they sum to the
//! step's GPU time), *gap* is from `i-1`'s end to `i`'s first block past its wait (the
//! boundary: completion, flush, release), *run* from that release to `i`'s end, and *ahead*
//! how long before `i-1`'s end `i`'s first block had started (launched early, waiting).
//! The table (per kernel name, per step) goes to stderr when the backend is dropped.
//! Decode steps of one shape only: a replayed graph's launches are named from its capture.

use std::collections::BTreeMap;

use smelt_cuda::cudarc::driver::result as cu;
use smelt_cuda::cudarc::driver::CudaSlice;
use smelt_cuda::{CudaError, Gpu};
use smelt_ptx::timeline::{self, Field};

/// Per-kernel sums over the recorded steps, in nanoseconds.
#[derive(Default, Clone, Copy)]
struct Sums {
    launches: u64,
    adds: f64,
    gap: f64,
    run: f64,
    ahead: f64,
}

pub(crate) struct Timeline {
    buf: CudaSlice<u64>,
    /// Slot of the next launch of this step.
    next: usize,
    /// Whether this step's launches record (decode steps).
    recording: bool,
    /// Kernel of each slot, from the last step whose launches ran (not a replay).
    names: Vec<String>,
    /// Slots the last such step used.
    used: usize,
    sums: BTreeMap<String, Sums>,
    /// First-launch order of the kernel names, for the table.
    order: Vec<String>,
    steps: u64,
    step_ns: f64,
}

impl Timeline {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        Ok(Self {
            buf: gpu.zeros::<u64>(timeline::WORDS)?,
            next: 0,
            recording: false,
            names: Vec::new(),
            used: 0,
            sums: BTreeMap::new(),
            order: Vec::new(),
            steps: 0,
            step_ns: 0.0,
        })
    }

    /// Starts a step: `record` for decode steps, whose buffer is reset on the stream (before
    /// the step's kernels or graph).
    pub(crate) fn begin(&mut self, gpu: &Gpu, record: bool) -> Result<(), CudaError> {
        self.next = 0;
        self.recording = record;
        if record {
            let base = gpu.ptr(&self.buf);
            let min_words = timeline::MIN_FIELDS * timeline::MAX_LAUNCHES * timeline::LANES;
            let stream = gpu.stream().cu_stream();
            // SAFETY: both fills stay inside the buffer of `WORDS` u64 words.
            unsafe {
                cu::memset_d8_async(base, 0xFF, min_words * 8, stream)?;
                cu::memset_d8_async(
                    base + (min_words * 8) as u64,
                    0,
                    (timeline::WORDS - min_words) * 8,
                    stream,
                )?;
            }
        }
        Ok(())
    }

    /// The timeline parameter of the next launch, kernel `name`: its slot, or 0.
    pub(crate) fn arg(&mut self, gpu: &Gpu, name: &str) -> u64 {
        if !self.recording || self.next >= timeline::MAX_LAUNCHES {
            return 0;
        }
        let slot = self.next;
        self.next += 1;
        if self.names.len() <= slot {
            self.names.resize(slot + 1, String::new());
        }
        name.clone_into(&mut self.names[slot]);
        gpu.ptr(&self.buf) + slot as u64 * timeline::SLOT_BYTES
    }

    /// Ends a step: reads its stamps back and adds them up (waits for the step).
    pub(crate) fn end(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        if !self.recording {
            return Ok(());
        }
        self.recording = false;
        if self.next > 0 {
            self.used = self.next;
        }
        let n = self.used;
        if n == 0 {
            return Ok(());
        }
        let mut host = vec![0u64; timeline::WORDS];
        gpu.synchronize()?;
        let stream = gpu.stream();
        stream.memcpy_dtoh(&self.buf, &mut host)?;
        stream.synchronize()?;
        let at = |f: Field, s: usize| timeline::read(&host, f, s);
        let Some(start) = at(Field::FirstEntry, 0) else {
            return Ok(());
        };
        let mut prev_end = start;
        let mut last = start;
        for slot in 0..n {
            let (Some(entry), Some(end)) = (at(Field::FirstEntry, slot), at(Field::LastExit, slot))
            else {
                continue;
            };
            let release = at(Field::FirstRelease, slot).unwrap_or(entry);
            let name = &self.names[slot];
            if !self.sums.contains_key(name) {
                self.order.push(name.clone());
            }
            let s = self.sums.entry(name.clone()).or_default();
            let d = |a: u64, b: u64| a as f64 - b as f64;
            s.launches += 1;
            s.adds += d(end.max(prev_end), prev_end);
            s.gap += d(release, prev_end);
            s.run += d(end, release);
            s.ahead += d(prev_end, entry);
            prev_end = end.max(prev_end);
            last = last.max(end);
        }
        self.steps += 1;
        self.step_ns += (last - start) as f64;
        Ok(())
    }

    /// The per-kernel table, microseconds per step (`adds`, summed over a step's launches
    /// of the kernel) and per launch (`gap`, `run`, `ahead`), largest share first.
    pub(crate) fn table(&self) -> String {
        if self.steps == 0 {
            return String::new();
        }
        let steps = self.steps as f64;
        let mut rows: Vec<(&String, &Sums)> = self
            .order
            .iter()
            .filter_map(|n| Some((n, self.sums.get(n)?)))
            .collect();
        rows.sort_by(|a, b| b.1.adds.total_cmp(&a.1.adds));
        let mut out = format!(
            "CUDA timeline: {} decode steps, {:.1} us of GPU time a step (first block in to last warp out)\n",
            self.steps,
            self.step_ns / steps / 1e3
        );
        out.push_str(&format!(
            "{:<44} {:>8} {:>10} {:>6} {:>9} {:>9} {:>9}\n",
            "kernel", "n/step", "adds us", "%", "gap us", "run us", "ahead us"
        ));
        for (name, s) in rows {
            let per = s.launches as f64;
            out.push_str(&format!(
                "{:<44} {:>8.1} {:>10.1} {:>6.1} {:>9.2} {:>9.2} {:>9.2}\n",
                name,
                per / steps,
                s.adds / steps / 1e3,
                100.0 * s.adds / self.step_ns,
                s.gap / per / 1e3,
                s.run / per / 1e3,
                s.ahead / per / 1e3
            ));
        }
        out
    }
}
