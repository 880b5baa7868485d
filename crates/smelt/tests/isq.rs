//! `--isq TYPE` and Hugging Face folders through the CLI: what `smelt run --isq T` generates
//! is what `smelt run` generates on the file `smelt quantize --type T` writes (the same
//! bytes), and a folder loads anywhere a GGUF path does.

mod common;

use common::{model, smelt, smelt_ok, SMOLLM};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn run_json(model: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "run",
        "--model",
        model,
        "--raw",
        "--prompt",
        "The three primary colors are",
        "--max-tokens",
        "12",
        "--threads",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = smelt_ok(&args);
    serde_json::from_str(out.lines().last().unwrap_or("")).expect("--json prints JSON last")
}

#[test]
fn run_isq_generates_what_the_quantized_file_generates() {
    let src = model(SMOLLM);
    let src = src.to_str().expect("UTF-8 path");
    let dir = tempfile::tempdir().expect("tempdir");
    for ty in ["q8_0", "q4_k_m"] {
        let file = dir.path().join(format!("{ty}.gguf"));
        let file = file.to_str().expect("UTF-8 path");
        smelt_ok(&["quantize", src, file, "--type", ty]);
        let want = run_json(file, &[]);
        let got = run_json(src, &["--isq", ty]);
        assert_eq!(got["tokens"], want["tokens"], "{ty}");
        assert_eq!(got["tokens"].as_array().map(Vec::len), Some(12), "{ty}");
    }
}

#[test]
fn bad_isq_and_bad_folders_are_clear_errors() {
    let src = model(SMOLLM);
    let out = smelt(&[
        "run",
        "--model",
        src.to_str().expect("UTF-8 path"),
        "--prompt",
        "x",
        "--isq",
        "q9_9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--isq") && err.contains("q9_9"), "{err}");

    let empty = tempfile::tempdir().expect("tempdir");
    let out = smelt(&[
        "run",
        "--model",
        empty.path().to_str().expect("UTF-8 path"),
        "--prompt",
        "x",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("config.json") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_hugging_face_folder_runs_with_and_without_isq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("SmolLM2-bf16");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oracle/hf_folder.py");
    let st = Command::new(common::python())
        .arg(script)
        .arg(model(SMOLLM))
        .arg(&folder)
        .status()
        .expect("runs hf_folder.py");
    assert!(st.success(), "hf_folder.py failed");
    let f = folder.to_str().expect("UTF-8 path");
    let bf16 = run_json(f, &[]);
    let q8 = run_json(f, &["--isq", "q8_0"]);
    for v in [&bf16, &q8] {
        assert_eq!(v["tokens"].as_array().map(Vec::len), Some(12), "{v}");
    }
    // Same prompt ids as the GGUF it was written from.
    let orig = run_json(model(SMOLLM).to_str().expect("UTF-8 path"), &[]);
    assert_eq!(bf16["prompt_tokens"], orig["prompt_tokens"]);

    // `smelt quantize` and `smelt inspect` take the folder too: the quantized file generates
    // what --isq generates.
    let q8_file = dir.path().join("q8.gguf");
    let q8_file = q8_file.to_str().expect("UTF-8 path");
    smelt_ok(&["quantize", f, q8_file, "--type", "q8_0"]);
    assert_eq!(run_json(q8_file, &[])["tokens"], q8["tokens"]);
    let info: Value = serde_json::from_str(&smelt_ok(&["inspect", "--json", f])).expect("JSON");
    assert_eq!(
        info["metadata"]["general.architecture"], "llama",
        "{}",
        info["metadata"]
    );
}

/// Every architecture a folder can hold, from `smelt synth`'s two-layer shapes in bf16: the
/// folder written from the GGUF loads back as the same tensors (names, types, shapes,
/// bytes; Llama's Q/K permuted back; Llama 3's rope_freqs recomputed from config.json), with
/// metadata that agrees, and the engine gives bit-identical logits on both.
#[test]
fn every_supported_architecture_round_trips_through_a_folder() {
    use smelt_engine::{Engine, EngineOptions, Logits, SeqInput};
    use smelt_gguf::Gguf;
    use std::sync::Arc;

    let dir = tempfile::tempdir().expect("tempdir");
    let tok = model(SMOLLM);
    for (shape, hf_arch) in [
        ("llama3-tiny", "LlamaForCausalLM"),
        ("mistral-tiny", "MistralForCausalLM"),
        ("qwen2-tiny", "Qwen2ForCausalLM"),
        ("qwen3-tiny", "Qwen3ForCausalLM"),
    ] {
        let gguf = dir.path().join(format!("{shape}.gguf"));
        let folder = dir.path().join(shape);
        smelt_ok(&[
            "synth",
            "--shape",
            shape,
            "--quant",
            "bf16",
            "--tokenizer-from",
            tok.to_str().expect("UTF-8 path"),
            "-o",
            gguf.to_str().expect("UTF-8 path"),
        ]);
        let st = Command::new(common::python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oracle/hf_folder.py"))
            .arg(&gguf)
            .arg(&folder)
            .args(["--hf-arch", hf_arch, "--f32-vectors"])
            .status()
            .expect("runs hf_folder.py");
        assert!(st.success(), "{shape}: hf_folder.py failed");

        let want = Gguf::open(&gguf).expect("synth output");
        let got = smelt_load::open(&folder, None, &smelt_load::CpuQuantizer)
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert_eq!(want.tensors().len(), got.tensors().len(), "{shape}");
        for t in want.tensors() {
            let g = got
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{shape}: {} missing", t.name));
            assert_eq!((g.ty, &g.shape), (t.ty, &t.shape), "{shape}: {}", t.name);
            if t.name == "rope_freqs.weight" {
                // convert computes the frequencies in f32 (torch), synth in f64: an ulp apart.
                let f = |b: &[u8]| -> Vec<f32> {
                    b.chunks(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                };
                let (a, b) = (f(got.tensor_data(g)), f(want.tensor_data(t)));
                eprintln!("{shape}: rope_freqs converted {a:?}\n  synth {b:?}");
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() <= 1e-6 * y.abs(),
                        "{shape}: rope_freqs {a:?} vs {b:?}"
                    );
                }
                continue;
            }
            assert!(
                got.tensor_data(g) == want.tensor_data(t),
                "{shape}: {} bytes differ",
                t.name
            );
        }
        let (wm, gm) = (want.metadata(), got.metadata());
        assert_eq!(gm.architecture(), wm.architecture(), "{shape}");
        for (k, v) in gm.iter() {
            if k.starts_with("general.") {
                continue;
            }
            assert_eq!(wm.get(k), Some(v), "{shape}: metadata key {k}");
        }
        let a = wm.architecture().unwrap_or("");
        for key in [
            "block_count",
            "embedding_length",
            "feed_forward_length",
            "attention.head_count",
            "attention.head_count_kv",
            "rope.freq_base",
            "attention.layer_norm_rms_epsilon",
        ] {
            assert!(
                gm.get(&format!("{a}.{key}")).is_some(),
                "{shape}: {a}.{key}"
            );
        }

        let opts = EngineOptions {
            kv_tokens: 64,
            ..EngineOptions::default()
        };
        let mut logits = Vec::new();
        for g in [want, got] {
            let mut e = Engine::from_gguf(Arc::new(g), &opts).expect("engine");
            let seq = e.new_sequence();
            let out = e
                .forward(&[SeqInput {
                    seq,
                    tokens: vec![1, 504, 3458, 282, 5365, 314, 2],
                    logits: Logits::Last,
                }])
                .expect("forward");
            logits.push(out[0][0].clone());
        }
        let diff = logits[0]
            .iter()
            .zip(&logits[1])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        if shape == "llama3-tiny" {
            // The rope factors above are an ulp apart.
            assert!(diff < 1e-3, "{shape}: logits differ by {diff}");
        } else {
            assert!(diff == 0.0, "{shape}: logits differ by {diff}");
        }
    }
}

/// A SentencePiece folder (tokenizer.model + tokenizer_config.json, as Mistral and Llama 2
/// ship): the vocabulary converts as convert's `_set_vocab_sentencepiece` makes it (pieces,
/// scores, types; added tokens from `added_tokens_decoder`), special ids and flags as gguf-py's
/// SpecialVocab reads them, and text tokenizes as with the GGUF the folder came from.
#[test]
fn a_sentencepiece_folder_converts_like_convert() {
    use smelt_gguf::Gguf;

    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = dir.path().join("mistral-gemma-vocab.gguf");
    let folder = dir.path().join("mistral-spm");
    smelt_ok(&[
        "synth",
        "--shape",
        "mistral-tiny",
        "--quant",
        "bf16",
        "--tokenizer-from",
        model(common::GEMMA).to_str().expect("UTF-8 path"),
        "-o",
        gguf.to_str().expect("UTF-8 path"),
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oracle/hf_folder.py");
    let st = Command::new(common::python())
        .arg(&script)
        .arg(&gguf)
        .arg(&folder)
        .args(["--hf-arch", "MistralForCausalLM", "--f32-vectors"])
        .status()
        .expect("runs hf_folder.py");
    assert!(st.success(), "hf_folder.py failed");
    assert!(folder.join("tokenizer.model").is_file());
    assert!(!folder.join("tokenizer.json").exists());

    let want = Gguf::open(&gguf).expect("synth output");
    let got = smelt_load::open(&folder, None, &smelt_load::CpuQuantizer).expect("converts");
    let (wm, gm) = (want.metadata(), got.metadata());
    assert_eq!(gm.get_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(gm.get_str("tokenizer.ggml.pre"), Some("default"));
    let strings = |m: &smelt_gguf::Metadata, k: &str| -> Vec<String> {
        m.get_array(k)
            .and_then(|a| a.as_strings())
            .expect("strings")
            .to_vec()
    };
    let arr = |m: &smelt_gguf::Metadata, k: &str| -> Vec<f64> {
        match m.get_array(k) {
            Some(smelt_gguf::Array::F32(v)) => v.iter().map(|&x| f64::from(x)).collect(),
            Some(smelt_gguf::Array::I32(v)) => v.iter().map(|&x| f64::from(x)).collect(),
            other => panic!("{k}: {other:?}"),
        }
    };
    let (wt, gt) = (
        strings(wm, "tokenizer.ggml.tokens"),
        strings(gm, "tokenizer.ggml.tokens"),
    );
    let (ws, gs) = (
        arr(wm, "tokenizer.ggml.scores"),
        arr(gm, "tokenizer.ggml.scores"),
    );
    let (wty, gty) = (
        arr(wm, "tokenizer.ggml.token_type"),
        arr(gm, "tokenizer.ggml.token_type"),
    );
    assert_eq!(wt.len(), gt.len());
    let mut promoted = 0;
    for i in 0..wt.len() {
        assert_eq!(gs[i], ws[i], "score of {i} {:?}", wt[i]);
        // convert: an added token that is not special but looks special (<...|>, <unusedN>,
        // <pad>, <mask> ...) becomes CONTROL; other user-defined tokens get ▁ as a space.
        let t = &wt[i];
        let looks = t.starts_with("<unused") && t.ends_with('>')
            || t.starts_with("<|") && t.ends_with("|>")
            || ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].contains(&t.as_str());
        if wty[i] == 4.0 && looks {
            assert_eq!((gty[i], &gt[i]), (3.0, t), "token {i}");
            promoted += 1;
        } else if wty[i] == 4.0 {
            assert_eq!(
                (gty[i], &gt[i]),
                (4.0, &t.replace('\u{2581}', " ")),
                "token {i}"
            );
        } else {
            assert_eq!((gty[i], &gt[i]), (wty[i], t), "token {i}");
        }
    }
    eprintln!("{promoted} user-defined tokens that look special became control tokens");

    // Special ids and flags: gguf-py's SpecialVocab on the folder.
    let out = Command::new(common::python())
        .arg(&script)
        .arg("special-vocab")
        .arg(&folder)
        .output()
        .expect("runs special-vocab");
    assert!(out.status.success());
    let sv: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for (typ, key) in [
        ("bos", "bos"),
        ("eos", "eos"),
        ("unk", "unknown"),
        ("pad", "padding"),
    ] {
        assert_eq!(
            gm.get_u64(&format!("tokenizer.ggml.{key}_token_id")),
            sv["special_token_ids"][typ].as_u64(),
            "{typ} id"
        );
    }
    for typ in ["bos", "eos"] {
        assert_eq!(
            gm.get_bool(&format!("tokenizer.ggml.add_{typ}_token")),
            sv["add_special_token"][typ].as_bool(),
            "add_{typ}_token"
        );
    }
    assert_eq!(
        gm.get_bool("tokenizer.ggml.add_space_prefix"),
        wm.get_bool("tokenizer.ggml.add_space_prefix")
    );

    let a = smelt_tokenizer::Tokenizer::from_gguf(wm).expect("tokenizer of the GGUF");
    let b = smelt_tokenizer::Tokenizer::from_gguf(gm).expect("tokenizer of the folder");
    for text in [
        "Hello world",
        "  two leading spaces, digits 12345 and tabs\t\there",
        "émojis 🦙 and 中文",
        "",
    ] {
        assert_eq!(
            a.encode(text, true, false),
            b.encode(text, true, false),
            "{text:?}"
        );
    }
}
