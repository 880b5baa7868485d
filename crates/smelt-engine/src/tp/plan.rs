//! The tensor-parallel shard plan: for `n` ranks, which part of every tensor each rank holds,
//! as plain data computed from the model's shape and its tensors' block formats alone (no
//! backend, no device), so it can be tested on the CPU and shared by every runner.
//!
//! The split is Megatron's: Q/K/V, gate/up (and every other projection into a layer)
//! are column-parallel (each rank keeps whole heads / rows of the output), the attention
//! output, FFN down (and delta-net `ssm_out`) are row-parallel (each rank keeps the
//! matching input columns) and their partial sums are all-reduced. Everything else (norms,
//! embeddings, routers, the output head unless vocabulary-parallel) is replicated.
//!
//! - KV heads are split between ranks; with fewer KV heads than ranks, each KV head is
//!   replicated on the ranks that share it and its query heads are split among them.
//! - Delta-net layers (the hybrids) are split by key heads, each with the value heads that
//!   read it: the q/k/v channels of `attn_qkv` and `ssm_conv1d`, `attn_gate` (z), beta,
//!   alpha, `ssm_dt.bias` and `ssm_a` keep the rank's heads, `ssm_out` the matching columns
//!   (several runs for Qwen3.5's tiled value heads, where value head `h` reads key head
//!   `h % n_k`: the rank's value heads keep that mapping locally), `ssm_norm` (per head
//!   size) is whole. Each rank's recurrent state is its heads' (made by its own model).
//!   A key head is never split: fewer key heads than ranks is an error.
//! - Heads or rows that do not divide evenly are split unevenly (rank sizes differ by at
//!   most one unit), not padded: every rank computes its own shapes, and the all-reduced
//!   tensors are full width on every rank anyway. Only a rank left with nothing is an error.
//! - A row-parallel matrix in a block format can only be cut between blocks (a Q4_K row at
//!   multiples of 256 columns): split points are rounded to whole blocks (and to whole
//!   heads), and a plan that cannot keep them there is refused with an error that says why.
//! - `n = 1` gives a plan whose every slice is the whole tensor, so `--tp 1` runs the same
//!   code as `--tp 2`.

// A slice's rows are a list of ranges, often of one: `vec![a..b]` is meant.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use smelt_gguf::{GgmlType, Gguf};

use crate::model::ModelInfo;
use crate::EngineError;

/// Metadata of a rank's file with a vocabulary-parallel head: the first vocabulary row its
/// `output.weight` holds, and how many.
pub const VOCAB_START_KEY: &str = "smelt.tp.vocab_start";
pub const VOCAB_ROWS_KEY: &str = "smelt.tp.vocab_rows";

/// Options of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpOptions {
    pub n_ranks: usize,
    /// Split the output head's vocabulary rows between ranks (the logits are then
    /// gathered); otherwise every rank holds the whole head. A model without an
    /// `output.weight` of its own (tied embeddings: the head is `token_embd`, which every
    /// rank needs whole for the embedding lookup) keeps its head whole regardless.
    pub vocab_parallel: bool,
}

/// What one rank computes: ranges of the model's units it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankShape {
    /// Query heads (attention layers).
    pub q_heads: Range<usize>,
    /// KV heads (replicated on several ranks when there are fewer KV heads than ranks).
    pub kv_heads: Range<usize>,
    /// Rows of the dense FFN's gate/up (columns of down).
    pub ff: Range<usize>,
    /// Rows of each expert's gate/up (MoE).
    pub ff_exp: Range<usize>,
    /// Rows of the shared expert's gate/up (MoE with a shared expert).
    pub ff_shexp: Range<usize>,
    /// Key heads of delta-net layers (their value heads follow, see [`ShardPlan::delta_v`]).
    pub delta_k: Range<usize>,
    /// Rows of the output head (the whole vocabulary unless vocabulary-parallel).
    pub vocab: Range<usize>,
}

/// Where one tensor goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every rank holds all of it.
    Replicated,
    /// Each rank holds a part: one [`Slice`] per rank.
    Split(Vec<Slice>),
}

/// One rank's part of a tensor, in ggml terms: a row is `shape[0]` elements, rows are
/// every later dimension flattened (an expert tensor's rows run through all experts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Rows kept, in order (column-parallel: output features).
    pub rows: Vec<Range<usize>>,
    /// Columns kept of every kept row (row-parallel: input features), runs put side by
    /// side in order (one run but for tiled delta-net value heads); `None` keeps all.
    pub cols: Option<Vec<Range<usize>>>,
    /// The rank's tensor shape (ggml `ne` order).
    pub shape: Vec<u64>,
}

/// Which unit a tensor is split by, and along which axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Replicated,
    /// Output rows by query heads of `rows_per_head` rows (2x head size with a gate).
    QHeads,
    KvHeads,
    /// Input columns by query heads (attention output).
    QHeadCols,
    FfRows,
    FfCols,
    ExpRows,
    /// Fused `ffn_gate_up_exps`: each expert's gate rows then its up rows.
    ExpGateUpRows,
    ExpCols,
    ShexpRows,
    ShexpCols,
    /// The delta-net `[q, k, v]` channels (attn_qkv rows, conv1d rows).
    DeltaQkv,
    /// Rows per value head of `head_dim` rows (attn_gate = z).
    DeltaVRows,
    /// One row (or element) per value head (alpha, beta, dt bias, a).
    DeltaVOne,
    /// Input columns per value head (ssm_out).
    DeltaVCols,
    /// Fused per key-head group rows (`ssm_in`: `[q, k, v.., z..]` per key head).
    DeltaFusedIn,
    /// Fused per key-head group rows (`ssm_ba`: `[b.., a..]` per key head).
    DeltaFusedBa,
    VocabRows,
}

/// The plan for a model over `n_ranks` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardPlan {
    pub opts: TpOptions,
    pub info: ModelInfo,
    pub ranks: Vec<RankShape>,
}

/// Splits `total` units into `n` parts as even as the `align` grid allows: split points are
/// multiples of `align`. Errors when a part would be empty.
pub fn split_aligned(
    total: usize,
    n: usize,
    align: usize,
    what: &str,
) -> Result<Vec<Range<usize>>, EngineError> {
    let align = align.max(1);
    if n == 0 {
        return Err(EngineError::BadOptions(
            "tensor parallelism needs at least one rank".into(),
        ));
    }
    let mut points = vec![0];
    for r in 1..n {
        let ideal = total as f64 * r as f64 / n as f64;
        let p = ((ideal / align as f64).round() as usize * align).min(total);
        points.push(p);
    }
    points.push(total);
    let ranges: Vec<Range<usize>> = points.windows(2).map(|w| w[0]..w[1]).collect();
    if let Some(r) = ranges.iter().position(|r| r.is_empty()) {
        return Err(EngineError::BadOptions(format!(
            "--tp {n}: rank {r} would get no {what} ({total} of them, cut only at multiples of \
             {align}): use fewer ranks"
        )));
    }
    Ok(ranges)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Units of `unit_cols` columns per cut so that a cut lands on a block of `block` columns.
fn units_per_block(block: usize, unit_cols: usize) -> usize {
    block / gcd(block, unit_cols.max(1))
}

impl ShardPlan {
    /// The plan for `gguf`'s model. Checks every split tensor's block format.
    pub fn new(gguf: &Gguf, opts: TpOptions) -> Result<Self, EngineError> {
        let mut info = ModelInfo::from_gguf(gguf)?;
        // A shared expert whose size the metadata does not give: its tensors say it.
        if let Some(m) = info.moe.as_mut().filter(|m| m.n_ff_shared == 0) {
            m.n_ff_shared = gguf
                .tensors()
                .iter()
                .find(|t| t.name.starts_with("blk.") && t.name.ends_with(".ffn_up_shexp.weight"))
                .and_then(|t| t.shape.get(1))
                .map_or(0, |&r| r as usize);
        }
        let block_of = |suffix: &str| -> usize {
            // The largest block of any layer's tensor of this kind (formats may differ
            // between layers, as in Q4_K_M files).
            gguf.tensors()
                .iter()
                .filter(|t| t.name.ends_with(suffix) && t.name.starts_with("blk."))
                .map(|t| t.ty.block_size())
                .max()
                .unwrap_or(1)
        };
        let mut opts = opts;
        opts.vocab_parallel &= gguf.tensor("output.weight").is_some();
        let plan = Self::for_info(&info, opts, &block_of)?;
        plan.check(gguf)?;
        Ok(plan)
    }

    /// The plan from the shape alone; `block_of(".ffn_down.weight")` gives the block size of
    /// a row-parallel tensor kind (1 for float formats).
    pub fn for_info(
        info: &ModelInfo,
        opts: TpOptions,
        block_of: &dyn Fn(&str) -> usize,
    ) -> Result<Self, EngineError> {
        let n = opts.n_ranks;
        if n == 0 {
            return Err(EngineError::BadOptions("--tp must be at least 1".into()));
        }
        // Delta-net heads first: a hybrid that cannot be split says so about them.
        let delta_k = match &info.delta {
            Some(d) => split_delta_heads(d, n, block_of(".ssm_out.weight"))?,
            None => vec![0..0; n],
        };
        let hd = info.head_dim;
        // Attention: heads cut where attn_output's columns can be cut.
        let head_align = units_per_block(block_of(".attn_output.weight"), hd);
        let (q_heads, kv_heads) = split_heads(info.n_head, info.n_head_kv, n, head_align)?;
        let ff = split_aligned(
            info.n_ff,
            n,
            block_of(".ffn_down.weight"),
            "feed-forward rows",
        );
        let (ff_exp, ff_shexp) = match &info.moe {
            Some(m) => {
                let exp = split_aligned(
                    m.n_ff_exp,
                    n,
                    block_of(".ffn_down_exps.weight"),
                    "expert rows",
                )?;
                let sh = if m.n_ff_shared > 0 {
                    split_aligned(
                        m.n_ff_shared,
                        n,
                        block_of(".ffn_down_shexp.weight"),
                        "shared-expert rows",
                    )?
                } else {
                    vec![0..0; n]
                };
                (exp, sh)
            }
            None => (vec![0..0; n], vec![0..0; n]),
        };
        // A MoE model's dense `feed_forward_length` may describe no tensor at all.
        let ff = match (&info.moe, ff) {
            (_, Ok(f)) => f,
            (Some(_), Err(_)) => vec![0..info.n_ff; n],
            (None, Err(e)) => return Err(e),
        };
        let vocab = if opts.vocab_parallel {
            split_aligned(info.n_vocab, n, 1, "vocabulary rows")?
        } else {
            vec![0..info.n_vocab; n]
        };
        let ranks = (0..n)
            .map(|r| RankShape {
                q_heads: q_heads[r].clone(),
                kv_heads: kv_heads[r].clone(),
                ff: ff[r].clone(),
                ff_exp: ff_exp[r].clone(),
                ff_shexp: ff_shexp[r].clone(),
                delta_k: delta_k[r].clone(),
                vocab: vocab[r].clone(),
            })
            .collect();
        Ok(ShardPlan {
            opts,
            info: info.clone(),
            ranks,
        })
    }

    pub fn n_ranks(&self) -> usize {
        self.opts.n_ranks
    }

    /// The value heads a rank's delta-net key heads `k` read, as ranges.
    pub fn delta_v(&self, k: &Range<usize>) -> Vec<Range<usize>> {
        let Some(d) = &self.info.delta else {
            return Vec::new();
        };
        let per_k = d.n_v_heads / d.n_k_heads.max(1);
        if d.grouped_heads {
            vec![k.start * per_k..k.end * per_k]
        } else {
            // Value head h reads key head h % n_k: the rank's value heads are one run of
            // key heads per tile (runs that touch are one: all heads at one rank).
            let mut runs: Vec<Range<usize>> = Vec::with_capacity(per_k);
            for j in 0..per_k {
                let r = j * d.n_k_heads + k.start..j * d.n_k_heads + k.end;
                match runs.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => runs.push(r),
                }
            }
            runs
        }
    }

    fn role(&self, name: &str) -> Role {
        let Some(rest) = name.strip_prefix("blk.") else {
            return match name {
                "output.weight" => Role::VocabRows,
                _ => Role::Replicated,
            };
        };
        let Some((_, t)) = rest.split_once('.') else {
            return Role::Replicated;
        };
        let delta = self.info.delta.is_some();
        match t {
            "attn_q.weight" | "attn_q.bias" => Role::QHeads,
            "attn_k.weight" | "attn_k.bias" | "attn_v.weight" | "attn_v.bias" => Role::KvHeads,
            "attn_output.weight" => Role::QHeadCols,
            "ffn_gate.weight" | "ffn_up.weight" => Role::FfRows,
            "ffn_down.weight" => Role::FfCols,
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" => Role::ExpRows,
            "ffn_gate_up_exps.weight" => Role::ExpGateUpRows,
            "ffn_down_exps.weight" => Role::ExpCols,
            "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => Role::ShexpRows,
            "ffn_down_shexp.weight" => Role::ShexpCols,
            "attn_qkv.weight" | "ssm_conv1d.weight" if delta => Role::DeltaQkv,
            "attn_gate.weight" if delta => Role::DeltaVRows,
            "ssm_beta.weight" | "ssm_alpha.weight" | "ssm_dt.bias" | "ssm_a" => Role::DeltaVOne,
            "ssm_out.weight" => Role::DeltaVCols,
            "ssm_in.weight" => Role::DeltaFusedIn,
            "ssm_ba.weight" => Role::DeltaFusedBa,
            _ => Role::Replicated,
        }
    }

    /// Where the tensor `name` of shape `shape` (ggml order) goes. Errors for a tensor that
    /// must be split but cannot be (a fused layout this plan does not know).
    pub fn placement(&self, name: &str, shape: &[u64]) -> Result<Placement, EngineError> {
        let role = self.role(name);
        if role == Role::Replicated || (role == Role::VocabRows && !self.opts.vocab_parallel) {
            return Ok(Placement::Replicated);
        }
        let i = &self.info;
        let hd = i.head_dim;
        let q_rows = if i.attn_gate { 2 * hd } else { hd };
        let n_rows: usize = shape.iter().skip(1).product::<u64>() as usize;
        let mut out = Vec::with_capacity(self.ranks.len());
        for r in &self.ranks {
            let unit = |rg: &Range<usize>, per: usize| vec![rg.start * per..rg.end * per];
            // Rows of each matrix of a 3D expert tensor.
            let per_expert = |rg: &Range<usize>| -> Vec<Range<usize>> {
                let ne = shape.get(2).copied().unwrap_or(1) as usize;
                let m = shape.get(1).copied().unwrap_or(1) as usize;
                (0..ne).map(|x| x * m + rg.start..x * m + rg.end).collect()
            };
            let (rows, cols): (Vec<Range<usize>>, Option<Vec<Range<usize>>>) = match role {
                Role::Replicated => unreachable!(),
                Role::QHeads => (unit(&r.q_heads, q_rows), None),
                Role::KvHeads => (unit(&r.kv_heads, hd), None),
                Role::QHeadCols => (
                    vec![0..n_rows],
                    Some(vec![r.q_heads.start * hd..r.q_heads.end * hd]),
                ),
                Role::FfRows => (vec![r.ff.clone()], None),
                Role::FfCols => (vec![0..n_rows], Some(vec![r.ff.clone()])),
                Role::ExpRows => (per_expert(&r.ff_exp), None),
                Role::ExpGateUpRows => {
                    // Per expert `2 n_ff_exp` rows: the rank's gate rows, then its up rows.
                    let ne = shape.get(2).copied().unwrap_or(1) as usize;
                    let m = shape.get(1).copied().unwrap_or(1) as usize;
                    let half = m / 2;
                    let rg = &r.ff_exp;
                    let rows = (0..ne)
                        .flat_map(|x| {
                            [
                                x * m + rg.start..x * m + rg.end,
                                x * m + half + rg.start..x * m + half + rg.end,
                            ]
                        })
                        .collect();
                    (rows, None)
                }
                Role::ExpCols => (vec![0..n_rows], Some(vec![r.ff_exp.clone()])),
                Role::ShexpRows => (vec![r.ff_shexp.clone()], None),
                Role::ShexpCols => (vec![0..n_rows], Some(vec![r.ff_shexp.clone()])),
                Role::VocabRows => (vec![r.vocab.clone()], None),
                Role::DeltaQkv | Role::DeltaVRows | Role::DeltaVOne | Role::DeltaVCols => {
                    let d = i.delta.as_ref().expect("delta role without delta info");
                    let dh = d.head_dim;
                    let v = self.delta_v(&r.delta_k);
                    let scaled = |rs: &[Range<usize>], per: usize, off: usize| {
                        rs.iter()
                            .map(|x| off + x.start * per..off + x.end * per)
                            .collect::<Vec<_>>()
                    };
                    match role {
                        Role::DeltaQkv => {
                            let kd = d.n_k_heads * dh;
                            let mut rows = scaled(std::slice::from_ref(&r.delta_k), dh, 0);
                            rows.extend(scaled(std::slice::from_ref(&r.delta_k), dh, kd));
                            rows.extend(scaled(&v, dh, 2 * kd));
                            (rows, None)
                        }
                        Role::DeltaVRows => (scaled(&v, dh, 0), None),
                        Role::DeltaVOne => (scaled(&v, 1, 0), None),
                        // Tiled value heads (Qwen3.5) are several runs of columns, put
                        // side by side in the rank's value-head order.
                        _ => (vec![0..n_rows], Some(scaled(&v, dh, 0))),
                    }
                }
                Role::DeltaFusedIn | Role::DeltaFusedBa => {
                    let d = i.delta.as_ref().expect("delta role without delta info");
                    let per_group = n_rows / d.n_k_heads.max(1);
                    (unit(&r.delta_k, per_group), None)
                }
            };
            let kept_rows: usize = rows.iter().map(|x| x.len()).sum();
            let shape = if shape.len() <= 1 {
                // A vector: its elements are the "rows".
                vec![kept_rows as u64]
            } else {
                let mut s = shape.to_vec();
                if let Some(c) = &cols {
                    s[0] = c.iter().map(|x| x.len()).sum::<usize>() as u64;
                }
                if kept_rows != n_rows {
                    // Rows of a 3D tensor are per expert: the matrix height shrinks.
                    let outer: u64 = shape.iter().skip(2).product();
                    s[1] = kept_rows as u64 / outer.max(1);
                }
                s
            };
            out.push(Slice { rows, cols, shape });
        }
        Ok(Placement::Split(out))
    }

    /// Checks that every split tensor of `gguf` can be cut where the plan cuts it.
    pub fn check(&self, gguf: &Gguf) -> Result<(), EngineError> {
        for t in gguf.tensors() {
            let Placement::Split(slices) = self.placement(&t.name, &t.shape)? else {
                continue;
            };
            let bs = t.ty.block_size();
            for (r, s) in slices.iter().enumerate() {
                for c in s.cols.iter().flatten() {
                    if c.start % bs != 0 || (c.end % bs != 0 && c.end as u64 != t.row_len()) {
                        return Err(cut_error(&t.name, t.ty, c, r, self.n_ranks()));
                    }
                }
                if t.shape.len() <= 1 && bs != 1 {
                    return Err(EngineError::NotSupported(format!(
                        "{}: a {} vector cannot be split (--tp {})",
                        t.name,
                        t.ty.name(),
                        self.n_ranks()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Metadata keys a rank's file overrides: its head and row counts.
    pub fn rank_counts(&self, rank: usize) -> Vec<(String, u64)> {
        let a = self.info.arch.name();
        let r = &self.ranks[rank];
        let i = &self.info;
        let mut kv = vec![
            (format!("{a}.attention.head_count"), r.q_heads.len() as u64),
            (
                format!("{a}.attention.head_count_kv"),
                r.kv_heads.len() as u64,
            ),
            (format!("{a}.attention.key_length"), i.head_dim as u64),
            (format!("{a}.attention.value_length"), i.head_dim_v as u64),
            (format!("{a}.rope.dimension_count"), i.n_rot as u64),
            (format!("{a}.vocab_size"), i.n_vocab as u64),
        ];
        if i.moe.is_none() {
            kv.push((format!("{a}.feed_forward_length"), r.ff.len() as u64));
        }
        if let Some(m) = &i.moe {
            kv.push((
                format!("{a}.expert_feed_forward_length"),
                r.ff_exp.len() as u64,
            ));
            if m.n_ff_shared > 0 {
                kv.push((
                    format!("{a}.expert_shared_feed_forward_length"),
                    r.ff_shexp.len() as u64,
                ));
            }
        }
        if r.vocab.len() != i.n_vocab {
            // The rank's head rows (see `Model::load`): the first row's id and how many.
            kv.push((VOCAB_START_KEY.into(), r.vocab.start as u64));
            kv.push((VOCAB_ROWS_KEY.into(), r.vocab.len() as u64));
        }
        if let Some(d) = &i.delta {
            let per_k = d.n_v_heads / d.n_k_heads.max(1);
            let nk = r.delta_k.len();
            kv.push((format!("{a}.ssm.group_count"), nk as u64));
            kv.push((format!("{a}.ssm.time_step_rank"), (nk * per_k) as u64));
            kv.push((
                format!("{a}.ssm.inner_size"),
                (nk * per_k * d.head_dim) as u64,
            ));
        }
        kv
    }
}

fn cut_error(name: &str, ty: GgmlType, c: &Range<usize>, rank: usize, n: usize) -> EngineError {
    EngineError::NotSupported(format!(
        "--tp {n}: {name} is {} ({}-column blocks) and rank {rank} would hold columns \
         {}..{}, which cut a block; use another --tp, or requantize this tensor to a type \
         with smaller blocks (q8_0, q4_0: 32)",
        ty.name(),
        ty.block_size(),
        c.start,
        c.end
    ))
}

/// The delta-net key heads of each rank (each key head's value heads go with it, see
/// [`ShardPlan::delta_v`]), cut where `ssm_out`'s columns can be cut (blocks of
/// `out_block`). Errors, saying why and what would work, for a `--tp` that cannot split
/// the heads.
pub fn split_delta_heads(
    d: &crate::model::DeltaInfo,
    n: usize,
    out_block: usize,
) -> Result<Vec<Range<usize>>, EngineError> {
    if n == 1 {
        return Ok(vec![0..d.n_k_heads]);
    }
    let per_k = d.n_v_heads / d.n_k_heads.max(1);
    let dh = d.head_dim;
    let refuse = |why: String| {
        EngineError::BadOptions(format!(
            "--tp {n} cannot split this model's delta-net heads ({} key heads, {} value heads \
             of {dh}): {why}; use a --tp that divides the key heads{}",
            d.n_k_heads,
            d.n_v_heads,
            if out_block > 1 {
                format!(" into runs of whole {out_block}-column blocks of ssm_out")
            } else {
                String::new()
            }
        ))
    };
    if n > d.n_k_heads {
        return Err(refuse(
            "more ranks than key heads, and a key head's state is not split".into(),
        ));
    }
    // Grouped heads (Qwen3-Next): a rank's value columns are one run, `per_k` heads per key
    // head. Tiled (Qwen3.5): `per_k` runs, each of the rank's key heads' width, starting at
    // multiples of `n_k_heads` heads, which must themselves sit on blocks.
    let align = if d.grouped_heads || per_k == 1 {
        units_per_block(out_block, per_k * dh)
    } else {
        if !(d.n_k_heads * dh).is_multiple_of(out_block.max(1)) {
            return Err(refuse(format!(
                "tiled value heads put each rank's ssm_out columns in {per_k} runs {} columns \
                 apart, which is not a whole number of {out_block}-column blocks",
                d.n_k_heads * dh
            )));
        }
        units_per_block(out_block, dh)
    };
    split_aligned(d.n_k_heads, n, align, "delta-net key heads").map_err(|e| refuse(e.to_string()))
}

/// Query and KV head ranges, one of each per rank.
pub type HeadSplit = (Vec<Range<usize>>, Vec<Range<usize>>);

/// Query and KV head ranges per rank. With at least as many KV heads as ranks, KV heads
/// are split (their query heads follow); with fewer, each KV head is replicated on a run
/// of ranks that split its query heads. Query-head cuts are multiples of `align`.
pub fn split_heads(
    n_head: usize,
    n_kv: usize,
    n: usize,
    align: usize,
) -> Result<HeadSplit, EngineError> {
    let group = n_head / n_kv.max(1);
    if n_kv >= n {
        // Cut KV heads where the query heads they carry can be cut.
        let kv_align = align / gcd(align, group);
        let kv = split_aligned(n_kv, n, kv_align, "KV heads")?;
        let q = kv.iter().map(|r| r.start * group..r.end * group).collect();
        return Ok((q, kv));
    }
    let mut q = Vec::with_capacity(n);
    let mut kv = Vec::with_capacity(n);
    for j in 0..n_kv {
        let ranks = j * n / n_kv..(j + 1) * n / n_kv;
        let parts = split_aligned(group, ranks.len(), align, "query heads").map_err(|_| {
            EngineError::BadOptions(format!(
                "--tp {n}: KV head {j} of {n_kv} is shared by {} ranks, which cannot split its \
                 {group} query heads at multiples of {align} (the attention output's blocks): \
                 use fewer ranks",
                ranks.len()
            ))
        })?;
        for p in parts {
            q.push(j * group + p.start..j * group + p.end);
            kv.push(j..j + 1);
        }
    }
    if let Some((r, h)) = q
        .iter()
        .enumerate()
        .find(|(_, h)| !h.start.is_multiple_of(align.max(1)))
    {
        return Err(EngineError::BadOptions(format!(
            "--tp {n}: rank {r} would start at query head {}, not a multiple of {align}",
            h.start
        )));
    }
    Ok((q, kv))
}
