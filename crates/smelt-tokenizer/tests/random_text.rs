//! Seeded random strings over an alphabet of the characters tokenizers trip on (spaces, tabs,
//! newlines, digits, apostrophes, punctuation, accents, CJK, emoji, pieces of special tokens),
//! and every code point of the Basic Multilingual Plane (plus samples of the others) in letter/digit/space
//! contexts: ids and detokenized text must equal llama.cpp's on both models.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use smelt_gguf::Gguf;
use smelt_tokenizer::Tokenizer;

const ATOMS: &[&str] = &[
    " ",
    " ",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\u{a0}",
    "\u{3000}",
    "a",
    "b",
    "e",
    "z",
    "A",
    "Q",
    "the",
    " the",
    "ing",
    "Hello",
    "world",
    "0",
    "1",
    "7",
    "42",
    "123",
    "'",
    "'s",
    "'S",
    "'re",
    "'ll",
    "n't",
    ".",
    ",",
    "!",
    "?",
    "...",
    "-",
    "_",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "/",
    "\\",
    "|",
    "$",
    "+",
    "=",
    "^",
    "~",
    "`",
    "\"",
    "#",
    "@",
    "%",
    "&",
    "*",
    "é",
    "ñ",
    "ü",
    "ß",
    "e\u{301}",
    "\u{300}",
    "中",
    "文",
    "字",
    "、",
    "。",
    "日本",
    "ー",
    "한",
    "가",
    "я",
    "ж",
    "ω",
    "α",
    "ب",
    "ש",
    "क",
    "्",
    "ก",
    "😀",
    "👍🏽",
    "🇯🇵",
    "‍",
    "\u{200b}",
    "\u{fe0f}",
    "½",
    "٣",
    "Ⅻ",
    "▁",
    "Ġ",
    "<",
    "|",
    "im",
    "_start",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "</s>",
    "<0x0A>",
    "<unused1>",
    "<|endoftext|>",
    "\u{0}",
    "\u{1b}",
    "\u{7f}",
    "\u{ffff}",
    "\u{10ffff}",
];

fn random_texts(seed: u64, n: usize) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.gen_range(0..40);
            (0..len)
                .map(|_| ATOMS[rng.gen_range(0..ATOMS.len())])
                .collect()
        })
        .collect()
}

fn check(name: &str, texts: &[String]) {
    let gguf = Gguf::open(model(name)).expect("open model");
    let tok = Tokenizer::from_gguf(gguf.metadata()).expect("tokenizer");
    let answer = oracle(&json!({ "model": model(name), "texts": texts }));
    let failures = oracle_mismatches(&tok, texts, &answer);
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches with llama.cpp:\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn smollm_random_strings_match_llama_cpp() {
    check(SMOLLM, &random_texts(1, 400));
}

#[test]
fn gemma_random_strings_match_llama_cpp() {
    check(GEMMA, &random_texts(2, 400));
}

#[test]
fn smollm_every_bmp_code_point_matches_llama_cpp() {
    check(SMOLLM, &codepoint_texts());
}

#[test]
fn gemma_every_bmp_code_point_matches_llama_cpp() {
    check(GEMMA, &codepoint_texts());
}
