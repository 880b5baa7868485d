//! `smelt perplexity` against llama.cpp's method run in llama.cpp itself (llama-cpp-python
//! 0.3.36) on a fixed text: within 1% on both real models.

mod common;

use common::{model, repo_root, smelt, smelt_ok, GEMMA, SMOLLM};

/// 256-token windows: the ~4.5 KB text gives three of them on both models.
const CTX: &str = "256";

fn text() -> std::path::PathBuf {
    repo_root().join("crates/smelt/tests/data/perplexity.txt")
}

fn smelt_ppl(name: &str) -> f64 {
    let m = model(name);
    let out = smelt_ok(&[
        "perplexity",
        "--model",
        m.to_str().expect("UTF-8 path"),
        "--file",
        text().to_str().expect("UTF-8 path"),
        "--ctx",
        CTX,
        "--threads",
        "2",
    ]);
    let last = out.lines().last().unwrap_or("");
    last.strip_prefix("perplexity: ")
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("last line is `perplexity: X`: {out:?}"))
}

fn llama_ppl(name: &str) -> f64 {
    let script = repo_root().join("scripts/oracle/llamacpp_perplexity.py");
    let (m, t) = (model(name), text());
    let out = smelt_oracle::run_recorded(
        &script,
        &[
            m.to_str().expect("UTF-8 path"),
            t.to_str().expect("UTF-8 path"),
            CTX,
        ],
        smelt_oracle::Keep::Small,
    );
    let stdout = &out.stdout;
    assert!(
        out.success(),
        "llamacpp_perplexity.py failed:\n{stdout}\n{}",
        out.stderr
    );
    let v: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one JSON line");
    v["ppl"].as_f64().expect("ppl")
}

fn within_one_percent(name: &str) {
    let (s, l) = (smelt_ppl(name), llama_ppl(name));
    let rel = (s - l).abs() / l;
    eprintln!(
        "{name}: smelt {s:.4}, llama.cpp {l:.4} ({:.3}% apart)",
        rel * 100.0
    );
    assert!(
        rel < 0.01,
        "{name}: smelt {s} vs llama.cpp {l}: {:.3}% apart",
        rel * 100.0
    );
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    within_one_percent(SMOLLM);
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    within_one_percent(GEMMA);
}

#[test]
fn a_text_shorter_than_two_windows_is_refused() {
    let m = model(SMOLLM);
    let out = smelt(&[
        "perplexity",
        "--model",
        m.to_str().expect("UTF-8 path"),
        "--file",
        text().to_str().expect("UTF-8 path"),
        "--ctx",
        "4096",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 2 x --ctx"), "{err}");
}
