//! `smelt bench` and `--device` on a machine with or without a GPU: `auto` says what it
//! picked and runs; a GPU that is not there is a clear error, never a panic.

mod common;

use common::{model, smelt, SMOLLM};

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
