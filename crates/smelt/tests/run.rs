//! `smelt run` against llama.cpp (llama-cpp-python 0.3.36): on both real models, greedy
//! generation from the same prompt ids is token-for-token llama.cpp's, raw and
//! chat-templated, and llama.cpp's own tokenization of each prompt gives smelt's ids.

mod common;

use common::{model, repo_root, smelt, smelt_ok, GEMMA, SMOLLM};
use serde_json::{json, Value};
use std::path::Path;

const N_TOKENS: usize = 32;

/// Varied prompts: prose, code, arithmetic, lists, other languages, unicode, markup.
const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What is 17 multiplied by 23?\nA:",
    "List three primary colors:\n1.",
    "Translate to French: I would like a cup of coffee, please.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Explain photosynthesis to a ten-year-old.",
    "In 1969, Apollo 11",
    "Ünïcödé   and emoji 🎉: what are they?",
    "<html>\n  <body>\n    <h1>",
    "Write a haiku about autumn leaves.",
];

/// smelt's results for every prompt, one JSON object each.
fn smelt_batch(model: &Path, chat: bool) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = PROMPTS.iter().map(|p| json!(p).to_string()).collect();
    std::fs::write(&file, lines.join("\n")).expect("write prompts");
    let n = N_TOKENS.to_string();
    let mut args = vec![
        "run",
        "--model",
        model.to_str().expect("UTF-8 path"),
        "--prompts-file",
        file.to_str().expect("UTF-8 path"),
        "--max-tokens",
        &n,
        "--threads",
        "2",
        "--json",
    ];
    // Raw prompts get no template (plain completion is not the default for a model with one).
    args.push(if chat { "--chat" } else { "--raw" });
    let out = smelt_ok(&args);
    let v: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("smelt run --prompts-file prints JSON lines"))
        .collect();
    assert_eq!(v.len(), PROMPTS.len(), "one result per prompt:\n{out}");
    v
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|t| t.as_u64().expect("an id"))
        .collect()
}

/// llama.cpp on smelt's prompt ids, one process for all cases.
fn llama(model: &Path, cases: &[Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cases.json");
    std::fs::write(&file, Value::Array(cases.to_vec()).to_string()).expect("write cases");
    let script = repo_root().join("scripts/oracle/llamacpp_generate.py");
    let out = smelt_oracle::run_recorded(
        &script,
        &[
            model.to_str().expect("UTF-8 path"),
            file.to_str().expect("UTF-8 path"),
        ],
        smelt_oracle::Keep::Small,
    );
    let stdout = &out.stdout;
    assert!(
        out.success(),
        "llamacpp_generate.py failed on {}:\n{stdout}\n{}",
        model.display(),
        out.stderr
    );
    let v: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("llamacpp_generate.py prints JSON lines"))
        .collect();
    assert_eq!(v.len(), cases.len());
    v
}

fn matches_llama_cpp(name: &str) {
    let path = model(name);
    let mut results = smelt_batch(&path, false);
    results.extend(smelt_batch(&path, true));
    let cases: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({
                "text": r["prompt_text"],
                "special": i >= PROMPTS.len(),
                "ids": r["prompt_tokens"],
                "n": N_TOKENS,
                "smelt": r["tokens"],
            })
        })
        .collect();
    let refs = llama(&path, &cases);
    let mut failures = Vec::new();
    for (i, (s, l)) in results.iter().zip(&refs).enumerate() {
        let mode = if i < PROMPTS.len() { "raw" } else { "chat" };
        let prompt = PROMPTS[i % PROMPTS.len()];
        let (s_prompt, l_prompt) = (ids(&s["prompt_tokens"]), ids(&l["tokenized"]));
        if s_prompt != l_prompt {
            failures.push(format!(
                "{mode} {prompt:?}: tokenization differs\n  smelt     {s_prompt:?}\n  llama.cpp {l_prompt:?}"
            ));
        }
        let (s_toks, l_toks) = (ids(&s["tokens"]), ids(&l["tokens"]));
        if s_toks == l_toks {
            continue;
        }
        let d = &l["divergence"];
        if d.is_null() {
            // Same tokens as far as both went, but one stopped early.
            failures.push(format!(
                "{mode} {prompt:?}: lengths differ\n  smelt     {s_toks:?}\n  llama.cpp {l_toks:?}"
            ));
            continue;
        }
        let gap = d["gap"].as_f64().unwrap_or(f64::INFINITY);
        let pos = d["pos"].as_u64().unwrap_or(0) as usize;
        // Where llama.cpp with flash attention (exact in real arithmetic) first disagrees
        // with llama.cpp without it.
        let flash = ids(&l["flash_attn_tokens"]);
        let self_flip = flash.iter().zip(&l_toks).position(|(a, b)| a != b);
        let what = format!(
            "{mode} {prompt:?}: first divergence at token {pos} (llama.cpp {} / smelt {}), \
             llama.cpp logit gap {gap:.6}, llama.cpp itself flips at {}\n  smelt     {s_toks:?}\n  llama.cpp {l_toks:?}\n  llama.cpp+FA {flash:?}",
            d["llama"],
            d["smelt"],
            self_flip.map_or("none".to_string(), |p| format!("token {p} with flash attention")),
        );
        // The CPU engine computes what ggml computes, in ggml's order, so there are no
        // floating-point ties to excuse: any divergence is a bug (the gap and whether
        // llama.cpp flips itself with flash attention are printed to help find it).
        failures.push(what);
    }
    eprintln!(
        "{name}: {} of {} generations equal to llama.cpp for {N_TOKENS} tokens",
        results.len() - failures.len(),
        results.len(),
    );
    assert!(
        failures.is_empty(),
        "{name}: {} of {} generations differ from llama.cpp:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_greedy_equals_llama_cpp() {
    matches_llama_cpp(SMOLLM);
}

#[test]
fn gemma3_greedy_equals_llama_cpp() {
    matches_llama_cpp(GEMMA);
}

fn last_json(out: &str) -> Value {
    let line = out.lines().last().unwrap_or("");
    serde_json::from_str(line).expect("the last line is one JSON object")
}

#[test]
fn stop_strings_end_generation_and_are_not_printed() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    let base = [
        "run",
        "--model",
        m,
        "--raw",
        "--prompt",
        "Count: 1, 2, 3, 4,",
        "--threads",
        "2",
        "--json",
    ];
    let free = last_json(&smelt_ok(&[&base[..], &["--max-tokens", "24"]].concat()));
    let text = free["text"].as_str().expect("text");
    // Stop at the second word-ish piece of what it generates freely.
    let stop = text
        .split_whitespace()
        .nth(1)
        .expect("it generates at least two words");
    let out = smelt_ok(&[&base[..], &["--max-tokens", "24", "--stop", stop]].concat());
    let v = last_json(&out);
    assert_eq!(v["finish_reason"], "stop", "{out}");
    let cut = v["text"].as_str().expect("text");
    assert!(!cut.contains(stop), "{cut:?} contains {stop:?}");
    assert!(text.starts_with(cut), "{cut:?} is not a prefix of {text:?}");
    assert!(
        out.starts_with(cut),
        "streamed text is the JSON text: {out}"
    );
}

#[test]
fn seeded_sampling_is_reproducible() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    let run = |seed: &str| {
        let out = smelt_ok(&[
            "run",
            "--model",
            m,
            "--raw",
            "--prompt",
            "My favourite animal is",
            "--max-tokens",
            "16",
            "--temperature",
            "0.9",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--min-p",
            "0.05",
            "--repeat-penalty",
            "1.1",
            "--seed",
            seed,
            "--threads",
            "2",
            "--json",
        ]);
        ids(&last_json(&out)["tokens"])
    };
    let a = run("7");
    assert_eq!(a, run("7"));
    assert_eq!(a.len(), 16);
    let others: Vec<_> = ["8", "9", "10"].iter().map(|s| run(s)).collect();
    assert!(
        others.iter().any(|o| *o != a),
        "different seeds draw differently"
    );
}

#[test]
fn max_tokens_and_finish_reason() {
    let m = model(GEMMA);
    let out = smelt_ok(&[
        "run",
        "--model",
        m.to_str().expect("UTF-8 path"),
        "--raw",
        "--prompt",
        "Hello",
        "--max-tokens",
        "5",
        "--threads",
        "2",
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(ids(&v["tokens"]).len(), 5);
    assert_eq!(v["finish_reason"], "length");
    assert!(
        v["timings"]["decode_tokens_per_s"]
            .as_f64()
            .expect("a rate")
            > 0.0
    );
}

/// `--batch-invariant` is accepted on the CPU, which is batch-invariant already: the same
/// tokens with it as without (on a GPU it changes the kernels; bench/gpu/peer.sh checks
/// there that a sequence's tokens are the same alone, among 8 and among 64).
#[test]
fn batch_invariant_is_accepted_and_changes_nothing_on_the_cpu() {
    let m = model(SMOLLM);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            m.to_str().expect("UTF-8 path"),
            "--raw",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
            "--threads",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        ids(&last_json(&smelt_ok(&args))["tokens"])
    };
    let plain = run(&[]);
    assert_eq!(plain.len(), 8);
    assert_eq!(run(&["--batch-invariant"]), plain);
}

#[test]
fn bad_devices_and_models_are_clear_errors() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    // A GPU ordinal no machine has: without a driver (CI) the error names the missing driver,
    // with one (the GPU machines) the missing device; either way the flag, never a panic.
    let out = smelt(&["run", "--model", m, "--prompt", "x", "--device", "cuda:99"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device cuda:99")
            && (err.contains("no CUDA driver") || err.contains("no CUDA device 99"))
            && !err.contains("panick"),
        "{err}"
    );
    let out = smelt(&["run", "--model", "no-such-model", "--prompt", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("known alias"), "{err}");
}

#[test]
fn aliases_resolve_to_the_fetched_models() {
    // The models are fetched already (model() checks), so the alias needs no download.
    model(SMOLLM);
    let out = smelt_ok(&[
        "run",
        "--model",
        "smollm2-135m",
        "--prompt",
        "Hi",
        "--max-tokens",
        "2",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(ids(&last_json(&out)["tokens"]).len(), 2);
}
