//! Tensor parallelism: one model split over several devices (or simulated ranks), each
//! holding a slice of every layer, the slices' partial sums all-reduced after each
//! row-parallel matmul ([`plan`] says which tensor goes where, [`shard`] cuts a rank's
//! file, [`cpu`] runs the ranks as threads on the CPU as the reference of the GPU runner).

pub mod cpu;
pub mod plan;
pub mod runner;
pub mod shard;

pub use cpu::{CpuTp, SimComm};
pub use plan::{Placement, RankShape, ShardPlan, Slice, TpOptions};
pub use runner::{tp_devices, TpRunner};
pub use shard::rank_gguf;
