//! Files smelt writes load and generate in llama.cpp (llama-cpp-python): Gemma 3 270M
//! requantized from its own dequantized weights, and synthetic models of real shapes.

mod common;
use common::*;

const PROMPT: &str = "The capital of France is";
const N: usize = 16;

fn agreeing_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn gemma_requantized_generates_in_llama_cpp() {
    let src = model(GEMMA);
    let dir = tempfile::tempdir().expect("tempdir");
    let reference = greedy(&src, N, PROMPT);
    assert_eq!(reference.tokens.len(), N);

    // q8_0: every matrix in Q8_0, from weights that were Q4_K_M: close to the original.
    let q8 = dir.path().join("gemma-q8_0.gguf");
    let run = smelt(&[
        "quantize",
        src.to_str().expect("p"),
        q8.to_str().expect("p"),
        "--type",
        "q8_0",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let warn = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        warn.matches("already quantized").count(),
        1,
        "one dequantize warning: {warn}"
    );
    assert!(warn.contains("127 tensors"), "{warn}");
    let types = tensor_types(&inspect_json(&q8));
    for (name, (ty, shape)) in &types {
        let want = if shape.len() == 1 { "f32" } else { "q8_0" };
        assert_eq!(ty, want, "{name}");
    }
    let got = greedy(&q8, N, PROMPT);
    let same = agreeing_prefix(&reference.tokens, &got.tokens);
    eprintln!(
        "q8_0: {same}/{N} greedy tokens agree with the original\n  original: {:?}\n  q8_0:     {:?}",
        reference.text, got.text
    );
    assert!(!got.text.trim().is_empty());
    assert!(
        same >= 8,
        "q8_0 diverged at token {same}: {:?} vs {:?}",
        reference.tokens,
        got.tokens
    );

    // q4_k_m: llama.cpp's mixture gives back exactly the original file's tensor types.
    let q4 = dir.path().join("gemma-q4_k_m.gguf");
    smelt_ok(&[
        "quantize",
        src.to_str().expect("p"),
        q4.to_str().expect("p"),
        "--type",
        "q4_k_m",
    ]);
    let original = tensor_types(&inspect_json(&src));
    assert_eq!(
        tensor_types(&inspect_json(&q4)),
        original,
        "same per-tensor types as llama.cpp's Q4_K_M"
    );
    let got = greedy(&q4, N, PROMPT);
    let same = agreeing_prefix(&reference.tokens, &got.tokens);
    eprintln!(
        "q4_k_m: {same}/{N} greedy tokens agree with the original: {:?}",
        got.text
    );
    assert!(!got.text.trim().is_empty());
    assert!(
        same >= 4,
        "q4_k_m diverged at token {same}: {:?} vs {:?}",
        reference.tokens,
        got.tokens
    );
}

#[test]
fn tiny_qwen2_synth_with_a_real_tokenizer_generates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("qwen.gguf");
    let tok = model(SMOLLM);
    smelt_ok(&[
        "synth",
        "--shape",
        "qwen2.5-0.5b",
        "--layers",
        "2",
        "--quant",
        "q8_0",
        "--tokenizer-from",
        tok.to_str().expect("p"),
        "-o",
        out.to_str().expect("p"),
    ]);
    let j = inspect_json(&out);
    assert_eq!(j["metadata"]["general.architecture"], "qwen2");
    assert_eq!(j["metadata"]["qwen2.block_count"], 2);
    assert_eq!(j["metadata"]["qwen2.vocab_size"], 49152);
    assert_eq!(j["metadata"]["tokenizer.ggml.model"], "gpt2");
    let types = tensor_types(&j);
    assert_eq!(
        types["token_embd.weight"],
        ("q8_0".into(), vec![896, 49152])
    );
    assert_eq!(
        types["blk.1.attn_k.weight"],
        ("q8_0".into(), vec![896, 128])
    );
    assert_eq!(types["blk.1.attn_k.bias"], ("f32".into(), vec![128]));
    assert_eq!(
        types["blk.0.ffn_down.weight"],
        ("q8_0".into(), vec![4864, 896])
    );
    assert!(!types.contains_key("output.weight"), "tied embeddings");
    let got = greedy(&out, 8, "Hello there");
    assert_eq!(got.tokens.len(), 8);
    assert_eq!(got.n_vocab, 49152);
}

#[test]
fn small_llama3_synth_generates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("llama3.gguf");
    smelt_ok(&[
        "synth",
        "--shape",
        "llama3-1b",
        "--layers",
        "2",
        "--quant",
        "q4_k_m",
        "-o",
        out.to_str().expect("p"),
    ]);
    let j = inspect_json(&out);
    assert_eq!(j["metadata"]["llama.block_count"], 2);
    assert_eq!(j["metadata"]["general.file_type"], 15);
    let types = tensor_types(&j);
    // Tied embeddings act as the output: Q6_K, as llama.cpp makes them.
    assert_eq!(
        types["token_embd.weight"],
        ("q6_K".into(), vec![2048, 128256])
    );
    assert_eq!(
        types["blk.0.attn_q.weight"],
        ("q4_K".into(), vec![2048, 2048])
    );
    // use_more_bits(i, 2) holds for layer 1 only (i >= 7 * 2 / 8).
    assert_eq!(
        types["blk.0.attn_v.weight"],
        ("q4_K".into(), vec![2048, 512])
    );
    assert_eq!(
        types["blk.1.attn_v.weight"],
        ("q6_K".into(), vec![2048, 512])
    );
    assert_eq!(
        types["blk.1.ffn_down.weight"],
        ("q6_K".into(), vec![8192, 2048])
    );
    assert_eq!(
        types["blk.1.ffn_gate.weight"],
        ("q4_K".into(), vec![2048, 8192])
    );
    let got = greedy(&out, 6, "ids:1,2,3,4");
    assert_eq!(got.tokens.len(), 6);
    assert!(got.tokens.iter().all(|&t| t < 128256));
}

#[test]
fn qwen3_synth_shapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("qwen3.gguf");
    smelt_ok(&[
        "synth",
        "--shape",
        "qwen3-32b",
        "--layers",
        "1",
        "--quant",
        "q4_k",
        "-o",
        out.to_str().expect("p"),
    ]);
    let j = inspect_json(&out);
    assert_eq!(j["metadata"]["qwen3.attention.key_length"], 128);
    let types = tensor_types(&j);
    assert_eq!(
        types["blk.0.attn_q.weight"],
        ("q4_K".into(), vec![5120, 8192])
    );
    assert_eq!(
        types["blk.0.attn_output.weight"],
        ("q4_K".into(), vec![8192, 5120])
    );
    assert_eq!(types["blk.0.attn_q_norm.weight"], ("f32".into(), vec![128]));
    assert_eq!(types["output.weight"], ("q6_K".into(), vec![5120, 151936]));
    let got = greedy(&out, 4, "ids:1,2,3");
    assert_eq!(got.tokens.len(), 4);
}

/// Runs llama.cpp's own quantizer (`llama_model_quantize`).
fn llama_quantize(input: &std::path::Path, output: &std::path::Path, ftype: u32, pure: bool) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/llama_quantize.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .arg(input)
        .arg(output)
        .arg(ftype.to_string())
        .args(pure.then_some("--pure"))
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "llama.cpp quantize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every tensor of `a` and `b` (matched by name: llama.cpp reorders them) has the same
/// type and the same bytes.
fn assert_same_tensors(what: &str, a: &std::path::Path, b: &std::path::Path) {
    let a = smelt_gguf::Gguf::open(a).expect("llama.cpp output reads");
    let b = smelt_gguf::Gguf::open(b).expect("smelt output reads");
    assert_eq!(a.tensors().len(), b.tensors().len(), "{what}");
    let mut types = 0;
    let mut bytes = 0;
    for ta in a.tensors() {
        let tb = b
            .tensor(&ta.name)
            .unwrap_or_else(|| panic!("{what}: smelt lacks {}", ta.name));
        if ta.ty != tb.ty || ta.shape != tb.shape {
            types += 1;
            eprintln!(
                "{what}: {} is {} in llama.cpp, {} in smelt",
                ta.name, ta.ty, tb.ty
            );
        } else if a.tensor_data(ta) != b.tensor_data(tb) {
            bytes += 1;
            eprintln!("{what}: {} ({}) bytes differ", ta.name, ta.ty);
        }
    }
    assert_eq!(
        (types, bytes),
        (0, 0),
        "{what}: tensors whose type / bytes differ from llama.cpp's"
    );
    assert_eq!(
        a.metadata().get_u64("general.file_type"),
        b.metadata().get_u64("general.file_type"),
        "{what}"
    );
}

/// Every preset, on the llama (SmolLM2, 576-wide rows: ragged for K-quants) and gemma3
/// architectures: smelt's per-tensor types and bytes equal llama.cpp's own quantizer's.
#[test]
fn presets_match_llama_cpp_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all: &[(&str, u32)] = &[
        ("q2_k", 10),
        ("q3_k_s", 11),
        ("q3_k_m", 12),
        ("q3_k_l", 13),
        ("q4_k_s", 14),
        ("q4_k_m", 15),
        ("q5_k_s", 16),
        ("q5_k_m", 17),
        ("q6_k", 18),
        ("q8_0", 7),
        ("q4_0", 2),
        ("q4_1", 3),
        ("q5_0", 8),
        ("q5_1", 9),
        ("f16", 1),
        ("bf16", 32),
    ];
    let few: &[(&str, u32)] = &[
        ("q2_k", 10),
        ("q3_k_m", 12),
        ("q4_k_m", 15),
        ("q5_k_s", 16),
        ("q8_0", 7),
    ];
    for (name, presets) in [(SMOLLM, all), (GEMMA, few)] {
        // An F16 source, as llama-quantize usually gets one.
        let f16 = dir.path().join("source-f16.gguf");
        smelt_ok(&[
            "quantize",
            model(name).to_str().expect("p"),
            f16.to_str().expect("p"),
            "--type",
            "f16",
        ]);
        for &(preset, ftype) in presets {
            let theirs = dir.path().join("llama.gguf");
            let ours = dir.path().join("smelt.gguf");
            llama_quantize(&f16, &theirs, ftype, false);
            smelt_ok(&[
                "quantize",
                f16.to_str().expect("p"),
                ours.to_str().expect("p"),
                "--type",
                preset,
                "--preset",
            ]);
            assert_same_tensors(&format!("{name} {preset}"), &theirs, &ours);
        }
    }
}

/// An exact format is llama.cpp's `--pure` quantization: one type for every matrix (with
/// the same ragged-row fallbacks), byte for byte.
#[test]
fn exact_types_match_llama_cpp_pure_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f16 = dir.path().join("source-f16.gguf");
    smelt_ok(&[
        "quantize",
        model(SMOLLM).to_str().expect("p"),
        f16.to_str().expect("p"),
        "--type",
        "f16",
    ]);
    // (format, the llama.cpp file type whose default type it is)
    for (ty, ftype) in [
        ("q4_0", 2),
        ("q5_1", 9),
        ("q8_0", 7),
        ("q2_k", 10),
        ("q3_k", 11),
        ("q4_k", 14),
        ("q5_k", 16),
        ("q6_k", 18),
    ] {
        let theirs = dir.path().join("llama.gguf");
        let ours = dir.path().join("smelt.gguf");
        llama_quantize(&f16, &theirs, ftype, true);
        smelt_ok(&[
            "quantize",
            f16.to_str().expect("p"),
            ours.to_str().expect("p"),
            "--type",
            ty,
        ]);
        assert_same_tensors(&format!("{SMOLLM} pure {ty}"), &theirs, &ours);
    }
}
