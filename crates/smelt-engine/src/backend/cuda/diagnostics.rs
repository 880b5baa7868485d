//! The backend's measurement state: the per-kernel profile, the timeline of decode steps
//! and the digests of the logits and of the launches, each there only when its setting
//! ([`super::options`]'s `debug`) turns it on, and each printed when the backend is
//! dropped. Apart so that what only measures reads apart from what computes.

use std::sync::Mutex;

use super::{profile, timeline};

/// What the debugging and measurement settings keep while the backend runs (`None`: off).
pub(super) struct Diagnostics {
    /// GPU time per kernel of eager decode steps (`SMELT_CUDA_PROFILE=1`).
    pub(super) profile: Option<Mutex<profile::Profile>>,
    /// Block timestamps of decode steps as their graphs run (`SMELT_CUDA_TIMELINE=1`).
    pub(super) timeline: Option<Mutex<timeline::Timeline>>,
    /// `SMELT_CUDA_DIGEST=1`: an FNV-1a hash of the bits of everything copied to the host
    /// (logits) and the number of copies, printed when the backend is dropped, so runs
    /// under different launch settings can be shown to compute the same bits (a race
    /// between kernels would change them).
    pub(super) digest: Option<Mutex<(u64, u64)>>,
    /// With `digest`: an FNV-1a hash of every kernel launch's name and shape, in launch
    /// order, and their count (a graph's kernels count once, when captured), printed beside
    /// it: two builds that launch the same kernels in the same order print the same line.
    pub(super) launch_digest: Option<Mutex<(u64, u64)>>,
}
