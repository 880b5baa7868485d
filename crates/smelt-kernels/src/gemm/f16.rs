//! The GEMM on f16 tensor cores: weights dequantized to f16 once per block in shared
//! memory, activations converted to f16 once per step, `mma.sync.m16n8k16` f16 x f16 with
//! f32 accumulation. The int8 GEMM ([`super`]) spends ~45 instructions per eight `mma`s
//! on fragments, group scales and minima (bench/gpu/NOTES.md, "The GEMM is issue-bound");
//! here the scales and minima are applied while staging, shared by the block's 64
//! tokens, and a 16-weight step of a warp is three `ldmatrix` and four `mma`s. f16 has
//! half the int8 rate, of which the int8 kernel used under a fifth.
//!
//! A block of [`THREADS`] threads owns [`BM`] rows x [`BN`] tokens, twice the int8 GEMM's
//! both ways, and each of its eight warps 64 rows x 32 tokens (4 x 4 `mma` tiles): a
//! 16-weight step of a warp is six `ldmatrix` for sixteen `mma`s, 192 bytes of shared
//! memory read per `mma` where the int8 GEMM's 32 x 16 warps read 384. That is what bound
//! both kernels at 64 x 64 (bench/RESULTS.md, 2026-11-26 evening: an f16 kernel of the
//! int8 one's geometry ran at its speed, single- or double-buffered, ~6 cycles an `mma`
//! against ~3 of shared-memory reads). Same arguments ([`super::GemmArgs`], with `x` the
//! f16 rows of [`act_kernel`]), same split-K and reduce ([`super::Args`], launched with
//! [`launch`]). K advances [`KT`] weights a step; each thread loads its share of the
//! next step's weights into registers while the block multiplies this one.
//!
//! **The K permutation.** A nibble mask of one 32-bit word of quants (`lop3`) gives two
//! halves `1024 + q` for weights `b` and `b + 2` of four, so the staged weights of every
//! four are in the order `0, 2, 1, 3`; the activation rows are written in the same order
//! ([`act_kernel`]), and a dot product does not care which order both operands share.
//!
//! **Precision.** Each weight is one f16 rounding of `q * A + B`, with the group's `A = d *
//! sc` and `B = -dmin * m` each rounded to f16 once: a relative error of 2^-11, against
//! the int8 path's ~1/254 per activation. Activations are one f16 rounding each.
//!
//! CPU twin: [`cpu_with_magnitude`] (the same f16 weights and activations, f64 sums).

use half::f16;
use smelt_ptx::{CpAsyncCache, FloatRound, Kernel, Load, MmaFloat, Pred, Reg, Store, B32, F32};
use smelt_ptx::{U32, U64};

use super::{split_range, GemmRegs, Out, Rows, THREADS};
use crate::act::and_or;
use crate::formats::{halves_to_f32, GpuFormat, Q4K, Q6K, Q8_0};
use crate::ops::{kernel_params, Launch};
use crate::{GgmlType, KernelError, TILE};

/// Rows of W per block.
pub const BM: u32 = 128;
/// Tokens per block.
pub const BN: u32 = 128;
/// Weights of K staged per step: a quarter of a 256-weight tile.
pub const KT: u32 = 64;
/// Steps a 256-weight tile.
const STEPS: u32 = TILE as u32 / KT;
/// Bytes of one row (or token) of [`KT`] halves in shared memory: 16 more, so the eight
/// rows an `ldmatrix` reads fall in different banks.
const STRIDE: u32 = KT * 2 + 16;
/// `mma` tiles of a prompt block's warp: 4 of 16 rows, 4 of 8 tokens.
const MI: usize = 4;
const NI: usize = 4;

/// A block's rows x tokens. Its eight warps each take `16 MI` rows x `8 NI` tokens, `MI`
/// and `NI` being [`multiply`]'s const parameters; the rows are a multiple of 128 (the
/// staging covers 128 rows a pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub rows: u32,
    pub tokens: u32,
    /// Steps of weights a thread has in flight (1 or 2 register sets) while the block
    /// multiplies the current one.
    pub ahead: u32,
}

/// Prompts: [`BM`] x [`BN`], warps of 64 x 32, one step ahead.
pub const PROMPT: Shape = Shape {
    rows: BM,
    tokens: BN,
    ahead: 1,
};

impl Shape {
    /// Static shared memory of a block of this shape.
    pub const fn shared_bytes(self) -> usize {
        ((self.rows + self.tokens) * STRIDE) as usize
    }
}
/// Static shared memory of a block: the step's weights and tokens as halves.
pub const SHARED_BYTES: usize = ((BM + BN) * STRIDE) as usize;
const _: () = assert!(SHARED_BYTES <= 48 * 1024);

/// Whether a matmul of `nrows` rows and `ntok` tokens runs faster on the f16 GEMM than on
/// the int8 one, as measured on an H100 (`gpu_ops perf -o gemm_f16`, bench/RESULTS.md
/// 2026-11-26 17:40 UTC; Q4_K, Llama-3-8B shapes): at 512+ tokens every shape (0.58-0.83 of
/// the int8 GEMM's time), at 128 the matrices of 4096+ rows (0.64-0.82) but not 1024 rows
/// (1.63: eight row blocks cannot fill the GPU), under 128 none (0.87-1.59: a block's 128
/// tokens are mostly padding).
pub fn preferred(nrows: usize, ntok: usize) -> bool {
    ntok >= 256 || (ntok >= 128 && nrows >= 4096)
}

/// Splits of the K range for the f16 GEMM: [`super::splits`] for its larger blocks.
pub fn splits(nrows: usize, ntiles: usize, ntok: Option<usize>, sm_count: usize) -> usize {
    splits_for(PROMPT, nrows, ntiles, ntok, sm_count)
}

/// [`splits`] for blocks of `shape`.
pub fn splits_for(
    shape: Shape,
    nrows: usize,
    ntiles: usize,
    ntok: Option<usize>,
    sm_count: usize,
) -> usize {
    super::splits_for_blocks((shape.rows, shape.tokens), nrows, ntiles, ntok, sm_count)
}

/// The launch of an f16 GEMM for `a` (grid of [`BM`] x [`BN`] blocks, `a`'s splits).
pub fn launch(a: &super::Args) -> Launch {
    launch_for(PROMPT, a)
}

/// [`launch`] for blocks of `shape`.
pub fn launch_for(shape: Shape, a: &super::Args) -> Launch {
    Launch::new(
        (
            a.ntok.div_ceil(shape.tokens).max(1),
            a.nrows.div_ceil(shape.rows).max(1),
            a.split_count(),
        ),
        (THREADS, 1, 1),
    )
}

/// The f16 GEMM's kernel name for `ty`, if it has one.
pub fn name(ty: GgmlType) -> Option<&'static str> {
    TYPES.iter().find(|(t, _)| *t == ty).map(|(_, n)| *n)
}

/// Formats with an f16 GEMM, and their kernels.
pub const TYPES: [(GgmlType, &str); 3] = [
    (GgmlType::Q4_K, Q4K::GEMM_F16_NAME),
    (GgmlType::Q6_K, Q6K::GEMM_F16_NAME),
    (GgmlType::Q8_0, Q8_0::GEMM_F16_NAME),
];

// Every format of [`TYPES`] was checked against its twin and measured faster than the
// int8 GEMM on prompts: Q4_K (bench/RESULTS.md 2026-11-26), Q6_K and Q8_0
// (`bench/gpu/prompt_f16.sh`, 2026-11-28: Q8_0 pp512 +24%, Q4_K_M's +1%). A new format
// joins TYPES only after such a run.

/// The f16 GEMMs and the activation conversion, for the catalog.
pub fn catalog() -> Vec<crate::catalog::Entry> {
    vec![
        (ACT.to_string(), Box::new(act_kernel)),
        (Q4K::GEMM_F16_NAME.to_string(), Box::new(kernel::<Q4K>)),
        (Q6K::GEMM_F16_NAME.to_string(), Box::new(kernel::<Q6K>)),
        (Q8_0::GEMM_F16_NAME.to_string(), Box::new(kernel::<Q8_0>)),
    ]
}

/// Name of the activation conversion kernel.
pub const ACT: &str = "gemm_f16_act";
/// Threads per block of [`act_kernel`].
pub const ACT_THREADS: u32 = 256;

kernel_params! {
    /// Arguments of [`act_kernel`]: `n` rows of `k` floats `x` into f16 rows `h` of
    /// `ntiles * 256` halves ([`act_row_bytes`]).
    ActArgs, ActRegs {
        x: Ptr,
        h: Ptr,
        k: U32,
        ntiles: U32,
    }
}

/// Bytes of one token's f16 row of `k` values (whole 256-value tiles, zero past `k`).
pub fn act_row_bytes(k: usize) -> usize {
    k.div_ceil(TILE) * TILE * 2
}

/// The launch of [`act_kernel`] for `n` rows of `k` values: a thread per four values.
pub fn act_launch(k: usize, n: usize) -> Launch {
    let quads = (k.div_ceil(TILE) * TILE / 4) as u32;
    Launch::new(
        (quads.div_ceil(ACT_THREADS).max(1), n as u32, 1),
        (ACT_THREADS, 1, 1),
    )
}

/// Converts activations to the f16 rows the GEMM reads: values `4i, 4i + 2, 4i + 1,
/// 4i + 3` at halves `4i..4i + 4` (the module's K permutation), each rounded to nearest,
/// zero past `k`. Parameters [`ActArgs`]; launch [`act_launch`].
pub fn act_kernel(k: &Kernel) {
    let ActRegs {
        x,
        h,
        k: len,
        ntiles,
    } = ActRegs::declare(k);
    let i = k.global_id_x();
    let row = k.ctaid_y();
    let quads = k.shl(k.reg(), ntiles, 6u32);
    k.grid_dep_wait();
    k.exit_if(k.ge(i, quads));
    let col0 = k.shl(k.reg(), i, 2u32);
    let rowbase = k.mul(k.reg(), row, len);
    let v: [Reg<F32>; 4] = std::array::from_fn(|_| k.f32(0.0));
    for (j, &vj) in v.iter().enumerate() {
        let col = k.add(k.reg(), col0, j as u32);
        let at = k.elem_addr(x, k.add(k.reg(), rowbase, col), 4);
        k.guarded(k.lt(col, len), |k| {
            k.ld(Load::GLOBAL_NC, vj, at);
        });
    }
    let lo = k.cvt_f16x2(k.reg(), v[2], v[0]);
    let hi = k.cvt_f16x2(k.reg(), v[3], v[1]);
    let at = k.elem_addr(h, k.mad(k.reg(), row, quads, i), 8);
    k.st_v2(Store::GLOBAL, at, [lo, hi]);
}

/// CPU twin of [`act_kernel`]: the f16 bits of each row of `k` values of `x`.
pub fn act_cpu(x: &[f32], k: usize) -> Result<Vec<u16>, KernelError> {
    if k == 0 || x.len() % k != 0 {
        return Err(KernelError::BadLength {
            what: "f16 GEMM activations",
            got: x.len(),
            want: k,
        });
    }
    let width = act_row_bytes(k) / 2;
    let mut out = vec![0u16; x.len() / k * width];
    for (row, dst) in x.chunks(k).zip(out.chunks_mut(width)) {
        let at = |c: usize| row.get(c).copied().unwrap_or(0.0);
        for (q, d) in dst.chunks_mut(4).enumerate() {
            for (slot, c) in [0, 2, 1, 3].into_iter().enumerate() {
                d[slot] = f16::from_f32(at(4 * q + c)).to_bits();
            }
        }
    }
    Ok(out)
}

/// What a format's staging works with: the block's rows and where their halves go.
#[derive(Clone, Copy)]
pub struct Stage {
    /// Thread index in the block (0..[`THREADS`]).
    pub tid: Reg<U32>,
    /// Shared address of row 0's halves (rows [`STRIDE`] bytes apart, the step's weight
    /// `i` of a row at byte `2 i`, permuted as the module doc says).
    pub aq: Reg<U32>,
    rows: Rows,
}

impl Stage {
    /// Global address of the block's row `local` (clamped to the last row: rows past the
    /// end are read again and never stored).
    pub fn row(&self, k: &Kernel, local: Reg<U32>) -> Reg<U64> {
        self.rows.row(k, local)
    }

    /// Bytes of one row of the weights.
    pub fn row_bytes(&self) -> Reg<U32> {
        self.rows.row_bytes
    }

    /// Shared address of row `local`'s halves.
    pub fn aq_row(&self, k: &Kernel, local: Reg<U32>) -> Reg<U32> {
        k.mad(k.reg(), local, STRIDE, self.aq)
    }
}

/// A weight format the f16 GEMM reads: how a thread loads its share of one [`KT`]-weight
/// step into registers (issued a step ahead) and dequantizes it into shared memory.
pub trait GemmF16Format: GpuFormat {
    /// The kernel's name.
    const GEMM_F16_NAME: &'static str;
    /// The grouped (mixture-of-experts) kernel's name ([`super::grouped`]).
    const GROUPED_NAME: &'static str;
    /// Blocks an SM its kernels (this module's and the grouped one) ask ptxas to fit on
    /// sm_90: [`BLOCKS_PER_SM`] (128 registers a thread), or 1 for a format whose step
    /// registers spill there.
    const BLOCKS_PER_SM: u32 = BLOCKS_PER_SM;
    /// A thread's constants, computed once.
    type StageSetup;
    /// A thread's raw loads of one step.
    type StepRegs;
    /// The thread's constants.
    fn stage_setup(k: &Kernel, s: &Stage) -> Self::StageSetup;
    /// Registers for [`GemmF16Format::load_step`].
    fn step_regs(k: &Kernel) -> Self::StepRegs;
    /// Loads the thread's share of step `q` (weights `KT q..KT (q + 1)`) of tile `tile`.
    fn load_step(k: &Kernel, c: &Self::StageSetup, regs: &Self::StepRegs, tile: Reg<U32>, q: u32);
    /// Dequantizes the loaded step `q` into shared memory ([`Stage::aq`]; all [`THREADS`]
    /// threads take part).
    fn stage_step(k: &Kernel, c: &Self::StageSetup, regs: &Self::StepRegs, q: u32);
    /// CPU twin: the f16 bits of one row's weights, in their natural order, exactly as
    /// [`GemmF16Format::stage_step`] makes them from the row's ggml bytes.
    fn dequantize_row(ggml: &[u8], k: usize) -> Result<Vec<u16>, KernelError>;
}

/// Unpacks the two nibbles at bits `shift` and `shift + 16` of `w` (shift 0, 4, 8 or 12)
/// into two halves `1024 + q` (`lop3` with the exponent of 1024, `magic`).
pub(super) fn nibble_pair(k: &Kernel, w: Reg<U32>, shift: u32, magic: Reg<B32>) -> Reg<B32> {
    let src = if shift == 0 {
        w
    } else {
        k.shr(k.reg(), w, shift)
    };
    k.lop3(k.reg::<B32>(), src, 0x000F_000Fu32, magic, and_or())
}

/// `q * a + b` of two halves `1024 + q`: the exact subtraction, then one rounding.
/// (Half arithmetic takes `.b32` registers only.)
pub(super) fn dequant_pair(
    k: &Kernel,
    v: Reg<B32>,
    magic: Reg<B32>,
    a: Reg<B32>,
    b: Reg<B32>,
) -> Reg<B32> {
    let q = k.sub_f16x2(k.reg(), v, magic);
    k.fma_f16x2(q, q, a, b)
}

/// Per-thread constants of the Q4_K staging: thread `tid` takes row `tid / 2`, and in
/// step `q` quant bytes `16 + 32 q + 16 (tid % 2)..+16` of each tile: weights
/// `16 (tid % 2)..+16` of group `2q` (low nibbles) and of group `2q + 1` (high).
pub struct Q4KSetup {
    /// The thread's row's first byte.
    row: Reg<U64>,
    /// Offset of its step-0 quants in a super-block.
    qoff: Reg<U64>,
    /// Shared address of its low-nibble halves (the high ones 64 bytes on).
    dst: Reg<U32>,
}

impl GemmF16Format for Q4K {
    const GEMM_F16_NAME: &'static str = "gemm_f16_q4_k";
    const GROUPED_NAME: &'static str = "gemm_f16_moe_q4_k";
    type StageSetup = Q4KSetup;
    /// The 16-byte header (d, dmin, twelve scale bytes), then the step's 16 quant bytes.
    type StepRegs = [Reg<U32>; 8];

    fn stage_setup(k: &Kernel, s: &Stage) -> Q4KSetup {
        let r = k.shr(k.reg(), s.tid, 1u32);
        let c2 = k.and(k.reg(), s.tid, 1u32);
        let qoff = k.mul_wide(k.reg::<U64>(), c2, 16u32);
        k.add(qoff, qoff, 16u64);
        let dst = s.aq_row(k, r);
        k.mad(dst, c2, 32u32, dst);
        Q4KSetup {
            row: s.row(k, r),
            qoff,
            dst,
        }
    }

    fn step_regs(k: &Kernel) -> [Reg<U32>; 8] {
        k.regs::<U32, 8>()
    }

    fn load_step(k: &Kernel, c: &Q4KSetup, regs: &[Reg<U32>; 8], tile: Reg<U32>, q: u32) {
        let block = k.add(k.reg(), c.row, k.mul_wide(k.reg::<U64>(), tile, 144u32));
        k.ld_v4(Load::GLOBAL_NC, [regs[0], regs[1], regs[2], regs[3]], block);
        let at = k.add(k.reg(), block, c.qoff);
        k.ld_v4(
            Load::GLOBAL_NC,
            [regs[4], regs[5], regs[6], regs[7]],
            at.at(32 * i64::from(q)),
        );
    }

    fn stage_step(k: &Kernel, c: &Q4KSetup, regs: &[Reg<U32>; 8], q: u32) {
        let [hd, h1, h2, h3] = [regs[0], regs[1], regs[2], regs[3]];
        let [d, dmin] = halves_to_f32(k, hd);
        let neg_dmin = k.neg(k.reg(), dmin);
        // Groups 2q and 2q + 1: scale and minimum as ggml's get_scale_min_k4 decodes them
        // (groups 0..4 plain 6-bit in bytes 0..8, 4..8 split over bytes 8..12 and the top
        // bits of bytes 0..8).
        let coef: Vec<(Reg<B32>, Reg<B32>)> = (0..2u32)
            .map(|gi| {
                let g = 2 * q + gi;
                let bit = 8 * (g % 4);
                let (sc, m) = if g < 4 {
                    (
                        k.bfe(k.reg::<U32>(), h1, bit, 6u32),
                        k.bfe(k.reg::<U32>(), h2, bit, 6u32),
                    )
                } else {
                    let top = |w: Reg<U32>| {
                        let t = k.bfe(k.reg::<U32>(), w, bit + 6, 2u32);
                        k.shl(t, t, 4u32)
                    };
                    let sc = k.bfe(k.reg::<U32>(), h3, bit, 4u32);
                    k.or(sc, sc, top(h1));
                    let m = k.bfe(k.reg::<U32>(), h3, bit + 4, 4u32);
                    k.or(m, m, top(h2));
                    (sc, m)
                };
                let a = k.mul(k.reg(), d, k.cvt(k.reg::<F32>(), sc, FloatRound::Rn));
                let b = k.mul(k.reg(), neg_dmin, k.cvt(k.reg::<F32>(), m, FloatRound::Rn));
                (k.cvt_f16x2(k.reg(), a, a), k.cvt_f16x2(k.reg(), b, b))
            })
            .collect();
        let magic = k.mov(k.reg::<B32>(), 0x6400_6400u32);
        // Word i holds weights 4i..4i+4 of the thread's 16 in both groups: low nibbles
        // (group 2q) and high (2q + 1), each as halves (b, b + 2) and (b + 1, b + 3).
        for (gi, shifts) in [(0usize, [0u32, 8]), (1, [4, 12])] {
            let (a, b) = coef[gi];
            let w: Vec<Reg<B32>> = regs[4..8]
                .iter()
                .flat_map(|&w| {
                    shifts.map(|sh| dequant_pair(k, nibble_pair(k, w, sh, magic), magic, a, b))
                })
                .collect();
            let at = 64 * gi as i64;
            k.st_v4(Store::SHARED, c.dst.at(at), [w[0], w[1], w[2], w[3]]);
            k.st_v4(Store::SHARED, c.dst.at(at + 16), [w[4], w[5], w[6], w[7]]);
        }
    }

    fn dequantize_row(ggml: &[u8], k: usize) -> Result<Vec<u16>, KernelError> {
        if k % TILE != 0 || ggml.len() != k / TILE * 144 {
            return Err(KernelError::BadLength {
                what: "Q4_K row",
                got: ggml.len(),
                want: k / TILE * 144,
            });
        }
        let mut out = Vec::with_capacity(k);
        for b in ggml.chunks(144) {
            let half_at = |i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]]));
            let (d, dmin) = (half_at(0).to_f32(), half_at(2).to_f32());
            let q = &b[4..16];
            let scale_min = |g: usize| -> (u8, u8) {
                if g < 4 {
                    (q[g] & 63, q[g + 4] & 63)
                } else {
                    (
                        (q[g + 4] & 0xF) | ((q[g - 4] >> 6) << 4),
                        (q[g + 4] >> 4) | ((q[g] >> 6) << 4),
                    )
                }
            };
            for g in 0..8 {
                let (sc, m) = scale_min(g);
                let a = f16::from_f32(d * f32::from(sc)).to_f64();
                let bias = f16::from_f32(-dmin * f32::from(m)).to_f64();
                for l in 0..32 {
                    let byte = b[16 + 32 * (g / 2) + l];
                    let nib = if g % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    out.push(f16::from_f64(f64::from(nib) * a + bias).to_bits());
                }
            }
        }
        Ok(out)
    }
}

/// `y = W x` on f16 tensor cores for a format with an f16 staging: see the module doc.
/// Parameters [`super::GemmArgs`] (`x`: [`act_kernel`]'s rows); launch [`launch`].
pub fn kernel<F: GemmF16Format>(k: &Kernel) {
    kernel_blocks::<F>(k, F::BLOCKS_PER_SM)
}

/// Blocks an SM the catalog's f16 GEMMs ask ptxas to fit on sm_90 (a register cap: 128 a
/// thread for two); `gpu_ops perf -o gemm_f16` times one and two.
pub const BLOCKS_PER_SM: u32 = 2;

/// [`kernel`] built for `blocks` blocks an SM on sm_90.
pub fn kernel_blocks<F: GemmF16Format>(k: &Kernel, blocks: u32) {
    kernel_shaped::<F, MI, NI>(k, blocks, PROMPT)
}

/// The f16 GEMM in blocks of `shape` (warps of `16 MI` x `8 NI`), `blocks` an SM on sm_90.
pub fn kernel_shaped<F: GemmF16Format, const MI: usize, const NI: usize>(
    k: &Kernel,
    blocks: u32,
    shape: Shape,
) {
    attributes(k, blocks);
    let GemmRegs {
        w,
        x,
        y,
        nrows,
        ntok,
        ntiles,
        row_bytes,
        kslice,
    } = GemmRegs::declare(k);
    let smem = Smem::declare(k, shape);
    let tid = k.tid_x();
    let tok0 = k.mul(k.reg(), k.ctaid_x(), shape.tokens);
    let row0 = k.mul(k.reg(), k.ctaid_y(), shape.rows);
    let last_row = k.sub(k.reg(), nrows, 1u32);
    let last_tok = k.sub(k.reg(), ntok, 1u32);
    let tok_stride = k.mul(k.reg(), ntiles, (TILE * 2) as u32);
    // This block's split: tiles [first, end); its outputs go to split z of the workspace.
    let (first, end, y) = split_range(k, y, nrows, ntok, ntiles, kslice);
    let rows = Rows {
        w,
        row0,
        last_row,
        row_bytes,
    };
    // Tokens past the end are not copied; their outputs are never stored.
    let token = |k: &Kernel, local: Reg<U32>| {
        let t = k.add(k.reg(), tok0, local);
        let valid = k.lt(t, ntok);
        k.min(t, t, last_tok);
        (t, valid)
    };
    let tokens = Tokens {
        x,
        stride: tok_stride,
        hold: true,
    };
    let p = multiply::<F, MI, NI>(
        k,
        &smem,
        shape,
        tid,
        rows,
        (tokens, token),
        (first, end),
        true,
    );
    super::fixup::store_split_outputs(
        k,
        &p.acc,
        Out {
            y,
            row: k.add(k.reg(), row0, p.arow),
            tok: k.add(k.reg(), tok0, p.ctok),
            nrows,
            ntok,
            slots: None,
        },
    );
}

/// The launch bounds of an f16 GEMM built for `blocks` blocks an SM on sm_90 (both
/// kernels).
pub(super) fn attributes(k: &Kernel, blocks: u32) {
    attributes_for(k, THREADS, blocks);
}

/// The launch bounds of a GEMM of `threads` threads a block built for `blocks` blocks an
/// SM on sm_90.
pub(super) fn attributes_for(k: &Kernel, threads: u32, blocks: u32) {
    k.max_threads(threads, 1, 1);
    if matches!(
        k.target(),
        smelt_ptx::Target::Sm90 | smelt_ptx::Target::Sm90a
    ) {
        k.min_blocks_per_sm(blocks);
    }
}

/// A block's shared memory: the step's weights and tokens as halves.
pub(super) struct Smem {
    aq: Reg<U32>,
    bq: Reg<U32>,
}

impl Smem {
    /// Declares it for blocks of `shape` (once a kernel).
    pub(super) fn declare(k: &Kernel, shape: Shape) -> Smem {
        let aq_s = k.shared::<U32>("gemmh_a", shape.rows * STRIDE / 4, 16);
        let bq_s = k.shared::<U32>("gemmh_b", shape.tokens * STRIDE / 4, 16);
        Smem {
            aq: k.shared_base(&aq_s),
            bq: k.shared_base(&bq_s),
        }
    }
}

/// A block's products: each thread's accumulators, and its first row (`arow`) and token
/// (`ctok`) in the block, as [`super::store_outputs`] takes them.
pub(super) struct Products<const MI: usize, const NI: usize> {
    pub acc: [[[Reg<F32>; 4]; NI]; MI],
    pub arow: Reg<U32>,
    pub ctok: Reg<U32>,
}

/// Where a block's tokens' f16 rows are: row `r` at `x + r * stride`. With `hold`, each
/// copy's address is computed once and kept through the loop (two registers a copy); else
/// only its row index is kept and the address made again each step (the grouped GEMM,
/// one register short at 128 a thread).
pub(super) struct Tokens {
    pub x: Reg<U64>,
    pub stride: Reg<U32>,
    pub hold: bool,
}

/// The body both f16 GEMMs share: the `shape.rows` rows of `rows` times the block's
/// `shape.tokens` tokens over the K tiles `[first, end)`, each warp `16 MI` x `8 NI`. `token(k, local)` gives the row (in `tokens`) of
/// the block's token `local` and whether it is a real token (the others are not copied,
/// and their outputs must not be stored). With `wait`, the programmatic launch wait comes
/// just before the first weight load (a kernel that read its predecessor's output earlier
/// has waited already).
#[allow(clippy::too_many_arguments)]
pub(super) fn multiply<F: GemmF16Format, const MI: usize, const NI: usize>(
    k: &Kernel,
    smem: &Smem,
    shape: Shape,
    tid: Reg<U32>,
    rows: Rows,
    (tokens, token): (Tokens, impl Fn(&Kernel, Reg<U32>) -> (Reg<U32>, Reg<Pred>)),
    (first, end): (Reg<U32>, Reg<U32>),
    wait: bool,
) -> Products<MI, NI> {
    let Smem { aq, bq } = *smem;
    let (wrows, wtoks) = (16 * MI as u32, 8 * NI as u32);
    let row_warps = shape.rows / wrows;
    assert!(
        row_warps.is_power_of_two()
            && row_warps * (shape.tokens / wtoks) == THREADS / 32
            && shape.rows % 128 == 0
            && shape.tokens % 32 == 0
            && (shape.ahead == 1 || shape.ahead == 2),
        "f16 GEMM shape {shape:?} with warps of {wrows} x {wtoks}"
    );
    // Token halves: thread copies 16-byte chunk `tid % 8` of a step's 128 bytes of tokens
    // `tid / 8 + 32 i`.
    let bch = k.and(k.reg(), tid, 7u32);
    let bt0 = k.shr(k.reg(), tid, 3u32);
    let address = |k: &Kernel, r: Reg<U32>| {
        let src = k.add(
            k.reg(),
            tokens.x,
            k.mul_wide(k.reg::<U64>(), r, tokens.stride),
        );
        k.add(src, src, k.mul_wide(k.reg::<U64>(), bch, 16u32))
    };
    // Each copy's address (held) or token row (made again each step), and validity.
    type Held = Result<Reg<U64>, Reg<U32>>;
    let copies: Vec<(Held, Reg<Pred>)> = (0..shape.tokens / 32)
        .map(|i| {
            let local = k.add(k.reg(), bt0, 32 * i);
            let (r, valid) = token(k, local);
            let held = if tokens.hold {
                Ok(address(k, r))
            } else {
                Err(r)
            };
            (held, valid)
        })
        .collect();
    let bdst = k.mad(k.reg(), bt0, STRIDE, bq);
    k.mad(bdst, bch, 16u32, bdst);

    // Warp (wm, wn) computes rows `wrows wm..` and tokens `wtoks wn..`; lane (g, t). `ldmatrix`:
    // lane 8 m + r gives row r of matrix m; an m-tile's four are (rows 0-7, k 0-7),
    // (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); a pair of n-tiles' (tokens 0-7, k 0-7),
    // (0-7, 8-15), then tokens 8-15.
    let warp = k.shr(k.reg(), tid, 5u32);
    let lane = k.and(k.reg(), tid, 31u32);
    let t = k.and(k.reg(), lane, 3u32);
    let wm = k.and(k.reg(), warp, row_warps - 1);
    let wn = k.shr(k.reg(), warp, row_warps.trailing_zeros());
    let arow = k.mad(k.reg(), wm, wrows, k.shr(k.reg(), lane, 2u32));
    let ctok = k.mad(k.reg(), wn, wtoks, k.shl(k.reg(), t, 1u32));
    let r = k.and(k.reg(), lane, 7u32);
    let lo = k.bfe(k.reg(), lane, 3u32, 1u32);
    let hi = k.shr(k.reg(), lane, 4u32);
    let a_lm = {
        let row = k.mad(k.reg(), wm, wrows, r);
        k.mad(row, lo, 8u32, row);
        let a = k.mad(k.reg(), row, STRIDE, aq);
        k.mad(a, hi, 16u32, a)
    };
    let b_lm = {
        let tok = k.mad(k.reg(), wn, wtoks, r);
        k.mad(tok, hi, 8u32, tok);
        let b = k.mad(k.reg(), tok, STRIDE, bq);
        k.mad(b, lo, 16u32, b)
    };

    // The staging covers 128 rows a pass: pass p stages rows 128 p.. with its own registers,
    // `shape.ahead` sets of them (step q in set q % ahead).
    let passes: Vec<(F::StageSetup, Vec<F::StepRegs>)> = (0..shape.rows / 128)
        .map(|p| {
            let stage = if p == 0 {
                Stage { tid, aq, rows }
            } else {
                Stage {
                    tid,
                    aq: k.add(k.reg(), aq, p * 128 * STRIDE),
                    rows: Rows {
                        row0: k.add(k.reg(), rows.row0, p * 128),
                        ..rows
                    },
                }
            };
            let setup = F::stage_setup(k, &stage);
            (setup, (0..shape.ahead).map(|_| F::step_regs(k)).collect())
        })
        .collect();
    let ahead = shape.ahead;
    let load_step = |k: &Kernel, tile: Reg<U32>, q: u32| {
        for (setup, sets) in &passes {
            F::load_step(k, setup, &sets[(q % ahead) as usize], tile, q);
        }
    };
    let acc: [[[Reg<F32>; 4]; NI]; MI] =
        std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| k.f32(0.0))));

    if wait {
        k.grid_dep_wait();
    }
    k.if_(k.lt(first, end), |k| {
        for q in 0..ahead {
            load_step(k, first, q);
        }
    });
    k.stride_loop(first, end, 1u32, |k, tile| {
        let next_tile = k.add(k.reg(), tile, 1u32);
        for q in 0..STEPS {
            // Every warp is done with the previous step's shared memory.
            k.bar_sync();
            let off = k.mul_wide(k.reg::<U64>(), tile, (TILE * 2) as u32);
            k.add(off, off, u64::from(q * KT * 2));
            for (i, &(held, valid)) in copies.iter().enumerate() {
                let src = held.unwrap_or_else(|r| address(k, r));
                let src = k.add(k.reg(), src, off);
                k.guarded(valid, |k| {
                    k.cp_async(
                        CpAsyncCache::Cg,
                        bdst.at(i as i64 * 32 * STRIDE as i64),
                        src,
                        16,
                    );
                });
            }
            k.cp_async_commit();
            for (setup, sets) in &passes {
                F::stage_step(k, setup, &sets[(q % ahead) as usize], q);
            }
            // Step q + ahead's weights, in flight during this step's products.
            if q + ahead < STEPS {
                load_step(k, tile, q + ahead);
            } else {
                k.if_(k.lt(next_tile, end), |k| {
                    load_step(k, next_tile, q + ahead - STEPS)
                });
            }
            k.cp_async_wait(0);
            k.bar_sync();
            for step in 0..(KT / 16) as i64 {
                let a: [[Reg<B32>; 4]; MI] = std::array::from_fn(|mi| {
                    let f = k.regs::<B32, 4>();
                    k.ldmatrix(
                        f,
                        a_lm.at(mi as i64 * 16 * STRIDE as i64 + 32 * step),
                        false,
                    );
                    f
                });
                let b: Vec<[Reg<B32>; 4]> = (0..NI / 2)
                    .map(|nj| {
                        let f = k.regs::<B32, 4>();
                        k.ldmatrix(
                            f,
                            b_lm.at(nj as i64 * 16 * STRIDE as i64 + 32 * step),
                            false,
                        );
                        f
                    })
                    .collect();
                for (mi, am) in a.iter().enumerate() {
                    for ni in 0..NI {
                        let c = acc[mi][ni];
                        let bf = b[ni / 2];
                        let h = 2 * (ni % 2);
                        k.mma_m16n8k16(MmaFloat::F16, c, *am, [bf[h], bf[h + 1]], c);
                    }
                }
            }
        }
    });
    Products { acc, arow, ctok }
}

/// CPU twin of the f16 GEMM for `ty`: `y[t][r] = sum_i W16[r][i] * x16[t][i]` in f64, from
/// the weights as the kernel stages them ([`GemmF16Format::dequantize_row`]) and the
/// activation rows `xh` of [`act_cpu`] (permuted as the kernel reads them); with each
/// output's `sum |w x|`, the scale of its rounding error.
pub fn cpu_with_magnitude(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    xh: &[u16],
    ntok: usize,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let dequantize = match ty {
        GgmlType::Q4_K => <Q4K as GemmF16Format>::dequantize_row,
        GgmlType::Q6_K => <crate::formats::Q6K as GemmF16Format>::dequantize_row,
        GgmlType::Q8_0 => super::narrow_q8_0::dequantize_row,
        other => {
            return Err(smelt_quant::QuantError::Unsupported {
                ty: other,
                op: "the f16 GEMM",
            }
            .into())
        }
    };
    let width = act_row_bytes(k) / 2;
    if nrows == 0 || ggml.len() % nrows != 0 || xh.len() != width * ntok {
        return Err(KernelError::BadLength {
            what: "f16 GEMM twin inputs",
            got: xh.len(),
            want: width * ntok,
        });
    }
    let row_len = ggml.len() / nrows;
    let weights: Vec<Vec<f64>> = ggml
        .chunks(row_len)
        .map(|row| {
            Ok(dequantize(row, k)?
                .into_iter()
                .map(|b| f16::from_bits(b).to_f64())
                .collect())
        })
        .collect::<Result<_, KernelError>>()?;
    let mut y = vec![0f32; ntok * nrows];
    let mut mag = vec![0f64; ntok * nrows];
    for t in 0..ntok {
        let row = &xh[t * width..(t + 1) * width];
        // Undo the K permutation: halves 4q..4q+4 hold values 4q, 4q+2, 4q+1, 4q+3.
        let x: Vec<f64> = (0..k)
            .map(|i| {
                let slot = [0, 2, 1, 3][i % 4];
                f16::from_bits(row[i - i % 4 + slot]).to_f64()
            })
            .collect();
        for (r, w) in weights.iter().enumerate() {
            let (s, m) = w.iter().zip(&x).fold((0f64, 0f64), |(s, m), (a, b)| {
                (s + a * b, m + (a * b).abs())
            });
            y[t * nrows + r] = s as f32;
            mag[t * nrows + r] = m;
        }
    }
    Ok((y, mag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_are_halves_in_the_k_permutation() {
        let x: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.25).collect();
        let h = act_cpu(&x, 300).unwrap();
        assert_eq!(h.len(), 512);
        assert_eq!(act_row_bytes(300), 1024);
        let f = |i: usize| f16::from_bits(h[i]).to_f32();
        assert_eq!([f(0), f(1), f(2), f(3)], [x[0], x[2], x[1], x[3]]);
        assert_eq!(
            [f(296), f(297), f(298), f(299)],
            [x[296], x[298], x[297], x[299]]
        );
        assert!(h[300..].iter().all(|&b| b == 0));
        assert!(act_cpu(&x, 7).is_err());
        let l = act_launch(300, 3);
        assert_eq!(l.grid, (1, 3, 1));
    }

    #[test]
    fn q4_k_twin_weights_match_ggml_dequantization_to_half_precision() {
        let k = 512;
        let w: Vec<f32> = (0..k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let mut ggml = vec![0u8; k / TILE * 144];
        smelt_quant::quantize_row(GgmlType::Q4_K, &w, &mut ggml).unwrap();
        let mut exact = vec![0f32; k];
        smelt_quant::dequantize_row(GgmlType::Q4_K, &ggml, &mut exact).unwrap();
        let h = <Q4K as GemmF16Format>::dequantize_row(&ggml, k).unwrap();
        // A weight is q A + B with A and B rounded to halves: its error scales with the
        // group's terms (up to the row's largest weight), not with the weight itself.
        let top = exact.iter().fold(0f32, |m, e| m.max(e.abs()));
        for (i, (&b, &e)) in h.iter().zip(&exact).enumerate() {
            let got = f16::from_bits(b).to_f32();
            assert!((got - e).abs() <= 2e-3 * top, "weight {i}: {got} vs {e}");
        }
        assert!(<Q4K as GemmF16Format>::dequantize_row(&ggml[..144], k).is_err());
    }

    #[test]
    fn twin_undoes_the_permutation() {
        let k = 256;
        let w: Vec<f32> = (0..k).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut ggml = vec![0u8; 144];
        smelt_quant::quantize_row(GgmlType::Q4_K, &w, &mut ggml).unwrap();
        let mut wd = vec![0f32; k];
        smelt_quant::dequantize_row(GgmlType::Q4_K, &ggml, &mut wd).unwrap();
        let x: Vec<f32> = (0..k).map(|i| ((i * 3) % 7) as f32 * 0.25).collect();
        let xh = act_cpu(&x, k).unwrap();
        let (y, mag) = cpu_with_magnitude(GgmlType::Q4_K, &ggml, 1, k, &xh, 1).unwrap();
        let exact: f64 = wd
            .iter()
            .zip(&x)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!(
            (f64::from(y[0]) - exact).abs() < 1e-3 * mag[0],
            "{} vs {exact}",
            y[0]
        );
    }

    #[test]
    fn launch_covers_ragged_shapes_in_128_by_128_blocks() {
        let a = crate::gemm::Args {
            w: 0,
            x: 0,
            y: 0,
            nrows: 260,
            ntok: 300,
            ntiles: 16,
            row_bytes: 16 * 144,
            splits: 3,
            fixup: None,
        };
        let l = launch(&a);
        assert_eq!(l.grid, (3, 3, 3));
        assert_eq!(l.block, (THREADS, 1, 1));
        // H100: 4096 rows x 512 tokens are 128 blocks, so three splits (the int8 GEMM's
        // 512 blocks take none).
        assert_eq!(splits(4096, 16, Some(512), 132), 3);
        assert_eq!(crate::gemm::splits(4096, 16, Some(512), 132), 1);
        assert!(preferred(1024, 512) && preferred(4096, 128) && !preferred(1024, 128));
        assert!(!preferred(14336, 64));
    }

    #[test]
    fn every_f16_gemm_builds_within_static_shared_memory() {
        crate::catalog::assert_builds(catalog, &TYPES.map(|(_, n)| n));
    }
}
