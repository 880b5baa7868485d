//! GGML block formats on the CPU: quantize, dequantize and the dot product against the
//! activation format ggml pairs each weight format with, byte-identical to ggml.
//!
//! Each format is a `#[repr(C)]` block struct implementing [`Block`] (and [`Quantize`] when
//! smelt can produce it); the byte-level functions at the bottom of this file dispatch on a
//! [`GgmlType`] for code that only knows a tensor's type at run time.

pub mod fp;
pub mod iq4;
pub mod kquants;
pub mod legacy;
mod parallel;
pub mod simd;

pub use parallel::quantize_tensor;
pub use smelt_gguf::GgmlType;

use bytemuck::Pod;

/// Why a quantization call was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    #[error("cannot quantize non-finite value {value} at row {row}, column {col}")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error("row length {n} is not a multiple of {ty}'s block size {block}")]
    RaggedRow {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty} has no {op} in smelt")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("buffer of {got} bytes does not hold {want} bytes of {ty}")]
    BadLength {
        ty: GgmlType,
        got: usize,
        want: usize,
    },
    #[error("source length {len} is not a whole number of rows of {n_per_row}")]
    BadShape { len: usize, n_per_row: usize },
}

/// One block of a GGML format: its byte layout, how to unpack it, and how to dot it
/// against the activation format ggml pairs it with.
///
/// Implementors are `#[repr(C)]` structs whose size is exactly ggml's `type_size`, so a
/// slice of them is the on-disk bytes (see [`GgmlType::type_size`]).
pub trait Block: Pod + Send + Sync {
    /// The ggml type this block is.
    const TYPE: GgmlType;
    /// Weights per block (ggml's `blck_size`).
    const WEIGHTS: usize;
    /// The format activations are quantized to before a dot product (ggml's
    /// `vec_dot_type`): Q8_0, Q8_1 or Q8_K for quantized weights.
    type Act: Block + Quantize;

    /// Unpacks `src` into `dst` (`dst.len() == src.len() * WEIGHTS`).
    fn dequantize_row(src: &[Self], dst: &mut [f32]);

    /// `sum_i x_i * y_i` over whole blocks, on the fastest path this CPU has (the AVX2
    /// and portable paths give bit-identical results).
    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32;
}

/// A format smelt can quantize to, with ggml's reference algorithm (no importance matrix).
pub trait Quantize: Block {
    /// Quantizes `src` (`src.len() == dst.len() * WEIGHTS`) into `dst`. Callers have
    /// already rejected non-finite input.
    fn quantize_row(src: &[f32], dst: &mut [Self]);
}

/// Calls `$body` with `$B` bound to the block type of `$ty`, or evaluates `$none` for
/// types smelt does not implement.
#[rustfmt::skip]
macro_rules! with_block {
    ($ty:expr, $B:ident => $body:expr, _ => $none:expr) => {
        match $ty {
            GgmlType::F32 => { type $B = fp::F32; $body }
            GgmlType::F16 => { type $B = fp::F16; $body }
            GgmlType::BF16 => { type $B = fp::BF16; $body }
            GgmlType::Q4_0 => { type $B = legacy::BlockQ4_0; $body }
            GgmlType::Q4_1 => { type $B = legacy::BlockQ4_1; $body }
            GgmlType::Q5_0 => { type $B = legacy::BlockQ5_0; $body }
            GgmlType::Q5_1 => { type $B = legacy::BlockQ5_1; $body }
            GgmlType::Q8_0 => { type $B = legacy::BlockQ8_0; $body }
            GgmlType::Q8_1 => { type $B = legacy::BlockQ8_1; $body }
            GgmlType::Q2_K => { type $B = kquants::BlockQ2K; $body }
            GgmlType::Q3_K => { type $B = kquants::BlockQ3K; $body }
            GgmlType::Q4_K => { type $B = kquants::BlockQ4K; $body }
            GgmlType::Q5_K => { type $B = kquants::BlockQ5K; $body }
            GgmlType::Q6_K => { type $B = kquants::BlockQ6K; $body }
            GgmlType::Q8_K => { type $B = kquants::BlockQ8K; $body }
            GgmlType::IQ4_NL => { type $B = iq4::BlockIQ4NL; $body }
            GgmlType::IQ4_XS => { type $B = iq4::BlockIQ4XS; $body }
            _ => $none,
        }
    };
}

/// Same as [`with_block`] but only for types implementing [`Quantize`].
#[rustfmt::skip]
macro_rules! with_quantize {
    ($ty:expr, $B:ident => $body:expr, _ => $none:expr) => {
        match $ty {
            GgmlType::F32 => { type $B = fp::F32; $body }
            GgmlType::F16 => { type $B = fp::F16; $body }
            GgmlType::BF16 => { type $B = fp::BF16; $body }
            GgmlType::Q4_0 => { type $B = legacy::BlockQ4_0; $body }
            GgmlType::Q4_1 => { type $B = legacy::BlockQ4_1; $body }
            GgmlType::Q5_0 => { type $B = legacy::BlockQ5_0; $body }
            GgmlType::Q5_1 => { type $B = legacy::BlockQ5_1; $body }
            GgmlType::Q8_0 => { type $B = legacy::BlockQ8_0; $body }
            GgmlType::Q8_1 => { type $B = legacy::BlockQ8_1; $body }
            GgmlType::Q2_K => { type $B = kquants::BlockQ2K; $body }
            GgmlType::Q3_K => { type $B = kquants::BlockQ3K; $body }
            GgmlType::Q4_K => { type $B = kquants::BlockQ4K; $body }
            GgmlType::Q5_K => { type $B = kquants::BlockQ5K; $body }
            GgmlType::Q6_K => { type $B = kquants::BlockQ6K; $body }
            GgmlType::Q8_K => { type $B = kquants::BlockQ8K; $body }
            _ => $none,
        }
    };
}

/// Types smelt can quantize to.
pub fn can_quantize(ty: GgmlType) -> bool {
    with_quantize!(ty, B => { let _ = <B as Block>::WEIGHTS; true }, _ => false)
}

/// Types smelt can dequantize and dot.
pub fn can_dequantize(ty: GgmlType) -> bool {
    with_block!(ty, B => { let _ = <B as Block>::WEIGHTS; true }, _ => false)
}

/// The activation type ggml pairs `ty` with in dot products.
pub fn act_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    with_block!(ty, B => Ok(<<B as Block>::Act as Block>::TYPE), _ => Err(QuantError::Unsupported { ty, op: "dot product" }))
}

fn check_row(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::RaggedRow { ty, n, block });
    }
    Ok(n / block * ty.type_size())
}

/// Rejects NaN and infinities, naming the first offending element (row-major with rows of
/// `n_per_row`).
pub fn check_finite(src: &[f32], n_per_row: usize) -> Result<(), QuantError> {
    match src.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(QuantError::NonFinite {
            row: i / n_per_row.max(1),
            col: i % n_per_row.max(1),
            value: src[i],
        }),
    }
}

/// Views `bytes` as blocks, copying only when the buffer is misaligned for `B`.
fn blocks<B: Block>(bytes: &[u8]) -> std::borrow::Cow<'_, [B]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// Quantizes one row of `src` into `dst`, which must hold exactly its bytes.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let want = check_row(ty, src.len())?;
    if dst.len() != want {
        return Err(QuantError::BadLength {
            ty,
            got: dst.len(),
            want,
        });
    }
    check_finite(src, src.len())?;
    quantize_checked_row(ty, src, dst)
}

/// [`quantize_row`] for a row whose length, buffer and finiteness the caller has already
/// checked ([`quantize_tensor`] scans each task's rows once, not once more per row).
pub(crate) fn quantize_checked_row(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    with_quantize!(ty, B => {
        match bytemuck::try_cast_slice_mut::<u8, B>(dst) {
            Ok(out) => <B as Quantize>::quantize_row(src, out),
            Err(_) => {
                let mut out = vec![<B as bytemuck::Zeroable>::zeroed(); src.len() / <B as Block>::WEIGHTS];
                <B as Quantize>::quantize_row(src, &mut out);
                dst.copy_from_slice(bytemuck::cast_slice(&out));
            }
        }
        Ok(())
    }, _ => Err(QuantError::Unsupported { ty, op: "quantization" }))
}

/// Unpacks the bytes of one row of `ty` into `dst` (`dst.len()` weights).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let want = check_row(ty, dst.len())?;
    if src.len() != want {
        return Err(QuantError::BadLength {
            ty,
            got: src.len(),
            want,
        });
    }
    with_block!(ty, B => {
        <B as Block>::dequantize_row(&blocks::<B>(src), dst);
        Ok(())
    }, _ => Err(QuantError::Unsupported { ty, op: "dequantization" }))
}

/// Dot product of a row of weights `x` (type `ty`) with a row of activations `y` already
/// quantized to [`act_type`]`(ty)`; both hold `n` elements.
pub fn vec_dot(ty: GgmlType, n: usize, x: &[u8], y: &[u8]) -> Result<f32, QuantError> {
    let want_x = check_row(ty, n)?;
    if x.len() != want_x {
        return Err(QuantError::BadLength {
            ty,
            got: x.len(),
            want: want_x,
        });
    }
    with_block!(ty, B => {
        let act = <<B as Block>::Act as Block>::TYPE;
        let want_y = check_row(act, n)?;
        if y.len() != want_y {
            return Err(QuantError::BadLength { ty: act, got: y.len(), want: want_y });
        }
        Ok(<B as Block>::vec_dot(&blocks::<B>(x), &blocks::<<B as Block>::Act>(y)))
    }, _ => Err(QuantError::Unsupported { ty, op: "dot product" }))
}
