//! Architectures with no small real model on PyPI (Qwen3-MoE, Mixtral, the Qwen3.5 Gated
//! DeltaNet hybrid), checked against
//! llama.cpp on tiny random models written by gguf-py (`tests/oracle/tiny_arch.py`): the
//! same greedy tokens for 32 steps from prompts of 8, 40 and 100 tokens, the same logits at
//! the end of each prompt, and perplexity over a fixed 160-token sequence within 0.5%.
//!
//! Each type (f32, f16, q8_0) is a file of its own: the expert matmuls take each format's
//! dot product, prompts route many tokens to each expert (the grouped path) and decode one.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use smelt_engine::{Engine, EngineOptions, Logits, SeqInput};
use smelt_gguf::Gguf;

const N_GEN: usize = 32;

fn oracle(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle")
        .join(name)
}

/// Writes the tiny model with gguf-py (its bytes do not depend on the llama.cpp build).
fn write_tiny(arch: &str, ty: &str, out: &Path) {
    let st = Command::new(smelt_oracle::python())
        .arg(oracle("tiny_arch.py"))
        .args([arch, ty, out.to_str().expect("UTF-8 path")])
        .status()
        .expect("run tiny_arch.py");
    assert!(st.success(), "tiny_arch.py {arch} {ty} failed");
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|t| t.as_f64().expect("float") as f32)
        .collect()
}

/// smelt's greedy run of `prompt`: the last prompt row's logits and `N_GEN` tokens.
fn greedy(e: &mut Engine, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let s = e.new_sequence();
    let mut out = e
        .forward(&[SeqInput {
            seq: s,
            tokens: prompt.to_vec(),
            logits: Logits::Last,
        }])
        .expect("prompt");
    let first = out[0][0].clone();
    let mut toks = Vec::new();
    for _ in 0..N_GEN {
        let t = smelt_engine::argmax(&out[0][0]);
        toks.push(t);
        out = e
            .forward(&[SeqInput {
                seq: s,
                tokens: vec![t],
                logits: Logits::Last,
            }])
            .expect("decode");
    }
    e.free_sequence(s);
    (first, toks)
}

fn perplexity(e: &mut Engine, seq: &[u32]) -> f64 {
    let s = e.new_sequence();
    let out = e
        .forward(&[SeqInput {
            seq: s,
            tokens: seq.to_vec(),
            logits: Logits::All,
        }])
        .expect("perplexity batch");
    e.free_sequence(s);
    let mut nll = 0.0;
    for (i, row) in out[0].iter().take(seq.len() - 1).enumerate() {
        let m = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        nll += lse - row[seq[i + 1] as usize] as f64;
    }
    (nll / (seq.len() - 1) as f64).exp()
}

/// Float matmuls do not all follow ggml's order yet (F16: smelt-quant's own dot; F32
/// within a few ulps): close, not equal. Q8_0 (and the F32 router) are ggml's bits.
const MOE_TOLERANCES: [(&str, f32); 3] = [("f32", 1e-4), ("f16", 2e-2), ("q8_0", 0.0)];

/// For every type: llama.cpp's answer, smelt's, and the differences that matter (the
/// largest last-prompt-row logit difference allowed per type).
fn same_as_llama_cpp(arch: &str, want_arch: &str, tolerances: &[(&str, f32)]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for &(ty, tol) in tolerances {
        let file = dir.path().join(format!("tiny-{arch}-{ty}.gguf"));
        write_tiny(arch, ty, &file);
        let answer = smelt_oracle::run_recorded(
            &oracle("tiny_ref.py"),
            &[file.to_str().expect("UTF-8 path"), &N_GEN.to_string()],
            smelt_oracle::Keep::Small,
        );
        assert!(
            answer.success(),
            "llama.cpp could not run {arch} {ty} (run scripts/oracles.sh):\n{}\n{}",
            answer.stdout,
            answer.stderr
        );
        let r: Value = serde_json::from_str(answer.stdout.trim()).expect("tiny_ref.py JSON");
        let gguf = Arc::new(Gguf::open(&file).expect("open tiny model"));
        let opts = EngineOptions {
            threads: Some(2),
            kv_tokens: 512,
            block_size: 16,
            ..EngineOptions::default()
        };
        let mut e = Engine::from_gguf(gguf, &opts).expect("smelt loads the tiny model");
        assert_eq!(e.info().arch.name(), want_arch);
        assert!(
            e.info().moe.is_some() || e.info().delta.is_some(),
            "{arch}: experts or delta-net layers read from metadata"
        );

        let mut margins: Vec<f64> = Vec::new();
        for case in r["cases"].as_array().expect("cases") {
            let prompt = ids(&case["prompt"]);
            let want = ids(&case["greedy"]);
            let gaps = f32s(&case["margins"]);
            margins.extend(gaps.iter().map(|&g| g as f64));
            let (logits, got) = greedy(&mut e, &prompt);
            let theirs = f32s(&case["logits"]);
            let worst = logits
                .iter()
                .zip(&theirs)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let bits = logits.iter().zip(&theirs).all(|(a, b)| a == b);
            eprintln!(
                "{arch} {ty} prompt of {}: last-row logits max |diff| {worst:e}{}",
                prompt.len(),
                if bits { " (bit-exact)" } else { "" }
            );
            if worst > tol {
                failures.push(format!(
                    "{arch} {ty} prompt of {}: logits differ by {worst}",
                    prompt.len()
                ));
            }
            let same = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
            if same < N_GEN {
                failures.push(format!(
                    "{arch} {ty} prompt of {}: first {same}/{N_GEN} tokens agree; then \
                     llama.cpp {} (its top-1 margin {:.4}), smelt {}",
                    prompt.len(),
                    want[same],
                    gaps[same],
                    got[same]
                ));
            }
        }
        margins.sort_by(f64::total_cmp);
        let median = margins[margins.len() / 2];
        assert!(
            median > 0.05,
            "{arch} {ty}: logits too flat (median margin {median})"
        );
        let seq = ids(&r["ppl_tokens"]);
        let (ours, theirs) = (perplexity(&mut e, &seq), r["ppl"].as_f64().expect("ppl"));
        let rel = (ours / theirs - 1.0).abs();
        eprintln!(
            "{arch} {ty}: perplexity smelt {ours:.4}, llama.cpp {theirs:.4} ({rel:.2e} apart)"
        );
        if rel > 0.005 {
            failures.push(format!(
                "{arch} {ty}: perplexity {ours} vs llama.cpp {theirs}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Qwen3-MoE: Qwen3 attention (Q/K norms, heads of 32 under a 64-wide embedding), softmax
/// router over 20 experts, top 4 normalised, expert FFN size from
/// `expert_feed_forward_length` (not the dense `feed_forward_length`).
#[test]
fn qwen3moe_equals_llama_cpp() {
    same_as_llama_cpp("qwen3moe", "qwen3moe", &MOE_TOLERANCES);
}

/// Mixtral: a `llama` file with `expert_count`, the same MoE block under Llama's attention
/// (adjacent-pair rope, no Q/K norms), expert size from `feed_forward_length`.
#[test]
fn mixtral_equals_llama_cpp() {
    same_as_llama_cpp("mixtral", "llama", &MOE_TOLERANCES);
}

/// Qwen3.5 (dense hybrid): delta, delta, attention, delta (`full_attention_interval` 3);
/// 4 value heads over 2 key heads; conv window and delta-rule state carried per sequence
/// across decode steps; prompts of 40 and 100 tokens take the chunked form (one and two
/// chunks of 64), which llama.cpp computes token by token, so logits agree to float
/// rounding rather than bit for bit; gated attention with partial M-RoPE.
#[test]
fn qwen35_equals_llama_cpp() {
    same_as_llama_cpp(
        "qwen35",
        "qwen35",
        &[("f32", 2e-3), ("f16", 2e-2), ("q8_0", 2e-3)],
    );
}

/// A hybrid's recurrent state belongs to its sequence: a 100-token prompt in one step
/// (chunked delta rule) equals it fed one token per step (the recurrence) within float
/// rounding; two sequences in one batch get what each gets alone; a prompt split over
/// several steps (prefill chunks) continues its state; a freed sequence's successor starts
/// from a fresh state.
#[test]
fn qwen35_state_is_per_sequence() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Q8_0: every matmul output is the same dot whatever the batch (F32 weights take
    // tinyBLAS's order from two rows on, as llama.cpp does).
    let file = dir.path().join("tiny-qwen35-q8_0.gguf");
    write_tiny("qwen35", "q8_0", &file);
    let gguf = Arc::new(Gguf::open(&file).expect("open tiny model"));
    let opts = EngineOptions {
        threads: Some(2),
        kv_tokens: 1024,
        block_size: 16,
        ..EngineOptions::default()
    };
    let mut e = Engine::from_gguf(gguf, &opts).expect("load");
    // As `smelt serve` asks (its default): a hybrid must keep it off anyway.
    e.set_prefix_cache(true);
    let a: Vec<u32> = (0..100).map(|i| 3 + (i * 37 % 500) as u32).collect();
    let b: Vec<u32> = (0..23).map(|i| 3 + (i * 91 % 500) as u32).collect();
    let step = |e: &mut Engine, seq, tokens: &[u32]| -> Vec<f32> {
        e.forward(&[SeqInput {
            seq,
            tokens: tokens.to_vec(),
            logits: Logits::Last,
        }])
        .expect("step")[0][0]
            .clone()
    };
    let worst = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    let s = e.new_sequence();
    let whole = step(&mut e, s, &a);
    e.free_sequence(s);
    let s = e.new_sequence();
    let mut one = Vec::new();
    for &t in &a {
        one = step(&mut e, s, &[t]);
    }
    assert!(
        worst(&whole, &one) < 1e-3,
        "prompt vs token by token: {}",
        worst(&whole, &one)
    );
    e.free_sequence(s);
    // Prefill in chunks of 30, 30 and 40 tokens.
    let s = e.new_sequence();
    step(&mut e, s, &a[..30]);
    step(&mut e, s, &a[30..60]);
    let chunked = step(&mut e, s, &a[60..]);
    assert!(
        worst(&whole, &chunked) < 1e-3,
        "chunked prefill: {}",
        worst(&whole, &chunked)
    );
    e.free_sequence(s);
    // Alone, then together in one batch.
    let s = e.new_sequence();
    let alone_b = step(&mut e, s, &b);
    e.free_sequence(s);
    let (sa, sb) = (e.new_sequence(), e.new_sequence());
    let both = e
        .forward(&[
            SeqInput {
                seq: sa,
                tokens: a.clone(),
                logits: Logits::Last,
            },
            SeqInput {
                seq: sb,
                tokens: b.clone(),
                logits: Logits::Last,
            },
        ])
        .expect("batch of two");
    assert_eq!(both[0][0], whole, "sequence a in a batch of two");
    assert_eq!(both[1][0], alone_b, "sequence b in a batch of two");
    // Prefix caching stayed off: `a`'s blocks were computed several times above, but a new
    // sequence starts on none of them (its recurrent state would miss them).
    e.set_prefix_cache(true);
    let s = e.new_sequence();
    assert_eq!(
        e.attach_prefix(s, &a),
        0,
        "a hybrid attached cached KV blocks"
    );
    assert_eq!(e.prefix_cache_stats().1, 0);
}

/// Qwen3.5-MoE: the hybrid's layers with routed experts (gate and up fused in one
/// `ffn_gate_up_exps` tensor) plus a shared expert scaled by `sigmoid(x . ffn_gate_inp_shexp)`.
#[test]
fn qwen35moe_equals_llama_cpp() {
    same_as_llama_cpp(
        "qwen35moe",
        "qwen35moe",
        &[("f32", 2e-3), ("f16", 2e-2), ("q8_0", 2e-3)],
    );
}

/// Qwen3-Next, split layout (`attn_qkv`, `attn_gate`): NeoX partial rope, value heads
/// grouped under their key head (repeat-interleave), fused `ssm_ba`, routed experts in
/// separate gate/up tensors and a shared expert. At q8_0 the 100-token prompt's last row
/// differs by 0.15: the chunked delta rule's last-bit differences move one token's router
/// logits across a near-tie between two experts (greedy tokens and perplexity still agree).
#[test]
fn qwen3next_equals_llama_cpp() {
    same_as_llama_cpp("qwen3next", "qwen3next", &[("f32", 2e-3), ("q8_0", 0.2)]);
}

/// Qwen3-Next as older converters wrote it: `ssm_in` holds q, k, v and z per key-head
/// group, gathered into the split layout after one matmul.
#[test]
fn qwen3next_fused_ssm_in_equals_llama_cpp() {
    same_as_llama_cpp(
        "qwen3next-fused",
        "qwen3next",
        &[("f32", 2e-3), ("q8_0", 2e-3)],
    );
}

/// Tensor parallelism on the llama.cpp-checked files: each hybrid (2 key heads, so one a
/// rank) split over 2 simulated CPU ranks (`--device cpu --tp 2`) generates what the whole
/// model generates (tests/tp_hybrid.rs checks more ranks, layouts and the plan).
#[test]
fn hybrids_split_over_two_ranks_generate_what_the_whole_model_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = EngineOptions {
        kv_tokens: 256,
        ..EngineOptions::default()
    };
    let prompt: Vec<u32> = (0..40).map(|i| (i * 53 + 7) % 512).collect();
    for arch in ["qwen35", "qwen35moe", "qwen3next", "qwen3next-fused"] {
        let file = dir.path().join(format!("{arch}.gguf"));
        write_tiny(arch, "f32", &file);
        let gguf = Arc::new(Gguf::open(&file).expect("open tiny model"));
        let mut whole = Engine::from_gguf(gguf.clone(), &opts).expect("load");
        let (wl, wt) = greedy(&mut whole, &prompt);
        let devices = [smelt_engine::Device::Cpu; 2];
        let mut tp = Engine::from_gguf_tp(gguf, &opts, &devices).expect("tp load");
        let (gl, gt) = greedy(&mut tp, &prompt);
        assert_eq!(wt, gt, "{arch}: greedy tokens");
        let scale = wl.iter().fold(1f32, |m, x| m.max(x.abs()));
        let d = wl
            .iter()
            .zip(&gl)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d <= 1e-4 * scale, "{arch}: prompt logits differ by {d}");
    }
}
