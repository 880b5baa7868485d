//! smelt's forward pass against llama.cpp itself (llama-cpp-python 0.3.36) on the two real
//! models: the same prompt token ids (from llama.cpp's tokenizer, so these tests do not
//! depend on ours), last-position logits equal bit for bit, and greedy generation token
//! for token.

mod common;

use smelt_engine::{argmax, Engine, EngineOptions, Logits, SeqInput};

const N_GEN: usize = 32;

struct Case {
    text: String,
    ids: Vec<u32>,
    greedy: Vec<u32>,
    gaps: Vec<f32>,
    /// llama.cpp's last prompt position's logits (the bytes, or their recorded digest).
    logits: smelt_oracle::Output,
}

fn reference(model: &std::path::Path) -> Vec<Case> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let answer = common::recorded(
        "llama_ref.py",
        &[model.to_str().unwrap(), out, &N_GEN.to_string()],
        smelt_oracle::Keep::Only(&["ref.json"]),
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ref.json")).unwrap()).unwrap();
    let nums = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logits = answer.file(&format!("logits_{i}.f32")).clone();
            Case {
                text: c["text"].as_str().unwrap().to_owned(),
                ids: nums(&c["ids"]).into_iter().map(|x| x as u32).collect(),
                greedy: nums(&c["greedy"]).into_iter().map(|x| x as u32).collect(),
                gaps: nums(&c["gaps"]).into_iter().map(|x| x as f32).collect(),
                logits,
            }
        })
        .collect()
}

fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    idx.truncate(k);
    idx
}

/// Greedy tokens from `first` on, feeding back `feed(step, our_choice)`.
fn decode(
    engine: &mut Engine,
    seq: smelt_engine::SeqId,
    first: u32,
    mut feed: impl FnMut(usize, u32) -> u32,
) -> Vec<u32> {
    let mut picks = vec![first];
    for step in 0..N_GEN - 1 {
        let tok = feed(step, picks[step]);
        let out = engine
            .forward(&[SeqInput {
                seq,
                tokens: vec![tok],
                logits: Logits::Last,
            }])
            .unwrap();
        picks.push(argmax(&out[0][0]));
    }
    picks
}

/// The CPU backend computes every op in ggml's order (see `backend::cpu::ggml_dot` and
/// `ggml_math`), so the prompt's logits must equal llama.cpp's bit for bit and every greedy
/// choice must be llama.cpp's: no tolerance, no floating-point ties to excuse.
fn check_model(file: &str) {
    let path = common::model(file);
    let cases = reference(&path);
    let opts = EngineOptions {
        threads: Some(2),
        kv_tokens: 4096,
        block_size: 16,
        ..EngineOptions::default()
    };
    let mut engine = Engine::load(&path, &opts).unwrap();
    let (mut worst, mut full_equal, mut forced_equal) = (0f32, 0, 0);
    let mut failures = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let prompt = |e: &mut Engine| {
            let seq = e.new_sequence();
            let out = e
                .forward(&[SeqInput {
                    seq,
                    tokens: c.ids.clone(),
                    logits: Logits::Last,
                }])
                .unwrap();
            (seq, out[0][0].clone())
        };
        let (seq, logits) = prompt(&mut engine);
        let ours_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bits_equal = c.logits.matches(&ours_bytes);
        // Without llama.cpp's values (a replayed digest) the diagnostics follow from equality.
        let (max_abs, agree) = match c.logits.f32s() {
            Some(theirs) => {
                assert_eq!(logits.len(), theirs.len());
                let max_abs = logits
                    .iter()
                    .zip(&theirs)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let (ours5, theirs5) = (top_k(&logits, 5), top_k(&theirs, 5));
                (
                    max_abs,
                    ours5.iter().filter(|t| theirs5.contains(t)).count(),
                )
            }
            None if bits_equal => (0.0, 5),
            None => (f32::NAN, 0),
        };
        worst = worst.max(max_abs);

        // Free running: our own choices fed back, as `smelt run` would generate.
        let free = decode(&mut engine, seq, argmax(&logits), |_, ours| ours);
        engine.free_sequence(seq);
        // Teacher forced: llama.cpp's tokens fed back, so one tie does not derail the rest;
        // every step where we choose differently must be a near-tie on llama.cpp's side.
        let (seq, logits) = prompt(&mut engine);
        let forced = decode(&mut engine, seq, argmax(&logits), |step, _| c.greedy[step]);
        engine.free_sequence(seq);

        let diverge = free.iter().zip(&c.greedy).position(|(a, b)| a != b);
        let misses: Vec<usize> = (0..N_GEN).filter(|&i| forced[i] != c.greedy[i]).collect();
        full_equal += usize::from(diverge.is_none());
        forced_equal += usize::from(misses.is_empty());
        eprintln!(
            "{file} case {ci:2} ({:2} prompt tokens): max|dlogit| {max_abs:.3}, top-5 {agree}/5, free-running {}, teacher-forced misses {:?} (gaps {:?})",
            c.ids.len(),
            match diverge {
                None => format!("equal for {N_GEN}"),
                Some(s) => format!("equal for {s}, then a tie (llama.cpp gap {:.3})", c.gaps[s]),
            },
            misses,
            misses.iter().map(|&i| (c.gaps[i] * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        );
        if !bits_equal || agree < 5 || !misses.is_empty() {
            failures.push(format!(
                "case {ci} {:?}: prompt logits bit-equal {bits_equal} (max |d| {max_abs}), teacher-forced misses {misses:?}",
                c.text
            ));
        }
        if let Some(s) = diverge {
            failures.push(format!(
                "case {ci}: free-running diverges at step {s}, llama.cpp gap {}",
                c.gaps[s]
            ));
        }
    }
    eprintln!(
        "{file}: worst max|dlogit| {worst:.3}; {full_equal}/{} prompts equal for {N_GEN} free-running tokens, {forced_equal}/{} with no teacher-forced miss",
        cases.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{file}: {failures:#?}");
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model(common::SMOLLM2);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model(common::GEMMA3);
}
