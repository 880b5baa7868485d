//! `smelt serve`'s flags that make a server safe to expose (issue 17): timeouts and a
//! connection limit against slow clients, the hosts and origins it answers, the admin and
//! metrics keys, where `/admin/models` may load from and how much memory models may take,
//! and whether special-token text in chat messages stays text. Kept apart from `serve.rs`
//! so the serving flags and these read separately in the code as in `--help`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use smelt_server::ServerConfig;

#[derive(Args, Debug)]
#[command(next_help_heading = "Exposure and limits")]
pub struct LimitArgs {
    /// Separate key for /admin/* (load and unload models). Without it, admin is open only on
    /// a localhost-bound server with no --api-key, and disabled otherwise.
    #[arg(long, value_name = "KEY")]
    pub admin_key: Option<String>,
    /// Require `Authorization: Bearer <KEY>` on /metrics (the admin key works too)
    /// [default: none: /metrics needs no key]
    #[arg(long, value_name = "KEY")]
    pub metrics_key: Option<String>,
    /// Also answer requests for this host name (repeat for several; `*`: any). A server bound
    /// to localhost answers only to localhost names otherwise (no DNS rebinding).
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Allow browser requests from this origin (`https://app.example`; repeat; `*`: any).
    /// Cross-origin requests are refused otherwise.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// A folder /admin/models may load models from (repeat for several). Without one, only
    /// the built-in aliases and the models the server started with can be loaded.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Vec<PathBuf>,
    /// Most memory all loaded models may take, weights and KV cache, in GiB; loads past it
    /// get 409 [default: 90% of the machine's memory].
    #[arg(long, value_name = "GIB")]
    pub max_models_memory: Option<f64>,
    /// Seconds a request's headers may take to arrive (also how long an idle keep-alive
    /// connection stays open).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive once its headers have.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub body_timeout: f64,
    /// Seconds a response may wait on a client that reads nothing before the connection ends.
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub idle_timeout: f64,
    /// Connections served at once; one more makes the oldest close as soon as it is idle.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_connections: usize,
    /// Turn special-token text in chat message content (`<|im_start|>` ...) into those
    /// tokens, as llama.cpp does. By default it is plain text, so a user cannot forge a turn.
    #[arg(long)]
    pub allow_special_in_content: bool,
}

impl LimitArgs {
    /// Writes these flags into `config`; `aliases` are the model names loadable as they are.
    pub fn apply(&self, config: &mut ServerConfig, aliases: Vec<String>) -> Result<()> {
        let secs = |name: &str, v: f64| -> Result<Duration> {
            if !(v.is_finite() && v > 0.0 && v < 1e9) {
                bail!("--{name} must be a number of seconds above 0");
            }
            Ok(Duration::from_secs_f64(v))
        };
        config.header_timeout = secs("header-timeout", self.header_timeout)?;
        config.body_timeout = secs("body-timeout", self.body_timeout)?;
        config.idle_timeout = secs("idle-timeout", self.idle_timeout)?;
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        config.max_connections = self.max_connections;
        config.admin_key = self.admin_key.clone().filter(|k| !k.is_empty());
        config.metrics_key = self.metrics_key.clone().filter(|k| !k.is_empty());
        config.allowed_hosts = self.allow_host.clone();
        config.cors = self.cors.clone();
        for d in &self.models_dir {
            if !d.is_dir() {
                bail!("--models-dir {} is not a folder", d.display());
            }
        }
        config.models_dirs = self.models_dir.clone();
        config.aliases = aliases;
        config.max_models_bytes = match self.max_models_memory {
            Some(g) if g.is_finite() && g > 0.0 => Some((g * (1u64 << 30) as f64) as u64),
            Some(_) => bail!("--max-models-memory must be a number of GiB above 0"),
            None => total_memory().map(|b| b / 10 * 9),
        };
        config.allow_special_in_content = self.allow_special_in_content;
        Ok(())
    }
}

/// The machine's memory in bytes (`MemTotal` of /proc/meminfo), where it can be read.
fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
