//! Hugging Face folders of the Qwen hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) must load as
//! the GGUF convert_hf_to_gguf.py (llama.cpp 0c1e570, `--no-mtp`) writes for them: the
//! delta-net metadata, `in_proj_qkvz` regrouped, value heads tiled for Qwen3.5, `A_log`
//! as -exp, norms + 1, the MTP head and vision tower dropped. The reference GGUFs are small
//! random ones in convert's layout (scripts/oracle/hf_folder.py `hybrid-gguf`: SmolLM2's
//! tokenizer and embeddings), each folder is written from its GGUF by the same script
//! (which checks its inverse against a numpy port of convert's transforms), so every tensor
//! must come back byte for byte, and the logits bit for bit.

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

/// One architecture's reference: how its GGUF and its folder are written.
struct Case {
    arch: &'static str,
    gguf_args: &'static [&'static str],
    folder_args: &'static [&'static str],
}

/// Qwen3-Next: interval 3 (delta, delta, attention), per-expert matrices, an MTP head.
const NEXT: Case = Case {
    arch: "qwen3next",
    gguf_args: &[],
    folder_args: &["--mtp"],
};
/// Qwen3.5 as its image-text checkpoint (text_config, `model.language_model.`, a vision
/// tower, an MTP head), layer_types not periodic, mrope_section in rope_parameters.
const Q35: Case = Case {
    arch: "qwen35",
    gguf_args: &["--layers", "4", "--layer-types"],
    folder_args: &["--hf-arch", "Qwen3_5ForConditionalGeneration", "--mtp"],
};
/// Qwen3.5-MoE as transformers 5 stores it (fused 3-D experts), no intermediate_size, no
/// mrope_section (convert's default sections).
const Q35MOE: Case = Case {
    arch: "qwen35moe",
    gguf_args: &["--layers", "4", "--layer-types", "--no-ff"],
    folder_args: &["--fused-experts", "--default-mrope"],
};

/// The reference GGUF and the folder written from it (once per test process, fresh each
/// run, under the git-ignored `.models/hf-test/`).
fn paths(case: &Case) -> &'static (PathBuf, PathBuf) {
    static CELLS: [OnceLock<(PathBuf, PathBuf)>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let cell = match case.arch {
        "qwen3next" => &CELLS[0],
        "qwen35" => &CELLS[1],
        _ => &CELLS[2],
    };
    cell.get_or_init(|| {
        let dir = root().join(".models/hf-test");
        std::fs::create_dir_all(&dir).expect("creates .models/hf-test");
        let gguf = dir.join(format!("{}-tiny-bf16.gguf", case.arch));
        let folder = dir.join(format!("{}-tiny-bf16", case.arch));
        let script = root().join("scripts/oracle/hf_folder.py");
        let run = |args: Vec<&std::ffi::OsStr>| {
            let st = Command::new(python())
                .arg(&script)
                .args(&args)
                .status()
                .expect("runs scripts/oracle/hf_folder.py");
            assert!(st.success(), "hf_folder.py {args:?} failed: {st}");
        };
        let smol = common::smollm2_path();
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "hybrid-gguf".as_ref(),
            case.arch.as_ref(),
            smol.as_os_str(),
            gguf.as_os_str(),
        ];
        args.extend(case.gguf_args.iter().map(std::ffi::OsStr::new));
        run(args);
        let mut args = vec![gguf.as_os_str(), folder.as_os_str()];
        args.extend(case.folder_args.iter().map(std::ffi::OsStr::new));
        run(args);
        (gguf, folder)
    })
}

fn loads_as_the_gguf_convert_writes(case: &Case) {
    let (gguf, folder) = paths(case);
    let orig = Gguf::open(gguf).expect("opens the reference");
    let conv = smelt_load::open(folder, None, &CpuQuantizer).expect("loads the folder");
    assert_same_metadata(&orig, &conv);
    let cm = conv.metadata();
    assert_eq!(
        cm.get_u64(&format!("{}.ssm.time_step_rank", case.arch)),
        Some(4)
    );
    assert_same_tensors(&orig, &conv);
    assert_eq!(
        conv.tensor("blk.1.ssm_a").map(|t| t.ty),
        Some(GgmlType::F32),
        "-exp(A_log) is F32"
    );

    // The same bytes make the same logits, bit for bit.
    let (a, b) = (common::last_logits(orig), common::last_logits(conv));
    assert!(a.iter().any(|&x| x != 0.0) && a.iter().all(|x| x.is_finite()));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "logits differ"
    );
}

#[test]
fn qwen3next_folder_loads_as_the_gguf_convert_writes() {
    loads_as_the_gguf_convert_writes(&NEXT);
}

#[test]
fn qwen35_folder_loads_as_the_gguf_convert_writes() {
    loads_as_the_gguf_convert_writes(&Q35);
}

#[test]
fn qwen35moe_folder_loads_as_the_gguf_convert_writes() {
    loads_as_the_gguf_convert_writes(&Q35MOE);
}

/// ISQ Q8_0 of every matrix is smelt-quant's Q8_0 of the bf16 load, and every tensor read in
/// pieces (the pipelined quantizer's chunks, across rows and regrouped segments) is the
/// tensor read whole.
fn quantizes_and_reads_in_pieces(case: &Case) {
    let (_, folder) = paths(case);
    let bf16 = smelt_load::open(folder, None, &CpuQuantizer).expect("loads bf16");
    let q8 = smelt_load::open(folder, Some(&EveryMatrix(GgmlType::Q8_0)), &CpuQuantizer)
        .expect("loads with ISQ");
    let mut quantized = 0;
    for t in bf16.tensors().iter().filter(|t| t.ty == GgmlType::BF16) {
        common::assert_q8_0_of_bf16(&bf16, &q8, &t.name);
        quantized += 1;
    }
    assert!(quantized > 10, "{quantized} matrices");

    let m = smelt_load::hf::open(folder).expect("opens");
    let src = &m.source;
    for (i, t) in src.tensors().iter().enumerate() {
        let whole = src.data(i).expect("data");
        for piece in [whole.len(), 1000, 77] {
            let mut got = vec![0u8; whole.len()];
            for (k, part) in got.chunks_mut(piece).enumerate() {
                src.read(i, (k * piece) as u64, part).expect("reads");
            }
            assert!(got == whole.as_ref(), "{} in pieces of {piece}", t.name);
        }
        assert!(src.read(i, whole.len() as u64, &mut [0u8; 4]).is_err());
    }
}

#[test]
fn qwen3next_quantizes_and_reads_in_pieces() {
    quantizes_and_reads_in_pieces(&NEXT);
}

#[test]
fn qwen35_quantizes_and_reads_in_pieces() {
    quantizes_and_reads_in_pieces(&Q35);
}

#[test]
fn qwen35moe_quantizes_and_reads_in_pieces() {
    quantizes_and_reads_in_pieces(&Q35MOE);
}

/// Renames a tensor in a scratch folder's safetensors header (`from` and `to` of one
/// length, so the header's size stays).
fn rename_tensor(dir: &std::path::Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let st = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&st).expect("reads");
    let quoted = format!("\"{from}\"");
    let at = bytes
        .windows(quoted.len())
        .position(|w| w == quoted.as_bytes())
        .unwrap_or_else(|| panic!("the header names {from}"));
    bytes[at + 1..at + 1 + to.len()].copy_from_slice(to.as_bytes());
    std::fs::remove_file(&st).expect("unlinks");
    std::fs::write(&st, bytes).expect("writes");
}

#[test]
fn broken_hybrid_folders_are_clear_errors() {
    let (_, next) = paths(&NEXT);
    let (_, q35) = paths(&Q35);
    let (_, q35moe) = paths(&Q35MOE);

    // The layer pattern disagrees with the tensors: layer 1 holds delta-net tensors.
    let d = scratch(next);
    edit_json(&d.path().join("config.json"), |v| {
        v["full_attention_interval"] = serde_json::json!(2);
    });
    let e = load_err(d.path());
    assert!(
        e.contains("model.layers.1.") && e.contains("layer 1 is full attention"),
        "{e}"
    );

    let d = scratch(q35);
    edit_json(&d.path().join("config.json"), |v| {
        v["text_config"]["layer_types"] = serde_json::json!(["linear_attention"]);
    });
    let e = load_err(d.path());
    assert!(e.contains("layer_types has 1 entries for 4 layers"), "{e}");

    let d = scratch(q35);
    edit_json(&d.path().join("config.json"), |v| {
        v["text_config"]["layer_types"][1] = serde_json::json!("sliding_attention");
    });
    let e = load_err(d.path());
    assert!(e.contains("sliding_attention"), "{e}");

    let d = scratch(next);
    edit_json(&d.path().join("config.json"), |v| {
        v.as_object_mut()
            .map(|o| o.remove("linear_num_value_heads"));
    });
    let e = load_err(d.path());
    assert!(e.contains("linear_num_value_heads"), "{e}");

    let d = scratch(next);
    edit_json(&d.path().join("config.json"), |v| {
        v["linear_num_value_heads"] = serde_json::json!(3);
    });
    let e = load_err(d.path());
    assert!(e.contains("3 linear value heads cannot share 2"), "{e}");

    // A delta-net tensor the config's sizes do not fit.
    let d = scratch(q35moe);
    edit_json(&d.path().join("config.json"), |v| {
        v["linear_value_head_dim"] = serde_json::json!(32);
    });
    let e = load_err(d.path());
    assert!(
        e.contains("linear_attn.") && e.contains("config.json implies"),
        "{e}"
    );

    // Qwen3-Next's fused in_proj_qkvz under a Qwen3.5 architecture.
    let d = scratch(next);
    edit_json(&d.path().join("config.json"), |v| {
        v["architectures"] = serde_json::json!(["Qwen3_5MoeForCausalLM"]);
    });
    let e = load_err(d.path());
    assert!(
        e.contains("not a tensor of a qwen35moe model") && e.contains("linear_attn.in_proj_"),
        "{e}"
    );

    // A delta-net tensor gone (renamed into the dropped MTP head).
    let d = scratch(next);
    rename_tensor(
        d.path(),
        "model.layers.0.linear_attn.A_log",
        "mtp.layers.000.linear_attn.A_log",
    );
    let e = load_err(d.path());
    assert!(e.contains("blk.0.ssm_a") && e.contains("missing"), "{e}");

    // Fused experts narrower than config.json says.
    let d = scratch(q35moe);
    edit_json(&d.path().join("config.json"), |v| {
        v["moe_intermediate_size"] = serde_json::json!(32);
    });
    let e = load_err(d.path());
    assert!(e.contains("mlp.experts.") && e.contains("32"), "{e}");

    // A shared expert narrower than config.json says.
    let d = scratch(q35moe);
    edit_json(&d.path().join("config.json"), |v| {
        v["shared_expert_intermediate_size"] = serde_json::json!(128);
    });
    let e = load_err(d.path());
    assert!(e.contains("shared_expert") && e.contains("128"), "{e}");
}
