//! Which type each tensor gets: one exact format, or llama.cpp's per-tensor mixture rules.
//!
//! The mixture rules follow llama.cpp's `src/llama-quant.cpp` (`llama_tensor_get_type`,
//! `tensor_allows_quantization`, the ragged-row fallback) so a file smelt writes with
//! `q4_k_m` has the same tensor types as one `llama-quantize` writes (the tests check this,
//! byte for byte, against the llama.cpp of llama-cpp-python 0.3.36). The rules are facts
//! about that program, re-expressed here.

use smelt_gguf::{GgmlType, Metadata};
use std::fmt;

/// A llama.cpp mixture preset (`llama-quantize`'s file types).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    F16,
    BF16,
}

impl Preset {
    pub const ALL: [Preset; 16] = [
        Self::Q2_K,
        Self::Q3_K_S,
        Self::Q3_K_M,
        Self::Q3_K_L,
        Self::Q4_K_S,
        Self::Q4_K_M,
        Self::Q5_K_S,
        Self::Q5_K_M,
        Self::Q6_K,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::F16,
        Self::BF16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Q2_K => "q2_k",
            Self::Q3_K_S => "q3_k_s",
            Self::Q3_K_M => "q3_k_m",
            Self::Q3_K_L => "q3_k_l",
            Self::Q4_K_S => "q4_k_s",
            Self::Q4_K_M => "q4_k_m",
            Self::Q5_K_S => "q5_k_s",
            Self::Q5_K_M => "q5_k_m",
            Self::Q6_K => "q6_k",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
        }
    }

    /// llama.cpp's `LLAMA_FTYPE_MOSTLY_*` value, written to `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Q5_0 => 8,
            Self::Q5_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K_S => 11,
            Self::Q3_K_M => 12,
            Self::Q3_K_L => 13,
            Self::Q4_K_S => 14,
            Self::Q4_K_M => 15,
            Self::Q5_K_S => 16,
            Self::Q5_K_M => 17,
            Self::Q6_K => 18,
            Self::BF16 => 32,
        }
    }

    /// The type most tensors get (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            Self::Q2_K => GgmlType::Q2_K,
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L => GgmlType::Q3_K,
            Self::Q4_K_S | Self::Q4_K_M => GgmlType::Q4_K,
            Self::Q5_K_S | Self::Q5_K_M => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
        }
    }

    fn from_name(name: &str) -> Option<Preset> {
        Self::ALL
            .iter()
            .copied()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }
}

/// Formats `--type` accepts as an exact, every-tensor format.
pub const EXACT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// What the user asked for: one format everywhere, or a llama.cpp mixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Exact(GgmlType),
    Preset(Preset),
}

impl Target {
    /// Parses `--type`. A name that is both a format and a preset (`q8_0`, `q6_k`, `f16`...)
    /// means the exact format unless `preset` is set; names that are only presets
    /// (`q4_k_m`...) are presets either way.
    pub fn parse(name: &str, preset: bool) -> Result<Target, String> {
        let exact = GgmlType::from_name(name).filter(|t| EXACT_TYPES.contains(t));
        let mix = Preset::from_name(name);
        match (exact, mix, preset) {
            (_, Some(p), true) | (None, Some(p), false) => Ok(Target::Preset(p)),
            (Some(t), _, false) => Ok(Target::Exact(t)),
            (Some(t), None, true) => Err(format!(
                "`{t}` has no llama.cpp mixture preset; drop --preset to make every tensor {t}, \
                 or pick one of: {}",
                preset_names()
            )),
            (None, None, _) => Err(format!(
                "unknown type `{name}`; formats: {}; llama.cpp presets: {}",
                EXACT_TYPES
                    .map(|t| t.name().to_ascii_lowercase())
                    .join(", "),
                preset_names()
            )),
        }
    }

    /// llama.cpp's `LLAMA_FTYPE_*` value for `general.file_type`. An exact K-quant maps to
    /// its "small" preset, the file type whose tensors are (almost) all that format.
    pub fn file_type(self) -> u32 {
        match self {
            Target::Preset(p) => p.file_type(),
            Target::Exact(t) => match t {
                GgmlType::F32 => 0,
                GgmlType::Q2_K => Preset::Q2_K.file_type(),
                GgmlType::Q3_K => Preset::Q3_K_S.file_type(),
                GgmlType::Q4_K => Preset::Q4_K_S.file_type(),
                GgmlType::Q5_K => Preset::Q5_K_S.file_type(),
                GgmlType::Q6_K => Preset::Q6_K.file_type(),
                GgmlType::Q8_0 => Preset::Q8_0.file_type(),
                GgmlType::Q4_0 => Preset::Q4_0.file_type(),
                GgmlType::Q4_1 => Preset::Q4_1.file_type(),
                GgmlType::Q5_0 => Preset::Q5_0.file_type(),
                GgmlType::Q5_1 => Preset::Q5_1.file_type(),
                GgmlType::BF16 => Preset::BF16.file_type(),
                _ => Preset::F16.file_type(),
            },
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Exact(t) => write!(f, "{t}"),
            Target::Preset(p) => write!(f, "{} (llama.cpp mixture)", p.name()),
        }
    }
}

fn preset_names() -> String {
    Preset::ALL.map(Preset::name).join(", ")
}

/// The hyper-parameters llama.cpp's mixture rules look at.
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    pub arch: String,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_expert: u64,
}

impl ModelInfo {
    pub fn from_metadata(md: &Metadata) -> ModelInfo {
        let arch = md.architecture().unwrap_or("").to_string();
        let get = |key: &str| first_u64(md, &format!("{arch}.{key}"));
        let n_head = get("attention.head_count").unwrap_or(0);
        ModelInfo {
            n_layer: get("block_count").unwrap_or(0),
            n_head,
            n_head_kv: get("attention.head_count_kv").unwrap_or(n_head),
            n_expert: get("expert_count").unwrap_or(0),
            arch,
        }
    }

    /// `hparams.n_gqa()`: query heads per key/value head (0 when unknown).
    fn n_gqa(&self) -> u64 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// A scalar, or the first element of a per-layer array (some architectures store head
/// counts per layer).
fn first_u64(md: &Metadata, key: &str) -> Option<u64> {
    use smelt_gguf::{Array, Value};
    md.get_u64(key).or_else(|| match md.get(key)? {
        Value::Array(Array::U32(v)) => v.first().map(|&x| x as u64),
        Value::Array(Array::I32(v)) => v.first().and_then(|&x| u64::try_from(x).ok()),
        Value::Array(Array::U64(v)) => v.first().copied(),
        Value::Array(Array::I64(v)) => v.first().and_then(|&x| u64::try_from(x).ok()),
        _ => None,
    })
}

/// One tensor as the planner sees it.
#[derive(Clone, Debug)]
pub struct TensorIn {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

/// How the output bytes of a tensor are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Source bytes are written unchanged.
    Copy,
    /// Source is converted to f32 (dequantized if needed) and quantized to the new type.
    Convert,
}

/// The plan for one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub ty: GgmlType,
    pub action: Action,
    /// Set when the row length forced a different type than the rules asked for.
    pub fallback: Option<String>,
}

/// ggml's `ggml_n_dims`: trailing dimensions of size 1 do not count.
pub fn n_dims(shape: &[u64]) -> usize {
    shape.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Chooses every tensor's output type. `tensors` are in file order; the result is too.
pub fn plan(target: Target, model: &ModelInfo, tensors: &[TensorIn]) -> Vec<Planned> {
    match target {
        Target::Exact(ty) => tensors.iter().map(|t| plan_exact(ty, t)).collect(),
        Target::Preset(p) => plan_preset(p, model, tensors),
    }
}

fn plan_exact(ty: GgmlType, t: &TensorIn) -> Planned {
    let row = t.shape.first().copied().unwrap_or(1);
    let want = if n_dims(&t.shape) < 2 {
        GgmlType::F32
    } else if !allows_quantization(&t.name, &t.shape) {
        // As llama.cpp's quantizer: the router, the delta-net convolution (ggml's ssm_conv
        // takes only f32) and their kind keep their type.
        t.ty
    } else {
        ty
    };
    let (ty, fallback) = fallback(want, row);
    Planned {
        ty,
        action: action(t.ty, ty),
        fallback,
    }
}

/// Same float type: the bytes are already right. Anything else is converted, including a
/// quantized source into its own type (requantized from its dequantized weights).
fn action(src: GgmlType, dst: GgmlType) -> Action {
    if src == dst && !src.is_quantized() {
        Action::Copy
    } else {
        Action::Convert
    }
}

/// llama.cpp's ragged-row fallback (`tensor_type_fallback`): when the row length is not a
/// multiple of the block, a smaller-block type of similar size, else F16.
fn fallback(ty: GgmlType, row: u64) -> (GgmlType, Option<String>) {
    let block = ty.block_size() as u64;
    if row % block == 0 {
        return (ty, None);
    }
    let mut note = String::new();
    let mut next = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::Q2_K | GgmlType::Q3_K => {
            // Older llama.cpp picked IQ4_NL here, which smelt cannot write; the llama.cpp
            // of llama-cpp-python 0.3.36 picks Q4_0 (same block and bits), and so do we.
            note = " (as current llama.cpp does; older llama.cpp used iq4_nl, which smelt \
                    cannot write)"
                .into();
            GgmlType::Q4_0
        }
        _ => GgmlType::F16,
    };
    if row % next.block_size() as u64 != 0 {
        next = GgmlType::F16;
    }
    let msg = format!("row length {row} is not a multiple of {block} ({ty}): using {next}{note}");
    (next, Some(msg))
}

/// llama.cpp's `tensor_allows_quantization`.
pub fn allows_quantization(name: &str, shape: &[u64]) -> bool {
    if n_dims(shape) < 2 || !name.ends_with("weight") || name.contains("_norm.weight") {
        return false;
    }
    const NEVER: &[&str] = &[
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    if NEVER.iter().any(|p| name.contains(p)) {
        return false;
    }
    name != "position_embd.weight" && name != "token_types.weight"
}

/// llama.cpp's broad tensor categories (`tensor_get_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", Category::AttnQkv),
        ("attn_kv_b.weight", Category::AttnKvB),
        ("attn_v.weight", Category::AttnV),
        ("attn_k.weight", Category::AttnK),
        ("attn_q.weight", Category::AttnQ),
        ("attn_output.weight", Category::AttnOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
    ];
    table
        .iter()
        .find(|(pat, _)| name.contains(pat))
        .map_or(Category::Other, |&(_, c)| c)
}

fn is_attn_v_like(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// The layer number of a `blk.N.` name, as llama.cpp's `sscanf("blk.%d.")` reads it.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// layer in between, get more bits.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Running counters of the mixture rules (`quantize_state_impl`).
struct State<'a> {
    model: &'a ModelInfo,
    preset: Preset,
    tied: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

fn plan_preset(preset: Preset, model: &ModelInfo, tensors: &[TensorIn]) -> Vec<Planned> {
    // llama.cpp walks tensors sorted by (layer, name), and its counters depend on that order.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (na, nb) = (&tensors[a].name, &tensors[b].name);
        (layer_of(na).unwrap_or(-1), na).cmp(&(layer_of(nb).unwrap_or(-1), nb))
    });
    let mut st = State {
        model,
        preset,
        tied: !tensors
            .iter()
            .any(|t| category(&t.name) == Category::Output),
        n_attention_wv: tensors
            .iter()
            .filter(|t| is_attn_v_like(category(&t.name)))
            .count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };
    let mut out = vec![None; tensors.len()];
    for i in order {
        let t = &tensors[i];
        let planned = if !allows_quantization(&t.name, &t.shape) {
            Planned {
                ty: t.ty,
                action: Action::Copy,
                fallback: None,
            }
        } else {
            let default = preset.default_type();
            let (ty, fallback) = if default.is_quantized() {
                let chosen = st.choose(t, default);
                fallback(chosen, t.shape.first().copied().unwrap_or(1))
            } else {
                (default, None)
            };
            Planned {
                ty,
                action: action(t.ty, ty),
                fallback,
            }
        };
        out[i] = Some(planned);
    }
    out.into_iter().flatten().collect()
}

impl State<'_> {
    fn layer(&self, counter: i64, name: &str) -> (i64, i64) {
        let n = self.model.n_layer as i64;
        if self.model.n_expert > 1 {
            if let Some(l) = layer_of(name) {
                return (l, n);
            }
        }
        (counter, n)
    }

    /// llama.cpp's `llama_tensor_get_type_impl` for the presets smelt offers.
    fn choose(&mut self, t: &TensorIn, default: GgmlType) -> GgmlType {
        use GgmlType as T;
        use Preset as P;
        let ftype = self.preset;
        let m = self.model;
        let cat = category(&t.name);
        let mut new = default;
        if cat == Category::Output || (self.tied && cat == Category::TokenEmbd) {
            let nx = t.shape.first().copied().unwrap_or(1);
            if m.is_falcon() || nx % new.block_size() as u64 != 0 {
                new = T::Q8_0;
            } else if new != T::Q8_0 {
                new = T::Q6_K;
            }
        } else if cat == Category::TokenEmbd {
            // Only the IQ and ternary presets change the token embeddings.
        } else if is_attn_v_like(cat) {
            let gqa = m.n_gqa();
            match ftype {
                P::Q2_K => new = if gqa >= 4 { T::Q4_K } else { T::Q3_K },
                P::Q3_K_M => {
                    new = if self.i_attention_wv < 2 {
                        T::Q5_K
                    } else {
                        T::Q4_K
                    }
                }
                P::Q3_K_L => new = T::Q5_K,
                P::Q4_K_M | P::Q5_K_M
                    if use_more_bits(self.i_attention_wv, self.n_attention_wv) =>
                {
                    new = T::Q6_K
                }
                P::Q4_K_S if self.i_attention_wv < 4 => new = T::Q5_K,
                _ => {}
            }
            if m.is_70b() && (new == T::Q3_K || new == T::Q4_K) {
                new = T::Q5_K;
            }
            if m.n_expert == 8 {
                new = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if m.n_expert == 8 {
                new = T::Q8_0;
            }
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer(self.i_ffn_down, &t.name);
            let falcon = m.is_falcon();
            match ftype {
                P::Q2_K => new = T::Q3_K,
                P::Q3_K_M => {
                    new = if i < n / 16 {
                        T::Q5_K
                    } else if !falcon || use_more_bits(i, n) {
                        T::Q4_K
                    } else {
                        T::Q3_K
                    }
                }
                P::Q3_K_L => new = if falcon { T::Q4_K } else { T::Q5_K },
                P::Q4_K_M => {
                    if falcon {
                        new = if i < n / 16 {
                            T::Q6_K
                        } else if use_more_bits(i, n) {
                            T::Q5_K
                        } else {
                            T::Q4_K
                        };
                    } else if use_more_bits(i, n) {
                        new = T::Q6_K;
                    }
                }
                P::Q5_K_M if use_more_bits(i, n) => new = T::Q6_K,
                P::Q4_K_S if !falcon && i < n / 8 => new = T::Q5_K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !m.is_falcon() {
                if m.n_expert == 8 {
                    if matches!(
                        ftype,
                        P::Q2_K | P::Q3_K_S | P::Q3_K_M | P::Q4_K_S | P::Q4_K_M
                    ) {
                        new = T::Q5_K;
                    }
                } else {
                    match ftype {
                        P::Q2_K => new = T::Q3_K,
                        P::Q3_K_M => new = T::Q4_K,
                        P::Q3_K_L => new = T::Q5_K,
                        _ => {}
                    }
                }
            } else if ftype == P::Q3_K_L {
                new = T::Q4_K;
            }
        } else if cat == Category::FfnGate {
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.i_ffn_up += 1;
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: &[u64]) -> TensorIn {
        TensorIn {
            name: name.into(),
            ty: GgmlType::F32,
            shape: shape.to_vec(),
        }
    }

    fn llama(n_layer: u64, embd: u64) -> (ModelInfo, Vec<TensorIn>) {
        let mut ts = vec![
            t("token_embd.weight", &[embd, 1000]),
            t("output_norm.weight", &[embd]),
        ];
        for i in 0..n_layer {
            for (n, s) in [
                ("attn_norm.weight", vec![embd]),
                ("attn_q.weight", vec![embd, embd]),
                ("attn_k.weight", vec![embd, embd / 4]),
                ("attn_v.weight", vec![embd, embd / 4]),
                ("attn_output.weight", vec![embd, embd]),
                ("ffn_norm.weight", vec![embd]),
                ("ffn_gate.weight", vec![embd, 2 * embd]),
                ("ffn_up.weight", vec![embd, 2 * embd]),
                ("ffn_down.weight", vec![2 * embd, embd]),
            ] {
                ts.push(t(&format!("blk.{i}.{n}"), &s));
            }
        }
        ts.push(t("output.weight", &[embd, 1000]));
        let m = ModelInfo {
            arch: "llama".into(),
            n_layer,
            n_head: 8,
            n_head_kv: 2,
            n_expert: 0,
        };
        (m, ts)
    }

    fn types(p: &[Planned], ts: &[TensorIn], name: &str) -> GgmlType {
        let i = ts
            .iter()
            .position(|t| t.name == name)
            .expect("tensor in test model");
        p[i].ty
    }

    #[test]
    fn q4_k_m_bumps_the_layers_llama_cpp_bumps() {
        let (m, ts) = llama(16, 256);
        let p = plan(Target::Preset(Preset::Q4_K_M), &m, &ts);
        // use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2 -> 0 1 4 7 10 13 14 15
        let bumped = [0, 1, 4, 7, 10, 13, 14, 15];
        for i in 0..16 {
            let want = if bumped.contains(&i) {
                GgmlType::Q6_K
            } else {
                GgmlType::Q4_K
            };
            assert_eq!(
                types(&p, &ts, &format!("blk.{i}.attn_v.weight")),
                want,
                "layer {i}"
            );
            assert_eq!(
                types(&p, &ts, &format!("blk.{i}.ffn_down.weight")),
                want,
                "layer {i}"
            );
            assert_eq!(
                types(&p, &ts, &format!("blk.{i}.attn_q.weight")),
                GgmlType::Q4_K
            );
            assert_eq!(
                types(&p, &ts, &format!("blk.{i}.attn_norm.weight")),
                GgmlType::F32
            );
        }
        assert_eq!(types(&p, &ts, "output.weight"), GgmlType::Q6_K);
        assert_eq!(types(&p, &ts, "token_embd.weight"), GgmlType::Q4_K);
    }

    #[test]
    fn counters_follow_layer_order_not_file_order() {
        let (m, mut ts) = llama(16, 256);
        ts.reverse();
        let p = plan(Target::Preset(Preset::Q4_K_M), &m, &ts);
        assert_eq!(types(&p, &ts, "blk.4.attn_v.weight"), GgmlType::Q6_K);
        assert_eq!(types(&p, &ts, "blk.5.attn_v.weight"), GgmlType::Q4_K);
    }

    #[test]
    fn ragged_rows_fall_back_like_llama_cpp() {
        // Gemma 3 270M: 640-wide rows, tied embeddings, one KV head for four query heads.
        let (mut m, mut ts) = llama(18, 640);
        ts.retain(|t| t.name != "output.weight");
        m.n_head = 4;
        m.n_head_kv = 1;
        let p = plan(Target::Preset(Preset::Q4_K_M), &m, &ts);
        assert_eq!(types(&p, &ts, "token_embd.weight"), GgmlType::Q8_0);
        assert_eq!(types(&p, &ts, "blk.0.attn_q.weight"), GgmlType::Q5_0);
        assert_eq!(types(&p, &ts, "blk.0.attn_v.weight"), GgmlType::Q8_0);
        assert_eq!(types(&p, &ts, "blk.2.attn_v.weight"), GgmlType::Q5_0);
        assert_eq!(types(&p, &ts, "blk.0.ffn_down.weight"), GgmlType::Q6_K);
        assert_eq!(types(&p, &ts, "blk.2.ffn_down.weight"), GgmlType::Q4_K);
        assert!(p.iter().any(|x| x.fallback.is_some()));
    }

    #[test]
    fn q2_k_and_q3_k_fall_back_to_q4_0() {
        let (ty, note) = fallback(GgmlType::Q3_K, 640);
        assert_eq!(ty, GgmlType::Q4_0);
        assert!(note.is_some_and(|n| n.contains("q4_0") && n.contains("iq4_nl")));
        assert_eq!(fallback(GgmlType::Q8_0, 100).0, GgmlType::F16);
    }

    #[test]
    fn exact_types_keep_vectors_f32() {
        let (m, ts) = llama(2, 256);
        let p = plan(Target::Exact(GgmlType::Q4_0), &m, &ts);
        for (t, p) in ts.iter().zip(&p) {
            let want = if t.shape.len() == 1 {
                GgmlType::F32
            } else {
                GgmlType::Q4_0
            };
            assert_eq!(p.ty, want, "{}", t.name);
        }
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            Target::parse("Q8_0", false),
            Ok(Target::Exact(GgmlType::Q8_0))
        );
        assert_eq!(
            Target::parse("q8_0", true),
            Ok(Target::Preset(Preset::Q8_0))
        );
        assert_eq!(
            Target::parse("q4_k_m", false),
            Ok(Target::Preset(Preset::Q4_K_M))
        );
        assert!(Target::parse("q4_k", true).is_err());
        assert!(Target::parse("iq4_nl", false).is_err());
        assert_eq!(Target::Preset(Preset::Q4_K_M).file_type(), 15);
    }
}
