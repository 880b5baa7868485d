//! `config.json`: the hyperparameters convert_hf_to_gguf.py reads for the Llama family,
//! with its fallbacks (`head_dim` = hidden / heads, KV heads = heads).

use serde_json::{Map, Value as Json};

use crate::LoadError;

/// The architectures a folder can hold, and the GGUF architecture each becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfArch {
    /// LlamaForCausalLM and MistralForCausalLM: GGUF `llama`, Q/K rows permuted for rope.
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3MoeForCausalLM: Qwen3's attention, every FFN a routed mixture of experts
    /// (the experts stacked into one 3-D tensor per projection, as convert does).
    Qwen3Moe,
}

impl HfArch {
    pub fn from_name(name: &str) -> Result<Self, LoadError> {
        match name {
            "LlamaForCausalLM" | "MistralForCausalLM" => Ok(Self::Llama),
            "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "Qwen3ForCausalLM" => Ok(Self::Qwen3),
            "Qwen3MoeForCausalLM" => Ok(Self::Qwen3Moe),
            other => Err(LoadError::UnknownArchitecture { name: other.into() }),
        }
    }

    /// `general.architecture`.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
        }
    }

    /// Qwen3's per-head Q and K norms.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Qwen3Moe)
    }
}

/// The routed experts of a mixture-of-experts model (`num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub n_ff_exp: u64,
}

/// What the conversion needs from `config.json`.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: HfArch,
    /// The raw object (after lifting `text_config`), for optional keys.
    pub raw: Map<String, Json>,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    /// `head_dim` was in the file (convert then writes key/value lengths).
    pub head_dim_explicit: bool,
    pub vocab_size: Option<u64>,
    pub tie_word_embeddings: bool,
    /// The experts, for a mixture-of-experts architecture.
    pub moe: Option<Moe>,
}

fn bad(why: impl Into<String>) -> LoadError {
    LoadError::BadConfig { why: why.into() }
}

impl Config {
    pub fn parse(text: &str) -> Result<Self, LoadError> {
        let json: Json = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Json::Object(mut raw) = json else {
            return Err(bad("not a JSON object"));
        };
        if let Some(Json::Object(text)) = raw.get("text_config").cloned() {
            raw.extend(text);
        }
        let arch_name = raw
            .get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .ok_or_else(|| bad("no \"architectures\" list"))?;
        let arch = HfArch::from_name(arch_name)?;
        let req = |keys: &[&str]| -> Result<u64, LoadError> {
            find_u64(&raw, keys)?.ok_or_else(|| bad(format!("no {:?}", keys[0])))
        };
        let n_layer = req(&["num_hidden_layers", "n_layers", "n_layer", "num_layers"])?;
        let n_embd = req(&["hidden_size", "n_embd", "dim"])?;
        let n_ff = req(&["intermediate_size", "n_inner", "hidden_dim"])?;
        let n_head = req(&["num_attention_heads", "n_head", "n_heads"])?;
        let n_head_kv = find_u64(&raw, &["num_key_value_heads", "n_kv_heads"])?.unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "{n_head} attention heads cannot share {n_head_kv} key/value heads"
            )));
        }
        let explicit = find_u64(&raw, &["head_dim"])?;
        let head_dim = explicit.unwrap_or(n_embd / n_head);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(format!(
                "head size {head_dim} is not a positive even number"
            )));
        }
        let vocab_size = find_u64(&raw, &["vocab_size"])?;
        let tie_word_embeddings = raw
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let moe = match arch {
            HfArch::Qwen3Moe => Some(parse_moe(&raw, n_layer)?),
            _ => None,
        };
        Ok(Self {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_explicit: explicit.is_some(),
            vocab_size,
            tie_word_embeddings,
            moe,
            raw,
        })
    }

    pub fn f64(&self, keys: &[&str]) -> Option<f64> {
        keys.iter()
            .find_map(|k| self.raw.get(*k).and_then(|v| v.as_f64()))
    }

    pub fn u64(&self, keys: &[&str]) -> Option<u64> {
        keys.iter()
            .find_map(|k| self.raw.get(*k).and_then(|v| v.as_u64()))
    }

    /// `rope_parameters` (transformers 5) or `rope_scaling`, with `rope_theta` mirrored in
    /// as convert does.
    pub fn rope(&self) -> Map<String, Json> {
        let mut r = match self
            .raw
            .get("rope_parameters")
            .or_else(|| self.raw.get("rope_scaling"))
        {
            Some(Json::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        if let Some(Json::Object(full)) = r.get("full_attention").cloned() {
            r = full;
        }
        if !r.contains_key("rope_theta") {
            if let Some(t) = self.raw.get("rope_theta") {
                r.insert("rope_theta".into(), t.clone());
            }
        }
        if !r.contains_key("rope_type") {
            if let Some(t) = r.get("type").cloned() {
                r.insert("rope_type".into(), t);
            }
        }
        if !r.contains_key("original_max_position_embeddings") {
            if let Some(t) = self.raw.get("original_max_position_embeddings") {
                r.insert("original_max_position_embeddings".into(), t.clone());
            }
        }
        r
    }
}

/// The experts of a Qwen3-MoE config. Every layer must be a mixture-of-experts one: GGUF's
/// `qwen3moe` (llama.cpp's and smelt's) has no dense layers among them, so a config with
/// `mlp_only_layers` or a `decoder_sparse_step` over 1 is refused rather than misread.
fn parse_moe(raw: &Map<String, Json>, n_layer: u64) -> Result<Moe, LoadError> {
    let req = |k: &str| find_u64(raw, &[k])?.ok_or_else(|| bad(format!("no {k:?}")));
    let moe = Moe {
        n_expert: req("num_experts")?,
        n_expert_used: req("num_experts_per_tok")?,
        n_ff_exp: req("moe_intermediate_size")?,
    };
    if moe.n_expert_used == 0 || moe.n_expert_used > moe.n_expert || moe.n_ff_exp == 0 {
        return Err(bad(format!(
            "{} of {} experts per token, {} wide: not a mixture of experts",
            moe.n_expert_used, moe.n_expert, moe.n_ff_exp
        )));
    }
    let dense = raw
        .get("mlp_only_layers")
        .and_then(|v| v.as_array())
        .is_some_and(|a| !a.is_empty());
    let step = find_u64(raw, &["decoder_sparse_step"])?.unwrap_or(1);
    if dense || (step > 1 && n_layer > 1) {
        return Err(bad(
            "dense layers among the expert ones (mlp_only_layers, decoder_sparse_step): \
             GGUF's qwen3moe has none",
        ));
    }
    Ok(moe)
}

/// The first of `keys` present, as a whole number; present but not one is an error.
fn find_u64(raw: &Map<String, Json>, keys: &[&str]) -> Result<Option<u64>, LoadError> {
    for k in keys {
        if let Some(v) = raw.get(*k) {
            if v.is_null() {
                continue;
            }
            return v
                .as_u64()
                .map(Some)
                .ok_or_else(|| bad(format!("{k:?} is {v}, not a whole number")));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let c = Config::parse(
            r#"{"architectures":["MistralForCausalLM"],"num_hidden_layers":2,"hidden_size":64,
                "intermediate_size":128,"num_attention_heads":4,"vocab_size":10}"#,
        )
        .expect("parses");
        assert_eq!((c.arch, c.n_head_kv, c.head_dim), (HfArch::Llama, 4, 16));
        assert!(!c.head_dim_explicit);
        let e = Config::parse(r#"{"architectures":["GPT2LMHeadModel"]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GPT2LMHeadModel") && e.contains("not supported"),
            "{e}"
        );
        let e = Config::parse(r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_hidden_layers"), "{e}");
        let e = Config::parse(r#"{"architectures":["Qwen3ForCausalLM"],"num_hidden_layers":2,
            "hidden_size":64,"intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":3}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot share"), "{e}");
        let moe = |extra: &str| {
            Config::parse(&format!(
                r#"{{"architectures":["Qwen3MoeForCausalLM"],"num_hidden_layers":2,
                "hidden_size":64,"intermediate_size":128,"num_attention_heads":4{extra}}}"#
            ))
        };
        let c = moe(r#","num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32"#)
            .expect("parses");
        assert_eq!(
            c.moe,
            Some(Moe {
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 32
            })
        );
        assert_eq!(c.arch.gguf_name(), "qwen3moe");
        let e = moe(r#","num_experts":8,"moe_intermediate_size":32"#).unwrap_err();
        assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
        let e = moe(r#","num_experts":2,"num_experts_per_tok":4,"moe_intermediate_size":32"#)
            .unwrap_err();
        assert!(e.to_string().contains("4 of 2 experts"), "{e}");
        let e = moe(
            r#","num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32,
            "mlp_only_layers":[1]"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("dense layers"), "{e}");
    }
}
