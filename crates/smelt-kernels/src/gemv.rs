//! `y[t][r] = W[r] . x[t]` for quantized weights `W` (rows of `k`) and 1 to 8 tokens of
//! activations already quantized by [`crate::act::quantize_kernel`]: the decode-time
//! matrix-vector product.
//!
//! One warp per row; four threads per 256-weight tile, so a warp covers eight tiles per
//! step. Each step issues all of its loads (weights once, activations per token) before any
//! arithmetic, unpacks the weights once and dots them with every token's activations, so
//! 2..8 tokens read the weights once. The warp's partial sums meet in a butterfly.

use smelt_ptx::{
    Cmp, Exact, FloatRound, Kernel, Label, Load, Narrow, Reg, Store, F16, F32, U32, U64,
};

use crate::act::{self, ActSlots};
use crate::formats::{GpuFormat, WeightLoad};
use crate::fused::quantize_warp_block;
use crate::ops::kernel_params;
use crate::{padded_tiles, GgmlType, KernelError, TILE};

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
        self.warps_per_cta * self.rows_per_warp
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
    let warp = k.mad(k.reg(), k.ctaid_x(), cfg.warps_per_cta, k.tid_y());
    let first_row = k.mul(k.reg(), warp, cfg.rows_per_warp);
    // Fused kernels keep every warp to the end: their blocks meet at a barrier or share
    // a grid-wide loop.
    if let Fused::None = fused {
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
            k.add(k.reg(), first, 8u32)
        }
        None => first,
    };
    k.stride_loop(loop_from, ntiles, 8u32, |k, tile| {
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

/// The parameters of the rope + KV-append epilogue ([`Config::rope_kv`]).
struct RopeKv {
    pos: Reg<U64>,
    freq_factors: Reg<U64>,
    k_cache: Reg<U64>,
    v_cache: Reg<U64>,
    seqs: Reg<U64>,
    tables: Reg<U64>,
    q_rows: Reg<U32>,
    kv_dim: Reg<U32>,
    head_dim: Reg<U32>,
    block_size: Reg<U32>,
    theta_scale: Reg<F32>,
    freq_scale: Reg<F32>,
}

/// Where the token's K and V go, and its position, loaded before the wait.
struct RopeSlot {
    pos: Reg<U32>,
    /// Element index of the slot's row in either cache.
    base: Reg<U64>,
}

impl RopeKv {
    fn params(k: &Kernel) -> Self {
        let r = RopeKvRegs::declare(k);
        Self {
            pos: r.pos,
            freq_factors: r.freq_factors,
            k_cache: r.k_cache,
            v_cache: r.v_cache,
            seqs: r.seqs,
            tables: r.block_tables,
            q_rows: r.q_rows,
            kv_dim: r.kv_dim,
            head_dim: r.head_dim,
            block_size: r.block_size,
            theta_scale: r.theta_scale,
            freq_scale: r.freq_scale,
        }
    }

    /// The token's position and cache slot, found as `rope_kv_rows_kernel` finds them.
    fn slot(&self, k: &Kernel) -> RopeSlot {
        let pos = k.load::<U32>(Load::GLOBAL_NC, self.pos);
        let w = k.regs::<U32, 4>();
        k.ld_v4(Load::GLOBAL_NC, w, self.seqs);
        let (start, bto) = (w[2], w[3]);
        let bi = k.div_int(k.reg(), start, self.block_size);
        let off = k.rem(k.reg(), start, self.block_size);
        let ti = k.add(k.reg(), bto, bi);
        let block = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(self.tables, ti, 4));
        let slot = k.mad(k.reg(), block, self.block_size, off);
        RopeSlot {
            pos,
            base: k.mul_wide(k.reg::<U64>(), slot, self.kv_dim),
        }
    }

    /// Rotates the warp's rows `first_row`, `first_row + 1` (`y0`, `y1`, in place) when
    /// they are a Q or K pair, and stores K and V rows as f16 at the slot (lane 0): the
    /// operations of `rope_kv_rows_kernel`, on the values it would have read back.
    #[allow(clippy::too_many_arguments)]
    fn epilogue(
        &self,
        k: &Kernel,
        slot: &RopeSlot,
        first_row: Reg<U32>,
        nrows: Reg<U32>,
        lane: Reg<U32>,
        y0: Reg<F32>,
        y1: Reg<F32>,
    ) {
        let rot_end = k.add(k.reg(), self.q_rows, self.kv_dim);
        let rotated = k.lt(first_row, rot_end);
        k.if_(rotated, |k| {
            let within = k.rem(k.reg(), first_row, self.head_dim);
            let pair = k.shr(k.reg(), within, 1u32);
            let (sin, cos) = crate::ops::rope::angle(
                k,
                slot.pos,
                pair,
                self.freq_factors,
                self.theta_scale,
                self.freq_scale,
            );
            let (r0, r1) = crate::ops::rope::rotate(k, y0, y1, sin, cos);
            k.mov(y0, r0);
            k.mov(y1, r1);
        });
        let store = k.ge(first_row, self.q_rows);
        k.and(store, store, k.lt(first_row, nrows));
        k.and(store, store, k.eq(lane, 0u32));
        k.if_(store, |k| {
            let col = k.sub(k.reg(), first_row, self.q_rows);
            let is_v = k.ge(col, self.kv_dim);
            let vcol = k.sub(k.reg(), col, self.kv_dim);
            k.selp(col, vcol, col, is_v);
            let cache = k.copy(self.k_cache);
            k.selp(cache, self.v_cache, self.k_cache, is_v);
            let e = k.cvt(k.reg::<U64>(), col, Exact);
            k.add(e, e, slot.base);
            k.shl(e, e, 1u32);
            let (h0, h1) = (k.reg::<F16>(), k.reg::<F16>());
            k.cvt(h0, y0, FloatRound::Rn);
            k.cvt(h1, y1, FloatRound::Rn);
            let both = k.reg::<U32>();
            k.raw(format!("mov.b32 {both}, {{{h0}, {h1}}}"));
            k.st(Store::GLOBAL, k.add(k.reg(), cache, e), both);
        });
    }
}

/// The parameters of a fused GEMV's epilogue.
enum Fused {
    None,
    ResidualNorm {
        res: Reg<U64>,
        g: Reg<U64>,
        q: Reg<U64>,
        partials: Reg<U64>,
    },
    RmsInput {
        partials: Reg<U64>,
        nparts: Reg<U32>,
        n: Reg<U32>,
        eps: Reg<F32>,
        res: Reg<U64>,
        g: Reg<U64>,
        out: Reg<U64>,
    },
}

/// What the epilogue reads from memory, loaded before the main loop.
enum Early {
    None,
    /// Per row of the warp: `res[row]`.
    Rows(Vec<Reg<F32>>),
    /// This lane's partial sums `partials[lane + 32 j]` (0 past `nparts`).
    Parts(Vec<Reg<F32>>),
}

impl Early {
    fn load(k: &Kernel, fused: &Fused, rows: &[Reg<U32>], lane: Reg<U32>) -> Self {
        match *fused {
            Fused::None => Early::None,
            Fused::ResidualNorm { res, .. } => Early::Rows(
                rows.iter()
                    // `res` was written by an earlier kernel and is written again by this
                    // one: coherent loads.
                    .map(|&row| k.load::<F32>(Load::GLOBAL, k.elem_addr(res, row, 4)))
                    .collect(),
            ),
            Fused::RmsInput {
                partials, nparts, ..
            } => Early::Parts(
                (0..MAX_PARTS / 32)
                    .map(|j| {
                        let v = k.f32(0.0);
                        let i = k.add(k.reg(), lane, 32 * j);
                        let inside = k.lt(i, nparts);
                        k.guarded(inside, |k| {
                            k.ld(Load::GLOBAL_NC, v, k.elem_addr(partials, i, 4));
                        });
                        v
                    })
                    .collect(),
            ),
        }
    }
}

/// `1 / sqrt(sum(partials) / n + eps)`, the same bits in every lane of every warp: each
/// lane adds its partials in index order, then the warp's butterfly; then the norm
/// kernels' operations (`ops::norm`): IEEE division, `sqrt.rn`, IEEE reciprocal.
pub(crate) fn rms_from_partials(
    k: &Kernel,
    parts: &[Reg<F32>],
    n: Reg<U32>,
    eps: Reg<F32>,
) -> Reg<F32> {
    let acc = k.f32(0.0);
    for &p in parts {
        k.add(acc, acc, p);
    }
    let total = k.warp_sum(acc);
    let nf = k.cvt(k.reg::<F32>(), n, FloatRound::Rn);
    let mean = k.div_rn(k.reg(), total, nf);
    k.add(mean, mean, eps);
    let root = k.sqrt_rn(k.reg(), mean);
    k.div_rn(k.reg(), 1.0f32, root)
}

/// The producer's epilogue: `res[row] += y[row]`; the block's 32 values of `res * g` as one
/// q8_1 block of `q` (unscaled by the RMS) and its sum of `res²` into `partials[block]`;
/// block 0 also zeroes the q8_1 blocks that pad the last tile past `nrows`.
#[allow(clippy::too_many_arguments)]
fn residual_norm_epilogue(
    k: &Kernel,
    cfg: Config,
    nrows: Reg<U32>,
    first_row: Reg<U32>,
    lane: Reg<U32>,
    sums: &[Reg<F32>],
    rv: &[Reg<F32>],
    res: Reg<U64>,
    g: Reg<U64>,
    q: Reg<U64>,
    partials: Reg<U64>,
) {
    let vals = k.shared::<F32>("resnorm_v", NORM_ROWS_PER_CTA, 16);
    let squares = k.shared::<F32>("resnorm_sq", NORM_ROWS_PER_CTA, 16);
    let vbase = k.shared_base(&vals);
    let sbase = k.shared_base(&squares);
    let lane0 = k.eq(lane, 0u32);
    for (r, (&s, &old)) in sums.iter().zip(rv).enumerate() {
        let row = k.add(k.reg(), first_row, r as u32);
        let inside = k.lt(row, nrows);
        let gv = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(g, row, 4));
        let nres = k.add(k.reg(), old, s);
        let v = k.mul(k.reg(), nres, gv);
        let sq = k.mul(k.reg(), nres, nres);
        // Rows past the end (never, with whole 32-row blocks) count as zeros.
        k.selp(v, v, 0.0f32, inside);
        k.selp(sq, sq, 0.0f32, inside);
        let store = k.and(k.reg(), inside, lane0);
        k.guarded(store, |k| {
            k.st(Store::GLOBAL, k.elem_addr(res, row, 4), nres)
        });
        let slot = k.mad(k.reg(), k.tid_y(), cfg.rows_per_warp, r as u32);
        let va = k.mad(k.reg(), slot, 4u32, vbase);
        let sa = k.mad(k.reg(), slot, 4u32, sbase);
        k.guarded(lane0, |k| {
            k.st(Store::SHARED, va, v);
            k.st(Store::SHARED, sa, sq);
        });
    }
    k.bar_sync();
    let warp0 = k.eq(k.tid_y(), 0u32);
    k.if_(warp0, |k| {
        let v = k.load::<F32>(Load::SHARED, k.mad(k.reg(), lane, 4u32, vbase));
        let sq = k.load::<F32>(Load::SHARED, k.mad(k.reg(), lane, 4u32, sbase));
        let f = k.mad(k.reg(), k.ctaid_x(), NORM_ROWS_PER_CTA, lane);
        quantize_warp_block(k, v, lane, f, q);
        let total = k.warp_sum(sq);
        k.guarded(lane0, |k| {
            k.st(Store::GLOBAL, k.elem_addr(partials, k.ctaid_x(), 4), total)
        });
    });
    // The last tile's blocks past `nrows` (a row of 576 fills 2.25 tiles): zeros, as the
    // quantize kernel writes them, so the consumer's padded weights meet zeros, not junk.
    let warp1 = k.eq(k.tid_y(), 1u32);
    let block0 = k.eq(k.ctaid_x(), 0u32);
    k.and(warp1, warp1, block0);
    k.if_(warp1, |k| {
        let used = k.shr(k.reg(), nrows, 5u32);
        let ntiles = k.add(k.reg(), nrows, (TILE - 1) as u32);
        k.shr(ntiles, ntiles, 8u32);
        let total = k.shl(k.reg(), ntiles, 3u32);
        let b = k.add(k.reg(), used, lane);
        let pad = k.lt(b, total);
        k.guarded(pad, |k| {
            let tile = k.shr(k.reg(), b, 3u32);
            let slot = k.and(k.reg(), b, 7u32);
            let tdst = k.elem_addr(q, tile, act::TILE_BYTES as u32);
            let qdst = k.add(k.reg(), tdst, k.mul_wide(k.reg::<U64>(), slot, 32u32));
            let z = k.u32(0);
            k.st_v4(Store::GLOBAL, qdst, [z, z, z, z]);
            k.st_v4(Store::GLOBAL, qdst.at(16), [z, z, z, z]);
            let hdst = k.add(k.reg(), tdst, k.mul_wide(k.reg::<U64>(), slot, 2u32));
            for off in [act::D_OFFSET, act::SUM_OFFSET, act::S_OFFSET] {
                k.st_narrow(Store::GLOBAL, Narrow::U16, hdst.at(off as i64), z);
            }
        });
    });
}

/// The consumer's second job: `out[i] = res[i] * inv_rms * g[i]` (the norm kernels'
/// operations and order) for every `i < n`, spread over all threads of the grid.
#[allow(clippy::too_many_arguments)]
fn write_norm_output(
    k: &Kernel,
    cfg: Config,
    n: Reg<U32>,
    res: Reg<U64>,
    g: Reg<U64>,
    out: Reg<U64>,
    inv: Reg<F32>,
    lane: Reg<U32>,
) {
    let wanted = k.cmp(Cmp::Ne, out, 0u64);
    k.if_(wanted, |k| {
        let threads = 32 * cfg.warps_per_cta;
        let tid = k.mad(k.reg(), k.tid_y(), 32u32, lane);
        let start = k.mad(k.reg(), k.ctaid_x(), threads, tid);
        let step = k.mul(k.reg(), k.nctaid_x(), threads);
        k.stride_loop(start, n, step, |k, i| {
            let v = k.load::<F32>(Load::GLOBAL, k.elem_addr(res, i, 4));
            let gv = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(g, i, 4));
            k.mul(v, v, inv);
            k.mul(v, v, gv);
            k.st(Store::GLOBAL, k.elem_addr(out, i, 4), v);
        });
    });
}

/// CPU twin of [`kernel`]: `y[t][r] = sum_i W[r][i] * x[t][i]` in f64, with `W` dequantized
/// from its ggml bytes by `smelt_quant` and `x` dequantized from the activation tiles.
pub fn cpu(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<Vec<f32>, KernelError> {
    Ok(cpu_with_magnitude(ty, ggml, nrows, k, x, ntok)?.0)
}

/// [`cpu`], plus each output's `sum_i |W[r][i] * x[t][i]|`: the scale that float rounding
/// errors of a dot product grow with, so a parity check can bound the error by it instead
/// of by the result (which cancellation can make arbitrarily small).
pub fn cpu_with_magnitude(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let tiles = TwinTiles {
        tile_bytes: act::TILE_BYTES,
        dequantize: act::dequantize_tile,
        // The Q4_1/Q5_1 minimum term as ggml-cpu rounds it (`m * s`).
        shift: &|row: &[u8], tiles: &[u8]| {
            crate::formats::legacy::cpu_min_term_shift(ty, row, tiles, k)
        },
    };
    dot_twin(ty, ggml, nrows, k, x, ntok, &tiles)
}

/// How a twin reads one token's activation tiles.
pub(crate) struct TwinTiles<'a> {
    /// Bytes of one tile.
    pub tile_bytes: usize,
    /// The tile's 256 values.
    pub dequantize: fn(&[u8]) -> [f64; TILE],
    /// What to add to a row's product with one token's tiles (`ggml` row, tiles).
    pub shift: &'a dyn Fn(&[u8], &[u8]) -> f64,
}

/// `y[t][r] = sum_i W[r][i] * x[t][i]` in f64 and each output's `sum_i |W[r][i] x[t][i]|`,
/// `W` dequantized from its ggml bytes by `smelt_quant`, `x` from `ntok` rows of tiles: the
/// CPU twin of the GEMV and of the GEMM (which differ in their activation tiles).
pub(crate) fn dot_twin(
    ty: GgmlType,
    ggml: &[u8],
    nrows: usize,
    k: usize,
    x: &[u8],
    ntok: usize,
    tiles: &TwinTiles<'_>,
) -> Result<(Vec<f32>, Vec<f64>), KernelError> {
    let ntiles = padded_tiles(k, "matmul twin")?;
    let want_x = ntok * ntiles * tiles.tile_bytes;
    if x.len() != want_x {
        return Err(KernelError::BadLength {
            what: "quantized activations",
            got: x.len(),
            want: want_x,
        });
    }
    let row_ggml = k / ty.block_size() * ty.type_size();
    if ggml.len() != nrows * row_ggml {
        return Err(KernelError::BadLength {
            what: "ggml weights",
            got: ggml.len(),
            want: nrows * row_ggml,
        });
    }
    let xs: Vec<f64> = x
        .chunks_exact(tiles.tile_bytes)
        .flat_map(tiles.dequantize)
        .collect();
    let mut y = vec![0f32; ntok * nrows];
    let mut mag = vec![0f64; ntok * nrows];
    let mut w = vec![0f32; k];
    for r in 0..nrows {
        let row = &ggml[r * row_ggml..(r + 1) * row_ggml];
        smelt_quant::dequantize_row(ty, row, &mut w)?;
        for t in 0..ntok {
            let xt = &xs[t * ntiles * TILE..t * ntiles * TILE + k];
            let (mut dot, mut abs) = (0f64, 0f64);
            for (&a, &b) in w.iter().zip(xt) {
                let p = f64::from(a) * b;
                dot += p;
                abs += p.abs();
            }
            let own = &x[t * ntiles * tiles.tile_bytes..(t + 1) * ntiles * tiles.tile_bytes];
            y[t * nrows + r] = (dot + (tiles.shift)(row, own)) as f32;
            mag[t * nrows + r] = abs;
        }
    }
    Ok((y, mag))
}

/// CPU twin of a [`Fuse::ResidualNorm`] GEMV's tiles: the q8_1 tiles of `res * g` (f32
/// products, as the kernel forms them) for the updated `res`, padded with zero blocks.
pub fn residual_norm_tiles(res: &[f32], g: &[f32]) -> Result<Vec<u8>, KernelError> {
    if res.len() != g.len() || res.is_empty() || res.len() % 32 != 0 {
        return Err(KernelError::BadLength {
            what: "residual row (a multiple of 32, as long as the norm's weights)",
            got: res.len(),
            want: g.len().div_ceil(32).max(1) * 32,
        });
    }
    let v: Vec<f32> = res.iter().zip(g).map(|(&r, &w)| r * w).collect();
    act::quantize_cpu(&v, v.len())
}

/// CPU twin of a [`Fuse::ResidualNorm`] GEMV's partial sums: `sum(res²)` over each block's
/// [`NORM_ROWS_PER_CTA`] rows of the updated `res`, in f64.
pub fn residual_norm_partials(res: &[f32]) -> Vec<f64> {
    res.chunks(NORM_ROWS_PER_CTA as usize)
        .map(|c| c.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
        .collect()
}

/// CPU twin of a [`Fuse::RmsInput`] GEMV's scale: `1 / sqrt(sum(partials) / n + eps)`.
pub fn rms_input_scale(partials: &[f64], n: usize, eps: f32) -> f64 {
    let total: f64 = partials.iter().sum();
    1.0 / (total / n as f64 + f64::from(eps)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The twin computes what it says: the dot of the dequantized weights with the
    /// dequantized activations, close to the dot of the original floats.
    #[test]
    fn twin_is_close_to_the_float_product() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (nrows, k, ntok) = (5, 512, 2);
        let w: Vec<f32> = (0..nrows * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..ntok * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let q = act::quantize_cpu(&x, k).unwrap();
        // smelt-quant has no IQ4 quantizer; the GPU check covers those with random blocks.
        for ty in crate::catalog::GEMV_TYPES
            .into_iter()
            .filter(|&t| smelt_quant::can_quantize(t))
        {
            let row = k / ty.block_size() * ty.type_size();
            let mut ggml = vec![0u8; nrows * row];
            for (src, dst) in w.chunks_exact(k).zip(ggml.chunks_exact_mut(row)) {
                smelt_quant::quantize_row(ty, src, dst).unwrap();
            }
            let (y, mag) = cpu_with_magnitude(ty, &ggml, nrows, k, &q, ntok).unwrap();
            for t in 0..ntok {
                for r in 0..nrows {
                    let exact: f64 = (0..k)
                        .map(|i| f64::from(w[r * k + i]) * f64::from(x[t * k + i]))
                        .sum();
                    let got = f64::from(y[t * nrows + r]);
                    // Quantization error: a few percent of the magnitude at most.
                    assert!((got - exact).abs() < 0.05 * mag[t * nrows + r], "{ty:?}");
                }
            }
        }
    }

    /// The split residual norm computes the unfused one: a GEMV over the unscaled tiles of
    /// `res * g`, scaled by `1 / rms` from the partial sums, is the GEMV over the tiles of
    /// `rms_norm(res) * g` up to quantization rounding, for a row that does not fill its
    /// last tile (576) and one that does.
    #[test]
    fn split_residual_norm_is_the_norm_then_the_gemv() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [576, 1024] {
            let nrows = 6;
            let res: Vec<f32> = (0..n).map(|_| rng.gen_range(-30.0..30.0)).collect();
            let g: Vec<f32> = (0..n).map(|_| rng.gen_range(0.5..1.5)).collect();
            let w: Vec<f32> = (0..nrows * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let ty = GgmlType::Q8_0;
            let row = n / ty.block_size() * ty.type_size();
            let mut ggml = vec![0u8; nrows * row];
            for (src, dst) in w.chunks_exact(n).zip(ggml.chunks_exact_mut(row)) {
                smelt_quant::quantize_row(ty, src, dst).unwrap();
            }
            let eps = 1e-5;
            let mut x = res.clone();
            let (_, normed_q) = crate::fused::cpu(&mut x, None, &g, eps).unwrap();
            let want = cpu(ty, &ggml, nrows, n, &normed_q, 1).unwrap();
            let tiles = residual_norm_tiles(&res, &g).unwrap();
            assert_eq!(tiles.len(), normed_q.len());
            let parts = residual_norm_partials(&res);
            assert_eq!(parts.len(), n / 32);
            let inv = rms_input_scale(&parts, n, eps);
            let exact: f64 = res.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            assert!((inv - 1.0 / (exact + 1e-5).sqrt()).abs() < 1e-12);
            let got = cpu(ty, &ggml, nrows, n, &tiles, 1).unwrap();
            for (g, w) in got.iter().zip(&want) {
                let scaled = f64::from(*g) * inv;
                assert!((scaled - f64::from(*w)).abs() < 0.02 * f64::from(w.abs()).max(1.0));
            }
        }
        assert!(residual_norm_tiles(&[1.0; 40], &[1.0; 40]).is_err());
        assert!(residual_norm_tiles(&[1.0; 32], &[1.0; 64]).is_err());
    }

    #[test]
    fn fused_configs_have_their_own_names_and_refuse_bad_shapes() {
        use crate::formats::Q4K;
        assert_eq!(
            Config::residual_norm().name::<Q4K>(),
            "gemv_q4_k_t1_resnorm"
        );
        assert_eq!(Config::rms_input().name::<Q4K>(), "gemv_q4_k_t1_rmsin");
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
        let ptx = m.to_ptx();
        assert!(ptx.contains("bar.sync"));
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

    #[test]
    fn twin_checks_its_inputs() {
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 256, &[0; 10], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 100], 1, 256, &[0; act::TILE_BYTES], 1).is_err());
        assert!(cpu(GgmlType::Q4_K, &[0; 144], 1, 100, &[0; act::TILE_BYTES], 1).is_err());
    }
}
