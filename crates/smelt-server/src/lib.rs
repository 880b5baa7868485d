//! smelt's OpenAI-compatible HTTP server.
//!
//! axum handles HTTP on a tokio runtime; every model runs on its own OS thread, where a
//! continuous-batching [`scheduler`] owns the engine. Handlers only parse, tokenize, queue
//! and relay: compute never blocks the runtime.
//!
//! ```no_run
//! # async fn demo() -> Result<(), smelt_server::ServerError> {
//! use smelt_server::{gguf_loader, Server, ServerConfig};
//! let config = ServerConfig::default();
//! let loader = gguf_loader(smelt_engine::EngineOptions::default());
//! let server = Server::bind(config, loader, &["model.gguf".to_string()]).await?;
//! let stop = server.shutdown_handle(); // stop.shutdown() ends it gracefully
//! server.run().await
//! # }
//! ```

mod assets;
mod embeddings;
/// Errors in OpenAI's shape (shared with the gateway: `smelt_http`).
pub mod error {
    pub use smelt_http::error::*;
}
pub mod grammar;
mod guard;
pub mod metrics;
pub mod models;
mod openapi;
mod reply;
mod routes;
pub mod scheduler;
mod tokenize;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use guard::HostPolicy;
pub use models::{gguf_loader, model_id, LoadedModel, Loader};
pub use scheduler::SchedulerConfig;
pub use smelt_http::conn::raise_fd_limit;
pub use smelt_http::ApiError;
/// The request surface (parsed and checked without a model) lives in `smelt-openai`.
pub use smelt_openai::{openai, tool_stream, tools};

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `host:port`; port 0 picks a free one (see [`Server::local_addr`]).
    pub addr: String,
    /// When set, `/v1/*` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// When set, `/admin/*` needs `Authorization: Bearer <admin key>` (and only it). Without
    /// it, admin is open on a loopback-bound server with no `api_key`, and disabled otherwise.
    pub admin_key: Option<String>,
    /// When set, `/metrics` needs `Authorization: Bearer <metrics key>` (or the admin key).
    pub metrics_key: Option<String>,
    pub scheduler: SchedulerConfig,
    /// Most tokens one sequence may hold (prompt and generation).
    pub ctx: usize,
    /// After a shutdown request, how long in-flight requests may run before they are ended.
    pub grace: Duration,
    /// A request's headers must arrive within this long of the connection opening or of the
    /// previous response (so it is also the keep-alive idle timeout).
    pub header_timeout: Duration,
    /// A request's whole body must arrive within this long of its headers.
    pub body_timeout: Duration,
    /// A response write that makes no progress for this long ends the connection.
    pub idle_timeout: Duration,
    /// Connections served at once; one more closes the oldest as soon as it is idle.
    /// Lowered to what the open-file limit allows.
    pub max_connections: usize,
    /// Host names the server answers to besides the localhost names (`*`: any); see
    /// [`HostPolicy::new`].
    pub allowed_hosts: Vec<String>,
    /// Origins whose cross-origin browser requests are allowed (CORS; `*`: any).
    pub cors: Vec<String>,
    /// Folders `/admin/models` may load models from (besides `aliases` and the models the
    /// server started with).
    pub models_dirs: Vec<std::path::PathBuf>,
    /// Model references `/admin/models` may load as they are (the built-in aliases).
    pub aliases: Vec<String>,
    /// Most bytes all loaded models may take (weights and KV cache); `None`: no limit.
    pub max_models_bytes: Option<u64>,
    /// Text of special tokens in chat message content becomes those tokens (it is tokenized
    /// as plain text otherwise, so a user cannot forge a system turn).
    pub allow_special_in_content: bool,
    /// Every model's chat template instead of its own: a built-in format's name (`chatml`,
    /// `llama3`, `gemma`) or Jinja source.
    pub chat_template: Option<String>,
    /// Share the KV blocks of identical prompt prefixes between requests.
    pub prefix_cache: bool,
    /// How `/v1/embeddings` pools every model's hidden states; `None`: as each GGUF's
    /// `{arch}.pooling_type` says, the mean when it says nothing.
    pub pooling: Option<smelt_engine::Pooling>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: "127.0.0.1:8080".into(),
            api_key: None,
            admin_key: None,
            metrics_key: None,
            scheduler: SchedulerConfig::default(),
            ctx: 4096,
            grace: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            allowed_hosts: Vec::new(),
            cors: Vec::new(),
            models_dirs: Vec::new(),
            aliases: Vec::new(),
            max_models_bytes: None,
            allow_special_in_content: false,
            chat_template: None,
            prefix_cache: true,
            pooling: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot load model {model}: {why}")]
    Load { model: String, why: String },
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Shared by every handler.
pub(crate) struct AppState {
    pub config: ServerConfig,
    pub models: models::Registry,
    pub loader: Loader,
    pub stats: metrics::ServerStats,
    /// Set once shutdown starts: new requests get 503.
    pub shutting_down: AtomicBool,
    /// The `Host` values answered (from the bound address and `allowed_hosts`).
    pub hosts: HostPolicy,
    /// Admin endpoints without an admin key: loopback-bound, no API key.
    pub admin_open: bool,
    /// What `/admin/models` may load.
    pub confine: models::Confinement,
    /// One admin load at a time, so the memory limit is checked against settled totals.
    pub loading: tokio::sync::Mutex<()>,
}

/// Ends a running [`Server`] gracefully: it stops accepting, lets in-flight requests finish
/// within the grace period, ends the rest, and [`Server::run`] returns `Ok`.
#[derive(Clone)]
pub struct ShutdownHandle(watch::Sender<bool>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

/// A bound server with its models loaded, ready to run.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: watch::Sender<bool>,
}

impl Server {
    /// Binds the address, then loads `models` (each a reference the loader understands).
    pub async fn bind(
        config: ServerConfig,
        loader: Loader,
        models: &[String],
    ) -> Result<Server, ServerError> {
        // The port first: one in use is reported at once, not after minutes of loading.
        let listener =
            TcpListener::bind(&config.addr)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.addr.clone(),
                    source,
                })?;
        let loopback = listener.local_addr()?.ip().is_loopback();
        let state = Arc::new(AppState {
            config: config.clone(),
            models: models::Registry::default(),
            loader,
            stats: metrics::ServerStats::default(),
            shutting_down: AtomicBool::new(false),
            hosts: HostPolicy::new(loopback, &config.allowed_hosts),
            admin_open: loopback && config.api_key.is_none(),
            confine: models::Confinement::new(&config.models_dirs, &config.aliases, models),
            loading: tokio::sync::Mutex::new(()),
        });
        for reference in models {
            routes::load_model(&state, reference, None)
                .await
                .map_err(|e| ServerError::Load {
                    model: reference.clone(),
                    why: e.message,
                })?;
        }
        let (shutdown, _) = watch::channel(false);
        Ok(Server {
            listener,
            state,
            shutdown,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Serves until shut down.
    pub async fn run(self) -> Result<(), ServerError> {
        let app = routes::router(Arc::clone(&self.state));
        let mut stop2 = self.shutdown.subscribe();
        let c = &self.state.config;
        let limits = smelt_http::conn::ConnLimits {
            header_timeout: c.header_timeout,
            idle_timeout: c.idle_timeout,
            max_connections: smelt_http::conn::fit_to_fds(c.max_connections),
        };
        let serve = smelt_http::conn::serve(self.listener, app, limits, self.shutdown.subscribe());
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => return Ok(r?),
            _ = stop2.wait_for(|s| *s) => {}
        }
        self.state.shutting_down.store(true, Ordering::SeqCst);
        tracing::info!(
            grace_s = self.state.config.grace.as_secs_f64(),
            "shutting down: no new connections; in-flight requests may finish"
        );
        tokio::select! {
            r = &mut serve => return Ok(r?),
            _ = tokio::time::sleep(self.state.config.grace) => {}
        }
        tracing::warn!("grace period over: ending the requests still running");
        for m in self.state.models.list() {
            m.scheduler.cancel_all();
        }
        // Their streams end with an error event now; give the connections a moment to flush.
        tokio::select! {
            r = &mut serve => Ok(r?),
            _ = tokio::time::sleep(Duration::from_secs(2)) => Ok(()),
        }
    }
}
