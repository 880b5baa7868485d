//! `smelt quantize` on a small llama-shaped F32 model written here: every exact format,
//! the llama.cpp presets' per-tensor types, and thread-count independence.

mod common;
use common::*;

use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, Normal};
use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};
use std::path::{Path, PathBuf};

const LAYERS: usize = 8;

/// One tensor of the toy model: its name, ggml shape and f32 values.
type Toy = (String, Vec<u64>, Vec<f32>);

/// A llama-shaped F32 model: `embd`-wide, 4 query heads sharing 1 KV head (GQA 4).
fn toy_model(dir: &Path, embd: u64) -> (PathBuf, Vec<Toy>) {
    let (ff, vocab, kv) = (2 * embd, 512u64, embd / 4);
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![embd, vocab]),
        ("output_norm.weight".into(), vec![embd]),
        ("output.weight".into(), vec![embd, vocab]),
    ];
    for i in 0..LAYERS {
        for (n, s) in [
            ("attn_norm.weight", vec![embd]),
            ("attn_q.weight", vec![embd, embd]),
            ("attn_k.weight", vec![embd, kv]),
            ("attn_v.weight", vec![embd, kv]),
            ("attn_output.weight", vec![embd, embd]),
            ("ffn_norm.weight", vec![embd]),
            ("ffn_gate.weight", vec![embd, ff]),
            ("ffn_up.weight", vec![embd, ff]),
            ("ffn_down.weight", vec![ff, embd]),
        ] {
            shapes.push((format!("blk.{i}.{n}"), s));
        }
    }
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("llama".into()));
    md.insert("general.name", Value::String("toy".into()));
    md.insert("llama.block_count", Value::U32(LAYERS as u32));
    md.insert("llama.embedding_length", Value::U32(embd as u32));
    md.insert("llama.feed_forward_length", Value::U32(ff as u32));
    md.insert("llama.attention.head_count", Value::U32(4));
    md.insert("llama.attention.head_count_kv", Value::U32(1));
    md.insert("general.file_type", Value::U32(0));
    let mut rng = StdRng::seed_from_u64(42);
    let normal = Normal::new(0.0f32, 0.02).expect("normal");
    let tensors: Vec<Toy> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product::<u64>() as usize;
            let vals = if shape.len() == 1 {
                (0..n).map(|i| 1.0 + i as f32 * 1e-3).collect()
            } else {
                (0..n).map(|_| normal.sample(&mut rng)).collect()
            };
            (name, shape, vals)
        })
        .collect();
    let specs = tensors
        .iter()
        .map(|(name, shape, _)| TensorSpec {
            name: name.clone(),
            ty: GgmlType::F32,
            shape: shape.clone(),
        })
        .collect();
    let path = dir.join(format!("toy-{embd}.gguf"));
    let mut w = GgufWriter::create(&path, &md, specs).expect("create toy model");
    for (name, _, vals) in &tensors {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_tensor(name, &bytes).expect("write tensor");
    }
    w.finish().expect("finish toy model");
    (path, tensors)
}

fn quantize(input: &Path, out: &Path, ty: &str, extra: &[&str]) -> Gguf {
    let mut args = vec![
        "quantize",
        input.to_str().expect("path"),
        out.to_str().expect("path"),
        "--type",
        ty,
    ];
    args.extend_from_slice(extra);
    smelt_ok(&args);
    Gguf::open(out).expect("output reads back")
}

fn dequantize(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.tensor(name).expect("tensor present");
    let row = t.shape[0] as usize;
    let data = g.tensor_data(t);
    let row_bytes = data.len() / t.n_rows() as usize;
    let mut out = vec![0f32; t.n_elements() as usize];
    for (dst, src) in out.chunks_mut(row).zip(data.chunks(row_bytes)) {
        smelt_quant::dequantize_row(t.ty, src, dst).expect("dequantize");
    }
    out
}

fn rel_rmse(a: &[f32], b: &[f32]) -> f64 {
    let err: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let sig: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
    (err / sig).sqrt()
}

#[test]
fn every_exact_type_round_trips_closely() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, tensors) = toy_model(dir.path(), 256);
    // Relative RMS error bounds for N(0, 0.02) weights, about 1.5x what each format gives.
    let formats = [
        ("f32", GgmlType::F32, 0.0),
        ("f16", GgmlType::F16, 1e-3),
        ("bf16", GgmlType::BF16, 6e-3),
        ("q8_0", GgmlType::Q8_0, 0.01),
        ("q6_k", GgmlType::Q6_K, 0.03),
        ("q5_1", GgmlType::Q5_1, 0.06),
        ("q5_0", GgmlType::Q5_0, 0.06),
        ("q5_k", GgmlType::Q5_K, 0.06),
        ("q4_1", GgmlType::Q4_1, 0.12),
        ("q4_0", GgmlType::Q4_0, 0.12),
        ("q4_k", GgmlType::Q4_K, 0.12),
        ("q3_k", GgmlType::Q3_K, 0.25),
        ("q2_k", GgmlType::Q2_K, 0.5),
    ];
    for (name, ty, bound) in formats {
        let out = dir.path().join(format!("out-{name}.gguf"));
        let g = quantize(&input, &out, name, &[]);
        assert_eq!(g.tensors().len(), tensors.len());
        let mut worst = 0.0f64;
        for ((tname, shape, src), info) in tensors.iter().zip(g.tensors()) {
            assert_eq!(&info.name, tname, "file order kept");
            assert_eq!(&info.shape, shape, "{tname}");
            let want = if shape.len() == 1 { GgmlType::F32 } else { ty };
            assert_eq!(info.ty, want, "{name}: {tname}");
            let e = rel_rmse(src, &dequantize(&g, tname));
            if shape.len() == 1 {
                assert_eq!(e, 0.0, "{tname}: vectors stay exact");
            }
            worst = worst.max(e);
        }
        eprintln!("{name}: worst relative RMS error {worst:.5}");
        assert!(
            worst <= bound,
            "{name}: relative RMS error {worst} > {bound}"
        );
        assert_eq!(
            g.metadata().get_u64("general.quantization_version"),
            Some(2)
        );
        assert_eq!(
            g.metadata().get_str("general.name"),
            Some("toy"),
            "metadata kept"
        );
    }
}

fn types_of(g: &Gguf) -> std::collections::BTreeMap<String, GgmlType> {
    g.tensors().iter().map(|t| (t.name.clone(), t.ty)).collect()
}

#[test]
fn presets_pick_llama_cpp_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 256);

    let g = quantize(&input, &dir.path().join("q4_k_m.gguf"), "q4_k_m", &[]);
    let t = types_of(&g);
    assert_eq!(g.metadata().get_u64("general.file_type"), Some(15));
    // use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2.
    for i in 0..LAYERS {
        let more = [0, 3, 6, 7].contains(&i);
        let want = if more { GgmlType::Q6_K } else { GgmlType::Q4_K };
        assert_eq!(t[&format!("blk.{i}.attn_v.weight")], want, "attn_v {i}");
        assert_eq!(t[&format!("blk.{i}.ffn_down.weight")], want, "ffn_down {i}");
        assert_eq!(t[&format!("blk.{i}.attn_k.weight")], GgmlType::Q4_K);
        assert_eq!(t[&format!("blk.{i}.ffn_up.weight")], GgmlType::Q4_K);
        assert_eq!(t[&format!("blk.{i}.attn_norm.weight")], GgmlType::F32);
    }
    assert_eq!(t["output.weight"], GgmlType::Q6_K);
    assert_eq!(t["token_embd.weight"], GgmlType::Q4_K);
    assert_eq!(t["output_norm.weight"], GgmlType::F32);

    let g = quantize(&input, &dir.path().join("q2_k.gguf"), "q2_k", &["--preset"]);
    let t = types_of(&g);
    assert_eq!(g.metadata().get_u64("general.file_type"), Some(10));
    assert_eq!(
        t["blk.3.attn_v.weight"],
        GgmlType::Q4_K,
        "GQA 4 bumps attn_v to Q4_K"
    );
    assert_eq!(t["blk.3.ffn_down.weight"], GgmlType::Q3_K);
    assert_eq!(t["blk.3.attn_output.weight"], GgmlType::Q3_K);
    assert_eq!(t["blk.3.attn_q.weight"], GgmlType::Q2_K);
    assert_eq!(t["output.weight"], GgmlType::Q6_K);

    let g = quantize(&input, &dir.path().join("q4_0.gguf"), "q4_0", &["--preset"]);
    let t = types_of(&g);
    assert_eq!(
        t["output.weight"],
        GgmlType::Q6_K,
        "llama.cpp keeps the output in Q6_K"
    );
    assert_eq!(t["blk.0.attn_v.weight"], GgmlType::Q4_0);
    assert_eq!(g.metadata().get_u64("general.file_type"), Some(2));

    let g = quantize(&input, &dir.path().join("q3_k_m.gguf"), "q3_k_m", &[]);
    let t = types_of(&g);
    assert_eq!(t["blk.0.attn_v.weight"], GgmlType::Q5_K);
    assert_eq!(t["blk.2.attn_v.weight"], GgmlType::Q4_K);
    assert_eq!(
        t["blk.0.ffn_down.weight"],
        GgmlType::Q4_K,
        "layer 0 < 8/16 is false"
    );
    assert_eq!(t["blk.0.attn_output.weight"], GgmlType::Q4_K);
    assert_eq!(t["blk.0.ffn_gate.weight"], GgmlType::Q3_K);
}

#[test]
fn ragged_rows_fall_back_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 96);
    let out = dir.path().join("ragged.gguf");
    let run = smelt(&[
        "quantize",
        input.to_str().expect("p"),
        out.to_str().expect("p"),
        "--type",
        "q4_k_m",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("not a multiple of 256"), "{err}");
    let t = types_of(&Gguf::open(&out).expect("reads"));
    assert_eq!(t["blk.1.attn_q.weight"], GgmlType::Q5_0);
    assert_eq!(
        t["blk.0.attn_v.weight"],
        GgmlType::Q8_0,
        "Q6_K falls back to Q8_0"
    );
    assert_eq!(t["output.weight"], GgmlType::Q8_0);
    // ffn_down rows are 192 long: still not a multiple of 256.
    assert_eq!(t["blk.1.ffn_down.weight"], GgmlType::Q5_0);

    let g = quantize(&input, &dir.path().join("q3.gguf"), "q3_k", &[]);
    assert_eq!(
        types_of(&g)["blk.1.attn_q.weight"],
        GgmlType::Q4_0,
        "no IQ4_NL in smelt"
    );
}

#[test]
fn thread_count_does_not_change_a_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 256);
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    quantize(&input, &a, "q4_k_m", &["--threads", "1"]);
    quantize(&input, &b, "q4_k_m", &["--threads", "3"]);
    assert!(std::fs::read(a).expect("a") == std::fs::read(b).expect("b"));
}

#[test]
fn bad_requests_are_clean_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 256);
    let i = input.to_str().expect("p");
    let o = dir.path().join("o.gguf");
    let o = o.to_str().expect("p");
    for (args, want) in [
        (vec!["quantize", i, o, "--type", "q7_x"], "unknown type"),
        (vec!["quantize", i, o, "--type", "iq4_nl"], "unknown type"),
        (
            vec!["quantize", i, o, "--type", "q4_k", "--preset"],
            "no llama.cpp mixture preset",
        ),
        (vec!["quantize", i, i, "--type", "q8_0"], "different file"),
        (
            vec!["quantize", "/nonexistent.gguf", o, "--type", "q8_0"],
            "nonexistent.gguf",
        ),
    ] {
        let out = smelt(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            !err.contains("panicked") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_failed_run_leaves_no_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A model whose fourth tensor holds a NaN: quantization stops there.
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("llama".into()));
    let names = ["a.weight", "b.weight", "c.weight", "d.weight"];
    let specs = names
        .iter()
        .map(|n| TensorSpec {
            name: (*n).into(),
            ty: GgmlType::F32,
            shape: vec![32, 4],
        })
        .collect();
    let input = dir.path().join("nan.gguf");
    let mut w = GgufWriter::create(&input, &md, specs).expect("create");
    for (i, n) in names.iter().enumerate() {
        let mut vals = vec![0.5f32; 128];
        if i == 3 {
            vals[37] = f32::NAN;
        }
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_tensor(n, &bytes).expect("write");
    }
    w.finish().expect("finish");

    let out = dir.path().join("out.gguf");
    let run = smelt(&[
        "quantize",
        input.to_str().expect("p"),
        out.to_str().expect("p"),
        "--type",
        "q8_0",
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(err.contains("d.weight") && err.contains("NaN"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("nan.gguf")],
        "no output and no .partial left"
    );
}

/// With stderr not a terminal (a log, CI), `smelt quantize` draws no progress bar: its stderr
/// is one summary line saying what it read and wrote, how long it took and how fast.
#[test]
fn stderr_off_a_terminal_is_one_summary_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 256);
    let out = dir.path().join("q.gguf");
    let o = smelt(&[
        "quantize",
        input.to_str().expect("path"),
        out.to_str().expect("path"),
        "--type",
        "q8_0",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8(o.stderr).expect("UTF-8");
    assert!(
        !err.contains('\r') && !err.contains('\x1b'),
        "a bar drew: {err:?}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let size = std::fs::metadata(&input).expect("input").len() as f64 / 1e9;
    // "wrote OUT (q8_0, cpu): N tensors, A -> B (P%); read X GB, wrote Y GB in S s (R GB/s), T s in all"
    let summary = lines[0].split("; ").nth(1).expect("summary after '; '");
    let nums: Vec<f64> = summary
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        summary.starts_with("read ") && summary.contains(" GB/s)"),
        "{summary}"
    );
    let (read, wrote) = (nums[0], nums[1]);
    assert!(
        (read - size).abs() < 0.011,
        "read {read} GB of a {size} GB file"
    );
    assert!(wrote > 0.0 && wrote < read, "{summary}");
    assert!(lines[0].contains("(q8_0, cpu)"), "{}", lines[0]);
}

/// On a terminal (a pseudo-terminal here), `smelt quantize` draws a progress bar of bytes in
/// decimal units with the rate and the time left, clears it, and ends with the summary line;
/// `-v` adds where the time went.
#[test]
fn on_a_terminal_a_bar_shows_gb_the_rate_and_the_time_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, _) = toy_model(dir.path(), 512);
    let out = dir.path().join("q.gguf");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"));
    cmd.args(["quantize", "-v", "--type", "q6_k"])
        .arg(&input)
        .arg(&out)
        .env("TERM", "xterm");
    let mut s = rexpect::session::spawn_with_options(
        cmd,
        rexpect::session::Options::new()
            .timeout_ms(Some(60_000))
            .strip_ansi_escape_codes(true),
    )
    .expect("smelt starts on a pseudo-terminal");
    let text = s.exp_eof().expect("smelt quantize ends");
    let bar = text
        .split(['\r', '\n'])
        .find(|l| l.starts_with("quantize ["))
        .unwrap_or_else(|| panic!("no bar drawn: {text:?}"));
    assert!(
        bar.contains("B/") && bar.contains("B/s, eta "),
        "bar {bar:?} in {text:?}"
    );
    assert!(
        !bar.contains("iB"),
        "decimal units like the summary: {bar:?}"
    );
    assert!(
        text.contains("wrote ") && text.contains(" GB/s), "),
        "{text:?}"
    );
    assert!(
        text.contains("stages: ") && text.contains("writer"),
        "-v says where the time went: {text:?}"
    );
    assert!(out.is_file());
}
