//! Sizing the KV cache from a GPU's memory (vLLM's `gpu_memory_utilization`): a server should
//! hold as many tokens as the card can, not a guessed count, and should say how many.
//!
//! After the weights load and one step of the largest size the engine will run has run (so
//! its activations are allocated), the KV cache takes what is left of `fraction` of the
//! device's total memory, less a little slack for what is allocated later (decode graphs,
//! allocator rounding). Memory other processes use counts as used. The arithmetic lives here,
//! apart from the CUDA calls, so it is tested without a GPU.

use std::fmt;
use std::str::FromStr;

/// What `--gpu-memory` takes when not given on `smelt serve`.
pub const DEFAULT_GPU_MEMORY: f64 = 0.9;

/// Left free after the KV cache for what is allocated after it: decode-step graphs, the
/// allocator's rounding, the driver's own small allocations.
pub const SLACK_BYTES: usize = 256 << 20;

/// The fraction of a GPU's total memory smelt may take, in (0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuMemory(f64);

// Never NaN: `GpuMemory::new` refuses it.
impl Eq for GpuMemory {}

impl GpuMemory {
    pub fn new(fraction: f64) -> Result<GpuMemory, String> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(GpuMemory(fraction))
        } else {
            Err(format!(
                "{fraction} is not a fraction of the GPU's memory: give a number above 0 and at \
                 most 1 (0.9 is 90%)"
            ))
        }
    }

    pub fn fraction(self) -> f64 {
        self.0
    }
}

impl Default for GpuMemory {
    fn default() -> Self {
        GpuMemory(DEFAULT_GPU_MEMORY)
    }
}

impl FromStr for GpuMemory {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let f: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a number (a fraction such as 0.9)"))?;
        GpuMemory::new(f)
    }
}

impl fmt::Display for GpuMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Bytes of one KV block: keys and values of `block_size` tokens in every layer, f16.
pub fn block_bytes(n_layer: usize, block_size: usize, kv_dim: usize) -> usize {
    2 * n_layer * block_size * kv_dim * 2
}

/// KV blocks of `block_bytes` that fit in `fraction` of `total` bytes when `used` bytes are
/// already taken (weights, one step's activations, other processes) and [`SLACK_BYTES`] are
/// kept free.
pub fn kv_blocks(total: usize, used: usize, fraction: GpuMemory, block_bytes: usize) -> usize {
    let cap = (total as f64 * fraction.0) as usize;
    cap.saturating_sub(used).saturating_sub(SLACK_BYTES) / block_bytes.max(1)
}

/// Bytes in GiB, for messages.
pub fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Bytes for a log line: GiB from 1 GiB up, MiB below.
pub fn human(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", gib(bytes))
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    #[test]
    fn the_cache_takes_what_is_left_of_the_fraction() {
        // An 80 GiB card, 5 GiB of weights and activations in use, 90%: 72 - 5 GiB less the
        // slack, in blocks of 2 MiB (Llama-3-8B: 32 layers, 16 tokens, 1024 wide).
        let b = block_bytes(32, 16, 1024);
        assert_eq!(b, 2 << 20);
        let f = GpuMemory::new(0.9).unwrap();
        let n = kv_blocks(80 * GIB, 5 * GIB, f, b);
        assert_eq!(n, ((80 * GIB * 9 / 10) - 5 * GIB - SLACK_BYTES) / b);
        // 16 tokens a block: about 540k tokens.
        assert!((540_000..560_000).contains(&(n * 16)), "{}", n * 16);
    }

    #[test]
    fn nothing_left_is_zero_blocks_not_an_underflow() {
        let f = GpuMemory::new(0.5).unwrap();
        assert_eq!(kv_blocks(80 * GIB, 60 * GIB, f, 1 << 20), 0);
        assert_eq!(kv_blocks(0, 0, f, 0), 0);
    }

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(human(3 << 29), "1.50 GiB");
        assert_eq!(human(48 << 20), "48.0 MiB");
    }

    #[test]
    fn fractions_outside_zero_to_one_are_refused() {
        assert_eq!("0.9".parse::<GpuMemory>().unwrap().fraction(), 0.9);
        assert_eq!("1".parse::<GpuMemory>().unwrap().fraction(), 1.0);
        for bad in ["0", "-0.1", "1.5", "NaN", "ninety", "90%"] {
            let e = bad.parse::<GpuMemory>().unwrap_err();
            assert!(e.contains("fraction"), "{bad}: {e}");
        }
    }
}
