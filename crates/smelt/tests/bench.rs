//! `smelt bench` and `--device` on a machine with or without a GPU: `auto` says what it
//! picked and runs; a GPU that is not there is a clear error, never a panic. Bench loads a
//! model as `smelt run` does: a Hugging Face folder, with or without `--isq`, like a GGUF.

mod common;

use std::path::Path;
use std::process::Command;

use common::{model, smelt, smelt_ok, SMOLLM};

#[test]
fn bench_auto_runs_and_says_which_device() {
    let m = model(SMOLLM);
    let out = smelt(&[
        "bench",
        "--model",
        m.to_str().expect("UTF-8 path"),
        "--device",
        "auto",
        "--prompt",
        "8",
        "--gen",
        "3",
        "--reps",
        "1",
        "--threads",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("device auto:"),
        "no note on stderr: {stderr}"
    );
    let j: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON line");
    assert!(j["prompt_tok_s"].as_f64().unwrap() > 0.0);
    assert!(j["decode_tok_s"].as_f64().unwrap() > 0.0);
    let device = j["device"].as_str().unwrap();
    if smelt_engine::Device::auto().device == smelt_engine::Device::Cpu {
        assert_eq!(device, "cpu");
        assert!(stderr.contains("using the CPU"), "{stderr}");
    } else {
        assert!(device.starts_with("cuda:0"), "{device}");
    }
}

#[test]
fn a_missing_gpu_is_a_clear_error() {
    let m = model(SMOLLM);
    for cmd in ["bench", "run"] {
        let mut args = vec![
            cmd,
            "--model",
            m.to_str().expect("UTF-8 path"),
            "--device",
            "cuda:4096",
        ];
        if cmd == "run" {
            args.extend(["--prompt", "hi", "--max-tokens", "1"]);
        }
        let out = smelt(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} succeeded without GPU 4096");
        assert!(!stderr.contains("panicked"), "{cmd} panicked: {stderr}");
        assert!(
            stderr.contains("--device cuda:4096") && stderr.contains("CUDA"),
            "{cmd}: {stderr}"
        );
    }
}

#[test]
fn bench_kernels_needs_a_gpu_and_bad_devices_are_refused() {
    let out = smelt(&["bench", "--kernels", "--device", "cpu"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a CUDA device"));
    let out = smelt(&["bench", "--model", "x.gguf", "--device", "tpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("expected auto, cpu, cuda or cuda:N"),
        "{stderr}"
    );
}

/// `smelt bench --json` on the CPU with `args` added; the parsed JSON line.
fn bench_json(m: &str, args: &[&str]) -> serde_json::Value {
    bench_out(m, args).0
}

/// [`bench_json`], and what the command said on stderr.
fn bench_out(m: &str, args: &[&str]) -> (serde_json::Value, String) {
    let mut all = vec![
        "bench",
        "--model",
        m,
        "--device",
        "cpu",
        "--reps",
        "1",
        "--threads",
        "2",
        "--json",
    ];
    all.extend(args);
    let out = smelt(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "smelt {all:?}: {stderr}");
    let j =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON line");
    (j, stderr)
}

#[test]
fn bench_batch_decodes_every_sequence_and_matches_one_alone() {
    let m = model(SMOLLM);
    let m = m.to_str().expect("UTF-8 path");
    // Three 20-token prompts in steps of at most 8 tokens (shared and cut), 5 steps of 3 rows.
    let many = bench_json(
        m,
        &[
            "--batch", "3", "--prompt", "20", "--gen", "5", "--ubatch", "8",
        ],
    );
    assert_eq!(many["batch"], 3);
    assert_eq!(many["ubatch"], 8);
    let agg = many["decode_tok_s"].as_f64().unwrap();
    assert!(agg > 0.0 && many["prompt_tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(many["batch_decode_tok_s"].as_f64().unwrap(), agg);
    let per_seq = many["seq_decode_tok_s"].as_f64().unwrap();
    assert!((per_seq * 3.0 - agg).abs() < 1e-6 * agg, "{many}");
    assert!(many["ttft_ms"].as_f64().unwrap() > 0.0);
    let digests = many["seq_token_digests"].as_array().unwrap();
    assert_eq!(digests.len(), 3, "{many}");
    assert_ne!(
        digests[0], digests[1],
        "sequences got the same prompt: {many}"
    );

    // Sequence 0 alone, its prompt in one step: the same greedy tokens (the CPU computes each
    // row on its own, whatever else is in the step and however the prompt was cut).
    let one = bench_json(m, &["--prompt", "20", "--gen", "5"]);
    assert_eq!(one["batch"], 1);
    assert_eq!(one["seq_token_digests"][0], digests[0], "{one}\n{many}");
}

#[test]
fn bench_refuses_empty_batches_and_steps() {
    let m = model(SMOLLM);
    for flag in ["--batch", "--ubatch"] {
        let out = smelt(&[
            "bench",
            "--model",
            m.to_str().expect("UTF-8 path"),
            "--device",
            "cpu",
            flag,
            "0",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} 0 was accepted");
        assert!(stderr.contains("must be at least 1"), "{flag}: {stderr}");
    }
}

/// A Hugging Face folder (`smelt synth`'s two-layer Qwen3 in bf16, written as a folder by
/// scripts/oracle/hf_folder.py) benches as `smelt run` loads it: converted in memory, giving
/// the GGUF's tokens; with `--isq q8_0` quantized as it loads, giving the tokens of the file
/// `smelt quantize --type q8_0` writes. Bench used to open the path as a GGUF file only.
#[test]
fn bench_loads_hugging_face_folders_with_and_without_isq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| {
        dir.path()
            .join(name)
            .to_str()
            .expect("UTF-8 path")
            .to_string()
    };
    let (gguf, folder, q8_file) = (path("qwen3-tiny.gguf"), path("qwen3-tiny"), path("q8.gguf"));
    smelt_ok(&[
        "synth",
        "--shape",
        "qwen3-tiny",
        "--quant",
        "bf16",
        "--tokenizer-from",
        model(SMOLLM).to_str().expect("UTF-8 path"),
        "-o",
        &gguf,
    ]);
    let st = Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oracle/hf_folder.py"))
        .args([&gguf, &folder])
        .args(["--hf-arch", "Qwen3ForCausalLM", "--f32-vectors"])
        .status()
        .expect("runs hf_folder.py");
    assert!(st.success(), "hf_folder.py failed");
    smelt_ok(&["quantize", &folder, &q8_file, "--type", "q8_0"]);

    let shape = ["--prompt", "8", "--gen", "3"];
    let (file, _) = bench_out(&gguf, &shape);
    let (bf16, err) = bench_out(&folder, &shape);
    assert!(err.contains("converted in memory"), "{err}");
    assert_eq!(bf16["model"], "qwen3-tiny");
    assert_eq!(bf16["seq_token_digests"], file["seq_token_digests"]);

    let (q8, err) = bench_out(&folder, &[&shape[..], &["--isq", "q8_0"]].concat());
    assert!(err.contains("quantized to q8_0"), "{err}");
    let (q8_ref, _) = bench_out(&q8_file, &shape);
    assert_eq!(q8["seq_token_digests"], q8_ref["seq_token_digests"]);
    assert!(q8["decode_tok_s"].as_f64().unwrap() > 0.0);
}
