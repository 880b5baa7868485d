//! Tokenizer settings no real test model has: the BPE pre-tokenizers (Llama 3, Qwen2,
//! Qwen3.5, GPT-2, "default"...), SentencePiece with a space prefix and EOS (Llama 2, Mistral),
//! Phi-3's right-stripping special tokens. A real model's vocabulary is written into
//! vocabulary-only GGUFs that differ only in those settings, and each must tokenize and
//! detokenize the corpus as llama.cpp does.

mod common;

use common::*;
use serde_json::json;
use smelt_gguf::{Array, Gguf, GgufWriter, Metadata, Value};
use smelt_tokenizer::Tokenizer;

fn check(pre: &str, drop_add_bos: bool, every_code_point: bool) {
    check_with(pre, every_code_point, |meta| {
        meta.insert("tokenizer.ggml.pre", Value::from(pre));
        if drop_add_bos {
            // the pre-tokenizer's own default decides (llama3: add BOS)
            meta.remove("tokenizer.ggml.add_bos_token");
        }
    });
}

/// SmolLM2's metadata changed by `edit`, written as a vocabulary-only GGUF, against llama.cpp.
fn check_with(pre: &str, every_code_point: bool, edit: impl FnOnce(&mut Metadata)) {
    check_model_with(SMOLLM, pre, every_code_point, edit);
}

/// A model's metadata changed by `edit`, written as a vocabulary-only GGUF, against llama.cpp.
fn check_model_with(
    base: &str,
    pre: &str,
    every_code_point: bool,
    edit: impl FnOnce(&mut Metadata),
) {
    check_texts(base, pre, every_code_point, &[], edit);
}

/// [`check_model_with`] over `extra` texts besides the corpus.
fn check_texts(
    base: &str,
    pre: &str,
    every_code_point: bool,
    extra: &[&str],
    edit: impl FnOnce(&mut Metadata),
) {
    let src = Gguf::open(model(base)).expect("open model");
    let mut meta = Metadata::new();
    for (k, v) in src.metadata().iter() {
        meta.insert(k, v.clone());
    }
    edit(&mut meta);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("vocab-{pre}.gguf"));
    GgufWriter::create(&path, &meta, Vec::new())
        .and_then(|w| w.finish())
        .expect("write vocab GGUF");

    let tok = Tokenizer::from_gguf(&meta).expect("tokenizer");
    let mut texts = corpus();
    texts.extend(extra.iter().map(|t| t.to_string()));
    if every_code_point {
        texts.extend(codepoint_texts());
    }
    // how much this pre-tokenizer changes the ids from SmolLM2's own, to show the test bites
    let own = Tokenizer::from_gguf(src.metadata()).expect("unchanged tokenizer");
    let differ = texts
        .iter()
        .filter(|t| tok.encode(t, true, true) != own.encode(t, true, true))
        .count();
    eprintln!(
        "{pre}: {differ} of {} corpus strings tokenize differently from the unchanged model",
        texts.len()
    );
    let answer = oracle(&json!({ "model": path, "texts": texts }));
    let failures = oracle_mismatches(&tok, &texts, &answer);
    assert!(
        failures.is_empty(),
        "pre-tokenizer {pre}: {} mismatches with llama.cpp:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn llama3() {
    check("llama-bpe", true, true);
}

#[test]
fn qwen2() {
    check("qwen2", false, true);
}

/// Qwen3.5/3.6's pre-tokenizer keeps combining marks (`\p{M}`) in letter runs: over the
/// corpus, every code point in mark-revealing contexts, and [`MARK_TEXTS`].
#[test]
fn qwen35() {
    check_texts(SMOLLM, "qwen35", true, MARK_TEXTS, |meta| {
        meta.insert("tokenizer.ggml.pre", Value::from("qwen35"));
    });
}

#[test]
fn default() {
    check("default", false, true);
}

#[test]
fn gpt2() {
    check("gpt-2", false, false);
}

#[test]
fn starcoder() {
    check("starcoder", false, false);
}

#[test]
fn falcon() {
    check("falcon", false, false);
}

#[test]
fn stablelm2() {
    check("stablelm2", false, false);
}

/// llama.cpp gives Phi-3 models (by `general.name`) right-stripping special tokens: the
/// whitespace after `<|im_end|>` and friends is swallowed.
#[test]
fn phi3_special_tokens_strip_the_whitespace_after_them() {
    check_with("phi-3 rstrip", false, |meta| {
        meta.insert("general.name", Value::from("Phi-3 mini (test)"));
        // llama.cpp looks these up by text on Phi-3 and fails without them
        let Some(Value::Array(Array::String(tokens))) = meta.get("tokenizer.ggml.tokens").cloned()
        else {
            panic!("SmolLM2 token list");
        };
        let mut tokens = tokens;
        let n = tokens.len();
        for (i, t) in ["</s>", "<unk>", "<s>"].into_iter().enumerate() {
            tokens[n - 1 - i] = t.to_string();
        }
        meta.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    });
}

/// SentencePiece as Llama 2 and Mistral GGUFs use it: a space prefixed to the text (and after
/// every special token), EOS appended; Gemma 3's vocabulary with those settings.
#[test]
fn spm_with_space_prefix_and_eos() {
    check_model_with(GEMMA, "spm space prefix", false, |meta| {
        meta.remove("tokenizer.ggml.add_space_prefix"); // SPM's default: true
        meta.insert("tokenizer.ggml.add_eos_token", Value::Bool(true));
        meta.insert("tokenizer.ggml.add_bos_token", Value::Bool(false));
    });
}

#[test]
fn more_pre_tokenizers() {
    // deepseek-coder and bloom also run llama.cpp's wide-character regex path (no categories)
    for pre in [
        "deepseek-coder",
        "deepseek-v3",
        "tekken",
        "gpt-4o",
        "bloom",
        "viking",
        "bailingmoe",
        "seed-coder",
    ] {
        // the category-heaviest one also over every BMP code point (llama.cpp's std::regex
        // makes this slow, so only one)
        let every_code_point = pre == "deepseek-v3";
        check(pre, false, every_code_point);
    }
}
