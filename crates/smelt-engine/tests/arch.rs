//! The architectures without a real model here (Llama with Llama 3 rope factors, Qwen2,
//! Qwen3) run end to end on tiny random GGUFs written in memory: every tensor is found,
//! shapes check, and a prompt in one batch gives the same logits as token by token.
//! Unknown architectures and missing tensors are clear errors.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use smelt_engine::{Engine, EngineError, EngineOptions, Logits, SeqInput};
use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};

const E: usize = 64;
const FF: usize = 96;
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 16;
const VOCAB: usize = 100;
const LAYERS: usize = 2;

fn tiny(arch: &str, skip: Option<&str>) -> Arc<Gguf> {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::from(arch));
    let k = |s: &str| format!("{arch}.{s}");
    m.insert(k("embedding_length"), Value::U32(E as u32));
    m.insert(k("block_count"), Value::U32(LAYERS as u32));
    m.insert(k("feed_forward_length"), Value::U32(FF as u32));
    m.insert(k("attention.head_count"), Value::U32(HEADS as u32));
    m.insert(k("attention.head_count_kv"), Value::U32(KV as u32));
    m.insert(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    m.insert(k("rope.freq_base"), Value::F32(500000.0));
    m.insert(k("context_length"), Value::U32(256));
    let mut t: Vec<(String, GgmlType, Vec<u64>)> = vec![
        (
            "token_embd.weight".into(),
            GgmlType::Q8_0,
            vec![E as u64, VOCAB as u64],
        ),
        ("output_norm.weight".into(), GgmlType::F32, vec![E as u64]),
    ];
    if arch == "llama" {
        t.push((
            "rope_freqs.weight".into(),
            GgmlType::F32,
            vec![(HD / 2) as u64],
        ));
    } else {
        t.push((
            "output.weight".into(),
            GgmlType::F16,
            vec![E as u64, VOCAB as u64],
        ));
    }
    for il in 0..LAYERS {
        let n = |s: &str| format!("blk.{il}.{s}");
        let mat =
            |s: &str, cols: usize, rows: usize, ty| (n(s), ty, vec![cols as u64, rows as u64]);
        t.push((n("attn_norm.weight"), GgmlType::F32, vec![E as u64]));
        t.push(mat("attn_q.weight", E, HEADS * HD, GgmlType::Q8_0));
        t.push(mat("attn_k.weight", E, KV * HD, GgmlType::Q4_0));
        t.push(mat("attn_v.weight", E, KV * HD, GgmlType::F16));
        t.push(mat("attn_output.weight", HEADS * HD, E, GgmlType::Q5_1));
        t.push((n("ffn_norm.weight"), GgmlType::F32, vec![E as u64]));
        t.push(mat("ffn_gate.weight", E, FF, GgmlType::Q4_1));
        t.push(mat("ffn_up.weight", E, FF, GgmlType::F32));
        t.push(mat("ffn_down.weight", FF, E, GgmlType::Q8_0));
        if arch == "qwen2" {
            t.push((n("attn_q.bias"), GgmlType::F32, vec![(HEADS * HD) as u64]));
            t.push((n("attn_k.bias"), GgmlType::F32, vec![(KV * HD) as u64]));
            t.push((n("attn_v.bias"), GgmlType::F32, vec![(KV * HD) as u64]));
        }
        if arch == "qwen3" {
            t.push((n("attn_q_norm.weight"), GgmlType::F32, vec![HD as u64]));
            t.push((n("attn_k_norm.weight"), GgmlType::F32, vec![HD as u64]));
        }
    }
    t.retain(|(name, _, _)| Some(name.as_str()) != skip);
    let specs = t
        .iter()
        .map(|(name, ty, shape)| TensorSpec {
            name: name.clone(),
            ty: *ty,
            shape: shape.clone(),
        })
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &m, specs).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (name, ty, shape) in &t {
        let cols = shape[0] as usize;
        let rows = shape.get(1).copied().unwrap_or(1) as usize;
        let norm = name.contains("norm") || name.contains("rope_freqs");
        let mut bytes = Vec::new();
        for _ in 0..rows {
            let row: Vec<f32> = (0..cols)
                .map(|_| {
                    if norm {
                        rng.gen_range(0.8..1.2)
                    } else {
                        rng.gen_range(-0.3..0.3)
                    }
                })
                .collect();
            let mut out = vec![0u8; ty.type_size() * cols / ty.block_size()];
            smelt_quant::quantize_row(*ty, &row, &mut out).unwrap();
            bytes.extend(out);
        }
        w.write_tensor(name, &bytes).unwrap();
    }
    Arc::new(Gguf::from_bytes(w.finish().unwrap()).unwrap())
}

fn opts() -> EngineOptions {
    EngineOptions {
        threads: Some(2),
        kv_tokens: 128,
        block_size: 4,
        ..EngineOptions::default()
    }
}

#[test]
fn tiny_models_run_and_batch_equals_token_by_token() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let mut e = Engine::from_gguf(tiny(arch, None), &opts()).unwrap();
        assert_eq!(e.info().arch.name(), arch);
        let prompt = vec![3u32, 14, 15, 92, 65, 35, 89];
        let s = e.new_sequence();
        let all = e
            .forward(&[SeqInput {
                seq: s,
                tokens: prompt.clone(),
                logits: Logits::All,
            }])
            .unwrap();
        let t = e.new_sequence();
        for (i, &tok) in prompt.iter().enumerate() {
            let one = e
                .forward(&[SeqInput {
                    seq: t,
                    tokens: vec![tok],
                    logits: Logits::Last,
                }])
                .unwrap();
            assert_eq!(one[0][0], all[0][i], "{arch} position {i}");
            assert!(one[0][0].iter().all(|v| v.is_finite()), "{arch}");
        }
        // The logits depend on the prefix (attention and rope are live).
        assert_ne!(all[0][5], all[0][6], "{arch}");
    }
}

#[test]
fn unknown_architecture_and_missing_tensor_are_named() {
    let err = Engine::from_gguf(tiny("mamba", None), &opts())
        .err()
        .unwrap();
    assert!(
        matches!(&err, EngineError::UnknownArchitecture(a) if a == "mamba"),
        "{err}"
    );
    let err = Engine::from_gguf(tiny("qwen3", Some("blk.1.attn_k_norm.weight")), &opts())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("blk.1.attn_k_norm.weight"),
        "{err}"
    );
    let err = Engine::from_gguf(tiny("qwen2", Some("blk.0.attn_v.bias")), &opts())
        .err()
        .unwrap();
    assert!(err.to_string().contains("blk.0.attn_v.bias"), "{err}");
}
