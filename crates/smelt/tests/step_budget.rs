//! Prompts fed in steps of at most `--ubatch` tokens give the tokens one step gives (so a
//! long prompt can be cut to bound activation memory without changing the answer), and the
//! KV-sizing flags refuse what makes no sense with a clear message, never a panic.

mod common;

use common::{model, smelt, smelt_ok, SMOLLM};

/// `smelt run --json` on the CPU: the generated token ids.
fn run_tokens(m: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "run",
        "--model",
        m,
        "--device",
        "cpu",
        "--threads",
        "2",
        "--raw",
        "--prompt",
        "The old lighthouse keeper climbed the stairs every evening to light the lamp, and",
        "--max-tokens",
        "6",
        "--json",
    ];
    args.extend(extra);
    let out = smelt_ok(&args);
    let last = out.lines().last().expect("a JSON line");
    let j: serde_json::Value = serde_json::from_str(last).expect("JSON");
    j["tokens"].as_array().expect("tokens").clone()
}

#[test]
fn a_prompt_cut_into_small_steps_gives_the_same_tokens() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    let whole = run_tokens(m, &[]);
    assert_eq!(whole.len(), 6);
    // About 18 prompt tokens in steps of 4 (and of 1: one token a step).
    assert_eq!(run_tokens(m, &["--ubatch", "4"]), whole);
    assert_eq!(run_tokens(m, &["--ubatch", "1"]), whole);
}

#[test]
fn bad_step_budgets_and_memory_fractions_are_refused() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    let cases: [(&[&str], &str); 5] = [
        (&["run", "--prompt", "hi", "--ubatch", "0"], "--ubatch"),
        (
            &["run", "--prompt", "hi", "--gpu-memory", "1.5"],
            "fraction",
        ),
        (&["bench", "--gpu-memory", "0"], "fraction"),
        (&["bench", "--gpu-memory", "lots"], "not a number"),
        (&["serve", "--gpu-memory=-1"], "fraction"),
    ];
    for (args, want) in cases {
        let mut all = args.to_vec();
        all.extend(["--model", m, "--device", "cpu"]);
        let out = smelt(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{all:?} succeeded");
        assert!(!stderr.contains("panicked"), "{all:?} panicked: {stderr}");
        assert!(stderr.contains(want), "{all:?}: {stderr}");
    }
}

#[test]
fn the_cpu_ignores_gpu_memory_and_bench_reports_its_kv_cache() {
    let m = model(SMOLLM);
    let out = smelt_ok(&[
        "bench",
        "--model",
        m.to_str().expect("UTF-8 path"),
        "--device",
        "cpu",
        "--threads",
        "2",
        "--prompt",
        "20",
        "--gen",
        "4",
        "--batch",
        "2",
        "--reps",
        "1",
        "--gpu-memory",
        "0.5",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    // Two sequences of 20 + 4 tokens, each rounded up to 32 (blocks of 16): exactly that.
    assert_eq!(j["kv_tokens"], 64, "{j}");
}

#[test]
fn serve_logs_how_many_tokens_its_kv_cache_holds() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let m = model(SMOLLM);
    let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(["serve", "--port", "0", "--threads", "2", "--device", "cpu"])
        .args(["--ctx", "256", "--kv-tokens", "320", "--model"])
        .arg(&m)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smelt serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut seen = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let up = line.contains("listening on");
        seen.push(line);
        if up {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    assert!(log.contains("listening on"), "serve never listened:\n{log}");
    // 320 tokens on the CPU: exactly --kv-tokens (20 blocks of 16; at least --ctx), said
    // before listening.
    assert!(
        log.contains("the KV cache holds 320 tokens"),
        "no KV line:\n{log}"
    );
}
