//! `smelt synth`: a random-weight GGUF of a real model's shape, for speed measurements.
//!
//! Speed does not depend on weight values, but NaN/Inf would poison any run, so block
//! formats get random quant bytes under fixed small scales chosen to give weights of
//! standard deviation about 0.02 centred on zero, and float formats get N(0, 0.02). Tensors
//! are generated in parallel and written one at a time.
//!
//! The tiny test shapes (and `--weight-std`) ask for larger weights, so that a two-layer
//! random model has peaked logits and greedy decoding is not decided by rounding: those
//! weights are normals quantized as `smelt quantize` would, in every format.

use anyhow::{bail, Context, Result};
use clap::Args;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};
use std::path::PathBuf;
use std::time::Instant;

use crate::commands::quantize::warn_about;
use crate::fmt::{bytes, count};
use crate::plan::{self, ModelInfo, Planned, Target, TensorIn};
use crate::shapes::{self, ModelShape};
use crate::{output, progress};

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Model shape: llama3-8b, llama3-70b, llama3-1b, qwen3-32b, qwen2.5-0.5b, mistral-7b,
    /// llama2-7b, or a two-layer test shape: llama3-tiny, mistral-tiny, qwen2-tiny, qwen3-tiny.
    #[arg(long)]
    pub shape: String,
    /// Weight type, as `smelt quantize --type` takes it: a format (q4_k, q8_0, f16... with
    /// output.weight in Q6_K for K-quant formats, as llama.cpp does) or a llama.cpp preset
    /// (q4_k_m...).
    #[arg(long, value_name = "TYPE")]
    pub quant: String,
    /// Where to write the GGUF.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Override the layer count (tiny models for tests) [default: the shape's]
    #[arg(long, value_name = "N")]
    pub layers: Option<u64>,
    /// Copy the tokenizer (every tokenizer.* key) of this GGUF and take its vocabulary size,
    /// so llama.cpp can tokenize text. Without it the tokenizer model is "none": llama.cpp
    /// loads the file and runs token ids, but cannot tokenize [default: none]
    #[arg(long, value_name = "GGUF")]
    pub tokenizer_from: Option<PathBuf>,
    /// Random seed; the same seed gives the same file whatever the thread count.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Standard deviation of the random matrices (default: the shape's, 0.02 for real
    /// shapes). Biases get half the spread of the projection they are added to.
    #[arg(long, value_name = "STD")]
    pub weight_std: Option<f32>,
    /// Worker threads (default: all cores); the file is the same whatever the count.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Override the width of one attention head (queries and keys become `n_head` and
    /// `n_head_kv` heads of this many values, as Qwen3 decouples them from the embedding):
    /// test models of any head size, e.g. 80, 96 or 112 for the GPU attention kernels. An
    /// even number; with a K-quant `--quant` the heads must fill whole 256-value blocks
    /// [default: the shape's]
    #[arg(long, value_name = "N")]
    pub head_dim: Option<u64>,
    /// Override a hybrid's Gated DeltaNet key and value head counts, `K,V` (V a multiple of
    /// K): test models whose delta-net heads split over more GPUs (`--tp 4` needs 4 key
    /// heads) [default: the shape's]
    #[arg(long, value_name = "K,V")]
    pub delta_heads: Option<String>,
}

/// `shape` with `spec` (`K,V`) delta-net key and value heads (see `SynthArgs::delta_heads`).
fn with_delta_heads(shape: &mut ModelShape, spec: &str) -> Result<()> {
    let Some(h) = shape.hybrid.as_mut() else {
        bail!("--delta-heads: {} has no Gated DeltaNet layers", shape.name);
    };
    let parse = |s: &str| s.trim().parse::<u64>().ok().filter(|&v| v > 0);
    let (k, v) = match spec.split_once(',') {
        Some((k, v)) => (parse(k), parse(v)),
        None => (None, None),
    };
    match (k, v) {
        (Some(k), Some(v)) if v % k == 0 => {
            h.n_k_heads = k;
            h.n_v_heads = v;
            Ok(())
        }
        _ => bail!("--delta-heads takes K,V: positive counts, V a multiple of K (not {spec:?})"),
    }
}

/// `shape` with heads of `head_dim` values (see `SynthArgs::head_dim`).
fn with_head_dim(shape: &mut ModelShape, head_dim: u64) -> Result<()> {
    if head_dim == 0 || head_dim % 2 != 0 {
        bail!("--head-dim must be a positive even number (rope turns pairs), not {head_dim}");
    }
    shape.head_dim = head_dim;
    Ok(())
}

pub fn run(args: &SynthArgs) -> Result<()> {
    let start = Instant::now();
    super::use_threads(args.threads)?;
    let mut shape = shapes::find(&args.shape)
        .with_context(|| {
            format!(
                "unknown shape `{}`; known shapes: {}",
                args.shape,
                shapes::names()
            )
        })?
        .clone();
    if let Some(n) = args.layers {
        if n == 0 {
            bail!("--layers must be at least 1");
        }
        shape.n_layer = n;
    }
    if let Some(h) = args.head_dim {
        with_head_dim(&mut shape, h)?;
    }
    if let Some(d) = &args.delta_heads {
        with_delta_heads(&mut shape, d)?;
    }
    if let Some(std) = args.weight_std {
        if !(std.is_finite() && std > 0.0) {
            bail!("--weight-std must be a positive number, not {std}");
        }
        shape.weight_std = std;
    }
    let target = Target::parse(&args.quant, false).map_err(anyhow::Error::msg)?;

    let tokenizer = match &args.tokenizer_from {
        Some(p) => Some(tokenizer_of(p)?),
        None => None,
    };
    if let Some((_, n_vocab)) = &tokenizer {
        shape.n_vocab = *n_vocab;
    }
    let md = metadata(&shape, target, tokenizer.map(|(md, _)| md));

    let tensors: Vec<TensorIn> = shape
        .tensors()
        .into_iter()
        .map(|(name, shape)| TensorIn {
            name,
            ty: GgmlType::F32,
            shape,
        })
        .collect();
    let planned = plan_types(
        target,
        &ModelInfo::from_metadata(&md),
        &tensors,
        shape.tied_embeddings,
    );
    warn_about(&tensors, &planned);
    for p in &planned {
        if !smelt_quant::can_quantize(p.ty) && random_block(p.ty).is_none() {
            bail!("smelt cannot make {} tensors", p.ty);
        }
    }

    let specs: Vec<TensorSpec> = tensors
        .iter()
        .zip(&planned)
        .map(|(t, p)| TensorSpec {
            name: t.name.clone(),
            ty: p.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let total: u64 = specs
        .iter()
        .map(|s| s.ty.row_bytes(s.shape.iter().product()).unwrap_or(0))
        .sum();
    let params: u64 = specs.iter().map(|s| s.shape.iter().product::<u64>()).sum();
    let partial = output::Partial::new(&args.output);
    let mut w = GgufWriter::create(partial.path(), &md, specs)
        .with_context(|| format!("cannot create {}", partial.path().display()))?;
    let values = Values::of(&shape);
    let bar = progress::bytes_bar(total, "synth");
    for (i, (t, p)) in tensors.iter().zip(&planned).enumerate() {
        bar.set_message(t.name.clone());
        let data = generate(&t.name, &t.shape, p.ty, &values, args.seed, i as u64)
            .with_context(|| format!("tensor {} ({})", t.name, p.ty))?;
        w.write_tensor(&t.name, &data).with_context(|| {
            format!(
                "cannot write tensor {} to {}",
                t.name,
                args.output.display()
            )
        })?;
        bar.inc(data.len() as u64);
    }
    w.finish()
        .with_context(|| format!("cannot finish {}", partial.path().display()))?;
    partial.commit()?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {}: {} ({} layers, {target}), {} parameters, {} tensors, {}, {:.1} s",
        args.output.display(),
        shape.name,
        shape.n_layer,
        count(params),
        tensors.len(),
        bytes(
            std::fs::metadata(&args.output)
                .map(|m| m.len())
                .unwrap_or(total)
        ),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Types as `smelt quantize` would choose them, plus llama.cpp's habit for whole-model
/// K-quant types: the output projection (or tied embeddings) in Q6_K.
fn plan_types(target: Target, model: &ModelInfo, tensors: &[TensorIn], tied: bool) -> Vec<Planned> {
    let mut planned = plan::plan(target, model, tensors);
    if let Target::Exact(ty) = target {
        let kquant = matches!(
            ty,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K
        );
        for (t, p) in tensors.iter().zip(planned.iter_mut()) {
            let is_output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
            if kquant && is_output && t.shape.first().is_some_and(|r| r % 256 == 0) {
                p.ty = GgmlType::Q6_K;
            }
        }
    }
    planned
}

/// The tokenizer.* keys of another GGUF and its vocabulary size.
fn tokenizer_of(path: &std::path::Path) -> Result<(Vec<(String, Value)>, u64)> {
    let g = Gguf::open(path)
        .with_context(|| format!("cannot read {} as a GGUF file", path.display()))?;
    let keys: Vec<(String, Value)> = g
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let n_vocab = match g.metadata().get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) if !a.is_empty() => a.len() as u64,
        _ => bail!(
            "{} has no tokenizer.ggml.tokens array to copy",
            path.display()
        ),
    };
    Ok((keys, n_vocab))
}

/// Everything llama.cpp reads for these architectures.
fn metadata(s: &ModelShape, target: Target, tokenizer: Option<Vec<(String, Value)>>) -> Metadata {
    let a = s.arch;
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String(a.into()));
    md.insert("general.type", Value::String("model".into()));
    md.insert(
        "general.name",
        Value::String(format!("smelt synth {} (random weights)", s.name)),
    );
    md.insert("general.file_type", Value::U32(target.file_type()));
    md.insert("general.quantization_version", Value::U32(2));
    let u32v = |x: u64| Value::U32(u32::try_from(x).unwrap_or(u32::MAX));
    md.insert(format!("{a}.context_length"), u32v(s.n_ctx_train));
    md.insert(format!("{a}.embedding_length"), u32v(s.n_embd));
    md.insert(format!("{a}.block_count"), u32v(s.n_layer));
    md.insert(format!("{a}.feed_forward_length"), u32v(s.n_ff));
    md.insert(format!("{a}.attention.head_count"), u32v(s.n_head));
    md.insert(format!("{a}.attention.head_count_kv"), u32v(s.n_head_kv));
    md.insert(format!("{a}.attention.key_length"), u32v(s.head_dim));
    md.insert(format!("{a}.attention.value_length"), u32v(s.head_dim));
    md.insert(format!("{a}.rope.dimension_count"), u32v(s.head_dim));
    md.insert(format!("{a}.rope.freq_base"), Value::F32(s.rope_freq_base));
    md.insert(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(s.rms_eps),
    );
    md.insert(format!("{a}.vocab_size"), u32v(s.n_vocab));
    if let Some(h) = &s.hybrid {
        md.insert(format!("{a}.rope.dimension_count"), u32v(h.n_rot));
        if let Some(sections) = h.rope_sections {
            md.insert(
                format!("{a}.rope.dimension_sections"),
                Value::Array(smelt_gguf::Array::I32(sections.to_vec())),
            );
        }
        md.insert(
            format!("{a}.full_attention_interval"),
            u32v(h.full_attention_interval),
        );
        md.insert(format!("{a}.ssm.conv_kernel"), u32v(h.conv_kernel));
        md.insert(format!("{a}.ssm.state_size"), u32v(h.head_dim));
        md.insert(format!("{a}.ssm.group_count"), u32v(h.n_k_heads));
        md.insert(format!("{a}.ssm.time_step_rank"), u32v(h.n_v_heads));
        md.insert(
            format!("{a}.ssm.inner_size"),
            u32v(h.n_v_heads * h.head_dim),
        );
    }
    if let Some(m) = &s.moe {
        md.insert(format!("{a}.expert_count"), u32v(m.n_expert));
        md.insert(format!("{a}.expert_used_count"), u32v(m.n_expert_used));
        md.insert(format!("{a}.expert_feed_forward_length"), u32v(m.n_ff_exp));
        if m.n_ff_shared > 0 {
            md.insert(
                format!("{a}.expert_shared_feed_forward_length"),
                u32v(m.n_ff_shared),
            );
        }
    }
    if let Some(r) = &s.rope_llama3 {
        // What llama.cpp's converter records next to rope_freqs.weight (informational:
        // llama.cpp scales by the tensor alone).
        md.insert(
            format!("{a}.rope.scaling.original_context_length"),
            Value::U32(r.original_context as u32),
        );
    }
    match tokenizer {
        Some(keys) => {
            for (k, v) in keys {
                md.insert(k, v);
            }
        }
        None => md.insert("tokenizer.ggml.model", Value::String("none".into())),
    }
    md
}

/// Weights per generation task: enough to amortise scheduling, small enough to spread a
/// vocabulary-sized tensor over every core.
const CHUNK_WEIGHTS: usize = 1 << 16;
const STD: f32 = 0.02;

/// What values a model's tensors get.
#[derive(Clone, Debug, PartialEq)]
struct Values {
    /// Standard deviation of matrices.
    weight_std: f32,
    /// Standard deviation of biases: half that of `x @ W` for unit-RMS `x`.
    bias_std: f32,
    /// Norm weights are 1 + N(0, norm_std).
    norm_std: f32,
    /// `rope_freqs.weight`, when the shape has Llama 3 rope scaling.
    rope_freqs: Option<Vec<f32>>,
}

impl Values {
    fn of(s: &ModelShape) -> Self {
        Values {
            weight_std: s.weight_std,
            bias_std: 0.5 * s.weight_std * (s.n_embd as f32).sqrt(),
            norm_std: s.norm_std,
            rope_freqs: s
                .rope_llama3
                .map(|r| r.factors(s.rope_freq_base, s.head_dim)),
        }
    }
}

/// One tensor's bytes. Each chunk has its own RNG seeded from (seed, tensor, chunk), so the
/// output does not depend on how rayon schedules the chunks.
fn generate(
    name: &str,
    shape: &[u64],
    ty: GgmlType,
    values: &Values,
    seed: u64,
    index: u64,
) -> Result<Vec<u8>> {
    let n = usize::try_from(shape.iter().product::<u64>())
        .context("tensor too large for this machine")?;
    let rng_for = |chunk: usize| {
        let s = seed
            ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (chunk as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        StdRng::seed_from_u64(s)
    };
    if name == "rope_freqs.weight" {
        return match &values.rope_freqs {
            Some(f) if f.len() == n => float_bytes(ty, f),
            _ => bail!("no rope factors for {n} rotated pairs"),
        };
    }
    if plan::n_dims(shape) < 2 && name.contains("norm") {
        if values.norm_std == 0.0 {
            return float_bytes(ty, &vec![1.0; n]);
        }
        let v = normals(n, values.norm_std, rng_for)?;
        return float_bytes(ty, &v.iter().map(|x| 1.0 + x).collect::<Vec<_>>());
    }
    if name.ends_with(".ssm_a") {
        // -exp(A_log): negative, so the delta-net state decays rather than grows.
        let v = normals(n, 0.3, rng_for)?;
        return float_bytes(ty, &v.iter().map(|x| -(0.05 + x.abs())).collect::<Vec<_>>());
    }
    if plan::n_dims(shape) < 2 && name.ends_with(".bias") {
        return float_bytes(ty, &normals(n, values.bias_std, rng_for)?);
    }
    let std = values.weight_std;
    let random = random_block(ty).filter(|_| std == STD);
    if ty.is_quantized() && random.is_none() {
        // Normals, quantized row by row as `smelt quantize` would.
        let row = usize::try_from(shape.first().copied().unwrap_or(1))
            .context("row too long for this machine")?;
        return Ok(smelt_quant::quantize_tensor(
            ty,
            &normals(n, std, rng_for)?,
            row.max(1),
            None,
        )?);
    }
    if let Some(patch) = random {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        if n % bs != 0 {
            bail!("{n} weights are not a whole number of {ty} blocks");
        }
        let mut out = vec![0u8; n / bs * ts];
        let blocks_per_chunk = (CHUNK_WEIGHTS / bs).max(1);
        out.par_chunks_mut(blocks_per_chunk * ts)
            .enumerate()
            .for_each(|(c, chunk)| {
                rng_for(c).fill_bytes(chunk);
                chunk.chunks_exact_mut(ts).for_each(&patch);
            });
        return Ok(out);
    }
    let normal = Normal::new(0.0f32, std).context("normal distribution")?;
    let encode: fn(f32, &mut [u8]) = match ty {
        GgmlType::F32 => |v, b| b.copy_from_slice(&v.to_le_bytes()),
        GgmlType::F16 => |v, b| b.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        GgmlType::BF16 => |v, b| b.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => bail!("no way to write {ty} weights"),
    };
    // Normals straight into the output bytes: no f32 copy of a vocabulary-sized tensor.
    let size = ty.type_size();
    let mut out = vec![0u8; n * size];
    out.par_chunks_mut(CHUNK_WEIGHTS * size)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = rng_for(c);
            chunk
                .chunks_exact_mut(size)
                .for_each(|b| encode(normal.sample(&mut rng), b));
        });
    Ok(out)
}

/// `n` draws from N(0, std), generated in chunks with their own RNGs (see [`generate`]).
fn normals(n: usize, std: f32, rng_for: impl Fn(usize) -> StdRng + Sync) -> Result<Vec<f32>> {
    let normal = Normal::new(0.0f32, std).context("normal distribution")?;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(CHUNK_WEIGHTS)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = rng_for(c);
            chunk.iter_mut().for_each(|v| *v = normal.sample(&mut rng));
        });
    Ok(out)
}

fn float_bytes(ty: GgmlType, vals: &[f32]) -> Result<Vec<u8>> {
    Ok(match ty {
        GgmlType::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        // A vector in a block format (a tied output in a ragged fallback, say): quantize it.
        _ => {
            let row = vals.len();
            smelt_quant::quantize_tensor(ty, vals, row.max(1), None)?
        }
    })
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// How to turn a block of random bytes into a sane block of `ty`: fixed scales (and
/// minimums, set so the mean weight is about zero) over random quants. `None` for types
/// that are not block formats.
fn random_block(ty: GgmlType) -> Option<fn(&mut [u8])> {
    // Offsets are ggml's block layouts (ggml-common.h).
    Some(match ty {
        // d, qs: weight = d * (q - 8), q uniform in 0..16
        GgmlType::Q4_0 => |b| put_f16(b, 0, 0.004),
        // d, m, qs: weight = d * q + m
        GgmlType::Q4_1 => |b| {
            put_f16(b, 0, 0.004);
            put_f16(b, 2, -0.030);
        },
        // d, qh, qs: weight = d * (q - 16), q uniform in 0..32
        GgmlType::Q5_0 => |b| put_f16(b, 0, 0.002),
        GgmlType::Q5_1 => |b| {
            put_f16(b, 0, 0.002);
            put_f16(b, 2, -0.031);
        },
        // d, qs: weight = d * q, q uniform in -128..128
        GgmlType::Q8_0 => |b| put_f16(b, 0, 2.7e-4),
        // scales[16] (scale | min << 4), qs[64], d, dmin: weight = d*8*q - dmin*1, q in 0..4
        GgmlType::Q2_K => |b| {
            b[..16].fill(0x18);
            put_f16(b, 80, 0.0022);
            put_f16(b, 82, 0.0264);
        },
        // hmask[32], qs[64], scales[12] (6-bit, minus 32: random is centred), d
        GgmlType::Q3_K => |b| put_f16(b, 108, 5e-4),
        // d, dmin, scales[12], qs[128]: all eight sub-block scales and mins 15
        GgmlType::Q4_K => |b| {
            put_f16(b, 0, 3e-4);
            put_f16(b, 2, 2.25e-3);
            b[4..12].fill(15);
            b[12..16].fill(0xFF);
        },
        // d, dmin, scales[12], qh[32], qs[128]: q in 0..32
        GgmlType::Q5_K => |b| {
            put_f16(b, 0, 1.5e-4);
            put_f16(b, 2, 2.3e-3);
            b[4..12].fill(15);
            b[12..16].fill(0xFF);
        },
        // ql[128], qh[64], scales[16] (i8), d: weight = d * scale * (q - 32)
        GgmlType::Q6_K => |b| {
            b[192..208].fill(8);
            put_f16(b, 208, 1.35e-4);
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_heads_override_a_hybrid_and_refuse_the_rest() {
        let mut s = shapes::find("qwen35-tiny").expect("shape").clone();
        with_delta_heads(&mut s, "4,8").expect("4,8");
        let h = s.hybrid.expect("hybrid");
        assert_eq!((h.n_k_heads, h.n_v_heads), (4, 8));
        assert!(s
            .tensors()
            .iter()
            .any(|(n, shape)| n == "blk.0.ssm_out.weight" && shape[0] == 8 * h.head_dim));
        for bad in ["4", "4,6", "0,8", "a,b"] {
            assert!(with_delta_heads(&mut s, bad).is_err(), "{bad}");
        }
        let mut dense = shapes::find("llama3-tiny").expect("shape").clone();
        assert!(with_delta_heads(&mut dense, "4,8").is_err());
    }

    fn real() -> Values {
        Values {
            weight_std: STD,
            bias_std: 0.3,
            norm_std: 0.0,
            rope_freqs: None,
        }
    }

    #[test]
    fn random_blocks_decode_to_small_centred_weights() {
        for ty in [
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
        ] {
            let bytes = generate("w", &[256, 64], ty, &real(), 1, 2).expect("generate");
            let mut vals = vec![0f32; 256];
            let row = bytes.len() / 64;
            let mut sum = 0.0f64;
            let mut sq = 0.0f64;
            for r in 0..64 {
                smelt_quant::dequantize_row(ty, &bytes[r * row..(r + 1) * row], &mut vals)
                    .expect("dequantize");
                for v in &vals {
                    assert!(v.is_finite(), "{ty}");
                    sum += f64::from(*v);
                    sq += f64::from(*v) * f64::from(*v);
                }
            }
            let n = 256.0 * 64.0;
            let mean = sum / n;
            let std = (sq / n - mean * mean).sqrt();
            assert!(mean.abs() < 0.005, "{ty}: mean {mean}");
            assert!((0.01..0.04).contains(&std), "{ty}: std {std}");
        }
    }

    #[test]
    fn a_head_size_override_shapes_the_attention_tensors() {
        let mut shape = shapes::find("qwen3-tiny").expect("shape exists").clone();
        with_head_dim(&mut shape, 80).expect("80");
        let dims = |name: &str| {
            shape
                .tensors()
                .into_iter()
                .find(|t| t.0 == name)
                .map(|t| t.1)
                .expect(name)
        };
        let (q, kv) = (shape.n_head * 80, shape.n_head_kv * 80);
        assert_eq!(dims("blk.0.attn_q.weight"), vec![shape.n_embd, q]);
        assert_eq!(dims("blk.0.attn_k.weight"), vec![shape.n_embd, kv]);
        assert_eq!(dims("blk.0.attn_output.weight"), vec![q, shape.n_embd]);
        assert_eq!(dims("blk.0.attn_q_norm.weight"), vec![80]);
        assert!(with_head_dim(&mut shape, 81).is_err());
        assert!(with_head_dim(&mut shape, 0).is_err());
    }

    #[test]
    fn same_seed_same_bytes() {
        let a = generate("w", &[64, 1000], GgmlType::F16, &real(), 7, 3).expect("generate");
        let b = generate("w", &[64, 1000], GgmlType::F16, &real(), 7, 3).expect("generate");
        assert_eq!(a, b);
        let c = generate("w", &[64, 1000], GgmlType::F16, &real(), 8, 3).expect("generate");
        assert_ne!(a, c);
    }

    fn stats(ty: GgmlType, bytes: &[u8], n: usize) -> (f64, f64) {
        let mut vals = vec![0f32; n];
        smelt_quant::dequantize_row(ty, bytes, &mut vals).expect("dequantize");
        let mean = vals.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = vals
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn tiny_shapes_get_their_scales_in_every_format() {
        let shape = shapes::find("llama3-tiny").expect("shape exists");
        let v = Values::of(shape);
        assert_eq!(v.weight_std, 0.08);
        for ty in [
            GgmlType::F32,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let bytes = generate("blk.0.attn_q.weight", &[256, 64], ty, &v, 3, 4).expect("gen");
            let (mean, std) = stats(ty, &bytes, 256 * 64);
            assert!(mean.abs() < 0.01, "{ty}: mean {mean}");
            assert!((0.07..0.09).contains(&std), "{ty}: std {std}");
        }
        // Biases: half the spread of a projection of a unit-RMS input (0.08 * 16 / 2).
        let bias = generate("blk.0.attn_q.bias", &[4096], GgmlType::F32, &v, 3, 5).expect("gen");
        let (_, std) = stats(GgmlType::F32, &bias, 4096);
        assert!((0.58..0.70).contains(&std), "bias std {std}");
        // Norms jitter around 1.
        let norm =
            generate("blk.0.attn_norm.weight", &[4096], GgmlType::F32, &v, 3, 6).expect("gen");
        let (mean, std) = stats(GgmlType::F32, &norm, 4096);
        assert!(
            (mean - 1.0).abs() < 0.02 && (0.17..0.23).contains(&std),
            "{mean} {std}"
        );
        // rope_freqs.weight carries the Llama 3 factors exactly.
        let f = generate("rope_freqs.weight", &[16], GgmlType::F32, &v, 3, 0).expect("gen");
        let want: Vec<u8> = v
            .rope_freqs
            .as_ref()
            .expect("factors")
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(f, want);
        assert!(generate("rope_freqs.weight", &[8], GgmlType::F32, &v, 3, 0).is_err());
    }
}
