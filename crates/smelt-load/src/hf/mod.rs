//! A Hugging Face model folder (config.json, tokenizer files, safetensors) turned into the
//! GGUF llama.cpp's convert_hf_to_gguf.py writes for it: the same metadata keys, tensor
//! names, the Q/K row permutation of Llama-style rope, and `rope_freqs` for Llama 3 scaling.
//! Weights keep their dtype (convert's `--outtype auto`, except that F32 stays F32); 1-D
//! tensors, norms and a mixture of experts' router become F32, as convert makes them; the
//! experts' per-expert matrices are stacked into one 3-D tensor per projection, as
//! convert's Qwen2MoeModel does.

pub mod config;
mod spm;
pub mod vocab;

use std::borrow::Cow;
use std::path::Path;

use smelt_gguf::{GgmlType, Metadata, Value};

use crate::isq::{SourceTensor, TensorSource};
use crate::safetensors::{Checkpoint, StTensor};
use crate::LoadError;
use config::{Config, HfArch};

/// How one output tensor is made from the checkpoint.
enum Recipe {
    /// The checkpoint tensor's bytes, rows permuted for rope when `permute_heads` is set.
    Copy {
        src: usize,
        permute_heads: Option<u64>,
    },
    /// A 1-D/norm tensor (or bias) converted to F32, Q/K biases permuted like their weights.
    ToF32 {
        src: usize,
        permute_heads: Option<u64>,
    },
    /// Bytes computed here (Llama 3's `rope_freqs`).
    Owned(Vec<u8>),
    /// Checkpoint tensors of one shape and dtype, one after the other (a layer's experts'
    /// matrices of one projection, in expert order).
    Stack { srcs: Vec<usize> },
}

/// The folder's tensors as a [`TensorSource`].
pub struct HfSource {
    ckpt: Checkpoint,
    st: Vec<StTensor>,
    tensors: Vec<SourceTensor>,
    recipes: Vec<Recipe>,
}

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
    hparams(&cfg, &mut md);
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

/// `TextModel.set_gguf_parameters` plus the Llama additions.
fn hparams(cfg: &Config, md: &mut Metadata) {
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
    md.insert(k("feed_forward_length"), u32v(cfg.n_ff));
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
    }
    if cfg.arch == HfArch::Llama {
        if let Some(v) = cfg.vocab_size {
            md.insert(k("vocab_size"), u32v(v));
        }
        md.insert(k("rope.dimension_count"), u32v(cfg.head_dim));
    }
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

/// The GGUF name of a checkpoint tensor, or `None` for tensors convert drops.
fn gguf_name(arch: HfArch, name: &str) -> Result<Option<String>, LoadError> {
    let name = name.strip_prefix("text_model.").unwrap_or(name);
    if name.ends_with(".rotary_emb.inv_freq") {
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
        "mlp.gate" if arch == HfArch::Qwen3Moe => "ffn_gate_inp",
        _ => return Err(unknown()),
    };
    if suffix != "weight" && suffix != "bias" {
        return Err(unknown());
    }
    Ok(Some(format!("blk.{bid}.{part}.{suffix}")))
}

/// `(layer, expert, projection)` of a per-expert matrix
/// (`model.layers.{b}.mlp.experts.{e}.{gate,up,down}_proj.weight`), which convert stacks.
fn expert_matrix(name: &str) -> Option<(u64, u64, &str)> {
    let name = name.strip_prefix("text_model.").unwrap_or(name);
    let rest = name.strip_prefix("model.layers.")?;
    let (bid, rest) = rest.split_once(".mlp.experts.")?;
    let (xid, rest) = rest.split_once('.')?;
    let proj = rest.strip_suffix("_proj.weight")?;
    matches!(proj, "gate" | "up" | "down").then_some(())?;
    Some((bid.parse().ok()?, xid.parse().ok()?, proj))
}

/// The shape config.json implies for a tensor (PyTorch order), when it implies one.
fn expected_shape(cfg: &Config, gguf: &str, vocab: u64) -> Option<Vec<u64>> {
    let (e, f, hd) = (cfg.n_embd, cfg.n_ff, cfg.head_dim);
    let q = cfg.n_head * hd;
    let kv = cfg.n_head_kv * hd;
    if gguf == "token_embd.weight" || gguf == "output.weight" {
        return Some(vec![vocab, e]);
    }
    if gguf == "output_norm.weight" {
        return Some(vec![e]);
    }
    let part = gguf.splitn(3, '.').nth(2)?;
    Some(match part {
        "attn_norm.weight" | "ffn_norm.weight" => vec![e],
        "attn_q.weight" => vec![q, e],
        "attn_k.weight" | "attn_v.weight" => vec![kv, e],
        "attn_q.bias" => vec![q],
        "attn_k.bias" | "attn_v.bias" => vec![kv],
        "attn_output.weight" => vec![e, q],
        "ffn_gate.weight" | "ffn_up.weight" => vec![f, e],
        "ffn_down.weight" => vec![e, f],
        "attn_q_norm.weight" | "attn_k_norm.weight" => vec![hd],
        "ffn_gate_inp.weight" => vec![cfg.moe?.n_expert, e],
        _ => return None,
    })
}

type Planned = (Vec<SourceTensor>, Vec<Recipe>, u32);

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
    let vocab = match (cfg.vocab_size, ckpt.get("model.embed_tokens.weight")) {
        (Some(v), _) => v,
        (None, Some(t)) => t.shape.first().copied().unwrap_or(0),
        (None, None) => 0,
    };
    let mut weight_type: Option<GgmlType> = None;
    // Per-expert matrices by (layer, projection): (expert, checkpoint index).
    let mut experts: std::collections::BTreeMap<(u64, String), Vec<(u64, usize)>> =
        Default::default();
    for (i, t) in ckpt.tensors().iter().enumerate() {
        if let (Some((bid, xid, proj)), Some(_)) = (expert_matrix(&t.name), cfg.moe) {
            experts
                .entry((bid, proj.to_string()))
                .or_default()
                .push((xid, i));
            continue;
        }
        let Some(name) = gguf_name(cfg.arch, &t.name)? else {
            continue;
        };
        if let Some(bid) = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|b| b.parse::<u64>().ok())
        {
            if bid >= cfg.n_layer {
                return Err(LoadError::BadTensor {
                    name: t.name.clone(),
                    why: format!("layer {bid}, but config.json has {} layers", cfg.n_layer),
                });
            }
        }
        let ty = t.ggml_type()?;
        if let Some(want) = expected_shape(cfg, &name, vocab) {
            if t.shape != want {
                return Err(LoadError::ShapeMismatch {
                    name: t.name.clone(),
                    got: t.shape.clone(),
                    want,
                });
            }
        }
        let n: u64 = t.shape.iter().product();
        let bytes = ckpt.bytes(t).len() as u64;
        if bytes != n * ty.type_size() as u64 {
            return Err(LoadError::BadTensor {
                name: t.name.clone(),
                why: format!("{bytes} bytes for {n} {} values", t.dtype),
            });
        }
        let shape: Vec<u64> = t.shape.iter().rev().copied().collect();
        // convert's undo_permute: Q and K (weights and biases) of Llama-style rope.
        let permute_heads = match (cfg.arch, name.rsplit('.').nth(1)) {
            (HfArch::Llama, Some("attn_q")) => Some(cfg.n_head),
            (HfArch::Llama, Some("attn_k")) => Some(cfg.n_head_kv),
            _ => None,
        };
        // convert keeps a mixture of experts' router in F32 (`FFN_GATE_INP`).
        let to_f32 = t.shape.len() <= 1
            || name.ends_with("_norm.weight")
            || name.ends_with("ffn_gate_inp.weight")
            || !name.ends_with(".weight");
        if to_f32 {
            tensors.push(SourceTensor {
                name,
                shape,
                ty: GgmlType::F32,
            });
            recipes.push(Recipe::ToF32 {
                src: i,
                permute_heads,
            });
            continue;
        }
        weight_type.get_or_insert(ty);
        tensors.push(SourceTensor { name, shape, ty });
        recipes.push(Recipe::Copy {
            src: i,
            permute_heads,
        });
    }
    if let Some(moe) = cfg.moe {
        for ((bid, proj), mut list) in experts {
            let stacked = stack_experts(cfg, ckpt, moe, bid, &proj, &mut list)?;
            weight_type.get_or_insert(stacked.0.ty);
            tensors.push(stacked.0);
            recipes.push(stacked.1);
        }
    }
    let have: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let mut required = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    for b in 0..cfg.n_layer {
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
    let file_type = match weight_type {
        Some(GgmlType::F16) => 1,
        Some(GgmlType::BF16) => 32,
        _ => 0,
    };
    Ok((tensors, recipes, file_type))
}

/// Layer `bid`'s `proj` matrices of every expert (`list`: expert id, checkpoint index) as
/// one `[n_expert][rows][cols]` tensor: each expert exactly once, all of the shape
/// config.json implies and of one dtype.
fn stack_experts(
    cfg: &Config,
    ckpt: &Checkpoint,
    moe: config::Moe,
    bid: u64,
    proj: &str,
    list: &mut [(u64, usize)],
) -> Result<(SourceTensor, Recipe), LoadError> {
    let name = format!("blk.{bid}.ffn_{proj}_exps.weight");
    let bad = |why: String| LoadError::BadTensor {
        name: format!("model.layers.{bid}.mlp.experts.*.{proj}_proj.weight"),
        why,
    };
    if bid >= cfg.n_layer {
        return Err(bad(format!(
            "layer {bid}, but config.json has {} layers",
            cfg.n_layer
        )));
    }
    list.sort();
    let ids: Vec<u64> = list.iter().map(|&(x, _)| x).collect();
    if ids != (0..moe.n_expert).collect::<Vec<_>>() {
        let missing = (0..moe.n_expert).find(|x| !ids.contains(x));
        return Err(bad(match missing {
            Some(x) => format!("expert {x} of {} is missing", moe.n_expert),
            None => format!("experts {ids:?}, but config.json has {}", moe.n_expert),
        }));
    }
    let want = match proj {
        "down" => vec![cfg.n_embd, moe.n_ff_exp],
        _ => vec![moe.n_ff_exp, cfg.n_embd],
    };
    let all = ckpt.tensors();
    let ty = all[list[0].1].ggml_type()?;
    for &(_, i) in list.iter() {
        let t = &all[i];
        if t.shape != want {
            return Err(LoadError::ShapeMismatch {
                name: t.name.clone(),
                got: t.shape.clone(),
                want,
            });
        }
        if t.ggml_type()? != ty {
            return Err(bad(format!("experts of dtypes {} and {ty:?}", t.dtype)));
        }
    }
    Ok((
        SourceTensor {
            name,
            shape: vec![want[1], want[0], moe.n_expert],
            ty,
        },
        Recipe::Stack {
            srcs: list.iter().map(|&(_, i)| i).collect(),
        },
    ))
}

impl TensorSource for HfSource {
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    fn data(&self, i: usize) -> Result<Cow<'_, [u8]>, LoadError> {
        let (src, permute_heads, to_f32) = match &self.recipes[i] {
            Recipe::Owned(b) => return Ok(Cow::Borrowed(b)),
            Recipe::Stack { srcs } => {
                let mut out = Vec::new();
                for &s in srcs {
                    out.extend_from_slice(self.ckpt.bytes(&self.st[s]));
                }
                return Ok(Cow::Owned(out));
            }
            Recipe::Copy { src, permute_heads } => (*src, *permute_heads, false),
            Recipe::ToF32 { src, permute_heads } => (*src, *permute_heads, true),
        };
        let st = &self.st[src];
        let bad = |why: String| LoadError::BadTensor {
            name: st.name.clone(),
            why,
        };
        let mut bytes = Cow::Borrowed(self.ckpt.bytes(st));
        if let Some(h) = permute_heads {
            let rows = st.shape.first().copied().unwrap_or(1);
            bytes = Cow::Owned(permute_rows(&bytes, rows, h).map_err(bad)?);
        }
        if !to_f32 {
            return Ok(bytes);
        }
        let ty = st.ggml_type()?;
        let mut vals = vec![0f32; bytes.len() / ty.type_size()];
        smelt_quant::dequantize_row(ty, &bytes, &mut vals).map_err(|e| bad(e.to_string()))?;
        Ok(Cow::Owned(
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ))
    }

    /// Copied weights (nearly all of a folder's bytes) come straight from their shard by
    /// parallel reads, or row by row when rope-permuted; converted vectors through `data`.
    fn read(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        match &self.recipes[i] {
            Recipe::Copy { src, permute_heads } => {
                self.read_copy(&self.st[*src], *permute_heads, offset, buf)
            }
            Recipe::Stack { srcs } => self.read_stack(srcs, offset, buf),
            _ => {
                let d = self.data(i)?;
                buf.copy_from_slice(crate::isq::byte_range(&d, i, offset, buf.len())?);
                Ok(())
            }
        }
    }
}

impl HfSource {
    /// `buf` from a stack of equal-sized tensors at `offset`: each piece straight from its
    /// member's shard.
    fn read_stack(&self, srcs: &[usize], offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        let each = srcs
            .first()
            .map_or(0, |&s| self.ckpt.bytes(&self.st[s]).len() as u64);
        let total = each * srcs.len() as u64;
        let end = offset + buf.len() as u64;
        if end > total {
            let name = srcs
                .first()
                .map_or(String::new(), |&s| self.st[s].name.clone());
            return Err(LoadError::BadTensor {
                name,
                why: format!("bytes {offset}..{end} past the stack's {total} bytes"),
            });
        }
        let (mut at, mut done) = (offset, 0usize);
        while done < buf.len() {
            let (k, within) = ((at / each) as usize, at % each);
            let n = ((each - within) as usize).min(buf.len() - done);
            self.ckpt
                .read_at(&self.st[srcs[k]], within, &mut buf[done..done + n])?;
            at += n as u64;
            done += n;
        }
        Ok(())
    }

    /// `buf` from a copied tensor's bytes at `offset`: straight from its shard by parallel
    /// reads, or, for rope-permuted rows, each output row's piece gathered from its source
    /// row (the whole tensor is never permuted for one chunk).
    fn read_copy(
        &self,
        st: &StTensor,
        permute_heads: Option<u64>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), LoadError> {
        let Some(heads) = permute_heads else {
            return self.ckpt.read_at(st, offset, buf);
        };
        let bytes = self.ckpt.bytes(st);
        let rows = st.shape.first().copied().unwrap_or(1);
        let bad = |why: String| LoadError::BadTensor {
            name: st.name.clone(),
            why,
        };
        let row = row_of(bytes.len(), rows, heads).map_err(bad)?;
        let end = offset as usize + buf.len();
        if end > bytes.len() {
            return Err(bad(format!(
                "bytes {offset}..{end} past its {} bytes",
                bytes.len()
            )));
        }
        let hd = rows as usize / heads as usize;
        let mut at = offset as usize;
        let mut done = 0;
        while at < end {
            let dst = at / row;
            let (h, r) = (dst / hd, dst % hd);
            // Output row h*hd + i*2 + j comes from source row h*hd + j*half + i.
            let src = h * hd + (r % 2) * (hd / 2) + r / 2;
            let within = at % row;
            let n = (row - within).min(end - at);
            let from = src * row + within;
            buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
            at += n;
            done += n;
        }
        Ok(())
    }
}

/// Bytes per row of a tensor of `len` bytes and `rows` rows that splits into `heads` rope
/// heads of an even number of rows.
fn row_of(len: usize, rows: u64, heads: u64) -> Result<usize, String> {
    if heads == 0 || rows % (heads * 2) != 0 || len as u64 % rows.max(1) != 0 {
        return Err(format!(
            "{rows} rows cannot be split into {heads} rope heads"
        ));
    }
    Ok(len / rows as usize)
}

/// convert's `LlamaModel.permute`: within each of `heads` heads, rows `[j * half + i]`
/// (j in 0..2, i in 0..half) move to `[i * 2 + j]`, turning HF's rotate-half rope layout into
/// ggml's interleaved one. A pure row shuffle, so it works on the bytes of any dtype.
pub fn permute_rows(bytes: &[u8], rows: u64, heads: u64) -> Result<Vec<u8>, String> {
    let row = row_of(bytes.len(), rows, heads)?;
    let hd = (rows / heads) as usize;
    let half = hd / 2;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads as usize {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * hd + i * 2 + j;
                let src = h * hd + j * half + i;
                out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, 1 byte per row: [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let out = permute_rows(&[0, 1, 2, 3, 10, 11, 12, 13], 8, 2).expect("permutes");
        assert_eq!(out, [0, 2, 1, 3, 10, 12, 11, 13]);
        assert!(permute_rows(&[0; 6], 6, 2).is_err());
    }

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
        assert_eq!(
            expert_matrix("model.layers.3.mlp.experts.17.down_proj.weight"),
            Some((3, 17, "down"))
        );
        assert_eq!(
            expert_matrix("model.layers.3.mlp.experts.17.w1.weight"),
            None
        );
        assert_eq!(expert_matrix("model.layers.3.mlp.gate_proj.weight"), None);
        assert!(gguf_name(HfArch::Llama, "vision_tower.x.weight").is_err());
    }
}
