//! `smelt quantize`: rewrite a GGUF with its weights in another format or llama.cpp mixture.
//!
//! Tensors stream in chunks of rows through `smelt_load::pipeline`: read ahead in large
//! parallel reads into a few reused staging slots while earlier chunks are quantized (all
//! CPU cores, or a GPU's copy engines and kernels on streams of their own) and written by a
//! writer thread at their offsets in an output file created at its final size, so memory
//! stays at a few chunks however large the model, and writing overlaps the rest.
//!
//! `-v` (or `SMELT_CUDA_LOAD_LOG=1`, which the load benchmarks set) prints where the time
//! went. Measurement switches: `SMELT_WRITE=serial` writes in order through one buffered
//! stream as before (file extended as it grows), `SMELT_WRITE=mmap` copies into a shared
//! mapping of the file instead of `pwrite`; `SMELT_WRITE_THREADS=N` (default 1) sets the
//! writer threads (buffered writes to one file take its inode lock, so more `pwrite`
//! threads only queue on it; a mapping's page faults run in parallel);
//! `SMELT_WRITE_ALLOC=sparse` sizes the output with `ftruncate` instead of allocating its
//! blocks, `SMELT_WRITE_PREFAULT=0` stops a thread of its own faulting its pages in ahead of
//! the writer (`smelt_gguf::GgufPlacedWriter`).
//!
//! Fixed costs overlap: the GPU opens on a thread of its own while the input is planned and
//! the output created (only that GPU visible to the driver, `smelt_cuda::visible`), the
//! pipeline starts with one staging slot and makes the rest as it goes, slots are freed off
//! the writer's path, and the device is released (timed) before the summary.

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_gguf::{GgmlType, Gguf, GgufPlacedWriter, GgufWriter, Metadata, TensorSpec, Value};
use smelt_load::{TensorQuantizer, TensorSource};
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
    /// Say where the time went (reading, quantizing, writing, setup) at the end.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// How the output is written (`SMELT_WRITE`, `SMELT_WRITE_THREADS`; see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteMode {
    /// In order through one buffered stream, the file growing as it goes.
    Serial,
    /// At known offsets of a file created at its size, by this many writer threads.
    Placed(usize),
    /// The same, copied into a shared mapping of the file (a measurement switch).
    Mapped(usize),
}

impl WriteMode {
    fn from_env() -> Result<Self> {
        let threads = match std::env::var("SMELT_WRITE_THREADS") {
            Ok(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .with_context(|| format!("SMELT_WRITE_THREADS={v}: a number from 1 to 64"))?,
            Err(_) => 1,
        };
        match std::env::var("SMELT_WRITE").as_deref() {
            Err(_) | Ok("placed") => Ok(WriteMode::Placed(threads)),
            Ok("serial") => Ok(WriteMode::Serial),
            Ok("mmap") => Ok(WriteMode::Mapped(threads)),
            Ok(other) => bail!("SMELT_WRITE={other}: `placed` (the default), `serial` or `mmap`"),
        }
    }
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
        verbose: args.verbose,
    };
    let verbose = args.verbose || smelt_cuda::GpuOptions::from_env().load_log;
    let mode = WriteMode::from_env()?;
    super::use_threads(args.threads)?;
    let target = Target::parse(&args.ty, args.preset).map_err(anyhow::Error::msg)?;
    let same_file = args.output.exists()
        && std::fs::canonicalize(&args.input).ok() == std::fs::canonicalize(&args.output).ok();
    if same_file {
        bail!("the output must be a different file from the input (it is read while writing)");
    }
    // The GPU opens on a thread of its own (driver start, context, kernel module from the
    // cache: 0.3 s on a one-GPU H100 host, 1 s and more with 4 GPUs visible) while the
    // input is opened and planned and the output created; joined when the pipeline needs it.
    let gpu_open = GpuOpen::start(&args.device)?;
    // A Hugging Face folder streams from its safetensors shards through the same pipeline
    // (its conversion is a tensor source), never assembled in memory.
    let (gguf, hf, gsrc);
    let (md_in, source): (&Metadata, &dyn TensorSource) = if args.input.is_dir() {
        hf = smelt_load::hf::open(&args.input)
            .with_context(|| format!("cannot convert {}", args.input.display()))?;
        (&hf.metadata, &hf.source)
    } else {
        gguf = Gguf::open(&args.input)
            .with_context(|| format!("cannot read {} as a GGUF file", args.input.display()))?;
        gsrc = smelt_load::GgufSource::new(&gguf);
        (gguf.metadata(), &gsrc)
    };

    let tensors: Vec<TensorIn> = source
        .tensors()
        .iter()
        .map(|t| TensorIn {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let model = ModelInfo::from_metadata(md_in);
    let planned = plan::plan(target, &model, &tensors);
    check_plan(&tensors, &planned)?;
    warn_about(&tensors, &planned);

    let md = output_metadata(md_in, target);
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .zip(&planned)
        .map(|(t, p)| TensorSpec {
            name: t.name.clone(),
            ty: p.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let planned_at = start.elapsed();
    let partial = output::Partial::new(&args.output);
    let cannot_create = || format!("cannot create {}", partial.path().display());
    let types: Vec<GgmlType> = planned.iter().map(|p| p.ty).collect();
    let cannot = || format!("cannot quantize into {}", args.output.display());
    // The output is created (at its size, header written) while the GPU opens.
    enum Out {
        Serial(GgufWriter<std::io::BufWriter<std::fs::File>>),
        Placed(GgufPlacedWriter, usize),
    }
    let out = match mode {
        WriteMode::Serial => {
            let file = std::fs::File::create(partial.path()).with_context(cannot_create)?;
            Out::Serial(
                GgufWriter::new(std::io::BufWriter::with_capacity(1 << 20, file), &md, specs)
                    .with_context(cannot_create)?,
            )
        }
        WriteMode::Placed(writers) | WriteMode::Mapped(writers) => {
            let w = if matches!(mode, WriteMode::Mapped(_)) {
                GgufPlacedWriter::create_mapped(partial.path(), &md, specs)
            } else {
                GgufPlacedWriter::create(partial.path(), &md, specs)
            }
            .with_context(cannot_create)?;
            Out::Placed(w, writers)
        }
    };
    let created = start.elapsed();
    let (gpu, gpu_took) = gpu_open.join()?;
    let quantizer: Box<dyn TensorQuantizer> = match gpu {
        Some(gpu) => Box::new(super::isq::GpuQuantizer::new(gpu)),
        None => Box::new(smelt_load::CpuQuantizer),
    };
    let device_name = quantizer.name().to_string();
    let ready_at = start.elapsed();
    let bar = progress::bytes_bar(0, "quantize");
    let summary = match out {
        Out::Serial(w) => {
            smelt_load::isq::stream(source, &types, true, quantizer.as_ref(), w, &bar)
                .with_context(cannot)?
        }
        Out::Placed(w, writers) => smelt_load::isq::stream_placed(
            source,
            &types,
            true,
            quantizer.as_ref(),
            w,
            writers,
            &bar,
        )
        .with_context(cannot)?,
    };
    let streamed_at = start.elapsed();
    partial.commit()?;
    // The device's context and memory go back here, timed (`-v`), not in the process exit.
    let t = Instant::now();
    drop(quantizer);
    let released = t.elapsed();

    let before = super::isq::input_bytes(&args.input);
    let after = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "wrote {} ({target}, {}): {} tensors, {} -> {} ({:.1}%); {}, {:.1} s in all",
        args.output.display(),
        device_name,
        tensors.len(),
        bytes(before),
        bytes(after),
        if before > 0 {
            after as f64 * 100.0 / before as f64
        } else {
            0.0
        },
        summary.line(),
        start.elapsed().as_secs_f64()
    );
    if verbose {
        let s = |d: std::time::Duration| format!("{:.2} s", d.as_secs_f64());
        eprintln!(
            "timing: input opened and planned {} | output created {} ({}) | {device_name} ready \
             {} (its own thread: open {}, waited for {}) | pipeline {} | closed and renamed {} \
             | device released {} | {} in all before exit",
            s(planned_at),
            s(created - planned_at),
            match mode {
                WriteMode::Serial => "serial".to_string(),
                WriteMode::Placed(n) => format!("pwrite, {n} writer thread(s)"),
                WriteMode::Mapped(n) => format!("mmap, {n} writer thread(s)"),
            },
            s(ready_at),
            s(gpu_took),
            s(ready_at - created),
            s(streamed_at - ready_at),
            s(start.elapsed() - streamed_at - released),
            s(released),
            s(start.elapsed()),
        );
        eprintln!("{}", summary.stages_line());
    }
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

type OpenedGpu = Result<Option<std::sync::Arc<smelt_cuda::Gpu>>>;

/// The GPU `--device` names, opening on a thread of its own (`None` for the CPU).
struct GpuOpen {
    thread: Option<std::thread::JoinHandle<(OpenedGpu, std::time::Duration)>>,
}

impl GpuOpen {
    /// Parses `spec` now (a bad name fails at once) and starts opening the device it
    /// names: only that device is made visible to the driver (`smelt_cuda::visible`), so
    /// the driver's start does not set up the host's other GPUs.
    fn start(spec: &str) -> Result<Self> {
        let selected = smelt_engine::Device::select(spec)?;
        if let Some(note) = selected.note {
            eprintln!("{note}");
        }
        let smelt_engine::Device::Cuda(n) = selected.device else {
            return Ok(Self { thread: None });
        };
        smelt_cuda::visible::use_only(&[n]);
        let spec = spec.to_string();
        let thread = std::thread::Builder::new()
            .name("gpu-open".into())
            .spawn(move || {
                let t = Instant::now();
                let gpu = smelt_cuda::Gpu::open(n)
                    .with_context(|| format!("cannot open CUDA device {n} for --device {spec}"));
                if let Ok(gpu) = &gpu {
                    eprintln!("quantizing on {} (cuda:{n})", gpu.name());
                }
                (gpu.map(Some), t.elapsed())
            })
            .context("cannot start the thread that opens the GPU")?;
        Ok(Self {
            thread: Some(thread),
        })
    }

    /// The opened device (or `None` for the CPU) and how long opening it took.
    fn join(self) -> Result<(Option<std::sync::Arc<smelt_cuda::Gpu>>, std::time::Duration)> {
        let Some(thread) = self.thread else {
            return Ok((None, std::time::Duration::ZERO));
        };
        let (gpu, took) = thread
            .join()
            .map_err(|_| anyhow::anyhow!("the thread opening the GPU panicked"))?;
        Ok((gpu?, took))
    }
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
