//! CUDA-event timings: of stream launches, of graph replays, and of the device-to-device
//! copy that kernel bandwidths are reported against (measured in the same run, since
//! absolute numbers differ between cards and clocks).

use cudarc::driver::sys::CUevent_flags;

use crate::{CudaError, Gpu};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn elapsed_ms(gpu: &Gpu, run: impl FnOnce() -> Result<(), CudaError>) -> Result<f64, CudaError> {
    let s = gpu.stream();
    let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    run()?;
    let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    Ok(f64::from(start.elapsed_ms(&end)?))
}

/// Median over `reps` repetitions of the time per launch (ms) of `launches` stream launches
/// (`launch(i)` queues the i-th), after 10 warm-up launches.
pub fn time_launches(
    gpu: &Gpu,
    reps: usize,
    launches: usize,
    mut launch: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    for i in 0..10 {
        launch(i)?;
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let ms = elapsed_ms(gpu, || (0..launches).try_for_each(&mut launch))?;
        times.push(ms / launches.max(1) as f64);
    }
    gpu.synchronize()?;
    Ok(median(times))
}

/// Median over `reps` replays of the time per launch (ms) of a graph of `launches` launches.
pub fn time_graph(
    gpu: &Gpu,
    reps: usize,
    launches: usize,
    mut launch: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    gpu.synchronize()?;
    let graph = gpu.capture(|| (0..launches).try_for_each(&mut launch))?;
    graph.launch()?;
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        times.push(elapsed_ms(gpu, || graph.launch())? / launches.max(1) as f64);
    }
    gpu.synchronize()?;
    Ok(median(times))
}

/// Device-to-device copy bandwidth in GB/s (bytes read + written per second) over a buffer
/// of `bytes`: the yardstick of every bandwidth-bound kernel.
pub fn copy_bandwidth(gpu: &Gpu, bytes: usize) -> Result<f64, CudaError> {
    let src = gpu.random_bytes(bytes, 1)?;
    let mut dst = gpu.zeros::<u8>(src.len())?;
    let ms = time_launches(gpu, 7, 5, |_| {
        Ok(gpu.stream().memcpy_dtod(&src, &mut dst)?)
    })?;
    Ok(2.0 * src.len() as f64 / (ms * 1e-3) / 1e9)
}
