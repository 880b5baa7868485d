//! `smelt synth` without llama.cpp: determinism and refusals.

mod common;
use common::*;

#[test]
fn same_seed_same_file_whatever_the_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    let c = dir.path().join("c.gguf");
    for (out, threads, seed) in [(&a, "1", "5"), (&b, "2", "5"), (&c, "2", "6")] {
        smelt_ok(&[
            "synth",
            "--shape",
            "qwen2.5-0.5b",
            "--layers",
            "1",
            "--quant",
            "f16",
            "--threads",
            threads,
            "--seed",
            seed,
            "-o",
            out.to_str().expect("p"),
        ]);
    }
    let (a, b, c) = (
        std::fs::read(a).expect("a"),
        std::fs::read(b).expect("b"),
        std::fs::read(c).expect("c"),
    );
    assert!(a == b, "thread count changed the file");
    assert!(a != c, "the seed did not change the file");
}

#[test]
fn every_shape_and_format_plans_and_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m.gguf");
    for shape in [
        "llama3-8b",
        "llama3-1b",
        "qwen3-32b",
        "qwen2.5-0.5b",
        "mistral-7b",
        "llama2-7b",
    ] {
        // One layer and the smallest format keep this quick; the vocabulary is full size.
        smelt_ok(&[
            "synth",
            "--shape",
            shape,
            "--layers",
            "1",
            "--quant",
            "q2_k",
            "-o",
            out.to_str().expect("p"),
        ]);
        let j = inspect_json(&out);
        let arch = j["metadata"]["general.architecture"]
            .as_str()
            .expect("arch")
            .to_string();
        assert_eq!(j["metadata"][format!("{arch}.block_count")], 1, "{shape}");
        let vocab = j["metadata"][format!("{arch}.vocab_size")]
            .as_u64()
            .expect("vocab");
        let types = tensor_types(&j);
        assert_eq!(types["token_embd.weight"].1[1], vocab, "{shape}");
    }
}

#[test]
fn bad_requests_are_clean_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m.gguf");
    let o = out.to_str().expect("p");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"nope").expect("write");
    for (args, want) in [
        (
            vec!["synth", "--shape", "gpt5", "--quant", "q4_k", "-o", o],
            "known shapes",
        ),
        (
            vec!["synth", "--shape", "llama3-8b", "--quant", "q9", "-o", o],
            "unknown type",
        ),
        (
            vec![
                "synth",
                "--shape",
                "llama3-8b",
                "--quant",
                "q4_k",
                "--layers",
                "0",
                "-o",
                o,
            ],
            "--layers",
        ),
        (
            vec![
                "synth",
                "--shape",
                "llama3-8b",
                "--quant",
                "q4_k",
                "--tokenizer-from",
                garbage.to_str().expect("p"),
                "-o",
                o,
            ],
            "garbage.gguf",
        ),
    ] {
        let run = smelt(&args);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{args:?}");
        assert!(
            !err.contains("panicked") && err.contains(want),
            "{args:?}: {err}"
        );
    }
    assert!(!out.exists());
}
