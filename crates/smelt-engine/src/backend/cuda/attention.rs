//! Glue from the backend's KV append and attention ops to their kernels
//! (`smelt_kernels::ops::kv`, `ops::attention`, `ops::flash`): which attention kernel a
//! step's sequences take, how its keys are split over the GPU and how the splits are
//! combined. Apart from `ops` because attention is the one op with several kernels and a
//! launch policy of its own.

use smelt_cuda::CudaError;
use smelt_kernels::fused::Sink;
use smelt_kernels::ops;

use super::ops::{args, u32_of, Arg};
use super::{Cuda, CudaKv, CudaTensor, StepPtrs};
use crate::backend::AttnParams;

impl Cuda {
    pub(crate) fn op_kv_write(
        &self,
        kv: &CudaKv,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        s: &StepPtrs,
    ) -> Result<(), CudaError> {
        let (kc, vc) = self.kv_layer(kv, layer, "kv_write")?;
        if k.cols != kv.kv_dim || v.cols != kv.kv_dim || k.rows != v.rows {
            return Err(CudaError::BadLength {
                what: "kv_write row",
                got: k.cols,
                want: kv.kv_dim,
            });
        }
        self.launch(
            ops::kv::KV_APPEND,
            ops::kv::launch(s.n_seqs, s.max_tokens, kv.kv_dim),
            &args(
                &ops::kv::KvAppendArgs {
                    k: k.ptr,
                    v: v.ptr,
                    k_cache: kc,
                    v_cache: vc,
                    seqs: s.descs,
                    block_tables: s.block_tables,
                    kv_dim: kv.kv_dim as u32,
                    block_size: kv.block_size as u32,
                }
                .values(),
            ),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        layer: usize,
        s: &StepPtrs,
        p: &AttnParams,
        out: &CudaTensor,
        tiles: Option<(u64, Sink)>,
        short_seqs: bool,
    ) -> Result<(), CudaError> {
        let (kc, vc) = self.kv_layer(kv, layer, "attention")?;
        if p.n_head_kv == 0
            || !p.n_head.is_multiple_of(p.n_head_kv)
            || q.cols != p.n_head * p.head_dim
            || kv.kv_dim != p.n_head_kv * p.head_dim
        {
            return Err(CudaError::BadLength {
                what: "attention heads",
                got: q.cols,
                want: p.n_head * p.head_dim,
            });
        }
        let window = u32_of(p.window.unwrap_or(0), "attention window")?;
        let Some(name) = ops::attention::name(p.head_dim) else {
            // A head size with no kernel of its own: the generic one, slower but correct.
            if !ops::attention::any_fits(p.head_dim) {
                return Err(CudaError::NoKernel(format!(
                    "attention for head_dim {} (kernels exist for {:?}, and the generic one takes up to {})",
                    p.head_dim,
                    ops::attention::HEAD_DIMS,
                    ops::attention::ANY_MAX_HEAD_DIM
                )));
            }
            let a = ops::attention::AnyArgs {
                q: q.ptr,
                k_cache: kc,
                v_cache: vc,
                seqs: s.descs,
                block_tables: s.block_tables,
                out: out.ptr,
                n_head: u32_of(p.n_head, "attention heads")?,
                n_head_kv: u32_of(p.n_head_kv, "attention kv heads")?,
                head_dim: u32_of(p.head_dim, "attention head_dim")?,
                block_size: u32_of(kv.block_size, "attention block size")?,
                window,
                scale: p.scale,
            };
            self.launch(
                ops::attention::ANY,
                ops::attention::any_launch(s.n_seqs, s.max_tokens, p.n_head),
                &args(&a.values()),
            )?;
            return self.sink_after(out, tiles);
        };
        // Prompt chunks: the tensor-core kernel, whole rows at once (no partials).
        if s.max_tokens >= self.flash_min_tokens(s.n_seqs) {
            if let Some(flash) = ops::flash::name(p.head_dim) {
                let min = self.flash_min_tokens(s.n_seqs) as u32;
                // A mixed step (decode rows beside prompt chunks): the split kernel takes
                // the short sequences first (it spreads a long context over many blocks,
                // where the prompt kernel would give it one), its reduce writes every row,
                // and the prompt kernel then writes the long sequences' rows over those
                // (it waits for the reduce at entry).
                if short_seqs {
                    self.split_attention(q, kc, vc, kv.block_size, s, p, name, out, None, min)?;
                }
                // The prompt kernel writes the f16 rows itself when it writes every row.
                let out16 = match tiles {
                    Some((t, Sink::F16Rows)) if !short_seqs => t,
                    _ => 0,
                };
                let a = ops::flash::Args {
                    q: q.ptr,
                    k_cache: kc,
                    v_cache: vc,
                    seqs: s.descs,
                    block_tables: s.block_tables,
                    out: out.ptr,
                    n_head: p.n_head as u32,
                    n_head_kv: p.n_head_kv as u32,
                    block_size: kv.block_size as u32,
                    window,
                    scale: p.scale,
                    min_tokens: if short_seqs { min } else { 0 },
                    out16,
                };
                let l = ops::flash::launch(s.n_seqs, s.max_tokens, p.n_head, p.n_head_kv);
                self.launch(flash, l, &args(&a.values()))?;
                return match out16 {
                    0 => self.sink_after(out, tiles),
                    _ => Ok(()),
                };
            }
        }
        self.split_attention(q, kc, vc, kv.block_size, s, p, name, out, tiles, 0)
    }

    /// `out`'s q8_1 tiles or f16 rows at `tiles`, as asked, by a launch of their own (for
    /// the attention kernels that do not write them).
    fn sink_after(&self, out: &CudaTensor, tiles: Option<(u64, Sink)>) -> Result<(), CudaError> {
        match tiles {
            Some((t, Sink::Q8_1)) => self.quantize_q8_1(out.ptr, t, out.cols, out.rows),
            Some((t, Sink::F16Rows)) => self.f16_rows_into(out, t),
            None => Ok(()),
        }
    }

    /// The split attention (`name`, one of `attention::name`'s) and its combine: in one
    /// launch when `tiles` are wanted and the combining kernel takes the shape, else the
    /// attention then the reduce (writing the tiles too when wanted). `skip_tokens`: the
    /// split kernel's (sequences of at least that many tokens left to the prompt kernel,
    /// whose rows the reduce then fills from stale partials until it overwrites them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_attention(
        &self,
        q: &CudaTensor,
        kc: u64,
        vc: u64,
        block_size: usize,
        s: &StepPtrs,
        p: &AttnParams,
        name: &str,
        out: &CudaTensor,
        tiles: Option<(u64, Sink)>,
        skip_tokens: u32,
    ) -> Result<(), CudaError> {
        let splits = self.splits(s.n_seqs, s.max_tokens, p);
        let (acc_len, ml_len) = ops::attention::partial_lens(q.rows, p.n_head, splits, p.head_dim);
        let acc = self.scratch(acc_len * 4)?;
        let ml = self.scratch(ml_len * 4)?;
        let q_tiles = ops::attention::q_tiles(s.max_tokens, p.n_head, p.n_head_kv);
        let a = ops::attention::Args {
            q: q.ptr,
            k_cache: kc,
            v_cache: vc,
            seqs: s.descs,
            block_tables: s.block_tables,
            part_acc: acc,
            part_ml: ml,
            n_head: p.n_head as u32,
            n_head_kv: p.n_head_kv as u32,
            block_size: block_size as u32,
            n_splits: splits as u32,
            q_tiles: u32_of(q_tiles, "attention q tiles")?,
            window: u32_of(p.window.unwrap_or(0), "attention window")?,
            scale: p.scale,
            stage_blocks: self.opts.attention.stage,
            skip_tokens,
        };
        let mut list = args(&a.values());
        let grid = ops::attention::launch(s.n_seqs, s.max_tokens, p.n_head, p.n_head_kv, splits);
        // The attention's last block per group combines and writes the tiles too.
        if let (Some((t, sink)), Some(counters)) = (tiles, self.combine_counters(s, p, splits)?) {
            let combine = ops::attention::combine_name(p.head_dim, sink).ok_or_else(|| {
                CudaError::NoKernel(format!("combining attention for head_dim {}", p.head_dim))
            })?;
            let c = ops::attention::CombineArgs {
                out: out.ptr,
                sink: t,
                counters,
            };
            list.extend(c.values().into_iter().map(Arg::from));
            return self.launch(combine, grid, &list);
        }
        self.launch(name, grid, &list)?;
        let l = ops::attention::reduce_launch(q.rows, p.n_head, p.head_dim);
        match tiles {
            // The combine also writes the q8_1 tiles or f16 rows the output projection
            // reads.
            Some((t, sink)) if ops::attention::reduce_q8_fits(p.n_head, p.head_dim) => self.launch(
                ops::attention::reduce_sink_name(sink),
                l,
                &args(
                    &ops::attention::ReduceQ8Args {
                        part_acc: acc,
                        part_ml: ml,
                        out: out.ptr,
                        q: t,
                        n_splits: splits as u32,
                        head_dim: p.head_dim as u32,
                    }
                    .values(),
                ),
            ),
            Some(_) => Err(CudaError::Init(format!(
                "attention_reduce_q8_1/_f16 do not take {} heads of {}",
                p.n_head, p.head_dim
            ))),
            None => self.launch(
                ops::attention::REDUCE,
                l,
                &args(
                    &ops::attention::ReduceArgs {
                        part_acc: acc,
                        part_ml: ml,
                        out: out.ptr,
                        n_splits: splits as u32,
                        head_dim: p.head_dim as u32,
                    }
                    .values(),
                ),
            ),
        }
    }

    /// The counters of the combining attention for this launch, or None when it does not
    /// apply (switched off, a shape it does not take, more groups than counters).
    pub(super) fn combine_counters(
        &self,
        s: &StepPtrs,
        p: &AttnParams,
        splits: usize,
    ) -> Result<Option<u64>, CudaError> {
        /// Counters allocated once: 256 KiB, far more groups than any decode step has.
        const COUNTERS: usize = 1 << 16;
        let groups =
            ops::attention::combine_counters(s.n_seqs, s.max_tokens, p.n_head, p.n_head_kv);
        if !self.opts.fuse.attn_combine
            || !ops::attention::combine_fits(p.n_head, p.head_dim, splits)
            || groups > COUNTERS
        {
            return Ok(None);
        }
        let mut c = super::lock(&self.held.attn_counters);
        if c.is_none() {
            *c = Some(self.gpu.zeros::<u32>(COUNTERS)?);
        }
        Ok(c.as_ref().map(|c| self.gpu.ptr(c)))
    }

    /// Key splits per (sequence, KV head): [`blocks_per_sm_splits`] for this step's
    /// sequences and query tiles, unless `SMELT_CUDA_SPLITS` sets them.
    pub(super) fn splits(&self, n_seqs: usize, max_tokens: usize, p: &AttnParams) -> usize {
        if let Some(n) = self.opts.attention.splits {
            return n.clamp(1, ops::attention::MAX_SPLITS);
        }
        // Batch-invariant: as many splits as for one sequence of one token, whatever the
        // batch.
        let (n_seqs, max_tokens) = match self.opts.batch_invariant {
            true => (1, 1),
            false => (n_seqs, max_tokens),
        };
        let q_tiles = ops::attention::q_tiles(max_tokens, p.n_head, p.n_head_kv);
        blocks_per_sm_splits(self.gpu.sm_count(), n_seqs * p.n_head_kv * q_tiles)
    }
}

/// Key splits for `groups` (sequence, KV head, query tile) blocks: at most one block per
/// multiprocessor, independent of sequence length (a graph captured at one length replays
/// at any). Fewer splits than the kernels' default (twice the SMs): at decode lengths each
/// split's partial output costs as much to write and combine as its keys cost to read
/// (H100, 2026-11-22: the combine step took more time than the attention itself at 64
/// splits). Rounded down: a block's staged keys leave room for one block per SM in the
/// kernels' carveout, and 17 x 8 blocks on 132 SMs ran four of them after the rest. The
/// query tiles count: Qwen3-30B-A3B's 8 query heads a KV head are two tiles, and 33 splits
/// of them were two waves of blocks (13.1 us a layer where Llama's 8 KV heads take 8.1).
pub(super) fn blocks_per_sm_splits(sm_count: usize, groups: usize) -> usize {
    (sm_count / groups.max(1)).clamp(4, 64)
}

#[cfg(test)]
mod tests {
    use super::blocks_per_sm_splits;
    use smelt_kernels::ops::attention::q_tiles;

    #[test]
    fn decode_splits_fill_one_wave_with_query_tiles_counted() {
        let h100 = 132;
        // Llama-3-8B: 32 query heads over 8 KV heads, one tile: 16 x 8 = 128 blocks.
        let llama = 8 * q_tiles(1, 32, 8);
        assert_eq!(blocks_per_sm_splits(h100, llama), 16);
        // Qwen3-30B-A3B: 32 over 4, two tiles: 16 splits (not 33, two waves).
        let qwen_moe = 4 * q_tiles(1, 32, 4);
        assert_eq!(qwen_moe, 8);
        assert_eq!(blocks_per_sm_splits(h100, qwen_moe), 16);
        for groups in [1, 3, 8, 16, 33, 132] {
            let s = blocks_per_sm_splits(h100, groups);
            assert!(s * groups <= h100 || s == 4, "{groups}: {s}");
        }
        // Many sequences: the floor of 4 splits.
        assert_eq!(blocks_per_sm_splits(h100, 32 * 8), 4);
    }
}
