//! Attention over the paged f16 KV cache, flash-decoding style: each sequence's keys are
//! split over a fixed number of blocks (`n_splits`, a launch constant, so the grid never
//! depends on a sequence's length), each block computes a partial softmax (max, sum,
//! weighted values) per query head, and [`reduce_kernel`] combines the partials.
//!
//! Causal, with grouped-query heads (`n_head` a multiple of `n_head_kv`), an optional
//! sliding window, several query tokens per sequence (prefill chunks: the causal mask
//! holds inside the chunk) and sequences at different positions in one batch. Every head
//! size of [`HEAD_DIMS`] (multiples of 16 from 64 to 256) has a kernel, generated from
//! one body ([`Lanes`] says how a warp holds a head); [`any_kernel`] takes any other head
//! size up to [`ANY_MAX_HEAD_DIM`], slowly, so a model never stops for want of a kernel.
//!
//! Precision follows the CPU backend where it matters: the query is rounded to f16 (as
//! ggml converts the f32 operand of its f16 K·Q), K and V are f16, everything else is
//! f32; the softmax runs in base 2 (`ex2.approx`, relative error ~2^-22) with the scale
//! folded in. The one difference from the CPU backend: it rounds the normalized
//! probabilities to f16 before weighting V, which a split softmax cannot (it normalizes
//! last); that is below 1e-3 relative.
//!
//! This file holds the split kernel ([`kernel`]) and its combining variant
//! ([`combine_kernel`]), their launch helpers and the CPU twin ([`attention_cpu`]). The
//! reduce kernels live in `attention_reduce.rs` and the any-head-size kernel in
//! `attention_any.rs`; both are re-exported here, so every path stays
//! `ops::attention::...`.

use smelt_ptx::{
    Addr, Cmp, Exact, FloatRound, Kernel, Load, LoadCache, Pred, Reg, Scope, Shfl, Space, Store,
    F16, F32, FULL_WARP, U32, U64,
};

use super::kv::SeqDesc;
use super::{bfly, dim, kernel_params, Launch, LOG2E};
use crate::catalog::Entry;
use crate::fused::Sink;

pub use super::attention_any::{
    any_fits, any_kernel, any_launch, AnyArgs, ANY, ANY_MAX_HEAD_DIM, ANY_THREADS,
};
pub use super::attention_reduce::{
    reduce_kernel, reduce_launch, reduce_q8_fits, reduce_sink_kernel, reduce_sink_name, ReduceArgs,
    ReduceQ8Args, MAX_SPLITS, REDUCE, REDUCE_F16, REDUCE_Q8, REDUCE_THREADS,
};

/// Head sizes with an attention kernel: every multiple of 16 from 64 to 256.
pub const HEAD_DIMS: [usize; 13] = [64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256];

/// The kernels of each head size: the attention, and the combining attention where the
/// head is whole q8_1 blocks (a multiple of 32 values; see [`reduce_q8_fits`]), writing
/// q8_1 tiles or f16 rows (in [`Sink::ALL`]'s order).
type KernelRow = (usize, &'static str, Option<[&'static str; 2]>);
const KERNELS: [KernelRow; 13] = [
    (
        64,
        "attention_hd64",
        Some(["attention_hd64_combine_q8_1", "attention_hd64_combine_f16"]),
    ),
    (80, "attention_hd80", None),
    (
        96,
        "attention_hd96",
        Some(["attention_hd96_combine_q8_1", "attention_hd96_combine_f16"]),
    ),
    (112, "attention_hd112", None),
    (
        128,
        "attention_hd128",
        Some([
            "attention_hd128_combine_q8_1",
            "attention_hd128_combine_f16",
        ]),
    ),
    (144, "attention_hd144", None),
    (
        160,
        "attention_hd160",
        Some([
            "attention_hd160_combine_q8_1",
            "attention_hd160_combine_f16",
        ]),
    ),
    (176, "attention_hd176", None),
    (
        192,
        "attention_hd192",
        Some([
            "attention_hd192_combine_q8_1",
            "attention_hd192_combine_f16",
        ]),
    ),
    (208, "attention_hd208", None),
    (
        224,
        "attention_hd224",
        Some([
            "attention_hd224_combine_q8_1",
            "attention_hd224_combine_f16",
        ]),
    ),
    (240, "attention_hd240", None),
    (
        256,
        "attention_hd256",
        Some([
            "attention_hd256_combine_q8_1",
            "attention_hd256_combine_f16",
        ]),
    ),
];

/// Warps per block: each warp owns one (query token, query head) pair.
pub const WARPS: u32 = 4;

/// How a warp's 32 lanes hold one head of `head_dim` f16 values (K, V and query rows):
/// in chunks of `vec` words (two values a word, loaded together), chunk `c` in lane
/// `c % 32` at slot `c / 32`. Lanes past the last chunk of a slot load the last chunk
/// again (so every load stays inside the head) and count for nothing: their query is
/// zero and their sums are never stored. For 64, 128 and 256 values this is one slot of
/// 1, 2 and 4 words, each lane's values contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// Words (pairs of halves) per chunk: 1, 2 or 4.
    pub vec: usize,
    /// Chunks of the head.
    pub chunks: usize,
    /// Chunks per lane (the last slot may be partial).
    pub slots: usize,
}

impl Lanes {
    /// The layout with the fewest words per lane (the latency of a key's dot product), then
    /// the widest loads. `head_dim` must be even.
    pub fn new(head_dim: usize) -> Self {
        let words = head_dim / 2;
        let mut best: Option<Lanes> = None;
        for vec in [4, 2, 1] {
            if words % vec != 0 {
                continue;
            }
            let chunks = words / vec;
            let l = Lanes {
                vec,
                chunks,
                slots: chunks.div_ceil(32),
            };
            if best.is_none_or(|b| l.words() < b.words()) {
                best = Some(l);
            }
        }
        best.unwrap_or(Lanes {
            vec: 1,
            chunks: 0,
            slots: 0,
        })
    }

    /// Words each lane holds.
    pub fn words(&self) -> usize {
        self.slots * self.vec
    }

    /// Values each lane holds.
    pub fn values(&self) -> usize {
        2 * self.words()
    }

    /// Whether every lane holds a chunk of the head at slot `s`.
    pub fn full(&self, s: usize) -> bool {
        (s + 1) * 32 <= self.chunks
    }

    /// The index in the head of value `i` (`0..values()`) of lane `lane`, or None where the
    /// lane holds no chunk there.
    pub fn value_index(&self, lane: usize, i: usize) -> Option<usize> {
        let per = 2 * self.vec;
        let c = (i / per) * 32 + lane;
        (c < self.chunks).then_some(c * per + i % per)
    }
}

/// Keys loaded together per warp (memory-level parallelism of the inner loop): 16 where
/// the registers allow (up to two words a lane), else 8.
fn keys_per_step(head_dim: usize) -> usize {
    if Lanes::new(head_dim).words() > 2 {
        8
    } else {
        16
    }
}

/// Bytes of shared memory a block stages its split's keys and values in (see [`body`]):
/// with the combine's 5 KB and the 1 KB the hardware keeps per block, under 32 KB, so
/// the kernel runs in an SM whose carveout is 32 KB of shared memory.
const STAGE_BYTES: usize = 24 * 1024;

/// KV-cache slots a block stages: each holds a K row and a V row of `head_dim` halves.
fn stage_slots(head_dim: usize) -> usize {
    STAGE_BYTES / (4 * head_dim)
}

/// Name of the attention kernel for heads of `head_dim`.
pub fn name(head_dim: usize) -> Option<&'static str> {
    KERNELS.iter().find(|e| e.0 == head_dim).map(|&(_, n, _)| n)
}

/// Most splits [`combine_kernel`] takes (two per lane).
pub const COMBINE_MAX_SPLITS: usize = 64;

/// Name of [`combine_kernel`] for heads of `head_dim` (multiples of 32 only) writing
/// `sink`'s form.
pub fn combine_name(head_dim: usize, sink: Sink) -> Option<&'static str> {
    KERNELS
        .iter()
        .find(|e| e.0 == head_dim)
        .and_then(|&(_, _, n)| n)
        .map(|n| n[sink as usize])
}

/// Whether [`combine_kernel`] takes this shape: what [`reduce_q8_fits`] takes, and at most
/// [`COMBINE_MAX_SPLITS`] splits.
pub fn combine_fits(n_head: usize, head_dim: usize, n_splits: usize) -> bool {
    reduce_q8_fits(n_head, head_dim)
        && combine_name(head_dim, Sink::Q8_1).is_some()
        && (1..=COMBINE_MAX_SPLITS).contains(&n_splits)
}

/// Counters [`combine_kernel`] uses for a launch of `n_seqs` sequences of at most
/// `max_tokens` tokens: one per block group `(z, KV head)`.
pub fn combine_counters(
    n_seqs: usize,
    max_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
) -> usize {
    n_seqs * q_tiles(max_tokens, n_head, n_head_kv) * n_head_kv
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for &(hd, n, _) in &KERNELS {
        v.push((n.to_string(), Box::new(move |k: &Kernel| kernel(k, hd))));
    }
    for &(hd, _, c) in &KERNELS {
        if let Some(names) = c {
            for (name, sink) in names.into_iter().zip(Sink::ALL) {
                v.push((
                    name.to_string(),
                    Box::new(move |k: &Kernel| combine_kernel(k, hd, sink)),
                ));
            }
        }
    }
    v.push((REDUCE.to_string(), Box::new(reduce_kernel)));
    for sink in Sink::ALL {
        v.push((
            reduce_sink_name(sink).to_string(),
            Box::new(move |k: &Kernel| reduce_sink_kernel(k, sink)),
        ));
    }
    v.push((ANY.to_string(), Box::new(any_kernel)));
    v
}

/// Blocks along z per sequence: enough warps for `max_tokens` tokens of `group` heads.
pub fn q_tiles(max_tokens: usize, n_head: usize, n_head_kv: usize) -> usize {
    let group = n_head / n_head_kv.max(1);
    (max_tokens.max(1) * group.max(1)).div_ceil(WARPS as usize)
}

kernel_params! {
    /// The parameters of [`kernel`] (and the first ones of [`combine_kernel`]), in order.
    /// `q: *const f32 ([rows][n_head * head_dim]), k_cache, v_cache: *const f16` (the
    /// layer's caches, see [`super::kv`]), `seqs: *const SeqDesc, block_tables: *const
    /// u32, part_acc, part_ml: *mut f32` (see [`partial_lens`]); `q_tiles` is
    /// [`q_tiles`]; `window`: 0 none, else keys at least `window` positions behind the
    /// query are masked; `stage_blocks`: most KV blocks of its split a block copies into
    /// shared memory before its key loop (at most 32 and what 24 KB hold; 0: none, every
    /// key read from the cache in the loop); `skip_tokens`: 0 none, else the sequences of
    /// at least this many query tokens are left to the prompt kernel ([`super::flash`],
    /// launched after the reduce): their blocks do nothing.
    Args, ArgRegs {
        q: Ptr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        part_acc: Ptr,
        part_ml: Ptr,
        n_head: U32,
        n_head_kv: U32,
        block_size: U32,
        n_splits: U32,
        q_tiles: U32,
        window: U32,
        scale: F32,
        stage_blocks: U32,
        skip_tokens: U32,
    }
}

kernel_params! {
    /// The parameters [`combine_kernel`] takes after [`Args`]': `out: *mut f32
    /// ([rows][n_head * head_dim])`, `sink: *mut u8` (the q8_1 tiles or f16 rows of each
    /// row, as the kernel's [`Sink`] says),
    /// `counters: *mut u32` ([`combine_counters`] words, zero before the first launch;
    /// every launch leaves them zero).
    CombineArgs, CombineRegs {
        out: Ptr,
        sink: Ptr,
        counters: Ptr,
    }
}

/// Launch of the attention kernel for `n_seqs` sequences of at most `max_tokens` query
/// tokens each; pass `q_tiles(max_tokens, n_head, n_head_kv)` as the kernel's `q_tiles`.
pub fn launch(
    n_seqs: usize,
    max_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
    n_splits: usize,
) -> Launch {
    Launch::new(
        (
            dim(n_splits),
            dim(n_head_kv),
            dim(n_seqs * q_tiles(max_tokens, n_head, n_head_kv)),
        ),
        (32, WARPS, 1),
    )
}

/// Floats of the partial accumulators and of the partial (max, sum) pairs for `rows`
/// query rows: `(acc, ml)`.
pub fn partial_lens(
    rows: usize,
    n_head: usize,
    n_splits: usize,
    head_dim: usize,
) -> (usize, usize) {
    let n = rows * n_head * n_splits;
    (n * head_dim, n * 2)
}

/// A split count for `n_seqs` sequences when their context is not known: about four
/// blocks per multiprocessor (`sms`), at most 64. Measured on an H100 at Llama-3-8B
/// decode shape (`bench/RESULTS.md`): fewer blocks leave the GPU latency bound (one
/// sequence at 4096 keys: 46 us with 16 splits, 24 us with 64), more add partials to
/// combine (64 sequences: 220 us with 1-8 splits, 300 us with 64).
pub fn default_splits(n_seqs: usize, n_head_kv: usize, sms: usize) -> usize {
    (4 * sms).div_ceil((n_seqs * n_head_kv).max(1)).clamp(1, 64)
}

/// [`default_splits`], but no more splits than blocks of 16 keys in `max_ctx` (short
/// contexts: one sequence at 512 keys took 11 us with 32 splits, 14 us with 64). The grid
/// still does not depend on any sequence's length: a graph captured with this count
/// replays correctly at any length, only less well tuned.
pub fn splits_for_context(n_seqs: usize, n_head_kv: usize, sms: usize, max_ctx: usize) -> usize {
    default_splits(n_seqs, n_head_kv, sms)
        .min(max_ctx.div_ceil(16))
        .max(1)
}

/// Unpacks the two halves of a 32-bit word into f32 (low half first).
fn halves(k: &Kernel, w: Reg<U32>) -> [Reg<F32>; 2] {
    let (a, b) = (k.reg::<F16>(), k.reg::<F16>());
    k.raw(format!("mov.b32 {{{a}, {b}}}, {w}"));
    [a, b].map(|h| k.cvt(k.reg::<F32>(), h, Exact))
}

/// Loads `e` consecutive halves (`e` = 2, 4 or 8) as words.
fn load_halves(k: &Kernel, op: Load, addr: impl Into<Addr>, e: usize) -> Vec<Reg<U32>> {
    match e {
        2 => vec![k.load::<U32>(op, addr)],
        4 => {
            let w = k.regs::<U32, 2>();
            k.ld_v2(op, w, addr);
            w.to_vec()
        }
        _ => {
            let w = k.regs::<U32, 4>();
            k.ld_v4(op, w, addr);
            w.to_vec()
        }
    }
}

/// The attention kernel for heads of `head_dim` values (one of [`HEAD_DIMS`]).
///
/// Parameters: [`Args`]. Launch: [`launch`]: grid x = split, y = KV head, z = sequence ×
/// query tile; blocks of [`WARPS`] warps. Each warp takes one (token, query head) pair of
/// its sequence and KV head, and the blocks of the sequence's visible key range
/// `[first, kv_len)` are divided evenly among the splits. Partial `(row, head, split)` is
/// at index `(row * n_head + head) * n_splits + split`: `head_dim` floats of unnormalized
/// output and the pair (max of the base-2 scores, sum of their powers); a split with no
/// visible key writes (-inf, 0) and zeros.
pub fn kernel(k: &Kernel, head_dim: usize) {
    body(k, head_dim, None);
}

/// [`kernel`] and [`reduce_sink_kernel`] in one launch: the last block of each `(z, KV head)`
/// group to finish (a counter per group, `atom.add` after a GPU-scope fence; the last
/// block puts it back to zero) combines the group's partials, writes the output rows and
/// their q8_1 tiles. At decode the combine was a launch of its own per layer, a few
/// microseconds of latency for a few kilobytes.
///
/// Parameters: [`Args`], then [`CombineArgs`]. Only for shapes [`combine_fits`] accepts.
/// Launch: [`launch`].
pub fn combine_kernel(k: &Kernel, head_dim: usize, sink: Sink) {
    body(k, head_dim, Some(sink));
}

/// A lane's chunks of a head ([`Lanes`]) as the kernel addresses them: the byte offset of
/// its first chunk (`base`, clamped into the head) and, per slot, how far the slot's chunk
/// is from it, a constant where every lane of the slot holds a chunk, else a register
/// (clamped), with the predicate of the lanes that do.
struct LaneChunks {
    lanes: Lanes,
    base: Reg<U32>,
    slots: Vec<(SlotOffset, Option<Reg<Pred>>)>,
}

#[derive(Clone, Copy)]
enum SlotOffset {
    Const(i64),
    /// The distance as a 32-bit and a 64-bit register.
    Reg(Reg<U32>, Reg<U64>),
}

impl LaneChunks {
    /// Offsets in units of `unit` bytes per value (2 for f16 rows, 4 for f32 ones).
    fn new(k: &Kernel, lanes: Lanes, lane: Reg<U32>, unit: u32) -> Self {
        let per = 2 * lanes.vec as u32 * unit; // bytes of a chunk
        let last = lanes.chunks as u32 - 1;
        let base = if lanes.full(0) {
            k.mul(k.reg(), lane, per)
        } else {
            let c = k.min(k.reg(), lane, last);
            k.mul(k.reg(), c, per)
        };
        let slots = (0..lanes.slots)
            .map(|s| {
                let delta = (s as u32 * 32 * per) as i64;
                if lanes.full(s) {
                    (SlotOffset::Const(delta), None)
                } else {
                    // The lane's chunk, or the last one: its distance from `base` (slot 0
                    // is full whenever there is a later slot).
                    let c = k.add(k.reg(), lane, 32 * s as u32);
                    let valid = k.lt(c, lanes.chunks as u32);
                    k.min(c, c, last);
                    let off = k.mul(k.reg(), c, per);
                    k.sub(off, off, base);
                    let wide = k.cvt(k.reg::<U64>(), off, Exact);
                    (SlotOffset::Reg(off, wide), Some(valid))
                }
            })
            .collect();
        Self { lanes, base, slots }
    }

    /// The address of slot `s`'s chunk from a 64-bit address `at` of the lane's first one.
    fn global(&self, k: &Kernel, at: Reg<U64>, s: usize) -> Addr {
        match self.slots[s].0 {
            SlotOffset::Const(d) => at.at(d),
            SlotOffset::Reg(_, wide) => k.add(k.reg(), at, wide).at(0),
        }
    }

    /// The address of slot `s`'s chunk from a shared-window address `at` of the lane's
    /// first one.
    fn shared(&self, k: &Kernel, at: Reg<U32>, s: usize) -> Addr {
        match self.slots[s].0 {
            SlotOffset::Const(d) => at.at(d),
            SlotOffset::Reg(r, _) => k.add(k.reg(), at, r).at(0),
        }
    }

    /// Loads the lane's words of a head whose lane's first chunk is at `at` (global).
    fn load_global(&self, k: &Kernel, op: Load, at: Reg<U64>) -> Vec<Reg<U32>> {
        (0..self.lanes.slots)
            .flat_map(|s| load_halves(k, op, self.global(k, at, s), 2 * self.lanes.vec))
            .collect()
    }

    /// Loads the lane's words of a head whose lane's first chunk is at `at` (shared).
    fn load_shared(&self, k: &Kernel, at: Reg<U32>) -> Vec<Reg<U32>> {
        (0..self.lanes.slots)
            .flat_map(|s| load_halves(k, Load::SHARED, self.shared(k, at, s), 2 * self.lanes.vec))
            .collect()
    }

    /// Runs `f(k, slot, addr)` for each slot, guarded by the slot's predicate, with the
    /// address of the lane's chunk from the 64-bit address `at` of its first.
    fn each_global(&self, k: &Kernel, at: Reg<U64>, f: impl Fn(&Kernel, usize, Addr)) {
        for s in 0..self.lanes.slots {
            let a = self.global(k, at, s);
            match self.slots[s].1 {
                Some(valid) => k.if_(valid, |k| f(k, s, a)),
                None => f(k, s, a),
            }
        }
    }
}

fn body(k: &Kernel, head_dim: usize, combine: Option<Sink>) {
    if !HEAD_DIMS.contains(&head_dim) {
        k.reject(format!("no attention kernel for head_dim {head_dim}"));
        return;
    }
    if combine.is_some() && head_dim % 32 != 0 {
        k.reject(format!(
            "no combining attention for head_dim {head_dim}: its q8_1 blocks span heads"
        ));
        return;
    }
    // One block per SM is all ptxas needs to plan for: with the thread cap alone it aimed
    // at more and spilled (hd128 on sm_80).
    k.max_threads(32, WARPS, 1);
    k.min_blocks_per_sm(1);
    let lanes = Lanes::new(head_dim);
    let e = lanes.values();
    let keys = keys_per_step(head_dim);
    let ArgRegs {
        q,
        k_cache: kc,
        v_cache: vc,
        seqs,
        block_tables: tables,
        part_acc,
        part_ml,
        n_head,
        n_head_kv,
        block_size: bs,
        n_splits,
        q_tiles,
        window,
        scale,
        stage_blocks,
        skip_tokens,
    } = ArgRegs::declare(k);
    let fused = combine.map(|sink| (CombineRegs::declare(k), sink));

    let lane = k.tid_x();
    let warp = k.tid_y();
    let split = k.ctaid_x();
    let kvh = k.ctaid_y();
    let z = k.special(smelt_ptx::Special::Ctaid(smelt_ptx::Dim::Z));
    let seq = k.div_int(k.reg(), z, q_tiles);
    let tile = k.rem(k.reg(), z, q_tiles);
    let dw = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, dw, k.elem_addr(seqs, seq, 16));
    let [row0, n_tokens, start, bto] = dw;
    // A sequence the prompt kernel takes: every block of it leaves (so no group counter
    // of the combine moves either).
    let skip = k.ge(n_tokens, skip_tokens);
    let on = k.cmp(Cmp::Ne, skip_tokens, 0u32);
    k.and(skip, skip, on);
    k.exit_if(skip);
    let group = k.div_int(k.reg(), n_head, n_head_kv);
    let item = k.mad(k.reg(), tile, WARPS, warp);
    let t = k.div_int(k.reg(), item, group);
    // Every warp stays to the end (the blocks meet at barriers: the staging, the
    // combine): a warp past the sequence's tokens takes the last one's place and stores
    // nothing.
    let active = k.lt(t, n_tokens);
    let last_t = k.sub(k.reg(), n_tokens, 1u32);
    k.min(t, t, last_t);
    let g = k.rem(k.reg(), item, group);
    let head = k.mad(k.reg(), kvh, group, g);
    let row = k.add(k.reg(), row0, t);
    let pos_q = k.add(k.reg(), start, t);
    let kv_len = k.add(k.reg(), start, n_tokens);

    // first visible position of the sequence (any query) and of this query.
    let first = behind(k, start, window);
    let lo_q = behind(k, pos_q, window);
    let b_first = k.div_int(k.reg(), first, bs);
    let b_end = k.add(k.reg(), kv_len, bs);
    k.sub(b_end, b_end, 1u32);
    k.div_int(b_end, b_end, bs);
    let nb = k.sub(k.reg(), b_end, b_first);
    let cb = k.add(k.reg(), nb, n_splits);
    k.sub(cb, cb, 1u32);
    k.div_int(cb, cb, n_splits);
    let sb = k.mad(k.reg(), split, cb, b_first);
    let eb = k.add(k.reg(), sb, cb);
    k.min(eb, eb, b_end);
    // This query's blocks inside the split.
    let qb_lo = k.div_int(k.reg(), lo_q, bs);
    k.max(qb_lo, qb_lo, sb);
    let qb_hi = k.div_int(k.reg(), pos_q, bs);
    k.add(qb_hi, qb_hi, 1u32);
    k.min(qb_hi, qb_hi, eb);

    let kv_dim = k.mul(k.reg(), n_head_kv, head_dim as u32);
    // Bytes from one slot to the next.
    let stride = k.shl(k.reg(), kv_dim, 1u32);

    // The split's first 32 block numbers, one per lane, so that no key load of the loop
    // waits on a table load: a KV block of 16 keys is one step of the loop, and each
    // step's table load was a dependent round trip before its keys.
    let split_blocks = k.u32(0);
    let lane_block = k.add(k.reg(), sb, lane);
    let lane_has = k.lt(lane_block, eb);
    k.guarded(lane_has, |k| {
        let ti = k.add(k.reg(), bto, lane_block);
        k.ld(Load::GLOBAL_NC, split_blocks, k.elem_addr(tables, ti, 4));
    });
    // The split's first KV blocks go to shared memory in one round trip (`cp.async`, 16
    // bytes a thread at a time), so the key loop below reads them at shared-memory latency
    // instead of one dependent DRAM round trip per block of 16 keys. The slots of positions
    // before `start` were written by earlier steps: they are copied before the wait, while
    // the kernels before this one run (the Q|K|V GEMV when it appends the token itself);
    // the step's own new slots after it.
    let slots = stage_slots(head_dim) as u32;
    let stage = k.shared::<U32>("attn_stage", slots * head_dim as u32, 16);
    let stage_base = k.shared_base(&stage);
    // At most 32 blocks: their numbers come from the lanes that preloaded them.
    let cap_blocks = k.div_int(k.reg(), k.u32(slots), bs);
    k.min(cap_blocks, cap_blocks, stage_blocks);
    k.min(cap_blocks, cap_blocks, 32u32);
    let nstage = k.u32(0);
    let some = k.lt(sb, eb);
    k.if_(some, |k| {
        k.sub(nstage, eb, sb);
        k.min(nstage, nstage, cap_blocks);
    });
    let stage_lo = k.mul(k.reg(), sb, bs);
    let stage_hi = k.mad(k.reg(), nstage, bs, stage_lo);
    k.min(stage_hi, stage_hi, kv_len);
    // 16-byte pieces of a K row and a V row (a head is a multiple of 16 values: whole
    // pieces, and every row 16-byte aligned).
    let chunks_per_slot = (head_dim / 4) as u32;
    let row_bytes = 2 * head_dim as u32;
    let tid = k.mad(k.reg(), warp, 32u32, lane);
    let head_bytes = k.mul(k.reg(), kvh, row_bytes);
    // Copies the staged slots of positions [lo, hi) (clamped to the stage) into shared
    // memory, asynchronously; `cp.async.wait_all` and a barrier make them visible.
    let copy_slots = |k: &Kernel, lo: Reg<U32>, hi: Reg<U32>| {
        let lo = k.max(k.reg(), lo, stage_lo);
        let hi = k.min(k.reg(), hi, stage_hi);
        let n = k.u32(0);
        let any = k.lt(lo, hi);
        k.if_(any, |k| {
            k.sub(n, hi, lo);
        });
        let total = k.mul(k.reg(), n, chunks_per_slot);
        let first_slot = k.sub(k.reg(), lo, stage_lo);
        // The same trip count in every lane (the block numbers are shuffled from the lanes
        // that preloaded them), one 16-byte piece a thread per trip.
        k.stride_loop(k.u32(0), total, 32 * WARPS, |k, base| {
            let c = k.add(k.reg(), base, tid);
            let half = chunks_per_slot / 2;
            let (si, is_v, piece) = if chunks_per_slot.is_power_of_two() {
                let si = k.shr(k.reg(), c, chunks_per_slot.trailing_zeros());
                let rest = k.and(k.reg(), c, chunks_per_slot - 1);
                let is_v = k.ge(rest, half);
                let piece = k.and(k.reg(), rest, half - 1);
                (si, is_v, piece)
            } else {
                let si = k.div_int(k.reg(), c, chunks_per_slot);
                let rest = k.rem(k.reg(), c, chunks_per_slot);
                let is_v = k.ge(rest, half);
                let piece = k.rem(k.reg(), rest, half);
                (si, is_v, piece)
            };
            k.add(si, si, first_slot);
            let nth = k.div_int(k.reg(), si, bs);
            let j = k.rem(k.reg(), si, bs);
            let block = k.reg::<U32>();
            k.shfl_sync(Shfl::Idx, block, split_blocks, nth, FULL_WARP);
            let inside = k.lt(c, total);
            k.if_(inside, |k| {
                let slot = k.mad(k.reg(), block, bs, j);
                let src = k.mul_wide(k.reg::<U64>(), slot, stride);
                let within = k.mad(k.reg(), piece, 16u32, head_bytes);
                k.add(src, src, k.cvt(k.reg::<U64>(), within, Exact));
                let cache = k.copy(kc);
                k.selp(cache, vc, kc, is_v);
                k.add(src, src, cache);
                let dst = k.mad(k.reg(), si, 2 * row_bytes, stage_base);
                let vo = k.u32(0);
                k.selp(vo, row_bytes, 0u32, is_v);
                k.add(dst, dst, vo);
                k.mad(dst, piece, 16u32, dst);
                k.raw(format!("cp.async.cg.shared.global [{dst}], [{src}], 16"));
            });
        });
        k.raw("cp.async.commit_group");
    };
    copy_slots(k, stage_lo, start);
    // Everything above reads only what the host wrote before the step, and cache slots no
    // kernel of this step writes.
    k.grid_dep_wait();
    copy_slots(k, start, kv_len);

    // The query slice of this lane, rounded to f16 (zero where the lane holds nothing).
    let f16s = LaneChunks::new(k, lanes, lane, 2);
    let f32s = LaneChunks::new(k, lanes, lane, 4);
    let qrow = k.mad(k.reg(), row, n_head, head);
    let qfirst = k.mul(k.reg(), qrow, head_dim as u32);
    let qa = k.elem_addr(q, qfirst, 4);
    k.add(qa, qa, k.cvt(k.reg::<U64>(), f32s.base, Exact));
    let mut qf: Vec<Reg<F32>> = Vec::with_capacity(e);
    for s in 0..lanes.slots {
        let at = f32s.global(k, qa, s);
        let vals: Vec<Reg<F32>> = (0..2 * lanes.vec).map(|_| k.f32(0.0)).collect();
        let load = |k: &Kernel| {
            for (i, &v) in vals.iter().enumerate() {
                k.ld(Load::GLOBAL_NC, v, at.clone().offset(4 * i as i64));
                let h = k.cvt(k.reg::<F16>(), v, FloatRound::Rn);
                k.cvt(v, h, Exact);
            }
        };
        match f32s.slots[s].1 {
            Some(valid) => k.if_(valid, load),
            None => load(k),
        }
        qf.extend(vals);
    }
    let scale2 = k.mul(k.reg(), scale, LOG2E);
    let m = k.f32(f32::NEG_INFINITY);
    let l = k.f32(0.0);
    let acc: Vec<Reg<F32>> = (0..e).map(|_| k.f32(0.0)).collect();
    // Byte offset of this lane's first chunk inside a slot.
    let lane_off = k.mad(k.reg(), kvh, row_bytes, f16s.base);
    let lane_off = k.cvt(k.reg::<U64>(), lane_off, Exact);
    // This lane's first chunk inside a staged K row.
    let lane_stage = k.add(k.reg(), stage_base, f16s.base);
    k.raw("cp.async.wait_all");
    k.bar_sync();

    // One block's keys `[jlo, jhi)` (slots of the block; `jlast = jhi - 1`), their K and V
    // words fetched by `fetch`.
    type Fetch<'a> = dyn Fn(&Kernel, Reg<U32>) -> (Vec<Reg<U32>>, Vec<Reg<U32>>) + 'a;
    let keys_loop = |k: &Kernel, jlo: Reg<U32>, jhi: Reg<U32>, jlast: Reg<U32>, fetch: &Fetch| {
        k.stride_loop(jlo, jhi, keys as u32, |k, j0| {
            let mut kw = Vec::with_capacity(keys);
            let mut vw = Vec::with_capacity(keys);
            let mut valid = Vec::with_capacity(keys);
            for u in 0..keys {
                // Keys past the range load the last visible one and count for nothing.
                let j = k.add(k.reg(), j0, u as u32);
                valid.push(k.lt(j, jhi));
                let jc = k.min(k.reg(), j, jlast);
                let (kwu, vwu) = fetch(k, jc);
                kw.push(kwu);
                vw.push(vwu);
            }
            let mut s = Vec::with_capacity(keys);
            for words in &kw {
                let dot = k.f32(0.0);
                for (wi, &w) in words.iter().enumerate() {
                    let [a, b] = halves(k, w);
                    k.fma(dot, qf[2 * wi], a, dot);
                    k.fma(dot, qf[2 * wi + 1], b, dot);
                }
                s.push(dot);
            }
            for offset in [16u32, 8, 4, 2, 1] {
                for &dot in &s {
                    let o = bfly(k, dot, offset);
                    k.add(dot, dot, o);
                }
            }
            let mx = k.copy(m);
            for (u, &dot) in s.iter().enumerate() {
                k.mul(dot, dot, scale2);
                k.selp(dot, dot, f32::NEG_INFINITY, valid[u]);
                k.max(mx, mx, dot);
            }
            // Nothing visible yet (all -inf): keep everything as it is.
            let empty = k.cmp(Cmp::Eq, mx, f32::NEG_INFINITY);
            let corr = k.sub(k.reg(), m, mx);
            k.ex2_approx(corr, corr);
            k.selp(corr, 1.0f32, corr, empty);
            k.mul(l, l, corr);
            for a in &acc {
                k.mul(*a, *a, corr);
            }
            for (u, &dot) in s.iter().enumerate() {
                let p = k.sub(k.reg(), dot, mx);
                k.ex2_approx(p, p);
                k.selp(p, p, 0.0f32, valid[u]);
                k.add(l, l, p);
                for (wi, &w) in vw[u].iter().enumerate() {
                    let [a, b] = halves(k, w);
                    k.fma(acc[2 * wi], p, a, acc[2 * wi]);
                    k.fma(acc[2 * wi + 1], p, b, acc[2 * wi + 1]);
                }
            }
            k.mov(m, mx);
        });
    };

    k.stride_loop(qb_lo, qb_hi, 1u32, |k, bi| {
        let nth = k.sub(k.reg(), bi, sb);
        let p0 = k.mul(k.reg(), bi, bs);
        // The keys of this block the query sees: slots [jlo, jhi), never empty here.
        let jlo = k.sub(k.reg(), lo_q, p0);
        let before = k.lt(lo_q, p0);
        k.selp(jlo, 0u32, jlo, before);
        let jhi = k.sub(k.reg(), pos_q, p0);
        k.add(jhi, jhi, 1u32);
        k.min(jhi, jhi, bs);
        let jlast = k.sub(k.reg(), jhi, 1u32);
        // `bi` is the same in every lane, so is the branch.
        let staged = k.lt(nth, nstage);
        k.if_else(
            staged,
            |k| {
                let first = k.mul(k.reg(), nth, bs);
                let rows = k.mad(k.reg(), first, 2 * row_bytes, lane_stage);
                keys_loop(k, jlo, jhi, jlast, &|k: &Kernel, jc: Reg<U32>| {
                    let ka = k.mad(k.reg(), jc, 2 * row_bytes, rows);
                    let va = k.add(k.reg(), ka, row_bytes);
                    (f16s.load_shared(k, ka), f16s.load_shared(k, va))
                });
            },
            |k| {
                // The block number comes from the lane that preloaded it, or from the
                // table past the split's first 32 blocks.
                let block = k.reg::<U32>();
                let preloaded = k.lt(nth, 32u32);
                k.if_else(
                    preloaded,
                    |k| {
                        k.shfl_sync(Shfl::Idx, block, split_blocks, nth, FULL_WARP);
                    },
                    |k| {
                        let ti = k.add(k.reg(), bto, bi);
                        k.ld(Load::GLOBAL_NC, block, k.elem_addr(tables, ti, 4));
                    },
                );
                let slot0 = k.mul(k.reg(), block, bs);
                let base = k.mul_wide(k.reg::<U64>(), slot0, stride);
                k.add(base, base, lane_off);
                let kbase = k.add(k.reg(), kc, base);
                let vbase = k.add(k.reg(), vc, base);
                keys_loop(k, jlo, jhi, jlast, &|k: &Kernel, jc: Reg<U32>| {
                    let off = k.mul_wide(k.reg::<U64>(), jc, stride);
                    let ka = k.add(k.reg(), kbase, off);
                    let va = k.add(k.reg(), vbase, off);
                    (
                        f16s.load_global(k, Load::GLOBAL_NC, ka),
                        f16s.load_global(k, Load::GLOBAL_NC, va),
                    )
                });
            },
        );
    });

    let pidx = k.mad(k.reg(), qrow, n_splits, split);
    let aoff = k.mul(k.reg(), pidx, head_dim as u32);
    let aa = k.elem_addr(part_acc, aoff, 4);
    k.add(aa, aa, k.cvt(k.reg::<U64>(), f32s.base, Exact));
    k.if_(active, |k| {
        f32s.each_global(k, aa, |k, s, at| {
            let per = 2 * lanes.vec;
            for (i, a) in acc[s * per..(s + 1) * per].iter().enumerate() {
                k.st(Store::GLOBAL, at.clone().offset(4 * i as i64), *a);
            }
        });
    });
    let ma = k.elem_addr(part_ml, pidx, 8);
    let lane0 = k.eq(lane, 0u32);
    let store_ml = k.and(k.reg(), lane0, active);
    k.guarded(store_ml, |k| k.st_v2(Store::GLOBAL, ma, [m, l]));
    if let Some((c, sink)) = fused {
        let group_idx = k.mad(k.reg(), z, n_head_kv, kvh);
        let last = last_block(k, c.counters, group_idx, n_splits);
        k.exit_if(!last);
        k.if_(active, |k| {
            let pbase = k.mul(k.reg(), qrow, n_splits);
            let parts = (part_acc, part_ml, pbase, n_splits);
            combine_row(k, &f32s, head_dim, parts, qrow, c.out, (c.sink, sink));
        });
    }
}

/// The first position a query at `p` sees: `window == 0 ? 0 : max(p + 1 - window, 0)`.
pub(super) fn behind(k: &Kernel, p: Reg<U32>, window: Reg<U32>) -> Reg<U32> {
    let p1 = k.add(k.reg(), p, 1u32);
    let lo = k.sub(k.reg(), p1, window);
    let under = k.cmp(Cmp::Le, p1, window);
    k.selp(lo, 0u32, lo, under);
    let none = k.eq(window, 0u32);
    k.selp(lo, 0u32, lo, none);
    lo
}

/// Whether this block is the last of its group to get here: every thread's stores are
/// fenced at GPU scope, then one thread counts the block in (`atom.add` on
/// `counters[group]`); the last one resets the counter for the next launch. True in
/// every thread of the last block, after an acquiring fence.
pub(crate) fn last_block(
    k: &Kernel,
    counters: Reg<U64>,
    group: Reg<U32>,
    n_splits: Reg<U32>,
) -> Reg<Pred> {
    let flag = k.shared::<U32>("attn_last", 1, 4);
    k.membar(Scope::Gpu);
    k.bar_sync();
    let first = k.eq(k.tid_x(), 0u32);
    let w0 = k.eq(k.tid_y(), 0u32);
    k.and(first, first, w0);
    k.if_(first, |k| {
        let at = k.elem_addr(counters, group, 4);
        let old = k.atom_add(Space::Global, k.reg::<U32>(), at, 1u32);
        let n1 = k.sub(k.reg(), n_splits, 1u32);
        let is_last = k.eq(old, n1);
        let v = k.u32(0);
        k.selp(v, 1u32, 0u32, is_last);
        k.st(Store::SHARED, flag.at(0), v);
        let zero = k.u32(0);
        k.guarded(is_last, |k| k.st(Store::GLOBAL, at, zero));
    });
    k.bar_sync();
    let v = k.load::<U32>(Load::SHARED, flag.at(0));
    let last = k.cmp(Cmp::Ne, v, 0u32);
    k.membar(Scope::Gpu);
    last
}

/// One warp combines the `n_splits` partials of one (row, head) as the reduce
/// (`attention_reduce::reduce_body`) does (weights `2^(m_s - max m)`, normalizer
/// `sum l_s w_s`; here warp reductions), writes the row's `head_dim` outputs and quantizes
/// them, one q8_1 block per 32 values. Partials are read through L2 (`.cg`): other blocks
/// wrote them during this launch. `f32s`: where the lane's values are in an f32 row of the
/// head.
fn combine_row(
    k: &Kernel,
    f32s: &LaneChunks,
    head_dim: usize,
    (part_acc, part_ml, pbase, n_splits): (Reg<U64>, Reg<U64>, Reg<U32>, Reg<U32>),
    qrow: Reg<U32>,
    out: Reg<U64>,
    (dst, sink): (Reg<U64>, Sink),
) {
    let lanes = f32s.lanes;
    let e = lanes.values();
    let per = 2 * lanes.vec;
    let cg = Load::GLOBAL.cache(LoadCache::Cg);
    let lane = k.tid_x();
    let warp = k.tid_y();
    let wsh = k.shared::<F32>("combine_w", WARPS * COMBINE_MAX_SPLITS as u32, 16);
    let osh = k.shared::<F32>("combine_o", WARPS * 256, 16);
    let wbase = k.mad(
        k.reg(),
        warp,
        4 * COMBINE_MAX_SPLITS as u32,
        k.shared_base(&wsh),
    );
    let obase = k.mad(k.reg(), warp, 4 * 256, k.shared_base(&osh));
    let base64 = k.cvt(k.reg::<U64>(), f32s.base, Exact);
    // This lane's `e` values of split `s`'s partial output (zeros past the end; lanes
    // that hold no chunk of a slot load the last chunk's values, never stored).
    let load_acc = |k: &Kernel, s: Reg<U32>, ok: Reg<Pred>| {
        let vals: Vec<Reg<F32>> = (0..e).map(|_| k.f32(0.0)).collect();
        k.guarded(ok, |k| {
            let i = k.add(k.reg(), pbase, s);
            let ai = k.mul(k.reg(), i, head_dim as u32);
            let a = k.elem_addr(part_acc, ai, 4);
            k.add(a, a, base64);
            for slot in 0..lanes.slots {
                let at = f32s.global(k, a, slot);
                for (c, chunk) in vals[slot * per..(slot + 1) * per].chunks(4).enumerate() {
                    let at = at.clone().offset(16 * c as i64);
                    match chunk.len() {
                        4 => k.ld_v4(cg, [chunk[0], chunk[1], chunk[2], chunk[3]], at),
                        _ => k.ld_v2(cg, [chunk[0], chunk[1]], at),
                    }
                }
            }
        });
        vals
    };
    // The first splits' partial outputs are loaded before the (m, l) pairs, so that both
    // are in flight together: they do not depend on the weights. At decode (17 splits on
    // an H100) that is every split: one round trip to L2 instead of one for the pairs and
    // one per eight splits. At most 96 values a lane and 24 splits: more cost registers
    // the key loop does not need (hd64 with 48 splits ahead: 205 instead of 96).
    let ahead = ((96 / e) / 8 * 8).clamp(8, 24) as u32;
    let early: Vec<_> = (0..ahead)
        .map(|s| {
            let ok = k.lt(k.u32(s), n_splits);
            load_acc(k, k.u32(s), ok)
        })
        .collect();
    // Each lane holds splits `lane` and `lane + 32`: (m, l) pairs, -inf/0 past the end.
    let pairs: Vec<_> = (0..COMBINE_MAX_SPLITS as u32 / 32)
        .map(|j| {
            let s = k.add(k.reg(), lane, 32 * j);
            let ok = k.lt(s, n_splits);
            let (m, l) = (k.f32(f32::NEG_INFINITY), k.f32(0.0));
            k.guarded(ok, |k| {
                let i = k.add(k.reg(), pbase, s);
                k.ld_v2(cg, [m, l], k.elem_addr(part_ml, i, 8));
            });
            (s, ok, m, l)
        })
        .collect();
    let mx = k.f32(f32::NEG_INFINITY);
    for &(_, _, m, _) in &pairs {
        k.max(mx, mx, m);
    }
    let mx = k.warp_max(mx);
    let lsum = k.f32(0.0);
    for &(s, ok, m, l) in &pairs {
        let w = k.sub(k.reg(), m, mx);
        k.ex2_approx(w, w);
        let empty = k.cmp(Cmp::Eq, m, f32::NEG_INFINITY);
        k.selp(w, 0.0f32, w, empty);
        k.fma(lsum, l, w, lsum);
        k.guarded(ok, |k| {
            k.st(Store::SHARED, k.mad(k.reg(), s, 4u32, wbase), w)
        });
    }
    let total = k.warp_sum(lsum);
    k.raw("bar.warp.sync -1");
    // This lane's `e` values, summed over the splits in index order, eight at a time (the
    // eight of a group past the end add zeros, as they always have: the same bits).
    let o: Vec<Reg<F32>> = (0..e).map(|_| k.f32(0.0)).collect();
    let weigh = |k: &Kernel, s: Reg<U32>, ok: Reg<Pred>| {
        let w = k.f32(0.0);
        k.guarded(ok, |k| {
            k.ld(Load::SHARED, w, k.mad(k.reg(), s, 4u32, wbase));
        });
        w
    };
    for (g, group) in early.chunks(8).enumerate() {
        let s0 = 8 * g as u32;
        let used = k.lt(k.u32(s0), n_splits);
        k.if_(used, |k| {
            for (u, vals) in group.iter().enumerate() {
                let s = k.u32(s0 + u as u32);
                let w = weigh(k, s, k.lt(s, n_splits));
                for (oi, v) in o.iter().zip(vals) {
                    k.fma(*oi, *v, w, *oi);
                }
            }
        });
    }
    k.stride_loop(ahead, n_splits, 8u32, |k, s0| {
        let mut terms = Vec::new();
        for u in 0..8u32 {
            let s = k.add(k.reg(), s0, u);
            let ok = k.lt(s, n_splits);
            terms.push((load_acc(k, s, ok), weigh(k, s, ok)));
        }
        for (vals, w) in terms {
            for (oi, v) in o.iter().zip(vals) {
                k.fma(*oi, v, w, *oi);
            }
        }
    });
    let row0 = k.mul(k.reg(), qrow, head_dim as u32);
    let oa = k.elem_addr(out, row0, 4);
    k.add(oa, oa, base64);
    let sa = k.add(k.reg(), obase, f32s.base);
    for oi in &o {
        k.div_rn(*oi, *oi, total);
    }
    f32s.each_global(k, oa, |k, slot, at| {
        let sat = f32s.shared(k, sa, slot);
        for (i, &oi) in o[slot * per..(slot + 1) * per].iter().enumerate() {
            k.st(Store::GLOBAL, at.clone().offset(4 * i as i64), oi);
            k.st(Store::SHARED, sat.clone().offset(4 * i as i64), oi);
        }
    });
    k.raw("bar.warp.sync -1");
    // The sink by 32-value blocks: lane `lane` takes value `32 c + lane` of the head.
    for c in 0..(head_dim / 32) as u32 {
        let idx = k.add(k.reg(), lane, 32 * c);
        let v = k.load::<F32>(Load::SHARED, k.mad(k.reg(), idx, 4u32, obase));
        let f = k.add(k.reg(), row0, idx);
        crate::fused::sink_warp_value(k, sink, v, lane, f, dst);
    }
}

/// Shape of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (`n_head` is a multiple).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Slots per KV block.
    pub block_size: usize,
    /// 0: no window; else keys `window` or more positions behind the query are masked.
    pub window: usize,
    /// Multiplier of `q·k`.
    pub scale: f32,
}

/// CPU twin of the attention + reduce pair: for every sequence's query rows, the softmax
/// of `q16·k · scale` over the visible keys, weighting V, in f64 (the exact value the
/// kernels approximate); `q` is rounded to f16 first, as the kernel does. Caches are f16
/// bits (`u16`), layout as in [`super::kv`].
pub fn attention_cpu(
    q: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    seqs: &[SeqDesc],
    block_tables: &[u32],
    p: &AttnShape,
    out: &mut [f32],
) {
    use smelt_quant::fp::{f16_to_f32, f32_to_f16};
    let hd = p.head_dim;
    let kv_dim = p.n_head_kv * hd;
    let group = p.n_head / p.n_head_kv.max(1);
    let h16 = |b: u16| f64::from(f16_to_f32(half::f16::from_bits(b)));
    for s in seqs {
        for t in 0..s.n_tokens as usize {
            let row = s.row as usize + t;
            let pos = s.start_pos as usize + t;
            let lo = if p.window == 0 {
                0
            } else {
                (pos + 1).saturating_sub(p.window)
            };
            for h in 0..p.n_head {
                let kvh = h / group;
                let qv: Vec<f64> = q[(row * p.n_head + h) * hd..][..hd]
                    .iter()
                    .map(|&x| f64::from(f16_to_f32(f32_to_f16(x))))
                    .collect();
                let slot = |j: usize| {
                    let b = block_tables[s.block_table_offset as usize + j / p.block_size] as usize;
                    b * p.block_size + j % p.block_size
                };
                let scores: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let kk = &k_cache[slot(j) * kv_dim + kvh * hd..][..hd];
                        qv.iter().zip(kk).map(|(&a, &b)| a * h16(b)).sum::<f64>()
                            * f64::from(p.scale)
                    })
                    .collect();
                let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|&x| (x - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                let o = &mut out[(row * p.n_head + h) * hd..][..hd];
                for (d, o) in o.iter_mut().enumerate() {
                    let v: f64 = (lo..=pos)
                        .zip(&w)
                        .map(|(j, &w)| w * h16(v_cache[slot(j) * kv_dim + kvh * hd + d]))
                        .sum();
                    *o = (v / sum) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernels_build_for_every_head_size() {
        let mut m = Module::new(Target::Sm90);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        for hd in HEAD_DIMS {
            assert!(ptx.contains(&format!(".entry attention_hd{hd}(")));
        }
        assert!(ptx.contains("ex2.approx.f32"));
        assert!(ptx.contains("ld.global.nc.v4.u32"));
        assert!(ptx.contains("shfl.sync.bfly.b32"));
        let mut m = Module::new(Target::Sm80);
        assert!(m.kernel("bad", |k| kernel(k, 72)).is_err());
        assert!(m
            .kernel("bad", |k| combine_kernel(k, 80, Sink::Q8_1))
            .is_err());
    }

    #[test]
    fn lanes_hold_every_value_of_every_head_once() {
        for hd in HEAD_DIMS.into_iter().chain([16, 48, 272]) {
            let l = Lanes::new(hd);
            let mut seen = vec![0; hd];
            for lane in 0..32 {
                for i in 0..l.values() {
                    if let Some(d) = l.value_index(lane, i) {
                        seen[d] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "hd {hd}: {l:?}");
            // At most four words a lane (the 256-value head's), and the layouts the
            // measured kernels had for 64, 128 and 256: one slot of contiguous values.
            assert!(l.words() <= 4 || hd > 256, "hd {hd}: {l:?}");
            if matches!(hd, 64 | 128 | 256) {
                assert_eq!((l.slots, l.vec), (1, hd / 64), "hd {hd}");
            }
        }
        // 80 values: 20 lanes of two words; 144: three slots of one word, the last half full.
        assert_eq!(
            Lanes::new(80),
            Lanes {
                vec: 2,
                chunks: 20,
                slots: 1
            }
        );
        assert_eq!(
            Lanes::new(144),
            Lanes {
                vec: 1,
                chunks: 72,
                slots: 3
            }
        );
        assert!(!Lanes::new(144).full(2) && Lanes::new(144).full(1));
    }

    #[test]
    fn every_head_size_has_kernels_and_the_others_the_generic_one() {
        for hd in (64..=256).step_by(16) {
            assert_eq!(
                name(hd).map(|n| n.to_string()),
                Some(format!("attention_hd{hd}"))
            );
            assert_eq!(
                combine_name(hd, Sink::F16Rows).is_some(),
                hd % 32 == 0,
                "hd {hd}"
            );
        }
        for hd in [32, 48, 72, 100, 272, 512] {
            assert!(name(hd).is_none() && any_fits(hd), "hd {hd}");
        }
        assert!(!any_fits(0) && !any_fits(513));
        assert!(!combine_fits(16, 80, 4) && combine_fits(16, 96, 4));
    }

    #[test]
    fn launch_shapes() {
        assert_eq!(q_tiles(1, 32, 8), 1);
        assert_eq!(q_tiles(5, 32, 8), 5);
        assert_eq!(launch(3, 1, 32, 8, 16).grid, (16, 8, 3));
        assert_eq!(partial_lens(2, 4, 3, 64), (2 * 4 * 3 * 64, 2 * 4 * 3 * 2));
        assert_eq!(default_splits(1, 8, 132), 64);
        assert_eq!(default_splits(64, 8, 132), 2);
        assert_eq!(splits_for_context(1, 8, 132, 512), 32);
        assert_eq!(splits_for_context(1, 8, 132, 0), 1);
    }

    #[test]
    fn twin_is_causal_and_windowed() {
        for hd in [64, 80, 144, 256] {
            twin_is_causal_and_windowed_at(hd);
        }
    }

    fn twin_is_causal_and_windowed_at(hd: usize) {
        // One KV head of size `hd`, two query heads, block size 4, a query per position.
        let bs = 4;
        let p = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: hd,
            block_size: bs,
            window: 0,
            scale: 0.125,
        };
        let h = |x: f32| smelt_quant::fp::f32_to_f16(x).to_bits();
        let n = 6;
        let kc: Vec<u16> = (0..2 * bs * hd)
            .map(|i| h(((i * 7) % 13) as f32 / 13.0 - 0.5))
            .collect();
        let vc: Vec<u16> = (0..2 * bs * hd).map(|i| h(((i * 5) % 11) as f32)).collect();
        let q: Vec<f32> = (0..n * 2 * hd)
            .map(|i| ((i * 3) % 17) as f32 / 17.0)
            .collect();
        let seqs = [SeqDesc {
            row: 0,
            n_tokens: n as u32,
            start_pos: 0,
            block_table_offset: 0,
        }];
        let tables = [1u32, 0];
        let mut out = vec![0f32; n * 2 * hd];
        attention_cpu(&q, &kc, &vc, &seqs, &tables, &p, &mut out);
        // Position 0 sees only itself: its output is V of position 0 (block 1, slot 0).
        for d in 0..hd {
            let v0 = smelt_quant::fp::f16_to_f32(half::f16::from_bits(vc[bs * hd + d]));
            assert!((out[d] - v0).abs() < 1e-5);
        }
        // A window of one: every query sees only itself.
        let mut w1 = vec![0f32; out.len()];
        attention_cpu(
            &q,
            &kc,
            &vc,
            &seqs,
            &tables,
            &AttnShape { window: 1, ..p },
            &mut w1,
        );
        let pos5 = hd + 1; // position 5, value 1: block 0 (table[1]), slot 1
        let v5 = smelt_quant::fp::f16_to_f32(half::f16::from_bits(vc[pos5]));
        assert!((w1[(5 * 2) * hd + 1] - v5).abs() < 1e-5);
    }
}
