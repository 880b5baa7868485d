//! A Hugging Face model folder (config.json, tokenizer files, safetensors) turned into the
//! GGUF llama.cpp's convert_hf_to_gguf.py writes for it: the same metadata keys, tensor
//! names, the Q/K row permutation of Llama-style rope, and `rope_freqs` for Llama 3 scaling.
//! Weights keep their dtype (convert's `--outtype auto`, except that F32 stays F32); 1-D
//! tensors, norms and a mixture of experts' routers become F32, as convert makes them; the
//! experts' matrices become one 3-D tensor per projection, as convert's Qwen2MoeModel makes
//! them (experts.rs); the Qwen hybrids' delta-net layers are converted as its
//! Qwen3NextModel converts them (hybrid.rs).

pub mod config;
mod experts;
mod hybrid;
mod source;
mod spm;
pub mod vocab;

use std::borrow::Cow;
use std::path::Path;

use smelt_gguf::{Array, GgmlType, Metadata, Value};

use crate::isq::SourceTensor;
use crate::safetensors::{Checkpoint, StTensor};
use crate::LoadError;
use config::{Config, HfArch};
pub use source::HfSource;
use source::{F32Op, Gather, Recipe};

/// A folder ready to assemble: the GGUF metadata and where each tensor comes from.
pub struct HfModel {
    pub metadata: Metadata,
    pub source: HfSource,
}

pub fn open(dir: &Path) -> Result<HfModel, LoadError> {
    let cfg_path = dir.join("config.json");
    if !cfg_path.is_file() {
        return Err(LoadError::Missing {
            path: cfg_path,
            what: "config.json",
        });
    }
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| LoadError::io(&cfg_path, e))?;
    let cfg = Config::parse(&text)?;
    let ckpt = Checkpoint::open(dir)?;
    let (tensors, recipes, file_type) = plan_tensors(&cfg, &ckpt)?;

    let mut md = Metadata::new();
    let arch = cfg.arch.gguf_name();
    md.insert("general.architecture", Value::from(arch));
    md.insert("general.type", Value::from("model"));
    if let Some(name) = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
    {
        md.insert("general.name", Value::String(name));
    }
    hparams(&cfg, &mut md)?;
    md.insert("general.file_type", Value::U32(file_type));
    vocab::convert(
        &vocab::VocabInput {
            dir,
            vocab_size: cfg.vocab_size,
            arch,
            config: &cfg.raw,
        },
        &mut md,
    )?;
    md.insert("general.quantization_version", Value::U32(2));
    let st = ckpt.tensors().to_vec();
    Ok(HfModel {
        metadata: md,
        source: HfSource {
            ckpt,
            st,
            tensors,
            recipes,
        },
    })
}

/// `TextModel.set_gguf_parameters` plus the Llama, mixture-of-experts and hybrid additions.
fn hparams(cfg: &Config, md: &mut Metadata) -> Result<(), LoadError> {
    let a = cfg.arch.gguf_name();
    let k = |s: &str| format!("{a}.{s}");
    let u32v = |v: u64| Value::U32(v as u32);
    md.insert(k("block_count"), u32v(cfg.n_layer));
    if let Some(n) = cfg.u64(&[
        "max_position_embeddings",
        "n_ctx",
        "n_positions",
        "max_length",
        "max_sequence_length",
        "model_max_length",
    ]) {
        md.insert(k("context_length"), u32v(n));
    }
    md.insert(k("embedding_length"), u32v(cfg.n_embd));
    if let Some(n) = cfg.n_ff {
        md.insert(k("feed_forward_length"), u32v(n));
    }
    md.insert(k("attention.head_count"), u32v(cfg.n_head));
    if cfg.u64(&["num_key_value_heads", "n_kv_heads"]).is_some() {
        md.insert(k("attention.head_count_kv"), u32v(cfg.n_head_kv));
    }
    let rope = cfg.rope();
    if let Some(t) = rope.get("rope_type").and_then(|t| t.as_str()) {
        let factor = rope.get("factor").and_then(|f| f.as_f64());
        match (t, factor) {
            ("linear", Some(f)) => {
                md.insert(k("rope.scaling.type"), Value::from("linear"));
                md.insert(k("rope.scaling.factor"), Value::F32(f as f32));
            }
            ("yarn", Some(f)) => {
                md.insert(k("rope.scaling.type"), Value::from("yarn"));
                md.insert(k("rope.scaling.factor"), Value::F32(f as f32));
                if let Some(n) = rope
                    .get("original_max_position_embeddings")
                    .and_then(|v| v.as_u64())
                {
                    md.insert(k("rope.scaling.original_context_length"), u32v(n));
                }
                for (src, dst) in [
                    ("extrapolation_factor", "rope.scaling.yarn_ext_factor"),
                    ("attention_factor", "rope.scaling.yarn_attn_factor"),
                    ("beta_fast", "rope.scaling.yarn_beta_fast"),
                    ("beta_slow", "rope.scaling.yarn_beta_slow"),
                ] {
                    if let Some(v) = rope.get(src).and_then(|v| v.as_f64()) {
                        md.insert(k(dst), Value::F32(v as f32));
                    }
                }
            }
            ("su" | "longrope", _) => {
                md.insert(k("rope.scaling.type"), Value::from("longrope"));
            }
            _ => {}
        }
    }
    if let Some(sec) = cfg.rope_parameters().get("mrope_section") {
        // Padded with zeros to 4, as convert writes it (an i32 array).
        let bad = || LoadError::BadConfig {
            why: format!("mrope_section is {sec}, not a list of whole numbers"),
        };
        let mut v = sec
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|x| {
                x.as_i64()
                    .and_then(|x| i32::try_from(x).ok())
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<i32>, _>>()?;
        v.resize(v.len().max(4), 0);
        v.truncate(4);
        md.insert(k("rope.dimension_sections"), Value::Array(Array::I32(v)));
    }
    if let Some(theta) = rope.get("rope_theta").and_then(|t| t.as_f64()) {
        md.insert(k("rope.freq_base"), Value::F32(theta as f32));
    }
    if let Some(eps) = cfg.f64(&["rms_norm_eps", "norm_eps"]) {
        md.insert(
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(eps as f32),
        );
    }
    if cfg.head_dim_explicit {
        md.insert(k("attention.key_length"), u32v(cfg.head_dim));
        md.insert(k("attention.value_length"), u32v(cfg.head_dim));
    }
    if let Some(m) = cfg.moe {
        md.insert(k("expert_count"), u32v(m.n_expert));
        md.insert(k("expert_used_count"), u32v(m.n_expert_used));
        md.insert(k("expert_feed_forward_length"), u32v(m.n_ff_exp));
        if let Some(n) = m.n_ff_shared {
            md.insert(k("expert_shared_feed_forward_length"), u32v(n));
        }
    }
    if let Some(h) = &cfg.hybrid {
        hybrid::hparams(cfg, h, md);
    }
    if cfg.arch == HfArch::Llama {
        if let Some(v) = cfg.vocab_size {
            md.insert(k("vocab_size"), u32v(v));
        }
        md.insert(k("rope.dimension_count"), u32v(cfg.head_dim));
    }
    Ok(())
}

/// Llama 3's per-dimension rope factors (convert's `generate_extra_tensors`), as f32 bytes.
fn llama3_rope_freqs(cfg: &Config) -> Option<Vec<u8>> {
    let rope = cfg.rope();
    if !rope
        .get("rope_type")
        .and_then(|t| t.as_str())
        .is_some_and(|t| t.eq_ignore_ascii_case("llama3"))
    {
        return None;
    }
    let get = |k: &str, d: f64| rope.get(k).and_then(|v| v.as_f64()).unwrap_or(d);
    let base = get("rope_theta", 10000.0);
    let dim = cfg.head_dim;
    let factor = get("factor", 8.0);
    let low = get("low_freq_factor", 1.0);
    let high = get("high_freq_factor", 4.0);
    let old_ctx = get("original_max_position_embeddings", 8192.0);
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let mut out = Vec::with_capacity(dim as usize * 2);
    for i in (0..dim).step_by(2) {
        // torch: 1 / base ** (arange(0, dim, 2, f32) / dim), computed in f32.
        let freq = 1.0f32 / (base as f32).powf(i as f32 / dim as f32);
        let wavelen = 2.0 * std::f64::consts::PI / f64::from(freq);
        let f = if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let smooth = (old_ctx / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        out.extend_from_slice(&(f as f32).to_le_bytes());
    }
    Some(out)
}

/// A checkpoint name as convert maps it: `text_model.` dropped, and `language_model.`
/// (an image-text model's text side) wherever it appears.
fn normalized(name: &str) -> Cow<'_, str> {
    let name = name.strip_prefix("text_model.").unwrap_or(name);
    match name.contains("language_model.") {
        true => Cow::Owned(name.replace("language_model.", "")),
        false => Cow::Borrowed(name),
    }
}

/// The GGUF name of a (normalized) checkpoint tensor, or `None` for tensors convert drops:
/// rope caches, and for the hybrids the multi-token-prediction head (`--no-mtp`) and a
/// Qwen3.5 image-text model's vision tower.
fn gguf_name(arch: HfArch, name: &str) -> Result<Option<String>, LoadError> {
    if name.ends_with(".rotary_emb.inv_freq") {
        return Ok(None);
    }
    if arch.is_hybrid() && (name.starts_with("mtp.") || name.starts_with("model.mtp.")) {
        return Ok(None);
    }
    if matches!(arch, HfArch::Qwen35 | HfArch::Qwen35Moe) && name.contains("visual.") {
        return Ok(None);
    }
    let fixed = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Ok(Some(f.to_string()));
    }
    let unknown = || LoadError::BadTensor {
        name: name.to_string(),
        why: format!("no GGUF name for it in a {} model", arch.gguf_name()),
    };
    let rest = name.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (bid, rest) = rest.split_once('.').ok_or_else(unknown)?;
    let bid: u64 = bid.parse().map_err(|_| unknown())?;
    let (base, suffix) = rest.rsplit_once('.').ok_or_else(unknown)?;
    let part = match base {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if arch.is_hybrid() => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "self_attn.q_norm" if arch.has_qk_norm() => "attn_q_norm",
        "self_attn.k_norm" if arch.has_qk_norm() => "attn_k_norm",
        "mlp.gate" if arch.is_moe() => "ffn_gate_inp",
        "mlp.shared_expert.gate_proj" if arch.is_hybrid() => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" if arch.is_hybrid() => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" if arch.is_hybrid() => "ffn_down_shexp",
        "mlp.shared_expert_gate" if arch.is_hybrid() => "ffn_gate_inp_shexp",
        _ => return Err(unknown()),
    };
    if suffix != "weight" && suffix != "bias" {
        return Err(unknown());
    }
    Ok(Some(format!("blk.{bid}.{part}.{suffix}")))
}

/// The shape config.json implies for a tensor (PyTorch order), when it implies one.
fn expected_shape(cfg: &Config, gguf: &str, vocab: u64) -> Option<Vec<u64>> {
    let (e, hd) = (cfg.n_embd, cfg.head_dim);
    let q = cfg.n_head * hd;
    // The hybrids' attention: a sigmoid gate per query row, interleaved per head.
    let gated = if cfg.arch.is_hybrid() { 2 } else { 1 };
    let shared = cfg.moe.and_then(|m| m.n_ff_shared);
    let kv = cfg.n_head_kv * hd;
    if gguf == "token_embd.weight" || gguf == "output.weight" {
        return Some(vec![vocab, e]);
    }
    if gguf == "output_norm.weight" {
        return Some(vec![e]);
    }
    let part = gguf.splitn(3, '.').nth(2)?;
    Some(match part {
        "attn_norm.weight" | "ffn_norm.weight" | "post_attention_norm.weight" => vec![e],
        "attn_q.weight" => vec![gated * q, e],
        "attn_k.weight" | "attn_v.weight" => vec![kv, e],
        "attn_q.bias" => vec![q],
        "attn_k.bias" | "attn_v.bias" => vec![kv],
        "attn_output.weight" => vec![e, q],
        "ffn_gate.weight" | "ffn_up.weight" => vec![cfg.n_ff?, e],
        "ffn_down.weight" => vec![e, cfg.n_ff?],
        "attn_q_norm.weight" | "attn_k_norm.weight" => vec![hd],
        "ffn_gate_inp.weight" => vec![cfg.moe?.n_expert, e],
        "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => vec![shared?, e],
        "ffn_down_shexp.weight" => vec![e, shared?],
        "ffn_gate_inp_shexp.weight" => vec![1, e],
        _ => return None,
    })
}

type Planned = (Vec<SourceTensor>, Vec<Recipe>, u32);

/// The tensor's GGML type, once its bytes fit its shape (and the shape is `want`).
fn checked(ckpt: &Checkpoint, t: &StTensor, want: Option<Vec<u64>>) -> Result<GgmlType, LoadError> {
    if let Some(want) = want {
        if t.shape != want {
            return Err(LoadError::ShapeMismatch {
                name: t.name.clone(),
                got: t.shape.clone(),
                want,
            });
        }
    }
    let ty = t.ggml_type()?;
    let n: u64 = t.shape.iter().product();
    let bytes = ckpt.bytes(t).len() as u64;
    if bytes != n * ty.type_size() as u64 {
        return Err(LoadError::BadTensor {
            name: t.name.clone(),
            why: format!("{bytes} bytes for {n} {} values", t.dtype),
        });
    }
    Ok(ty)
}

/// The layer of a GGUF name (`blk.{b}.*`).
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn plan_tensors(cfg: &Config, ckpt: &Checkpoint) -> Result<Planned, LoadError> {
    let mut tensors = Vec::new();
    let mut recipes = Vec::new();
    if let Some(bytes) = llama3_rope_freqs(cfg) {
        tensors.push(SourceTensor {
            name: "rope_freqs.weight".into(),
            shape: vec![cfg.head_dim / 2],
            ty: GgmlType::F32,
        });
        recipes.push(Recipe::Owned(bytes));
    }
    let vocab = match cfg.vocab_size {
        Some(v) => v,
        None => ckpt
            .get("model.embed_tokens.weight")
            .or_else(|| ckpt.get("model.language_model.embed_tokens.weight"))
            .and_then(|t| t.shape.first().copied())
            .unwrap_or(0),
    };
    let mut weight_type: Option<GgmlType> = None;
    // Per-expert matrices by (layer, projection): (expert, checkpoint index).
    let mut experts: std::collections::BTreeMap<(u64, String), Vec<(u64, usize)>> =
        Default::default();
    for (i, t) in ckpt.tensors().iter().enumerate() {
        let hf = normalized(&t.name);
        if let Some(moe) = cfg.moe {
            if let Some((bid, xid, proj)) = experts::expert_matrix(&hf) {
                experts
                    .entry((bid, proj.to_string()))
                    .or_default()
                    .push((xid, i));
                continue;
            }
            if let Some((bid, proj)) = experts::fused_matrix(&hf) {
                for (st, recipe) in experts::fused(cfg, ckpt, moe, i, bid, proj)? {
                    weight_type.get_or_insert(st.ty);
                    tensors.push(st);
                    recipes.push(recipe);
                }
                continue;
            }
        }
        if let Some(h) = &cfg.hybrid {
            if let Some(planned) = hybrid::plan(cfg, h, ckpt, i, &hf)? {
                for (st, recipe) in planned {
                    if matches!(recipe, Recipe::Copy { .. }) {
                        weight_type.get_or_insert(st.ty);
                    }
                    tensors.push(st);
                    recipes.push(recipe);
                }
                continue;
            }
        }
        let Some(name) = gguf_name(cfg.arch, &hf)? else {
            continue;
        };
        if let Some(bid) = layer_of(&name) {
            if bid >= cfg.n_layer {
                return Err(LoadError::BadTensor {
                    name: t.name.clone(),
                    why: format!("layer {bid}, but config.json has {} layers", cfg.n_layer),
                });
            }
            if let Some(h) = &cfg.hybrid {
                let part = name.split('.').nth(2).unwrap_or("");
                if matches!(
                    part,
                    "attn_q" | "attn_k" | "attn_v" | "attn_output" | "attn_q_norm" | "attn_k_norm"
                ) {
                    hybrid::check_kind(h, bid, false, &t.name)?;
                }
            }
        }
        let ty = checked(ckpt, t, expected_shape(cfg, &name, vocab))?;
        let shape: Vec<u64> = t.shape.iter().rev().copied().collect();
        // convert's undo_permute: Q and K (weights and biases) of Llama-style rope.
        let heads = match (cfg.arch, name.rsplit('.').nth(1)) {
            (HfArch::Llama, Some("attn_q")) => Some(cfg.n_head),
            (HfArch::Llama, Some("attn_k")) => Some(cfg.n_head_kv),
            _ => None,
        };
        let gather = match heads {
            Some(h) => {
                let rows = t.shape.first().copied().unwrap_or(1);
                let row = ckpt.bytes(t).len() / rows.max(1) as usize;
                Some(
                    Gather::rope(row, rows, h).map_err(|why| LoadError::BadTensor {
                        name: t.name.clone(),
                        why,
                    })?,
                )
            }
            None => None,
        };
        // convert keeps a mixture of experts' routers in F32 (`FFN_GATE_INP`,
        // `FFN_GATE_INP_SHEXP`).
        let to_f32 = t.shape.len() <= 1
            || name.ends_with("_norm.weight")
            || name.ends_with("ffn_gate_inp.weight")
            || name.ends_with("ffn_gate_inp_shexp.weight")
            || !name.ends_with(".weight");
        if to_f32 {
            // The hybrids' RMS norms hold w for a scale of 1 + w: convert adds the 1.
            let op = match cfg.arch.is_hybrid() && hf.ends_with("norm.weight") {
                true => F32Op::AddOne,
                false => F32Op::Keep,
            };
            tensors.push(SourceTensor {
                name,
                shape,
                ty: GgmlType::F32,
            });
            recipes.push(Recipe::ToF32 { src: i, gather, op });
            continue;
        }
        weight_type.get_or_insert(ty);
        tensors.push(SourceTensor { name, shape, ty });
        recipes.push(Recipe::Copy { src: i, gather });
    }
    if let Some(moe) = cfg.moe {
        for ((bid, proj), mut list) in experts {
            let stacked = experts::stack(cfg, ckpt, moe, bid, &proj, &mut list)?;
            weight_type.get_or_insert(stacked.0.ty);
            tensors.push(stacked.0);
            recipes.push(stacked.1);
        }
    }
    check_complete(cfg, &tensors)?;
    let file_type = match weight_type {
        Some(GgmlType::F16) => 1,
        Some(GgmlType::BF16) => 32,
        _ => 0,
    };
    Ok((tensors, recipes, file_type))
}

/// Every tensor llama.cpp needs is there, and no GGUF name is made twice (a layer's
/// experts both fused and per expert, say).
fn check_complete(cfg: &Config, tensors: &[SourceTensor]) -> Result<(), LoadError> {
    let mut have = std::collections::HashSet::new();
    for t in tensors {
        if !have.insert(t.name.as_str()) {
            return Err(LoadError::BadTensor {
                name: t.name.clone(),
                why: "made from more than one checkpoint tensor".into(),
            });
        }
    }
    let mut required = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    for b in 0..cfg.n_layer {
        if let Some(h) = &cfg.hybrid {
            required.extend(hybrid::required(cfg, h, b));
            continue;
        }
        let ffn: &[&str] = match cfg.moe {
            Some(_) => &[
                "ffn_gate_inp",
                "ffn_gate_exps",
                "ffn_up_exps",
                "ffn_down_exps",
            ],
            None => &["ffn_gate", "ffn_up", "ffn_down"],
        };
        for p in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
        ]
        .iter()
        .chain(ffn)
        {
            required.push(format!("blk.{b}.{p}.weight"));
        }
        if cfg.arch.has_qk_norm() {
            required.push(format!("blk.{b}.attn_q_norm.weight"));
            required.push(format!("blk.{b}.attn_k_norm.weight"));
        }
    }
    if let Some(missing) = required.iter().find(|r| !have.contains(r.as_str())) {
        return Err(LoadError::BadTensor {
            name: missing.clone(),
            why: "missing from the checkpoint".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_convert() {
        let n = |s| gguf_name(HfArch::Qwen3, s).expect("maps");
        assert_eq!(
            n("model.layers.3.self_attn.k_norm.weight").as_deref(),
            Some("blk.3.attn_k_norm.weight")
        );
        assert_eq!(
            n("model.layers.0.self_attn.q_proj.bias").as_deref(),
            Some("blk.0.attn_q.bias")
        );
        assert_eq!(n("model.layers.0.self_attn.rotary_emb.inv_freq"), None);
        assert!(gguf_name(HfArch::Llama, "model.layers.0.self_attn.q_norm.weight").is_err());
        assert_eq!(
            gguf_name(HfArch::Qwen3Moe, "model.layers.2.mlp.gate.weight")
                .expect("maps")
                .as_deref(),
            Some("blk.2.ffn_gate_inp.weight")
        );
        assert!(gguf_name(HfArch::Qwen3, "model.layers.2.mlp.gate.weight").is_err());
        assert!(gguf_name(HfArch::Llama, "vision_tower.x.weight").is_err());
        let q35 = |s| gguf_name(HfArch::Qwen35Moe, s).expect("maps");
        assert_eq!(
            q35("model.layers.1.post_attention_layernorm.weight").as_deref(),
            Some("blk.1.post_attention_norm.weight")
        );
        assert_eq!(
            q35("model.layers.1.mlp.shared_expert_gate.weight").as_deref(),
            Some("blk.1.ffn_gate_inp_shexp.weight")
        );
        assert_eq!(q35("mtp.fc.weight"), None);
        assert_eq!(q35("model.visual.blocks.0.attn.qkv.weight"), None);
        assert!(gguf_name(HfArch::Qwen3Moe, "mtp.fc.weight").is_err());
        assert_eq!(
            normalized("model.language_model.layers.0.mlp.gate.weight"),
            "model.layers.0.mlp.gate.weight"
        );
    }
}
