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
  metrics_key = \"k-metrics\"      # /metrics needs it (or admin_key); absent: open
  allow_hosts = [\"gw.lan\"]       # Host names answered besides localhost ones
  cors = [\"https://app.example\"] # origins allowed cross-origin; absent: none
  # header_timeout_ms = 10000, body_timeout_ms = 30000, idle_timeout_ms = 60000,
  # max_connections = 4096: as smelt serve's flags of those names
  forget_after_ms = 300000       # nodes that joined by themselves and stay down this
                                 # long are forgotten until they join again

  [[node]]                       # repeat; nodes may also join with
  name = \"a\"                     # `smelt serve --gateway URL --name NAME`
  url = \"http://127.0.0.1:9001\"
  admin_key = \"k-node\"           # sent to the node's /admin/*
  memory_mb = 4096               # room for models; absent: what the node reports

  [[model]]                      # repeat
  name = \"smollm2\"               # the `model` clients ask for
  source = \"smollm2-135m\"        # what the node's /admin/models load takes
  memory_mb = 300                # absent: what a node reports once loaded; before
                                 # that, a GGUF file's size plus its KV cache at ctx
  ctx = 4096                     # the nodes' --ctx, for that estimate (default 4096)
  pinned_on = [\"a\"]              # loaded at start there and never evicted

Endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (with where
each model is), /health, /metrics, /admin/nodes, /admin/models (load, unload, pin, unpin by
hand).")]
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
    #[command(flatten)]
    pub exposure: ExposureArgs,
}

/// The gateway's protections, as `smelt serve` has them (each overrides the config file's
/// `[gateway]` key of the same meaning).
#[derive(Args, Debug)]
#[command(next_help_heading = "Exposure and limits")]
pub struct ExposureArgs {
    /// Key for the gateway's own /admin/* (and node registration), separate from the
    /// clients' api_keys [default: the config's admin_key; none: admin disabled]
    #[arg(long, value_name = "KEY")]
    pub admin_key: Option<String>,
    /// Require `Authorization: Bearer <KEY>` on /metrics (the admin key works too)
    /// [default: the config's metrics_key; none: open]
    #[arg(long, value_name = "KEY")]
    pub metrics_key: Option<String>,
    /// Also answer requests for this host name (repeat; `*`: any). Bound to localhost, the
    /// gateway answers only to localhost names otherwise (no DNS rebinding).
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Allow browser requests from this origin (repeat; `*`: any); refused otherwise.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Seconds a request's headers may take (also the keep-alive idle time) [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub header_timeout: Option<f64>,
    /// Seconds a request's body may take once its headers have arrived [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub body_timeout: Option<f64>,
    /// Seconds a response may wait on a client that reads nothing [default: 60]
    #[arg(long, value_name = "SECONDS")]
    pub idle_timeout: Option<f64>,
    /// Client connections served at once [default: 4096]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
}

impl ExposureArgs {
    /// Writes the flags given into the config's `[gateway]` section.
    fn apply(&self, g: &mut smelt_gateway::config::GatewaySection) -> Result<()> {
        let ms = |name: &str, v: Option<f64>, into: &mut u64| -> Result<()> {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0 && v < 1e9) {
                    anyhow::bail!("--{name} must be a number of seconds above 0");
                }
                *into = ((v * 1000.0) as u64).max(1);
            }
            Ok(())
        };
        ms(
            "header-timeout",
            self.header_timeout,
            &mut g.header_timeout_ms,
        )?;
        ms("body-timeout", self.body_timeout, &mut g.body_timeout_ms)?;
        ms("idle-timeout", self.idle_timeout, &mut g.idle_timeout_ms)?;
        if let Some(n) = self.max_connections {
            if n == 0 {
                anyhow::bail!("--max-connections must be at least 1");
            }
            g.max_connections = n;
        }
        for (flag, key, into) in [
            ("--admin-key", &self.admin_key, &mut g.admin_key),
            ("--metrics-key", &self.metrics_key, &mut g.metrics_key),
        ] {
            if let Some(k) = key {
                if k.is_empty() {
                    anyhow::bail!("{flag} must not be empty");
                }
                *into = Some(k.clone());
            }
        }
        g.allow_hosts.extend(self.allow_host.iter().cloned());
        g.cors.extend(self.cors.iter().cloned());
        Ok(())
    }
}

pub fn run(args: &GatewayArgs) -> Result<()> {
    let mut config = smelt_gateway::Config::load(&args.config)?;
    args.exposure.apply(&mut config.gateway)?;
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
