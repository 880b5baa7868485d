//! A Hugging Face folder's pre-tokenizer is identified as convert_hf_to_gguf.py does it: the
//! hash of the ids its tokenizer.json gives convert's check text. smelt-load computes those ids
//! with smelt-tokenizer's implementation of each candidate, so for Qwen2's and Qwen3.5's split
//! regexes (as their tokenizer.json files write them) smelt must give the ids Hugging Face
//! `tokenizers` gives, on the check text and on text with combining marks, where the two differ.

mod common;

use common::*;
use serde_json::json;
use smelt_gguf::{Array, Metadata, Value};
use smelt_tokenizer::Tokenizer;

/// convert_hf_to_gguf.py's `chktxt` (as smelt-load's `hf::vocab::CHKTXT`).
const CHKTXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\u{1f680} (normal) \u{1f636}\u{200d}\u{1f32b}\u{fe0f} (multiple emojis concatenated) \u{2705} \u{1f999}\u{1f999} 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 \u{1780}\u{17b6}\u{1793}\u{17cb}\u{178f}\u{17c2}\u{1796}\u{17b7}\u{179f}\u{17c1}\u{179f}\u{17a2}\u{17b6}\u{1785}\u{1f601} ?\u{6211}\u{60f3}\u{5728}apple\u{5de5}\u{4f5c}1314151\u{5929}\u{ff5e} ------======= \u{43d}\u{435}\u{449}\u{43e} \u{43d}\u{430} \u{411}\u{44a}\u{43b}\u{433}\u{430}\u{440}\u{441}\u{43a}\u{438} ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// The split regexes of Qwen2's and Qwen3.5's tokenizer.json (llama.cpp quotes them as the
/// originals of its `qwen2` and `qwen35` patterns).
const HF_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const HF_QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|s| s.as_str().expect("string").to_string())
        .collect()
}

#[test]
fn qwen_splits_equal_hugging_face_tokenizers() {
    let mut texts = vec![CHKTXT.to_string()];
    texts.extend(MARK_TEXTS.iter().map(|s| s.to_string()));
    let n_vocab_texts = texts.len();
    texts.extend(corpus());
    let answer = oracle_script(
        "hf_split.py",
        &json!({
            "regexes": { "qwen2": HF_QWEN2, "qwen35": HF_QWEN35 },
            "vocab_from": "qwen35",
            "vocab_texts": texts[..n_vocab_texts],
            "texts": texts,
        }),
    );
    let tokens = strings(&answer["tokens"]);
    let mut meta = Metadata::new();
    meta.insert("tokenizer.ggml.model", Value::from("gpt2"));
    meta.insert(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1; tokens.len()])),
    );
    meta.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    meta.insert(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(strings(&answer["merges"]))),
    );

    let mut got = Vec::new();
    for pre in ["qwen2", "qwen35"] {
        meta.insert("tokenizer.ggml.pre", Value::from(pre));
        let tok = Tokenizer::from_gguf(&meta).expect("tokenizer");
        let mut failures = Vec::new();
        let mut all = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let want = ids(&answer["ids"][pre][i]);
            let ids = tok.encode(text, false, false);
            if ids != want {
                failures.push(format!("{}: {}", show(text), diff(&want, &ids)));
            }
            all.push(ids);
        }
        assert!(
            failures.is_empty(),
            "{pre}: {} mismatches with tokenizers:\n{}",
            failures.len(),
            failures[..failures.len().min(10)].join("\n")
        );
        got.push(all);
    }
    // the vocabulary glues Qwen3.5's words, so a split that differs gives other ids: the check
    // text (its Khmer vowel signs) tells the two patterns apart, as do the mark texts (all but
    // the keycaps, whose enclosing marks both patterns keep together)
    assert_ne!(got[0][0], got[1][0], "the check text");
    let same: Vec<String> = (0..n_vocab_texts)
        .filter(|&i| got[0][i] == got[1][i])
        .map(|i| show(&texts[i]))
        .collect();
    assert!(same.len() <= 1, "qwen2 and qwen35 agree on {same:?}");
}
