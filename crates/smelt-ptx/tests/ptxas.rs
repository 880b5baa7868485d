//! Assembles generated PTX with ptxas (the PyPI `nvidia-cuda-nvcc` build that matches
//! driver 580) for sm_80 and sm_90, failing on any error or warning: CI has no GPU, so this
//! is where a malformed instruction is caught.
//!
//! ptxas comes from `SMELT_PTXAS`, else from running `scripts/ptxas.sh` (which installs
//! it once). Neither working is a failure, never a skip.

use std::path::Path;
use std::sync::OnceLock;

use smelt_ptx::ptxas::Ptxas;
use smelt_ptx::*;

const TARGETS: [Target; 2] = [Target::Sm80, Target::Sm90];

fn ptxas() -> &'static Ptxas {
    static PTXAS: OnceLock<Ptxas> = OnceLock::new();
    PTXAS.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ptxas.sh");
        Ptxas::locate(&script).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Assembles one module, keeping its PTX under the target's tmp dir for reading a failure.
fn assemble(target: Target, name: &str, ptx: &str) -> Result<(), String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("smelt-ptx")
        .join(target.to_string());
    ptxas().assemble(&dir, target, name, ptx).map(|_| ())
}

fn assemble_all(modules: impl Fn(Target) -> Vec<(String, Result<Module, PtxError>)>) {
    let mut failures = Vec::new();
    let mut assembled = 0;
    for target in TARGETS {
        for (name, module) in modules(target) {
            match module {
                Err(e) => failures.push(format!("{name} ({target}) did not build: {e}")),
                Ok(m) => match assemble(target, &name, &m.to_ptx()) {
                    Ok(()) => assembled += 1,
                    Err(e) => failures.push(e),
                },
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} modules failed:\n\n{}",
        failures.len(),
        failures.len() + assembled,
        failures.join("\n\n")
    );
}

#[test]
fn demo_kernels_assemble() {
    assemble_all(|target| {
        let mut v: Vec<_> = demo::ALL
            .iter()
            .map(|kernel| (kernel.0.to_string(), demo::single(target, kernel)))
            .collect();
        v.push(("demo_all".to_string(), demo::module(target)));
        v
    });
}

/// One kernel that uses every instruction form the builder emits, so each is known to be
/// accepted by ptxas, not only to print as the unit tests expect.
fn tour(k: &Kernel) {
    let p = k.param_ptr("p");
    let n = k.param_u32("n");
    let tile = k.shared::<U32>("tile", 64, 16);
    let (tid, lane) = (k.tid_x(), k.lane());
    k.special(Special::Ctaid(Dim::Z));
    k.special(Special::Nctaid(Dim::Y));
    k.special(Special::WarpId);
    k.special(Special::SmId);
    let gid = k.global_id_x();
    k.grid_size_x();

    // integers
    let u = k.add(k.reg(), tid, 1u32);
    k.sub(u, u, lane);
    k.mul(u, u, 3u32);
    k.mul_hi(u, u, 0x9E37_79B9u32);
    k.mad(u, u, 5u32, tid);
    k.div_int(u, u, 7u32);
    k.rem(u, u, 7u32);
    k.min(u, u, n);
    k.max(u, u, 1u32);
    let s = k.s32(-3);
    k.neg(s, s);
    k.abs(s, s);
    let wide = k.mul_wide(k.reg::<S64>(), s, -2i32);
    k.add(wide, wide, 1i64);
    let w16 = k.reg::<U16>();
    k.mov(w16, 7u16);
    k.mul_wide(k.reg::<U32>(), w16, 3u16);

    // floats
    let x = k.f32(1.5);
    let y = k.add(k.reg(), x, 2.0f32);
    k.sub(y, y, x);
    k.mul(y, y, x);
    k.fma(y, y, x, 0.25f32);
    k.min(y, y, x);
    k.max(y, y, 0.0f32);
    k.neg(y, y);
    k.abs(y, y);
    k.div_rn(y, y, x);
    k.rcp_approx(y, y);
    k.sqrt_rn(y, y);
    k.rsqrt_approx(y, y);
    k.ex2_approx(y, y);
    k.lg2_approx(y, y);
    let h = k.f16_bits(0x3C00);
    let h2 = k.add(k.reg(), h, h);
    k.mul(h2, h2, h);
    k.fma(h2, h2, h, h);
    k.pack_f16x2(h, h2);
    let dd = k.reg::<F64>();
    k.mov(dd, 0.5f64);
    k.fma(dd, dd, dd, dd);

    // conversions
    let fi = k.cvt(k.reg::<F32>(), s, FloatRound::Rn);
    k.cvt(s, fi, IntRound::Rni);
    k.cvt(u, fi, IntRound::Rzi);
    k.cvt(fi, h, Exact);
    k.cvt(h, fi, FloatRound::Rn);
    k.cvt(fi, fi, IntRound::Rmi);
    k.cvt(dd, fi, Exact);
    k.cvt(fi, dd, FloatRound::Rz);
    k.cvt(k.reg::<U64>(), u, Exact);
    k.cvt(k.reg::<Bf16>(), fi, FloatRound::Rn);
    k.cvt_sat(s, fi, IntRound::Rni);
    k.cvt_sat(fi, fi, IntRound::Rni);
    k.sext_i8(s, u);
    let bits = k.bitcast::<U32, F32>(fi);
    k.bitcast::<F32, U32>(bits);
    k.bitcast::<F64, U64>(k.u64(1));
    k.mov_from(k.reg::<B32>(), u);

    // bits
    k.and(u, u, 0xFFu32);
    k.or(u, u, bits);
    k.xor(u, u, 0x8080_8080u32);
    k.not(u, u);
    k.and(fi, fi, 0x7FFF_FFFFu32);
    k.shl(u, u, 2u32);
    k.shr(u, u, 1u32);
    k.shr(s, s, 1u32);
    k.shl(wide, wide, 3u32);
    k.prmt(u, u, bits, 0x5410u32);
    k.prmt_mode(PrmtMode::Rc8, u, u, 0u32, 0u32);
    k.lop3(u, u, bits, 0x0F0Fu32, Lut::from_fn(|a, b, c| (a & b) ^ c));
    k.bfe(u, u, 4u32, 6u32);
    k.bfe(s, s, 0u32, 8u32);
    k.bfi(u, bits, u, 8u32, 8u32);
    k.popc(u, u);
    k.clz(u, u);
    k.brev(u, u);
    k.brev64(k.reg::<B64>(), wide);
    let acc = k.s32(0);
    k.dp4a(acc, u, bits, acc);
    k.dp4a_with(Bytes::Unsigned, Bytes::Signed, acc, u, 0x0101_0101u32, acc);
    k.dp4a_with(Bytes::Unsigned, Bytes::Unsigned, acc, u, u, acc);

    // comparisons and selects
    let pr = k.cmp(Cmp::Lt, gid, n);
    k.setp(Cmp::Ne, pr, y, 0.0f32);
    k.setp(Cmp::Eq, pr, h, h);
    k.setp(Cmp::Le, pr, s, 4i32);
    k.selp(y, y, 1.0f32, pr);
    let q = k.reg::<Pred>();
    k.and(q, pr, pr);
    k.not(q, q);

    // memory
    let addr = k.elem_addr(p, gid, 16);
    let v4 = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC.prefetch(L2Prefetch::B256), v4, addr);
    k.ld_v4(Load::GLOBAL.cache(LoadCache::Cg), v4, addr);
    k.ld_v2(
        Load::GLOBAL_NC.prefetch(L2Prefetch::B128),
        [v4[0], v4[1]],
        addr.at(8),
    );
    k.ld(Load::GLOBAL.prefetch(L2Prefetch::B64), y, addr);
    k.ld(Load::GLOBAL_NC, h, addr.at(2));
    k.ld_narrow(Load::GLOBAL_NC, Narrow::U8, u, addr.at(1));
    k.ld_narrow(Load::GLOBAL, Narrow::S16, s, addr.at(2));
    k.ld(Load::GLOBAL.cache(LoadCache::Cs), dd, addr);
    k.prefetch_l2(addr);
    k.st_v4(Store::GLOBAL.cache(StoreCache::Cs), addr, v4);
    k.st_v2(Store::GLOBAL, addr, [y, y]);
    k.st(Store::GLOBAL.cache(StoreCache::Wt), addr, h);
    k.st_narrow(Store::GLOBAL, Narrow::U8, addr.at(3), u);
    let slot = k.mad(k.reg(), lane, 4u32, k.shared_base(&tile));
    k.st(Store::SHARED, slot, u);
    k.st_v4(Store::SHARED, tile.at(16), v4);
    k.bar_sync();
    k.ld(Load::SHARED, u, tile.at(4));
    k.ld_v4(Load::SHARED, v4, tile.at(32));
    k.atom_add(Space::Global, y, addr, y);
    k.atom_add(Space::Global, u, addr, 1u32);
    k.atom_add(Space::Shared, u, slot, 1u32);
    k.atom_add(Space::Global, dd, addr, dd);
    k.red_add::<F32>(Space::Global, addr, 1.0f32);
    k.red_add::<U64>(Space::Global, addr, 1u64);
    k.atom_cas(Space::Global, u, addr, 0u32, 1u32);

    // warps
    k.shfl_sync(Shfl::Down, y, y, 1u32, FULL_WARP);
    k.shfl_sync(Shfl::Up, u, u, 1u32, FULL_WARP);
    k.shfl_sync(Shfl::Idx, u, u, 0u32, FULL_WARP);
    k.warp_sum(y);
    k.warp_sum(s);
    k.warp_max(y);

    // votes, fences
    k.ballot(u, pr, FULL_WARP);
    k.vote_any(q, !pr, FULL_WARP);
    k.vote_all(q, pr, FULL_WARP);
    k.activemask(u);
    k.membar(Scope::Cta);
    k.membar(Scope::Gpu);
    k.membar(Scope::Sys);

    // async copies and tensor cores
    let stage = k.shared::<B32>("stage", 256, 16);
    let sbase = k.shared_base(&stage);
    let srow = k.mad(k.reg(), lane, 16u32, sbase);
    k.cp_async(CpAsyncCache::Cg, srow, addr, 16);
    k.cp_async(CpAsyncCache::Ca, srow.at(4), addr.at(4), 4);
    k.cp_async_commit();
    k.cp_async_wait(0);
    k.bar_sync();
    let fa = k.regs::<B32, 4>();
    let fb = k.regs::<B32, 2>();
    k.ldmatrix(fa, srow, false);
    k.ldmatrix(fb, srow, true);
    k.ldmatrix([fb[0]], srow, false);
    let facc = k.regs::<F32, 4>();
    for r in facc {
        k.mov(r, 0.0f32);
    }
    k.mma_m16n8k16(MmaFloat::F16, facc, fa, fb, facc);
    k.mma_m16n8k16(MmaFloat::Bf16, facc, fa, fb, facc);
    // packed halves (the f16 GEMM's weight dequantization)
    k.sub_f16x2(fa[0], fa[1], fa[2]);
    k.fma_f16x2(fa[0], fa[0], fa[1], fa[2]);
    let iacc = k.regs::<S32, 4>();
    for r in iacc {
        k.mov(r, 0i32);
    }
    k.mma_m16n8k32_s8(iacc, fa, fb, iacc);
    k.st_v4(Store::GLOBAL, addr, facc);
    k.st_v4(Store::GLOBAL, addr.at(16), iacc);

    // control
    k.if_(pr, |k| {
        k.add(u, u, 1u32);
    });
    k.if_else(!pr, |k| k.comment("then"), |k| k.comment("else"));
    k.for_count(4u32, |k, i| {
        k.add(u, u, i);
    });
    k.stride_loop(gid, n, k.grid_size_x(), |k, i| {
        k.guarded(k.eq(i, 3u32), |k| k.st(Store::GLOBAL, addr, y));
    });
    let l = k.label();
    k.bra_if(q, l);
    k.bra(l);
    k.place(l);
    k.bar_sync_count(1, 64);
    k.raw(format!("tanh.approx.f32 {y}, {y}"));
    k.st(Store::GLOBAL, addr, y);
    k.exit_if(!pr);
    k.exit();
}

#[test]
fn every_instruction_form_assembles() {
    assemble_all(|target| {
        let mut m = Module::new(target);
        let built = m.kernel("tour", |k| {
            k.max_threads(256, 1, 1);
            k.min_blocks_per_sm(2);
            tour(k)
        });
        vec![("tour".to_string(), built.map(|m| m.clone()))]
    });
}

#[test]
fn newest_accepted_isa_assembles() {
    assemble_all(|target| {
        let m = Module::with_version(target, PtxVersion::NEWEST).and_then(|mut m| {
            m.kernel("vector_add", demo::vector_add)?;
            Ok(m)
        });
        vec![("isa_9_0".to_string(), m)]
    });
}

#[test]
fn ptxas_warnings_fail() {
    let mut m = Module::new(Target::Sm80);
    m.kernel("overcommitted", |k| {
        // 32 blocks of 1024 threads cannot fit on one SM: ptxas warns and ignores it.
        k.max_threads(1024, 1, 1);
        k.min_blocks_per_sm(32);
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let err = match assemble(Target::Sm80, "overcommitted", &m.to_ptx()) {
        Ok(()) => panic!("a ptxas warning passed"),
        Err(e) => e,
    };
    assert!(err.contains("minnctapersm"), "{err}");
}

#[test]
fn ptxas_failures_are_reported_with_the_offending_line() {
    let mut m = Module::new(Target::Sm80);
    m.kernel("broken", |k| {
        let r = k.tid_x();
        k.raw(format!("frobnicate.u32 {r}, {r}"));
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let err = match assemble(Target::Sm80, "broken", &m.to_ptx()) {
        Ok(()) => panic!("ptxas accepted an unknown instruction"),
        Err(e) => e,
    };
    assert!(err.contains(">>"), "{err}");
    assert!(err.contains("frobnicate.u32 %r0, %r0;"), "{err}");
}
