//! In-situ quantization on the GPU: f32, f16 or bf16 rows in, ggml's block bytes out,
//! byte-identical to `smelt_quant::quantize_row` (and so to ggml's `quantize_row_*_ref`).
//!
//! Every float operation of the CPU quantizer is emitted as the same IEEE operation in the
//! same order: `add.rn`/`mul.rn` (never contracted into an FMA, which ggml's reference C
//! does not form either), `div.rn` and `sqrt.rn` (correctly rounded, as C's `/` and
//! `sqrtf`), `cvt.rn.f16.f32` for `GGML_FP32_TO_FP16`, ggml's `nearest_int` as the same
//! add-1.5*2^23-and-mask trick, and x86's truncating conversion (`cvttss2si`, whose
//! out-of-range result ggml really hits on tiny blocks) emulated exactly. Scans keep
//! ggml's order wherever the result depends on it (first extreme wins); reductions across
//! threads carry the group index so ties resolve as the sequential scan resolves them.
//!
//! Work split:
//! - legacy formats ([`legacy`]): one thread per 32-weight block;
//! - K-quants ([`kquants`]): one thread per group of a 256-weight super-block (16 threads
//!   of 16 weights for Q2_K, Q3_K and Q6_K, 8 threads of 32 for Q4_K and Q5_K); each
//!   runs ggml's per-group search on its own weights, the threads of a super-block agree
//!   on its scale through shuffles, and pack the block's bytes from levels staged in
//!   shared memory.
//!
//! Non-finite input is never quantized silently: each thread checks its values and
//! raises a per-row flag (`u32::MAX - first bad column`, kept by an atomic max, so the
//! lowest column wins); the host turns a raised flag into smelt-quant's `NonFinite` error
//! naming the row and column ([`check_flags`]).

pub mod kquants;
pub mod legacy;
mod search;

use crate::ops::kernel_params;
use smelt_ptx::{
    Cmp, Exact, FloatRound, IntRound, Kernel, Load, Pred, Reg, Store, F16, F32, S32, U16, U32, U64,
};
use smelt_quant::{GgmlType, QuantError};

use crate::catalog::Entry;
use crate::KernelError;

/// Threads per block of every quantize kernel.
pub const BLOCK_THREADS: u32 = 128;

/// The types the GPU quantizes to.
pub const TYPES: [GgmlType; 10] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The element type of the source rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// IEEE single precision.
    F32,
    /// IEEE half precision, widened exactly.
    F16,
    /// bfloat16 (the top half of an f32), widened exactly.
    Bf16,
}

impl Input {
    /// Every input type.
    pub const ALL: [Input; 3] = [Input::F32, Input::F16, Input::Bf16];

    /// Its name in kernel names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Input::F32 => "f32",
            Input::F16 => "f16",
            Input::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Input::F32 => 4,
            Input::F16 | Input::Bf16 => 2,
        }
    }

    /// The ggml type of such a tensor.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Input::F32 => GgmlType::F32,
            Input::F16 => GgmlType::F16,
            Input::Bf16 => GgmlType::BF16,
        }
    }

    /// The input type of a tensor of ggml type `ty`, if the GPU reads it directly.
    pub fn from_ggml(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::F32 => Some(Input::F32),
            GgmlType::F16 => Some(Input::F16),
            GgmlType::BF16 => Some(Input::Bf16),
            _ => None,
        }
    }

    /// Widens raw source bytes to f32 exactly as the CPU path does (`dequantize_row` of
    /// F32/F16/BF16).
    pub fn widen(self, src: &[u8]) -> Vec<f32> {
        match self {
            Input::F32 => src
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Input::F16 => src
                .chunks_exact(2)
                .map(|b| smelt_quant::fp::f16_to_f32(half::f16::from_le_bytes([b[0], b[1]])))
                .collect(),
            Input::Bf16 => src
                .chunks_exact(2)
                .map(|b| smelt_quant::fp::bf16_to_f32(half::bf16::from_le_bytes([b[0], b[1]])))
                .collect(),
        }
    }
}

/// How a format splits its work: weights per block (the unit one group of threads
/// quantizes), threads per block, and bytes per output block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Weights per block (32 or 256).
    pub weights: u32,
    /// Threads cooperating on one block (a power of two dividing 32).
    pub threads: u32,
    /// Output bytes per block (ggml's `type_size`).
    pub bytes: u32,
}

impl Shape {
    /// Weights each thread quantizes.
    pub fn group(self) -> u32 {
        self.weights / self.threads
    }
}

/// The work split of `ty`, or an error for types without a GPU quantizer.
pub fn shape(ty: GgmlType) -> Result<Shape, KernelError> {
    let threads = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 1,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K => 16,
        GgmlType::Q4_K | GgmlType::Q5_K => 8,
        _ => return Err(unsupported(ty)),
    };
    Ok(Shape {
        weights: ty.block_size() as u32,
        threads,
        bytes: ty.type_size() as u32,
    })
}

fn unsupported(ty: GgmlType) -> KernelError {
    KernelError::Quant(QuantError::Unsupported {
        ty,
        op: "GPU quantization",
    })
}

/// The kernel quantizing `input` rows to `ty`.
pub fn kernel_name(ty: GgmlType, input: Input) -> Result<String, KernelError> {
    shape(ty)?;
    Ok(format!(
        "isq_{}_{}",
        ty.to_string().to_lowercase(),
        input.name()
    ))
}

kernel_params! {
    /// Arguments of every quantize [`kernel`].
    QuantizeArgs, QuantizeRegs {
        src: Ptr,
        dst: Ptr,
        flags: Ptr,
        blocks: U32,
        blocks_per_row: U32,
    }
}

/// Emits the kernel quantizing `input` rows to `ty`. Parameters, in order: `src` (the
/// rows), `dst` (the blocks), `flags` (one zeroed u32 per row), `blocks` (u32, blocks in
/// the tensor) and `blocks_per_row` (u32). Launch with [`plan`].
pub fn kernel(k: &Kernel, ty: GgmlType, input: Input) {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            legacy::kernel(k, ty, input)
        }
        GgmlType::Q2_K => kquants::q2_k(k, input),
        GgmlType::Q3_K => kquants::q3_k(k, input),
        GgmlType::Q4_K => kquants::q4_k(k, input),
        GgmlType::Q5_K => kquants::q5_k(k, input),
        GgmlType::Q6_K => kquants::q6_k(k, input),
        _ => k.reject(format!("no GPU quantizer for {ty}")),
    }
}

/// Every quantize kernel, for the catalog.
pub fn entries() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for ty in TYPES {
        for input in Input::ALL {
            if let Ok(name) = kernel_name(ty, input) {
                v.push((name, Box::new(move |k: &Kernel| kernel(k, ty, input))));
            }
        }
    }
    v
}

/// A launch of a quantize kernel over a whole tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Blocks of [`BLOCK_THREADS`] threads (1-D grid).
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Output blocks in the tensor (the kernel's `blocks` parameter).
    pub blocks: u32,
    /// Output blocks per row (the kernel's `blocks_per_row` parameter).
    pub blocks_per_row: u32,
    /// Bytes of the output.
    pub out_bytes: usize,
}

/// Plans quantizing `rows` rows of `cols` weights to `ty`: checks the row length against
/// the block size and that the thread count fits the kernel's 32-bit indexing.
pub fn plan(ty: GgmlType, rows: usize, cols: usize) -> Result<Plan, KernelError> {
    let s = shape(ty)?;
    let w = s.weights as usize;
    if cols == 0 || cols % w != 0 {
        return Err(KernelError::Quant(QuantError::RaggedRow {
            ty,
            n: cols,
            block: w,
        }));
    }
    let per_row = cols / w;
    let blocks = rows
        .checked_mul(per_row)
        .filter(|&b| {
            b.checked_mul(s.threads as usize)
                .is_some_and(|t| t <= u32::MAX as usize)
        })
        .ok_or(KernelError::BadLength {
            what: "tensor too large for one quantize launch",
            got: rows.saturating_mul(cols),
            want: u32::MAX as usize / s.threads as usize * w,
        })?;
    let threads = blocks * s.threads as usize;
    Ok(Plan {
        grid: threads.div_ceil(BLOCK_THREADS as usize).max(1) as u32,
        block: BLOCK_THREADS,
        blocks: blocks as u32,
        blocks_per_row: per_row as u32,
        out_bytes: blocks * s.bytes as usize,
    })
}

/// CPU twin of the quantize kernels: widens `src` (rows of `cols` elements of `input`)
/// and quantizes every row with `smelt_quant::quantize_row`.
pub fn quantize_cpu(
    ty: GgmlType,
    input: Input,
    src: &[u8],
    cols: usize,
) -> Result<Vec<u8>, QuantError> {
    let x = input.widen(src);
    if cols == 0 || x.len() % cols != 0 {
        return Err(QuantError::BadShape {
            len: x.len(),
            n_per_row: cols,
        });
    }
    smelt_quant::check_finite(&x, cols)?;
    smelt_quant::quantize_tensor(ty, &x, cols, None)
}

/// Turns the per-row flags a kernel raised into smelt-quant's error for the first bad
/// row, reading the offending value from the source (`value_at(row, col)`).
pub fn check_flags(
    flags: &[u32],
    value_at: impl FnOnce(usize, usize) -> f32,
) -> Result<(), QuantError> {
    match flags.iter().position(|&f| f != 0) {
        None => Ok(()),
        Some(row) => {
            let col = (u32::MAX - flags[row]) as usize;
            Err(QuantError::NonFinite {
                row,
                col,
                value: value_at(row, col),
            })
        }
    }
}

// ---------------------------------------------------------------------------------------
// Emitters shared by the formats: ggml's scalar helpers as exact PTX sequences.

/// What every quantize thread starts from.
pub(crate) struct Thread {
    /// This thread's weights, widened to f32.
    pub x: Vec<Reg<F32>>,
    /// Index of the thread inside its block's group of threads.
    pub sub: Reg<U32>,
    /// False for the padding threads of the last CTA (they compute on zeros and store
    /// nothing; they do not exit, so shuffles always see full warps).
    pub valid: Reg<Pred>,
    /// Address of this block's output bytes.
    pub dst: Reg<U64>,
    /// `tid.x`, for shared-memory staging.
    pub tid: Reg<U32>,
}

/// Loads this thread's weights and raises its row's flag for non-finite values.
pub(crate) fn prologue(k: &Kernel, input: Input, s: Shape) -> Thread {
    let QuantizeRegs {
        src,
        dst,
        flags,
        blocks,
        blocks_per_row: per_row,
    } = QuantizeRegs::declare(k);
    k.max_threads(BLOCK_THREADS, 1, 1);
    let tid = k.tid_x();
    let gid = k.global_id_x();
    let (unit, sub) = if s.threads == 1 {
        (gid, k.u32(0))
    } else {
        (
            k.shr(k.reg(), gid, s.threads.trailing_zeros()),
            k.and(k.reg(), gid, s.threads - 1),
        )
    };
    let valid = k.lt(unit, blocks);
    let g = s.group();
    let eb = input.bytes() as u32;
    let base = k.add(
        k.reg(),
        src,
        k.mul_wide(k.reg::<U64>(), unit, s.weights * eb),
    );
    let addr = k.add(k.reg(), base, k.mul_wide(k.reg::<U64>(), sub, g * eb));
    let load = Load::GLOBAL_NC;
    let x: Vec<Reg<F32>> = match input {
        Input::F32 => {
            let x: Vec<Reg<F32>> = (0..g).map(|_| k.f32(0.0)).collect();
            k.guarded(valid, |k| {
                for (c, chunk) in x.chunks_exact(4).enumerate() {
                    k.ld_v4(
                        load,
                        [chunk[0], chunk[1], chunk[2], chunk[3]],
                        addr.at(16 * c as i64),
                    );
                }
            });
            x
        }
        Input::F16 | Input::Bf16 => {
            let words: Vec<Reg<U32>> = (0..g / 2).map(|_| k.u32(0)).collect();
            k.guarded(valid, |k| {
                for (c, chunk) in words.chunks_exact(4).enumerate() {
                    k.ld_v4(
                        load,
                        [chunk[0], chunk[1], chunk[2], chunk[3]],
                        addr.at(16 * c as i64),
                    );
                }
            });
            let mut x = Vec::with_capacity(g as usize);
            for &w in &words {
                if input == Input::Bf16 {
                    let lo = k.shl(k.reg(), w, 16u32);
                    let hi = k.and(k.reg(), w, 0xFFFF_0000u32);
                    x.push(k.bitcast::<F32, U32>(lo));
                    x.push(k.bitcast::<F32, U32>(hi));
                } else {
                    let (h0, h1) = (k.reg::<F16>(), k.reg::<F16>());
                    k.raw(format!("mov.b32 {{{h0}, {h1}}}, {w}"));
                    x.push(k.cvt(k.reg::<F32>(), h0, Exact));
                    x.push(k.cvt(k.reg::<F32>(), h1, Exact));
                }
            }
            x
        }
    };

    // The first non-finite value of this thread (u32::MAX when none).
    let first = k.u32(u32::MAX);
    for i in (0..g).rev() {
        let bits = k.bitcast::<U32, F32>(x[i as usize]);
        let mag = k.and(k.reg(), bits, 0x7FFF_FFFFu32);
        let bad = k.cmp(Cmp::Ge, mag, 0x7F80_0000u32);
        k.selp(first, i, first, bad);
    }
    let any = k.cmp(Cmp::Ne, first, u32::MAX);
    let raise = k.and(k.reg::<Pred>(), any, valid);
    k.if_(raise, |k| {
        let row = k.div_int(k.reg(), unit, per_row);
        let in_row = k.sub(k.reg(), unit, k.mul(k.reg(), row, per_row));
        let col = k.mad(k.reg(), in_row, s.weights, k.mad(k.reg(), sub, g, first));
        let flag = k.sub(k.reg(), k.u32(u32::MAX), col);
        let at = k.elem_addr(flags, row, 4);
        k.raw(format!("red.global.max.u32 [{at}], {flag}"));
    });

    let dst = k.add(k.reg(), dst, k.mul_wide(k.reg::<U64>(), unit, s.bytes));
    Thread {
        x,
        sub,
        valid,
        dst,
        tid,
    }
}

/// ggml's `nearest_int`: `fval + 1.5 * 2^23`, then the low 22 mantissa bits, rebiased.
/// Same garbage as the CPU for out-of-range inputs, NaN included: every NaN an x86 CPU
/// makes here is its "default NaN" (mantissa 0x400000, so `nearest_int` gives 0), while
/// the GPU's canonical NaN has every mantissa bit set; NaN is therefore mapped to 0
/// explicitly. (Blocks whose squares overflow, such as a 1e30 weight, reach this.)
pub(crate) fn nearest_int(k: &Kernel, v: Reg<F32>) -> Reg<S32> {
    let t = k.add(k.reg(), v, 12_582_912.0f32);
    let bits = k.bitcast::<U32, F32>(t);
    let m = k.and(k.reg(), bits, 0x007F_FFFFu32);
    let r = k.sub(k.reg(), m.cast::<S32>(), 0x0040_0000i32);
    let number = k.cmp(Cmp::Eq, t, t);
    k.selp(r, r, 0i32, number)
}

/// `v.clamp(lo, hi)` on integers.
pub(crate) fn clamp(k: &Kernel, v: Reg<S32>, lo: i32, hi: i32) -> Reg<S32> {
    let a = k.max(k.reg(), v, lo);
    k.min(a, a, hi)
}

/// Integer -> float, rounded to nearest (Rust's `as f32`).
pub(crate) fn to_f32(k: &Kernel, v: Reg<S32>) -> Reg<F32> {
    k.cvt(k.reg::<F32>(), v, FloatRound::Rn)
}

/// x86's `cvttss2si`: truncation toward zero, `i32::MIN` for NaN and out-of-range values
/// (PTX's conversion saturates instead).
pub(crate) fn cvtt(k: &Kernel, v: Reg<F32>) -> Reg<S32> {
    let a = k.abs(k.reg(), v);
    let in_range = k.cmp(Cmp::Lt, a, 2_147_483_648.0f32);
    let t = k.cvt(k.reg::<S32>(), v, IntRound::Rzi);
    k.selp(t, t, i32::MIN, in_range)
}

/// `roundf(v)` then `cvtt`, as smelt-quant's `round_away`.
pub(crate) fn round_away(k: &Kernel, v: Reg<F32>) -> Reg<S32> {
    let t = cvtt(k, v);
    let frac = k.sub(k.reg(), v, to_f32(k, t));
    let up = k.cmp(Cmp::Ge, frac, 0.5f32);
    let down = k.cmp(Cmp::Le, frac, -0.5f32);
    let a = k.abs(k.reg(), v);
    let small = k.cmp(Cmp::Lt, a, 8_388_608.0f32);
    let up = k.and(k.reg::<Pred>(), up, small);
    let down = k.and(k.reg::<Pred>(), down, small);
    let r = k.copy(t);
    let stepped = k.add(k.reg(), t, 1i32);
    k.selp(r, stepped, r, up);
    let lowered = k.sub(k.reg(), t, 1i32);
    k.selp(r, lowered, r, down);
    r
}

/// `GGML_FP32_TO_FP16(v)` as the 16 bits in a u32 (round to nearest even).
pub(crate) fn f16_bits(k: &Kernel, v: Reg<F32>) -> Reg<U32> {
    let h = k.cvt(k.reg::<F16>(), v, FloatRound::Rn);
    let u = k.bitcast::<U16, F16>(h);
    k.cvt(k.reg::<U32>(), u, Exact)
}

/// `GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))`: `v` rounded to f16 and widened back.
pub(crate) fn through_f16(k: &Kernel, v: Reg<F32>) -> Reg<F32> {
    let h = k.cvt(k.reg::<F16>(), v, FloatRound::Rn);
    k.cvt(k.reg::<F32>(), h, Exact)
}

/// Four byte values (low byte of each word) packed little-endian into one word.
pub(crate) fn pack_bytes(k: &Kernel, b: [Reg<U32>; 4]) -> Reg<U32> {
    let lo = k.prmt(k.reg::<U32>(), b[0], b[1], 0x0040u32);
    let hi = k.prmt(k.reg::<U32>(), b[2], b[3], 0x0040u32);
    k.prmt(k.reg::<U32>(), lo, hi, 0x5410u32)
}

/// Two 16-bit values (low half of each word) packed into one word.
pub(crate) fn pack_halves(k: &Kernel, lo: Reg<U32>, hi: Reg<U32>) -> Reg<U32> {
    k.prmt(k.reg::<U32>(), lo, hi, 0x5410u32)
}

/// Stores a word at an address only 2-byte aligned, as two 16-bit stores.
pub(crate) fn store_u32_as_u16(k: &Kernel, addr: smelt_ptx::Addr, word: Reg<U32>) {
    k.st_narrow(Store::GLOBAL, smelt_ptx::Narrow::U16, addr.clone(), word);
    let hi = k.shr(k.reg(), word, 16u32);
    k.st_narrow(Store::GLOBAL, smelt_ptx::Narrow::U16, addr.offset(2), hi);
}

/// Waits for the warp's lanes, ordering their shared-memory writes before later reads.
pub(crate) fn warp_sync(k: &Kernel) {
    k.raw("bar.warp.sync 0xFFFFFFFF");
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn every_kernel_builds() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in entries() {
                m.kernel(&name, |k| build(k))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            assert_eq!(m.kernel_names().count(), TYPES.len() * Input::ALL.len());
        }
    }

    #[test]
    fn plans_cover_every_block_once() {
        let p = plan(GgmlType::Q6_K, 3, 512).unwrap();
        assert_eq!((p.blocks, p.blocks_per_row, p.block), (6, 2, BLOCK_THREADS));
        assert_eq!(p.grid, 1);
        assert_eq!(p.out_bytes, 6 * 210);
        let p = plan(GgmlType::Q8_0, 4096, 14336).unwrap();
        assert_eq!(p.blocks as usize, 4096 * 14336 / 32);
        assert_eq!(p.grid as usize * 128, 4096 * 14336 / 32);
        assert!(plan(GgmlType::Q4_K, 2, 300).is_err());
        assert!(plan(GgmlType::Q8_0, 2, 0).is_err());
        assert!(plan(GgmlType::IQ4_NL, 2, 32).is_err());
        assert!(plan(GgmlType::Q2_K, 1 << 20, 1 << 20).is_err());
    }

    #[test]
    fn twin_widens_exactly_and_names_non_finite_values() {
        let vals = [1.5f32, -2.25, 0.0, 3.0e-5];
        let mut x: Vec<f32> = (0..64).map(|i| vals[i % 4] * (i as f32)).collect();
        let bf: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let widened: Vec<f32> = bf
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let want = smelt_quant::quantize_tensor(GgmlType::Q8_0, &widened, 32, None).unwrap();
        assert_eq!(
            quantize_cpu(GgmlType::Q8_0, Input::Bf16, &bf, 32).unwrap(),
            want
        );
        x[37] = f32::INFINITY;
        let f: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            quantize_cpu(GgmlType::Q8_0, Input::F32, &f, 32),
            Err(QuantError::NonFinite {
                row: 1,
                col: 5,
                value: f32::INFINITY
            })
        );
    }

    #[test]
    fn flags_decode_to_the_first_bad_row_and_column() {
        assert_eq!(check_flags(&[0, 0], |_, _| 0.0), Ok(()));
        let r = check_flags(&[0, u32::MAX - 7, u32::MAX], |r, c| (r * 100 + c) as f32);
        assert_eq!(
            r,
            Err(QuantError::NonFinite {
                row: 1,
                col: 7,
                value: 107.0
            })
        );
    }

    /// Every quantize kernel assembles for sm_80 and sm_90 without register spills (a
    /// spilled search runs from local memory, several times slower). ptxas as CI finds it
    /// (`SMELT_PTXAS`, else `scripts/ptxas.sh`); not finding it fails the test.
    #[test]
    fn kernels_assemble_without_spills() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let ptxas = smelt_ptx::ptxas::Ptxas::locate(&root.join("../../scripts/ptxas.sh"))
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = std::env::temp_dir().join(format!("smelt-isq-ptxas-{}", std::process::id()));
        let mut failures = Vec::new();
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in entries() {
                m.kernel(&name, |k| build(k))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            match ptxas.assemble(&dir, target, "isq", &m.to_ptx()) {
                Ok(report) => {
                    let kernels = report.matches("Compiling entry function").count();
                    let clean = report.matches(" 0 bytes spill stores").count();
                    if kernels != entries().len() || clean != kernels {
                        failures.push(format!(
                            "{target}: {clean} of {kernels} spill-free:\n{report}"
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn names_say_type_and_input() {
        assert_eq!(
            kernel_name(GgmlType::Q6_K, Input::Bf16).unwrap(),
            "isq_q6_k_bf16"
        );
        assert!(kernel_name(GgmlType::F16, Input::F32).is_err());
    }
}
