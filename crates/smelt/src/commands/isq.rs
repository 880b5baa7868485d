//! `--isq TYPE` on the commands that run a model: the model (a GGUF file or a Hugging Face
//! folder) is quantized tensor by tensor as it loads, with the same per-tensor plan as
//! `smelt quantize --type TYPE`, so the in-memory GGUF is the file `smelt quantize` writes.

use anyhow::{Context, Result};
use smelt_engine::Device;
use smelt_gguf::{Gguf, Metadata};
use smelt_load::{CpuQuantizer, IsqPlan, Planner, QuantizeError, SourceTensor, TensorQuantizer};
use std::path::Path;

use super::quantize::warn_about;
use crate::plan::{self, ModelInfo, Target, TensorIn};

/// llama.cpp's per-tensor rules for one `--isq` target (a format or a mixture preset).
pub struct IsqRules(pub Target);

impl IsqRules {
    /// `q8_0`, `q4_k` ... every quantizable tensor in that format (with llama.cpp's
    /// fallbacks for ragged rows), or a preset such as `q4_k_m`.
    pub fn parse(name: &str) -> Result<Self> {
        Target::parse(name, false)
            .map(IsqRules)
            .map_err(|e| anyhow::anyhow!("--isq: {e}"))
    }
}

impl Planner for IsqRules {
    fn plan(&self, metadata: &Metadata, tensors: &[SourceTensor]) -> Result<IsqPlan, String> {
        let ins: Vec<TensorIn> = tensors
            .iter()
            .map(|t| TensorIn {
                name: t.name.clone(),
                ty: t.ty,
                shape: t.shape.clone(),
            })
            .collect();
        let planned = plan::plan(self.0, &ModelInfo::from_metadata(metadata), &ins);
        warn_about(&ins, &planned);
        Ok(IsqPlan {
            types: planned.iter().map(|p| p.ty).collect(),
            file_type: self.0.file_type(),
        })
    }
}

/// Quantizes on a GPU what its kernels cover (F32/F16/BF16 into the ten ggml formats of
/// `smelt_cuda::quantize`, byte-identical to the CPU) and the rest on the CPU. Each tensor is
/// uploaded, quantized and read back on its own, so the GPU holds one source tensor and its
/// output at a time while the model is quantized; the engine uploads the result after.
pub struct GpuQuantizer {
    gpu: std::sync::Arc<smelt_cuda::Gpu>,
    name: String,
}

impl GpuQuantizer {
    pub fn open(ordinal: usize) -> Result<Self> {
        let gpu = smelt_cuda::Gpu::open(ordinal)
            .with_context(|| format!("cannot open CUDA device {ordinal} for --isq"))?;
        Ok(Self {
            gpu,
            name: format!("cuda:{ordinal}"),
        })
    }
}

impl TensorQuantizer for GpuQuantizer {
    fn name(&self) -> &str {
        &self.name
    }

    fn quantize(
        &self,
        src_ty: smelt_gguf::GgmlType,
        src: &[u8],
        shape: &[u64],
        dst: smelt_gguf::GgmlType,
        progress: &dyn Fn(u64),
    ) -> Result<Vec<u8>, QuantizeError> {
        let input = smelt_kernels::quantize::Input::from_ggml(src_ty);
        let (Some(input), true) = (input, smelt_cuda::quantize::supports(src_ty, dst)) else {
            return CpuQuantizer.quantize(src_ty, src, shape, dst, progress);
        };
        let n: u64 = shape.iter().product();
        if n == 0 {
            return Ok(Vec::new());
        }
        let row = usize::try_from(shape.first().copied().unwrap_or(1))?;
        let rows = usize::try_from(n)? / row.max(1);
        let q = smelt_cuda::quantize::quantize_host(&self.gpu, dst, input, src, rows, row)?;
        progress(q.len() as u64);
        Ok(q)
    }
}

/// Opens `path` (GGUF file or Hugging Face folder) for the engine, quantized to `isq` when
/// given (on the GPU when `device` is one); says on stderr what it did and how long it took.
pub fn open(path: &Path, isq: Option<&str>, device: Device) -> Result<Gguf> {
    let rules = isq.map(IsqRules::parse).transpose()?;
    let start = std::time::Instant::now();
    let converting = path.is_dir() || rules.is_some();
    let quantizer: Box<dyn TensorQuantizer> = match (device, &rules) {
        (Device::Cuda(n), Some(_)) => Box::new(GpuQuantizer::open(n)?),
        _ => Box::new(CpuQuantizer),
    };
    let g = smelt_load::open(
        path,
        rules.as_ref().map(|r| r as &dyn Planner),
        quantizer.as_ref(),
    )
    .with_context(|| format!("cannot load {}", path.display()))?;
    if converting {
        let what = match &rules {
            Some(r) => format!("quantized to {} ({})", r.0, quantizer.name()),
            None => "converted".to_string(),
        };
        eprintln!(
            "{}: {what} in memory, {} tensors, {:.1} MB, {:.1} s",
            path.display(),
            g.tensors().len(),
            g.file_size() as f64 / 1e6,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::quantize::{self, QuantizeArgs};
    use clap::Parser;

    /// `smelt quantize`'s own argument parsing, so the test runs what users run.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        q: QuantizeArgs,
    }

    fn smollm() -> std::path::PathBuf {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../.models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            p.is_file(),
            "run scripts/fetch-models.sh all ({})",
            p.display()
        );
        p
    }

    /// The in-memory GGUF of `--isq T` is byte for byte the file `smelt quantize --type T`
    /// writes, for an exact format and for a llama.cpp mixture.
    #[test]
    fn isq_bytes_equal_smelt_quantize() {
        let dir = tempfile::tempdir().expect("tempdir");
        for ty in ["q8_0", "q4_k_m", "q5_1"] {
            let out = dir.path().join(format!("{ty}.gguf"));
            let input = smollm();
            let cli = Cli::parse_from([
                "quantize".as_ref(),
                input.as_os_str(),
                out.as_os_str(),
                "--type".as_ref(),
                ty.as_ref(),
            ]);
            quantize::run(&cli.q).expect("smelt quantize");
            let rules = IsqRules::parse(ty).expect("parses");
            let mem = smelt_load::to_bytes(&smollm(), Some(&rules), &CpuQuantizer).expect("isq");
            let file = std::fs::read(&out).expect("reads");
            assert_eq!(mem.len(), file.len(), "{ty}: sizes");
            assert!(mem == file, "{ty}: bytes differ from smelt quantize's");
        }
    }

    #[test]
    fn unknown_isq_types_are_named() {
        let e = IsqRules::parse("q9_9").err().expect("error").to_string();
        assert!(
            e.contains("--isq") && e.contains("q9_9") && e.contains("q4_k_m"),
            "{e}"
        );
    }
}
