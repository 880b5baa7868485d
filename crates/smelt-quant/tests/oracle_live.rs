//! smelt-quant against the Python oracles, run now (not from committed data):
//!
//! - `ggml_refs.py check`: the committed references under `tests/ggml/` are still exactly
//!   what ggml (llama-cpp-python's libggml) produces, so `ggml_parity.rs` compares with
//!   ggml itself;
//! - gguf-py's numpy quantizers (legacy types, F16, BF16) on fresh random rows and
//!   adversarial rows: byte-identical;
//! - gguf-py's dequantizers on fresh random valid blocks of every type it has: identical
//!   bits;
//! - ggml's quantizers and dequantizers on fresh data of the same kinds, for every type;
//! - ggml-cpu's own `vec_dot` on smelt-quantized rows: within the dot tolerance.
//!
//! The oracles live in the venv `scripts/oracles.sh` makes (or at `SMELT_PYTHON`); when
//! it is missing these tests fail and say so. Fresh seeds are printed; `SMELT_SEED`
//! replays one.

mod common;

use common::dot_cases::{cases, reference};
use common::{
    catch, f32_bytes, floats, hex, random_valid_blocks, run_oracle, Report, Rng, Scratch,
};
use smelt_quant::{act_type, dequantize_row, quantize_row, vec_dot, GgmlType};

/// gguf-py's name for a type (its `GGMLQuantizationType` member).
fn py_name(ty: GgmlType) -> String {
    ty.name().to_ascii_uppercase()
}

#[test]
fn committed_references_are_ggml_output_today() {
    let dir = common::ref_dir();
    let (code, text) = run_oracle("ggml_refs.py", &["check", &dir.to_string_lossy()]);
    eprintln!("{text}");
    assert_eq!(
        code,
        Some(0),
        "ggml_refs.py check failed (exit {code:?}):\n{text}"
    );
}

/// Rows that stress rounding, ranges and degenerate blocks, `n` values each.
fn adversarial_rows(n: usize, rng: &mut Rng) -> Vec<(&'static str, Vec<f32>)> {
    let normal =
        |scale: f32, rng: &mut Rng| -> Vec<f32> { (0..n).map(|_| rng.normal() * scale).collect() };
    let mut rows = vec![
        ("zeros", vec![0.0; n]),
        ("const 1", vec![1.0; n]),
        ("const -1", vec![-1.0; n]),
        ("const 0.3", vec![0.3; n]),
        ("const -7", vec![-7.0; n]),
        ("normal*1e-30", normal(1e-30, rng)),
        ("normal*1e-38", normal(1e-38, rng)),
        ("normal*1e30", normal(1e30, rng)),
        ("normal*1e-3", normal(1e-3, rng)),
    ];
    let mut outlier = normal(1.0, rng);
    outlier[rng.below(n)] = 1e4;
    rows.push(("one outlier 1e4", outlier));
    let mut outlier = normal(1.0, rng);
    outlier[rng.below(n)] = -3e38;
    rows.push(("one outlier -3e38", outlier));
    rows.push((
        "subnormals",
        (0..n)
            .map(|_| f32::from_bits((rng.next_u64() as u32 & 0x807F_FFFF) | 1))
            .collect(),
    ));
    rows.push((
        "ints -8..7",
        (0..n).map(|_| rng.below(16) as f32 - 8.0).collect(),
    ));
    rows.push((
        "half ints",
        (0..n)
            .map(|_| (rng.below(33) as f32 - 16.0) / 2.0)
            .collect(),
    ));
    rows.push((
        "f16 midpoints",
        (0..n)
            .map(|_| {
                // An even mantissa and exponent: the next f16 up (in magnitude) is finite.
                let h = half::f16::from_bits(rng.f16_bits() & 0xFBFE);
                let next = half::f16::from_bits(h.to_bits() + 1);
                ((h.to_f64() + next.to_f64()) / 2.0) as f32
            })
            .collect(),
    ));
    rows.push((
        "bf16 midpoints",
        (0..n)
            .map(|_| f32::from_bits((rng.normal().to_bits() & 0xFFFF_0000) | 0x8000))
            .collect(),
    ));
    rows
}

/// Fresh random rows of `n`: normal at a random magnitude, uniform, and per-16 scales.
fn random_rows(n: usize, count: usize, rng: &mut Rng) -> Vec<(&'static str, Vec<f32>)> {
    (0..count)
        .map(|i| match i % 3 {
            0 => {
                let s = 10f32.powf(rng.unit() * 6.0 - 3.0);
                ("random normal", (0..n).map(|_| rng.normal() * s).collect())
            }
            1 => (
                "random uniform",
                (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect(),
            ),
            _ => {
                let mut s = 1.0;
                let v = (0..n)
                    .map(|j| {
                        if j % 16 == 0 {
                            s = 10f32.powf(rng.unit() * 4.0 - 2.0);
                        }
                        rng.normal() * s
                    })
                    .collect();
                ("random per-16 scales", v)
            }
        })
        .collect()
}

/// A Python oracle with `quantize TYPE N IN OUT` and `dequantize TYPE IN OUT` modes.
#[derive(Clone, Copy)]
struct Oracle {
    name: &'static str,
    script: &'static str,
}

const GGUF_PY: Oracle = Oracle {
    name: "gguf-py",
    script: "gguf_py.py",
};
const GGML: Oracle = Oracle {
    name: "ggml",
    script: "ggml_quant.py",
};

/// Fresh random and adversarial rows quantized by smelt and by `oracle`: same bytes.
fn quantize_like(oracle: Oracle, ty: GgmlType) {
    const N: usize = 512;
    let seed = common::fresh_seed(&format!("{} quantize {}", oracle.name, ty.name()));
    let mut rng = Rng::new(seed);
    let mut rows = adversarial_rows(N, &mut rng);
    // Signed zeros only for ggml: gguf-py's numpy min/max and sign handling pick +0.0
    // where ggml keeps -0.0 (Q4_0/Q5_0 all -0.0 blocks: d; Q4_1/Q5_1 mixed zeros: m), and
    // ggml is the reference.
    if oracle.script == GGML.script {
        rows.push(("all -0.0", vec![-0.0; N]));
        rows.push((
            "-0.0 and 0.0",
            (0..N)
                .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
                .collect(),
        ));
    }
    rows.extend(random_rows(N, 48, &mut rng));
    let scratch = Scratch::new(&format!("{}-quant-{}", oracle.name, ty.name()));
    let (src, dst) = (scratch.path("in.f32"), scratch.path("out.bin"));
    let flat: Vec<f32> = rows.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    std::fs::write(&src, f32_bytes(&flat)).unwrap();
    let args = ["quantize", &py_name(ty), &N.to_string(), &src, &dst];
    let (code, text) = run_oracle(oracle.script, &args);
    assert_eq!(
        code,
        Some(0),
        "{} quantize {} failed:\n{text}",
        oracle.script,
        ty.name()
    );
    let want = std::fs::read(&dst).unwrap();
    let row_bytes = N / ty.block_size() * ty.type_size();
    assert_eq!(
        want.len(),
        rows.len() * row_bytes,
        "{} wrote the wrong size",
        oracle.name
    );

    let mut report = Report::new(format!("{} (seed {seed})", ty.name()));
    let stage = &format!("quantize_row == {}", oracle.name);
    report.stage(stage);
    let (size, weights) = (ty.type_size(), ty.block_size());
    for (i, ((case, row), want)) in rows.iter().zip(want.chunks(row_bytes)).enumerate() {
        let mut got = vec![0u8; row_bytes];
        match catch(|| quantize_row(ty, row, &mut got)) {
            Err(p) => {
                report.fail(stage, || p);
                break;
            }
            Ok(Err(e)) => report.fail(stage, || format!("row {i} ({case}): error {e}")),
            Ok(Ok(())) => {
                if let Some(off) = got.iter().zip(want).position(|(a, b)| a != b) {
                    let b = off / size;
                    report.fail(stage, || {
                        format!(
                            "row {i} ({case}): block {b} differs at byte {off} ({} of the block)\n  {:7}: {}\n  smelt  : {}\n  input  : {}",
                            off % size,
                            oracle.name,
                            hex(&want[b * size..(b + 1) * size]),
                            hex(&got[b * size..(b + 1) * size]),
                            floats(&row[b * weights..(b + 1) * weights])
                        )
                    });
                }
            }
        }
    }
    report.finish();
}

/// Fresh random valid blocks dequantized by smelt and by `oracle`: same bits.
fn dequantize_like(oracle: Oracle, ty: GgmlType) {
    let seed = common::fresh_seed(&format!("{} dequantize {}", oracle.name, ty.name()));
    let mut rng = Rng::new(seed);
    let blocks = if ty.block_size() == 256 { 64 } else { 512 };
    let raw = random_valid_blocks(ty, blocks, &mut rng);
    let scratch = Scratch::new(&format!("{}-dequant-{}", oracle.name, ty.name()));
    let (src, dst) = (scratch.path("in.bin"), scratch.path("out.f32"));
    std::fs::write(&src, &raw).unwrap();
    let (code, text) = run_oracle(oracle.script, &["dequantize", &py_name(ty), &src, &dst]);
    assert_eq!(
        code,
        Some(0),
        "{} dequantize {} failed:\n{text}",
        oracle.script,
        ty.name()
    );
    let want = common::bytes_f32(&std::fs::read(&dst).unwrap());
    let n = blocks * ty.block_size();
    assert_eq!(want.len(), n, "{} wrote the wrong size", oracle.name);

    let mut report = Report::new(format!("{} (seed {seed})", ty.name()));
    let stage = &format!("dequantize_row(random valid blocks) == {}", oracle.name);
    report.stage(stage);
    let mut got = vec![f32::NAN; n];
    match catch(|| dequantize_row(ty, &raw, &mut got)) {
        Err(p) => report.fail(stage, || p),
        Ok(Err(e)) => report.fail(stage, || format!("error {e}")),
        Ok(Ok(())) => {
            let (size, weights) = (ty.type_size(), ty.block_size());
            for (b, (w, g)) in want.chunks(weights).zip(got.chunks(weights)).enumerate() {
                if w.iter().zip(g).any(|(a, c)| a.to_bits() != c.to_bits()) {
                    report.fail(stage, || {
                        format!(
                            "block {b}: {}\n  {:7}: {}\n  smelt  : {}",
                            hex(&raw[b * size..(b + 1) * size]),
                            oracle.name,
                            floats(w),
                            floats(g)
                        )
                    });
                }
            }
        }
    }
    report.finish();
}

fn ggml_vec_dot(ty: GgmlType) {
    let seed = common::fresh_seed(&format!("ggml vec_dot {}", ty.name()));
    let mut rng = Rng::new(seed);
    let mut report = Report::new(format!("{} (seed {seed})", ty.name()));
    let stage = "vec_dot within tolerance of ggml-cpu's vec_dot";
    report.stage(stage);
    let all = match cases(ty, &mut rng) {
        Ok(c) => c,
        Err(e) => {
            report.fail(stage, || format!("cannot build inputs: {e}"));
            return report.finish();
        }
    };
    let act = act_type(ty).unwrap();
    let scratch = Scratch::new(&format!("ggml-dot-{}", ty.name()));
    let mut worst = 0f64;
    let mut lengths: Vec<usize> = all.iter().map(|c| c.n).collect();
    lengths.dedup();
    for n in lengths {
        let group: Vec<_> = all.iter().filter(|c| c.n == n).collect();
        let (xs, ys, out) = (
            scratch.path("x.bin"),
            scratch.path("y.bin"),
            scratch.path("out.f32"),
        );
        std::fs::write(
            &xs,
            group
                .iter()
                .flat_map(|c| c.x.iter().copied())
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        std::fs::write(
            &ys,
            group
                .iter()
                .flat_map(|c| c.y.iter().copied())
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        let (code, text) = run_oracle(
            "ggml_dot.py",
            &[&py_name(ty), &n.to_string(), &xs, &ys, &out],
        );
        assert_eq!(code, Some(0), "ggml_dot.py {} failed:\n{text}", ty.name());
        let ggml_act = text
            .lines()
            .find_map(|l| l.strip_prefix("vec_dot_type "))
            .unwrap_or("?");
        if ggml_act != py_name(act) {
            report.fail(stage, || {
                format!(
                    "smelt pairs {} with {}, ggml with {ggml_act}",
                    ty.name(),
                    act.name()
                )
            });
        }
        let ggml = common::bytes_f32(&std::fs::read(&out).unwrap());
        for (case, &theirs) in group.iter().zip(&ggml) {
            let ours = match catch(|| vec_dot(ty, n, &case.x, &case.y)) {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    report.fail(stage, || format!("{}: error {e}", case.label));
                    continue;
                }
                Err(p) => {
                    report.fail(stage, || format!("{}: vec_dot {p}", case.label));
                    return report.finish();
                }
            };
            match reference(ty, case) {
                Err(e) => report.fail(stage, || format!("{}: {e}", case.label)),
                Ok((exact, tol)) => {
                    // Both approximate `exact` within `tol`, each in its own order.
                    let diff = (ours as f64 - theirs as f64).abs();
                    worst = worst.max(diff / (2.0 * tol));
                    if diff.is_nan() || diff > 2.0 * tol {
                        report.fail(stage, || {
                            format!(
                                "{}: smelt {ours:e}, ggml {theirs:e}, exact {exact:e}: |smelt - ggml| {diff:e} > {:e}",
                                case.label,
                                2.0 * tol
                            )
                        });
                    }
                }
            }
        }
    }
    eprintln!(
        "{}: largest |smelt - ggml| / tolerance = {worst:.3e}",
        ty.name()
    );
    report.finish();
}

macro_rules! live_tests {
    ($f:ident($oracle:expr): $($name:ident => $ty:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $f($oracle, GgmlType::$ty);
            }
        )*
    };
    ($f:ident: $($name:ident => $ty:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $f(GgmlType::$ty);
            }
        )*
    };
}

// gguf-py quantizes only these (its numpy K-quant code dequantizes only).
live_tests! { quantize_like(GGUF_PY):
    gguf_py_quantize_f16 => F16,
    gguf_py_quantize_bf16 => BF16,
    gguf_py_quantize_q4_0 => Q4_0,
    gguf_py_quantize_q4_1 => Q4_1,
    gguf_py_quantize_q5_0 => Q5_0,
    gguf_py_quantize_q5_1 => Q5_1,
    gguf_py_quantize_q8_0 => Q8_0,
}

// gguf-py has no Q8_1 or Q8_K (activation-only formats); the committed ggml references
// cover their dequantization.
live_tests! { dequantize_like(GGUF_PY):
    gguf_py_dequantize_f32 => F32,
    gguf_py_dequantize_f16 => F16,
    gguf_py_dequantize_bf16 => BF16,
    gguf_py_dequantize_q4_0 => Q4_0,
    gguf_py_dequantize_q4_1 => Q4_1,
    gguf_py_dequantize_q5_0 => Q5_0,
    gguf_py_dequantize_q5_1 => Q5_1,
    gguf_py_dequantize_q8_0 => Q8_0,
    gguf_py_dequantize_q2_k => Q2_K,
    gguf_py_dequantize_q3_k => Q3_K,
    gguf_py_dequantize_q4_k => Q4_K,
    gguf_py_dequantize_q5_k => Q5_K,
    gguf_py_dequantize_q6_k => Q6_K,
    gguf_py_dequantize_iq4_nl => IQ4_NL,
    gguf_py_dequantize_iq4_xs => IQ4_XS,
}

// ggml itself on fresh data, for every type (the committed references are fixed data).
live_tests! { quantize_like(GGML):
    ggml_quantize_f32 => F32,
    ggml_quantize_f16 => F16,
    ggml_quantize_bf16 => BF16,
    ggml_quantize_q4_0 => Q4_0,
    ggml_quantize_q4_1 => Q4_1,
    ggml_quantize_q5_0 => Q5_0,
    ggml_quantize_q5_1 => Q5_1,
    ggml_quantize_q8_0 => Q8_0,
    ggml_quantize_q8_1 => Q8_1,
    ggml_quantize_q2_k => Q2_K,
    ggml_quantize_q3_k => Q3_K,
    ggml_quantize_q4_k => Q4_K,
    ggml_quantize_q5_k => Q5_K,
    ggml_quantize_q6_k => Q6_K,
    ggml_quantize_q8_k => Q8_K,
}

live_tests! { dequantize_like(GGML):
    ggml_dequantize_f32 => F32,
    ggml_dequantize_f16 => F16,
    ggml_dequantize_bf16 => BF16,
    ggml_dequantize_q4_0 => Q4_0,
    ggml_dequantize_q4_1 => Q4_1,
    ggml_dequantize_q5_0 => Q5_0,
    ggml_dequantize_q5_1 => Q5_1,
    ggml_dequantize_q8_0 => Q8_0,
    ggml_dequantize_q8_1 => Q8_1,
    ggml_dequantize_q2_k => Q2_K,
    ggml_dequantize_q3_k => Q3_K,
    ggml_dequantize_q4_k => Q4_K,
    ggml_dequantize_q5_k => Q5_K,
    ggml_dequantize_q6_k => Q6_K,
    ggml_dequantize_q8_k => Q8_K,
    ggml_dequantize_iq4_nl => IQ4_NL,
    ggml_dequantize_iq4_xs => IQ4_XS,
}

// ggml-cpu has no vec_dot for Q8_1 and Q8_K (activation-only formats): `dot.rs` checks
// smelt's against the exact dot only.
live_tests! { ggml_vec_dot:
    ggml_vec_dot_f32 => F32,
    ggml_vec_dot_f16 => F16,
    ggml_vec_dot_bf16 => BF16,
    ggml_vec_dot_q4_0 => Q4_0,
    ggml_vec_dot_q4_1 => Q4_1,
    ggml_vec_dot_q5_0 => Q5_0,
    ggml_vec_dot_q5_1 => Q5_1,
    ggml_vec_dot_q8_0 => Q8_0,
    ggml_vec_dot_q2_k => Q2_K,
    ggml_vec_dot_q3_k => Q3_K,
    ggml_vec_dot_q4_k => Q4_K,
    ggml_vec_dot_q5_k => Q5_K,
    ggml_vec_dot_q6_k => Q6_K,
    ggml_vec_dot_iq4_nl => IQ4_NL,
    ggml_vec_dot_iq4_xs => IQ4_XS,
}

/// A missing oracle must fail loudly, never skip: point `SMELT_PYTHON` at nothing and the
/// helper refuses with the fix in its message.
#[test]
fn missing_python_fails_with_the_fix() {
    if std::env::var_os("SMELT_ORACLE_PROBE").is_some() {
        common::python();
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "missing_python_fails_with_the_fix",
            "--nocapture",
        ])
        .env("SMELT_ORACLE_PROBE", "1")
        .env("SMELT_PYTHON", "/nonexistent/python")
        .output()
        .expect("re-running the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "a missing python did not fail:\n{text}"
    );
    assert!(
        text.contains("run scripts/oracles.sh"),
        "the failure does not say how to fix it:\n{text}"
    );
}
