//! A mixture of experts' matrices as convert_hf_to_gguf.py's Qwen2MoeModel writes them: one
//! 3-D tensor per projection and layer (`ffn_{gate,up,down}_exps`), made either by stacking
//! the per-expert matrices older checkpoints hold
//! (`mlp.experts.{e}.{gate,up,down}_proj.weight`) or from the fused 3-D tensors transformers
//! 5 writes (`mlp.experts.gate_up_proj`, split in its gate and up halves, and
//! `mlp.experts.down_proj`). Why a module: both layouts meet the same checks (every expert
//! once, the shape config.json implies, one dtype) and the same GGUF names.

use smelt_gguf::GgmlType;

use super::config::{Config, Moe};
use super::source::{Gather, Recipe};
use crate::isq::SourceTensor;
use crate::safetensors::Checkpoint;
use crate::LoadError;

/// `(layer, expert, projection)` of a per-expert matrix
/// (`model.layers.{b}.mlp.experts.{e}.{gate,up,down}_proj.weight`), which convert stacks.
pub fn expert_matrix(name: &str) -> Option<(u64, u64, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (bid, rest) = rest.split_once(".mlp.experts.")?;
    let (xid, rest) = rest.split_once('.')?;
    let proj = rest.strip_suffix("_proj.weight")?;
    matches!(proj, "gate" | "up" | "down").then_some(())?;
    Some((bid.parse().ok()?, xid.parse().ok()?, proj))
}

/// `(layer, projection)` of a fused 3-D experts tensor
/// (`model.layers.{b}.mlp.experts.{gate_up,down}_proj`, `.weight` or not).
pub fn fused_matrix(name: &str) -> Option<(u64, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (bid, rest) = rest.split_once(".mlp.experts.")?;
    let proj = rest.strip_suffix(".weight").unwrap_or(rest);
    let proj = proj.strip_suffix("_proj")?;
    matches!(proj, "gate_up" | "down").then_some(())?;
    Some((bid.parse().ok()?, proj))
}

fn check_layer(cfg: &Config, bid: u64, name: &str) -> Result<(), LoadError> {
    if bid >= cfg.n_layer {
        return Err(LoadError::BadTensor {
            name: name.to_string(),
            why: format!("layer {bid}, but config.json has {} layers", cfg.n_layer),
        });
    }
    Ok(())
}

/// A fused experts tensor (`fused_matrix`) as convert splits it: `down_proj`
/// (`[n_expert, n_embd, n_ff_exp]`) as it is, `gate_up_proj` (`[n_expert, 2 * n_ff_exp,
/// n_embd]`) as its first half of rows per expert (gate) and its second (up).
pub fn fused(
    cfg: &Config,
    ckpt: &Checkpoint,
    moe: Moe,
    i: usize,
    bid: u64,
    proj: &str,
) -> Result<Vec<(SourceTensor, Recipe)>, LoadError> {
    let t = &ckpt.tensors()[i];
    check_layer(cfg, bid, &t.name)?;
    let (e, ff, ne) = (cfg.n_embd, moe.n_ff_exp, moe.n_expert);
    let want = match proj {
        "down" => vec![ne, e, ff],
        _ => vec![ne, 2 * ff, e],
    };
    let ty = super::checked(ckpt, t, Some(want))?;
    let tensor = |p: &str, shape: Vec<u64>| SourceTensor {
        name: format!("blk.{bid}.ffn_{p}_exps.weight"),
        shape,
        ty,
    };
    if proj == "down" {
        let recipe = Recipe::Copy {
            src: i,
            gather: None,
        };
        return Ok(vec![(tensor("down", vec![ff, e, ne]), recipe)]);
    }
    let half = |from: u64| Gather {
        seg: e as usize * ty.type_size(),
        out_period: ff as usize,
        in_period: 2 * ff as usize,
        map: (from..from + ff).map(|r| r as u32).collect(),
    };
    Ok(["gate", "up"]
        .into_iter()
        .zip([0, ff])
        .map(|(p, from)| {
            let recipe = Recipe::Copy {
                src: i,
                gather: Some(half(from)),
            };
            (tensor(p, vec![e, ff, ne]), recipe)
        })
        .collect())
}

/// Layer `bid`'s `proj` matrices of every expert (`list`: expert id, checkpoint index) as
/// one `[n_expert][rows][cols]` tensor: each expert exactly once, all of the shape
/// config.json implies and of one dtype.
pub fn stack(
    cfg: &Config,
    ckpt: &Checkpoint,
    moe: Moe,
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
    let ty: GgmlType = all[list[0].1].ggml_type()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(
            expert_matrix("model.layers.3.mlp.experts.17.down_proj.weight"),
            Some((3, 17, "down"))
        );
        assert_eq!(
            expert_matrix("model.layers.3.mlp.experts.17.w1.weight"),
            None
        );
        assert_eq!(expert_matrix("model.layers.3.mlp.gate_proj.weight"), None);
        assert_eq!(
            expert_matrix("model.layers.3.mlp.experts.gate_up_proj"),
            None
        );
        assert_eq!(
            fused_matrix("model.layers.3.mlp.experts.gate_up_proj"),
            Some((3, "gate_up"))
        );
        assert_eq!(
            fused_matrix("model.layers.0.mlp.experts.down_proj.weight"),
            Some((0, "down"))
        );
        assert_eq!(
            fused_matrix("model.layers.0.mlp.experts.0.down_proj.weight"),
            None
        );
    }
}
