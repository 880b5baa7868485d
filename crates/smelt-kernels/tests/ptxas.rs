//! CI's check of the GPU kernels without a GPU: every kernel's PTX is generated and
//! assembled with ptxas (CUDA 13.0, the generation of the GPU machine's driver) for sm_80
//! and sm_90, failing on any error or warning, and ptxas's resource report is checked for
//! spills (a spilled GEMV is several times slower).
//!
//! ptxas comes from `SMELT_PTXAS`, else from `scripts/ptxas.sh` (which installs it once).
//! Neither working is a failure, never a skip.

use std::path::Path;
use std::sync::OnceLock;

use smelt_kernels::catalog;
use smelt_ptx::ptxas::Ptxas;
use smelt_ptx::{Module, Target};

fn ptxas() -> &'static Ptxas {
    static PTXAS: OnceLock<Ptxas> = OnceLock::new();
    PTXAS.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ptxas.sh");
        Ptxas::locate(&script).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Assembles one kernel's module; `Err` holds ptxas's message, `Ok` its resource report.
fn assemble(target: Target, name: &str, ptx: &str) -> Result<String, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("smelt-kernels")
        .join(target.to_string());
    ptxas().assemble(&dir, target, name, ptx)
}

/// Assembles `jobs` (target, kernel name, PTX) on every core: ptxas runs one kernel at a
/// time, and this is the suite's longest test binary on CI's two cores.
fn assemble_all(jobs: &[(Target, String, String)]) -> Vec<Result<String, String>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut results: Vec<Option<Result<String, String>>> = vec![None; jobs.len()];
    let done = std::sync::Mutex::new(&mut results);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((target, name, ptx)) = jobs.get(i) else {
                    break;
                };
                let r = assemble(*target, name, ptx);
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every job assembled"))
        .collect()
}

/// Every catalog kernel, each in a module of its own, for both targets. Beside the
/// general rules, the mixture-of-experts kernels (router, plan, grouped GEMV of every
/// format and tile size, combine, the router's f32 GEMV, the fused decode router and
/// combine + norm of `moe_fused`) and the delta-net kernels must
/// not spill, except the grouped GEMV's 4- and 8-token tiles (prompts), whose few bytes are
/// shown, as for the many-token GEMVs.
#[test]
fn every_kernel_assembles_for_sm80_and_sm90_without_spills() {
    let mut failures = Vec::new();
    let mut assembled = 0;
    let mut strict = vec![catalog::QUANTIZE.to_string()];
    for ty in catalog::GEMV_TYPES {
        strict.push(catalog::gemv_name(ty, 1).unwrap_or_else(|e| panic!("{e}")));
    }
    // The GEMMs' activation quantizer must not spill. The GEMMs themselves run at a
    // 128-register cap on sm_90 (two blocks per SM): under the engine's own launch settings
    // none spills (ptxas -v, 2026-11-26), but with every programmatic-launch instruction
    // this test turns on, Q4_K's spills 16 bytes, so their spills are shown, not failed.
    strict.push(smelt_kernels::gemm::act::QUANTIZE.to_string());
    // The repack kernels (ggml blocks into the GEMV's rows on the device, in-situ
    // quantization's last step), one per GEMV format, must not spill either.
    let repack: Vec<String> = smelt_kernels::formats::gpu_repack::entries()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        repack.len(),
        catalog::GEMV_TYPES.len(),
        "a repack kernel per format"
    );
    strict.extend(repack.iter().cloned());
    // The one-shot all-reduce (every group size) must not spill either: its eight ranks'
    // predicates once did on sm_80 (the hardware has seven).
    strict.extend(
        smelt_kernels::allreduce::catalog()
            .into_iter()
            .chain(smelt_kernels::allreduce_norm::catalog())
            .map(|(n, _)| n),
    );
    let moe = |name: &str| {
        name.starts_with("moe_")
            || name.starts_with("delta_")
            || name == smelt_kernels::moe::DENSE_F32
    };
    let mut jobs = Vec::new();
    for target in [Target::Sm80, Target::Sm90] {
        for (name, build) in catalog::all() {
            let mut m = Module::new(target);
            // On sm_90 with every programmatic-dependent-launch instruction the runtime
            // can be asked for (`SMELT_CUDA_PDL`): waits, early launch, the GEMV prefetch.
            m.set_grid_dep(smelt_ptx::GridDep::ALL);
            if let Err(e) = m.kernel(&name, |k| build(k)) {
                failures.push(format!("{name} ({target}) did not build: {e}"));
                continue;
            }
            jobs.push((target, name, m.to_ptx()));
        }
    }
    let mut moe_assembled = 0;
    for ((target, name, _), result) in jobs.iter().zip(assemble_all(&jobs)) {
        match result {
            Ok(report) => {
                assembled += 1;
                let smem = report
                    .split(" bytes smem")
                    .next()
                    .and_then(|r| r.rsplit(' ').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
                // The GEMMs run in a carveout of their own (`gemm::SHARED_BYTES`).
                let limit = if name.starts_with("gemm_") {
                    smelt_kernels::gemm::SHARED_BYTES
                } else {
                    catalog::MAX_SHARED_BYTES
                };
                if smem > limit {
                    failures.push(format!(
                        "{name} ({target}) declares {smem} bytes of shared memory, more than the {limit} it must fit in (catalog::MAX_SHARED_BYTES, gemm::SHARED_BYTES)"
                    ));
                }
                let spills = !report.contains(" 0 bytes spill stores");
                // The kernels decode runs (1 token, default configuration) and the
                // quantize kernel must not spill; ptxas's own register budget leaves
                // a few bytes in some many-token variants, which are shown.
                // The grouped GEMV's lane-group variants (`_l16`, `_l8`): ptxas aims at
                // 40 registers for them, and Q8_0's and Q4_0's spill 8-12 bytes (to L1),
                // so theirs are shown too (a `.minnctapersm 8` hint gave 64 registers
                // and still 4 bytes).
                let lane_groups = name.ends_with("_l16") || name.ends_with("_l8");
                let prompt_tile = name.ends_with("_t4") || name.ends_with("_t8") || lane_groups;
                if moe(name) && (!spills || prompt_tile) {
                    moe_assembled += 1;
                }
                if spills && (strict.contains(name) || (moe(name) && !prompt_tile)) {
                    failures.push(format!("{name} ({target}) spills:\n{report}"));
                } else if spills {
                    eprintln!("note: {name} ({target}) spills:\n{report}");
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed:\n\n{}",
        failures.len(),
        failures.len() + assembled,
        failures.join("\n\n")
    );
    let delta = smelt_kernels::delta_net::catalog().len();
    let fused_moe = smelt_kernels::moe_fused::catalog().len();
    assert_eq!(
        moe_assembled,
        2 * (5
            + fused_moe
            + smelt_kernels::moe::gemv_id_variants().count() * catalog::GEMV_TYPES.len()
            + delta),
        "MoE and delta-net kernels assembled"
    );
}

#[test]
fn the_whole_module_assembles() {
    // sm_90 with the timeline's instrumentation too (`SMELT_CUDA_TIMELINE`): its exits
    // become branches, its waits are followed by timestamps.
    for (target, timeline) in [(Target::Sm80, false), (Target::Sm90, true)] {
        let all = smelt_ptx::GridDep::ALL;
        let m = catalog::module_with(target, all, all, &[], &[], timeline)
            .unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = assemble(target, "all", &m.to_ptx()) {
            panic!("{e}");
        }
    }
}
/// Assembles `entries` for sm_80 and sm_90 with the engine's programmatic-launch settings
/// for GEMMs (`catalog::GRID_DEPS.0`), printing each report; fails on any that does not
/// build, assemble, or spills. Returns how many assembled.
fn assemble_without_spills(entries: impl Fn() -> Vec<catalog::Entry>) -> usize {
    let mut failures = Vec::new();
    let mut assembled = 0;
    for target in [Target::Sm80, Target::Sm90] {
        for (name, build) in entries() {
            let mut m = Module::new(target);
            m.set_grid_dep(catalog::GRID_DEPS.0);
            if let Err(e) = m.kernel(&name, |k| build(k)) {
                failures.push(format!("{name} ({target}) did not build: {e}"));
                continue;
            }
            match assemble(target, &name, &m.to_ptx()) {
                Ok(report) if report.contains(" 0 bytes spill stores") => {
                    assembled += 1;
                    eprintln!("{name} ({target}): {report}");
                }
                Ok(report) => failures.push(format!("{name} ({target}) spills:\n{report}")),
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assembled
}

/// The grouped (mixture-of-experts) GEMMs assemble for both targets with the engine's
/// programmatic-launch settings for them, within the GEMMs' shared memory, and without a
/// spill: they run every prompt's expert matmuls.
#[test]
fn grouped_gemms_assemble_without_spills() {
    let grouped = smelt_kernels::gemm::grouped::catalog;
    assert_eq!(assemble_without_spills(grouped), 2 * grouped().len());
    assert_eq!(smelt_kernels::gemm::grouped::TYPES.len(), grouped().len());
}

/// The narrow GEMMs (batched decode's matmuls) under the engine's launch settings: they
/// keep one tile's weights in registers beside their accumulators and must not spill
/// (their rings are dynamic shared memory, which ptxas does not count).
#[test]
fn narrow_gemms_assemble_without_spills() {
    let narrow = smelt_kernels::gemm::narrow::catalog;
    assert_eq!(assemble_without_spills(narrow), 2 * narrow().len());
}

/// The split-K GEMMs (`gemm::narrow`, `gemm::f16_small`, `gemm::f16`, the int8
/// `gemm::kernel`) with the engine's programmatic-launch settings (`catalog::GRID_DEPS.0`)
/// on sm_90: their split fix-up (the last block of a tile sums the splits, `gemm::fixup`)
/// runs after the K loop and must not push the accumulators into local memory. The f16
/// and narrow ones must not spill at all; the int8 ones no more than before the fix-up
/// (ptxas 13.0, 2026-11-27: Q4_K and Q5_K 16 bytes, Q4_1 and Q5_1 4, the rest none). Each
/// report is printed (registers, to compare builds).
#[test]
fn split_gemms_assemble_without_new_spills_on_sm90() {
    const BEFORE: &[(&str, usize)] = &[
        ("gemm_q4_k", 16),
        ("gemm_q5_k", 16),
        ("gemm_q4_1", 4),
        ("gemm_q5_1", 4),
    ];
    let gemm = |n: &str| {
        n.starts_with("gemm_narrow")
            || n.starts_with("gemm_f16s")
            || n.starts_with("gemm_f16_q")
            || n.starts_with("gemm_q")
            || n.starts_with("gemm_iq")
    };
    let mut jobs = Vec::new();
    for (name, build) in catalog::all().into_iter().filter(|(n, _)| gemm(n)) {
        let mut m = Module::new(Target::Sm90);
        m.set_grid_dep(catalog::GRID_DEPS.0);
        m.kernel(&name, |k| build(k))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        jobs.push((Target::Sm90, name, m.to_ptx()));
    }
    let split = smelt_kernels::gemm::narrow::catalog().len()
        + smelt_kernels::gemm::f16_small::catalog().len()
        + smelt_kernels::gemm::f16::TYPES.len()
        + smelt_kernels::gemm::TYPES.len();
    assert_eq!(jobs.len(), split, "every split GEMM selected once");
    let mut failures = Vec::new();
    for ((_, name, _), result) in jobs.iter().zip(assemble_all(&jobs)) {
        match result {
            Ok(report) => {
                eprintln!("{name}: {}", report.trim());
                let spilled = report
                    .split(" bytes spill stores")
                    .next()
                    .and_then(|r| r.rsplit(' ').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(usize::MAX);
                let allowed = BEFORE
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0, |(_, b)| *b);
                if spilled > allowed {
                    failures.push(format!(
                        "{name} spills {spilled} bytes (allowed {allowed}):\n{report}"
                    ));
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
