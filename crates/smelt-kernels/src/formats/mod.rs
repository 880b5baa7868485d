//! Weight formats as the GEMV kernels see them: one [`GpuFormat`] per ggml type.
//!
//! Every format is read in tiles of 256 weights by four threads, each taking 64 weights
//! (two 32-weight activation blocks) with 16-byte `ld.global.nc` loads. Where ggml's block
//! is a multiple of 16 bytes (Q4_K: 144) its bytes are used as they are; where it is not
//! (Q8_0: 34, Q6_K: 210), a row is repacked once at upload into one array per block field
//! (all quants, then all scales ...), which keeps every thread's loads aligned and moves
//! exactly ggml's bytes (plus at most 15 bytes of padding per row).

use smelt_ptx::{Addr, Kernel, L2Prefetch, Load, Reg, F32, U32, U64};

use crate::act::ActRegs;
use crate::{GgmlType, KernelError};

pub mod gpu_repack;
pub mod iq4;
pub mod legacy;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;

pub use iq4::{IQ4NL, IQ4XS};
pub use legacy::{Q4_0, Q4_1, Q5_0, Q5_1};
pub use q2_k::Q2K;
pub use q3_k::Q3K;
pub use q4_k::Q4K;
pub use q5_k::Q5K;
pub use q6_k::Q6K;
pub use q8_0::Q8_0;

/// A weight format the GEMV kernels read.
pub trait GpuFormat {
    /// The ggml type of the weights.
    const TYPE: GgmlType;
    /// Lower-case name used in kernel names (`q4_k`).
    const NAME: &'static str;
    /// Whether its one-token GEMV fits 64 registers (ptxas of CUDA 13.0, sm_90; not sm_80), so the
    /// 512-thread residual-norm GEMV can ask for two blocks per SM without spilling
    /// (`tests/ops_resources.rs` checks the fused GEMVs never spill).
    const COMPACT: bool = false;

    /// Per-thread values computed once before the loop over tiles.
    type Setup;
    /// A thread's raw loads of one tile.
    type Loaded;
    /// A thread's share of one tile, unpacked for the dot products (shared by all tokens).
    type Decoded;

    /// Bytes of one row of `k` weights in the GPU layout (a multiple of 16).
    fn row_bytes(k: usize) -> Result<usize, KernelError>;

    /// Writes one row of ggml blocks (`ggml`, `k` weights) into `out` in the GPU layout.
    fn repack_row(ggml: &[u8], k: usize, out: &mut [u8]);

    /// Per-thread setup; `part` is the thread's quarter of a tile (0..4), `ntiles` the
    /// number of tiles in a row.
    fn setup(k: &Kernel, part: Reg<U32>, ntiles: Reg<U32>) -> Self::Setup;

    /// The two activation blocks of a tile (0..8) that thread `part` dots with: its first
    /// eight quant words pair with the first block, the next eight with the second.
    fn act_blocks(k: &Kernel, part: Reg<U32>) -> (Reg<U32>, Reg<U32>);

    /// Issues the thread's loads of tile `tile` of the row at `row`, the 16-byte ones
    /// through [`ld_weights`] with `how`.
    fn load(
        k: &Kernel,
        setup: &Self::Setup,
        row: Reg<U64>,
        tile: Reg<U32>,
        how: WeightLoad,
    ) -> Self::Loaded;

    /// One word of each load instruction in `w` (a vector load completes as a whole), for
    /// the dependency that pins all loads before their first use.
    fn load_words(w: &Self::Loaded) -> Vec<Reg<U32>>;

    /// Unpacks the loads (masks, scales) once for all tokens.
    fn decode(k: &Kernel, setup: &Self::Setup, w: &Self::Loaded) -> Self::Decoded;

    /// `acc += this thread's weights . x`.
    fn dot(k: &Kernel, setup: &Self::Setup, w: &Self::Decoded, x: &ActRegs, acc: Reg<F32>);
}

/// How the 16-byte weight loads are issued: always `ld.global.nc` with the 256-byte L2
/// prefetch hint; optionally without allocating in L1, so that streaming weights (read
/// once) do not evict the activations every warp of the SM reads again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightLoad {
    /// `.L1::no_allocate`.
    pub no_l1: bool,
}

/// Loads four words of weights at `addr` as `how` says.
pub fn ld_weights(k: &Kernel, how: WeightLoad, d: [Reg<U32>; 4], addr: impl Into<Addr>) {
    if how.no_l1 {
        // smelt-ptx has no eviction-priority qualifier yet.
        let addr = addr.into();
        k.raw(format!(
            "ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {{{}, {}, {}, {}}}, {addr}",
            d[0], d[1], d[2], d[3]
        ));
    } else {
        k.ld_v4(Load::GLOBAL_NC.prefetch(L2Prefetch::B256), d, addr);
    }
}

/// Checks a row of ggml bytes against its expected size.
pub(crate) fn check_ggml_row(ty: GgmlType, ggml: &[u8], k: usize) -> Result<(), KernelError> {
    let want = k / ty.block_size() * ty.type_size();
    if ggml.len() != want || k % ty.block_size() != 0 {
        return Err(KernelError::BadLength {
            what: "ggml weight row",
            got: ggml.len(),
            want,
        });
    }
    Ok(())
}

/// Repacks `rows` rows of ggml bytes into the GPU layout of `F`.
pub fn repack<F: GpuFormat>(ggml: &[u8], rows: usize, k: usize) -> Result<Vec<u8>, KernelError> {
    let row_bytes = F::row_bytes(k)?;
    let ggml_row = k / F::TYPE.block_size() * F::TYPE.type_size();
    if ggml.len() != rows * ggml_row {
        return Err(KernelError::BadLength {
            what: "ggml weights",
            got: ggml.len(),
            want: rows * ggml_row,
        });
    }
    let mut out = vec![0u8; rows * row_bytes];
    for (src, dst) in ggml
        .chunks_exact(ggml_row.max(1))
        .zip(out.chunks_exact_mut(row_bytes.max(1)))
    {
        check_ggml_row(F::TYPE, src, k)?;
        F::repack_row(src, k, dst);
    }
    Ok(out)
}

/// Unpacks a `b32` word into its two f16 halves and converts them (low half first).
pub(crate) fn halves_to_f32(k: &Kernel, word: Reg<U32>) -> [Reg<F32>; 2] {
    let (lo, hi) = (k.reg::<smelt_ptx::F16>(), k.reg::<smelt_ptx::F16>());
    k.raw(format!("mov.b32 {{{lo}, {hi}}}, {word}"));
    [lo, hi].map(|h| k.cvt(k.reg::<F32>(), h, smelt_ptx::Exact))
}

/// `round_up(n, 16)`.
pub(crate) fn pad16(n: usize) -> usize {
    n.div_ceil(16) * 16
}
