//! Kernels that fuse steps a decode step would otherwise launch one after another: the
//! RMS norm of the residual stream (after the residual add) and the q8_1 quantization of
//! its output for the GEMVs that follow; the gated activation (SwiGLU, GeGLU) and the q8_1
//! quantization of its output for the down projection. At decode a row is one block, so each separate
//! launch costs a few microseconds of latency for a few kilobytes of work.
//!
//! The f32 results are computed exactly as [`crate::ops::norm`] computes them (same loop,
//! same block reduction, same operations: identical floats for the same block size) and
//! the q8_1 tiles exactly as [`crate::act::quantize_kernel`] writes them, so the twin is
//! the two kernels' twins one after the other.
//!
//! Batches of 8-64 tokens multiply on the narrow GEMM, which reads f16 rows, not q8_1
//! tiles ([`crate::gemm::f16::act_kernel`]); for those the same kernels write the f16 rows
//! instead ([`Sink::F16Rows`]), so the tiles nobody reads are not written and the
//! conversion launch before the GEMM goes (two of a layer's four at 64 sequences, 5 us
//! each in an eager step on an H100).

use crate::ops::kernel_params;
use smelt_ptx::{
    Cmp, FloatRound, Kernel, Load, Narrow, Reg, Shfl, Store, F32, FULL_WARP, U32, U64,
};

use crate::act::{self, quantize_lane, round_away, store_header, TILE_BYTES};
use crate::catalog::Entry;
use crate::ops::elementwise::{gelu, silu, Glu};
use crate::ops::{block_sum, reduce_scratch, Launch};
use crate::{KernelError, TILE};

/// Name of the kernel without the residual add.
pub const RMS_NORM_Q8: &str = "rms_norm_q8_1";
/// Name of the kernel with the residual add.
pub const ADD_RMS_NORM_Q8: &str = "add_rms_norm_q8_1";

/// What the kernels write beside their f32 output, for the matmuls that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// q8_1 tiles: the GEMV's (and the int8 GEMM's on the legacy formats).
    Q8_1,
    /// f16 rows in [`crate::gemm::f16::act_kernel`]'s layout: the narrow and f16 GEMMs'.
    F16Rows,
}

impl Sink {
    /// Both, in the catalog's order.
    pub const ALL: [Sink; 2] = [Sink::Q8_1, Sink::F16Rows];

    /// Bytes of one 256-value tile's output.
    const fn tile_bytes(self) -> u32 {
        match self {
            Sink::Q8_1 => TILE_BYTES as u32,
            Sink::F16Rows => 2 * TILE as u32,
        }
    }

    /// Bytes of one row's output for rows of `n` values.
    pub fn row_bytes(self, n: usize) -> Result<usize, KernelError> {
        match self {
            Sink::Q8_1 => act::row_bytes(n),
            Sink::F16Rows => Ok(crate::gemm::f16::act_row_bytes(n)),
        }
    }

    /// Writes lane `lane`'s eight values `v` (values `8 lane..8 lane + 8` of a tile; a
    /// full warp holds the tile) into the tile's output at `dst`.
    fn write_lane(self, k: &Kernel, v: &[Reg<F32>; 8], lane: Reg<U32>, dst: Reg<U64>) {
        match self {
            Sink::Q8_1 => quantize_lane(k, v, lane, dst),
            Sink::F16Rows => {
                // Values 4i, 4i + 2, 4i + 1, 4i + 3 at halves 4i..4i + 4, as act_kernel.
                let h: [Reg<smelt_ptx::B32>; 4] = std::array::from_fn(|i| {
                    let q = 4 * (i / 2) + i % 2;
                    k.cvt_f16x2(k.reg(), v[q + 2], v[q])
                });
                let at = k.add(k.reg(), dst, k.mul_wide(k.reg::<U64>(), lane, 16u32));
                k.st_v4(Store::GLOBAL, at, h);
            }
        }
    }
}

/// Name of the norm kernel, with the residual add or not, writing `sink`.
pub const fn norm_name(add: bool, sink: Sink) -> &'static str {
    match (add, sink) {
        (false, Sink::Q8_1) => RMS_NORM_Q8,
        (true, Sink::Q8_1) => ADD_RMS_NORM_Q8,
        (false, Sink::F16Rows) => "rms_norm_f16",
        (true, Sink::F16Rows) => "add_rms_norm_f16",
    }
}

/// Name of the gated activation + q8_1 kernel for `act`.
pub fn glu_q8_name(act: Glu) -> &'static str {
    glu_name(act, Sink::Q8_1)
}

/// Name of the gated activation kernel for `act` writing `sink`.
pub fn glu_name(act: Glu, sink: Sink) -> &'static str {
    match (act, sink) {
        (Glu::Silu, Sink::Q8_1) => "glu_silu_q8_1",
        (Glu::Gelu, Sink::Q8_1) => "glu_gelu_q8_1",
        (Glu::Silu, Sink::F16Rows) => "glu_silu_f16",
        (Glu::Gelu, Sink::F16Rows) => "glu_gelu_f16",
    }
}

/// Every kernel of this module.
pub fn catalog() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    for sink in Sink::ALL {
        for add in [false, true] {
            v.push((
                norm_name(add, sink).to_string(),
                Box::new(move |k: &Kernel| kernel_to(k, add, sink)),
            ));
        }
        for a in [Glu::Silu, Glu::Gelu] {
            v.push((
                glu_name(a, sink).to_string(),
                Box::new(move |k: &Kernel| glu_kernel(k, a, sink)),
            ));
        }
    }
    v
}

/// Launch over `rows` rows of `n` values: one block per row, about four values per thread
/// (up to 1024 threads). The block size changes the float order of the norm's sum: the
/// unfused norm must be launched with the same one to give the same floats.
pub fn launch(rows: usize, n: usize) -> Launch {
    let threads = (n.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
    Launch::new((rows.max(1) as u32, 1, 1), (threads, 1, 1))
}

/// Bytes of one row's q8_1 tiles.
pub fn q_row_bytes(n: usize) -> Result<usize, KernelError> {
    act::row_bytes(n)
}

kernel_params! {
    /// Arguments of the norm + quantize [`kernel`] without the add.
    NormQ8Args, NormQ8Regs {
        x: Ptr,
        w: Ptr,
        out: Ptr,
        q: Ptr,
        n: U32,
        ntiles: U32,
        eps: F32,
    }
}

kernel_params! {
    /// Arguments of the add + norm + quantize [`kernel`].
    AddNormQ8Args, AddNormQ8Regs {
        x: Ptr,
        y: Ptr,
        w: Ptr,
        out: Ptr,
        q: Ptr,
        n: U32,
        ntiles: U32,
        eps: F32,
    }
}

/// `[x += y;] out = x / sqrt(mean(x²) + eps) * w; q = quantize_q8_1(out)` per row.
///
/// Parameters: `x: *mut f32, y: *const f32 (add variant only), w: *const f32, out: *mut f32,
/// q: *mut u8 (ntiles tiles of q8_1 per row), n: u32 (a multiple of 32), ntiles: u32
/// (ceil(n / 256)), eps: f32`. Launch: [`launch`]. `out` must not alias `x` or `y`.
pub fn kernel(k: &Kernel, add: bool) {
    kernel_to(k, add, Sink::Q8_1)
}

/// [`kernel`] writing `sink` at `q` (`ntiles` tiles of it a row).
pub fn kernel_to(k: &Kernel, add: bool, sink: Sink) {
    let (x, y, w, out, q, n, ntiles, eps) = if add {
        let r = AddNormQ8Regs::declare(k);
        (r.x, Some(r.y), r.w, r.out, r.q, r.n, r.ntiles, r.eps)
    } else {
        let r = NormQ8Regs::declare(k);
        (r.x, None, r.w, r.out, r.q, r.n, r.ntiles, r.eps)
    };

    // Phase 1, as `ops::norm`: [x += y], sum of squares, block reduction, scale.
    let scratch = reduce_scratch(k, "fnorm_red");
    let row = k.ctaid_x();
    let base = k.mul_wide(k.reg(), row, n);
    k.shl(base, base, 2u32);
    let xs = k.add(k.reg(), x, base);
    let os = k.add(k.reg(), out, base);
    // All of a thread's loads issued at once, in `ops::norm`'s order (so the sum is its).
    let ys = y.map(|y| k.add(k.reg(), y, base));
    let sum = crate::ops::norm::add_sum_squares(k, xs, ys, n);
    // The reduction's barriers also make every thread's `x` writes visible to the block.
    let total = block_sum(k, sum, &scratch);
    let scale = rms_scale(k, total, n, eps);
    norm_row(k, (xs, os, w), (q, sink), row, n, ntiles, scale);
}

/// `1 / sqrt(total / n + eps)`, as the norm kernels compute it.
pub(crate) fn rms_scale(k: &Kernel, total: Reg<F32>, n: Reg<U32>, eps: Reg<F32>) -> Reg<F32> {
    let nf = k.cvt(k.reg::<F32>(), n, FloatRound::Rn);
    let mean = k.div_rn(k.reg(), total, nf);
    k.add(mean, mean, eps);
    let root = k.sqrt_rn(k.reg(), mean);
    k.div_rn(k.reg(), 1.0f32, root)
}

/// Phase 2 of [`kernel`] for the block's row `row` (the residual row at `xs`, its norm
/// output at `os`): `out = x * scale * w` and its q8_1 tiles, as `act::quantize_kernel`
/// writes them, one warp per 256-value tile, eight values per lane. `x` may have been
/// written by other threads of the block before a barrier.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_quantize_row(
    k: &Kernel,
    xs: Reg<U64>,
    os: Reg<U64>,
    w: Reg<U64>,
    q: Reg<U64>,
    row: Reg<U32>,
    n: Reg<U32>,
    ntiles: Reg<U32>,
    scale: Reg<F32>,
) {
    norm_row(k, (xs, os, w), (q, Sink::Q8_1), row, n, ntiles, scale);
}

/// [`norm_quantize_row`] writing `sink` at `q`.
fn norm_row(
    k: &Kernel,
    (xs, os, w): (Reg<U64>, Reg<U64>, Reg<U64>),
    (q, sink): (Reg<U64>, Sink),
    row: Reg<U32>,
    n: Reg<U32>,
    ntiles: Reg<U32>,
    scale: Reg<F32>,
) {
    let tid = k.tid_x();
    let step = k.ntid_x();
    let lane = k.and(k.reg(), tid, 31u32);
    let warp = k.shr(k.reg(), tid, 5u32);
    let nwarps = k.shr(k.reg(), step, 5u32);
    let qrow = k.mul_wide(k.reg::<U64>(), row, ntiles);
    k.mul(qrow, qrow, u64::from(sink.tile_bytes()));
    let qs = k.add(k.reg(), q, qrow);
    k.stride_loop(warp, ntiles, nwarps, |k, tile| {
        norm_tile(k, (xs, os, w), (qs, sink), tile, n, scale, lane);
    });
}

/// One warp's tile of [`norm_quantize_row`]: `out = x * scale * w` for the 256 values of
/// tile `tile` of the row (`xs`, `os`; eight a lane) and their q8_1 tile at `qs + tile *
/// TILE_BYTES`; values past `n` count as zeros. Also the fused MoE router's
/// (`moe_fused::router_kernel`), whose warps each write one tile of the normed row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_quantize_tile(
    k: &Kernel,
    xs: Reg<U64>,
    os: Reg<U64>,
    w: Reg<U64>,
    qs: Reg<U64>,
    tile: Reg<U32>,
    n: Reg<U32>,
    scale: Reg<F32>,
    lane: Reg<U32>,
) {
    norm_tile(k, (xs, os, w), (qs, Sink::Q8_1), tile, n, scale, lane);
}

/// [`norm_quantize_tile`] writing `sink` at `qs`.
fn norm_tile(
    k: &Kernel,
    (xs, os, w): (Reg<U64>, Reg<U64>, Reg<U64>),
    (qs, sink): (Reg<U64>, Sink),
    tile: Reg<U32>,
    n: Reg<U32>,
    scale: Reg<F32>,
    lane: Reg<U32>,
) {
    let dst = k.elem_addr(qs, tile, sink.tile_bytes());
    let col = k.shl(k.reg(), lane, 3u32);
    k.mad(col, tile, TILE as u32, col);
    let inside = k.lt(col, n);
    let src = k.elem_addr(xs, col, 4);
    let wsrc = k.elem_addr(w, col, 4);
    let osrc = k.elem_addr(os, col, 4);
    let v: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    let g: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    k.guarded(inside, |k| {
        // `x` was written by other threads of this block: a coherent load, not `.nc`.
        k.ld_v4(Load::GLOBAL, [v[0], v[1], v[2], v[3]], src);
        k.ld_v4(Load::GLOBAL, [v[4], v[5], v[6], v[7]], src.at(16));
        k.ld_v4(Load::GLOBAL_NC, [g[0], g[1], g[2], g[3]], wsrc);
        k.ld_v4(Load::GLOBAL_NC, [g[4], g[5], g[6], g[7]], wsrc.at(16));
    });
    for i in 0..8 {
        k.mul(v[i], v[i], scale);
        k.mul(v[i], v[i], g[i]);
    }
    k.guarded(inside, |k| {
        k.st_v4(Store::GLOBAL, osrc, [v[0], v[1], v[2], v[3]]);
        k.st_v4(Store::GLOBAL, osrc.at(16), [v[4], v[5], v[6], v[7]]);
    });
    sink.write_lane(k, &v, lane, dst);
}

/// Launch of [`glu_kernel`] over `rows` rows of `n` values: as `act::quantize_kernel`,
/// one warp per 256-value tile.
pub fn glu_q8_launch(rows: usize, n: usize) -> Launch {
    let ntiles = n.div_ceil(TILE) as u32;
    Launch::new(
        (
            ntiles.div_ceil(act::QUANTIZE_WARPS).max(1),
            rows.max(1) as u32,
            1,
        ),
        (32, act::QUANTIZE_WARPS, 1),
    )
}

kernel_params! {
    /// Arguments of [`glu_q8_kernel`] (every activation).
    GluQ8Args, GluQ8Regs {
        gate: Ptr,
        up: Ptr,
        q: Ptr,
        k: U32,
        ntiles: U32,
    }
}

/// `gate = act(gate) * up; q = quantize_q8_1(gate)` per row: the GLU kernel of
/// [`crate::ops::elementwise`] (same float operations, so the same floats) and
/// `act::quantize_kernel`'s tiles, in one launch instead of two.
///
/// Parameters: `gate: *mut f32, up: *const f32, q: *mut u8 (ntiles tiles per row), k: u32
/// (row length, a multiple of 32), ntiles: u32 (ceil(k / 256))`. Rows are `k` apart in
/// `gate` and `up`. Launch: [`glu_q8_launch`].
pub fn glu_q8_kernel(k: &Kernel, act: Glu) {
    glu_kernel(k, act, Sink::Q8_1)
}

/// [`glu_q8_kernel`] writing `sink` at `q` (same parameters).
pub fn glu_kernel(k: &Kernel, act: Glu, sink: Sink) {
    let GluQ8Regs {
        gate,
        up,
        q,
        k: len,
        ntiles,
    } = GluQ8Regs::declare(k);
    let act::LaneTile {
        lane,
        dst,
        inside,
        first,
    } = act::lane_tile(k, q, len, ntiles, sink.tile_bytes());
    let ga = k.elem_addr(gate, first, 4);
    let ua = k.elem_addr(up, first, 4);
    let v: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    let u: [Reg<F32>; 8] = std::array::from_fn(|_| k.f32(0.0));
    k.guarded(inside, |k| {
        k.ld_v4(Load::GLOBAL, [v[0], v[1], v[2], v[3]], ga);
        k.ld_v4(Load::GLOBAL, [v[4], v[5], v[6], v[7]], ga.at(16));
        k.ld_v4(Load::GLOBAL_NC, [u[0], u[1], u[2], u[3]], ua);
        k.ld_v4(Load::GLOBAL_NC, [u[4], u[5], u[6], u[7]], ua.at(16));
    });
    for i in 0..8 {
        let y = match act {
            Glu::Silu => silu(k, v[i]),
            Glu::Gelu => gelu(k, v[i]),
        };
        k.mul(v[i], y, u[i]);
    }
    k.guarded(inside, |k| {
        k.st_v4(Store::GLOBAL, ga, [v[0], v[1], v[2], v[3]]);
        k.st_v4(Store::GLOBAL, ga.at(16), [v[4], v[5], v[6], v[7]]);
    });
    sink.write_lane(k, &v, lane, dst);
}

/// CPU twin of [`glu_q8_kernel`]: the GLU twin then [`act::quantize_cpu`] (rows of `k`).
pub fn glu_q8_cpu(
    gate: &mut [f32],
    up: &[f32],
    act: Glu,
    k: usize,
) -> Result<Vec<u8>, KernelError> {
    crate::ops::elementwise::glu_cpu(gate, up, act);
    act::quantize_cpu(gate, k)
}

/// Quantizes one 32-value q8_1 block held one value per lane of a full warp (all 32 lanes
/// present), as `act::quantize_kernel` quantizes it: `f` is the value's index in rows of
/// whole tiles (row length a multiple of 256), so its tile is `f / 256` of `q`.
pub(crate) fn quantize_warp_block(
    k: &Kernel,
    v: Reg<F32>,
    lane: Reg<U32>,
    f: Reg<U32>,
    q: Reg<U64>,
) {
    let amax = k.abs(k.reg(), v);
    for offset in [1u32, 2, 4, 8, 16] {
        let other = k.shfl_sync(Shfl::Bfly, k.reg(), amax, offset, FULL_WARP);
        k.max(amax, amax, other);
    }
    let d = k.div_rn(k.reg(), amax, 127.0f32);
    let id = k.div_rn(k.reg(), 1.0f32, d);
    let zero = k.cmp(Cmp::Eq, d, 0.0f32);
    k.selp(id, 0.0f32, id, zero);
    let qv = round_away(k, k.mul(k.reg(), v, id));
    let sum = k.add(k.reg(), qv, 0i32);
    for offset in [1u32, 2, 4, 8, 16] {
        let other = k.shfl_sync(Shfl::Bfly, k.reg(), sum, offset, FULL_WARP);
        k.add(sum, sum, other);
    }
    let tile = k.shr(k.reg(), f, 8u32);
    let tdst = k.elem_addr(q, tile, TILE_BYTES as u32);
    let inb = k.and(k.reg(), f, 255u32);
    let bdst = k.add(k.reg(), tdst, k.cvt(k.reg::<U64>(), inb, smelt_ptx::Exact));
    k.st_narrow(Store::GLOBAL, Narrow::U8, bdst, qv);
    let slot = k.shr(k.reg(), inb, 5u32);
    let hdst = k.add(k.reg(), tdst, k.mul_wide(k.reg::<U64>(), slot, 2u32));
    let first = k.cmp(Cmp::Eq, lane, 0u32);
    store_header(k, first, hdst, d, sum);
}

/// Stores one value `v` of rows of whole tiles (`f` its index there) into f16 rows in
/// [`crate::gemm::f16::act_kernel`]'s layout at `h`: values `4i, 4i + 2, 4i + 1, 4i + 3` at
/// halves `4i..4i + 4`, rounded to nearest (so value `4i + r` goes to half `4i + (r & 1) * 2
/// + r / 2`). Any lanes may call it; each stores its own value.
pub(crate) fn store_f16_row_value(k: &Kernel, v: Reg<F32>, f: Reg<U32>, h: Reg<U64>) {
    let r = k.and(k.reg(), f, 3u32);
    let at = k.sub(k.reg(), f, r);
    let odd = k.and(k.reg(), r, 1u32);
    k.mad(at, odd, 2u32, at);
    k.add(at, at, k.shr(k.reg(), r, 1u32));
    let half = k.cvt(k.reg::<smelt_ptx::F16>(), v, FloatRound::Rn);
    k.st(Store::GLOBAL, k.elem_addr(h, at, 2), half);
}

/// Writes value `f` of rows of whole tiles, held by `lane` of a full warp whose 32 values
/// are one q8_1 block (for [`Sink::Q8_1`]), into `sink`'s output at `dst`: the block's
/// quantization (every lane must call it), or the value's half of the f16 rows.
pub(crate) fn sink_warp_value(
    k: &Kernel,
    sink: Sink,
    v: Reg<F32>,
    lane: Reg<U32>,
    f: Reg<U32>,
    dst: Reg<U64>,
) {
    match sink {
        Sink::Q8_1 => quantize_warp_block(k, v, lane, f, dst),
        Sink::F16Rows => store_f16_row_value(k, v, f, dst),
    }
}

/// What the kernels write in `sink` for rows of `n` values `out` (their f32 output): the
/// q8_1 twin's tiles, or the f16 rows' twin's halves as little-endian bytes.
pub fn sink_cpu(out: &[f32], n: usize, sink: Sink) -> Result<Vec<u8>, KernelError> {
    match sink {
        Sink::Q8_1 => act::quantize_cpu(out, n),
        Sink::F16Rows => Ok(crate::gemm::f16::act_cpu(out, n)?
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect()),
    }
}

/// CPU twin: the norm twins of [`crate::ops::norm`] then [`act::quantize_cpu`]. Returns
/// `(out, q)` for rows of `w.len()` values; `x` is updated in place when `y` is given.
pub fn cpu(
    x: &mut [f32],
    y: Option<&[f32]>,
    w: &[f32],
    eps: f32,
) -> Result<(Vec<f32>, Vec<u8>), KernelError> {
    let mut out = vec![0f32; x.len()];
    match y {
        Some(y) => crate::ops::norm::add_rms_norm_cpu(x, y, w, eps, &mut out),
        None => crate::ops::norm::rms_norm_cpu(x, w, eps, &mut out),
    }
    let q = act::quantize_cpu(&out, w.len())?;
    Ok((out, q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn both_kernels_build_with_a_barrier_and_the_quantize_stores() {
        for target in [Target::Sm80, Target::Sm90] {
            let mut m = Module::new(target);
            for (name, build) in catalog() {
                m.kernel(&name, |k| build(k)).unwrap();
            }
            let ptx = m.to_ptx();
            for name in [RMS_NORM_Q8, ADD_RMS_NORM_Q8] {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
            }
            assert!(ptx.contains("bar.sync"));
            assert!(ptx.contains("st.global.v2"));
            assert!(ptx.contains("st.global.v4"));
            assert!(ptx.contains("div.rn.f32"));
        }
    }

    #[test]
    fn the_glu_kernels_build_and_their_twin_is_glu_then_quantize() {
        let mut m = Module::new(Target::Sm90);
        for a in [Glu::Silu, Glu::Gelu] {
            m.kernel(glu_q8_name(a), |k| glu_q8_kernel(k, a)).unwrap();
        }
        let ptx = m.to_ptx();
        for a in [Glu::Silu, Glu::Gelu] {
            assert!(ptx.contains(&format!(".entry {}(", glu_q8_name(a))));
        }
        assert!(ptx.contains("ex2.approx"));
        assert!(ptx.contains("st.global.v4"));
        let n = 320;
        for a in [Glu::Silu, Glu::Gelu] {
            let g0: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
                .collect();
            let up: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 5.0)
                .collect();
            let mut g = g0.clone();
            let q = glu_q8_cpu(&mut g, &up, a, n).unwrap();
            let mut want = g0.clone();
            crate::ops::elementwise::glu_cpu(&mut want, &up, a);
            assert_eq!(g, want);
            assert_ne!(g, g0);
            assert_eq!(q, act::quantize_cpu(&want, n).unwrap());
            assert_eq!(q.len(), 2 * q_row_bytes(n).unwrap());
        }
        let l = glu_q8_launch(3, 14336);
        assert_eq!((l.grid.0, l.grid.1), (14, 3));
        assert_eq!(glu_q8_launch(1, 320).grid.0, 1);
    }

    #[test]
    fn the_f16_kernels_store_rows_and_their_twin_is_act_rows() {
        let mut m = Module::new(Target::Sm90);
        for (name, build) in catalog() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        for name in [
            norm_name(false, Sink::F16Rows),
            norm_name(true, Sink::F16Rows),
            glu_name(Glu::Silu, Sink::F16Rows),
            glu_name(Glu::Gelu, Sink::F16Rows),
        ] {
            let body = ptx.split(&format!(".entry {name}(")).nth(1).unwrap();
            let body = body.split(".entry ").next().unwrap();
            assert!(body.contains("cvt.rn.f16x2.f32"), "{name}");
            assert!(!body.contains("st.global.u8"), "{name} writes no q8_1");
        }
        assert_eq!(catalog().len(), 8);
        // 4 values 4i.. as halves 4i, 4i + 2, 4i + 1, 4i + 3; a row padded to its tile.
        let out: Vec<f32> = (0..288).map(|i| i as f32).collect();
        let b = sink_cpu(&out, 288, Sink::F16Rows).unwrap();
        assert_eq!(b.len(), Sink::F16Rows.row_bytes(288).unwrap());
        assert_eq!(b.len(), 2 * 512);
        let h = |i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
        assert_eq!([h(4), h(5), h(6), h(7)], [4.0, 6.0, 5.0, 7.0]);
        assert_eq!(h(300), 0.0);
        assert_eq!(
            sink_cpu(&out, 288, Sink::Q8_1).unwrap(),
            act::quantize_cpu(&out, 288).unwrap()
        );
    }

    #[test]
    fn the_twin_is_norm_then_quantize() {
        let n = 640;
        let mut x: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let y: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0)
            .collect();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 / 10.0).collect();
        let x0 = x.clone();
        let (out, q) = cpu(&mut x, Some(&y), &w, 1e-6).unwrap();
        let summed: Vec<f32> = x0.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert_eq!(x, summed);
        let mut want = vec![0f32; 2 * n];
        crate::ops::norm::rms_norm_cpu(&summed, &w, 1e-6, &mut want);
        assert_eq!(out, want);
        assert_eq!(q, act::quantize_cpu(&want, n).unwrap());
        assert_eq!(q.len(), 2 * q_row_bytes(n).unwrap());
        assert_eq!(launch(1, 4096).block.0, 1024);
        assert_eq!(launch(3, 64).grid.0, 3);
    }
}
