//! CUDA graphs: a sequence of launches on the device's stream captured once and replayed
//! with one call (a stream launch costs ~1.6 us more than a graph node; a decode step has
//! hundreds of launches).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use crate::{CudaError, Gpu};

/// An instantiated graph, replayable on the stream it was captured from.
pub struct Graph {
    exec: CudaGraph,
}

// SAFETY: a graph exec is a driver handle; cudarc binds the context before each use and
// smelt replays a graph from one thread at a time (the owner holds it behind `&mut`).
unsafe impl Send for Graph {}

impl Graph {
    /// Replays the graph on the stream (asynchronous).
    pub fn launch(&self) -> Result<(), CudaError> {
        Ok(self.exec.launch()?)
    }
}

impl Gpu {
    /// Captures everything `body` queues on the stream into a graph. Nothing runs during
    /// capture; kernels read their inputs when the graph is replayed. On error the capture
    /// is ended and discarded.
    pub fn capture(
        &self,
        body: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<Graph, CudaError> {
        let stream = self.stream();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let r = body();
        let end = stream.end_capture(CUgraphInstantiate_flags(0));
        r?;
        let exec = end?.ok_or_else(|| CudaError::Init("captured an empty graph".into()))?;
        Ok(Graph { exec })
    }
}
