//! `smelt serve`: the OpenAI-compatible server (crate `smelt-server`) over the models named
//! with `--model` (default: SmolLM2-135M-Instruct, fetched once by the project script).
//!
//! SIGINT/SIGTERM stop accepting connections and let in-flight requests finish within
//! `--grace` seconds; the process then exits 0. A second signal exits at once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_server::{LoadedModel, Loader, SchedulerConfig, Server, ServerConfig};

use smelt_engine::GpuMemory;

use super::model_ref;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A GGUF file, a Hugging Face model folder or an alias (smollm2-135m, gemma3-270m),
    /// fetched once into .models/; repeat to serve several models (they share the CPU
    /// threads). Each is served under its file stem (or its alias) [default: smollm2-135m]
    #[arg(long, short = 'm', value_name = "MODEL", conflicts_with = "no_model")]
    pub model: Vec<String>,
    /// Start with no model loaded: /live answers, /health says `no_model` until one is
    /// loaded through /admin/models (a node a `smelt gateway` fills) [default: off]
    #[arg(long)]
    pub no_model: bool,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    #[arg(long, default_value = "cpu", help = model_ref::DEVICE_HELP)]
    pub device: String,
    #[arg(long, value_name = "N", help = model_ref::TP_HELP)]
    pub tp: Option<usize>,
    /// Require `Authorization: Bearer <KEY>` on /v1/* (/admin/* then needs --admin-key)
    /// [default: none: no key]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests waiting for a place in a model's batch; more get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Sequences decoded together in one step, per model.
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Tokens per step: every running sequence's next token, the rest for prompt chunks.
    /// More tokens read prompts faster (many streams starting together get their first
    /// tokens sooner); fewer keep running streams' time between tokens short while a long
    /// prompt is read [default: 2048 on a GPU (llama.cpp's n_batch), 256 on the CPU]
    #[arg(long, value_name = "TOKENS")]
    pub step_tokens: Option<usize>,
    /// Most tokens in one sequence (prompt plus generation); longer prompts get 400.
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// KV cache room in tokens per model, shared by all its sequences [default: on a GPU,
    /// what --gpu-memory leaves; on the CPU, 4 x --ctx]
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// On a GPU, the fraction of its memory smelt may take: after the weights and one
    /// step's activations, the KV cache fills the rest (vLLM's gpu_memory_utilization); the
    /// log says how many tokens it holds [default: 0.9 when one model is served and no
    /// --kv-tokens is given; otherwise the cache holds exactly --kv-tokens]. The CPU ignores it
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory: Option<GpuMemory>,
    #[arg(long, help = model_ref::BATCH_INVARIANT_HELP)]
    pub batch_invariant: bool,
    /// CPU threads, shared by all the models served [default: the cores this process may
    /// use: its CPU affinity and cgroup quota]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    pub grace: f64,
    /// Quantize every model's weights as it loads (q8_0, q4_k, q4_k_m ...), with `smelt
    /// quantize`'s per-tensor rules. A model may also be a Hugging Face folder [default:
    /// none: the weights as stored]
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    /// Every model's chat template instead of its own: a file of Jinja source, or a built-in
    /// format (chatml, llama3, gemma). Tool calls take the format the template shows (Qwen/
    /// Hermes <tool_call>, Llama 3.1 JSON, Mistral [TOOL_CALLS]) [default: the model's own]
    #[arg(long, value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
    /// Compute every prompt in full: no sharing of the KV blocks of prompt prefixes that
    /// earlier requests computed (prefix caching is on by default; /metrics counts its hits)
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// How /v1/embeddings pools a model's hidden states into one vector: mean, cls (first
    /// token) or last (last token), then L2-normalizes it, as llama.cpp's --pooling
    /// [default: what each GGUF's pooling_type says; the mean when it says nothing]
    #[arg(long, value_name = "mean|cls|last", value_parser = parse_pooling)]
    pub pooling: Option<smelt_engine::Pooling>,
    #[command(flatten)]
    pub limits: super::serve_limits::LimitArgs,
    /// Join the `smelt gateway` at this URL: register there and keep sending heartbeats, so
    /// it routes requests here and loads and unloads models through /admin/models (with
    /// --admin-key, which the node sends it) [default: none: no gateway]
    #[arg(long, value_name = "URL", requires = "name", help_heading = "Gateway")]
    pub gateway: Option<String>,
    /// This node's name at the gateway (required with --gateway).
    #[arg(
        long,
        value_name = "NAME",
        requires = "gateway",
        help_heading = "Gateway"
    )]
    pub name: Option<String>,
    /// The gateway's admin key, which registration needs [default: none: no key sent]
    #[arg(
        long,
        value_name = "KEY",
        requires = "gateway",
        help_heading = "Gateway"
    )]
    pub gateway_key: Option<String>,
}

fn parse_pooling(s: &str) -> Result<smelt_engine::Pooling, String> {
    smelt_engine::Pooling::parse(s).ok_or_else(|| format!("{s:?} is not mean, cls or last"))
}

/// `--step-tokens`' default on a GPU: prompts of many streams starting together are read in
/// a few steps. H100, bench/RESULTS.md 2026-11-27 (`bench/gpu/serve.sh` with `SERVE_VARIANTS`).
pub const GPU_STEP_TOKENS: usize = 2048;
/// `--step-tokens`' default on the CPU, where a step of 2048 prompt tokens would hold every
/// running stream for seconds.
pub const CPU_STEP_TOKENS: usize = 256;

pub fn run(args: &ServeArgs) -> Result<()> {
    let gpu = match model_ref::tp_devices(&args.device, args.tp)? {
        Some(_) => true,
        None => model_ref::check_device(&args.device)? != smelt_engine::Device::Cpu,
    };
    let step_tokens = args.step_tokens.unwrap_or(if gpu {
        GPU_STEP_TOKENS
    } else {
        CPU_STEP_TOKENS
    });
    if args.ctx == 0 || args.max_batch == 0 || step_tokens == 0 {
        bail!("--ctx, --max-batch and --step-tokens must be at least 1");
    }
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        bail!("--grace must be a number of seconds, 0 or more");
    }
    let mut config = ServerConfig {
        addr: format!("{}:{}", args.host, args.port),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        scheduler: SchedulerConfig {
            max_batch: args.max_batch,
            max_queue: args.max_queue,
            step_tokens,
        },
        ctx: args.ctx,
        grace: Duration::from_secs_f64(args.grace),
        chat_template: match &args.chat_template {
            Some(t) if std::path::Path::new(t).is_file() => Some(
                std::fs::read_to_string(t)
                    .with_context(|| format!("cannot read --chat-template {t}"))?,
            ),
            Some(t) if matches!(t.trim(), "chatml" | "llama3" | "gemma") => Some(t.clone()),
            Some(t) => bail!("--chat-template {t}: neither a file nor chatml, llama3 or gemma"),
            None => None,
        },
        prefix_cache: !args.no_prefix_cache,
        pooling: args.pooling,
        ..ServerConfig::default()
    };
    args.limits.apply(&mut config, model_ref::alias_names())?;
    if let Some(g) = &args.gateway {
        smelt_gateway::config::check_url(g).map_err(|e| anyhow::anyhow!("--gateway: {e}"))?;
    }
    let models = if args.no_model {
        Vec::new()
    } else if args.model.is_empty() {
        vec![model_ref::DEFAULT_MODEL.to_string()]
    } else {
        args.model.clone()
    };
    // A node that starts empty will hold whatever models a gateway loads: each gets
    // --kv-tokens, as with several models, rather than one filling the GPU.
    let kv = kv_args(
        args,
        if args.no_model { 2 } else { models.len() },
        step_tokens,
    );
    let loader = loader(args.device.clone(), args.threads, kv, args.isq.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let server = Server::bind(config, loader, &models).await?;
        let addr = server.local_addr()?;
        let stop = server.shutdown_handle();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received: shutting down (again to exit at once)");
            stop.shutdown();
            wait_for_signal().await;
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        });
        eprintln!("smelt serve: listening on http://{addr}");
        if let (Some(gateway), Some(name)) = (&args.gateway, &args.name) {
            let me = smelt_gateway::nodes::Registration {
                name: name.clone(),
                url: format!("http://{addr}"),
                admin_key: args.limits.admin_key.clone().filter(|k| !k.is_empty()),
                memory_mb: None,
            };
            let key = args.gateway_key.clone().filter(|k| !k.is_empty());
            tokio::spawn(smelt_gateway::join::heartbeats(gateway.clone(), key, me));
        }
        server.run().await?;
        eprintln!("smelt serve: stopped");
        anyhow::Ok(())
    })?;
    // Scheduler threads may still hold a model; they are not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The KV cache each model gets. Filling the GPU (`--gpu-memory`, 0.9 by default) is for a
/// GPU that serves one model: with several, or an explicit `--kv-tokens`, each holds exactly
/// `--kv-tokens` unless `--gpu-memory` is given too. Filled, the cache holds at least one
/// `--ctx` sequence (the CPU ignores the fraction and holds `--kv-tokens`, 4 x `--ctx`).
fn kv_args(args: &ServeArgs, n_models: usize, step_tokens: usize) -> model_ref::KvArgs {
    let gpu_memory = args
        .gpu_memory
        .or_else(|| (args.kv_tokens.is_none() && n_models <= 1).then(GpuMemory::default));
    let tokens = args
        .kv_tokens
        .unwrap_or(args.ctx.saturating_mul(4))
        .max(args.ctx);
    model_ref::KvArgs {
        // Filling the GPU, the least the cache may hold is what was asked for, or one context.
        tokens: match (gpu_memory, args.kv_tokens) {
            (Some(_), None) => args.ctx,
            _ => tokens,
        },
        gpu_memory,
        batch_invariant: args.batch_invariant,
        // A step carries every running sequence's token, or the token budget.
        step_tokens: step_tokens.max(args.max_batch),
        tp: args.tp,
    }
}

/// Models load through `model_ref`, so aliases resolve (and fetch) as in `smelt run`.
fn loader(
    device: String,
    threads: Option<usize>,
    kv: model_ref::KvArgs,
    isq: Option<String>,
) -> Loader {
    Arc::new(move |reference: &str| {
        let m = model_ref::load_kv(reference, &device, threads, &kv, isq.as_deref())
            .map_err(|e| format!("{e:#}"))?;
        let e = &m.engine;
        let sized = match (e.device(), kv.gpu_memory) {
            (smelt_engine::Device::Cuda(_), Some(f)) => format!(", filling --gpu-memory {f}"),
            _ => String::new(),
        };
        tracing::info!(
            "{reference}: the KV cache holds {} tokens ({} on {}{sized})",
            e.kv_tokens(),
            smelt_engine::gpu_memory::human(e.kv_bytes()),
            e.device_name(),
        );
        Ok(LoadedModel {
            path: m.path,
            engine: m.engine,
            tokenizer: m.tokenizer,
        })
    })
}

pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
