//! `gpu_ops`: every GPU op against its CPU twin, in one command on the GPU machine (in the
//! spirit of llama.cpp's `test-backend-ops`). Each op is a registered [`Case`]: its name,
//! the kernels it covers, a table of shapes (ragged ones: odd rows/columns/lengths, one
//! token, sizes that are not multiples of the block sizes, sequences crossing KV blocks),
//! a CPU twin, a GPU run into poisoned outputs (NaN / 0xFF, so an unwritten element
//! fails), a tolerance rule and an error metric.
//!
//! ```text
//! gpu_ops [check|perf|list] [-o OP[,OP..]] [-s SHAPE[,SHAPE..]] [--seed N]
//! ```
//! - `check` (default): one line a case (`op  shape  error  PASS|FAIL`), a summary table
//!   per op last, exit status 1 on any failure;
//! - `perf`: each op's timings at real model shapes (time per launch, GB/s or TOPS);
//! - `list`: the registry and how many catalog kernels each op covers, `list --kernels`
//!   each kernel with its ops (no GPU needed);
//! - `-o`: ops whose names contain one of the words (`-o gemv,rope`); `-s`: cases whose
//!   shape label contains one of the words (`-s 7x1000`).
//!
//! The module holds only the kernels of the selected ops (the whole catalog's JIT takes
//! over half a minute). `tests/gpu_ops_registry.rs` checks on the CPU that every kernel of
//! the catalog is covered by some op here, so a new kernel without a case fails CI.
//! `bench/gpu/ops.sh` builds, packs and runs it on the GPU machine.

#![allow(clippy::too_many_arguments)]

#[macro_use]
pub mod harness;
pub mod attention;
pub mod delta;
pub mod gemm;
pub mod gemm_f16;
pub mod gemm_narrow;
pub mod gemv;
pub mod gemv_fused;
pub mod isq;
pub mod moe;
pub mod moe_fused;
pub mod ops;
pub mod rows;
pub mod timing;
pub mod tiny;

use std::time::Instant;

use anyhow::{bail, Result};
use harness::{Gpu, Report};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// A check or a timing of one op: writes its cases into the report.
pub type RunFn = fn(&Gpu, &mut StdRng, &mut Report) -> Result<()>;

/// One registered op.
pub struct Case {
    /// What `-o` matches and the summary rows start with.
    pub op: &'static str,
    /// The catalog kernels this op checks (`*` matches any run of characters): every
    /// kernel of `catalog::all()` must be covered by some op.
    pub covers: &'static [&'static str],
    /// Other kernels it launches (inputs made by kernels checked elsewhere).
    pub needs: &'static [&'static str],
    pub check: RunFn,
    pub perf: Option<RunFn>,
    /// Runs only when `-o` names it (a slow or build-variant check).
    pub explicit: bool,
    /// Runs through the engine's CUDA backend, which loads its own module: the harness's
    /// module need not hold its kernels.
    pub via_engine: bool,
}

/// Catalog kernels no single-GPU case can run, and where they are checked instead.
pub const ELSEWHERE: &[(&str, &str)] = &[(
    "allreduce_*",
    "needs 2+ GPUs: bench/gpu/tp.sh (tp_check) checks the all-reduce against NCCL's sums",
)];

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

impl Case {
    pub fn covers(&self, kernel: &str) -> bool {
        self.covers.iter().any(|p| glob(p, kernel))
    }

    fn loads(&self, kernel: &str) -> bool {
        !self.via_engine && self.covers(kernel) || self.needs.iter().any(|p| glob(p, kernel))
    }
}

/// Every op, in the order a check run takes them.
pub fn registry() -> Vec<Case> {
    fn case(op: &'static str, covers: &'static [&'static str], check: RunFn) -> Case {
        Case {
            op,
            covers,
            needs: &[],
            check,
            perf: None,
            explicit: false,
            via_engine: false,
        }
    }
    vec![
        Case {
            ..case("quantize_q8_1", &["quantize_q8_1"], gemv::check_quantize)
        },
        Case {
            needs: &["quantize_q8_1"],
            perf: Some(gemv::perf),
            ..case("gemv", gemv::PLAIN, gemv::check)
        },
        Case {
            needs: &[
                "quantize_q8_1",
                "gemv_q4_k_t1*",
                "gemv_q6_k_t1*",
                "gemv_q8_0_t1*",
            ],
            explicit: true,
            perf: Some(gemv::tune),
            ..case("gemv_tune", &[], gemv::check_tune)
        },
        Case {
            needs: &["quantize_q8_1"],
            ..case(
                "gemv_resnorm",
                gemv_fused::SPLIT_NORM,
                gemv_fused::check_split_norm,
            )
        },
        Case {
            needs: &["quantize_q8_1", "gemv_*", "rope_kv_rows_normal"],
            ..case(
                "gemv_rope_kv",
                gemv_fused::ROPE_KV,
                gemv_fused::check_rope_gemv,
            )
        },
        Case {
            needs: &["quantize_q8_1", "gemv_*_t8"],
            perf: Some(gemm::perf),
            ..case("gemm", gemm::COVERS, gemm::check)
        },
        Case {
            needs: &["gemm_*", "quantize_*"],
            explicit: true,
            ..case("gemm_variants", &[], gemm::check_variants)
        },
        Case {
            needs: &["quantize_q8_1", "quantize_q8_tile", "gemm_*", "glu_*_f16"],
            perf: Some(gemm_f16::perf),
            ..case("gemm_f16", gemm_f16::COVERS, gemm_f16::check)
        },
        case("norm", ops::NORM, ops::check_norms),
        case("rope", ops::ROPE, ops::check_rope),
        Case {
            needs: &["rope_*", "kv_append"],
            ..case("rope_kv_rows", ops::ROPE_KV_ROWS, ops::check_rope_kv_rows)
        },
        case("glu_q8", ops::GLU_Q8, ops::check_glu_q8),
        case("norm_q8", ops::NORM_Q8, ops::check_norm_q8),
        case("attention_reduce_q8", ops::REDUCE_Q8, ops::check_reduce_q8),
        case("elementwise", ops::ELEMENTWISE, ops::check_elementwise),
        case("embed", ops::EMBED, ops::check_embed),
        Case {
            // perf: the attention at 8B decode shape, and the small ops of a decode step.
            needs: &[
                "rms_norm",
                "add_rms_norm",
                "rope_normal",
                "glu_silu",
                "softmax_rows",
                "argmax_rows",
                "sample_rows",
            ],
            perf: Some(rows::perf),
            ..case(
                "attention",
                attention::DECODE,
                attention::check_kv_attention,
            )
        },
        Case {
            needs: &["attention_*", "kv_append"],
            perf: Some(attention::perf_prefill),
            ..case(
                "attention_prompt",
                attention::PROMPT,
                attention::check_prefill,
            )
        },
        case("argmax_softmax", rows::ROWS, rows::check_rows),
        case("sample", rows::SAMPLE, rows::check_sample),
        Case {
            perf: Some(delta::perf),
            ..case("delta", delta::COVERS, delta::check)
        },
        Case {
            perf: Some(isq::perf),
            ..case("isq_quantize", isq::QUANTIZE, isq::check)
        },
        Case {
            perf: Some(isq::perf_repack),
            ..case("repack", isq::REPACK, isq::check_repack)
        },
        Case {
            perf: Some(moe::perf),
            via_engine: true,
            ..case("moe", moe::COVERS, moe::check)
        },
        case("moefuse", moe_fused::COVERS, moe_fused::check),
    ]
}

struct Args {
    mode: String,
    ops: Vec<String>,
    shapes: Vec<String>,
    seed: u64,
}

fn args() -> Result<Args> {
    let mut a = Args {
        mode: "check".into(),
        ops: Vec::new(),
        shapes: Vec::new(),
        seed: rand::random(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let list = |v: Option<String>| -> Result<Vec<String>> {
            let v = v.ok_or_else(|| anyhow::anyhow!("{x} needs a value"))?;
            Ok(v.split(',').map(str::to_string).collect())
        };
        match x.as_str() {
            "check" | "perf" | "list" => a.mode = x.clone(),
            "--kernels" => {}
            "-o" => a.ops.extend(list(it.next())?),
            "-s" => a.shapes.extend(list(it.next())?),
            "--seed" => {
                a.seed = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| anyhow::anyhow!("--seed needs a number"))?
            }
            _ => bail!("unknown argument {x}: gpu_ops [check|perf|list] [-o OP,..] [-s SHAPE,..] [--seed N]"),
        }
    }
    Ok(a)
}

/// The ops `-o` selects: for each word, the op of exactly that name, else the ops whose
/// names contain it (never an explicit op, which runs only by its exact name); all but the
/// explicit ones when it names none.
pub fn selected(all: Vec<Case>, ops: &[String]) -> Vec<Case> {
    let exact = |o: &String| all.iter().any(|c| c.op == o);
    let picks = |c: &Case| {
        if ops.is_empty() {
            return !c.explicit;
        }
        ops.iter().any(|o| {
            if exact(o) {
                c.op == o
            } else {
                !c.explicit && c.op.contains(o.as_str())
            }
        })
    };
    let keep: Vec<bool> = all.iter().map(picks).collect();
    all.into_iter()
        .zip(keep)
        .filter_map(|(c, k)| k.then_some(c))
        .collect()
}

fn list() {
    let names: Vec<String> = smelt_kernels::catalog::all()
        .into_iter()
        .map(|e| e.0)
        .collect();
    for c in registry() {
        let n = names.iter().filter(|k| c.covers(k)).count();
        println!(
            "{:18} {:4} kernels  perf {:3}  {}{}",
            c.op,
            n,
            if c.perf.is_some() { "yes" } else { "-" },
            c.covers.join(" "),
            if c.explicit { "  (only with -o)" } else { "" }
        );
    }
    let cases = registry();
    for (p, why) in ELSEWHERE {
        let n = names.iter().filter(|k| glob(p, k)).count();
        println!("{p:18} {n:4} kernels  not here: {why}");
    }
    let orphans: Vec<&String> = names
        .iter()
        .filter(|k| !cases.iter().any(|c| c.covers(k)))
        .filter(|k| !ELSEWHERE.iter().any(|(p, _)| glob(p, k)))
        .collect();
    if std::env::args().any(|a| a == "--kernels") {
        for k in &names {
            let ops: Vec<&str> = cases.iter().filter(|c| c.covers(k)).map(|c| c.op).collect();
            println!("{k:40} {}", ops.join(" "));
        }
    }
    println!(
        "{} catalog kernels, {} without an op: {orphans:?}",
        names.len(),
        orphans.len()
    );
}

fn main() -> Result<()> {
    let a = args()?;
    if a.mode == "list" {
        list();
        return Ok(());
    }
    let cases = selected(registry(), &a.ops);
    if cases.is_empty() {
        bail!("-o {:?} selects no op (see `gpu_ops list`)", a.ops);
    }
    harness::SHAPES.set(a.shapes.clone()).expect("set once");
    let start = Instant::now();
    // Every op selected (no -o): the whole catalog, cached for the engine's backend too.
    let all = a.ops.is_empty();
    let gpu = Gpu::new(&|k| cases.iter().any(|c| c.loads(k)), all)?;
    println!(
        "mode {}, seed {}, ops: {}",
        a.mode,
        a.seed,
        cases.iter().map(|c| c.op).collect::<Vec<_>>().join(" ")
    );
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut rep = Report::default();
    let mut times = Vec::new();
    for c in &cases {
        let run = if a.mode == "perf" {
            match c.perf {
                Some(p) => p,
                None => continue,
            }
        } else {
            c.check
        };
        println!("\n== {} ==", c.op);
        let t = Instant::now();
        rep.group = c.op.to_string();
        // A check that errors (a launch refused, say) is a failure of its own; the others
        // still run, so one bad kernel does not hide the rest of the report.
        let before: usize = rep.rows.iter().map(|r| r.cases).sum();
        if let Err(e) = run(&gpu, &mut rng, &mut rep) {
            rep.error(c.op, &e);
        }
        let after: usize = rep.rows.iter().map(|r| r.cases).sum();
        // A check that ran no case (without `-s`) checked nothing: a failure, not a pass.
        if a.mode == "check" && a.shapes.is_empty() && after == before {
            rep.error(c.op, &anyhow::anyhow!("no case ran"));
        }
        times.push((c.op, t.elapsed().as_secs_f64()));
    }
    if a.mode == "perf" {
        println!("\n== perf ==");
        for l in &rep.perf {
            println!("{l}");
        }
    }
    println!("\n== seconds per op ==");
    println!(
        "{}",
        times
            .iter()
            .map(|(o, s)| format!("{o} {s:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "\n== summary ({} mode, seed {}, {:.0} s) ==",
        a.mode,
        a.seed,
        start.elapsed().as_secs_f64()
    );
    // Every row, then a row per registered op (short enough to read last).
    println!("| op | cases | failed | worst error | metric | tolerance | result |");
    println!("|---|---:|---:|---:|---|---|---|");
    for r in &rep.rows {
        println!(
            "| {} | {} | {} | {:.2e} | {} | {} | {} |",
            r.op,
            r.cases,
            r.fails,
            r.worst,
            r.metric,
            r.tol,
            if r.fails == 0 { "PASS" } else { "FAIL" }
        );
    }
    println!();
    println!("| registered op | rows | cases | failed cases | failing rows | seconds | result |");
    println!("|---|---:|---:|---:|---|---:|---|");
    for (op, secs) in &times {
        let rows: Vec<_> = rep.rows.iter().filter(|r| r.group == *op).collect();
        let failing: Vec<&str> = rows
            .iter()
            .filter(|r| r.fails > 0)
            .map(|r| r.op.as_str())
            .collect();
        println!(
            "| {op} | {} | {} | {} | {} | {secs:.1} | {} |",
            rows.len(),
            rows.iter().map(|r| r.cases).sum::<usize>(),
            rows.iter().map(|r| r.fails).sum::<usize>(),
            if failing.is_empty() {
                "-".to_string()
            } else {
                failing.join(", ")
            },
            if failing.is_empty() { "PASS" } else { "FAIL" }
        );
    }
    for r in rep.rows.iter().filter(|r| r.fails > 0) {
        println!("FAIL {}: {}", r.op, r.first_bad.as_deref().unwrap_or("-"));
    }
    let failures = rep.failures();
    let cases_run: usize = rep.rows.iter().map(|r| r.cases).sum();
    println!(
        "gpu_ops: {} ops, {cases_run} cases, {failures} failing ops",
        rep.rows.len()
    );
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
