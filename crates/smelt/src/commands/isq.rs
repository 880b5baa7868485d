//! `--isq TYPE` on the commands that run a model: the model (a GGUF file or a Hugging Face
//! folder) is quantized tensor by tensor as it loads, with the same per-tensor plan as
//! `smelt quantize --type TYPE`, so the in-memory GGUF is the file `smelt quantize` writes.

use anyhow::{bail, Context, Result};
use smelt_engine::Device;
use smelt_gguf::{Gguf, Metadata};
use smelt_load::pipeline::{ProgressFn, Sink, Stage};
use smelt_load::{
    CpuQuantizer, IsqPlan, Job, LoadError, Planner, QuantizeError, SourceTensor, Summary,
    TensorQuantizer, TensorSource,
};
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
/// `smelt_cuda::quantize`, byte-identical to the CPU) and the rest on the CPU. A model goes
/// through in chunks of rows on a few staging slots (reads, uploads, kernels and downloads
/// of different chunks overlap), so the GPU holds a few chunks at a time; the engine
/// uploads the result after.
pub struct GpuQuantizer {
    gpu: std::sync::Arc<smelt_cuda::Gpu>,
    name: String,
}

impl GpuQuantizer {
    /// A quantizer on an opened device.
    pub fn new(gpu: std::sync::Arc<smelt_cuda::Gpu>) -> Self {
        let name = format!("cuda:{}", gpu.ordinal());
        Self { gpu, name }
    }

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

    fn run_pipelined(
        &self,
        source: &dyn TensorSource,
        jobs: &[Job],
        sink: &mut Sink<'_, '_>,
        progress: &ProgressFn<'_>,
    ) -> Option<Result<Summary, LoadError>> {
        Some(run_on_gpu(&self.gpu, source, jobs, sink, progress))
    }
}

/// Staging slots in flight on the GPU: one being read, one uploading, one in the kernel,
/// one downloading (an H100 copies both ways and computes at once).
const GPU_SLOTS: usize = 4;

/// The GPU's pipeline stage: F32/F16/BF16 chunks through [`smelt_cuda::staged`] slots,
/// anything else quantized on the CPU when its turn comes.
struct GpuStage;

/// A GPU staging slot, plus room for a chunk the CPU quantizes.
struct GpuSlot {
    slot: smelt_cuda::staged::Slot,
    on_gpu: bool,
    host_out: Vec<u8>,
}

fn gpu_input(job: &Job) -> Option<smelt_kernels::quantize::Input> {
    smelt_kernels::quantize::Input::from_ggml(job.src_ty)
        .filter(|_| smelt_cuda::quantize::supports(job.src_ty, job.dst_ty))
}

impl Stage for GpuStage {
    type Slot = GpuSlot;
    fn input<'a>(&self, s: &'a mut GpuSlot) -> &'a mut [u8] {
        s.slot.input()
    }
    fn submit(&self, s: &mut GpuSlot, job: &Job) -> Result<(), QuantizeError> {
        s.on_gpu = false;
        if let Some(input) = gpu_input(job) {
            s.slot.submit(job.dst_ty, input, job.rows, job.cols)?;
            s.on_gpu = true;
        }
        Ok(())
    }
    fn complete(&self, s: &mut GpuSlot, job: &Job) -> Result<(), QuantizeError> {
        if s.on_gpu {
            s.slot.complete()?;
            return Ok(());
        }
        s.host_out =
            smelt_load::pipeline::convert_with(&CpuQuantizer, job, &s.slot.input()[..job.src_len])?;
        Ok(())
    }
    fn output<'a>(&self, s: &'a GpuSlot, job: &Job) -> &'a [u8] {
        match (job.convert, s.on_gpu) {
            (false, _) => &s.slot.input_bytes()[..job.src_len],
            (true, true) => s.slot.output(),
            (true, false) => &s.host_out,
        }
    }
}

/// Runs `jobs` through [`GPU_SLOTS`] staging slots on `gpu`, plus one per writer thread of
/// `sink` (see [`smelt_load::pipeline`]).
pub fn run_on_gpu(
    gpu: &std::sync::Arc<smelt_cuda::Gpu>,
    source: &dyn TensorSource,
    jobs: &[Job],
    sink: &mut Sink<'_, '_>,
    progress: &ProgressFn<'_>,
) -> Result<Summary, LoadError> {
    let t = std::time::Instant::now();
    let on_gpu = || jobs.iter().filter(|j| j.convert && gpu_input(j).is_some());
    let max_out = on_gpu().map(|j| j.out_len).max().unwrap_or(0);
    let max_rows = on_gpu().map(|j| j.rows).max().unwrap_or(0);
    let max_in = smelt_load::pipeline::max_src(jobs);
    let staging = |e: smelt_cuda::CudaError| LoadError::Plan {
        why: format!("GPU staging buffers: {e}"),
    };
    let make = || {
        smelt_cuda::staged::slot(gpu, max_in, max_out, max_rows)
            .map(|slot| GpuSlot {
                slot,
                on_gpu: false,
                host_out: Vec::new(),
            })
            .map_err(staging)
    };
    // The first slot now, the others while the first chunks go through (each slot pins
    // ~100 MB: the five took 0.25-0.4 s before the first read on an H100 host).
    let first = make()?;
    let setup = t.elapsed();
    let more = (GPU_SLOTS + sink.extra_slots() - 1).min(jobs.len().saturating_sub(1));
    let mut s = smelt_load::pipeline::run_growing(
        &GpuStage,
        vec![first],
        Some(smelt_load::pipeline::Grow {
            n: more,
            make: &make,
        }),
        source.tensors(),
        jobs,
        &|job, buf| source.read(job.tensor, job.src_offset, buf),
        sink,
        progress,
    )?;
    s.stages.setup = setup;
    Ok(s)
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
        let summary = smelt_load::Summary {
            read: input_bytes(path),
            written: g.file_size(),
            elapsed: start.elapsed(),
            ..Default::default()
        };
        eprintln!(
            "{}: {what} in memory, {} tensors; {}",
            path.display(),
            g.tensors().len(),
            summary.line()
        );
    }
    Ok(g)
}

/// `--isq` straight into a GPU's memory ([`plan_for_device`]), the default since an H100
/// run showed it gives the `smelt quantize` file's weights byte for byte and loads 4.7x
/// faster than the path through host memory (`bench/gpu/load.sh`, bench/RESULTS.md
/// 2026-11-27: 8B bf16 to q6_k, launch to 8 tokens 1.45 s against 6.76 s);
/// `SMELT_ISQ_ON_DEVICE=0` takes the host path (`None`).
pub fn device_plan(
    path: &Path,
    isq: Option<&str>,
    device: Device,
) -> Result<Option<(Gguf, smelt_engine::backend::cuda::isq::DeviceIsq)>> {
    if std::env::var("SMELT_ISQ_ON_DEVICE").is_ok_and(|v| v == "0") {
        return Ok(None);
    }
    plan_for_device(path, isq, device)
}

/// For a GGUF file loaded on CUDA by one device with `--isq`: the source (mapped, not read)
/// and the per-tensor plan of the types that change, which the engine quantizes on the
/// device as it loads (the weights never come back to the host). `None` where that path
/// does not apply: no ISQ, a CPU, a Hugging Face folder, a model with experts or
/// delta-net layers (their loaders read host bytes).
pub fn plan_for_device(
    path: &Path,
    isq: Option<&str>,
    device: Device,
) -> Result<Option<(Gguf, smelt_engine::backend::cuda::isq::DeviceIsq)>> {
    let (Some(isq), Device::Cuda(_)) = (isq, device) else {
        return Ok(None);
    };
    if path.is_dir() {
        return Ok(None);
    }
    let rules = IsqRules::parse(isq)?;
    let g = Gguf::open(path).with_context(|| format!("cannot load {}", path.display()))?;
    let info = smelt_engine::ModelInfo::from_gguf(&g)
        .with_context(|| format!("cannot load {}", path.display()))?;
    if info.moe.is_some() || info.delta.is_some() {
        return Ok(None);
    }
    let src = smelt_load::GgufSource::new(&g);
    let plan = rules
        .plan(g.metadata(), src.tensors())
        .map_err(|why| anyhow::anyhow!("--isq {isq}: {why}"))?;
    let mut types = std::collections::BTreeMap::new();
    for (t, &ty) in src.tensors().iter().zip(&plan.types) {
        if smelt_load::pipeline::converts(t.ty, ty, true) {
            if !smelt_quant::can_quantize(ty) || !smelt_quant::can_dequantize(t.ty) {
                bail!(
                    "--isq {isq}: tensor {} ({}) cannot become {ty}",
                    t.name,
                    t.ty
                );
            }
            types.insert(t.name.clone(), ty);
        }
    }
    drop(src);
    Ok(Some((
        g,
        smelt_engine::backend::cuda::isq::DeviceIsq { types },
    )))
}

/// Bytes of a model's file, or of a folder's safetensors shards.
pub fn input_bytes(path: &Path) -> u64 {
    if !path.is_dir() {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
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

    /// The plan `--isq` hands a GPU (quantize on the device as it loads) names exactly the
    /// tensors whose bytes the in-memory ISQ model changes (the types `smelt quantize`'s plan
    /// gives them: `isq_bytes_equal_smelt_quantize` ties that model to the file); it applies
    /// to GGUF files on CUDA only.
    #[test]
    fn device_plan_is_the_isq_models_types() {
        let path = smollm();
        let (g, plan) = plan_for_device(&path, Some("q4_k_m"), Device::Cuda(0))
            .expect("plans")
            .expect("a GGUF on cuda gets a device plan");
        let rules = IsqRules::parse("q4_k_m").expect("parses");
        let src = smelt_load::GgufSource::new(&g);
        let want = rules.plan(g.metadata(), src.tensors()).expect("plan");
        assert!(!plan.types.is_empty());
        for (t, &ty) in src.tensors().iter().zip(&want.types) {
            match plan.types.get(&t.name) {
                Some(&got) => assert_eq!(got, ty, "{}", t.name),
                None => assert!(
                    ty == t.ty && !t.ty.is_quantized(),
                    "{} ({} -> {ty}) is left out of the plan",
                    t.name,
                    t.ty
                ),
            }
        }
        assert!(plan_for_device(&path, Some("q4_k_m"), Device::Cpu)
            .expect("cpu")
            .is_none());
        assert!(plan_for_device(&path, None, Device::Cuda(0))
            .expect("no isq")
            .is_none());
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
