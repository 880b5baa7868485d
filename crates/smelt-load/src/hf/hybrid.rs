//! The Qwen hybrids' Gated DeltaNet side (Qwen3-Next `qwen3next`, Qwen3.5 `qwen35`,
//! Qwen3.5-MoE `qwen35moe`) as convert_hf_to_gguf.py writes it (llama.cpp 0c1e570's
//! Qwen3NextModel and _LinearAttentionVReorderBase, run with `--no-mtp`: smelt runs no
//! multi-token-prediction head, so `mtp.*` is dropped and `block_count` stays the model's).
//!
//! Why a module: these layers are where a folder and its GGUF differ most.
//! - metadata: `ssm.conv_kernel` (`linear_conv_kernel_dim`), `ssm.state_size` (key head
//!   size), `ssm.group_count` (key heads), `ssm.time_step_rank` (value heads),
//!   `ssm.inner_size` (value width), `attention.recurrent_layers` (from `layer_types`),
//!   `full_attention_interval`, `rope.dimension_count` (head size x
//!   `partial_rotary_factor`), and for Qwen3.5 `rope.dimension_sections` ([11, 11, 10, 0]
//!   when config.json has no `mrope_section`);
//! - tensors: `A_log` -> `ssm_a` = -exp(A_log) and `dt_bias` -> `ssm_dt.bias` (F32), the
//!   convolution squeezed to `[channels, kernel]` (F32), `linear_attn.norm` kept as it is
//!   (every other hybrid norm gets + 1, in mod.rs), Qwen3-Next's `in_proj_qkvz` (per key
//!   head `[q, k, v, z]`) regrouped into `attn_qkv` (all q, all k, all v) and `attn_gate`
//!   (z), its `in_proj_ba` kept fused as `ssm_ba`; Qwen3.5's value heads reordered from
//!   grouped by key head to tiled (ggml's broadcast order) wherever they appear.
//!
//! Every regrouping is a [`Gather`] of rows (or column groups), so chunked reads stay
//! straight from the mapped shards.

use smelt_gguf::{Array, Metadata, Value};

use super::config::{Config, HfArch, Hybrid};
use super::source::{F32Op, Gather, Recipe};
use crate::isq::SourceTensor;
use crate::safetensors::Checkpoint;
use crate::LoadError;

/// convert's `_Qwen35MRopeMixin` default, written when config.json has no `mrope_section`.
const QWEN35_SECTIONS: [i32; 4] = [11, 11, 10, 0];

/// The hybrid's metadata keys (`Qwen3NextModel.set_gguf_parameters` and the Qwen3.5 rope
/// sections default).
pub fn hparams(cfg: &Config, h: &Hybrid, md: &mut Metadata) {
    let a = cfg.arch.gguf_name();
    let k = |s: &str| format!("{a}.{s}");
    let u32v = |v: u64| Value::U32(v as u32);
    md.insert(k("ssm.conv_kernel"), u32v(h.conv_kernel));
    md.insert(k("ssm.state_size"), u32v(h.k_head_dim));
    md.insert(k("ssm.group_count"), u32v(h.n_k_heads));
    md.insert(k("ssm.time_step_rank"), u32v(h.n_v_heads));
    md.insert(k("ssm.inner_size"), u32v(h.value_dim()));
    if h.layer_types {
        md.insert(
            k("attention.recurrent_layers"),
            Value::Array(Array::Bool(h.recurrent.clone())),
        );
    }
    md.insert(k("full_attention_interval"), u32v(h.interval));
    md.insert(k("rope.dimension_count"), u32v(h.n_rot));
    let sections = k("rope.dimension_sections");
    if cfg.arch != HfArch::Qwen3Next && md.get(&sections).is_none() {
        md.insert(sections, Value::Array(Array::I32(QWEN35_SECTIONS.to_vec())));
    }
}

/// Value head `p` of the tiled order is head `g * r + j` of the grouped one, where
/// `p = j * n_k + g` (convert's `_reorder_v_heads`: `[n_k, r]` swapped to `[r, n_k]`).
fn tiled_heads(h: &Hybrid) -> Vec<u32> {
    let (nk, r) = (h.n_k_heads, h.ratio());
    (0..h.n_v_heads)
        .map(|p| ((p % nk) * r + p / nk) as u32)
        .collect()
}

/// Rows of `dim` per head, heads in tiled order (`tiled_heads`), after `skip` rows kept.
fn tiled_rows(h: &Hybrid, skip: u64, dim: u64) -> Vec<u32> {
    let heads = tiled_heads(h);
    (0..skip as u32)
        .chain(
            heads
                .iter()
                .flat_map(|&src| (0..dim).map(move |d| (skip + u64::from(src) * dim + d) as u32)),
        )
        .collect()
}

/// Qwen3-Next's `in_proj_qkvz` rows: per key head `[q (hk), k (hk), v (r hv), z (r hv)]`;
/// `attn_qkv` takes all heads' q, then k, then v, `attn_gate` all heads' z.
fn qkvz_rows(h: &Hybrid) -> (Vec<u32>, Vec<u32>) {
    let (hk, rv) = (h.k_head_dim, h.ratio() * h.v_head_dim);
    let per = 2 * hk + 2 * rv;
    let part = |at: u64, width: u64| {
        (0..h.n_k_heads).flat_map(move |g| (0..width).map(move |d| (g * per + at + d) as u32))
    };
    let qkv = part(0, hk).chain(part(hk, hk)).chain(part(2 * hk, rv));
    (qkv.collect(), part(2 * hk + rv, rv).collect())
}

/// Whether layer `bid` of the config is delta-net; an error naming `hf` when the tensor's
/// kind (`recurrent`: a delta-net tensor) disagrees.
pub fn check_kind(h: &Hybrid, bid: u64, recurrent: bool, hf: &str) -> Result<(), LoadError> {
    let is = h.recurrent.get(bid as usize).copied().unwrap_or(false);
    if is == recurrent {
        return Ok(());
    }
    let (kind, other) = match is {
        true => ("Gated DeltaNet", "an attention"),
        false => ("full attention", "a Gated DeltaNet"),
    };
    let by = match h.layer_types {
        true => "layer_types".to_string(),
        false => format!("full_attention_interval {}", h.interval),
    };
    Err(LoadError::BadTensor {
        name: hf.to_string(),
        why: format!("layer {bid} is {kind} in config.json ({by}), but this is {other} tensor"),
    })
}

/// The GGUF tensors a checkpoint's `model.layers.{b}.linear_attn.*` tensor `i` (`name`,
/// prefixes normalised) becomes, `None` for any other tensor.
pub fn plan(
    cfg: &Config,
    h: &Hybrid,
    ckpt: &Checkpoint,
    i: usize,
    name: &str,
) -> Result<Option<Vec<(SourceTensor, Recipe)>>, LoadError> {
    let Some((bid, part)) = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once(".linear_attn."))
    else {
        return Ok(None);
    };
    let t = &ckpt.tensors()[i];
    let unknown = |why: String| LoadError::BadTensor {
        name: t.name.clone(),
        why,
    };
    let bid: u64 = bid.parse().map_err(|_| unknown("no layer number".into()))?;
    if bid >= cfg.n_layer {
        return Err(unknown(format!(
            "layer {bid}, but config.json has {} layers",
            cfg.n_layer
        )));
    }
    check_kind(h, bid, true, &t.name)?;
    let next = cfg.arch == HfArch::Qwen3Next;
    let (e, kd, vd, ch) = (cfg.n_embd, h.key_dim(), h.value_dim(), h.conv_channels());
    let (nv, hv) = (h.n_v_heads, h.v_head_dim);
    // The checkpoint's shape; a convolution may come squeezed already.
    let want = match part {
        "in_proj_qkvz.weight" if next => vec![2 * kd + 2 * vd, e],
        "in_proj_ba.weight" if next => vec![2 * nv, e],
        "in_proj_qkv.weight" if !next => vec![ch, e],
        "in_proj_z.weight" if !next => vec![vd, e],
        "in_proj_b.weight" | "in_proj_a.weight" if !next => vec![nv, e],
        "conv1d.weight" if t.shape.len() == 2 => vec![ch, h.conv_kernel],
        "conv1d.weight" => vec![ch, 1, h.conv_kernel],
        "dt_bias" | "A_log" => vec![nv],
        "norm.weight" => vec![hv],
        "out_proj.weight" => vec![e, vd],
        _ => {
            return Err(unknown(format!(
                "linear_attn.{part} is not a tensor of a {} model",
                cfg.arch.gguf_name()
            )))
        }
    };
    let ty = super::checked(ckpt, t, Some(want))?;
    let ts = ty.type_size();
    let row = e as usize * ts;
    let gguf = |p: &str| format!("blk.{bid}.{p}");
    let tensor = |p: &str, shape: Vec<u64>, ty| SourceTensor {
        name: gguf(p),
        shape,
        ty,
    };
    let copy = |gather| Recipe::Copy { src: i, gather };
    let to_f32 = |gather, op| Recipe::ToF32 { src: i, gather, op };
    let tiled =
        |rows: usize, seg: usize, map: Vec<u32>| h.tiled.then(|| Gather::rows(seg, rows, map));
    let f = smelt_gguf::GgmlType::F32;
    let out = match part {
        "in_proj_qkvz.weight" => {
            let (qkv, z) = qkvz_rows(h);
            let rows = (2 * kd + 2 * vd) as usize;
            vec![
                (
                    tensor("attn_qkv.weight", vec![e, ch], ty),
                    copy(Some(Gather::rows(row, rows, qkv))),
                ),
                (
                    tensor("attn_gate.weight", vec![e, vd], ty),
                    copy(Some(Gather::rows(row, rows, z))),
                ),
            ]
        }
        "in_proj_ba.weight" => vec![(tensor("ssm_ba.weight", vec![e, 2 * nv], ty), copy(None))],
        "in_proj_qkv.weight" => vec![(
            tensor("attn_qkv.weight", vec![e, ch], ty),
            copy(tiled(ch as usize, row, tiled_rows(h, 2 * kd, hv))),
        )],
        "in_proj_z.weight" => vec![(
            tensor("attn_gate.weight", vec![e, vd], ty),
            copy(tiled(vd as usize, row, tiled_rows(h, 0, hv))),
        )],
        "in_proj_b.weight" | "in_proj_a.weight" => {
            let p = match part {
                "in_proj_b.weight" => "ssm_beta.weight",
                _ => "ssm_alpha.weight",
            };
            vec![(
                tensor(p, vec![e, nv], ty),
                copy(tiled(nv as usize, row, tiled_heads(h))),
            )]
        }
        "conv1d.weight" => {
            let k = h.conv_kernel;
            vec![(
                tensor("ssm_conv1d.weight", vec![k, ch], f),
                to_f32(
                    tiled(ch as usize, k as usize * ts, tiled_rows(h, 2 * kd, hv)),
                    F32Op::Keep,
                ),
            )]
        }
        "dt_bias" | "A_log" => {
            let (p, op) = match part {
                "dt_bias" => ("ssm_dt.bias", F32Op::Keep),
                _ => ("ssm_a", F32Op::NegExp),
            };
            vec![(
                tensor(p, vec![nv], f),
                to_f32(tiled(nv as usize, ts, tiled_heads(h)), op),
            )]
        }
        "norm.weight" => vec![(
            tensor("ssm_norm.weight", vec![hv], f),
            to_f32(None, F32Op::Keep),
        )],
        _ => {
            // out_proj: each row's value heads, `hv` columns each, in tiled order.
            let gather = h.tiled.then(|| Gather {
                seg: hv as usize * ts,
                out_period: nv as usize,
                in_period: nv as usize,
                map: tiled_heads(h),
            });
            vec![(tensor("ssm_out.weight", vec![vd, e], ty), copy(gather))]
        }
    };
    Ok(Some(out))
}

/// Layer `b`'s tensors llama.cpp needs, by its kind and FFN.
pub fn required(cfg: &Config, h: &Hybrid, b: u64) -> Vec<String> {
    let mut parts = vec!["attn_norm.weight", "post_attention_norm.weight"];
    if h.recurrent[b as usize] {
        parts.extend([
            "attn_qkv.weight",
            "attn_gate.weight",
            "ssm_conv1d.weight",
            "ssm_dt.bias",
            "ssm_a",
            "ssm_norm.weight",
            "ssm_out.weight",
        ]);
        match cfg.arch {
            HfArch::Qwen3Next => parts.push("ssm_ba.weight"),
            _ => parts.extend(["ssm_beta.weight", "ssm_alpha.weight"]),
        }
    } else {
        parts.extend([
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
        ]);
    }
    match cfg.moe {
        Some(m) => {
            parts.extend([
                "ffn_gate_inp.weight",
                "ffn_gate_exps.weight",
                "ffn_up_exps.weight",
                "ffn_down_exps.weight",
            ]);
            if m.n_ff_shared.is_some() {
                parts.extend([
                    "ffn_gate_inp_shexp.weight",
                    "ffn_gate_shexp.weight",
                    "ffn_up_shexp.weight",
                    "ffn_down_shexp.weight",
                ]);
            }
        }
        None => parts.extend(["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]),
    }
    parts.iter().map(|p| format!("blk.{b}.{p}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid(nk: u64, nv: u64, hk: u64, hv: u64) -> Hybrid {
        Hybrid {
            conv_kernel: 4,
            k_head_dim: hk,
            v_head_dim: hv,
            n_k_heads: nk,
            n_v_heads: nv,
            recurrent: vec![true, false],
            layer_types: false,
            interval: 2,
            n_rot: 16,
            tiled: nk != nv,
        }
    }

    #[test]
    fn value_heads_tile() {
        // Two key heads, three value heads each: grouped [K0v0 K0v1 K0v2 K1v0 K1v1 K1v2]
        // become [K0v0 K1v0 K0v1 K1v1 K0v2 K1v2].
        let h = hybrid(2, 6, 1, 1);
        assert_eq!(tiled_heads(&h), [0, 3, 1, 4, 2, 5]);
        let h = hybrid(2, 4, 1, 2);
        assert_eq!(tiled_rows(&h, 3, 2), [0, 1, 2, 3, 4, 7, 8, 5, 6, 9, 10]);
    }

    #[test]
    fn qkvz_regroups_per_key_head() {
        // Two key heads of 1, two value heads of 1 per key head: per head [q k v v z z].
        let (qkv, z) = qkvz_rows(&hybrid(2, 4, 1, 1));
        assert_eq!(qkv, [0, 6, 1, 7, 2, 3, 8, 9]);
        assert_eq!(z, [4, 5, 10, 11]);
    }

    #[test]
    fn layer_kinds_are_checked() {
        let h = hybrid(2, 4, 1, 1);
        assert!(check_kind(&h, 0, true, "x").is_ok());
        let e = check_kind(&h, 1, true, "model.layers.1.linear_attn.A_log")
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer 1 is full attention"), "{e}");
    }
}
