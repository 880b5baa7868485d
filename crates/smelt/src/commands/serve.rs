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

use super::model_ref;

/// The model served when no `--model` is given.
const DEFAULT_MODEL: &str = "smollm2-135m";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A GGUF path or an alias (smollm2-135m, gemma3-270m); repeat to serve several models.
    /// Each is served under its file stem (or its alias). Default: smollm2-135m.
    #[arg(long, short = 'm', value_name = "MODEL")]
    pub model: Vec<String>,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// cpu (auto: the best available device).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Require `Authorization: Bearer <KEY>` on /v1/* (/admin/* then needs --admin-key).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests waiting for a place in a model's batch; more get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Sequences decoded together in one step, per model.
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Tokens per step: every running sequence's next token, the rest for prompt chunks.
    #[arg(long, default_value_t = 256)]
    pub step_tokens: usize,
    /// Most tokens in one sequence (prompt plus generation); longer prompts get 400.
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// KV cache room in tokens per model, shared by all its sequences (default: 4 x --ctx).
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Compute threads per model (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    pub grace: f64,
    /// Quantize every model's weights as it loads (q8_0, q4_k, q4_k_m ...), with `smelt
    /// quantize`'s per-tensor rules. A model may also be a Hugging Face folder.
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    #[command(flatten)]
    pub limits: super::serve_limits::LimitArgs,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    init_logging();
    model_ref::check_device(&args.device)?;
    if args.ctx == 0 || args.max_batch == 0 || args.step_tokens == 0 {
        bail!("--ctx, --max-batch and --step-tokens must be at least 1");
    }
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        bail!("--grace must be a number of seconds, 0 or more");
    }
    let kv_tokens = args
        .kv_tokens
        .unwrap_or(args.ctx.saturating_mul(4))
        .max(args.ctx);
    let mut config = ServerConfig {
        addr: format!("{}:{}", args.host, args.port),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        scheduler: SchedulerConfig {
            max_batch: args.max_batch,
            max_queue: args.max_queue,
            step_tokens: args.step_tokens,
        },
        ctx: args.ctx,
        grace: Duration::from_secs_f64(args.grace),
        ..ServerConfig::default()
    };
    args.limits.apply(&mut config, model_ref::alias_names())?;
    let models = if args.model.is_empty() {
        vec![DEFAULT_MODEL.to_string()]
    } else {
        args.model.clone()
    };
    let loader = loader(
        args.device.clone(),
        args.threads,
        kv_tokens,
        args.isq.clone(),
    );
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
        server.run().await?;
        eprintln!("smelt serve: stopped");
        anyhow::Ok(())
    })?;
    // Scheduler threads may still hold a model; they are not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// Models load through `model_ref`, so aliases resolve (and fetch) as in `smelt run`.
fn loader(device: String, threads: Option<usize>, kv_tokens: usize, isq: Option<String>) -> Loader {
    Arc::new(move |reference: &str| {
        let m = model_ref::load_isq(reference, &device, threads, kv_tokens, isq.as_deref())
            .map_err(|e| format!("{e:#}"))?;
        Ok(LoadedModel {
            path: m.path,
            engine: m.engine,
            tokenizer: m.tokenizer,
        })
    })
}

async fn wait_for_signal() {
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

/// Logs to stderr; `RUST_LOG` picks the level (default info).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
