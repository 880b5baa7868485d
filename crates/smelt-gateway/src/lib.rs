//! `smelt gateway`: one OpenAI endpoint in front of many `smelt serve` nodes (issue 22).
//!
//! The gateway knows which node has which model (it polls each node's `/live` and
//! `/admin/models`), sends each request to the node with the model that has the fewest
//! requests in flight, loads a model where there is room when it is loaded nowhere (unloading
//! least recently used models that are neither pinned nor busy), retries on another node when
//! one dies, and passes streams through unbuffered. Its decisions are plain data in
//! [`policy`]; [`nodes`] talks to nodes, [`proxy`] forwards requests, [`routes`] is the HTTP
//! surface and [`join`] is the node side of `smelt serve --gateway`.
//!
//! It keeps no state it cannot rebuild from its nodes (what is loaded where, and each node's
//! room): several gateways can run side by side behind any load balancer.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = smelt_gateway::Config::load(std::path::Path::new("gateway.toml"))?;
//! let gw = smelt_gateway::Gateway::bind(config, "127.0.0.1:8000").await?;
//! gw.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

pub mod config;
pub mod error;
pub mod estimate;
pub mod join;
pub mod metrics;
pub mod nodes;
pub mod policy;
mod proxy;
mod routes;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::net::TcpListener;
use tokio::sync::Notify;

pub use config::Config;
use policy::{Cluster, Node, Origin, Spec};

/// Shared by every handler and background task.
pub struct Shared {
    pub config: Config,
    cluster: Mutex<Cluster>,
    /// Woken on every change of what is loaded where (loads, unloads, polls, failures), so
    /// requests waiting for a load route again.
    pub changed: Notify,
    pub metrics: metrics::Metrics,
    pub http: reqwest::Client,
    /// Per model: how many loads failed, and the last failure (for the requests that waited).
    load_failures: Mutex<BTreeMap<String, LoadFailures>>,
    /// Unix seconds at start (`created` in `/v1/models`).
    pub started: u64,
}

impl Shared {
    pub fn new(config: Config) -> Arc<Shared> {
        let mut c = Cluster::default();
        for n in &config.nodes {
            let mut node = Node::new(&n.name, &n.url, n.admin_key.clone(), Origin::Static);
            node.room_configured = n.memory_mb.map(|m| m << 20);
            c.nodes.push(node);
        }
        for m in &config.models {
            c.catalogue.insert(
                m.name.clone(),
                Spec {
                    source: m.source.clone(),
                    bytes: m.memory_mb.map(|b| b << 20),
                },
            );
            let ctx = m.ctx.unwrap_or(estimate::DEFAULT_CTX);
            if let Some(bytes) = estimate::model_bytes(std::path::Path::new(&m.source), ctx) {
                c.on_disk.insert(m.name.clone(), bytes);
            }
            for p in &m.pinned_on {
                if let Some(i) = c.node_index(p) {
                    c.nodes[i].pins.insert(m.name.clone());
                }
            }
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client with no TLS always builds");
        Arc::new(Shared {
            config,
            cluster: Mutex::new(c),
            changed: Notify::new(),
            metrics: metrics::Metrics::default(),
            http,
            load_failures: Mutex::new(BTreeMap::new()),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        })
    }

    /// The cluster view, for a short critical section (never held across an await).
    pub fn cluster(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failures(&self) -> MutexGuard<'_, BTreeMap<String, LoadFailures>> {
        self.load_failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How loads of `model` failed so far.
    pub fn load_failure(&self, model: &str) -> LoadFailures {
        self.failures().get(model).cloned().unwrap_or_default()
    }

    fn note_load_failure(&self, model: &str, node: usize, why: String) {
        let mut f = self.failures();
        let e = f.entry(model.to_string()).or_default();
        e.count += 1;
        e.node = node;
        e.why = why;
    }
}

/// Failed loads of one model: how many so far, and the last one's node and reason.
#[derive(Debug, Clone, Default)]
pub struct LoadFailures {
    pub count: u64,
    pub node: usize,
    pub why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the gateway failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A bound gateway, ready to run.
pub struct Gateway {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Gateway {
    pub async fn bind(config: Config, addr: &str) -> Result<Gateway, GatewayError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        Ok(Gateway {
            listener,
            shared: Shared::new(config),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, GatewayError> {
        Ok(self.listener.local_addr()?)
    }

    /// Polls the nodes and serves until `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), GatewayError> {
        let n = self.shared.cluster().nodes.len();
        for i in 0..n {
            nodes::spawn_poller(Arc::clone(&self.shared), i);
        }
        let loopback = self.listener.local_addr()?.ip().is_loopback();
        let app = routes::router(Arc::clone(&self.shared), loopback);
        // The accept loop `smelt serve` uses: header, idle and write timeouts, a connection
        // limit, TCP_NODELAY (stream chunks are small writes) and each peer's address.
        let g = &self.shared.config.gateway;
        let limits = smelt_http::conn::ConnLimits {
            header_timeout: Duration::from_millis(g.header_timeout_ms),
            idle_timeout: Duration::from_millis(g.idle_timeout_ms),
            max_connections: smelt_http::conn::fit_to_fds(g.max_connections),
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            stop_tx.send_replace(true);
        });
        smelt_http::conn::serve(self.listener, app, limits, stop_rx).await?;
        Ok(())
    }
}
