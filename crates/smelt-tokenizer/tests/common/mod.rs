//! Shared plumbing for the tests that compare with llama.cpp: the oracle's Python, the real
//! models, and one JSON request/answer exchange with `tests/oracle.py`.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use smelt_tokenizer::Tokenizer;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The oracle's Python, shared by every crate's tests (`smelt_oracle::python`).
pub fn python() -> PathBuf {
    smelt_oracle::python()
}

pub const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn model(name: &str) -> PathBuf {
    let path = root().join(".models").join(name);
    assert!(
        path.exists(),
        "test model {} is missing (run scripts/fetch-models.sh all)",
        path.display()
    );
    path
}

/// Sends one request to `tests/oracle.py` and returns its answer.
pub fn oracle(request: &Value) -> Value {
    oracle_script("oracle.py", request)
}

/// Sends one JSON request to the Python script `tests/{name}` and returns its JSON answer.
pub fn oracle_script(name: &str, request: &Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    let mut child = Command::new(python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the oracle python");
    let body = serde_json::to_vec(request).expect("serialize request");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&body)
        .expect("write request");
    let out = child.wait_with_output().expect("run oracle");
    assert!(
        out.status.success(),
        "oracle failed ({}): {}\n(run scripts/oracles.sh if llama_cpp is missing)",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("oracle answer is JSON")
}

/// Text in scripts written with combining marks (Devanagari, Thai, Khmer, Arabic harakat,
/// decomposed Latin and Vietnamese), and marks after digits, spaces, punctuation, newlines and
/// apostrophes: where Qwen3.5's pre-tokenizer (marks inside letter runs) differs from Qwen2's.
pub const MARK_TEXTS: &[&str] = &[
    "नमस्ते दुनिया, क्या हाल है?",
    "สวัสดีครับ ภาษาไทย",
    "\u{1780}\u{17b6}\u{1793}\u{17cb}\u{178f}\u{17c2}\u{1796}\u{17b7}\u{179f}\u{17c1}\u{179f}\u{17a2}\u{17b6}\u{1785}\u{1f601} ?",
    "مَرْحَبًا بِكُمْ",
    "Tie\u{302}\u{301}ng Vie\u{323}\u{302}t cafe\u{301} nai\u{308}ve",
    "1\u{301}2\u{300} \u{301}x !\u{301}? .\u{308}\u{308}a",
    "\n\u{301}\r\n\u{300}a\t\u{302} \u{302}\u{303}  \u{301}",
    "it'\u{301}s '\u{301}S \u{301}'ll don\u{301}'t",
    "\u{20dd}\u{20e3}1\u{fe0f}\u{20e3} #\u{fe0f}\u{20e3}",
    "a\u{300}\u{301}\u{302}\u{303}\u{304}\u{305}\u{306}\u{307}b",
];

pub fn corpus() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read corpus"))
        .expect("corpus is JSON")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("hex string");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Shortens long test strings in failure messages.
pub fn show(s: &str) -> String {
    let mut t: String = s.chars().take(80).collect();
    if t.len() < s.len() {
        t += &format!("… ({} bytes)", s.len());
    }
    format!("{t:?}")
}

/// Every BMP code point (surrogates excluded), and samples of the other planes (emoji, math
/// letters, CJK extensions including Unicode 15.1's Extension I), in a few contexts that decide
/// how pre-tokenizers classify a character: after a letter, after a digit, after a space,
/// doubled.
pub fn codepoint_texts() -> Vec<String> {
    let ranges = [
        0x80..0x10000,
        0x10400..0x10450,
        0x1D400..0x1D500,
        0x1E900..0x1E960,
        0x1F300..0x1F700,
        0x1FA70..0x1FB00,
        0x20000..0x20020,
        0x2EBE0..0x2EC10,
        0x2EE50..0x2EE70,
        0xE0000..0xE0080,
    ];
    let chars: Vec<char> = ranges
        .into_iter()
        .flatten()
        .filter_map(char::from_u32)
        .collect();
    chars
        .chunks(64)
        .map(|chunk| {
            chunk
                .iter()
                .map(|c| format!("a{c}1{c} {c}{c}'{c}\n"))
                .collect()
        })
        .collect()
}

/// Where two id lists first differ, with a few ids of context (whole lists can be huge).
pub fn diff(want: &[u32], got: &[u32]) -> String {
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let lo = at.saturating_sub(4);
    format!(
        "first difference at {at} of {}/{}:\n  llama.cpp ..{:?}..\n  smelt     ..{:?}..",
        want.len(),
        got.len(),
        &want[lo..(at + 8).min(want.len())],
        &got[lo..(at + 8).min(got.len())]
    )
}

/// Everything where `tok` disagrees with the oracle's `answer` for `texts`: the ids under each
/// add_special/parse_special pair, and the text of the ids with both on under each
/// remove_special/unparse_special pair.
pub fn oracle_mismatches(tok: &Tokenizer, texts: &[String], answer: &Value) -> Vec<String> {
    let flags = |a: bool, b: bool| format!("{}{}", u8::from(a), u8::from(b));
    let mut failures = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        for add in [false, true] {
            for parse in [false, true] {
                let want = ids(&answer["encode"][i][flags(add, parse)]);
                let got = tok.encode(text, add, parse);
                if got != want {
                    failures.push(format!(
                        "encode({}, add_special={add}, parse_special={parse}): {}",
                        show(text),
                        diff(&want, &got)
                    ));
                }
            }
        }
        let ids_tt = ids(&answer["encode"][i]["11"]);
        for rs in [false, true] {
            for us in [false, true] {
                let want = hex(&answer["detok"][i][flags(rs, us)]);
                let got = tok.detokenize(&ids_tt, rs, us);
                if got != want {
                    failures.push(format!(
                        "detokenize({}, remove_special={rs}, unparse_special={us}):\n  llama.cpp {:?}\n  smelt     {:?}",
                        show(text),
                        String::from_utf8_lossy(&want),
                        String::from_utf8_lossy(&got)
                    ));
                }
            }
        }
    }
    failures
}
