//! GPU time per kernel of eager decode steps, without Nsight (`SMELT_CUDA_PROFILE=1`, which
//! turns graphs off).
//!
//! An event after every launch times the stretch since the previous event. Timing only the
//! kernels needs the GPU to run them back to back: eager launches cost the host a few
//! microseconds each, as long as the small kernels themselves, so events recorded as they go
//! would time the host's launch gaps. Each profiled step therefore starts with a few large
//! device-to-device copies (milliseconds of "ballast") that let the host queue the whole step
//! before the GPU reaches it; the first event is recorded after the ballast. Intervals then
//! hold each kernel plus the GPU's own gap between kernels, about what a graph replay sees.
//! The numbers of a profiled run are for the breakdown only: the events and the ballast slow
//! its steps. The table goes to stderr when the backend is dropped.

use std::collections::BTreeMap;

use smelt_cuda::cudarc::driver::result as cu;
use smelt_cuda::cudarc::driver::sys::CUevent_flags;
use smelt_cuda::cudarc::driver::{CudaEvent, CudaSlice};
use smelt_cuda::{CudaError, Gpu};

/// Bytes of each ballast buffer, and how many copies of it start a profiled step.
const BALLAST_BYTES: usize = 512 << 20;
const BALLAST_COPIES: usize = 8;

/// Per-kernel totals over the profiled steps, and the marks of the step in flight.
#[derive(Default)]
pub(crate) struct Profile {
    ballast: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    start: Option<CudaEvent>,
    marks: Vec<(String, CudaEvent)>,
    /// kernel name -> (launches, milliseconds)
    totals: BTreeMap<String, (u64, f64)>,
    steps: u64,
}

impl Profile {
    /// Queues the ballast and the step's first event.
    pub(crate) fn begin(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        let stream = gpu.stream();
        if self.ballast.is_none() {
            // SAFETY: plain device buffers; their contents are never read as values.
            let a = unsafe { stream.alloc::<u8>(BALLAST_BYTES) }?;
            let b = unsafe { stream.alloc::<u8>(BALLAST_BYTES) }?;
            self.ballast = Some((a, b));
        }
        if let Some((a, b)) = &self.ballast {
            let (pa, pb) = (gpu.ptr(a), gpu.ptr(b));
            for i in 0..BALLAST_COPIES {
                let (dst, src) = if i % 2 == 0 { (pa, pb) } else { (pb, pa) };
                // SAFETY: both buffers hold BALLAST_BYTES.
                unsafe { cu::memcpy_dtod_async(dst, src, BALLAST_BYTES, stream.cu_stream()) }?;
            }
        }
        self.marks.clear();
        self.start = Some(stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
        Ok(())
    }

    /// Records the end of kernel `name` (only inside a profiled step).
    pub(crate) fn mark(&mut self, gpu: &Gpu, name: &str) -> Result<(), CudaError> {
        if self.start.is_none() {
            return Ok(());
        }
        let e = gpu
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        self.marks.push((name.to_string(), e));
        Ok(())
    }

    /// Waits for the step and adds its intervals to the totals.
    pub(crate) fn end(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        let Some(start) = self.start.take() else {
            return Ok(());
        };
        gpu.synchronize()?;
        let mut prev = &start;
        for (name, e) in &self.marks {
            let ms = f64::from(prev.elapsed_ms(e)?);
            let t = self.totals.entry(name.clone()).or_insert((0, 0.0));
            t.0 += 1;
            t.1 += ms;
            prev = e;
        }
        self.marks.clear();
        self.steps += 1;
        Ok(())
    }

    /// The table: kernels by GPU time per step, most first.
    pub(crate) fn table(&self) -> String {
        let steps = self.steps.max(1) as f64;
        let total: f64 = self.totals.values().map(|t| t.1).sum();
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut s = format!(
            "PROFILE: {} eager decode steps, GPU time {:.1} us/step in {:.0} launches/step\n\
             | kernel | launches/step | us/step | us/launch | share |\n|---|---:|---:|---:|---:|\n",
            self.steps,
            total * 1e3 / steps,
            self.totals.values().map(|t| t.0 as f64).sum::<f64>() / steps
        );
        for (name, (n, ms)) in rows {
            s += &format!(
                "| {name} | {:.1} | {:.1} | {:.2} | {:.1}% |\n",
                *n as f64 / steps,
                ms * 1e3 / steps,
                ms * 1e3 / (*n).max(1) as f64,
                100.0 * ms / total.max(f64::MIN_POSITIVE)
            );
        }
        s
    }

    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }
}
