//! `smelt bench`: prompt and decode speed of a model (llama-bench's pp and tg), or, with
//! `--kernels`, each GEMV's bandwidth at real shapes against a device copy measured in the
//! same run.
//!
//! Prompt: one forward over `--prompt` tokens from an empty cache. Decode: `--gen`
//! single-token steps after it, each feeding back the greedy token chosen as greedy
//! generation chooses it (`Engine::forward_greedy`: on the GPU inside the step, 4 bytes
//! back), or with `--host-logits` from the logits copied to the host every step (what a
//! sampler needs; llama-bench's tg copies them too). A warm-up sequence runs first
//! (weights touched, kernels loaded, the decode step's CUDA graph captured) and is freed.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_engine::{argmax, Device, Engine, EngineOptions, Logits, SeqId, SeqInput};

use super::model_ref;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A GGUF path or an alias (smollm2-135m, gemma3-270m).
    #[arg(long, required_unless_present = "kernels")]
    pub model: Option<String>,
    /// auto (the GPU when one is usable, and says so), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Prompt tokens (one forward).
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,
    /// Decode steps after the prompt.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// CPU threads (CPU device).
    #[arg(long)]
    pub threads: Option<usize>,
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
    let Some(model) = &args.model else {
        bail!("--model is required (or --kernels)");
    };
    if args.prompt == 0 || args.gen == 0 || args.reps == 0 {
        bail!("--prompt, --gen and --reps must be at least 1");
    }
    let device = model_ref::check_device(&args.device)?;
    let path = model_ref::resolve(model)?;
    let opts = EngineOptions {
        threads: args.threads,
        kv_tokens: 2 * (args.prompt + args.gen) + 64,
        device,
        ..EngineOptions::default()
    };
    let t = Instant::now();
    let mut e =
        Engine::load(&path, &opts).with_context(|| format!("cannot load {}", path.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    let n_vocab = e.info().n_vocab;
    // Deterministic ordinary tokens (speed does not depend on which).
    let prompt: Vec<u32> = (0..args.prompt)
        .map(|i| ((i * 7919 + 1000) % n_vocab.max(1)) as u32)
        .collect();

    // Warm-up at the measured sizes: scratch sized by the prompt, kernels loaded, and the
    // decode step run eagerly, captured, then replayed.
    let host = args.host_logits;
    run_once(&mut e, &prompt, 4, host)?;
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for _ in 0..args.reps {
        let (p, g) = run_once(&mut e, &prompt, args.gen, host)?;
        pp.push(args.prompt as f64 / p);
        tg.push(args.gen as f64 / g);
    }
    let (pp, tg) = (median(pp), median(tg));
    let name = path
        .file_name()
        .map_or_else(|| model.clone(), |n| n.to_string_lossy().into_owned());
    if args.json {
        let j = serde_json::json!({
            "model": name,
            "device": e.device_name(),
            "prompt_tokens": args.prompt,
            "gen_tokens": args.gen,
            "reps": args.reps,
            "prompt_tok_s": pp,
            "decode_tok_s": tg,
            "decode_ms_per_token": 1e3 / tg,
            "decode_token_from": if host { "host logits" } else { "engine greedy" },
            "load_s": load_s,
        });
        println!("{j}");
    } else {
        println!("model   {name}");
        println!("device  {}", e.device_name());
        println!("load    {load_s:.2} s");
        println!("| test | tokens/s |");
        println!("|---|---|");
        println!("| pp{} | {pp:.1} |", args.prompt);
        println!("| tg{} | {tg:.1} |", args.gen);
    }
    Ok(())
}

/// The greedy token after `tokens` of `seq`: from the logits on the host (`host`), or
/// the engine's greedy path.
fn greedy_step(e: &mut Engine, seq: SeqId, tokens: Vec<u32>, host: bool) -> Result<u32> {
    let input = [SeqInput {
        seq,
        tokens,
        logits: Logits::Last,
    }];
    Ok(if host {
        let out = e.forward(&input)?;
        argmax(out[0].first().map_or(&[][..], |r| &r[..]))
    } else {
        e.forward_greedy(&input)?.pop().flatten().unwrap_or(0)
    })
}

/// One prompt forward and `gen` decode steps on a fresh sequence: (prompt s, decode s).
fn run_once(e: &mut Engine, prompt: &[u32], gen: usize, host: bool) -> Result<(f64, f64)> {
    let seq = e.new_sequence();
    let r = (|| {
        let t = Instant::now();
        let mut next = greedy_step(e, seq, prompt.to_vec(), host)?;
        let p = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..gen {
            next = greedy_step(e, seq, vec![next], host)?;
        }
        Ok::<_, anyhow::Error>((p, t.elapsed().as_secs_f64()))
    })();
    e.free_sequence(seq);
    r
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
