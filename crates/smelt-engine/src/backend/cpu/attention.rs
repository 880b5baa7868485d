//! Attention over the paged KV cache, with llama.cpp's (non flash-attention) precision:
//! K and V are stored as f16, the query is rounded to f16 before `q·k` (ggml converts the
//! f32 operand of an f16 matmul), the softmax runs in f32 with an f64 sum, and the
//! probabilities are rounded to f16 before they weight V.
//!
//! This file holds the cache itself (its layout and writes) and [`CpuKv::attend`], which
//! cuts a call into tasks and hands each to a summation order: one query row at a time
//! ([`super::attention_row`]) or, for prompts on AVX2, [`ROWS`] rows of a head together
//! ([`super::attention_tiled`]). The per-head view of the cache and the per-thread scratch
//! both orders work in are here too.

use half::f16;
use rayon::prelude::*;
use smelt_quant::fp::{f16_to_f32, f32_to_f16};

use super::attention_row::{one_head, one_head_512, one_head_fast};
#[cfg(target_arch = "x86_64")]
use super::attention_tiled::rows_head_fast;
use super::attention_tiled::ROWS;
use super::ggml_math;
use super::spin_pool;
use crate::backend::{AttnParams, AttnSeq};

/// K and V of every layer: `[layer][slot * kv_dim + d]`, a slot being
/// `block * block_size + offset`.
pub struct CpuKv {
    pub(crate) block_size: usize,
    pub(crate) kv_dim: usize,
    pub(crate) k: Vec<Vec<f16>>,
    pub(crate) v: Vec<Vec<f16>>,
}

impl CpuKv {
    pub fn new(n_layer: usize, n_blocks: usize, block_size: usize, kv_dim: usize) -> Self {
        let n = n_blocks * block_size * kv_dim;
        Self {
            block_size,
            kv_dim,
            k: (0..n_layer).map(|_| vec![f16::ZERO; n]).collect(),
            v: (0..n_layer).map(|_| vec![f16::ZERO; n]).collect(),
        }
    }

    /// Cache slot of a position (attention looks one up per key and value: a power-of-two
    /// block size takes a shift instead of a division).
    #[inline(always)]
    fn slot(&self, blocks: &[u32], pos: usize) -> usize {
        let bs = self.block_size;
        if bs.is_power_of_two() {
            let sh = bs.trailing_zeros();
            ((blocks[pos >> sh] as usize) << sh) | (pos & (bs - 1))
        } else {
            blocks[pos / bs] as usize * bs + pos % bs
        }
    }

    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], seqs: &[AttnSeq<'_>]) {
        let d = self.kv_dim;
        for s in seqs {
            for i in 0..s.n_tokens {
                let slot = self.slot(s.blocks, s.start_pos + i);
                let row = s.row + i;
                for (dst, &src) in self.k[layer][slot * d..(slot + 1) * d]
                    .iter_mut()
                    .zip(&k[row * d..(row + 1) * d])
                {
                    *dst = f32_to_f16(src);
                }
                for (dst, &src) in self.v[layer][slot * d..(slot + 1) * d]
                    .iter_mut()
                    .zip(&v[row * d..(row + 1) * d])
                {
                    *dst = f32_to_f16(src);
                }
            }
        }
    }

    pub fn attend(
        &self,
        q: &[f32],
        layer: usize,
        seqs: &[AttnSeq<'_>],
        p: &AttnParams,
        invariant: bool,
        out: &mut [f32],
    ) {
        let hd = p.head_dim;
        let group = p.n_head / p.n_head_kv.max(1);
        // Each sequence's cache offset of every position its queries can see, from `base`
        // (the first such position rounded down to a multiple of 64: ggml's summation lanes
        // are fixed by the position), looked up once per call instead of once per head, key
        // and value.
        let offsets: Vec<(usize, Vec<usize>)> = seqs
            .iter()
            .map(|s| {
                let first = match p.window {
                    Some(w) => (s.start_pos + 1).saturating_sub(w),
                    None => 0,
                };
                let base = first - first % 64;
                let end = s.start_pos + s.n_tokens;
                let offs = (base..end)
                    .map(|pos| {
                        if pos >= first {
                            self.slot(s.blocks, pos) * self.kv_dim
                        } else {
                            0
                        }
                    })
                    .collect();
                (base, offs)
            })
            .collect();
        // F16C widens keys and values in registers; without it (or with SMELT_NO_SIMD) the
        // portable conversion gives the same f32 values, so the same bits.
        let fast = ggml_math::fma_ok() && f16c_ok();
        let wide = fast && avx512_ok();
        // Tasks: one head of one query row, or (prefill on AVX2, tinyBLAS order) of
        // [`ROWS`] consecutive rows of a sequence, which then share each key's widening.
        // Head-major within a sequence, so consecutive tasks read the same KV head.
        // With `invariant`, every row takes the one-query order (prompt rows too).
        let multi = fast && !wide && hd.is_multiple_of(16) && !invariant;
        let mut tasks = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            let step = if multi && s.n_tokens >= 2 { ROWS } else { 1 };
            for h in 0..p.n_head {
                for r0 in (0..s.n_tokens).step_by(step) {
                    tasks.push(Task {
                        si,
                        row: s.row + r0,
                        n: step.min(s.n_tokens - r0),
                        h,
                    });
                }
            }
        }
        let n_rows = out.len() / (p.n_head * hd).max(1);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let make = || Scratch {
            q16: vec![0f32; hd],
            scores: Vec::new(),
            acc: Vec::new(),
            keys: vec![0f32; 4 * hd],
            rows: Default::default(),
            q16_rows: vec![0f32; ROWS * hd],
        };
        let run = |sc: &mut Scratch, t: &Task| {
            let (Some(s), Some((base, offs))) = (seqs.get(t.si), offsets.get(t.si)) else {
                return;
            };
            if t.row + t.n > n_rows || t.row < s.row {
                return;
            }
            let h = t.h;
            let view = View {
                kv: self,
                layer,
                offs,
                base: *base,
                off: (h / group) * hd,
                hd,
            };
            let span = |row: usize| {
                let pos = s.start_pos + row - s.row;
                let lo = match p.window {
                    Some(win) => (pos + 1).saturating_sub(win),
                    None => 0,
                };
                (lo, pos)
            };
            // SAFETY: every (row, head) belongs to exactly one task, rows are below
            // `n_rows`, so the output slices of concurrent tasks are disjoint and in
            // bounds.
            let out_of = |row: usize| unsafe {
                std::slice::from_raw_parts_mut(out_ptr.get().add((row * p.n_head + h) * hd), hd)
            };
            let round = |row: usize, dst: &mut [f32]| {
                let qrow = &q[(row * p.n_head + h) * hd..][..hd];
                for (a, &b) in dst.iter_mut().zip(qrow) {
                    *a = f16_to_f32(f32_to_f16(b));
                }
            };
            #[cfg(target_arch = "x86_64")]
            if t.n == ROWS {
                for r in 0..ROWS {
                    round(t.row + r, &mut sc.q16_rows[r * hd..(r + 1) * hd]);
                }
                let q16 = std::mem::take(&mut sc.q16_rows);
                let rows = std::array::from_fn(|r| span(t.row + r));
                let outs = std::array::from_fn(|r| out_of(t.row + r));
                // SAFETY: `multi` implies AVX2, FMA and F16C were detected.
                unsafe { rows_head_fast(&view, rows, &q16, p.scale, sc, outs) };
                sc.q16_rows = q16;
                return;
            }
            for row in t.row..t.row + t.n {
                let (lo, pos) = span(row);
                round(row, &mut sc.q16);
                let o = out_of(row);
                // llama.cpp multiplies a batch of two or more tokens through tinyBLAS
                // and a single token through ggml's vec_dot: two summation orders.
                let batched = s.n_tokens >= 2 && !invariant;
                if wide {
                    // SAFETY: AVX-512F, AVX2, FMA and F16C were detected at run time.
                    unsafe { one_head_512(&view, lo, pos, p.scale, batched, sc, o) }
                } else if fast {
                    // SAFETY: AVX2, FMA and F16C were detected at run time.
                    unsafe { one_head_fast(&view, lo, pos, p.scale, batched, sc, o) }
                } else {
                    one_head::<false, false>(&view, lo, pos, p.scale, batched, sc, o)
                }
            }
        };
        if seqs.iter().all(|s| s.n_tokens == 1) {
            // Decode: on the engine's spinning pool, like the matmuls around it (rayon's
            // idle worker would sleep and wake for every layer), a few tasks per chunk.
            let n_chunks = tasks.len().min(4 * spin_pool::current_threads()).max(1);
            spin_pool::par_for(n_chunks, |c| {
                let mut sc = make();
                let (lo, hi) = (c * tasks.len() / n_chunks, (c + 1) * tasks.len() / n_chunks);
                for t in &tasks[lo..hi] {
                    run(&mut sc, t);
                }
            });
        } else {
            tasks.par_iter().for_each_init(make, run);
        }
    }
}

/// One parallel unit of [`CpuKv::attend`]: rows `row..row + n` of sequence `si`, head `h`.
struct Task {
    si: usize,
    row: usize,
    n: usize,
    h: usize,
}

/// The output pointer shared by the tasks, which write disjoint heads.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to write disjoint slices from rayon tasks (see `attend`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Whether the CPU has AVX-512F (16-lane registers: one per ggml accumulator).
fn avx512_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU converts f16 in hardware.
fn f16c_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One query head's keys and values, read from the cache in place (no widened copy: every
/// decode step would otherwise convert, and allocate, the whole visible cache).
pub(super) struct View<'a> {
    kv: &'a CpuKv,
    layer: usize,
    /// Cache offset of each position from `base` (of its slot's first value).
    offs: &'a [usize],
    /// Position of index 0 (a multiple of 64).
    pub(super) base: usize,
    /// Offset of the KV head within a cache slot.
    off: usize,
    pub(super) hd: usize,
}

impl View<'_> {
    #[inline(always)]
    fn at(&self, j: usize) -> usize {
        self.offs[j] + self.off
    }
    #[inline(always)]
    pub(super) fn key(&self, j: usize) -> &[f16] {
        &self.kv.k[self.layer][self.at(j)..][..self.hd]
    }
    #[inline(always)]
    pub(super) fn value(&self, j: usize) -> &[f16] {
        &self.kv.v[self.layer][self.at(j)..][..self.hd]
    }
}

/// Per-thread buffers of [`one_head`], reused across heads.
pub(super) struct Scratch {
    /// The query rounded to f16 (held in f32).
    pub(super) q16: Vec<f32>,
    pub(super) scores: Vec<f32>,
    /// The p·V accumulators, `[lane][d]`.
    pub(super) acc: Vec<f32>,
    /// Four keys widened to f32 (`[4][hd]`, stays in L1).
    pub(super) keys: Vec<f32>,
    /// The scores of each row of a multi-row task ([`rows_head_fast`]).
    pub(super) rows: [Vec<f32>; ROWS],
    /// Its rows' queries rounded to f16 (`[ROWS][hd]`).
    q16_rows: Vec<f32>,
}
