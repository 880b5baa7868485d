//! Prompt attention on the tensor cores: causal flash attention for prefill chunks (many
//! query tokens of a sequence), over the paged f16 KV cache, so a chunk attends to the
//! sequence's cached blocks as well as to its own keys. The split kernel of
//! [`super::attention`] gives each (token, head) pair one warp and dots keys one at a
//! time with FMAs; here a warp takes 16 query rows and multiplies them by 8-key tiles with
//! `mma.sync.m16n8k16` (f16 inputs, f32 accumulation), for `Q·K` and again for `P·V`.
//!
//! A block of [`WARPS`] warps owns [`ROWS`] query rows of one sequence and KV head: the
//! rows are (token, query head of the KV head's group) pairs, token-major, so grouped-query
//! heads share every K and V tile the block stages. For each tile of [`keys_per_tile`]
//! keys (from the first key any row of the block sees, sliding window included, to the
//! last), the block copies the keys' K and V rows into shared memory (`cp.async`, the slot
//! of each key looked up in the sequence's block table), then each warp computes its rows'
//! scores, masks what a row must not see (later positions, positions out of its window),
//! and folds the tile into its rows' online softmax in f32 (running max, running sum,
//! output rescaled by `2^(m_old - m_new)`), exactly as the split kernel does per key.
//!
//! Precision: the query is rounded to f16 (as the other kernels and the CPU backend do),
//! scores and sums are f32, the softmax is base 2 with the scale folded in. The weights
//! `p` are rounded to f16 for the `P·V` product (the tensor cores take f16 pairs), a
//! relative error of at most 2^-11 per weight, so an output differs from the exact
//! softmax by at most ~5e-4 of the largest `|v|` (llama.cpp's flash attention rounds
//! the same way). CPU twin: [`super::attention::attention_cpu`].

use smelt_ptx::{
    Cmp, CpAsyncCache, Exact, Kernel, Load, MmaFloat, Pred, Reg, Store, B32, F32, U32, U64,
};

use super::attention::behind;
use super::{dim, kernel_params, Launch, LOG2E};
use crate::catalog::Entry;

/// Warps per block.
pub const WARPS: u32 = 4;
/// Query rows per warp: the M of `mma.m16n8k16`.
const WARP_ROWS: u32 = 16;
/// Query rows (token, head pairs) per block.
pub const ROWS: u32 = WARPS * WARP_ROWS;

/// Fewest query tokens of one sequence in a step for which the CUDA backend takes this
/// kernel instead of the split kernel. A first guess, to be measured on the card: below
/// a few dozen tokens most of each block's 64 rows would be empty, and the split kernel
/// spreads a long context over more blocks.
pub const MIN_TOKENS: usize = 32;

/// The kernels of each head size (every multiple of 16 from 64 to 256: the `mma` K step is
/// 16 values of a head, the `P·V` N step 8): pipelined (the one the backend runs) and
/// serial (each tile's K and V copied, then used: the first version, kept to compare).
const KERNELS: [(usize, &str, &str); 13] = [
    (
        64,
        "attention_prefill_hd64",
        "attention_prefill_serial_hd64",
    ),
    (
        80,
        "attention_prefill_hd80",
        "attention_prefill_serial_hd80",
    ),
    (
        96,
        "attention_prefill_hd96",
        "attention_prefill_serial_hd96",
    ),
    (
        112,
        "attention_prefill_hd112",
        "attention_prefill_serial_hd112",
    ),
    (
        128,
        "attention_prefill_hd128",
        "attention_prefill_serial_hd128",
    ),
    (
        144,
        "attention_prefill_hd144",
        "attention_prefill_serial_hd144",
    ),
    (
        160,
        "attention_prefill_hd160",
        "attention_prefill_serial_hd160",
    ),
    (
        176,
        "attention_prefill_hd176",
        "attention_prefill_serial_hd176",
    ),
    (
        192,
        "attention_prefill_hd192",
        "attention_prefill_serial_hd192",
    ),
    (
        208,
        "attention_prefill_hd208",
        "attention_prefill_serial_hd208",
    ),
    (
        224,
        "attention_prefill_hd224",
        "attention_prefill_serial_hd224",
    ),
    (
        240,
        "attention_prefill_hd240",
        "attention_prefill_serial_hd240",
    ),
    (
        256,
        "attention_prefill_hd256",
        "attention_prefill_serial_hd256",
    ),
];

/// Name of the prompt attention kernel for heads of `head_dim`, if there is one.
pub fn name(head_dim: usize) -> Option<&'static str> {
    KERNELS.iter().find(|e| e.0 == head_dim).map(|e| e.1)
}

/// Name of the serial variant of [`name`]'s kernel (`kernel(k, head_dim, false)`).
pub fn serial_name(head_dim: usize) -> Option<&'static str> {
    KERNELS.iter().find(|e| e.0 == head_dim).map(|e| e.2)
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for &(hd, n, serial) in &KERNELS {
        v.push((
            n.to_string(),
            Box::new(move |k: &Kernel| kernel(k, hd, true)),
        ));
        v.push((
            serial.to_string(),
            Box::new(move |k: &Kernel| kernel(k, hd, false)),
        ));
    }
    v
}

/// Bytes of shared memory the K and V tiles may take: with the 1 KB the hardware keeps per
/// block, inside the kernels' 32 KB carveout (`catalog::CARVEOUT_BYTES`).
const TILE_BYTES: usize = 24 * 1024;

/// Bytes from one staged K (or V) row to the next: the head's halves and 8 more, so that
/// the 8 rows one `ldmatrix` matrix (or one fragment load) touches fall in different banks
/// (a row is `4 (mod 8)` words long).
fn row_stride(head_dim: usize) -> usize {
    2 * (head_dim + 8)
}

/// Keys per tile: 32 where the K and V tiles fit [`TILE_BYTES`], else 16.
pub fn keys_per_tile(head_dim: usize) -> usize {
    if 2 * 32 * row_stride(head_dim) <= TILE_BYTES {
        32
    } else {
        16
    }
}

kernel_params! {
    /// The parameters of [`kernel`], in order: `q: *const f32 ([rows][n_head *
    /// head_dim])`, `k_cache, v_cache: *const f16` (the layer's caches, see
    /// [`super::kv`]), `seqs: *const SeqDesc, block_tables: *const u32`, `out: *mut f32
    /// ([rows][n_head * head_dim])`; `window`: 0
    /// none, else keys at least `window` positions behind the query are masked; `scale`:
    /// the multiplier of `q·k`; `min_tokens`: the sequences of fewer query tokens are left
    /// to the split kernel (`attention::Args::skip_tokens`, a mixed step's decode rows):
    /// their blocks do nothing; `out16`: 0, or where the output rows go again as f16 rows
    /// for the output projection's GEMM (`fused::Sink::F16Rows`, rows of `n_head *
    /// head_dim` values, a multiple of 256: `gemm::f16::act_kernel`'s layout).
    Args, ArgRegs {
        q: Ptr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        out: Ptr,
        n_head: U32,
        n_head_kv: U32,
        block_size: U32,
        window: U32,
        scale: F32,
        min_tokens: U32,
        out16: MaybePtr,
    }
}

/// Blocks per sequence and KV head: enough for `max_tokens` tokens of the group's heads.
pub fn q_tiles(max_tokens: usize, n_head: usize, n_head_kv: usize) -> usize {
    let group = n_head / n_head_kv.max(1);
    (max_tokens.max(1) * group.max(1)).div_ceil(ROWS as usize)
}

/// Launch for `n_seqs` sequences of at most `max_tokens` query tokens: grid x = query
/// tile, y = KV head, z = sequence; blocks of [`WARPS`] warps.
pub fn launch(n_seqs: usize, max_tokens: usize, n_head: usize, n_head_kv: usize) -> Launch {
    Launch::new(
        (
            dim(q_tiles(max_tokens, n_head, n_head_kv)),
            dim(n_head_kv),
            dim(n_seqs),
        ),
        (32, WARPS, 1),
    )
}

/// One query row of a thread's fragments: its validity, query row index, position and
/// first visible position.
struct Row {
    valid: Reg<Pred>,
    qrow: Reg<U32>,
    pos: Reg<U32>,
    lo: Reg<U32>,
}

/// The prompt attention kernel for heads of `head_dim` values (see the module doc);
/// `pipelined`: each tile's V copied while its scores are computed and the next tile's K
/// while its values are weighted, in the same shared memory (else each tile is copied
/// whole, then used). Parameters: [`Args`]. Launch: [`launch`]. Writes `out` rows of
/// every sequence's tokens, all heads; nothing else.
pub fn kernel(k: &Kernel, head_dim: usize, pipelined: bool) {
    if name(head_dim).is_none() {
        k.reject(format!(
            "no prompt attention kernel for head_dim {head_dim}"
        ));
        return;
    }
    k.max_threads(32, WARPS, 1);
    // Registers over occupancy: the accumulators of large heads need most of the 255 a
    // thread may have, and with the thread cap alone ptxas aimed at more blocks per SM
    // and spilled (hd64 on sm_90 at 96 registers).
    k.min_blocks_per_sm(1);
    let hd = head_dim as u32;
    let bk = keys_per_tile(head_dim) as u32;
    let stride = row_stride(head_dim) as u32;
    let ArgRegs {
        q,
        k_cache: kc,
        v_cache: vc,
        seqs,
        block_tables: tables,
        out,
        n_head,
        n_head_kv,
        block_size: bs,
        window,
        scale,
        min_tokens,
        out16,
    } = ArgRegs::declare(k);
    let lane = k.tid_x();
    let warp = k.tid_y();
    let tid = k.mad(k.reg(), warp, 32u32, lane);
    let kvh = k.ctaid_y();
    let seq = k.special(smelt_ptx::Special::Ctaid(smelt_ptx::Dim::Z));
    let dw = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, dw, k.elem_addr(seqs, seq, 16));
    let [row0, n_tokens, start, bto] = dw;
    let group = k.div_int(k.reg(), n_head, n_head_kv);
    let items = k.mul(k.reg(), n_tokens, group);
    let item0 = k.mul(k.reg(), k.ctaid_x(), ROWS);
    // Whole blocks past the sequence's rows, or of a sequence left to the split kernel,
    // leave before any barrier.
    k.exit_if(k.ge(item0, items));
    k.exit_if(k.lt(n_tokens, min_tokens));
    let last_t = k.sub(k.reg(), n_tokens, 1u32);
    let kv_len = k.add(k.reg(), start, n_tokens);

    // The block's keys: from the first its first token sees to its last token's own.
    let t_first = k.div_int(k.reg(), item0, group);
    let t_last = k.add(k.reg(), item0, ROWS - 1);
    k.div_int(t_last, t_last, group);
    k.min(t_last, t_last, last_t);
    let p_first = k.add(k.reg(), start, t_first);
    let key_lo = behind(k, p_first, window);
    let key_hi = k.add(k.reg(), start, t_last);
    k.add(key_hi, key_hi, 1u32);

    // This thread's two rows: `g` and `g + 8` of its warp's 16 (the mma fragment rows).
    let g = k.shr(k.reg(), lane, 2u32);
    let tq = k.and(k.reg(), lane, 3u32);
    let rows: Vec<Row> = [0u32, 8]
        .iter()
        .map(|&off| {
            let item = k.mad(k.reg(), warp, WARP_ROWS, item0);
            k.add(item, item, g);
            k.add(item, item, off);
            let valid = k.lt(item, items);
            let t = k.div_int(k.reg(), item, group);
            k.min(t, t, last_t);
            let gi = k.rem(k.reg(), item, group);
            let head = k.mad(k.reg(), kvh, group, gi);
            let row = k.add(k.reg(), row0, t);
            let qrow = k.mad(k.reg(), row, n_head, head);
            let pos = k.add(k.reg(), start, t);
            let lo = behind(k, pos, window);
            Row {
                valid,
                qrow,
                pos,
                lo,
            }
        })
        .collect();

    // The query fragments (A of `Q·K`), rounded to f16, for every 16 values of the head:
    // rows g and g + 8, values 2tq, 2tq + 1 and 8 further.
    let col = k.shl(k.reg(), tq, 1u32);
    let qbase: Vec<Reg<U64>> = rows
        .iter()
        .map(|r| {
            let i = k.mad(k.reg(), r.qrow, hd, col);
            k.elem_addr(q, i, 4)
        })
        .collect();
    let qa: Vec<[Reg<B32>; 4]> = (0..head_dim / 16)
        .map(|s| {
            let frag = k.regs::<B32, 4>();
            for (i, half) in [(0usize, 0i64), (1, 0), (0, 8), (1, 8)].iter().enumerate() {
                let (r, extra) = *half;
                let v = k.regs::<F32, 2>();
                k.ld_v2(Load::GLOBAL_NC, v, qbase[r].at(4 * (16 * s as i64 + extra)));
                k.cvt_f16x2(frag[i], v[1], v[0]);
            }
            frag
        })
        .collect();

    // Staged tiles: K rows then V rows, `stride` bytes each.
    let tile = k.shared::<U32>("prefill_kv", 2 * bk * stride / 4, 16);
    let k_s = k.shared_base(&tile);
    let v_s = k.add(k.reg(), k_s, bk * stride);
    // Copy roles: `tpk` threads per key, each some of the row's 16-byte pieces.
    let tpk = 32 * WARPS / bk;
    let pieces = hd / 8;
    let my_key = k.div_int(k.reg(), tid, tpk);
    let my_part = k.rem(k.reg(), tid, tpk);
    let kv_dim = k.mul(k.reg(), n_head_kv, hd);
    let head_bytes = k.mul(k.reg(), kvh, 2 * hd);
    let dst_row = k.mad(k.reg(), my_key, stride, k_s);
    k.mad(dst_row, my_part, 16u32, dst_row);
    let src_part = k.mul(k.reg(), my_part, 16u32);
    k.add(src_part, src_part, head_bytes);
    let src_part = k.cvt(k.reg::<U64>(), src_part, Exact);
    let last_key = k.sub(k.reg(), kv_len, 1u32);

    // The row this lane gives `ldmatrix.x4` (lane `8 m + r` gives row `r` of matrix `m`).
    // K: matrix m holds keys 8 (m / 2) .. + 8 and values 8 (m % 2) .. + 8 of a 16-value
    // step: the B fragment (b0, b1) of an 8-key tile, then of the next one.
    let lrow = k.and(k.reg(), lane, 7u32);
    let lmat = k.shr(k.reg(), lane, 3u32);
    let k_lane = {
        let key = k.shr(k.reg(), lmat, 1u32);
        k.mad(key, key, 8u32, lrow);
        let a = k.mad(k.reg(), key, stride, k_s);
        let half = k.and(k.reg(), lmat, 1u32);
        k.mad(a, half, 16u32, a)
    };
    // V (transposed): matrix m covers keys 8 (m % 2) .. + 8 of a 16-key step and values
    // 8 (m / 2) .. + 8: b0, b1 of value tile n, then of value tile n + 1.
    let v_lane = {
        let key = k.and(k.reg(), lmat, 1u32);
        k.mad(key, key, 8u32, lrow);
        let a = k.mad(k.reg(), key, stride, v_s);
        let dt = k.shr(k.reg(), lmat, 1u32);
        k.mad(a, dt, 16u32, a)
    };

    let scale2 = k.mul(k.reg(), scale, LOG2E);
    let m = [k.f32(f32::NEG_INFINITY), k.f32(f32::NEG_INFINITY)];
    let l = [k.f32(0.0), k.f32(0.0)];
    let o: Vec<[Reg<F32>; 4]> = (0..head_dim / 8)
        .map(|_| [0; 4].map(|_| k.f32(0.0)))
        .collect();
    let n_key_tiles = (bk / 8) as usize;

    // This thread's key of the tile at `j0`, clamped to the sequence (keys past its end
    // load its last one and are masked below): its block number's table index and its
    // place in the block.
    let key_of = |k: &Kernel, j0: Reg<U32>| {
        let j = k.add(k.reg(), j0, my_key);
        k.min(j, j, last_key);
        let nth = k.div_int(k.reg(), j, bs);
        let within = k.rem(k.reg(), j, bs);
        (k.add(k.reg(), bto, nth), within)
    };
    let block_at =
        |k: &Kernel, ti: Reg<U32>| k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(tables, ti, 4));
    // Copies this thread's pieces of the K (or V) row of cache slot `slot` into the tile.
    let copy_row = |k: &Kernel, slot: Reg<U32>, v: bool| {
        let off = k.mul_wide(k.reg::<U64>(), slot, kv_dim);
        k.shl(off, off, 1u32);
        k.add(off, off, src_part);
        let src = k.add(k.reg(), if v { vc } else { kc }, off);
        let dst = if v { (bk * stride) as i64 } else { 0 };
        for i in 0..pieces.div_ceil(tpk) {
            let copy = |k: &Kernel| {
                let d = (16 * tpk * i) as i64;
                k.cp_async(CpAsyncCache::Cg, dst_row.at(dst + d), src.at(d), 16);
            };
            if (i + 1) * tpk <= pieces {
                copy(k);
            } else {
                let has = k.lt(my_part, pieces - i * tpk);
                k.if_(has, copy);
            }
        }
    };
    // The tile's scores, masked and folded into the rows' softmax (the powers replace
    // the scores), and the output rescaled: reads the K tile.
    let scores = |k: &Kernel, j0: Reg<U32>| -> Vec<[Reg<F32>; 4]> {
        // S = Q·K over the head, 16 values a step, two 8-key tiles a `ldmatrix`.
        let s: Vec<[Reg<F32>; 4]> = (0..n_key_tiles)
            .map(|_| [0; 4].map(|_| k.f32(0.0)))
            .collect();
        for (step, a) in qa.iter().enumerate() {
            for pair in 0..n_key_tiles / 2 {
                let b = k.regs::<B32, 4>();
                let at = k_lane.at((16 * pair as u32 * stride) as i64 + 32 * step as i64);
                k.ldmatrix(b, at, false);
                for (h, n) in [2 * pair, 2 * pair + 1].into_iter().enumerate() {
                    let acc = s[n];
                    k.mma_m16n8k16(MmaFloat::F16, acc, *a, [b[2 * h], b[2 * h + 1]], acc);
                }
            }
        }
        // Mask, scale to base 2, and fold into each row's running max.
        let corr: Vec<Reg<F32>> = (0..2)
            .map(|r| {
                let row = &rows[r];
                let mx = k.f32(f32::NEG_INFINITY);
                for (n, tile) in s.iter().enumerate() {
                    for c in 0..2 {
                        let v = tile[2 * r + c];
                        let key = k.add(k.reg(), j0, (8 * n + c) as u32);
                        k.add(key, key, col);
                        let ok = k.cmp(Cmp::Le, key, row.pos);
                        let seen = k.ge(key, row.lo);
                        k.and(ok, ok, seen);
                        k.mul(v, v, scale2);
                        k.selp(v, v, f32::NEG_INFINITY, ok);
                        k.max(mx, mx, v);
                    }
                }
                for off in [1u32, 2] {
                    let other = super::bfly(k, mx, off);
                    k.max(mx, mx, other);
                }
                k.max(mx, mx, m[r]);
                // A row that has seen nothing yet keeps its -inf and its zeros: the powers
                // are taken from 0, not from -inf (which would make them NaN).
                let none = k.cmp(Cmp::Eq, mx, f32::NEG_INFINITY);
                let base = k.copy(mx);
                k.selp(base, 0.0f32, mx, none);
                let c = k.sub(k.reg(), m[r], base);
                k.ex2_approx(c, c);
                k.mov(m[r], mx);
                k.mul(l[r], l[r], c);
                for tile in &s {
                    for c2 in 0..2 {
                        let v = tile[2 * r + c2];
                        k.sub(v, v, base);
                        k.ex2_approx(v, v);
                        k.add(l[r], l[r], v);
                    }
                }
                c
            })
            .collect();
        for tile in &o {
            for (e, v) in tile.iter().enumerate() {
                k.mul(*v, *v, corr[e / 2]);
            }
        }
        s
    };
    // The tile's weighted values added to the output: reads the V tile.
    let weights = |k: &Kernel, s: &[[Reg<F32>; 4]]| {
        // O += P·V: P's fragments are the score tiles' accumulators, paired into halves.
        for step in 0..n_key_tiles / 2 {
            let (s0, s1) = (s[2 * step], s[2 * step + 1]);
            let a = k.regs::<B32, 4>();
            k.cvt_f16x2(a[0], s0[1], s0[0]);
            k.cvt_f16x2(a[1], s0[3], s0[2]);
            k.cvt_f16x2(a[2], s1[1], s1[0]);
            k.cvt_f16x2(a[3], s1[3], s1[2]);
            for pair in 0..head_dim / 16 {
                let b = k.regs::<B32, 4>();
                let at = v_lane.at((16 * step as u32 * stride) as i64 + 32 * pair as i64);
                k.ldmatrix(b, at, true);
                for h in 0..2 {
                    let acc = o[2 * pair + h];
                    k.mma_m16n8k16(MmaFloat::F16, acc, a, [b[2 * h], b[2 * h + 1]], acc);
                }
            }
        }
    };

    if pipelined {
        // K of the first tile before the loop; then in each tile V is copied while the
        // scores are computed, and the next tile's K while the values are weighted (the
        // two halves of the staging take turns, four barriers a tile).
        let slot = k.reg::<U32>();
        let (ti, within) = key_of(k, key_lo);
        let block = block_at(k, ti);
        k.mad(slot, block, bs, within);
        copy_row(k, slot, false);
        k.cp_async_commit();
        k.stride_loop(key_lo, key_hi, bk, |k, j0| {
            // Every warp is done with the last tile's V.
            k.bar_sync();
            copy_row(k, slot, true);
            k.cp_async_commit();
            // The next tile's block number, wanted after the scores.
            let next = k.add(k.reg(), j0, bk);
            let (ti, within_next) = key_of(k, next);
            let block_next = block_at(k, ti);
            k.cp_async_wait(1);
            k.bar_sync();
            let s = scores(k, j0);
            // Every warp is done with this tile's K.
            k.bar_sync();
            let more = k.lt(next, key_hi);
            k.if_(more, |k| {
                k.mad(slot, block_next, bs, within_next);
                copy_row(k, slot, false);
            });
            // (An empty group when there is no next tile: the waits count groups.)
            k.cp_async_commit();
            k.cp_async_wait(1);
            k.bar_sync();
            weights(k, &s);
        });
        k.cp_async_wait(0);
    } else {
        k.stride_loop(key_lo, key_hi, bk, |k, j0| {
            let (ti, within) = key_of(k, j0);
            let block = block_at(k, ti);
            let slot = k.mad(k.reg(), block, bs, within);
            copy_row(k, slot, false);
            copy_row(k, slot, true);
            k.cp_async_commit();
            k.cp_async_wait(0);
            k.bar_sync();
            let s = scores(k, j0);
            weights(k, &s);
            // Before the next tile overwrites this one.
            k.bar_sync();
        });
    }

    // Each row's sum over its quad, then the normalized rows, and their f16 rows when asked:
    // a thread holds values 2tq, 2tq + 1 of each 8; the f16 layout puts values 4i, 4i + 2,
    // 4i + 1, 4i + 3 at halves 4i..4i + 4, so the two threads of a quad's half swap one
    // value each and store two halves at the f32 index of their first value.
    let halves = k.cmp(smelt_ptx::Cmp::Ne, out16, 0u64);
    let odd = k.cmp(smelt_ptx::Cmp::Ne, k.and(k.reg(), tq, 1u32), 0u32);
    for (r, row) in rows.iter().enumerate() {
        for off in [1u32, 2] {
            let other = super::bfly(k, l[r], off);
            k.add(l[r], l[r], other);
        }
        let inv = k.f32(1.0);
        k.div_rn(inv, inv, l[r]);
        let i = k.mad(k.reg(), row.qrow, hd, col);
        let at = k.elem_addr(out, i, 4);
        let vals: Vec<[Reg<F32>; 2]> = o
            .iter()
            .map(|tile| {
                let v = [k.f32(0.0), k.f32(0.0)];
                k.mul(v[0], tile[2 * r], inv);
                k.mul(v[1], tile[2 * r + 1], inv);
                v
            })
            .collect();
        k.if_(row.valid, |k| {
            for (n, v) in vals.iter().enumerate() {
                k.st_v2(Store::GLOBAL, at.at(32 * n as i64), *v);
            }
        });
        // Uniform per block; every lane of the warp shuffles.
        k.if_(halves, |k| {
            let hat = k.elem_addr(out16, i, 2);
            for (n, v) in vals.iter().enumerate() {
                let give = k.reg::<F32>();
                k.selp(give, v[0], v[1], odd);
                let got = super::bfly(k, give, 1);
                let (lo, hi) = (k.reg::<F32>(), k.reg::<F32>());
                k.selp(lo, got, v[0], odd);
                k.selp(hi, v[1], got, odd);
                let h = k.cvt_f16x2(k.reg(), hi, lo);
                k.guarded(row.valid, |k| {
                    k.st(Store::GLOBAL, hat.at(16 * n as i64), h);
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn every_head_size_builds_with_tiles_that_fit() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k)).unwrap();
            }
            let ptx = m.to_ptx();
            for hd in (64..=256).step_by(16) {
                assert!(ptx.contains(&format!(".entry attention_prefill_hd{hd}(")));
                assert!(ptx.contains(&format!(".entry attention_prefill_serial_hd{hd}(")));
                assert!(2 * keys_per_tile(hd) * row_stride(hd) <= TILE_BYTES, "{hd}");
                // Rows of 4 (mod 8) words: an 8-row ldmatrix touches 8 bank groups.
                assert_eq!(row_stride(hd) / 4 % 8, 4, "{hd}");
            }
            assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
            assert!(ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
            assert!(ptx.contains("cvt.rn.f16x2.f32"));
        }
        let mut m = Module::new(Target::Sm80);
        assert!(m.kernel("bad", |k| kernel(k, 72, true)).is_err());
        assert_eq!(serial_name(80), Some("attention_prefill_serial_hd80"));
    }

    #[test]
    fn launch_covers_every_row() {
        // 8 query heads on 2 KV heads: 4 rows a token, 64 a block.
        assert_eq!(q_tiles(16, 8, 2), 1);
        assert_eq!(q_tiles(17, 8, 2), 2);
        assert_eq!(launch(3, 100, 32, 8).grid, (7, 8, 3));
        assert_eq!(launch(1, 1, 4, 4).block, (32, WARPS, 1));
        assert_eq!(keys_per_tile(128), 32);
        assert_eq!(keys_per_tile(256), 16);
    }
}
