//! Small kernels that exercise the builder end to end. CI assembles them with ptxas for
//! every target (`tests/ptxas.rs`), and `examples/emit_ptx.rs` writes them out to read.
//! The production kernels live in `smelt-kernels`; these stay small and obvious.

use crate::{
    Exact, FloatRound, Kernel, L2Prefetch, Load, Lut, Module, Narrow, PtxError, Reg, Space, Store,
    Target, F16, F32, S32, U32, U64,
};

/// Bytes of a Q8_0 block: an f16 scale and 32 int8 quants.
pub const Q8_0_BLOCK_BYTES: u32 = 34;
/// Bytes of a Q4_0 block: an f16 scale and 32 4-bit quants.
pub const Q4_0_BLOCK_BYTES: u32 = 18;

/// A demo kernel: its entry name and the function that emits it.
pub type DemoKernel = (&'static str, fn(&Kernel));

/// Every demo kernel.
pub const ALL: &[DemoKernel] = &[
    ("vector_add", vector_add),
    ("vector_add_v4", vector_add_v4),
    ("block_sum", block_sum),
    ("q8_0_dot_rows", q8_0_dot_rows),
    ("q4_0_dequant", q4_0_dequant),
];

/// A module holding every demo kernel, for `target`.
pub fn module(target: Target) -> Result<Module, PtxError> {
    let mut m = Module::new(target);
    for (name, build) in ALL {
        m.kernel(name, build)?;
    }
    Ok(m)
}

/// A module holding one demo kernel, so a ptxas failure names the kernel.
pub fn single(target: Target, kernel: &DemoKernel) -> Result<Module, PtxError> {
    let mut m = Module::new(target);
    m.kernel(kernel.0, kernel.1)?;
    Ok(m)
}

/// `c[i] = a[i] + b[i]` over `n` floats, one thread per element.
pub fn vector_add(k: &Kernel) {
    let (a, b, c) = (k.param_ptr("a"), k.param_ptr("b"), k.param_ptr("c"));
    let n = k.param_u32("n");
    let i = k.global_id_x();
    k.exit_if(k.ge(i, n));
    let x = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(a, i, 4));
    let y = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(b, i, 4));
    let sum = k.add(k.reg(), x, y);
    k.st(Store::GLOBAL, k.elem_addr(c, i, 4), sum);
}

/// `vector_add` four floats per thread: 16-byte `.nc` loads with the 256-byte L2
/// prefetch hint, 16-byte stores. `n4` counts float4s (pointers 16-byte aligned).
pub fn vector_add_v4(k: &Kernel) {
    let (a, b, c) = (k.param_ptr("a"), k.param_ptr("b"), k.param_ptr("c"));
    let n4 = k.param_u32("n4");
    let i = k.global_id_x();
    k.exit_if(k.ge(i, n4));
    let load = Load::GLOBAL_NC.prefetch(L2Prefetch::B256);
    let x = k.regs::<F32, 4>();
    let y = k.regs::<F32, 4>();
    k.ld_v4(load, x, k.elem_addr(a, i, 16));
    k.ld_v4(load, y, k.elem_addr(b, i, 16));
    for (x, y) in x.iter().zip(&y) {
        k.add(*x, *x, *y);
    }
    k.st_v4(Store::GLOBAL, k.elem_addr(c, i, 16), x);
}

/// `*out += sum(x[0..n])`: a grid-stride loop, a warp butterfly, per-warp partials in
/// shared memory, a second butterfly in warp 0 and one `red.global.add.f32` per block.
/// `*out` must be zeroed first; blocks of at most 1024 threads, a multiple of 32.
pub fn block_sum(k: &Kernel) {
    let x = k.param_ptr("x");
    let out = k.param_ptr("out");
    let n = k.param_u32("n");
    let partials = k.shared::<F32>("partials", 32, 4);

    let tid = k.tid_x();
    let lane = k.and(k.reg(), tid, 31);
    let warp = k.shr(k.reg(), tid, 5);
    let acc = k.f32(0.0);
    let (start, step) = (k.global_id_x(), k.grid_size_x());
    k.stride_loop(start, n, step, |k, i| {
        let v = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(x, i, 4));
        k.add(acc, acc, v);
    });
    let warp_total = k.warp_sum(acc);

    let base = k.shared_base(&partials);
    let lane0 = k.eq(lane, 0);
    let slot = k.mad(k.reg(), warp, 4, base);
    k.guarded(lane0, |k| k.st(Store::SHARED, slot, warp_total));
    k.bar_sync();

    k.if_(k.eq(warp, 0), |k| {
        let nwarps = k.shr(k.reg(), k.ntid_x(), 5);
        let v = k.f32(0.0);
        let mine = k.mad(k.reg(), lane, 4, base);
        k.guarded(k.lt(lane, nwarps), |k| {
            k.ld(Load::SHARED, v, mine);
        });
        let total = k.warp_sum(v);
        k.guarded(lane0, |k| k.red_add::<F32>(Space::Global, out, total));
    });
}

/// `out[r] = dot(a[r], b)` for rows of `nblocks` Q8_0 blocks, one warp per row (blocks of
/// 32 x warps threads; `tid.y` picks the warp): lanes stride over blocks, unpack the
/// 2-byte-aligned quants with `prmt`, multiply with `dp4a`, scale by the product of the
/// two f16 scales with `mul.rn`/`fma.rn`, and reduce with a warp butterfly.
pub fn q8_0_dot_rows(k: &Kernel) {
    let (a, b, out) = (k.param_ptr("a"), k.param_ptr("b"), k.param_ptr("out"));
    let nblocks = k.param_u32("nblocks");
    let nrows = k.param_u32("nrows");
    let row = k.mad(k.reg(), k.ctaid_x(), k.ntid_y(), k.tid_y());
    k.exit_if(k.ge(row, nrows));
    let row_bytes = k.mul(k.reg(), nblocks, Q8_0_BLOCK_BYTES);
    let row_offset = k.mul_wide(k.reg::<U64>(), row, row_bytes);
    let a_row = k.add(k.reg(), a, row_offset);

    let acc = k.f32(0.0);
    k.stride_loop(k.tid_x(), nblocks, 32, |k, blk| {
        let wa = k.elem_addr(a_row, blk, Q8_0_BLOCK_BYTES);
        let wb = k.elem_addr(b, blk, Q8_0_BLOCK_BYTES);
        let qa = q8_0_quants(k, wa);
        let qb = q8_0_quants(k, wb);
        let da = k.load::<F16>(Load::GLOBAL_NC, wa);
        let db = k.load::<F16>(Load::GLOBAL_NC, wb);
        let isum = k.s32(0);
        for (x, y) in qa.iter().zip(&qb) {
            k.dp4a(isum, *x, *y, isum);
        }
        let sum = k.cvt(k.reg::<F32>(), isum, FloatRound::Rn);
        let da = k.cvt(k.reg::<F32>(), da, Exact);
        let db = k.cvt(k.reg::<F32>(), db, Exact);
        let scale = k.mul(k.reg(), da, db);
        k.fma(acc, sum, scale, acc);
    });
    let total = k.warp_sum(acc);
    k.if_(k.eq(k.tid_x(), 0), |k| {
        k.st(Store::GLOBAL, k.elem_addr(out, row, 4), total);
    });
}

/// The 32 quants of the Q8_0 block at `block` as eight words. They sit at offset 2 of a
/// 34-byte block, so only 2-byte loads are aligned; `prmt` joins pairs of halves.
fn q8_0_quants(k: &Kernel, block: Reg<U64>) -> [Reg<U32>; 8] {
    std::array::from_fn(|w| {
        let offset = 2 + 4 * w as i64;
        let lo = k.ld_narrow(
            Load::GLOBAL_NC,
            Narrow::U16,
            k.reg::<U32>(),
            block.at(offset),
        );
        let hi = k.ld_narrow(
            Load::GLOBAL_NC,
            Narrow::U16,
            k.reg::<U32>(),
            block.at(offset + 2),
        );
        k.prmt(k.reg::<U32>(), lo, hi, 0x5410)
    })
}

/// Dequantizes `nblocks` Q4_0 blocks to f32, one thread per block: value `j` of a block
/// is `d * ((q[j] & 0xF) - 8)` and value `j + 16` is `d * ((q[j] >> 4) - 8)`. Low
/// nibbles are masked with `lop3`, high ones shifted and masked, bytes pulled out with
/// `bfe`, and results written with 16-byte stores.
pub fn q4_0_dequant(k: &Kernel) {
    let (q, y) = (k.param_ptr("q"), k.param_ptr("y"));
    let nblocks = k.param_u32("nblocks");
    let blk = k.global_id_x();
    k.exit_if(k.ge(blk, nblocks));
    let src = k.elem_addr(q, blk, Q4_0_BLOCK_BYTES);
    let dst = k.elem_addr(y, blk, 32 * 4);
    let d = k.load::<F16>(Load::GLOBAL_NC, src);
    let d = k.cvt(k.reg::<F32>(), d, Exact);
    let nibbles = Lut::from_fn(|a, b, _| a & b);
    for w in 0..4 {
        let offset = 2 + 4 * i64::from(w);
        let lo = k.ld_narrow(Load::GLOBAL_NC, Narrow::U16, k.reg::<U32>(), src.at(offset));
        let hi = k.ld_narrow(
            Load::GLOBAL_NC,
            Narrow::U16,
            k.reg::<U32>(),
            src.at(offset + 2),
        );
        let word = k.prmt(k.reg::<U32>(), lo, hi, 0x5410);
        let low = k.lop3(k.reg::<U32>(), word, 0x0F0F_0F0F, 0, nibbles);
        let shifted = k.shr(k.reg(), word, 4);
        let high = k.and(k.reg(), shifted, 0x0F0F_0F0F);
        for (plane, first) in [(low, 4 * w), (high, 16 + 4 * w)] {
            let values = k.regs::<F32, 4>();
            for (byte, v) in values.iter().enumerate() {
                let n = k.bfe(k.reg::<U32>(), plane, 8 * byte as u32, 8);
                let centered = k.sub(k.reg::<S32>(), n.cast::<S32>(), 8);
                k.cvt(*v, centered, FloatRound::Rn);
                k.mul(*v, *v, d);
            }
            k.st_v4(Store::GLOBAL, dst.at(4 * i64::from(first)), values);
        }
    }
}
