//! Model sources: a GGUF file or a Hugging Face folder, turned into the GGUF the engine
//! runs, with optional in-situ quantization (ISQ).
//!
//! - A GGUF file without ISQ is mapped as it is (nothing is copied).
//! - A GGUF file with ISQ is requantized tensor by tensor into one in-memory GGUF, the same
//!   bytes `smelt quantize` writes for the same plan.
//! - A Hugging Face folder (config.json, tokenizer.json, safetensors) becomes the GGUF
//!   llama.cpp's convert_hf_to_gguf.py writes for it, in memory, then ISQ'd if asked.
//!
//! Which type each tensor gets is a [`Planner`]'s choice (the CLI passes llama.cpp's
//! rules); how it is quantized is a [`TensorQuantizer`]'s ([`CpuQuantizer`] here, a GPU
//! one from smelt-cuda later).

mod error;
pub mod hf;
pub mod isq;
pub mod pipeline;
mod safetensors;

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use smelt_gguf::Gguf;

pub use error::{LoadError, QuantizeError};
pub use isq::{
    CpuQuantizer, GgufSource, IsqPlan, Planner, SourceTensor, TensorQuantizer, TensorSource,
};
pub use pipeline::{Job, Summary};

/// What a path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Gguf,
    HfFolder,
}

/// A directory is a Hugging Face folder (it must hold config.json, which the conversion
/// checks with a clear error); anything else is read as a GGUF file.
pub fn source_kind(path: &Path) -> Result<SourceKind, LoadError> {
    if path.is_dir() {
        Ok(SourceKind::HfFolder)
    } else if path.is_file() {
        Ok(SourceKind::Gguf)
    } else {
        Err(LoadError::NotAModel {
            path: path.to_path_buf(),
        })
    }
}

/// The model at `path` as a GGUF in the form the engine runs: mapped when it is a GGUF file
/// and no ISQ is asked for, else assembled in memory.
pub fn open(
    path: &Path,
    isq: Option<&dyn Planner>,
    quantizer: &dyn TensorQuantizer,
) -> Result<Gguf, LoadError> {
    if source_kind(path)? == SourceKind::Gguf && isq.is_none() {
        return Ok(Gguf::open(path)?);
    }
    Ok(Gguf::from_bytes(to_bytes(path, isq, quantizer)?)?)
}

/// The bytes of the GGUF [`open`] would run (always assembled in memory).
pub fn to_bytes(
    path: &Path,
    isq: Option<&dyn Planner>,
    quantizer: &dyn TensorQuantizer,
) -> Result<Vec<u8>, LoadError> {
    match source_kind(path)? {
        SourceKind::Gguf => {
            let g = Gguf::open(path)?;
            let src = GgufSource::new(&g);
            build(g.metadata(), &src, isq, quantizer, "isq")
        }
        SourceKind::HfFolder => {
            let m = hf::open(path)?;
            build(&m.metadata, &m.source, isq, quantizer, "convert")
        }
    }
}

fn build(
    metadata: &smelt_gguf::Metadata,
    source: &dyn TensorSource,
    isq: Option<&dyn Planner>,
    quantizer: &dyn TensorQuantizer,
    what: &str,
) -> Result<Vec<u8>, LoadError> {
    let bar = bar(what);
    match isq {
        None => isq::assemble(metadata, source, None, quantizer, &bar),
        Some(p) => {
            let plan = p
                .plan(metadata, source.tensors())
                .map_err(|why| LoadError::Plan { why })?;
            if plan.types.len() != source.tensors().len() {
                return Err(LoadError::Plan {
                    why: format!(
                        "the plan has {} types for {} tensors",
                        plan.types.len(),
                        source.tensors().len()
                    ),
                });
            }
            let md = isq::planned_metadata(metadata, &plan);
            isq::assemble(&md, source, Some(&plan.types), quantizer, &bar)
        }
    }
}

/// A byte-counting bar on stderr for every long load, conversion and quantization: bytes
/// done of the total, the rate and the time left, in decimal units as the summary line
/// (`1.20 GB/3.40 GB (2.10 GB/s, eta 1s)`); hidden when stderr is not a terminal (logs,
/// CI, tests), so redirected output stays clean.
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
        bar.set_style(style);
    }
    bar.set_prefix(what.to_string());
    bar
}

/// The bar's look (indicatif's template language).
pub const BAR_TEMPLATE: &str = "{prefix} [{elapsed_precise}] {wide_bar} {decimal_bytes}/{decimal_total_bytes} ({decimal_bytes_per_sec}, eta {eta}) {msg}";

fn bar(what: &str) -> ProgressBar {
    bytes_bar(0, what)
}
