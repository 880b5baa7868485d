//! The two real test models: known facts, and a full comparison with gguf-py's reading.

mod common;

use smelt_gguf::{GgmlType, Gguf, Value};

const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

#[test]
fn smollm2_known_facts() {
    let g = Gguf::open(common::model(SMOLLM)).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    let m = g.metadata();
    assert_eq!(m.architecture(), Some("llama"));
    assert_eq!(m.get_u64("llama.block_count"), Some(30));
    assert_eq!(m.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(m.get_u64("llama.attention.head_count_kv"), Some(3));
    assert_eq!(m.get_f32("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(m.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    assert_eq!(m.get_str("tokenizer.ggml.model"), Some("gpt2"));
    let tokens = m.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        m.get("general.languages").unwrap().type_name(),
        "array[string]"
    );

    assert_eq!(g.tensors().len(), 272);
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ty, embd.shape.as_slice()),
        (GgmlType::Q8_0, &[576, 49152][..])
    );
    assert_eq!((embd.offset, embd.n_bytes()), (0, 30081024));
    assert_eq!((embd.row_len(), embd.n_rows()), (576, 49152));
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.ty, q.shape.as_slice()),
        (GgmlType::Q4_1, &[576, 576][..])
    );
    let norm = g.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!(
        (norm.ty, norm.shape.as_slice()),
        (GgmlType::F32, &[576][..])
    );
    // The norm weights are plain f32s: read one through the zero-copy view.
    let data = g.tensor_data(norm);
    assert_eq!(data.len(), 576 * 4);
    let first = f32::from_le_bytes(data[..4].try_into().unwrap());
    assert!(first.is_finite() && first != 0.0);
    assert!(g.tensor("no.such.tensor").is_none());
}

#[test]
fn gemma3_known_facts() {
    let g = Gguf::open(common::model(GEMMA)).unwrap();
    let m = g.metadata();
    assert_eq!(m.architecture(), Some("gemma3"));
    assert_eq!(m.get_u64("gemma3.block_count"), Some(18));
    assert_eq!(m.get_u64("gemma3.embedding_length"), Some(640));
    assert_eq!(m.get_u64("gemma3.attention.sliding_window"), Some(512));
    assert_eq!(m.get_u64("general.file_type"), Some(15));
    assert_eq!(m.get_array("tokenizer.ggml.tokens").unwrap().len(), 262144);
    assert!(matches!(
        m.get("tokenizer.ggml.scores"),
        Some(Value::Array(smelt_gguf::Array::F32(v))) if v.len() == 262144
    ));

    assert_eq!(g.tensors().len(), 236);
    let check = |name: &str, ty: GgmlType, shape: &[u64]| {
        let t = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((t.ty, t.shape.as_slice()), (ty, shape), "{name}");
        assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes(), "{name}");
    };
    check("token_embd.weight", GgmlType::Q8_0, &[640, 262144]);
    check("blk.0.attn_k.weight", GgmlType::Q5_0, &[640, 256]);
    check("blk.0.attn_output.weight", GgmlType::Q4_K, &[1024, 640]);
    check("blk.0.ffn_down.weight", GgmlType::Q6_K, &[2048, 640]);
    check("output_norm.weight", GgmlType::F32, &[640]);
    assert_eq!(g.tensors()[0].name, "output_norm.weight");
}

#[test]
fn smollm2_matches_gguf_py() {
    common::assert_matches_gguf_py(&common::model(SMOLLM));
}

#[test]
fn gemma3_matches_gguf_py() {
    common::assert_matches_gguf_py(&common::model(GEMMA));
}
