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
pub mod error;
pub mod metrics;
pub mod models;
pub mod openai;
mod openapi;
mod reply;
mod routes;
pub mod scheduler;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use error::ApiError;
pub use models::{gguf_loader, model_id, LoadedModel, Loader};
pub use scheduler::SchedulerConfig;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `host:port`; port 0 picks a free one (see [`Server::local_addr`]).
    pub addr: String,
    /// When set, `/v1/*` and `/admin/*` need `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    pub scheduler: SchedulerConfig,
    /// Most tokens one sequence may hold (prompt and generation).
    pub ctx: usize,
    /// After a shutdown request, how long in-flight requests may run before they are ended.
    pub grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: "127.0.0.1:8080".into(),
            api_key: None,
            scheduler: SchedulerConfig::default(),
            ctx: 4096,
            grace: Duration::from_secs(10),
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
        let state = Arc::new(AppState {
            config: config.clone(),
            models: models::Registry::default(),
            loader,
            stats: metrics::ServerStats::default(),
            shutting_down: AtomicBool::new(false),
        });
        // The port first: one in use is reported at once, not after minutes of loading.
        let listener =
            TcpListener::bind(&config.addr)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.addr.clone(),
                    source,
                })?;
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
        let mut stop = self.shutdown.subscribe();
        let mut stop2 = self.shutdown.subscribe();
        let serve = axum::serve(self.listener, app).with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        let serve = std::future::IntoFuture::into_future(serve);
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
