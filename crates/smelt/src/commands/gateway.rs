//! `smelt gateway --config FILE`: one OpenAI endpoint in front of many `smelt serve` nodes
//! (crate `smelt-gateway`): routing by model, loading on demand, LRU eviction with pins,
//! failover. SIGINT/SIGTERM stop it gracefully.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug)]
#[command(after_help = "\
The config is TOML:

  [gateway]
  api_keys = [\"k-user\"]          # clients' keys for /v1/*; empty or absent: open
  admin_key = \"k-admin\"          # the gateway's /admin/*; absent: admin disabled
  health_interval_ms = 1000      # how often nodes are polled

  [[node]]                       # repeat; nodes may also join with
  name = \"a\"                     # `smelt serve --gateway URL --name NAME`
  url = \"http://127.0.0.1:9001\"
  admin_key = \"k-node\"           # sent to the node's /admin/*
  memory_mb = 4096               # room for models; absent: what the node reports

  [[model]]                      # repeat
  name = \"smollm2\"               # the `model` clients ask for
  source = \"smollm2-135m\"        # what the node's /admin/models load takes
  memory_mb = 300                # absent: what a node reports once loaded
  pinned_on = [\"a\"]              # loaded at start there and never evicted

Endpoints: /v1/chat/completions, /v1/completions, /v1/models (with where each model is),
/health, /metrics, /admin/nodes, /admin/models (load, unload, pin, unpin by hand).")]
pub struct GatewayArgs {
    /// The gateway's TOML file: its keys, the nodes and the model catalogue (see below).
    #[arg(long, value_name = "FILE", required = true)]
    pub config: PathBuf,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
}

pub fn run(args: &GatewayArgs) -> Result<()> {
    let config = smelt_gateway::Config::load(&args.config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let (nodes, models) = (config.nodes.len(), config.models.len());
        let gw =
            smelt_gateway::Gateway::bind(config, &format!("{}:{}", args.host, args.port)).await?;
        let addr = gw.local_addr()?;
        eprintln!(
            "smelt gateway: listening on http://{addr} ({nodes} configured nodes, {models} models)"
        );
        gw.run(async {
            super::serve::wait_for_signal().await;
            tracing::info!("signal received: shutting down");
        })
        .await?;
        eprintln!("smelt gateway: stopped");
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}
