//! Token ids, pieces and detokenized text equal llama.cpp's (llama-cpp-python 0.3.36, loaded
//! with `vocab_only`) on both real models, over the committed corpus of tricky strings.

mod common;

use std::time::Instant;

use common::*;
use serde_json::json;
use smelt_gguf::Gguf;
use smelt_tokenizer::{DecodeStream, Tokenizer, VocabKind};

fn load(name: &str) -> (Gguf, Tokenizer) {
    let gguf = Gguf::open(model(name)).expect("open model");
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(gguf.metadata()).expect("tokenizer");
    let took = t0.elapsed();
    eprintln!("{name}: tokenizer built in {took:?}");
    assert!(
        took.as_secs_f64() < 1.0,
        "{name}: building the tokenizer took {took:?}"
    );
    (gguf, tok)
}

/// Every corpus string, every add_special/parse_special combination: same ids; and the
/// detokenized text of the ids with both flags on, for every detokenize setting.
fn encode_and_detokenize_match(name: &str) {
    let (_g, tok) = load(name);
    let texts = corpus();
    let answer = oracle(&json!({ "model": model(name), "texts": texts }));
    let failures = oracle_mismatches(&tok, &texts, &answer);
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches with llama.cpp:\n{}",
        failures.len(),
        failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn smollm_encode_and_detokenize_match_llama_cpp() {
    encode_and_detokenize_match(SMOLLM);
}

#[test]
fn gemma_encode_and_detokenize_match_llama_cpp() {
    encode_and_detokenize_match(GEMMA);
}

/// Every token's piece (special rendering on and off), BOS/EOS and the end-of-generation set.
fn pieces_match(name: &str) {
    let (_g, tok) = load(name);
    let answer = oracle(&json!({ "model": model(name), "pieces": true }));
    let pieces = answer["pieces"].as_array().expect("pieces");
    assert_eq!(pieces.len(), tok.n_vocab(), "{name}: vocabulary size");
    let mut failures = Vec::new();
    for (id, p) in pieces.iter().enumerate() {
        let id = id as u32;
        for (k, special) in [(0, true), (1, false)] {
            let want = hex(&p[k]);
            let got = tok.piece(id, special);
            if got != want {
                failures.push(format!(
                    "token {id} special={special}: llama.cpp {want:?} smelt {got:?}"
                ));
            }
        }
        assert_eq!(tok.token_bytes(id), tok.piece(id, true));
    }
    assert!(
        failures.is_empty(),
        "{name}: {} piece mismatches:\n{}",
        failures.len(),
        failures[..failures.len().min(12)].join("\n")
    );
    assert_eq!(
        tok.bos().map(i64::from),
        answer["bos"].as_i64(),
        "{name}: BOS"
    );
    assert_eq!(
        tok.eos().map(i64::from),
        answer["eos"].as_i64(),
        "{name}: EOS"
    );
    // llama.cpp answers -1 for "none"
    assert_eq!(
        tok.eot().map_or(-1, i64::from),
        answer["eot"].as_i64().expect("eot"),
        "{name}: EOT"
    );
    assert_eq!(
        tok.eog_ids(),
        ids(&answer["eog"]),
        "{name}: end-of-generation tokens"
    );
}

#[test]
fn smollm_pieces_match_llama_cpp() {
    pieces_match(SMOLLM);
}

#[test]
fn gemma_pieces_match_llama_cpp() {
    pieces_match(GEMMA);
}

/// Plain text survives encode -> decode on both models.
#[test]
fn decode_round_trips_the_corpus() {
    for name in [SMOLLM, GEMMA] {
        let (_g, tok) = load(name);
        for text in corpus() {
            // SentencePiece reads a literal U+2581 as a space, in llama.cpp too
            if tok.kind() == VocabKind::Spm && text.contains('\u{2581}') {
                continue;
            }
            let ids = tok.encode(&text, false, false);
            assert_eq!(
                tok.decode(&ids),
                text,
                "{name}: round trip of {}",
                show(&text)
            );
            // piece by piece, as a streaming decoder sees it
            let bytes: Vec<u8> = ids.iter().flat_map(|&i| tok.token_bytes(i)).collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                text,
                "{name}: pieces of {}",
                show(&text)
            );
            // streamed a chunk per token: never a broken character, the same text at the end
            let mut stream = DecodeStream::new(&tok, true);
            let mut streamed = String::new();
            for &id in &ids {
                let chunk = stream.push(id);
                assert!(
                    !chunk.contains('\u{FFFD}'),
                    "{name}: broken chunk {chunk:?}"
                );
                streamed += &chunk;
            }
            streamed += &stream.finish();
            assert_eq!(streamed, text, "{name}: streamed {}", show(&text));
        }
    }
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<smelt_tokenizer::ChatTemplate>();
}
