//! Small kernels of the runtime itself (not model math): filling buffers with a hash so
//! timings never run on zeros and nothing large crosses PCIe.

use smelt_ptx::{Kernel, Reg, Store, U32};

/// Name of [`fill_kernel`].
pub const FILL: &str = "smelt_fill_hash";

/// Fills `n` 32-bit words at `p` with a hash of their index and `seed`. Parameters: `p`,
/// `n`, `seed`; any grid (grid-stride loop).
pub fn fill_kernel(k: &Kernel) {
    fill_with(k, |_, h| h);
}

/// A fill kernel's body: word `i` of `p` (parameters `p`, `n`, `seed`; grid-stride loop) is
/// `word(k, h)` of the hash `h` of `i` and `seed` ([`fill_kernel`] stores the hash itself;
/// the GPU op harness makes finite bf16 pairs of it).
pub fn fill_with(k: &Kernel, word: impl Fn(&Kernel, Reg<U32>) -> Reg<U32>) {
    let p = k.param_ptr("p");
    let n = k.param_u32("n");
    let seed = k.param_u32("seed");
    k.stride_loop(k.global_id_x(), n, k.grid_size_x(), |k, i| {
        let h = k.mad(k.reg::<U32>(), i, 0x9E37_79B1u32, seed);
        let t = k.shr(k.reg(), h, 15u32);
        k.xor(h, h, t);
        k.mul(h, h, 0x2C1B_3C6Du32);
        let t = k.shr(k.reg(), h, 12u32);
        k.xor(h, h, t);
        let v = word(k, h);
        k.st(Store::GLOBAL, k.elem_addr(p, i, 4), v);
    });
}

/// The runtime's own module for `target`.
pub fn module(target: smelt_ptx::Target) -> Result<smelt_ptx::Module, smelt_ptx::PtxError> {
    let mut m = smelt_ptx::Module::new(target);
    m.kernel(FILL, fill_kernel)?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_module_builds_for_both_targets() {
        for t in [smelt_ptx::Target::Sm80, smelt_ptx::Target::Sm90] {
            let ptx = module(t).unwrap().to_ptx();
            assert!(ptx.contains(&format!(".entry {FILL}(")));
            assert!(ptx.contains("st.global"));
        }
    }
}
