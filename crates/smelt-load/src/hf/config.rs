//! `config.json`: the hyperparameters convert_hf_to_gguf.py reads for the Llama family and
//! the Qwen hybrids, with its fallbacks (`head_dim` = hidden / heads, KV heads = heads,
//! `full_attention_interval` 4, a quarter of each head rotated).

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
    /// Qwen3NextForCausalLM: Gated DeltaNet layers with gated attention every few, experts
    /// and a gated shared expert in every FFN; `in_proj_qkvz` regrouped, value heads grouped.
    Qwen3Next,
    /// Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration (its text model): Qwen3-Next's
    /// layers with split projections, a dense FFN, value heads reordered to tiled.
    Qwen35,
    /// Qwen3_5MoeForCausalLM / Qwen3_5MoeForConditionalGeneration: Qwen3.5 with experts and
    /// a gated shared expert in every FFN.
    Qwen35Moe,
}

impl HfArch {
    pub fn from_name(name: &str) -> Result<Self, LoadError> {
        match name {
            "LlamaForCausalLM" | "MistralForCausalLM" => Ok(Self::Llama),
            "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "Qwen3ForCausalLM" => Ok(Self::Qwen3),
            "Qwen3MoeForCausalLM" => Ok(Self::Qwen3Moe),
            "Qwen3NextForCausalLM" => Ok(Self::Qwen3Next),
            "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => Ok(Self::Qwen35),
            "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => Ok(Self::Qwen35Moe),
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
            Self::Qwen3Next => "qwen3next",
            Self::Qwen35 => "qwen35",
            Self::Qwen35Moe => "qwen35moe",
        }
    }

    /// Qwen3's per-head Q and K norms.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Qwen3Moe) || self.is_hybrid()
    }

    /// Gated DeltaNet layers among the attention ones.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Self::Qwen3Next | Self::Qwen35 | Self::Qwen35Moe)
    }

    /// Every FFN a routed mixture of experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Self::Qwen3Moe | Self::Qwen3Next | Self::Qwen35Moe)
    }
}

/// The routed experts of a mixture-of-experts model (`num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub n_ff_exp: u64,
    /// The always-on shared expert's width (`shared_expert_intermediate_size`), if any.
    pub n_ff_shared: Option<u64>,
}

/// The Gated DeltaNet side of a hybrid (`linear_*`, `layer_types`,
/// `full_attention_interval`, `partial_rotary_factor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hybrid {
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: u64,
    /// `linear_key_head_dim` and `linear_value_head_dim`.
    pub k_head_dim: u64,
    pub v_head_dim: u64,
    /// `linear_num_key_heads` and `linear_num_value_heads` (a multiple of them).
    pub n_k_heads: u64,
    pub n_v_heads: u64,
    /// Which layers are delta-net, the others full attention.
    pub recurrent: Vec<bool>,
    /// `layer_types` was given (convert then writes `attention.recurrent_layers`).
    pub layer_types: bool,
    /// `full_attention_interval` (convert's default 4).
    pub interval: u64,
    /// Rotated dimensions of an attention head: `head_dim * partial_rotary_factor`.
    pub n_rot: u64,
    /// Value heads reordered from grouped by key head to tiled (Qwen3.5's converter, when
    /// there are more value heads than key heads).
    pub tiled: bool,
}

impl Hybrid {
    /// Key (and query) width and value width of a delta-net layer.
    pub fn key_dim(&self) -> u64 {
        self.n_k_heads * self.k_head_dim
    }

    pub fn value_dim(&self) -> u64 {
        self.n_v_heads * self.v_head_dim
    }

    /// The convolution's channels: queries, keys and values.
    pub fn conv_channels(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }

    /// Value heads per key head.
    pub fn ratio(&self) -> u64 {
        self.n_v_heads / self.n_k_heads
    }
}

/// What the conversion needs from `config.json`.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: HfArch,
    /// The raw object (after lifting `text_config`), for optional keys.
    pub raw: Map<String, Json>,
    pub n_layer: u64,
    pub n_embd: u64,
    /// `intermediate_size`: required but for mixtures of experts, where convert writes
    /// `feed_forward_length` only when it is given.
    pub n_ff: Option<u64>,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    /// `head_dim` was in the file (convert then writes key/value lengths).
    pub head_dim_explicit: bool,
    pub vocab_size: Option<u64>,
    pub tie_word_embeddings: bool,
    /// The experts, for a mixture-of-experts architecture.
    pub moe: Option<Moe>,
    /// The delta-net layers, for a hybrid architecture.
    pub hybrid: Option<Hybrid>,
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
        let n_ff = find_u64(&raw, &["intermediate_size", "n_inner", "hidden_dim"])?;
        if n_ff.is_none() && !arch.is_moe() {
            return Err(bad("no \"intermediate_size\""));
        }
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
        let moe = match arch.is_moe() {
            true => Some(parse_moe(&raw, n_layer)?),
            false => None,
        };
        let hybrid = match arch.is_hybrid() {
            true => Some(parse_hybrid(&raw, arch, n_layer, head_dim)?),
            false => None,
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
            hybrid,
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

    /// convert's `self.rope_parameters`: `rope_parameters` (transformers 5) or
    /// `rope_scaling`, with `rope_theta` and `partial_rotary_factor` mirrored in unless it is
    /// split per attention kind.
    pub fn rope_parameters(&self) -> Map<String, Json> {
        rope_parameters(&self.raw)
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

/// The experts of a Qwen3-MoE, Qwen3-Next or Qwen3.5-MoE config. Every layer must be a
/// mixture-of-experts one: their GGUF architectures (llama.cpp's and smelt's) have no dense
/// layers among them, so a config with
/// `mlp_only_layers` or a `decoder_sparse_step` over 1 is refused rather than misread.
fn parse_moe(raw: &Map<String, Json>, n_layer: u64) -> Result<Moe, LoadError> {
    let req = |k: &str| find_u64(raw, &[k])?.ok_or_else(|| bad(format!("no {k:?}")));
    let moe = Moe {
        n_expert: req("num_experts")?,
        n_expert_used: req("num_experts_per_tok")?,
        n_ff_exp: req("moe_intermediate_size")?,
        n_ff_shared: find_u64(raw, &["shared_expert_intermediate_size"])?,
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
             the GGUF architecture has none",
        ));
    }
    Ok(moe)
}

/// convert's `TextModel.__init__` mirroring of the global rope keys.
fn rope_parameters(raw: &Map<String, Json>) -> Map<String, Json> {
    let mut r = match raw
        .get("rope_parameters")
        .or_else(|| raw.get("rope_scaling"))
    {
        Some(Json::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    if r.contains_key("full_attention") || r.contains_key("sliding_attention") {
        return r;
    }
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| raw.get(*k).filter(|v| !v.is_null()))
    };
    for (key, keys) in [
        ("rope_theta", &["rope_theta", "rotary_emb_base"][..]),
        (
            "partial_rotary_factor",
            &["partial_rotary_factor", "rope_pct", "rope_percent"][..],
        ),
    ] {
        if !r.contains_key(key) {
            if let Some(v) = first(keys) {
                r.insert(key.into(), v.clone());
            }
        }
    }
    r
}

/// The delta-net layers of a hybrid config. convert reads the `linear_*` keys without
/// defaults; the layer pattern is `layer_types` when given (which must name every layer
/// `linear_attention` or `full_attention`), else every `full_attention_interval`-th layer
/// (default 4) is attention.
fn parse_hybrid(
    raw: &Map<String, Json>,
    arch: HfArch,
    n_layer: u64,
    head_dim: u64,
) -> Result<Hybrid, LoadError> {
    let req = |k: &str| find_u64(raw, &[k])?.ok_or_else(|| bad(format!("no {k:?}")));
    let (conv_kernel, k_head_dim, v_head_dim) = (
        req("linear_conv_kernel_dim")?,
        req("linear_key_head_dim")?,
        req("linear_value_head_dim")?,
    );
    let (n_k_heads, n_v_heads) = (req("linear_num_key_heads")?, req("linear_num_value_heads")?);
    if conv_kernel == 0 || k_head_dim == 0 || v_head_dim == 0 {
        return Err(bad(
            "linear_conv_kernel_dim and the linear head sizes must be positive",
        ));
    }
    if n_k_heads == 0 || n_v_heads % n_k_heads != 0 {
        return Err(bad(format!(
            "{n_v_heads} linear value heads cannot share {n_k_heads} key heads"
        )));
    }
    let interval = find_u64(raw, &["full_attention_interval"])?.unwrap_or(4);
    if interval == 0 {
        return Err(bad("full_attention_interval is 0"));
    }
    let (recurrent, layer_types) = match raw.get("layer_types") {
        None | Some(Json::Null) => (
            (0..n_layer).map(|i| (i + 1) % interval != 0).collect(),
            false,
        ),
        Some(Json::Array(types)) => {
            if types.len() as u64 != n_layer {
                return Err(bad(format!(
                    "layer_types has {} entries for {n_layer} layers",
                    types.len()
                )));
            }
            let kinds = types.iter().map(|t| match t.as_str() {
                Some("linear_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(bad(format!(
                    "layer_types: {t} is neither \"linear_attention\" nor \"full_attention\""
                ))),
            });
            (kinds.collect::<Result<_, _>>()?, true)
        }
        Some(other) => return Err(bad(format!("layer_types is {other}, not a list"))),
    };
    let factor = match rope_parameters(raw).get("partial_rotary_factor") {
        None => 0.25,
        Some(v) => v
            .as_f64()
            .filter(|f| (0.0..=1.0).contains(f))
            .ok_or_else(|| bad(format!("partial_rotary_factor is {v}, not in 0..1")))?,
    };
    Ok(Hybrid {
        conv_kernel,
        k_head_dim,
        v_head_dim,
        n_k_heads,
        n_v_heads,
        recurrent,
        layer_types,
        interval,
        // Python's int(): toward zero.
        n_rot: (head_dim as f64 * factor) as u64,
        tiled: arch != HfArch::Qwen3Next && n_k_heads != n_v_heads,
    })
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
                n_ff_exp: 32,
                n_ff_shared: None,
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

    #[test]
    fn hybrids_read_convert_s_keys_and_defaults() {
        let parse = |arch: &str, extra: &str| {
            Config::parse(&format!(
                r#"{{"architectures":["{arch}"],"num_hidden_layers":8,"hidden_size":64,
                "num_attention_heads":4,"head_dim":256,"linear_conv_kernel_dim":4,
                "linear_key_head_dim":128,"linear_value_head_dim":128,
                "linear_num_key_heads":16,"linear_num_value_heads":32{extra}}}"#
            ))
        };
        // Qwen3.5 dense: intermediate_size is required; defaults: every 4th layer is
        // attention, a quarter of the head rotated; value heads tiled.
        let e = parse("Qwen3_5ForCausalLM", "").unwrap_err().to_string();
        assert!(e.contains("intermediate_size"), "{e}");
        let c = parse("Qwen3_5ForCausalLM", r#","intermediate_size":128"#).expect("parses");
        let h = c.hybrid.expect("hybrid");
        assert_eq!(c.arch.gguf_name(), "qwen35");
        assert_eq!(
            (h.interval, h.n_rot, h.tiled, h.layer_types),
            (4, 64, true, false)
        );
        assert_eq!(
            h.recurrent,
            [true, true, true, false, true, true, true, false]
        );
        assert_eq!(
            (h.conv_channels(), h.value_dim(), h.ratio()),
            (8192, 4096, 2)
        );
        // rope_parameters' partial_rotary_factor (transformers 5) wins over the top level.
        let c = parse(
            "Qwen3_5ForConditionalGeneration",
            r#","intermediate_size":128,"partial_rotary_factor":0.5,
               "rope_parameters":{"partial_rotary_factor":0.125}"#,
        )
        .expect("parses");
        assert_eq!(c.hybrid.map(|h| h.n_rot), Some(32));
        // Qwen3-Next: experts required, no intermediate_size needed; grouped value heads.
        let moe = r#","num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32,
                     "shared_expert_intermediate_size":64,"full_attention_interval":2"#;
        let c = parse("Qwen3NextForCausalLM", moe).expect("parses");
        let h = c.hybrid.clone().expect("hybrid");
        assert_eq!((c.n_ff, h.tiled, h.interval), (None, false, 2));
        assert_eq!(c.moe.and_then(|m| m.n_ff_shared), Some(64));
        let e = parse("Qwen3NextForCausalLM", "").unwrap_err().to_string();
        assert!(e.contains("num_experts"), "{e}");
        let e = parse(
            "Qwen3_5MoeForCausalLM",
            &format!("{moe},\"layer_types\":[]"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("layer_types has 0 entries for 8 layers"), "{e}");
        let e = parse("Qwen3_5MoeForCausalLM", &moe.replace(":2,\"moe", ":2,\"x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe_intermediate_size"), "{e}");
    }
}
