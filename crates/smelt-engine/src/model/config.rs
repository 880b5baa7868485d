//! Model hyperparameters from GGUF metadata, with llama.cpp's per-architecture defaults.

use smelt_gguf::{Gguf, Metadata};

use crate::backend::RopeStyle;
use crate::EngineError;

/// The architectures smelt can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3.x, SmolLM2, Mistral (GGUF architecture `llama`).
    Llama,
    /// Qwen2 / Qwen2.5: biases on Q, K and V.
    Qwen2,
    /// Qwen3: RMS norms on each head of Q and K.
    Qwen3,
    /// Gemma 3: sandwich norms, GeGLU, scaled embeddings, local/global attention.
    Gemma3,
    /// Qwen3-MoE: Qwen3's attention with a routed mixture of experts for every FFN.
    Qwen3Moe,
    /// Qwen3.5/3.6 dense hybrids: Gated DeltaNet layers with a gated full-attention layer
    /// every few (`full_attention_interval` or `attention.recurrent_layers`).
    Qwen35,
    /// Qwen3.5/3.6 MoE hybrids: Qwen35's layers with routed experts and a gated shared
    /// expert in every FFN.
    Qwen35Moe,
    /// Qwen3-Next: the MoE hybrid before Qwen3.5 (NeoX rope, value heads grouped under
    /// their key head, fused `ssm_ba` and, from older converters, fused `ssm_in`).
    Qwen3Next,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Self, EngineError> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            "qwen3next" => Arch::Qwen3Next,
            other => return Err(EngineError::UnknownArchitecture(other.into())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
        }
    }
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Size of each query/key head.
    pub head_dim: usize,
    /// Size of each value head.
    pub head_dim_v: usize,
    pub n_rot: usize,
    pub rms_eps: f32,
    pub rope_style: RopeStyle,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    /// Rope base of sliding-window layers (Gemma 3's local layers use 10000).
    pub rope_freq_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    /// Sliding window size, for the layers marked in `swa_layers`.
    pub n_swa: Option<usize>,
    pub swa_layers: Vec<bool>,
    /// Multiplier of `q·k` inside the softmax.
    pub kq_scale: f32,
    /// Multiplier applied to Q before attention (Gemma's query_pre_attn_scalar), or 1.
    pub q_scale: f32,
    /// Multiplier of the token embeddings (Gemma: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
    /// The routed experts of a mixture-of-experts FFN, `None` for a dense FFN.
    pub moe: Option<MoeInfo>,
    /// Gated DeltaNet layers of a hybrid model, `None` when every layer is attention.
    pub delta: Option<DeltaInfo>,
    /// Attention layers whose query projection also yields a sigmoid gate per head
    /// (Qwen3-Next, Qwen3.5: `[q, gate]` interleaved per head).
    pub attn_gate: bool,
}

/// The Gated DeltaNet layers of a hybrid (`{arch}.ssm.*` metadata).
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaInfo {
    /// Causal convolution taps (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Size of each key/query/value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Key/query heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_heads: usize,
    /// Which layers are delta-net (the rest attention).
    pub recurrent: Vec<bool>,
    /// Value head `h` reads key/query head `h / (n_v_heads / n_k_heads)` (Qwen3-Next's
    /// repeat-interleave) rather than `h % n_k_heads` (Qwen3.5, whose converter orders the
    /// value heads for ggml's tiling broadcast).
    pub grouped_heads: bool,
}

impl DeltaInfo {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_channels(&self) -> usize {
        (2 * self.n_k_heads + self.n_v_heads) * self.head_dim
    }

    /// Width of the values (and of the output gate `z`).
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }
}

/// How a mixture-of-experts layer routes a token (`{arch}.expert_*` metadata).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeInfo {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token runs (`expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden size of one expert (`expert_feed_forward_length`, else `feed_forward_length`).
    pub n_ff_exp: usize,
    /// Router probabilities: softmax or sigmoid of the router logits (`expert_gating_func`).
    pub gating: crate::backend::Gating,
    /// Whether the chosen experts' weights are divided by their sum (`expert_weights_norm`;
    /// llama.cpp normalises for `qwen3moe` and Mixtral-style `llama`).
    pub norm_weights: bool,
    /// Multiplier of the expert weights (`expert_weights_scale`; 0 or 1: none).
    pub weights_scale: f32,
    /// Hidden size of the shared expert (`expert_shared_feed_forward_length`), 0 when the
    /// metadata does not say (its tensors then give it).
    pub n_ff_shared: usize,
}

fn req_u64(m: &Metadata, key: &str) -> Result<usize, EngineError> {
    m.get_u64(key)
        .map(|v| v as usize)
        .ok_or_else(|| EngineError::MissingKey(key.into()))
}

/// A per-layer count stored either as one number or as an array; llama.cpp takes the
/// array's first element for models whose layers agree.
fn u64_or_first(m: &Metadata, key: &str) -> Option<usize> {
    if let Some(v) = m.get_u64(key) {
        return Some(v as usize);
    }
    match m.get_array(key)? {
        smelt_gguf::Array::U32(v) => v.first().map(|&x| x as usize),
        smelt_gguf::Array::I32(v) => v.first().map(|&x| x as usize),
        _ => None,
    }
}

impl ModelInfo {
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, EngineError> {
        let m = gguf.metadata();
        let arch_name = m.architecture().ok_or(EngineError::NoArchitecture)?;
        let arch = Arch::from_name(arch_name)?;
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_embd = req_u64(m, &k("embedding_length"))?;
        let n_layer = req_u64(m, &k("block_count"))?;
        let n_head = u64_or_first(m, &k("attention.head_count"))
            .ok_or_else(|| EngineError::MissingKey(k("attention.head_count")))?;
        let n_head_kv = u64_or_first(m, &k("attention.head_count_kv")).unwrap_or(n_head);
        let moe = moe_info(m, arch_name)?;
        let n_ff = match (u64_or_first(m, &k("feed_forward_length")), &moe) {
            (Some(v), _) => v,
            (None, Some(moe)) => moe.n_ff_exp,
            (None, None) => return Err(EngineError::MissingKey(k("feed_forward_length"))),
        };
        if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(EngineError::BadMetadata {
                key: k("attention.head_count_kv"),
                why: format!("{n_head} query heads cannot share {n_head_kv} KV heads"),
            });
        }
        let head_dim = m
            .get_u64(&k("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(n_embd / n_head);
        let head_dim_v = m
            .get_u64(&k("attention.value_length"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if head_dim_v != head_dim {
            return Err(EngineError::BadMetadata {
                key: k("attention.value_length"),
                why: "value heads of a different size than key heads".into(),
            });
        }
        let n_rot = m
            .get_u64(&k("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(EngineError::BadMetadata {
                key: k("rope.dimension_count"),
                why: format!("{n_rot} rotated dimensions in heads of {head_dim}"),
            });
        }
        let rms_eps = m
            .get_f32(&k("attention.layer_norm_rms_epsilon"))
            .ok_or_else(|| EngineError::MissingKey(k("attention.layer_norm_rms_epsilon")))?;
        let n_vocab = match m.get_u64(&k("vocab_size")) {
            Some(v) => v as usize,
            None => gguf
                .tensor("token_embd.weight")
                .map(|t| t.n_rows() as usize)
                .ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?,
        };
        let n_ctx_train = m
            .get_u64(&k("context_length"))
            .map(|v| v as usize)
            .unwrap_or(4096);
        let rope_freq_base = m.get_f32(&k("rope.freq_base")).unwrap_or(10000.0);
        let rope_freq_scale = rope_scale(m, arch_name)?;

        let mut info = ModelInfo {
            arch,
            n_vocab,
            n_ctx_train,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_rot,
            rms_eps,
            rope_style: RopeStyle::Normal,
            rope_freq_base,
            rope_freq_scale,
            rope_freq_base_swa: rope_freq_base,
            rope_freq_scale_swa: rope_freq_scale,
            n_swa: None,
            swa_layers: vec![false; n_layer],
            kq_scale: 1.0 / (head_dim as f32).sqrt(),
            q_scale: 1.0,
            embd_scale: None,
            moe,
            delta: None,
            attn_gate: false,
        };
        match arch {
            Arch::Llama => {}
            Arch::Qwen2 | Arch::Qwen3 => info.rope_style = RopeStyle::Neox,
            Arch::Qwen3Moe => {
                info.rope_style = RopeStyle::Neox;
                if info.moe.is_none() {
                    return Err(EngineError::MissingKey(k("expert_count")));
                }
            }
            Arch::Qwen3Next => {
                if info.moe.is_none() {
                    return Err(EngineError::MissingKey(k("expert_count")));
                }
                info.rope_style = RopeStyle::Neox;
                info.attn_gate = true;
                let mut d = delta_info(m, arch_name, n_layer)?;
                d.grouped_heads = true;
                info.delta = Some(d);
            }
            Arch::Qwen35 | Arch::Qwen35Moe => {
                if arch == Arch::Qwen35Moe && info.moe.is_none() {
                    return Err(EngineError::MissingKey(k("expert_count")));
                }
                info.rope_style = RopeStyle::Neox;
                info.attn_gate = true;
                info.delta = Some(delta_info(m, arch_name, n_layer)?);
                check_text_mrope(m, arch_name, n_rot)?;
            }
            Arch::Gemma3 => {
                info.rope_style = RopeStyle::Neox;
                // llama.cpp: local layers use base 10000 unscaled; every 6th layer is global.
                info.rope_freq_base_swa = 10000.0;
                info.rope_freq_scale_swa = 1.0;
                info.n_swa = Some(
                    u64_or_first(m, &k("attention.sliding_window"))
                        .ok_or_else(|| EngineError::MissingKey(k("attention.sliding_window")))?,
                );
                info.swa_layers = (0..n_layer).map(|il| il % 6 < 5).collect();
                // Q is pre-scaled (query_pre_attn_scalar); the softmax scale is then 1.
                // The 27B model (62 layers) scales by n_embd / n_head instead of head_dim.
                let d = if n_layer == 62 {
                    n_embd / n_head
                } else {
                    head_dim
                };
                info.q_scale = 1.0 / (d as f32).sqrt();
                info.kq_scale = 1.0;
                info.embd_scale = Some((n_embd as f32).sqrt());
            }
        }
        Ok(info)
    }

    /// Rope base and scale of layer `il`.
    pub fn rope_for_layer(&self, il: usize) -> (f32, f32) {
        if self.swa_layers.get(il).copied().unwrap_or(false) {
            (self.rope_freq_base_swa, self.rope_freq_scale_swa)
        } else {
            (self.rope_freq_base, self.rope_freq_scale)
        }
    }

    /// Sliding window of layer `il`, if it has one.
    pub fn window_for_layer(&self, il: usize) -> Option<usize> {
        if self.swa_layers.get(il).copied().unwrap_or(false) {
            self.n_swa
        } else {
            None
        }
    }
}

/// The `ssm.*` keys and the layer pattern: `attention.recurrent_layers` (one flag per layer)
/// when present, else every `full_attention_interval`-th layer (default 4) is attention.
fn delta_info(m: &Metadata, arch: &str, n_layer: usize) -> Result<DeltaInfo, EngineError> {
    let k = |s: &str| format!("{arch}.{s}");
    let req = |s: &str| req_u64(m, &k(s));
    let info = DeltaInfo {
        conv_kernel: req("ssm.conv_kernel")?,
        head_dim: req("ssm.state_size")?,
        n_k_heads: req("ssm.group_count")?,
        n_v_heads: req("ssm.time_step_rank")?,
        recurrent: match m.get_array(&k("attention.recurrent_layers")) {
            Some(smelt_gguf::Array::Bool(v)) if v.len() >= n_layer => v[..n_layer].to_vec(),
            Some(_) => {
                return Err(EngineError::BadMetadata {
                    key: k("attention.recurrent_layers"),
                    why: format!("expected {n_layer} booleans"),
                })
            }
            None => {
                let every = m.get_u64(&k("full_attention_interval")).unwrap_or(4) as usize;
                if every == 0 {
                    return Err(EngineError::BadMetadata {
                        key: k("full_attention_interval"),
                        why: "0".into(),
                    });
                }
                (0..n_layer).map(|i| (i + 1) % every != 0).collect()
            }
        },
        grouped_heads: false,
    };
    let inner = req("ssm.inner_size")?;
    if info.conv_kernel < 1
        || info.n_k_heads == 0
        || !info.n_v_heads.is_multiple_of(info.n_k_heads)
        || inner != info.value_dim()
    {
        return Err(EngineError::BadMetadata {
            key: k("ssm.inner_size"),
            why: format!(
                "{} key heads, {} value heads of {}, inner size {inner}",
                info.n_k_heads, info.n_v_heads, info.head_dim
            ),
        });
    }
    Ok(info)
}

/// Qwen3.5's rope is llama.cpp's interleaved M-RoPE; for text every section turns with the
/// token's position, which is NeoX rope over `rope.dimension_count` dimensions, as long as
/// no rotated pair falls to the fourth section (whose position is 0 for text).
fn check_text_mrope(m: &Metadata, arch: &str, n_rot: usize) -> Result<(), EngineError> {
    let key = format!("{arch}.rope.dimension_sections");
    let sec: Vec<usize> = match m.get_array(&key) {
        Some(smelt_gguf::Array::I32(v)) => v.iter().map(|&x| x.max(0) as usize).collect(),
        Some(smelt_gguf::Array::U32(v)) => v.iter().map(|&x| x as usize).collect(),
        _ => return Ok(()),
    };
    let s = |i: usize| sec.get(i).copied().unwrap_or(0);
    let total: usize = (0..4).map(s).sum();
    let fourth = (0..n_rot / 2).any(|i| {
        let sector = if total == 0 { 0 } else { i % total };
        !((sector % 3 == 1 && sector < 3 * s(1))
            || (sector % 3 == 2 && sector < 3 * s(2))
            || (sector % 3 == 0 && sector < 3 * s(0)))
    });
    if total == 0 || fourth {
        return Err(EngineError::BadMetadata {
            key,
            why: format!("sections {sec:?} rotate text dimensions by the extra position"),
        });
    }
    Ok(())
}

/// The `expert_*` keys: `None` without experts (no `expert_count`, or one expert, which
/// llama.cpp treats as a dense model).
fn moe_info(m: &Metadata, arch: &str) -> Result<Option<MoeInfo>, EngineError> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_expert = m.get_u64(&k("expert_count")).unwrap_or(0) as usize;
    if n_expert <= 1 {
        return Ok(None);
    }
    let n_expert_used = u64_or_first(m, &k("expert_used_count"))
        .ok_or_else(|| EngineError::MissingKey(k("expert_used_count")))?;
    if n_expert_used == 0 || n_expert_used > n_expert {
        return Err(EngineError::BadMetadata {
            key: k("expert_used_count"),
            why: format!("{n_expert_used} of {n_expert} experts per token"),
        });
    }
    let n_ff_exp = u64_or_first(m, &k("expert_feed_forward_length"))
        .or_else(|| u64_or_first(m, &k("feed_forward_length")))
        .ok_or_else(|| EngineError::MissingKey(k("expert_feed_forward_length")))?;
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*: 1 softmax, 2 sigmoid.
    let gating = match m.get_u64(&k("expert_gating_func")).unwrap_or(1) {
        1 => crate::backend::Gating::Softmax,
        2 => crate::backend::Gating::Sigmoid,
        other => {
            return Err(EngineError::BadMetadata {
                key: k("expert_gating_func"),
                why: format!("gating function {other} is not supported yet"),
            })
        }
    };
    let norm_weights = m.get_bool(&k("expert_weights_norm")).unwrap_or(true);
    Ok(Some(MoeInfo {
        n_expert,
        n_expert_used,
        n_ff_exp,
        gating,
        norm_weights,
        weights_scale: m.get_f32(&k("expert_weights_scale")).unwrap_or(0.0),
        n_ff_shared: u64_or_first(m, &k("expert_shared_feed_forward_length")).unwrap_or(0),
    }))
}

/// `rope.scaling.*` as llama.cpp reads it: the linear factor (`rope.scale_linear`, else
/// `rope.scaling.factor`) divides positions whatever the type says; Llama 3 scaling is
/// carried by the `rope_freqs.weight` tensor; YaRN and LongRoPE are not implemented yet.
fn rope_scale(m: &Metadata, arch: &str) -> Result<f32, EngineError> {
    let key = format!("{arch}.rope.scaling.type");
    match m.get_str(&key).unwrap_or("none") {
        "none" | "linear" | "llama3" => {}
        other => {
            return Err(EngineError::BadMetadata {
                key,
                why: format!("rope scaling {other:?} is not supported yet"),
            })
        }
    }
    let factor = m
        .get_f32(&format!("{arch}.rope.scale_linear"))
        .or_else(|| m.get_f32(&format!("{arch}.rope.scaling.factor")))
        .unwrap_or(0.0);
    Ok(if factor == 0.0 { 1.0 } else { 1.0 / factor })
}
