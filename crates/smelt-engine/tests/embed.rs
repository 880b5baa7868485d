//! `Engine::embed` against llama.cpp's own embeddings (llama-cpp-python 0.3.36 in embedding
//! mode) on both real models, for each pooling llama.cpp offers a decoder model: mean, first
//! token and last token, L2-normalized. Inputs are also fed in small steps that split one
//! input and pack several into one step, so chunking and packing are checked too.

mod common;

use smelt_engine::embed::normalize;
use smelt_engine::{Engine, EngineOptions, Pooling};

const TEXTS: [&str; 3] = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun.",
    "<|im_start|>system is text here",
];

struct Oracle {
    tokens: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn oracle(model: &str, pooling: Pooling) -> Oracle {
    let m = common::model(model);
    let mut args = vec![m.to_str().expect("UTF-8 path"), pooling.name()];
    args.extend(TEXTS);
    let out = common::recorded("llamacpp_embed.py", &args, smelt_oracle::Keep::Small);
    let v: serde_json::Value =
        serde_json::from_str(out.stdout.lines().last().unwrap_or("")).expect("one JSON line");
    let list = |key: &str| -> Vec<Vec<f64>> {
        v[key]
            .as_array()
            .expect("array")
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("number"))
                    .collect()
            })
            .collect()
    };
    Oracle {
        tokens: list("tokens")
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as u32).collect())
            .collect(),
        embeddings: list("embeddings")
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as f32).collect())
            .collect(),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// `Engine::embed`, normalized, with every sequence freed after.
fn embed(engine: &mut Engine, inputs: &[Vec<u32>], pooling: Pooling, step: usize) -> Vec<Vec<f32>> {
    let mut out = engine.embed(inputs, pooling, step).expect("embed");
    assert_eq!(
        engine.free_blocks(),
        engine.total_blocks(),
        "sequences freed"
    );
    out.iter_mut().for_each(|v| normalize(v));
    out
}

/// Cosine similarity and the largest difference of one element.
fn compare(a: &[f32], b: &[f32]) -> (f64, f32) {
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    (cosine(a, b), worst)
}

fn check(model: &str) {
    let opts = EngineOptions {
        threads: Some(2),
        kv_tokens: 1024,
        ..EngineOptions::default()
    };
    let mut engine = Engine::load(&common::model(model), &opts).expect("model loads");
    for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        let want = oracle(model, pooling);
        // Each input in one step, as llama.cpp runs it: the same bits up to rounding.
        let whole = embed(&mut engine, &want.tokens, pooling, 512);
        for (i, (g, w)) in whole.iter().zip(&want.embeddings).enumerate() {
            let (cos, worst) = compare(g, w);
            eprintln!("{model} {pooling:?} input {i}: cosine {cos:.8}, worst |diff| {worst:.2e}");
            assert_eq!(g.len(), w.len(), "{model} {pooling:?} input {i}: width");
            assert!(
                cos > 0.999_999 && worst < 1e-4,
                "{model} {pooling:?} input {i}: cosine {cos}, worst |diff| {worst}"
            );
        }
        // 7-token steps split the long inputs and pack the short ones together. Steps of
        // fewer than 8 rows take other matmul kernels, in ggml as here (llama.cpp's own
        // answers depend on its batch size too): Gemma's last-token row moves by up to
        // cosine 0.9987 that way, so the bar is looser (SmolLM2 stays within 1e-7).
        let chunked = embed(&mut engine, &want.tokens, pooling, 7);
        for (i, (g, w)) in chunked.iter().zip(&want.embeddings).enumerate() {
            let (cos, worst) = compare(g, w);
            eprintln!(
                "{model} {pooling:?} input {i}, 7-token steps: cosine {cos:.8}, worst {worst:.2e}"
            );
            assert!(
                cos > 0.995,
                "{model} {pooling:?} input {i} in 7-token steps: cosine {cos}"
            );
        }
        // Packed into one step with the others or alone: the same embedding, up to the last
        // bits that the step's row count moves in some matmul kernels.
        let alone = embed(&mut engine, &want.tokens[1..2], pooling, 64);
        let packed = embed(&mut engine, &want.tokens, pooling, 64);
        let (cos, worst) = compare(&alone[0], &packed[1]);
        assert!(
            worst < 1e-6,
            "{model} {pooling:?}: alone vs packed: {cos}, {worst}"
        );
    }
    assert!(
        engine.embed(&[vec![]], Pooling::Mean, 8).is_err(),
        "empty input refused"
    );
    assert_eq!(
        engine.free_blocks(),
        engine.total_blocks(),
        "sequences freed"
    );
}

#[test]
fn smollm2_embeddings_match_llama_cpp() {
    check(common::SMOLLM2);
}

#[test]
fn gemma3_embeddings_match_llama_cpp() {
    check(common::GEMMA3);
}
