//! Dot products: every type's `vec_dot` against activations quantized by smelt is close to
//! the exact dot of the dequantized rows, and the portable path gives the same bits as the
//! AVX2 one. (`oracle_live.rs` compares with ggml-cpu's own `vec_dot`.)

mod common;

use common::dot_cases::{cases, reference};
use common::{catch, hex, Report, Rng};
use smelt_quant::{vec_dot, GgmlType};

/// Fixed so a failure replays; `oracle_live.rs` adds fresh seeds through ggml.
const SEED: u64 = 0x05EE_DD07;

fn dot_is_close(ty: GgmlType) {
    let mut report = Report::new(ty.name());
    let stage = "vec_dot within tolerance of the exact dot of the dequantized rows";
    report.stage(stage);
    let mut rng = Rng::new(SEED ^ ty.id() as u64);
    let mut worst = 0f64;
    match cases(ty, &mut rng) {
        Err(e) => report.fail(stage, || format!("cannot build inputs: {e}")),
        Ok(cases) => {
            for case in &cases {
                let got = match catch(|| vec_dot(ty, case.n, &case.x, &case.y)) {
                    Ok(Ok(v)) => v,
                    Ok(Err(e)) => {
                        report.fail(stage, || format!("{}: error {e}", case.label));
                        continue;
                    }
                    Err(p) => {
                        report.fail(stage, || format!("{}: vec_dot {p}", case.label));
                        break;
                    }
                };
                match reference(ty, case) {
                    Err(e) => report.fail(stage, || format!("{}: {e}", case.label)),
                    Ok((exact, tol)) => {
                        let err = (got as f64 - exact).abs();
                        worst = worst.max(err / tol);
                        if err.is_nan() || err > tol {
                            report.fail(stage, || {
                                format!("{}: smelt {got:e}, exact {exact:e}, |diff| {err:e} > tolerance {tol:e}", case.label)
                            });
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{}: largest |vec_dot - exact| / tolerance = {worst:.3e}",
        ty.name()
    );
    report.finish();
}

macro_rules! dot_tests {
    ($($name:ident => $ty:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                dot_is_close(GgmlType::$ty);
            }
        )*
    };
}

dot_tests! {
    f32 => F32,
    f16 => F16,
    bf16 => BF16,
    q4_0 => Q4_0,
    q4_1 => Q4_1,
    q5_0 => Q5_0,
    q5_1 => Q5_1,
    q8_0 => Q8_0,
    q8_1 => Q8_1,
    q2_k => Q2_K,
    q3_k => Q3_K,
    q4_k => Q4_K,
    q5_k => Q5_K,
    q6_k => Q6_K,
    q8_k => Q8_K,
    iq4_nl => IQ4_NL,
    iq4_xs => IQ4_XS,
}

/// Everything whose speed path the process chose at start-up, one line per case:
/// `TYPE | label | field value | field value ...` with the quantized weights and
/// activations, the weights dequantized, and the dot product's bits.
fn simd_sensitive_outputs(seed: u64) -> Vec<String> {
    let mut lines = Vec::new();
    for ty in common::DEQUANTIZABLE {
        let mut rng = Rng::new(seed ^ ty.id() as u64);
        let cases = match cases(ty, &mut rng) {
            Ok(c) => c,
            Err(e) => {
                lines.push(format!("{} | inputs | error {e}", ty.name()));
                continue;
            }
        };
        for case in cases {
            let dot = match catch(|| vec_dot(ty, case.n, &case.x, &case.y)) {
                Ok(Ok(v)) => format!("{:08x}", v.to_bits()),
                Ok(Err(e)) => format!("error {e}"),
                Err(p) => p,
            };
            let deq = match common::dot_cases::dequantize(ty, &case.x, case.n) {
                Ok(v) => hex(&common::f32_bytes(&v)),
                Err(e) => e,
            };
            lines.push(format!(
                "{} | {} | weights {} | activations {} | dequantized {deq} | dot {dot}",
                ty.name(),
                case.label,
                hex(&case.x),
                hex(&case.y),
            ));
        }
    }
    lines
}

/// The fields two output lines disagree on, dots shown in full (the rest are long hex).
fn differing_fields(avx2: &str, portable: &str) -> String {
    let fields = avx2.split(" | ").zip(portable.split(" | ")).skip(2);
    let diffs: Vec<String> = fields
        .filter(|(a, b)| a != b)
        .map(
            |(a, b)| match (a.strip_prefix("dot "), b.strip_prefix("dot ")) {
                (Some(a), Some(b)) => format!("dot {a} (AVX2) vs {b} (portable)"),
                _ => format!("{} differ", a.split(' ').next().unwrap_or("?")),
            },
        )
        .collect();
    diffs.join(", ")
}

/// The child half of [`portable_path_is_bit_identical`]: writes its outputs where the
/// parent asks, and does nothing in a normal run.
#[test]
fn dump_outputs_for_portable_check() {
    let Some(path) = std::env::var_os("SMELT_DOT_DUMP") else {
        return;
    };
    let seed: u64 = std::env::var("SMELT_DOT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    std::fs::write(path, simd_sensitive_outputs(seed).join("\n")).expect("writing the dump");
}

/// Quantization, dequantization and dot products give the same bits with
/// `SMELT_NO_SIMD=1` (a child process: the path is chosen once per process) as here.
#[test]
fn portable_path_is_bit_identical() {
    if std::env::var_os("SMELT_DOT_DUMP").is_some() {
        return;
    }
    if !smelt_quant::simd::has_avx2() {
        eprintln!("note: this process runs the portable path already (no AVX2 or SMELT_NO_SIMD set); comparing portable with portable");
    }
    let seed = common::fresh_seed("portable_path_is_bit_identical");
    let scratch = common::Scratch::new("portable");
    let dump = scratch.path("portable.txt");
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "dump_outputs_for_portable_check",
            "--test-threads",
            "1",
        ])
        .env("SMELT_NO_SIMD", "1")
        .env("SMELT_DOT_DUMP", &dump)
        .env("SMELT_DOT_SEED", seed.to_string())
        .output()
        .expect("re-running the test binary");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let portable = std::fs::read_to_string(&dump).expect("child wrote no dump");
    let ours = simd_sensitive_outputs(seed);
    let mut report = Report::new("portable vs AVX2");
    for ty in common::DEQUANTIZABLE {
        report.stage(ty.name());
    }
    let theirs: Vec<&str> = portable.lines().collect();
    assert_eq!(
        theirs.len(),
        ours.len(),
        "the child produced a different number of cases"
    );
    for (a, b) in ours.iter().zip(theirs) {
        if a != b {
            let mut head = a.split(" | ");
            let (ty, label) = (head.next().unwrap_or("?"), head.next().unwrap_or("?"));
            report.fail(ty, || format!("{label}: {}", differing_fields(a, b)));
        }
    }
    report.finish();
}
