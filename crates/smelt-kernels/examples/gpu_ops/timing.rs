//! Kernel timings the harness's perf mode shares: CUDA events around many launches on one
//! stream, the median of several repetitions, per launch.

use anyhow::{Context, Result};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::sync::Arc;

use cudarc::driver::CudaStream;

/// Median of `reps` timings (ms per launch) of `launches` stream launches each, after
/// `warmup` launches.
pub fn time_launches(
    stream: &Arc<CudaStream>,
    reps: usize,
    warmup: usize,
    launches: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    for i in 0..warmup {
        launch(i)?;
    }
    stream.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for i in 0..launches {
            launch(i)?;
        }
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        times.push(f64::from(start.elapsed_ms(&end)?) / launches as f64);
    }
    stream.synchronize()?;
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

/// Median of `reps` replays (ms per launch) of a CUDA graph of `launches` launches: what
/// the decode step pays, without the CPU's launch cost.
pub fn time_graph(
    stream: &Arc<CudaStream>,
    reps: usize,
    launches: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    for i in 0..launches {
        launch(i)?;
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))?
        .context("empty graph")?;
    graph.launch()?;
    stream.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graph.launch()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        times.push(f64::from(start.elapsed_ms(&end)?) / launches as f64);
    }
    stream.synchronize()?;
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}
