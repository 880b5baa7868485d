//! The device buffers the backend makes once, at first use, and keeps at one address for
//! as long as it lives: the split kernels' counters and words (zero between launches) and
//! the column lists of `gather_cols`. A captured decode graph holds their addresses, so
//! none of them is ever moved or freed. Apart so that what graphs hold reads in one place.

use std::sync::Mutex;

use smelt_cuda::cudarc::driver::CudaSlice;

use super::delta;

/// Device buffers allocated once and never moved (graphs hold their addresses), each made
/// by the op that first needs it.
pub(super) struct HeldBuffers {
    /// Column lists of `gather_cols` on the device ([`delta`]).
    pub(super) columns: Mutex<delta::ColumnCache>,
    /// The combining attention's counters: zero between launches (each launch leaves them
    /// so), allocated once and never moved (graphs hold the address).
    pub(super) attn_counters: Mutex<Option<CudaSlice<u32>>>,
    /// The fused MoE router's last-block counter (zero between launches).
    pub(super) moe_counter: Mutex<Option<CudaSlice<u32>>>,
    /// The split GEMMs' per-tile counters (`gemm::fixup::counter_slots`; zero between
    /// launches, allocated once and never moved: graphs hold the address).
    pub(super) gemm_counters: Mutex<Option<CudaSlice<u32>>>,
    /// The split argmax's per-row words and counters (zero between launches; graphs hold
    /// the address).
    pub(super) argmax_state: Mutex<Option<CudaSlice<u64>>>,
}
