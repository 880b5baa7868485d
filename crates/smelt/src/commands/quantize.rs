//! `smelt quantize`: rewrite a GGUF with its weights in another format or llama.cpp mixture.
//!
//! Tensors stream one at a time from the input's mmap to the output, so memory stays at
//! about one tensor (as f32) however large the model.

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::fmt::bytes;
use crate::plan::{self, Action, ModelInfo, Planned, Target, TensorIn};
use crate::{output, progress};

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Input GGUF (tensors in F32, F16 or BF16; quantized tensors are dequantized first), a
    /// Hugging Face model folder (converted as llama.cpp's convert_hf_to_gguf.py would), or
    /// an alias (smollm2-135m, gemma3-270m).
    pub input: PathBuf,
    /// Output GGUF to write (overwritten if it exists).
    pub output: PathBuf,
    /// A format (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k): every
    /// tensor of two or more dimensions whose row length is a multiple of the format's block
    /// becomes exactly that format, vectors become f32, and other rows fall back the way
    /// llama.cpp does (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0, q2_k/q3_k -> q4_0, else f16). Or a llama.cpp
    /// mixture preset (q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k q8_0 q4_0
    /// q4_1 q5_0 q5_1 f16 bf16) with llama-quantize's per-tensor rules.
    #[arg(long = "type", short = 't', value_name = "TYPE")]
    pub ty: String,
    /// Read TYPE as a llama.cpp preset even where it also names a format (q8_0, q6_k, q4_0,
    /// f16...): the output tensor gets Q6_K, attn_v/ffn_down get llama.cpp's bumps, and
    /// tensors llama.cpp never quantizes keep their type. Names that are only presets
    /// (q4_k_m...) need no flag.
    #[arg(long)]
    pub preset: bool,
    #[arg(long, value_name = "N", help = super::model_ref::THREADS_HELP)]
    pub threads: Option<usize>,
    /// Where to quantize: `cpu`, or `cuda`/`cuda:N` (`auto` takes a GPU when there is one).
    /// On a GPU, F32/F16/BF16 tensors go through smelt's quantize kernels, byte-identical
    /// to the CPU; other conversions stay on the CPU.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
}

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let start = Instant::now();
    let input = super::model_ref::resolve(&args.input.to_string_lossy())?;
    let args = &QuantizeArgs {
        input,
        output: args.output.clone(),
        ty: args.ty.clone(),
        preset: args.preset,
        threads: args.threads,
        device: args.device.clone(),
    };
    super::use_threads(args.threads)?;
    let target = Target::parse(&args.ty, args.preset).map_err(anyhow::Error::msg)?;
    let same_file = args.output.exists()
        && std::fs::canonicalize(&args.input).ok() == std::fs::canonicalize(&args.output).ok();
    if same_file {
        bail!("the output must be a different file from the input (it is read while writing)");
    }
    // A Hugging Face folder is converted in memory first (smelt-load), then quantized as usual.
    let g = if args.input.is_dir() {
        super::isq::open(&args.input, None, smelt_engine::Device::Cpu)?
    } else {
        Gguf::open(&args.input)
            .with_context(|| format!("cannot read {} as a GGUF file", args.input.display()))?
    };

    let tensors: Vec<TensorIn> = g
        .tensors()
        .iter()
        .map(|t| TensorIn {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let model = ModelInfo::from_metadata(g.metadata());
    let planned = plan::plan(target, &model, &tensors);
    check_plan(&tensors, &planned)?;
    warn_about(&tensors, &planned);

    let md = output_metadata(g.metadata(), target);
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .zip(&planned)
        .map(|(t, p)| TensorSpec {
            name: t.name.clone(),
            ty: p.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let out_bytes: u64 = specs
        .iter()
        .map(|s| {
            let n: u64 = s.shape.iter().product();
            s.ty.row_bytes(n).unwrap_or(0)
        })
        .sum();
    let partial = output::Partial::new(&args.output);
    let mut w = GgufWriter::create(partial.path(), &md, specs)
        .with_context(|| format!("cannot create {}", partial.path().display()))?;

    let gpu = open_gpu(&args.device)?;
    let mut on_gpu = gpu.as_deref().map(smelt_cuda::quantize::Quantizer::new);
    let bar = progress::bytes_bar(out_bytes, "quantize");
    for (info, p) in g.tensors().iter().zip(&planned) {
        bar.set_message(info.name.clone());
        let src = g.tensor_data(info);
        let data = match (p.action, on_gpu.as_mut()) {
            (Action::Copy, _) => std::borrow::Cow::Borrowed(src),
            (Action::Convert, Some(q)) if smelt_cuda::quantize::supports(info.ty, p.ty) => {
                std::borrow::Cow::Owned(
                    convert_gpu(q, info.ty, src, &info.shape, p.ty).with_context(|| {
                        format!("tensor {} ({} -> {}) on the GPU", info.name, info.ty, p.ty)
                    })?,
                )
            }
            (Action::Convert, _) => std::borrow::Cow::Owned(
                convert(info.ty, src, &info.shape, p.ty, &|b| bar.inc(b))
                    .with_context(|| format!("tensor {} ({} -> {})", info.name, info.ty, p.ty))?,
            ),
        };
        w.write_tensor(&info.name, &data).with_context(|| {
            format!(
                "cannot write tensor {} to {}",
                info.name,
                args.output.display()
            )
        })?;
        if p.action == Action::Copy
            || (on_gpu.is_some() && smelt_cuda::quantize::supports(info.ty, p.ty))
        {
            bar.inc(data.len() as u64);
        }
    }
    w.finish()
        .with_context(|| format!("cannot finish {}", partial.path().display()))?;
    partial.commit()?;
    bar.finish_and_clear();

    let before = g.file_size();
    let after = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "wrote {} ({target}): {} tensors, {} -> {} ({:.1}%), {:.1} s",
        args.output.display(),
        tensors.len(),
        bytes(before),
        bytes(after),
        if before > 0 {
            after as f64 * 100.0 / before as f64
        } else {
            0.0
        },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Refuses up front what would fail half-way through writing.
fn check_plan(tensors: &[TensorIn], planned: &[Planned]) -> Result<()> {
    for (t, p) in tensors.iter().zip(planned) {
        if p.action == Action::Convert {
            if !smelt_quant::can_dequantize(t.ty) {
                bail!(
                    "tensor {} is {}, which smelt cannot read as numbers; it cannot be converted to {}",
                    t.name,
                    t.ty,
                    p.ty
                );
            }
            if !smelt_quant::can_quantize(p.ty) {
                bail!(
                    "tensor {} would need {}, which smelt cannot write",
                    t.name,
                    p.ty
                );
            }
        }
    }
    Ok(())
}

/// One warning per kind of surprise, not one per tensor: a model has hundreds.
pub fn warn_about(tensors: &[TensorIn], planned: &[Planned]) {
    let mut dequant: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for (t, p) in tensors.iter().zip(planned) {
        if p.action == Action::Convert && t.ty.is_quantized() {
            *dequant.entry(t.ty).or_default() += 1;
        }
    }
    if !dequant.is_empty() {
        let n: usize = dequant.values().sum();
        let kinds: Vec<String> = dequant.iter().map(|(t, n)| format!("{n} {t}")).collect();
        eprintln!(
            "warning: {n} tensors are already quantized ({}); they are dequantized to f32 and \
             requantized, so their earlier rounding stays in the output",
            kinds.join(", ")
        );
    }
    let mut fallbacks: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (t, p) in tensors.iter().zip(planned) {
        if let Some(msg) = &p.fallback {
            fallbacks.entry(msg.as_str()).or_default().push(&t.name);
        }
    }
    for (msg, names) in fallbacks {
        let more = if names.len() > 1 {
            format!(" and {} more", names.len() - 1)
        } else {
            String::new()
        };
        eprintln!("warning: {}{more}: {msg}", names[0]);
    }
}

/// The input's metadata, with the file type and quantization version llama.cpp writes,
/// and without split keys (the output is one file).
fn output_metadata(input: &Metadata, target: Target) -> Metadata {
    let mut md = Metadata::new();
    for (k, v) in input.iter() {
        md.insert(k, v.clone());
    }
    for key in ["split.no", "split.count", "split.tensors.count"] {
        md.remove(key);
    }
    md.insert("general.quantization_version", Value::U32(2));
    md.insert("general.file_type", Value::U32(target.file_type()));
    md
}

/// Source bytes of any readable type to `dst` bytes on the CPU: the same slice-by-slice
/// path `--isq` uses ([`smelt_load::CpuQuantizer`]), so both write the same bytes.
/// `progress` gets the output bytes of each slice as it is done.
pub fn convert(
    src_ty: GgmlType,
    src: &[u8],
    shape: &[u64],
    dst: GgmlType,
    progress: &dyn Fn(u64),
) -> Result<Vec<u8>> {
    use smelt_load::TensorQuantizer;
    smelt_load::CpuQuantizer
        .quantize(src_ty, src, shape, dst, progress)
        .map_err(|e| anyhow::anyhow!(e))
}

/// The GPU `--device` names, or `None` for the CPU.
fn open_gpu(spec: &str) -> Result<Option<std::sync::Arc<smelt_cuda::Gpu>>> {
    let selected = smelt_engine::Device::select(spec)?;
    if let Some(note) = selected.note {
        eprintln!("{note}");
    }
    match selected.device {
        smelt_engine::Device::Cpu => Ok(None),
        smelt_engine::Device::Cuda(n) => {
            let gpu = smelt_cuda::Gpu::open(n)
                .with_context(|| format!("cannot open CUDA device {n} for --device {spec}"))?;
            eprintln!("quantizing on {} (cuda:{n})", gpu.name());
            Ok(Some(gpu))
        }
    }
}

/// One F32/F16/BF16 tensor quantized on the GPU (whole tensor per launch).
fn convert_gpu(
    q: &mut smelt_cuda::quantize::Quantizer<'_>,
    src_ty: GgmlType,
    src: &[u8],
    shape: &[u64],
    dst: GgmlType,
) -> Result<Vec<u8>> {
    let input = smelt_kernels::quantize::Input::from_ggml(src_ty)
        .with_context(|| format!("{src_ty} is not a GPU quantize input"))?;
    let n: u64 = shape.iter().product();
    if n == 0 {
        return Ok(Vec::new());
    }
    let row = usize::try_from(shape.first().copied().unwrap_or(1))
        .context("row too long for this machine")?;
    let rows = usize::try_from(n).context("tensor too large for this machine")? / row;
    Ok(q.quantize(dst, input, src, rows, row)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_gets_file_type_and_loses_split_keys() {
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::String("llama".into()));
        md.insert("split.count", Value::U16(2));
        md.insert("general.file_type", Value::U32(1));
        let out = output_metadata(
            &md,
            Target::parse("q4_k_m", false).unwrap_or(Target::Exact(GgmlType::F32)),
        );
        assert_eq!(out.get_u64("general.file_type"), Some(15));
        assert_eq!(out.get_u64("general.quantization_version"), Some(2));
        assert!(out.get("split.count").is_none());
        assert_eq!(out.architecture(), Some("llama"));
    }
}
