//! `y[t][r] = W[r] . x[t]` for quantized weights `W` (rows of `k`) and 1 to 8 tokens of
//! activations already quantized by [`crate::act::quantize_kernel`]: the decode-time
//! matrix-vector product.
//!
//! One warp per row; four threads per 256-weight tile, so a warp covers eight tiles per
//! step. Each step issues all of its loads (weights once, activations per token) before any
//! arithmetic, unpacks the weights once and dots them with every token's activations, so
//! 2..8 tokens read the weights once. The warp's partial sums meet in a butterfly.
//!
//! Files: this one the configurations, parameters and kernel body; `gemv/epilogue.rs` the
//! fused GEMVs' epilogues (rope + KV append, split residual norm); `gemv/twin.rs` the CPU
//! twins.

mod epilogue;
mod twin;

use smelt_ptx::{Cmp, Kernel, Label, Load, Reg, Store, F32, U32, U64};

use crate::act::{self, ActSlots};
use crate::formats::{GpuFormat, WeightLoad};
use crate::ops::kernel_params;
use epilogue::{residual_norm_epilogue, write_norm_output, Early, Fused, RopeKv};

pub(crate) use epilogue::rms_from_partials;
pub use twin::{
    cpu, cpu_with_magnitude, residual_norm_partials, residual_norm_tiles, rms_input_scale,
};
pub(crate) use twin::{dot_twin, TwinTiles};

/// Warps per block of the default configurations: blocks are `(32, warps_per_cta)` threads.
pub const WARPS_PER_CTA: u32 = 4;

/// Most tokens one launch handles.
pub const MAX_TOKENS: usize = 8;

/// Rows of the residual stream one [`Fuse::ResidualNorm`] block owns: one q8_1 block.
pub const NORM_ROWS_PER_CTA: u32 = 32;

/// Most per-block partial sums a [`Fuse::RmsInput`] GEMV reads: rows of up to
/// `MAX_PARTS * NORM_ROWS_PER_CTA` = 8192 values (the widest model of DESIGN.md's list).
pub const MAX_PARTS: u32 = 256;

/// What a single-token GEMV does around its dot products, so that the residual add and the
/// RMS norm between two GEMVs need no launch of their own.
///
/// `res += W_o a; out = res / rms(res) * g; q = q8_1(out)` would be a one-block kernel
/// between the output projection and the next GEMV: a few microseconds of latency for 16
/// KB of work, twice per layer. Split over the two GEMVs instead:
///
/// - the producer ([`Fuse::ResidualNorm`]), whose blocks own 32 rows each, adds its rows
///   into `res`, quantizes its 32 values of `res * g` as one q8_1 block *without* the
///   `1 / rms` factor (which needs every row), and writes the block's sum of `res²`;
/// - the consumer ([`Fuse::RmsInput`]) reads those tiles as any GEMV does, sums the
///   partial sums in a fixed order (every warp gets the same bits) and scales its dot
///   products by `1 / rms`: the dot product is linear in the activations, and every q8_1
///   term (`d`, `s`) scales with them. Its blocks also write `out` itself, so the norm's
///   f32 output exists for whoever else reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fuse {
    /// `y = W x`.
    None,
    /// `y = W x; res += y`; q8_1 tiles of `res * g` and per-block sums of `res²`.
    ResidualNorm,
    /// `y = (W x) / rms` with `x` the tiles of a [`Fuse::ResidualNorm`] GEMV.
    RmsInput,
}

/// The shape of one GEMV kernel: what is fixed when its PTX is generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tokens (activation rows) per launch, 1..=8.
    pub ntok: usize,
    /// Weight rows per warp: more rows put more loads in flight per thread and share the
    /// activation loads between rows.
    pub rows_per_warp: u32,
    /// Ends each step's loads with a branch that depends on all of them and is never taken,
    /// so ptxas issues every load before the first use instead of interleaving them.
    pub pin_loads: bool,
    /// Weight loads skip L1 (`.L1::no_allocate`), keeping it for the activations.
    pub no_l1: bool,
    /// Tokens whose activations are loaded (and pinned) with the weights; the others are
    /// loaded one at a time just before their dot products, which keeps fewer registers
    /// live when there are many tokens.
    pub act_ahead: usize,
    /// Warps per block.
    pub warps_per_cta: u32,
    /// What the GEMV fuses around its dot products (one token only).
    pub fuse: Fuse,
    /// The rows are one decode token's `Q | K | V` (one token, two rows per warp): the
    /// warp rotates its pair of Q or K rows (normal rope: a pair is two adjacent rows) and
    /// stores K and V as f16 into the sequence's KV-cache slot, the job of
    /// `ops::rope::rope_kv_rows_kernel` for one row, without its launch.
    pub rope_kv: bool,
    /// Warps that share each warp's worth of rows (1, 2 or 4; plain GEMVs only): each
    /// takes every `split`-th step of eight tiles, so a short row's chain of loads is
    /// `split` times shorter, and their sums meet in shared memory in a fixed order.
    pub split: u32,
}

impl Config {
    /// The default for `ntok` tokens: the fastest measured (H200, 2026-11-22, CUDA-graph
    /// replays: two rows per warp with pinned loads took Q4_K at 14336x4096 from 68% to 77%
    /// of the device copy rate, Q6_K from 54% to 79%, and 2-token Q4_K from 51% to 67%).
    pub fn new(ntok: usize) -> Self {
        Self {
            ntok,
            rows_per_warp: 2,
            pin_loads: true,
            no_l1: false,
            act_ahead: ntok,
            warps_per_cta: WARPS_PER_CTA,
            fuse: Fuse::None,
            rope_kv: false,
            split: 1,
        }
    }

    /// The producer half of a residual add + RMS norm (one token): two rows per warp, 16
    /// warps, so a block owns [`NORM_ROWS_PER_CTA`] rows (the same warps per row as the
    /// default, in larger blocks).
    pub fn residual_norm() -> Self {
        Self {
            warps_per_cta: NORM_ROWS_PER_CTA / 2,
            fuse: Fuse::ResidualNorm,
            ..Self::new(1)
        }
    }

    /// The consumer half of a residual add + RMS norm (one token): the default shape.
    pub fn rms_input() -> Self {
        Self {
            fuse: Fuse::RmsInput,
            ..Self::new(1)
        }
    }

    /// `self` with `rows_per_warp` rows a warp.
    pub fn with_rows(self, rows_per_warp: u32) -> Self {
        Self {
            rows_per_warp,
            ..self
        }
    }

    /// `self` rotating and appending one token's Q|K|V rows ([`Config::rope_kv`]).
    pub fn with_rope_kv(self) -> Self {
        Self {
            rope_kv: true,
            ..self
        }
    }

    /// The preset configuration of `ntok` tokens with `fuse`.
    fn preset(ntok: usize, fuse: Fuse) -> Self {
        match fuse {
            Fuse::None => Self::new(ntok),
            Fuse::ResidualNorm => Self::residual_norm(),
            Fuse::RmsInput => Self::rms_input(),
        }
    }

    /// Rows one block covers: the grid is `ceil(nrows / rows_per_cta())`.
    pub fn rows_per_cta(&self) -> u32 {
        self.warps_per_cta / self.split * self.rows_per_warp
    }

    /// Threads per block, as `(32, warps_per_cta, 1)`.
    pub fn block(&self) -> (u32, u32, u32) {
        (32, self.warps_per_cta, 1)
    }

    /// The kernel's name for format `F`.
    pub fn name<F: GpuFormat>(&self) -> String {
        let mut n = format!("gemv_{}_t{}", F::NAME, self.ntok);
        match self.fuse {
            Fuse::None => {}
            Fuse::ResidualNorm => n.push_str("_resnorm"),
            Fuse::RmsInput => n.push_str("_rmsin"),
        }
        if self.rope_kv {
            n.push_str("_ropekv");
        }
        let preset = Config {
            rope_kv: self.rope_kv,
            ..Config::preset(self.ntok, self.fuse)
        };
        if *self != preset {
            n.push_str(&format!("_r{}", self.rows_per_warp));
        } else {
            return n;
        }
        if self.warps_per_cta != WARPS_PER_CTA {
            n.push_str(&format!("_w{}", self.warps_per_cta));
        }
        if !self.pin_loads {
            n.push_str("_nopin");
        }
        if self.no_l1 {
            n.push_str("_nol1");
        }
        if self.act_ahead != self.ntok {
            n.push_str(&format!("_a{}", self.act_ahead));
        }
        if self.split != 1 {
            n.push_str(&format!("_s{}", self.split));
        }
        n
    }
}

/// The default kernel's name for format `F` and `ntok` tokens.
pub fn name<F: GpuFormat>(ntok: usize) -> String {
    Config::new(ntok).name::<F>()
}

kernel_params! {
    /// The arguments every GEMV takes first ([`kernel`]).
    GemvArgs, GemvRegs {
        w: Ptr,
        x: Ptr,
        y: Ptr,
        nrows: U32,
        ntiles: U32,
        row_bytes: U32,
        never: U32,
    }
}

kernel_params! {
    /// Then those of a [`Fuse::ResidualNorm`] GEMV.
    ResNormArgs, ResNormRegs {
        res: Ptr,
        g: Ptr,
        q: Ptr,
        partials: Ptr,
    }
}

kernel_params! {
    /// Or those of a [`Fuse::RmsInput`] GEMV.
    RmsInputArgs, RmsInputRegs {
        partials: Ptr,
        nparts: U32,
        n: U32,
        eps: F32,
        res: Ptr,
        g: Ptr,
        out: Ptr,
    }
}

kernel_params! {
    /// Then, with [`Config::rope_kv`], the rope and KV append's.
    RopeKvArgs, RopeKvRegs {
        pos: Ptr,
        freq_factors: MaybePtr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        q_rows: U32,
        kv_dim: U32,
        head_dim: U32,
        block_size: U32,
        theta_scale: F32,
        freq_scale: F32,
    }
}

/// Emits the GEMV. Parameters, in order: `w` (rows in `F`'s GPU layout), `x` (`ntok` rows
/// of quantized activations), `y` (`ntok x nrows` floats), `nrows`, `ntiles` (`ceil(k / 256)`),
/// `row_bytes` (`F::row_bytes(k)`), `never` (0: the pinning branch's operand); then for
/// [`Fuse::ResidualNorm`]: `res` (`nrows` floats, added to in place), `g` (the norm's
/// `nrows` weights), `q` (`ceil(nrows / 256)` q8_1 tiles out), `partials` (one float per
/// block out); for [`Fuse::RmsInput`]: `partials`, `nparts` (at most [`MAX_PARTS`]), `n`
/// (the normed row's length), `eps`, `res`, `g`, `out` (`n` floats written, or 0: none);
/// then with [`Config::rope_kv`]: those of `ops::rope::rope_kv_rows_kernel` the GEMV does not
/// already have: `pos`, `freq_factors`, `k_cache`, `v_cache`, `seqs`, `block_tables`,
/// `q_rows` (`n_head * head_dim`), `kv_dim`, `head_dim`, `block_size`, `theta_scale`,
/// `freq_scale` (`nrows` is `q_rows + 2 kv_dim`).
/// Blocks of [`Config::block`], grid `ceil(nrows / cfg.rows_per_cta())`;
/// [`Fuse::ResidualNorm`] needs `nrows` a multiple of [`NORM_ROWS_PER_CTA`].
pub fn kernel<F: GpuFormat>(k: &Kernel, cfg: Config) {
    let ntok = cfg.ntok;
    if ntok == 0 || ntok > MAX_TOKENS {
        k.reject(format!("{ntok} tokens: the GEMV takes 1 to {MAX_TOKENS}"));
        return;
    }
    if cfg.act_ahead == 0 || cfg.act_ahead > ntok {
        k.reject(format!("{} tokens ahead of {ntok}", cfg.act_ahead));
        return;
    }
    if !(1..=4).contains(&cfg.rows_per_warp) {
        k.reject(format!("{} rows per warp: 1 to 4", cfg.rows_per_warp));
        return;
    }
    let split_ok = matches!(cfg.split, 1 | 2 | 4)
        && cfg.warps_per_cta % cfg.split == 0
        && (cfg.split == 1 || (cfg.fuse == Fuse::None && !cfg.rope_kv));
    if !split_ok {
        k.reject(format!(
            "{} warps a row group: 1, 2 or 4, dividing the block's warps, plain GEMVs only",
            cfg.split
        ));
        return;
    }
    if !(1..=32).contains(&cfg.warps_per_cta) {
        k.reject(format!("{} warps per block: 1 to 32", cfg.warps_per_cta));
        return;
    }
    if cfg.fuse != Fuse::None && ntok != 1 {
        k.reject(format!("{:?} takes one token, not {ntok}", cfg.fuse));
        return;
    }
    if cfg.fuse == Fuse::ResidualNorm && cfg.rows_per_cta() != NORM_ROWS_PER_CTA {
        k.reject(format!(
            "{:?} blocks own {NORM_ROWS_PER_CTA} rows, not {}",
            cfg.fuse,
            cfg.rows_per_cta()
        ));
        return;
    }
    if cfg.rope_kv && (ntok != 1 || cfg.rows_per_warp != 2 || cfg.fuse == Fuse::ResidualNorm) {
        k.reject(format!(
            "rope + KV append takes one token, two rows per warp and no residual norm, not {cfg:?}"
        ));
        return;
    }
    k.max_threads(32, cfg.warps_per_cta, 1);
    let sm90 = matches!(
        k.target(),
        smelt_ptx::Target::Sm90 | smelt_ptx::Target::Sm90a
    );
    if cfg.fuse == Fuse::ResidualNorm && F::COMPACT && sm90 {
        // Two 512-thread blocks per SM (64 registers): as many warps as the plain GEMV's
        // (78 registers left one). Q4_K so takes 0.7 us more per launch than the plain
        // GEMV at 4096x4096 and 4096x14336 (H100, graph replays, `smelt bench --kernels`,
        // 2026-11-25). Other formats, and these for sm_80, would spill at 64.
        k.min_blocks_per_sm(2);
    }
    let GemvRegs {
        w,
        x,
        y,
        nrows,
        ntiles,
        row_bytes,
        never,
    } = GemvRegs::declare(k);
    let fused = match cfg.fuse {
        Fuse::None => Fused::None,
        Fuse::ResidualNorm => {
            let ResNormRegs {
                res,
                g,
                q,
                partials,
            } = ResNormRegs::declare(k);
            Fused::ResidualNorm {
                res,
                g,
                q,
                partials,
            }
        }
        Fuse::RmsInput => {
            let RmsInputRegs {
                partials,
                nparts,
                n,
                eps,
                res,
                g,
                out,
            } = RmsInputRegs::declare(k);
            Fused::RmsInput {
                partials,
                nparts,
                n,
                eps,
                res,
                g,
                out,
            }
        }
    };

    let rope = cfg.rope_kv.then(|| RopeKv::params(k));

    let nr = cfg.rows_per_warp as usize;
    // The warp's group of rows, and (split) which of the group's warps it is.
    let (warp, share) = if cfg.split == 1 {
        (
            k.mad(k.reg(), k.ctaid_x(), cfg.warps_per_cta, k.tid_y()),
            None,
        )
    } else {
        let in_block = k.shr(k.reg(), k.tid_y(), cfg.split.trailing_zeros());
        let group = k.mad(
            k.reg(),
            k.ctaid_x(),
            cfg.warps_per_cta / cfg.split,
            in_block,
        );
        (group, Some(k.and(k.reg(), k.tid_y(), cfg.split - 1)))
    };
    let first_row = k.mul(k.reg(), warp, cfg.rows_per_warp);
    // Fused kernels keep every warp to the end: their blocks meet at a barrier or share
    // a grid-wide loop; so do split ones, whose warps meet at a barrier.
    if let (Fused::None, None) = (&fused, share) {
        k.exit_if(k.ge(first_row, nrows));
    }
    let last = k.sub(k.reg(), nrows, 1u32);
    // Rows past the end read the last row again and store nothing.
    let rows: Vec<_> = (0..nr)
        .map(|r| {
            let row = k.add(k.reg(), first_row, r as u32);
            k.min(row, row, last)
        })
        .collect();
    let lane = k.tid_x();
    let part = k.and(k.reg(), lane, 3u32);
    let first = k.shr(k.reg(), lane, 2u32);
    // A split warp starts `share` steps in and takes every `split`-th step.
    let first = match share {
        Some(p) => k.mad(k.reg(), p, 8u32, first),
        None => first,
    };
    let stride = 8 * cfg.split;
    let wrows: Vec<_> = rows
        .iter()
        .map(|&row| k.add(k.reg(), w, k.mul_wide(k.reg::<U64>(), row, row_bytes)))
        .collect();
    let setup = F::setup(k, part, ntiles);
    let how = WeightLoad { no_l1: cfg.no_l1 };
    let sink = k.label();
    // Launched ahead of its input (programmatic dependent launch), the warp loads its
    // first step's weights into registers while the kernel before it runs: no kernel
    // writes the weights, so they may be read before the wait; the activations only after
    // it. (Whole rows prefetched into L2 instead lost 10-15%: they did not fit beside the
    // kernel before; the rows' first lines into L2 gained under 1%.)
    let hoisted = k.grid_dep().early_work.then(|| {
        let valid = k.lt(first, ntiles);
        let last_tile = k.sub(k.reg(), ntiles, 1u32);
        let tile = k.min(k.reg(), first, last_tile);
        let weights: Vec<_> = wrows
            .iter()
            .map(|&wr| F::load(k, &setup, wr, tile, how))
            .collect();
        if cfg.pin_loads {
            pin(k, weights.iter().flat_map(F::load_words), never, sink);
        }
        (valid, weights)
    });
    // The host wrote the position and the block table before the step: read before the wait.
    let slot = rope.as_ref().map(|r| r.slot(k));
    k.grid_dep_wait();
    // What the epilogue reads, loaded before the main loop so it arrives during it.
    let early = Early::load(k, &fused, &rows, lane);
    let (b0, b1) = F::act_blocks(k, part);
    let slots = ActSlots::new(k, b0, b1);
    let token_stride = k.mul_wide(k.reg::<U64>(), ntiles, act::TILE_BYTES as u32);
    let accs: Vec<Vec<_>> = (0..nr)
        .map(|_| (0..ntok).map(|_| k.f32(0.0)).collect())
        .collect();

    // One loop step: tile `tile`'s activations for every token, dotted with `weights`
    // (this step's tile of each of the warp's rows).
    let step = |k: &Kernel, tile: Reg<U32>, weights: Vec<F::Loaded>, pin_weights: bool| {
        let xtile = k.add(
            k.reg(),
            x,
            k.mul_wide(k.reg::<U64>(), tile, act::TILE_BYTES as u32),
        );
        let token_at = |t: usize| {
            if t == 0 {
                xtile
            } else {
                k.add(xtile, xtile, token_stride)
            }
        };
        let xs: Vec<_> = (0..cfg.act_ahead)
            .map(|t| act::load_tile(k, token_at(t), &slots))
            .collect();
        if cfg.pin_loads {
            let weight_words = weights
                .iter()
                .filter(|_| pin_weights)
                .flat_map(F::load_words);
            let act_words = xs
                .iter()
                .flat_map(|xa| [xa.q[0], xa.q[8], xa.sum[0].cast(), xa.sum[1].cast()]);
            pin(k, weight_words.chain(act_words), never, sink);
        }
        let decoded: Vec<_> = weights.iter().map(|wl| F::decode(k, &setup, wl)).collect();
        for t in 0..ntok {
            let later;
            let xa = match xs.get(t) {
                Some(xa) => xa,
                None => {
                    later = act::load_tile(k, token_at(t), &slots);
                    &later
                }
            };
            for (dw, acc_r) in decoded.iter().zip(&accs) {
                F::dot(k, &setup, dw, xa, acc_r[t]);
            }
        }
    };
    let loop_from = match hoisted {
        Some((valid, weights)) => {
            k.if_(valid, |k| step(k, first, weights, false));
            k.add(k.reg(), first, stride)
        }
        None => first,
    };
    k.stride_loop(loop_from, ntiles, stride, |k, tile| {
        let weights: Vec<_> = wrows
            .iter()
            .map(|&wr| F::load(k, &setup, wr, tile, how))
            .collect();
        step(k, tile, weights, true);
    });

    let sums: Vec<Vec<_>> = accs
        .iter()
        .map(|acc_r| acc_r.iter().map(|&a| k.warp_sum(a)).collect())
        .collect();
    // A split group's warps meet: each writes its sums, the group's first warp adds the
    // others' in order and alone stores.
    if let Some(p) = share {
        let ntok32 = ntok as u32;
        let red = k.shared::<F32>(
            "gemv_split",
            cfg.warps_per_cta * cfg.rows_per_warp * ntok32,
            16,
        );
        let base = k.shared_base(&red);
        let at = |k: &Kernel, warp_y: Reg<U32>, r: usize, t: usize| {
            let slot = k.mad(
                k.reg(),
                warp_y,
                cfg.rows_per_warp * ntok32,
                (r * ntok + t) as u32,
            );
            k.mad(k.reg(), slot, 4u32, base)
        };
        let lane0 = k.eq(lane, 0u32);
        for (r, sums_r) in sums.iter().enumerate() {
            for (t, &v) in sums_r.iter().enumerate() {
                let a = at(k, k.tid_y(), r, t);
                k.guarded(lane0, |k| k.st(Store::SHARED, a, v));
            }
        }
        k.bar_sync();
        let lead = k.eq(p, 0u32);
        k.if_(lead, |k| {
            for other in 1..cfg.split {
                let wy = k.add(k.reg(), k.tid_y(), other);
                for (r, sums_r) in sums.iter().enumerate() {
                    for (t, &v) in sums_r.iter().enumerate() {
                        let o = k.load::<F32>(Load::SHARED, at(k, wy, r, t));
                        k.add(v, v, o);
                    }
                }
            }
        });
    }
    let inv_rms = match (&fused, &early) {
        (Fused::RmsInput { n, eps, .. }, Early::Parts(parts)) => {
            // Loaded before the loop (16 more registers): loaded after it, they cost
            // 0.3 us more per launch at 6144x4096 (H100, 2026-11-25).
            let inv = rms_from_partials(k, parts, *n, *eps);
            for s in sums.iter().flatten() {
                k.mul(*s, *s, inv);
            }
            Some(inv)
        }
        _ => None,
    };
    if let (Some(r), Some(slot)) = (&rope, &slot) {
        r.epilogue(k, slot, first_row, nrows, lane, sums[0][0], sums[1][0]);
    }
    for (r, sums_r) in sums.iter().enumerate() {
        let row = k.add(k.reg(), first_row, r as u32);
        let store = k.lt(row, nrows);
        let lane0 = k.eq(lane, 0u32);
        k.and(store, store, lane0);
        if let Some(p) = share {
            let lead = k.eq(p, 0u32);
            k.and(store, store, lead);
        }
        k.if_(store, |k| {
            let mut out = k.elem_addr(y, row, 4);
            let stride = k.mul_wide(k.reg::<U64>(), nrows, 4u32);
            for (t, s) in sums_r.iter().enumerate() {
                if t > 0 {
                    out = k.add(out, out, stride);
                }
                k.st(Store::GLOBAL, out, *s);
            }
        });
    }
    match (&fused, &early) {
        (
            Fused::ResidualNorm {
                res,
                g,
                q,
                partials,
            },
            Early::Rows(rg),
        ) => {
            let sums: Vec<_> = sums.iter().map(|s| s[0]).collect();
            residual_norm_epilogue(
                k, cfg, nrows, first_row, lane, &sums, rg, *res, *g, *q, *partials,
            );
        }
        (Fused::RmsInput { n, res, g, out, .. }, _) => {
            if let Some(inv) = inv_rms {
                write_norm_output(k, cfg, *n, *res, *g, *out, inv, lane);
            }
        }
        _ => {}
    }
    if cfg.pin_loads {
        k.exit();
    }
    k.place(sink);
}

/// Ends a group of loads with a branch to `sink` that depends on every one of `words` and
/// is never taken (`never` is 0): ptxas cannot know that, so it issues all the loads
/// before the branch instead of interleaving them with their uses.
fn pin(k: &Kernel, words: impl IntoIterator<Item = Reg<U32>>, never: Reg<U32>, sink: Label) {
    let all = k.u32(0);
    for word in words {
        k.xor(all, all, word);
    }
    let hit = k.cmp(Cmp::Eq, all, never);
    let armed = k.cmp(Cmp::Ne, never, 0u32);
    k.and(hit, hit, armed);
    k.bra_if(hit, sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_configs_have_their_own_names_and_refuse_bad_shapes() {
        use crate::formats::Q4K;
        assert_eq!(
            Config::residual_norm().name::<Q4K>(),
            "gemv_q4_k_t1_resnorm"
        );
        assert_eq!(Config::rms_input().name::<Q4K>(), "gemv_q4_k_t1_rmsin");
        assert_eq!(
            Config::rms_input().with_rows(4).name::<Q4K>(),
            "gemv_q4_k_t1_rmsin_r4"
        );
        let odd = Config {
            warps_per_cta: 8,
            ..Config::residual_norm()
        };
        assert_eq!(odd.name::<Q4K>(), "gemv_q4_k_t1_resnorm_r2_w8");
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        assert!(m.kernel("a", |k| kernel::<Q4K>(k, odd)).is_err());
        let two = Config {
            ntok: 2,
            ..Config::rms_input()
        };
        assert!(m.kernel("b", |k| kernel::<Q4K>(k, two)).is_err());
        m.kernel("c", |k| kernel::<Q4K>(k, Config::residual_norm()))
            .unwrap();
        m.kernel("d", |k| kernel::<Q4K>(k, Config::rms_input()))
            .unwrap();
        m.kernel("e", |k| kernel::<Q4K>(k, Config::rms_input().with_rows(4)))
            .unwrap();
        let ptx = m.to_ptx();
        assert!(ptx.contains("bar.sync"));
    }

    #[test]
    fn split_gemvs_share_rows_between_warps_and_meet_at_a_barrier() {
        use crate::formats::Q4K;
        let s2 = Config {
            split: 2,
            ..Config::new(1)
        };
        assert_eq!(s2.name::<Q4K>(), "gemv_q4_k_t1_r2_s2");
        assert_eq!(s2.rows_per_cta(), 4);
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        for (i, bad) in [
            Config { split: 3, ..s2 },
            Config {
                warps_per_cta: 2,
                split: 4,
                ..s2
            },
            Config {
                split: 2,
                ..Config::rms_input()
            },
        ]
        .into_iter()
        .enumerate()
        {
            assert!(m
                .kernel(&format!("bad{i}"), |k| kernel::<Q4K>(k, bad))
                .is_err());
        }
        m.kernel("s2", |k| kernel::<Q4K>(k, s2)).unwrap();
        let ptx = m.to_ptx();
        assert!(ptx.contains("bar.sync") && ptx.contains("st.shared.f32"));
    }

    #[test]
    fn rope_kv_gemvs_have_their_own_names_and_need_pairs_in_one_warp() {
        use crate::formats::Q4K;
        let rms = Config::rms_input().with_rope_kv();
        let plain = Config::new(1).with_rope_kv();
        assert_eq!(rms.name::<Q4K>(), "gemv_q4_k_t1_rmsin_ropekv");
        assert_eq!(plain.name::<Q4K>(), "gemv_q4_k_t1_ropekv");
        let mut m = smelt_ptx::Module::new(smelt_ptx::Target::Sm90);
        for (i, bad) in [
            Config::new(2).with_rope_kv(),
            Config {
                rows_per_warp: 1,
                ..plain
            },
            Config::residual_norm().with_rope_kv(),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(m
                .kernel(&format!("bad{i}"), |k| kernel::<Q4K>(k, bad))
                .is_err());
        }
        m.kernel("a", |k| kernel::<Q4K>(k, rms)).unwrap();
        m.kernel("b", |k| kernel::<Q4K>(k, plain)).unwrap();
        let ptx = m.to_ptx();
        // The K and V halves stored as one word each, the angle reduced in f64.
        assert!(ptx.contains("cvt.rn.f16.f32"));
        assert!(ptx.contains(".f64"));
    }
}
