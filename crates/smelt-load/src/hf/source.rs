//! Where each tensor of a converted Hugging Face folder comes from ([`Recipe`]), and the
//! folder as a [`TensorSource`].
//!
//! Why a recipe rather than converted bytes: a folder is tens of gigabytes and the ISQ
//! pipeline reads it in chunks, so copies and regroupings of rows (Llama's rope
//! permutation, Qwen3-Next's `in_proj_qkvz` split, Qwen3.5's value-head reorder, the two
//! halves of fused experts) are served piece by piece straight from the mapped shards,
//! never a whole tensor for one chunk. Only small tensors (norms, biases, the delta-net's
//! per-head vectors and convolution taps, routers) are converted to F32 whole.

use std::borrow::Cow;

use crate::isq::{SourceTensor, TensorSource};
use crate::safetensors::{Checkpoint, StTensor};
use crate::LoadError;

/// An output tensor as a regrouping of a source tensor's byte segments (rows, or groups of
/// columns): output segment `k` is source segment
/// `(k / out_period) * in_period + map[k % out_period]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Bytes per segment, in the source's dtype.
    pub seg: usize,
    pub out_period: usize,
    pub in_period: usize,
    pub map: Vec<u32>,
}

impl Gather {
    /// The rows of a tensor of `rows` rows of `row` bytes given by `map` (one period).
    pub fn rows(row: usize, rows: usize, map: Vec<u32>) -> Self {
        Self {
            seg: row,
            out_period: map.len(),
            in_period: rows,
            map,
        }
    }

    /// convert's `LlamaModel.permute` of a tensor of `rows` rows (`row` bytes each) in
    /// `heads` rope heads: within each head, rows `[j * half + i]` (j in 0..2, i in 0..half)
    /// move to `[i * 2 + j]`, turning HF's rotate-half layout into ggml's interleaved one.
    pub fn rope(row: usize, rows: u64, heads: u64) -> Result<Self, String> {
        if heads == 0 || rows % (heads * 2) != 0 {
            return Err(format!(
                "{rows} rows cannot be split into {heads} rope heads"
            ));
        }
        let hd = (rows / heads) as usize;
        let half = hd / 2;
        let map = (0..hd).map(|r| ((r % 2) * half + r / 2) as u32).collect();
        Ok(Self {
            seg: row,
            out_period: hd,
            in_period: hd,
            map,
        })
    }

    fn source(&self, k: usize) -> usize {
        (k / self.out_period) * self.in_period + self.map[k % self.out_period] as usize
    }

    /// Output bytes `offset..offset + buf.len()` from the source's bytes `src`.
    pub fn read(&self, src: &[u8], offset: usize, buf: &mut [u8]) -> Result<(), String> {
        let end = offset + buf.len();
        let (mut at, mut done) = (offset, 0);
        while at < end {
            let (k, within) = (at / self.seg, at % self.seg);
            let n = (self.seg - within).min(end - at);
            let from = self.source(k) * self.seg + within;
            let piece = src.get(from..from + n).ok_or_else(|| {
                format!(
                    "segment {k} comes from bytes {from}..{} of {}",
                    from + n,
                    src.len()
                )
            })?;
            buf[done..done + n].copy_from_slice(piece);
            at += n;
            done += n;
        }
        Ok(())
    }

    /// The first `len` output bytes.
    pub fn apply(&self, src: &[u8], len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        self.read(src, 0, &mut out)?;
        Ok(out)
    }
}

/// What convert does to a tensor's values on the way to F32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F32Op {
    Keep,
    /// The Qwen hybrids' RMS norms store `w` for a scale of `1 + w` (`+ 1`, in F32).
    AddOne,
    /// Qwen3-Next's `A_log` becomes `ssm_a = -exp(A_log)`, computed in f64 and rounded to
    /// f32 (convert's torch float32 exp may differ from that by an ulp).
    NegExp,
}

impl F32Op {
    fn apply(self, v: f32) -> f32 {
        match self {
            Self::Keep => v,
            Self::AddOne => v + 1.0,
            Self::NegExp => -(f64::from(v).exp() as f32),
        }
    }
}

/// How one output tensor is made from the checkpoint.
pub enum Recipe {
    /// The checkpoint tensor's bytes, regrouped when `gather` is set.
    Copy { src: usize, gather: Option<Gather> },
    /// A 1-D/norm tensor, bias, router or convolution converted to F32 (regrouped first).
    ToF32 {
        src: usize,
        gather: Option<Gather>,
        op: F32Op,
    },
    /// Bytes computed here (Llama 3's `rope_freqs`).
    Owned(Vec<u8>),
    /// Checkpoint tensors of one shape and dtype, one after the other (a layer's experts'
    /// matrices of one projection, in expert order).
    Stack { srcs: Vec<usize> },
}

/// The folder's tensors as a [`TensorSource`].
pub struct HfSource {
    pub(super) ckpt: Checkpoint,
    pub(super) st: Vec<StTensor>,
    pub(super) tensors: Vec<SourceTensor>,
    pub(super) recipes: Vec<Recipe>,
}

impl TensorSource for HfSource {
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError> {
        let (src, gather, op) = match &self.recipes[i] {
            Recipe::Owned(b) => return Ok(Cow::Borrowed(b)),
            Recipe::Stack { srcs } => {
                let mut out = Vec::new();
                for &s in srcs {
                    out.extend_from_slice(self.ckpt.bytes(&self.st[s]));
                }
                return Ok(Cow::Owned(out));
            }
            Recipe::Copy { src, gather } => (*src, gather, None),
            Recipe::ToF32 { src, gather, op } => (*src, gather, Some(*op)),
        };
        let st = &self.st[src];
        let bad = |why: String| LoadError::BadTensor {
            name: st.name.clone(),
            why,
        };
        let ty = st.ggml_type()?;
        let n: u64 = self.tensors[i].shape.iter().product();
        let mut bytes = Cow::Borrowed(self.ckpt.bytes(st));
        if let Some(g) = gather {
            let len = n as usize * ty.type_size();
            bytes = Cow::Owned(g.apply(&bytes, len).map_err(bad)?);
        }
        let Some(op) = op else {
            return Ok(bytes);
        };
        let mut vals = vec![0f32; bytes.len() / ty.type_size()];
        smelt_quant::dequantize_row(ty, &bytes, &mut vals).map_err(|e| bad(e.to_string()))?;
        Ok(Cow::Owned(
            vals.iter()
                .flat_map(|&v| op.apply(v).to_le_bytes())
                .collect(),
        ))
    }

    /// Copied weights (nearly all of a folder's bytes) come straight from their shard by
    /// parallel reads, or piece by piece when regrouped; converted vectors through `data`.
    fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        match &self.recipes[i] {
            Recipe::Copy { src, gather: None } => self.ckpt.read_at(&self.st[*src], offset, buf),
            Recipe::Copy {
                src,
                gather: Some(g),
            } => {
                let st = &self.st[*src];
                let t = &self.tensors[i];
                let len = t.shape.iter().product::<u64>() * t.ty.type_size() as u64;
                let end = offset + buf.len() as u64;
                let bad = |why: String| LoadError::BadTensor {
                    name: st.name.clone(),
                    why,
                };
                if end > len {
                    return Err(bad(format!("bytes {offset}..{end} past its {len} bytes")));
                }
                g.read(self.ckpt.bytes(st), offset as usize, buf)
                    .map_err(bad)
            }
            Recipe::Stack { srcs } => self.read_stack(srcs, offset, buf),
            _ => {
                let d = self.data(i)?;
                buf.copy_from_slice(crate::isq::byte_range(&d, i, offset, buf.len())?);
                Ok(())
            }
        }
    }
}

impl HfSource {
    /// `buf` from a stack of equal-sized tensors at `offset`: each piece straight from its
    /// member's shard.
    fn read_stack(&self, srcs: &[usize], offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        let each = srcs
            .first()
            .map_or(0, |&s| self.ckpt.bytes(&self.st[s]).len() as u64);
        let total = each * srcs.len() as u64;
        let end = offset + buf.len() as u64;
        if end > total {
            let name = srcs
                .first()
                .map_or(String::new(), |&s| self.st[s].name.clone());
            return Err(LoadError::BadTensor {
                name,
                why: format!("bytes {offset}..{end} past the stack's {total} bytes"),
            });
        }
        let (mut at, mut done) = (offset, 0usize);
        while done < buf.len() {
            let (k, within) = ((at / each) as usize, at % each);
            let n = ((each - within) as usize).min(buf.len() - done);
            self.ckpt
                .read_at(&self.st[srcs[k]], within, &mut buf[done..done + n])?;
            at += n as u64;
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, 1 byte per row: [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let g = Gather::rope(1, 8, 2).expect("permutes");
        let out = g.apply(&[0, 1, 2, 3, 10, 11, 12, 13], 8).expect("applies");
        assert_eq!(out, [0, 2, 1, 3, 10, 12, 11, 13]);
        assert!(Gather::rope(1, 6, 2).is_err());
        // Read in pieces that cross rows (2 bytes a row).
        let g = Gather::rope(2, 4, 1).expect("permutes");
        let src = [0, 1, 2, 3, 4, 5, 6, 7];
        let mut buf = [0u8; 3];
        g.read(&src, 1, &mut buf).expect("reads");
        assert_eq!(buf, [1, 4, 5]);
    }

    #[test]
    fn periods_regroup_blocks() {
        // Two blocks of 4 rows; each output block takes rows 2 and 3 of its input block.
        let g = Gather {
            seg: 1,
            out_period: 2,
            in_period: 4,
            map: vec![2, 3],
        };
        assert_eq!(
            g.apply(&[0, 1, 2, 3, 4, 5, 6, 7], 4).expect("applies"),
            [2, 3, 6, 7]
        );
        assert!(g.apply(&[0, 1, 2, 3], 4).is_err(), "past the source");
    }

    #[test]
    fn f32_ops() {
        assert_eq!(F32Op::AddOne.apply(0.5), 1.5);
        assert_eq!(F32Op::NegExp.apply(0.0), -1.0);
        assert_eq!(F32Op::NegExp.apply(1.0), -std::f32::consts::E);
    }
}
