//! A Qwen3-MoE Hugging Face folder (per-expert matrices, as HF stores them) must load as the
//! GGUF convert_hf_to_gguf.py writes for it: its experts stacked into one 3-D tensor per
//! projection and layer, the router in F32, the `expert_*` keys. The reference is a small
//! bf16 qwen3moe GGUF (scripts/oracle/hf_folder.py `qwen3moe-gguf`: SmolLM2's tokenizer,
//! embeddings and first two layers' attention, random experts), and the folder is written
//! from it by the same script, so every tensor must come back byte for byte.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use smelt_gguf::{GgmlType, Gguf};
use smelt_load::{CpuQuantizer, TensorSource};

mod common;
use common::{
    assert_same_metadata, assert_same_tensors, edit_json, load_err, python, root, scratch,
    EveryMatrix,
};

/// The reference GGUF and the folder written from it (once per test process, fresh each
/// run, under the git-ignored `.models/hf-test/`).
fn paths() -> &'static (PathBuf, PathBuf) {
    static PATHS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PATHS.get_or_init(|| {
        let dir = root().join(".models/hf-test");
        std::fs::create_dir_all(&dir).expect("creates .models/hf-test");
        let gguf = dir.join("qwen3moe-tiny-bf16.gguf");
        let folder = dir.join("qwen3moe-tiny-bf16");
        let script = root().join("scripts/oracle/hf_folder.py");
        let run = |args: &[&std::ffi::OsStr]| {
            let st = Command::new(python())
                .arg(&script)
                .args(args)
                .status()
                .expect("runs scripts/oracle/hf_folder.py");
            assert!(st.success(), "hf_folder.py {args:?} failed: {st}");
        };
        run(&[
            "qwen3moe-gguf".as_ref(),
            common::smollm2_path().as_os_str(),
            gguf.as_os_str(),
        ]);
        run(&[gguf.as_os_str(), folder.as_os_str()]);
        (gguf, folder)
    })
}

#[test]
fn qwen3moe_folder_loads_as_the_gguf_convert_writes() {
    let (gguf, folder) = paths();
    let orig = Gguf::open(gguf).expect("opens the reference");
    let conv = smelt_load::open(folder, None, &CpuQuantizer).expect("loads the folder");
    assert_same_metadata(&orig, &conv);
    let cm = conv.metadata();
    assert_eq!(cm.get_u64("qwen3moe.expert_count"), Some(4));
    assert_same_tensors(&orig, &conv);
    let stacked = orig.tensors().iter().filter(|t| t.shape.len() == 3).count();
    assert_eq!(stacked, 2 * 3, "gate, up and down experts of two layers");
    assert_eq!(
        conv.tensor("blk.1.ffn_gate_inp.weight").map(|t| t.ty),
        Some(GgmlType::F32),
        "the router stays F32"
    );

    // The same bytes make the same logits, bit for bit.
    let (a, b) = (common::last_logits(orig), common::last_logits(conv));
    assert!(a.iter().any(|&x| x != 0.0));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "logits differ"
    );
}

#[test]
fn qwen3moe_experts_quantize_and_read_in_pieces() {
    let (_, folder) = paths();
    let bf16 = smelt_load::open(folder, None, &CpuQuantizer).expect("loads bf16");
    let q8 = smelt_load::open(folder, Some(&EveryMatrix(GgmlType::Q8_0)), &CpuQuantizer)
        .expect("loads with ISQ");
    let mut experts = 0;
    for t in bf16.tensors().iter().filter(|t| t.shape.len() == 3) {
        common::assert_q8_0_of_bf16(&bf16, &q8, &t.name);
        experts += 1;
    }
    assert_eq!(experts, 6);

    // The pipelined quantizer's chunked reads of a stack cross expert boundaries.
    let m = smelt_load::hf::open(folder).expect("opens");
    let src = &m.source;
    let mut stacks = 0;
    for (i, t) in src.tensors().iter().enumerate() {
        if t.shape.len() != 3 {
            continue;
        }
        stacks += 1;
        let whole = src.data(i).expect("data");
        for piece in [whole.len(), 1000, 36_865] {
            let mut got = vec![0u8; whole.len()];
            for (k, part) in got.chunks_mut(piece).enumerate() {
                src.read(i, (k * piece) as u64, part).expect("reads");
            }
            assert!(got == whole.as_ref(), "{} in pieces of {piece}", t.name);
        }
        assert!(src.read(i, whole.len() as u64, &mut [0u8; 4]).is_err());
    }
    assert_eq!(stacks, 6);
}

#[test]
fn broken_qwen3moe_folders_are_clear_errors() {
    let (_, folder) = paths();
    // More experts than the checkpoint holds: the router's shape says so first.
    let d = scratch(folder);
    edit_json(&d.path().join("config.json"), |v| {
        v["num_experts"] = serde_json::json!(5);
    });
    let e = load_err(d.path());
    assert!(
        e.contains("mlp.gate.weight") && e.contains("[5, 576]"),
        "{e}"
    );

    // An expert's matrix missing (renamed in the safetensors header: same length).
    let d = scratch(folder);
    let st = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&st).expect("reads");
    let (from, to) = (
        b"model.layers.1.mlp.experts.3.up_proj.weight",
        b"model.layers.1.mlp.experts.9.up_proj.weight",
    );
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the header names expert 3");
    bytes[at..at + to.len()].copy_from_slice(to);
    std::fs::remove_file(&st).expect("unlinks");
    std::fs::write(&st, bytes).expect("writes");
    let e = load_err(d.path());
    assert!(e.contains("expert 3 of 4 is missing"), "{e}");

    let d = scratch(folder);
    edit_json(&d.path().join("config.json"), |v| {
        v["moe_intermediate_size"] = serde_json::json!(32);
    });
    let e = load_err(d.path());
    assert!(e.contains("experts.0.") && e.contains("32"), "{e}");

    let d = scratch(folder);
    edit_json(&d.path().join("config.json"), |v| {
        v["mlp_only_layers"] = serde_json::json!([1]);
    });
    let e = load_err(d.path());
    assert!(e.contains("dense layers"), "{e}");

    let d = scratch(folder);
    edit_json(&d.path().join("config.json"), |v| {
        v.as_object_mut().map(|o| o.remove("num_experts_per_tok"));
    });
    let e = load_err(d.path());
    assert!(e.contains("num_experts_per_tok"), "{e}");
}
