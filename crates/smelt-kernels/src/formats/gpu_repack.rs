//! The GEMV row layouts as data, and the kernels that repack ggml blocks into them on the
//! device, so in-situ quantization on a GPU never sends its blocks back to the host to be
//! repacked there (issue 20: weights cross the link once).
//!
//! Every format's GPU row is ggml's block fields regrouped: all blocks' first field, then
//! all blocks' second field ..., each field array `padded_blocks * len` bytes, the row
//! padded with zeros to 16 bytes ([`super::GpuFormat::repack_row`] writes the same bytes
//! by hand per format; [`repack_host`] from this table, and a test ties the two). Formats
//! of 32-weight blocks are padded with zero blocks to whole 256-weight tiles.
//!
//! The kernel ([`kernel`], one per format, named by [`kernel_name`]) is output-driven: one
//! thread per output byte (grid-stride) finds the field and block it belongs to and copies
//! that source byte, or writes 0 for padding, so every byte of the destination is written
//! (the engine's weight memory is not zeroed). Its CPU twin is the host repack
//! ([`crate::catalog::repack`]); `examples/gpu_ops` (`-o repack`) compares them on a GPU.

use smelt_ptx::{Kernel, Load, Narrow, Store, U32};

use super::pad16;
use crate::ops::{dim, kernel_params, Launch};
use crate::{GgmlType, KernelError};

/// A format's GPU row as fields of its ggml block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of a ggml block.
    pub block: usize,
    /// `(offset in the ggml block, bytes)` of each field, in the order the GPU row keeps
    /// them; the lengths add up to `block`.
    pub fields: &'static [(usize, usize)],
    /// Blocks of 32 weights, padded with zero blocks to whole 256-weight tiles.
    pub tile_padded: bool,
}

impl Layout {
    /// Whether the GPU row is ggml's row as it is (one field; no padding when `k` is a
    /// whole number of tiles, which 256-weight formats always are).
    pub fn is_identity(&self) -> bool {
        self.fields.len() == 1 && !self.tile_padded && self.block % 16 == 0
    }

    /// Blocks of a row of `k` weights in ggml's layout.
    pub fn blocks(&self, ty: GgmlType, k: usize) -> usize {
        k / ty.block_size()
    }

    /// Blocks of a row in the GPU layout (zero blocks included).
    pub fn padded_blocks(&self, ty: GgmlType, k: usize) -> usize {
        if self.tile_padded {
            k.div_ceil(crate::TILE) * (crate::TILE / ty.block_size())
        } else {
            self.blocks(ty, k)
        }
    }
}

/// The GPU row layout of `ty`, for every type with a GEMV.
pub fn layout(ty: GgmlType) -> Result<Layout, KernelError> {
    let (block, fields, tile_padded): (usize, &'static [(usize, usize)], bool) = match ty {
        GgmlType::Q4_K => (144, &[(0, 144)], false),
        GgmlType::Q5_K => (176, &[(0, 176)], false),
        GgmlType::Q6_K => (210, &[(0, 128), (128, 64), (192, 16), (208, 2)], false),
        GgmlType::Q2_K => (84, &[(16, 64), (0, 16), (80, 4)], false),
        GgmlType::Q3_K => (110, &[(32, 64), (0, 32), (96, 12), (108, 2)], false),
        GgmlType::IQ4_XS => (136, &[(8, 128), (4, 4), (2, 2), (0, 2)], false),
        GgmlType::Q8_0 => (34, &[(2, 32), (0, 2)], true),
        GgmlType::Q4_0 | GgmlType::IQ4_NL => (18, &[(2, 16), (0, 2)], true),
        GgmlType::Q4_1 => (20, &[(4, 16), (0, 2), (2, 2)], true),
        GgmlType::Q5_0 => (22, &[(6, 16), (2, 4), (0, 2)], true),
        GgmlType::Q5_1 => (24, &[(8, 16), (4, 4), (0, 2), (2, 2)], true),
        _ => {
            return Err(KernelError::Quant(smelt_quant::QuantError::Unsupported {
                ty,
                op: "GPU repack",
            }))
        }
    };
    Ok(Layout {
        block,
        fields,
        tile_padded,
    })
}

/// Repacks `rows` rows of `k` weights of ggml bytes from the [`layout`] table: the same
/// bytes as [`crate::catalog::repack`] (tested), written the way the kernel computes them.
pub fn repack_host(
    ty: GgmlType,
    ggml: &[u8],
    rows: usize,
    k: usize,
) -> Result<Vec<u8>, KernelError> {
    let l = layout(ty)?;
    let row_bytes = crate::catalog::row_bytes(ty, k)?;
    let (nb, nbp) = (l.blocks(ty, k), l.padded_blocks(ty, k));
    let src_row = nb * l.block;
    if ggml.len() != rows * src_row {
        return Err(KernelError::BadLength {
            what: "ggml weights",
            got: ggml.len(),
            want: rows * src_row,
        });
    }
    let mut out = vec![0u8; rows * row_bytes];
    for r in 0..rows {
        for (o, byte) in out[r * row_bytes..(r + 1) * row_bytes]
            .iter_mut()
            .enumerate()
        {
            let mut base = 0;
            for &(at, len) in l.fields {
                let span = nbp * len;
                if o >= base && o < base + span {
                    let (b, j) = ((o - base) / len, (o - base) % len);
                    if b < nb {
                        *byte = ggml[r * src_row + b * l.block + at + j];
                    }
                }
                base += span;
            }
        }
    }
    Ok(out)
}

/// The repack kernel's name for `ty`.
pub fn kernel_name(ty: GgmlType) -> Result<String, KernelError> {
    layout(ty)?;
    Ok(format!("repack_{}", ty.to_string().to_lowercase()))
}

kernel_params! {
    /// Arguments of the repack [`kernel`] (see [`args`]).
    RepackArgs, RepackRegs {
        src: Ptr,
        dst: Ptr,
        /// Output bytes: `rows * row_bytes`.
        total: U32,
        /// Bytes of a GPU row.
        row_bytes: U32,
        /// Bytes of a ggml row.
        src_row: U32,
        /// ggml blocks per row.
        blocks: U32,
        /// GPU blocks per row (zero blocks included).
        padded_blocks: U32,
    }
}

/// Threads per block of the repack kernels.
pub const THREADS: u32 = 256;

/// The arguments repacking `rows` rows of `k` weights of `ty` from `src` (ggml bytes) to
/// `dst` (GPU rows), and the launch; an error when the bytes do not fit 32-bit offsets.
pub fn args(
    ty: GgmlType,
    src: u64,
    dst: u64,
    rows: usize,
    k: usize,
) -> Result<(RepackArgs, Launch), KernelError> {
    let l = layout(ty)?;
    let row_bytes = crate::catalog::row_bytes(ty, k)?;
    let (nb, nbp) = (l.blocks(ty, k), l.padded_blocks(ty, k));
    let total = rows * row_bytes;
    let src_bytes = rows * nb * l.block;
    let fits = |n: usize| u32::try_from(n).ok();
    let (Some(total32), Some(_)) = (fits(total), fits(src_bytes)) else {
        return Err(KernelError::BadLength {
            what: "repack bytes (at most 4 GiB per launch)",
            got: total.max(src_bytes),
            want: u32::MAX as usize,
        });
    };
    let launch = Launch::new(
        (dim(total.div_ceil(THREADS as usize).min(32768)), 1, 1),
        (THREADS, 1, 1),
    );
    Ok((
        RepackArgs {
            src,
            dst,
            total: total32,
            row_bytes: row_bytes as u32,
            src_row: (nb * l.block) as u32,
            blocks: nb as u32,
            padded_blocks: nbp as u32,
        },
        launch,
    ))
}

/// Emits the repack kernel of `ty` (parameters: [`RepackArgs`]; launch: [`args`]).
pub fn kernel(k: &Kernel, ty: GgmlType) {
    let l = match layout(ty) {
        Ok(l) => l,
        Err(e) => return k.reject(e.to_string()),
    };
    k.max_threads(THREADS, 1, 1);
    let RepackRegs {
        src,
        dst,
        total,
        row_bytes,
        src_row,
        blocks,
        padded_blocks,
    } = RepackRegs::declare(k);
    // Where each field's array starts in a GPU row, and its length.
    let mut bases = Vec::with_capacity(l.fields.len());
    let mut cum = 0u32;
    for &(_, len) in l.fields {
        bases.push((
            k.mul(k.reg::<U32>(), padded_blocks, cum),
            k.mul(k.reg::<U32>(), padded_blocks, len as u32),
        ));
        cum += len as u32;
    }
    k.stride_loop(k.global_id_x(), total, k.grid_size_x(), |k, i| {
        let row = k.div_int(k.reg::<U32>(), i, row_bytes);
        let o = k.mul(k.reg::<U32>(), row, row_bytes);
        k.sub(o, i, o);
        let row_src = k.mul(k.reg::<U32>(), row, src_row);
        let val = k.u32(0);
        for (&(at, len), &(base, span)) in l.fields.iter().zip(&bases) {
            // Offset in the field's array (wraps past u32::MAX below its start).
            let rel = k.sub(k.reg::<U32>(), o, base);
            let inside = k.lt(rel, span);
            let b = k.div_int(k.reg::<U32>(), rel, len as u32);
            let j = k.mul(k.reg::<U32>(), b, len as u32);
            k.sub(j, rel, j);
            // Blocks past the row's real ones (padding) and bytes of other fields read
            // nothing: their block index is pushed out of range.
            k.selp(b, b, u32::MAX, inside);
            let real = k.lt(b, blocks);
            let off = k.mad(k.reg::<U32>(), b, l.block as u32, row_src);
            k.add(off, off, j);
            k.add(off, off, at as u32);
            k.guarded(real, |k| {
                k.ld_narrow(Load::GLOBAL_NC, Narrow::U8, val, k.elem_addr(src, off, 1));
            });
        }
        k.st_narrow(Store::GLOBAL, Narrow::U8, k.elem_addr(dst, i, 1), val);
    });
}

/// Every repack kernel, for the catalog.
pub fn entries() -> Vec<crate::catalog::Entry> {
    crate::catalog::GEMV_TYPES
        .into_iter()
        .filter_map(|ty| {
            let name = kernel_name(ty).ok()?;
            Some((
                name,
                Box::new(move |k: &Kernel| kernel(k, ty)) as Box<dyn Fn(&Kernel)>,
            ))
        })
        .collect()
}

/// `pad16` of the fields' total, the row size the table implies (tested against each
/// format's `row_bytes`).
pub fn table_row_bytes(ty: GgmlType, k: usize) -> Result<usize, KernelError> {
    let l = layout(ty)?;
    Ok(pad16(
        l.padded_blocks(ty, k) * l.fields.iter().map(|f| f.1).sum::<usize>(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    /// The table the kernel is generated from gives each format's own host repack (the
    /// kernel's CPU twin) byte for byte, ragged rows and zero blocks included.
    #[test]
    fn the_table_is_every_formats_repack() {
        for ty in catalog::GEMV_TYPES {
            let l = layout(ty).expect("layout");
            assert_eq!(
                l.fields.iter().map(|f| f.1).sum::<usize>(),
                l.block,
                "{ty}: fields cover the block"
            );
            assert_eq!(l.block, ty.type_size(), "{ty}");
            let ks: &[usize] = if l.tile_padded {
                &[32, 96, 256, 288, 512, 800]
            } else {
                &[256, 512, 1280]
            };
            for (i, &k) in ks.iter().enumerate() {
                let rows = 3 + i;
                let ggml = bytes(rows * k / ty.block_size() * ty.type_size(), i as u64 + 7);
                let want = catalog::repack(ty, &ggml, rows, k).expect("repack");
                let got = repack_host(ty, &ggml, rows, k).expect("table repack");
                assert!(got == want, "{ty} k={k}: the table's bytes differ");
                assert_eq!(
                    table_row_bytes(ty, k).expect("row bytes"),
                    catalog::row_bytes(ty, k).expect("row bytes"),
                    "{ty} k={k}"
                );
            }
        }
        assert!(layout(GgmlType::Q4_K).expect("q4_k").is_identity());
        assert!(!layout(GgmlType::Q6_K).expect("q6_k").is_identity());
        assert!(!layout(GgmlType::Q8_0).expect("q8_0").is_identity());
    }

    #[test]
    fn launches_cover_the_output_and_refuse_4_gib() {
        let (a, l) = args(GgmlType::Q6_K, 1, 2, 10, 4096).expect("args");
        assert_eq!(
            a.total as usize,
            10 * catalog::row_bytes(GgmlType::Q6_K, 4096).unwrap()
        );
        assert_eq!((a.blocks, a.padded_blocks), (16, 16));
        assert!(l.grid.0 * l.block.0 >= a.total.min(32768 * THREADS));
        let (a, _) = args(GgmlType::Q8_0, 1, 2, 1, 96).expect("args");
        assert_eq!((a.blocks, a.padded_blocks, a.src_row), (3, 8, 102));
        assert!(args(GgmlType::Q6_K, 0, 0, 1 << 20, 1 << 14).is_err());
        assert!(kernel_name(GgmlType::F16).is_err());
    }
}
