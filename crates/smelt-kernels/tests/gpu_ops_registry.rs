//! The GPU op harness (`examples/gpu_ops`) checked on the CPU, so CI (no GPU) catches a
//! kernel added to the catalog without a GPU case, a stale kernel pattern in the registry,
//! and a change to the harness's pass/fail rules (poisoned outputs must fail).

#[allow(dead_code, unused_imports)]
#[path = "../examples/gpu_ops/main.rs"]
mod gpu_ops;

use gpu_ops::harness::{worst_over_magnitude, Check, Report};
use gpu_ops::{glob, registry, selected, ELSEWHERE};

fn kernel_names() -> Vec<String> {
    smelt_kernels::catalog::all()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn every_catalog_kernel_has_a_gpu_case() {
    let cases = registry();
    let missing: Vec<String> = kernel_names()
        .into_iter()
        .filter(|k| !cases.iter().any(|c| c.covers(k)))
        .filter(|k| !ELSEWHERE.iter().any(|(p, _)| glob(p, k)))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels without a case in examples/gpu_ops (add one to `registry()`): {missing:?}"
    );
}

#[test]
fn registry_names_are_unique_and_patterns_match_kernels() {
    let names = kernel_names();
    let cases = registry();
    for (i, c) in cases.iter().enumerate() {
        assert!(cases[..i].iter().all(|d| d.op != c.op), "op {} twice", c.op);
        for p in c.covers.iter().chain(c.needs) {
            assert!(
                names.iter().any(|k| glob(p, k)),
                "{}: pattern {p} matches no catalog kernel",
                c.op
            );
        }
    }
    for (p, _) in ELSEWHERE {
        assert!(names.iter().any(|k| glob(p, k)), "{p} matches nothing");
    }
    // The big families are there, by the kernels the CUDA backend launches.
    for k in [
        "quantize_q8_1",
        "gemv_q4_k_t1",
        "gemm_reduce",
        "gemm_f16_act",
        "attention_prefill_hd80",
        "rms_norm",
        "sample_rows",
        "moe_plan",
        "delta_conv1d_silu",
    ] {
        assert!(names.iter().any(|n| n == k), "{k} left the catalog");
        assert!(cases.iter().any(|c| c.covers(k)), "{k} has no case");
    }
}

#[test]
fn glob_and_op_selection() {
    assert!(glob("gemv_*", "gemv_q4_k_t1"));
    assert!(glob("gemv_*ropekv*", "gemv_q4_k_t1_ropekv"));
    assert!(!glob("gemv_*ropekv*", "gemv_q4_k_t1_rmsin"));
    assert!(glob("rms_norm", "rms_norm"));
    assert!(!glob("rms_norm", "rms_norm_q8_1"));
    assert!(glob("*_q8_1", "glu_silu_q8_1"));
    let ops = |sel: &[&str]| -> Vec<&'static str> {
        let sel: Vec<String> = sel.iter().map(|s| s.to_string()).collect();
        selected(registry(), &sel).iter().map(|c| c.op).collect()
    };
    let all = ops(&[]);
    assert!(all.contains(&"gemv") && all.contains(&"moe"));
    // Explicit ops run only when named exactly.
    assert!(!all.contains(&"gemm_variants"));
    assert_eq!(ops(&["gemm_variants"]), ["gemm_variants"]);
    // A word that names an op picks just it; any other picks the ops containing it.
    assert_eq!(ops(&["gemm"]), ["gemm"]);
    assert_eq!(ops(&["rope"]), ["rope"]);
    assert_eq!(ops(&["rope_"]), ["gemv_rope_kv", "rope_kv_rows"]);
    assert_eq!(ops(&["gemm_", "norm"]), ["gemm_f16", "norm"]);
}

/// The rules every case is judged by: an unwritten (still NaN-poisoned) element fails, a
/// value within tolerance passes, one past it fails; a matmul's error is scaled by the
/// magnitude of its products.
#[test]
fn poisoned_outputs_fail_and_tolerances_hold() {
    let want = [1.0f32, -2.0, 3.5, 0.0];
    let mut c = Check::new("twin");
    c.add("exact", &want, &want, 0.0, 0.0);
    c.add("close", &[1.0, -2.0, 3.5 + 1e-6, 1e-7], &want, 1e-6, 1e-6);
    assert_eq!(c.fails, 0);
    c.add("unwritten", &[1.0, -2.0, f32::NAN, 0.0], &want, 1e-3, 1e-3);
    c.add("far", &[1.0, -2.0, 3.6, 0.0], &want, 1e-3, 1e-3);
    c.add("short", &want[..3], &want, 1.0, 1.0);
    assert_eq!((c.cases, c.fails), (5, 3));
    let mut bits = Check::new("bits");
    bits.bits("same", &[1u16, 0xffff], &[1u16, 0xffff]);
    bits.bits("poisoned", &[1u16, 0xffff], &[1u16, 7]);
    assert_eq!(bits.fails, 1);

    let mut rep = Report::default();
    rep.push("twin", c, "1e-3");
    let mag = [10.0f64; 4];
    let ok = worst_over_magnitude(&want, &want, &mag);
    assert_eq!(ok, 0.0);
    assert!(rep.case("gemv", "1x4", "err/mag", ok, 1e-5));
    let nan = worst_over_magnitude(&[1.0, f32::NAN, 3.5, 0.0], &want, &mag);
    assert!(nan.is_nan());
    assert!(!rep.case("gemv", "1x4 poisoned", "err/mag", nan, 1e-5));
    assert!(!rep.case("gemv", "1x4 off", "err/mag", 2e-5, 1e-5));
    assert!(!rep.verdict("isq", "bytes", false, "1 byte differs"));
    assert_eq!(rep.failures(), 3);
    let gemv = rep.rows.iter().find(|r| r.op == "gemv").unwrap();
    assert_eq!((gemv.cases, gemv.fails), (3, 2));
}

/// The CPU twins the GEMV cases compare against, on a tiny ragged shape: the twin's
/// magnitudes bound its own rounding, and the q8_1 quantizer twin round-trips the
/// tiles the GPU cases read (built here exactly as a case builds its inputs).
#[test]
fn a_tiny_gemv_case_builds_on_the_cpu() {
    use rand::SeedableRng;
    use smelt_kernels::{act, catalog, gemv, GgmlType};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0] {
        let (nrows, k, ntok) = (3usize, 256usize, 2usize);
        let ggml = gpu_ops::harness::random_weights(&mut rng, ty, nrows, k).unwrap();
        let packed = catalog::repack(ty, &ggml, nrows, k).unwrap();
        assert_eq!(packed.len(), nrows * catalog::row_bytes(ty, k).unwrap());
        let x = gpu_ops::harness::random_floats(&mut rng, k * ntok, 2.0);
        let q = act::quantize_cpu(&x, k).unwrap();
        let (want, mag) = gemv::cpu_with_magnitude(ty, &ggml, nrows, k, &q, ntok).unwrap();
        assert_eq!(want.len(), nrows * ntok);
        assert!(want.iter().all(|v| v.is_finite()));
        assert_eq!(worst_over_magnitude(&want, &want, &mag), 0.0);
        // A poisoned (never written) output fails the case.
        let poisoned = vec![f32::NAN; want.len()];
        assert!(worst_over_magnitude(&poisoned, &want, &mag).is_nan());
    }
}

/// Every registered op's inputs and CPU twins at a tiny ragged shape (`tiny::run`): the CPU
/// half of its GPU case, which CI can run.
#[test]
fn every_op_builds_its_tiny_case_on_the_cpu() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for c in registry() {
        let n = gpu_ops::tiny::run(c.op, &mut rng).unwrap_or_else(|e| panic!("{}: {e:#}", c.op));
        assert!(n > 0, "{}: no reference values", c.op);
    }
    assert!(gpu_ops::tiny::run("no such op", &mut rng).is_err());
}
