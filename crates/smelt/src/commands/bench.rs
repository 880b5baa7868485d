//! `smelt bench`: prompt and decode speed of a model (llama-bench's pp and tg), or, with
//! `--kernels`, each GEMV's bandwidth at real shapes against a device copy measured in the
//! same run. The model loads as `smelt run` loads it (a GGUF file or a Hugging Face folder,
//! `--isq` quantizing as it loads), so what is timed is what runs.
//!
//! Prompt: `--prompt` tokens from an empty cache, fed in steps of at most `--ubatch` tokens
//! (llama.cpp's n_ubatch), so a 32k-token prompt needs activations for one step only; its
//! time is the time to first token. Decode: `--gen` steps after it, each feeding back the
//! greedy token chosen as greedy generation chooses it (`Engine::forward_greedy`: on the GPU
//! inside the step, 4 bytes back), or with `--host-logits` from the logits copied to the
//! host every step (what a sampler needs; llama-bench's tg copies them too). With `--batch
//! N`, N sequences each get their own prompt (prompts share prefill steps) and every decode
//! step runs all N in one forward: the aggregate tokens/s a server's batch reaches (see
//! `batch.rs`). A warm-up run of the same shape goes first (weights touched, kernels
//! loaded, the decode step's CUDA graph captured) and is freed.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_engine::generate::DEFAULT_PREFILL_CHUNK;
use smelt_engine::{Device, EngineOptions, GpuMemory};

use super::model_ref;

mod batch;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[arg(long, short = 'm', value_name = "MODEL", default_value = model_ref::DEFAULT_MODEL,
          help = model_ref::MODEL_HELP)]
    pub model: String,
    /// Quantize the weights as they load (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k ... q6_k, or a
    /// llama.cpp preset such as q4_k_m), with `smelt quantize`'s per-tensor rules, as
    /// `smelt run --isq` does [default: none: the weights as stored]
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    #[arg(long, default_value = "auto", help = model_ref::DEVICE_HELP)]
    pub device: String,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,
    /// Decode steps after the prompt.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Sequences decoding together: each gets its own prompt, then every decode step runs
    /// all N in one forward; tokens/s are the aggregate of all N.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batch: usize,
    /// Most tokens in one prefill step (llama.cpp's n_ubatch): longer prompts are fed in
    /// chunks, so activation memory depends on this, not on the prompt's length.
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub ubatch: usize,
    /// On a GPU, size the KV cache as `smelt serve` does: fill this fraction of the device's
    /// memory after the weights and one step's activations (at least what the run needs)
    /// [default: exactly what the run needs]
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory: Option<GpuMemory>,
    #[arg(long, help = model_ref::BATCH_INVARIANT_HELP)]
    pub batch_invariant: bool,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[arg(long, value_name = "N", help = model_ref::THREADS_HELP)]
    pub threads: Option<usize>,
    /// Tensor parallelism over N GPUs (see `smelt run --help`); the report adds the time of
    /// one all-reduce of a decode step's hidden state and the all-reduce time per token
    /// [default: none: one device]
    #[arg(long, value_name = "N")]
    pub tp: Option<usize>,
    /// Time the GEMV kernels at Llama-3-8B shapes instead of a model (needs a GPU).
    #[arg(long)]
    pub kernels: bool,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Copy every decode step's logits to the host and take the greedy token there (the
    /// sampler's path) instead of the engine's greedy path.
    #[arg(long)]
    pub host_logits: bool,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.kernels {
        return kernels(args);
    }
    let model = &args.model;
    if args.prompt == 0 || args.gen == 0 || args.reps == 0 || args.batch == 0 || args.ubatch == 0 {
        bail!("--prompt, --gen, --reps, --batch and --ubatch must be at least 1");
    }
    let (device, tp) = model_ref::devices(&args.device, args.tp)?;
    let path = model_ref::resolve(model)?;
    // As `smelt run` and `smelt serve` load it: a GGUF file or a Hugging Face folder, with
    // `--isq` quantizing as it loads.
    let kv = model_ref::KvArgs {
        tokens: kv_tokens(args, EngineOptions::default().block_size)?,
        gpu_memory: args.gpu_memory,
        batch_invariant: args.batch_invariant,
        // The largest step: a prompt chunk, or a decode step of every sequence.
        step_tokens: args.ubatch.max(args.batch),
        tp: args.tp,
    };
    let t = Instant::now();
    let mut e = model_ref::load_engine(
        &path,
        device,
        tp.as_deref(),
        args.threads,
        &kv,
        args.isq.as_deref(),
    )?;
    let load_s = t.elapsed().as_secs_f64();
    let n_vocab = e.info().n_vocab;
    let prompts: Vec<Vec<u32>> = (0..args.batch)
        .map(|i| batch::prompt(i, args.prompt, n_vocab))
        .collect();

    // Warm-up at the measured sizes: scratch sized by the largest step, kernels loaded, and
    // the decode step run eagerly, captured, then replayed.
    let host = args.host_logits;
    batch::run_once(&mut e, &prompts, WARMUP_GEN, args.ubatch, host)?;
    let mut runs = Vec::new();
    for _ in 0..args.reps {
        runs.push(batch::run_once(
            &mut e,
            &prompts,
            args.gen,
            args.ubatch,
            host,
        )?);
    }
    let n = args.batch as f64;
    let pp = median(
        runs.iter()
            .map(|r| n * args.prompt as f64 / r.timing.prompt_s)
            .collect(),
    );
    let tg = median(
        runs.iter()
            .map(|r| n * args.gen as f64 / r.timing.decode_s)
            .collect(),
    );
    let ttft_ms = median(runs.iter().map(|r| 1e3 * r.timing.prompt_s).collect());
    // Every repetition computes the same tokens; the last one's stand for all.
    let digests: Vec<String> = runs
        .last()
        .map(|r| r.tokens.iter().map(|t| batch::digest(t)).collect())
        .unwrap_or_default();
    // Tensor parallel: one all-reduce of a decode step's hidden state (batch x n_embd
    // floats), and the time a step spends in all-reduces: two per layer, and with a
    // vocabulary-parallel head the gather of its logits (batch x n_vocab floats).
    let all_reduce = match e.tp() {
        Some(tp) => {
            let (n_embd, n_layer, n_vocab) = (e.info().n_embd, e.info().n_layer, e.info().n_vocab);
            let vocab = tp.plan.opts.vocab_parallel && tp.n_ranks() > 1;
            let tp = e.tp_mut().expect("tp engine");
            let t = tp.time_all_reduce(n_embd * args.batch, 200)?.as_secs_f64();
            let head = if vocab {
                tp.time_all_reduce(n_vocab * args.batch, 50)?.as_secs_f64()
            } else {
                0.0
            };
            Some((t * 1e6, (2.0 * n_layer as f64 * t + head) * 1e3))
        }
        None => None,
    };
    let name = path
        .file_name()
        .map_or_else(|| model.clone(), |n| n.to_string_lossy().into_owned());
    if args.json {
        let j = serde_json::json!({
            "model": name,
            "device": e.device_name(),
            "threads": e.cpu_threads(),
            "prompt_tokens": args.prompt,
            "gen_tokens": args.gen,
            "batch": args.batch,
            "ubatch": args.ubatch,
            "reps": args.reps,
            "kv_tokens": e.kv_tokens(),
            "prompt_tok_s": pp,
            "ttft_ms": ttft_ms,
            "decode_tok_s": tg,
            "batch_decode_tok_s": tg,
            "seq_decode_tok_s": tg / n,
            "decode_ms_per_token": 1e3 * n / tg,
            "decode_token_from": if host { "host logits" } else { "engine greedy" },
            "seq_token_digests": digests,
            "load_s": load_s,
            "tp": e.tp().map(|t| t.n_ranks()),
            "all_reduce": e.tp().map(|t| t.all_reduce_path().to_string()),
            "vocab_parallel": e.tp().map(|t| t.plan.opts.vocab_parallel),
            "all_reduce_us": all_reduce.map(|a| a.0),
            "all_reduce_ms_per_step": all_reduce.map(|a| a.1),
        });
        println!("{j}");
    } else {
        println!("model   {name}");
        match e.cpu_threads() {
            Some(t) => println!("device  {} ({t} threads)", e.device_name()),
            None => println!("device  {}", e.device_name()),
        }
        println!("load    {load_s:.2} s");
        println!(
            "kv      {} tokens ({})",
            e.kv_tokens(),
            smelt_engine::gpu_memory::human(e.kv_bytes())
        );
        if args.batch > 1 {
            println!(
                "batch   {} sequences; tokens/s are the aggregate of all of them",
                args.batch
            );
        }
        let x = if args.batch > 1 {
            format!(" x{}", args.batch)
        } else {
            String::new()
        };
        if let Some((us, ms)) = all_reduce {
            println!(
                "all-reduce {us:.1} us each ({} floats, back to back); {ms:.3} ms per \
                 decode step ({} of them{})",
                e.info().n_embd * args.batch,
                2 * e.info().n_layer,
                if e.tp().is_some_and(|t| t.plan.opts.vocab_parallel) {
                    ", and the vocabulary-parallel head's gather"
                } else {
                    ""
                }
            );
        }
        println!("| test | tokens/s |");
        println!("|---|---|");
        println!("| pp{}{x} | {pp:.1} |", args.prompt);
        println!("| tg{}{x} | {tg:.1} |", args.gen);
        if args.batch > 1 {
            println!(
                "prompts {ttft_ms:.1} ms until every sequence had its first token (steps of at \
                 most {} tokens)",
                args.ubatch
            );
            println!(
                "decode step {:.2} ms ({:.1} tokens/s per sequence)",
                1e3 * n / tg,
                tg / n
            );
        } else {
            println!(
                "time to first token {ttft_ms:.1} ms (prompt in steps of at most {} tokens)",
                args.ubatch
            );
        }
    }
    Ok(())
}

/// Decode steps of the warm-up run.
const WARMUP_GEN: usize = 4;

/// KV cache room for `--batch` sequences of `--prompt` + `--gen` tokens (or the warm-up's,
/// when more), each rounded up to whole blocks of `block_size`.
fn kv_tokens(args: &BenchArgs, block_size: usize) -> Result<usize> {
    args.prompt
        .checked_add(args.gen.max(WARMUP_GEN))
        .and_then(|t| t.checked_next_multiple_of(block_size))
        .and_then(|t| t.checked_mul(args.batch))
        .context("--batch x (--prompt + --gen) is too large")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `--kernels`: every GEMV type at Llama-3-8B's decode shapes vs the device copy.
fn kernels(args: &BenchArgs) -> Result<()> {
    let ordinal = match model_ref::check_device(&args.device)? {
        Device::Cuda(n) => n,
        Device::Cpu => bail!("--kernels times GPU kernels: it needs a CUDA device"),
    };
    let gpu = smelt_cuda::Gpu::open(ordinal).context("cannot open the GPU")?;
    let copy = smelt_cuda::gemv_bench::copy_gbs(&gpu)?;
    let mut rows = Vec::new();
    for ty in smelt_kernels::catalog::GEMV_TYPES {
        for (n, k) in smelt_cuda::gemv_bench::SHAPES {
            if k % ty.block_size() != 0 {
                continue;
            }
            rows.push(smelt_cuda::gemv_bench::time_gemv(&gpu, ty, n, k, 1)?);
        }
    }
    rows.extend(smelt_cuda::gemv_bench::time_fused(&gpu)?);
    if args.json {
        let j = serde_json::json!({
            "device": format!("cuda:{ordinal} ({})", gpu.name()),
            "copy_gb_s": copy,
            "gemv": rows.iter().map(|r| serde_json::json!({
                "type": r.ty.to_string(),
                "kernel": r.kernel,
                "rows": r.rows,
                "k": r.k,
                "us_graph": r.us_graph,
                "us_stream": r.us_stream,
                "gb_s": r.gbs(),
                "pct_copy": 100.0 * r.gbs() / copy,
            })).collect::<Vec<_>>(),
        });
        println!("{j}");
    } else {
        println!("device  cuda:{ordinal} ({})", gpu.name());
        println!("device copy (read + write): {copy:.0} GB/s");
        println!(
            "| type | kernel | rows x k | graph us | GB/s | % copy | stream us | stream % copy |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {} | {}x{} | {:.2} | {:.0} | {:.1} | {:.2} | {:.1} |",
                r.ty,
                r.kernel,
                r.rows,
                r.k,
                r.us_graph,
                r.gbs(),
                100.0 * r.gbs() / copy,
                r.us_stream,
                100.0 * r.gbs_stream() / copy
            );
        }
    }
    Ok(())
}
