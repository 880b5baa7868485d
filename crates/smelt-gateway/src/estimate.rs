//! What a catalogue model will take on a node before any node has loaded it (and reported
//! its own figure): the GGUF file's size plus its KV cache at the context it is served with,
//! from the file's header (layers, KV heads, head sizes), as `smelt serve` sizes the cache:
//! f32 keys and values for every layer. Only the header is read (the file is memory-mapped).

use std::path::Path;

/// The context a node serves with when the catalogue does not say (`smelt serve --ctx`'s
/// default).
pub const DEFAULT_CTX: u64 = 4096;

/// Bytes of one token's keys and values over every layer, from the GGUF header.
pub fn kv_bytes_per_token(gguf: &smelt_gguf::Gguf) -> Option<u64> {
    let m = gguf.metadata();
    let arch = m.architecture()?;
    let key = |k: &str| format!("{arch}.{k}");
    let n_layer = m.get_u64(&key("block_count"))?;
    let n_embd = m.get_u64(&key("embedding_length"))?;
    let n_head = m.get_u64(&key("attention.head_count")).filter(|&h| h > 0)?;
    let n_head_kv = m.get_u64(&key("attention.head_count_kv")).unwrap_or(n_head);
    let k_len = m
        .get_u64(&key("attention.key_length"))
        .unwrap_or(n_embd / n_head);
    let v_len = m.get_u64(&key("attention.value_length")).unwrap_or(k_len);
    Some(n_layer * n_head_kv * (k_len + v_len) * 4)
}

/// The file's size plus its KV cache at `ctx` tokens; `None` when `path` is not a GGUF file
/// the gateway can read (an alias, a folder, a file on another machine).
pub fn model_bytes(path: &Path, ctx: u64) -> Option<u64> {
    if !path.is_file() {
        return None;
    }
    let g = smelt_gguf::Gguf::open(path).ok()?;
    let kv = kv_bytes_per_token(&g).unwrap_or(0);
    Some(g.file_size().saturating_add(kv.saturating_mul(ctx)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_gguf::{Metadata, Value};

    #[test]
    fn kv_cache_from_the_header() {
        let mut m = Metadata::new();
        m.insert("general.architecture", Value::String("llama".into()));
        m.insert("llama.block_count", Value::U32(30));
        m.insert("llama.embedding_length", Value::U32(576));
        m.insert("llama.attention.head_count", Value::U32(9));
        m.insert("llama.attention.head_count_kv", Value::U32(3));
        let w = smelt_gguf::GgufWriter::new(Vec::new(), &m, Vec::new()).expect("a header");
        let bytes = w.finish().expect("a GGUF with no tensors");
        let g = smelt_gguf::Gguf::from_bytes(bytes).expect("reads back");
        // SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) x 4 bytes.
        assert_eq!(kv_bytes_per_token(&g), Some(30 * 3 * 128 * 4));
    }
}
