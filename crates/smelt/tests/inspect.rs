//! `smelt inspect` on the real test models and on files that are not GGUF.

mod common;
use common::*;

#[test]
fn inspect_gemma_text_and_json() {
    let path = model(GEMMA);
    let text = smelt_ok(&["inspect", path.to_str().expect("path")]);
    assert!(text.contains("GGUF v3, alignment 32"), "{text}");
    assert!(text.contains("metadata (33 keys)"));
    assert!(text.contains("tensors (236)"));
    assert!(text.contains("268,098,176"), "parameter total");
    // The 262,144-token vocabulary is summarised, not printed.
    assert!(text.contains("262144 items"));
    assert!(text.lines().count() < 400, "{} lines", text.lines().count());
    assert!(text.contains("token_embd.weight") && text.contains("[640, 262144]"));

    let j = inspect_json(&path);
    assert_eq!(j["version"], 3);
    assert_eq!(j["alignment"], 32);
    assert_eq!(j["metadata"]["general.architecture"], "gemma3");
    assert_eq!(j["metadata"]["gemma3.block_count"], 18);
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["len"], 262144);
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["first"][0], "<pad>");
    assert_eq!(j["totals"]["tensors"], 236);
    assert_eq!(j["totals"]["parameters"], 268_098_176u64);
    assert_eq!(j["totals"]["by_type"]["q6_K"]["tensors"], 9);
    assert_eq!(j["totals"]["by_type"]["q4_K"]["tensors"], 27);
    let bytes: u64 = j["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| t["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(j["totals"]["bytes"], bytes);
    let types = tensor_types(&j);
    assert_eq!(
        types["blk.0.attn_q.weight"],
        ("q5_0".to_string(), vec![640, 1024])
    );
    assert_eq!(types.len(), 236);
}

/// `inspect` takes the model as every command does: an alias, as MODEL or `-m`, or nothing
/// (the default model).
#[test]
fn inspect_takes_aliases_and_the_default_model() {
    model(SMOLLM);
    let want = smelt_ok(&["inspect", "smollm2-135m", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&want).expect("JSON");
    assert_eq!(j["totals"]["tensors"], 272);
    assert_eq!(smelt_ok(&["inspect", "-m", "smollm2-135m", "--json"]), want);
    assert_eq!(
        smelt_ok(&["inspect", "--model", "smollm2-135m", "--json"]),
        want
    );
    assert_eq!(smelt_ok(&["inspect", "--json"]), want);
}

#[test]
fn inspect_smollm_json() {
    let j = inspect_json(&model(SMOLLM));
    assert_eq!(j["metadata"]["general.architecture"], "llama");
    assert_eq!(j["metadata"]["llama.block_count"], 30);
    assert_eq!(j["totals"]["tensors"], 272);
    assert_eq!(j["metadata"]["tokenizer.ggml.merges"]["len"], 48900);
    assert_eq!(j["totals"]["by_type"]["q4_1"]["tensors"], 210);
    let types = tensor_types(&j);
    assert_eq!(
        types["token_embd.weight"],
        ("q8_0".to_string(), vec![576, 49152])
    );
}

fn assert_clean_failure(args: &[&str], want: &str) {
    let out = smelt(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(want), "{err}");
}

#[test]
fn bad_files_fail_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all, just text").expect("write");
    assert_clean_failure(
        &["inspect", garbage.to_str().expect("path")],
        "garbage.gguf",
    );

    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(model(SMOLLM)).expect("read model");
    std::fs::write(&truncated, &bytes[..100_000]).expect("write");
    assert_clean_failure(
        &["inspect", truncated.to_str().expect("path")],
        "truncated.gguf",
    );

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert_clean_failure(
        &["inspect", "--json", empty.to_str().expect("path")],
        "empty.gguf",
    );

    assert_clean_failure(&["inspect", "/nonexistent/model.gguf"], "model.gguf");
}
