//! Architectures with no real model here (Llama 3 with rope scaling, Mistral, Qwen2, Qwen3,
//! Qwen3-MoE):
//! a two-layer random-weight model of each, written by `smelt synth` with SmolLM2's
//! tokenizer, generates the same greedy tokens in smelt and in llama.cpp.
//!
//! The tiny shapes' weights are large enough that logits are peaked (llama.cpp's median
//! top-1 margin is checked), so the comparison is decided by the architecture (rope
//! factors, QKV bias, Q/K norms, grouped-query attention) rather than by rounding.

mod common;
use common::*;

use serde_json::Value;
use std::path::Path;

/// Tokens compared per prompt (the issue asks for at least 32).
const N: usize = 40;

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Once upon a time, in a land far away, there lived",
    "1, 2, 3, 5, 8, 13,",
];

/// Float weights, the 8-bit format and a K-quant mixture (Q4_K, Q6_K, Q8_0... per tensor).
const TYPES: &[&str] = &["f32", "q8_0", "q4_k_m"];

/// llama.cpp's greedy tokens for every prompt, with each step's top-1 margin.
struct Reference {
    prompt: Vec<u64>,
    tokens: Vec<u64>,
    margins: Vec<f64>,
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|t| t.as_u64().expect("token id"))
        .collect()
}

fn llama_cpp(model: &Path, prompts_json: &Path) -> Vec<Reference> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/synth_ref.py");
    let out = smelt_oracle::run_recorded(
        &script,
        &[
            model.to_str().expect("UTF-8 path"),
            &N.to_string(),
            prompts_json.to_str().expect("UTF-8 path"),
        ],
        smelt_oracle::Keep::Small,
    );
    let stdout = &out.stdout;
    assert!(
        out.success(),
        "llama.cpp could not run {}:\n{stdout}\n{}",
        model.display(),
        out.stderr
    );
    stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("synth_ref.py prints JSON lines");
            Reference {
                prompt: ids(&v["prompt"]),
                tokens: ids(&v["tokens"]),
                margins: v["margins"]
                    .as_array()
                    .expect("margins")
                    .iter()
                    .map(|m| m.as_f64().expect("margin"))
                    .collect(),
            }
        })
        .collect()
}

/// smelt's (prompt ids, generated ids) for every prompt, from one process.
fn smelt_greedy(model: &Path, prompts_jsonl: &Path) -> Vec<(Vec<u64>, Vec<u64>)> {
    let out = smelt_ok(&[
        "run",
        "--model",
        model.to_str().expect("UTF-8 path"),
        "--raw",
        "--prompts-file",
        prompts_jsonl.to_str().expect("UTF-8 path"),
        "--max-tokens",
        &N.to_string(),
        "--ignore-eog",
    ]);
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("smelt run prints JSON lines");
            (ids(&v["prompt_tokens"]), ids(&v["tokens"]))
        })
        .collect()
}

/// Tokens that must agree for the hybrids (the 32): their prompts take smelt's
/// chunked delta rule where llama.cpp runs the recurrence, equal only to float rounding, so a
/// near-tie late in a long continuation may go either way (reported, not failed).
const HYBRID_MUST_AGREE: usize = 32;

/// A first divergence where llama.cpp's own top-1 margin is below this is a float tie
/// (the two engines requantize activations differently): reported, not failed. A real
/// difference moves tokens with clear margins (the medians here are above 0.05).
const TIE_MARGIN: f64 = 0.02;

/// Synthesizes `shape` in every type of [`TYPES`], checks the file carries `must_have`
/// (the tensors and keys that make the architecture what it is), and requires smelt's
/// greedy tokens to equal llama.cpp's on every prompt.
fn same_tokens_as_llama_cpp(shape: &str, arch: &str, must_have: &[&str], keys: &[(&str, u64)]) {
    same_tokens_within(shape, arch, must_have, keys, N)
}

/// [`same_tokens_as_llama_cpp`] requiring only the first `must_agree` tokens to agree.
fn same_tokens_within(
    shape: &str,
    arch: &str,
    must_have: &[&str],
    keys: &[(&str, u64)],
    must_agree: usize,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompts_json = dir.path().join("prompts.json");
    let prompts_jsonl = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts_json, serde_json::to_string(PROMPTS).expect("JSON"))
        .expect("write prompts");
    let lines: String = PROMPTS
        .iter()
        .map(|p| serde_json::to_string(p).expect("JSON") + "\n")
        .collect();
    std::fs::write(&prompts_jsonl, lines).expect("write prompts");
    let tokenizer = model(SMOLLM);

    let mut failures = Vec::new();
    for ty in TYPES {
        let file = dir.path().join(format!("{shape}-{ty}.gguf"));
        smelt_ok(&[
            "synth",
            "--shape",
            shape,
            "--quant",
            ty,
            "--tokenizer-from",
            tokenizer.to_str().expect("UTF-8 path"),
            "-o",
            file.to_str().expect("UTF-8 path"),
        ]);
        let j = inspect_json(&file);
        assert_eq!(j["metadata"]["general.architecture"], arch, "{shape}");
        let tensors = tensor_types(&j);
        for t in must_have {
            assert!(tensors.contains_key(*t), "{shape} {ty} lacks {t}");
        }
        for (k, v) in keys {
            assert_eq!(j["metadata"][format!("{arch}.{k}")], *v, "{shape} {k}");
        }

        let reference = llama_cpp(&file, &prompts_json);
        let ours = smelt_greedy(&file, &prompts_jsonl);
        assert_eq!(
            reference.len(),
            PROMPTS.len(),
            "llama.cpp answered every prompt"
        );
        assert_eq!(ours.len(), PROMPTS.len(), "smelt answered every prompt");
        let mut margins: Vec<f64> = reference
            .iter()
            .flat_map(|r| r.margins.iter().copied())
            .collect();
        margins.sort_by(f64::total_cmp);
        let median = margins[margins.len() / 2];
        eprintln!(
            "{shape} {ty}: llama.cpp top-1 margin min {:.4}, median {median:.3}",
            margins[0]
        );
        // Flat logits would make this a test of rounding, not of the architecture.
        assert!(
            median > 0.05,
            "{shape} {ty}: logits too flat (median margin {median}): the synth weights lost their scale"
        );
        for ((text, r), (prompt, tokens)) in PROMPTS.iter().zip(&reference).zip(&ours) {
            assert_eq!(&r.prompt, prompt, "{shape} {ty}: prompt ids of {text:?}");
            assert_eq!(r.tokens.len(), N);
            let same = r
                .tokens
                .iter()
                .zip(tokens)
                .take_while(|(a, b)| a == b)
                .count();
            if same < N {
                eprintln!(
                    "{shape} {ty} {text:?}: first {same}/{N} tokens agree (margin there {:.4})",
                    r.margins[same]
                );
            }
            if same < must_agree && r.margins[same] >= TIE_MARGIN {
                failures.push(format!(
                    "{shape} {ty} {text:?}: first {same}/{N} tokens agree; then llama.cpp {} \
                     (its top-1 margin {:.4}), smelt {:?}",
                    r.tokens[same],
                    r.margins[same],
                    tokens.get(same)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "greedy tokens differ from llama.cpp:\n{}",
        failures.join("\n")
    );
}

/// Llama 3.1 rope scaling (`rope_freqs.weight`, some pairs divided by 8 or interpolated),
/// grouped-query attention with 8 query heads over 2 KV heads.
#[test]
fn llama3_rope_scaling_equals_llama_cpp() {
    same_tokens_as_llama_cpp(
        "llama3-tiny",
        "llama",
        &["rope_freqs.weight", "output.weight"],
        &[("attention.head_count", 8), ("attention.head_count_kv", 2)],
    );
}

/// Mistral: a `llama` GGUF with 4 query heads per KV head and rope base 1e6.
#[test]
fn mistral_equals_llama_cpp() {
    same_tokens_as_llama_cpp(
        "mistral-tiny",
        "llama",
        &["output.weight"],
        &[("attention.head_count", 8), ("attention.head_count_kv", 2)],
    );
}

/// Qwen2: biases on Q, K and V, NeoX rope, tied embeddings.
#[test]
fn qwen2_qkv_bias_equals_llama_cpp() {
    same_tokens_as_llama_cpp(
        "qwen2-tiny",
        "qwen2",
        &[
            "blk.0.attn_q.bias",
            "blk.1.attn_k.bias",
            "blk.1.attn_v.bias",
        ],
        &[("attention.head_count", 4), ("attention.head_count_kv", 2)],
    );
}

/// Qwen3: RMS norms on each Q and K head, heads of 128 under a 256-wide embedding.
#[test]
fn qwen3_qk_norm_equals_llama_cpp() {
    same_tokens_as_llama_cpp(
        "qwen3-tiny",
        "qwen3",
        &["blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"],
        &[
            ("attention.key_length", 128),
            ("attention.head_count_kv", 2),
        ],
    );
}

/// Qwen3-MoE: the router (F32, as llama.cpp's quantizer keeps it) and 3D expert tensors in
/// each type, K-quant experts included (llama.cpp runs repacked Q4_K experts through its gemv
/// and Q6_K ones tiled from 8 rows per expert).
#[test]
fn qwen3moe_experts_equal_llama_cpp() {
    same_tokens_as_llama_cpp(
        "qwen3moe-tiny",
        "qwen3moe",
        &[
            "blk.0.ffn_gate_inp.weight",
            "blk.1.ffn_down_exps.weight",
            "blk.1.attn_k_norm.weight",
        ],
        &[("expert_count", 16), ("expert_used_count", 4)],
    );
}

/// Qwen3.5 hybrid: two Gated DeltaNet layers (conv window and delta-rule state carried
/// through decode; prompts in one step take smelt's chunked form, llama.cpp's recurrence)
/// then a gated attention layer with partial M-RoPE, in f32, q8_0 and K-quants.
#[test]
fn qwen35_hybrid_equals_llama_cpp() {
    same_tokens_within(
        "qwen35-tiny",
        "qwen35",
        &[
            "blk.0.attn_qkv.weight",
            "blk.1.ssm_conv1d.weight",
            "blk.1.ssm_a",
            "blk.2.attn_q_norm.weight",
            "blk.2.post_attention_norm.weight",
        ],
        &[("full_attention_interval", 3), ("ssm.time_step_rank", 4)],
        HYBRID_MUST_AGREE,
    );
}

/// Qwen3-Next: the MoE hybrid with NeoX rope, grouped value heads, fused `ssm_ba`, routed
/// experts and a gated shared expert.
#[test]
fn qwen3next_equals_llama_cpp() {
    same_tokens_within(
        "qwen3next-tiny",
        "qwen3next",
        &[
            "blk.0.ssm_ba.weight",
            "blk.1.ffn_gate_inp_shexp.weight",
            "blk.2.ffn_down_exps.weight",
        ],
        &[("expert_count", 16), ("ssm.group_count", 2)],
        HYBRID_MUST_AGREE,
    );
}

/// Qwen3.5-MoE: Qwen3.5's hybrid layers (sectioned rope, tiled value heads, split
/// projections) with routed experts and a gated shared expert.
#[test]
fn qwen35moe_equals_llama_cpp() {
    same_tokens_within(
        "qwen35moe-tiny",
        "qwen35moe",
        &[
            "blk.0.ssm_beta.weight",
            "blk.1.ffn_gate_inp_shexp.weight",
            "blk.2.ffn_down_exps.weight",
        ],
        &[("expert_count", 16), ("ssm.time_step_rank", 4)],
        HYBRID_MUST_AGREE,
    );
}
