//! The benchmark's input: one tensor of standard normals from a fixed seed, written to a
//! raw file so the ggml side (Python) quantizes exactly the same floats.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// splitmix64: tiny, fast and fully specified here, so the data never changes with a
/// dependency's version (the file is the contract with the Python side anyway).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so the logarithm below is finite.
    fn next_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// `len` standard normal samples (Box-Muller), deterministic for a given `seed`.
pub fn normals(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(len + 1);
    while out.len() < len {
        let r = (-2.0 * rng.next_unit().ln()).sqrt();
        let theta = std::f64::consts::TAU * rng.next_unit();
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(len);
    out
}

/// Writes `values` as little-endian f32, the layout `numpy.fromfile(dtype="<f4")` reads.
pub fn write_f32(path: &Path, values: &[f32]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut buf = Vec::with_capacity(4 << 16);
    for chunk in values.chunks(1 << 16) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
        w.write_all(&buf)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_are_deterministic_and_look_normal() {
        let a = normals(100_001, 7);
        assert_eq!(a, normals(100_001, 7));
        assert_ne!(a, normals(100_001, 8));
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
        assert!(a.iter().all(|v| v.is_finite()));
    }
}
