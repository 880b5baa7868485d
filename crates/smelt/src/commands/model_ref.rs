//! `-m/--model`: a GGUF path, a Hugging Face folder or a short alias of a model the project
//! knows how to fetch, the same for every command (with one default model), and the loading
//! shared by the commands that run a model (`run`, `chat`, `perplexity`, `bench`, `serve`).
//! The help texts of the flags those commands share live here too, so they read the same.

use anyhow::{bail, Context, Result};
use smelt_engine::{Device, Engine, EngineOptions, GpuMemory};
use smelt_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The model a command uses when none is given (SmolLM2-135M-Instruct, 93 MB).
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// `-m/--model`'s help, for every command.
pub const MODEL_HELP: &str = "A GGUF file, a Hugging Face model folder (config.json, \
tokenizer.json, safetensors) or an alias (smollm2-135m, gemma3-270m), fetched once into \
.models/";

/// `--device`'s help, for every command that runs a model.
pub const DEVICE_HELP: &str = "Where to compute: cpu; cuda (the first NVIDIA GPU) or cuda:N \
(GPU N), which need only the NVIDIA driver; auto: the GPU when one is usable, else the CPU, \
and says which";

/// `--tp`'s help, for every command that runs a model.
pub const TP_HELP: &str = "Tensor parallelism: split the model over N GPUs (cuda:0..N-1, or \
the GPUs --device lists: cuda:0,1,...), one thread each, summed with all-reduces (small \
ones by a one-shot kernel over peer GPU memory, the rest and SMELT_TP_PEER=0 by NCCL); \
attention and delta-net heads (with their recurrent state), FFN rows and experts are split. \
NCCL (libnccl.so.2) is loaded at run time: from SMELT_NCCL (the file or its folder), \
LD_LIBRARY_PATH, the system's path, or a Python environment's nvidia/nccl/lib (PyTorch's). \
--tp 1 runs the same sharded path on one GPU. With --device cpu, N simulated ranks \
[default: none: the whole model on one device, or every GPU --device lists]";

/// The devices of a tensor-parallel run, when `--tp` is given or `--device` lists several
/// GPUs (`cuda:0,1`); `None` for a single-device run.
pub fn tp_devices(device: &str, tp: Option<usize>) -> Result<Option<Vec<Device>>> {
    if tp.is_none() && !device.contains(',') {
        return Ok(None);
    }
    if tp == Some(0) {
        bail!("--tp must be at least 1");
    }
    let spec = if device.trim().eq_ignore_ascii_case("auto") {
        match Device::auto().device {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    } else {
        device
    };
    let devices = smelt_engine::tp::tp_devices(spec, tp.unwrap_or(1))
        .map_err(|e| anyhow::anyhow!("--device {device}: {e}"))?;
    for d in &devices {
        d.check().with_context(|| format!("--device {device}"))?;
    }
    Ok(Some(devices))
}

/// `--threads`' help, for every command that computes on the CPU.
pub const THREADS_HELP: &str = "CPU threads [default: the cores this process may use: its \
CPU affinity and cgroup quota]. Results are the same for any count";

/// `--batch-invariant`'s help, for `run`, `serve` and `bench`.
pub const BATCH_INVARIANT_HELP: &str = "On a GPU, make every sequence's output independent \
of the others in its steps and of how its prompt is cut into chunks (same tokens alone or \
among 64): every matmul on the tensor-core GEMM and every attention on the tiled prompt \
kernel. Costs single-stream decode speed (about a quarter of it on an H100). On the CPU, \
every row in its one-token order instead of llama.cpp's batch orders (which Q4_K, Q6_K and \
float weights, and prompt attention, take): slower prompts, no longer llama.cpp's bits. \
Without it the server still feeds prompts and recomputes preempted sequences so that each \
answer keeps its bits under load, but a K-quant model's rows depend on the step [default: off]";

/// Aliases and the file `scripts/fetch-models.sh` writes for each.
const ALIASES: &[(&str, &str)] = &[
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
];

/// The aliases' names (what `smelt serve` lets `/admin/models` load besides its folders).
pub fn alias_names() -> Vec<String> {
    ALIASES.iter().map(|(a, _)| a.to_string()).collect()
}

/// The GGUF file (or Hugging Face model folder) `model` names: an existing path as it is;
/// an alias found in `$SMELT_MODELS` or the repository's `.models/`; else fetched by the
/// repository's script when there is one. Anything else is an error that says how to get
/// the file.
pub fn resolve(model: &str) -> Result<PathBuf> {
    let as_path = Path::new(model);
    if as_path.is_file() || as_path.is_dir() {
        return Ok(clean(as_path));
    }
    let Some(&(alias, file)) = ALIASES.iter().find(|(a, _)| *a == model) else {
        let known: Vec<&str> = ALIASES.iter().map(|(a, _)| *a).collect();
        bail!(
            "model {model:?} is neither a file nor a known alias ({})",
            known.join(", ")
        );
    };
    for dir in cache_dirs() {
        let p = dir.join(file);
        if p.is_file() {
            return Ok(clean(&p));
        }
    }
    let Some(script) = fetch_script() else {
        bail!(
            "model {alias} is not in $SMELT_MODELS or .models/ and the fetch script is not \
             here: run scripts/fetch-models.sh {alias} from a smelt checkout, or pass a GGUF path"
        );
    };
    eprintln!("fetching {alias} with {}", script.display());
    let out = Command::new("bash")
        .arg(&script)
        .arg(alias)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} {alias} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().map(str::trim).unwrap_or("");
    if path.is_empty() || !Path::new(path).is_file() {
        bail!(
            "{} {alias} printed no model path ({path:?})",
            script.display()
        );
    }
    Ok(clean(Path::new(path)))
}

/// Where fetched models live: `$SMELT_MODELS`, then `.models/` of the checkout this binary
/// was built from, then `.models/` under the current directory.
fn cache_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SMELT_MODELS") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(root) = repo_root() {
        dirs.push(root.join(".models"));
    }
    dirs.push(PathBuf::from(".models"));
    dirs
}

fn fetch_script() -> Option<PathBuf> {
    let mut roots: Vec<PathBuf> = repo_root().into_iter().collect();
    roots.push(PathBuf::from("."));
    roots
        .into_iter()
        .map(|r| r.join("scripts/fetch-models.sh"))
        .find(|p| p.is_file())
}

/// The checkout this binary was built from, when it is still there (as a clean absolute
/// path: it shows in messages and logs).
fn repo_root() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = std::fs::canonicalize(root).ok()?;
    root.join("Cargo.toml").is_file().then_some(root)
}

/// `path` as an absolute path without `.` and `..` parts, for messages and logs. The file
/// name stays as given (a symlink is not resolved: the served model name comes from it).
pub fn clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `--device`: `auto`, `cpu`, `cuda` or `cuda:N`. `auto` says on stderr what it picked; an
/// explicit GPU that is not there is an error naming what is missing.
pub fn check_device(device: &str) -> Result<Device> {
    let sel = Device::select(device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    if let Some(note) = &sel.note {
        eprintln!("{note}");
    }
    if let Device::Cuda(n) = sel.device {
        // One device: the driver's start sets up only it (smelt_cuda::visible).
        smelt_cuda::visible::use_only(&[n]);
    }
    sel.device
        .check()
        .with_context(|| format!("--device {device}"))?;
    Ok(sel.device)
}

/// A model loaded for running: the engine and its tokenizer.
pub struct Loaded {
    pub path: PathBuf,
    pub engine: Engine,
    pub tokenizer: Tokenizer,
}

/// Resolves `model`, loads its weights with room for `kv_tokens` tokens of KV cache, and
/// builds its tokenizer.
pub fn load(model: &str, device: &str, threads: Option<usize>, kv_tokens: usize) -> Result<Loaded> {
    load_isq(model, device, threads, kv_tokens, None)
}

/// [`load`], with the weights quantized to `isq` (`--isq TYPE`) as they load; `model` may
/// also be a Hugging Face folder (converted in memory as convert_hf_to_gguf.py would).
pub fn load_isq(
    model: &str,
    device: &str,
    threads: Option<usize>,
    kv_tokens: usize,
    isq: Option<&str>,
) -> Result<Loaded> {
    let kv = KvArgs {
        tokens: kv_tokens,
        ..KvArgs::default()
    };
    load_kv(model, device, threads, &kv, isq)
}

/// How big a KV cache to give a model (`--ctx`/`--kv-tokens`, `--gpu-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvArgs {
    /// Tokens it holds; with `gpu_memory` on a GPU, the least it must hold.
    pub tokens: usize,
    /// On a GPU: fill this fraction of its memory (see `smelt_engine::gpu_memory`).
    pub gpu_memory: Option<GpuMemory>,
    /// Results independent of the batch (`EngineOptions::batch_invariant`).
    pub batch_invariant: bool,
    /// The most tokens one step carries (measured before the cache is sized from memory).
    pub step_tokens: usize,
    /// `--tp N`: tensor parallelism over N devices (see [`tp_devices`]).
    pub tp: Option<usize>,
}

impl Default for KvArgs {
    fn default() -> Self {
        let d = EngineOptions::default();
        KvArgs {
            tokens: d.kv_tokens,
            gpu_memory: d.gpu_memory,
            batch_invariant: d.batch_invariant,
            step_tokens: d.step_tokens,
            tp: None,
        }
    }
}

/// [`load_isq`] with the KV cache sized by `kv`.
pub fn load_kv(
    model: &str,
    device: &str,
    threads: Option<usize>,
    kv: &KvArgs,
    isq: Option<&str>,
) -> Result<Loaded> {
    let (device, tp) = devices(device, kv.tp)?;
    let path = resolve(model)?;
    let engine = load_engine(&path, device, tp.as_deref(), threads, kv, isq)?;
    let tokenizer = Tokenizer::from_gguf(engine.gguf().metadata())
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    Ok(Loaded {
        path,
        engine,
        tokenizer,
    })
}

/// The device `--device` names (checked), and with `--tp` (or several GPUs listed) the
/// devices of the tensor-parallel run, the first of them the device.
pub fn devices(device: &str, tp: Option<usize>) -> Result<(Device, Option<Vec<Device>>)> {
    let tp = tp_devices(device, tp)?;
    let device = match &tp {
        Some(d) => d[0],
        None => check_device(device)?,
    };
    Ok((device, tp))
}

/// The engine of the model at `path` (a GGUF file or a Hugging Face folder, converted in
/// memory as convert_hf_to_gguf.py would, with the weights quantized to `isq` as they load)
/// on `device`, or split over `tp`'s devices ([`devices`]), with the KV cache sized by `kv`:
/// what [`load_kv`] loads, without the tokenizer (`smelt bench` feeds token ids).
pub fn load_engine(
    path: &Path,
    device: Device,
    tp: Option<&[Device]>,
    threads: Option<usize>,
    kv: &KvArgs,
    isq: Option<&str>,
) -> Result<Engine> {
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let mut opts = EngineOptions {
        threads,
        kv_tokens: kv.tokens,
        device,
        gpu_memory: kv.gpu_memory,
        batch_invariant: kv.batch_invariant,
        step_tokens: kv.step_tokens,
        ..EngineOptions::default()
    };
    let on_device = match tp {
        None => super::isq::device_plan(path, isq, device)?,
        Some(_) => None,
    };
    let gguf = match on_device {
        Some((g, plan)) => {
            opts.device_isq = Some(std::sync::Arc::new(plan));
            g
        }
        None => super::isq::open(path, isq, device)?,
    };
    match (tp, device) {
        (Some(devices), _) => Engine::from_gguf_tp(std::sync::Arc::new(gguf), &opts, devices)
            .with_context(|| format!("cannot load {}", path.display())),
        (None, Device::Cuda(n)) => gpu_load(path, gguf, &opts, n),
        (None, Device::Cpu) => Engine::from_gguf(std::sync::Arc::new(gguf), &opts)
            .with_context(|| format!("cannot load {}", path.display())),
    }
}

/// The engine on GPU `n`, with a progress bar of the weights going to the device (on a
/// terminal) and a summary line after: what was read and uploaded, in how long.
fn gpu_load(path: &Path, gguf: smelt_gguf::Gguf, opts: &EngineOptions, n: usize) -> Result<Engine> {
    use smelt_engine::backend::cuda::upload::loaded_bytes;
    let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes()).sum();
    let start = std::time::Instant::now();
    let before = loaded_bytes();
    let bar = crate::progress::bytes_bar(total, "load");
    let done = std::sync::atomic::AtomicBool::new(false);
    let engine = std::thread::scope(|s| {
        if !bar.is_hidden() {
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    bar.set_position(loaded_bytes().saturating_sub(before).min(total));
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        }
        let e = Engine::from_gguf(std::sync::Arc::new(gguf), opts);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        e
    })
    .with_context(|| format!("cannot load {}", path.display()))?;
    bar.finish_and_clear();
    let moved = loaded_bytes().saturating_sub(before);
    let summary = smelt_load::Summary {
        read: moved,
        written: moved,
        elapsed: start.elapsed(),
        ..Default::default()
    };
    let what = match &opts.device_isq {
        Some(p) => format!(
            "{} tensors quantized on cuda:{n} as they loaded",
            p.types.len()
        ),
        None => format!("weights to cuda:{n}"),
    };
    eprintln!("{}: {what}: {}", path.display(), summary.line());
    if smelt_cuda::GpuOptions::from_env().load_log {
        eprintln!(
            "smelt: engine ready {:.2} s after launch",
            crate::started().elapsed().as_secs_f64()
        );
    }
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_is_a_clear_error() {
        let e = resolve("no-such-model-xyz").unwrap_err().to_string();
        assert!(e.contains("neither a file nor a known alias"), "{e}");
        assert!(e.contains("smollm2-135m"), "{e}");
    }

    #[test]
    fn paths_print_absolute_and_without_dot_dot() {
        let p = clean(Path::new("crates/smelt/../../.models/m.gguf"));
        assert!(p.is_absolute(), "{}", p.display());
        assert!(p.ends_with(".models/m.gguf"), "{}", p.display());
        assert!(!p.to_string_lossy().contains(".."), "{}", p.display());
        assert_eq!(clean(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        let root = repo_root().expect("tests run in the checkout");
        assert!(!root.to_string_lossy().contains(".."), "{}", root.display());
    }

    #[test]
    fn devices() {
        assert_eq!(check_device("cpu").unwrap(), Device::Cpu);
        // auto: the GPU when this machine has one, else the CPU; never an error.
        let auto = check_device("auto").unwrap();
        assert_eq!(
            auto == Device::Cuda(0),
            smelt_engine::Device::auto().device == Device::Cuda(0)
        );
        let e = format!("{:#}", check_device("tpu").unwrap_err());
        assert!(e.contains("expected auto, cpu, cuda or cuda:N"), "{e}");
        // A GPU ordinal no machine has: a clear error, not a panic.
        let e = format!("{:#}", check_device("cuda:4096").unwrap_err());
        assert!(
            e.contains("--device cuda:4096") && e.contains("CUDA"),
            "{e}"
        );
    }
}
