//! Talking to nodes: the health poller (each node's `/live`, then its `/admin/models`, which
//! the [`Cluster`](crate::policy::Cluster) view is rebuilt from), loads and unloads through
//! the node's `/admin/models`, putting pinned models back, and nodes that join by themselves
//! (`smelt serve --gateway`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::policy::{Node, Origin, Reported};
use crate::Shared;

/// Longest a node's `/live` or `/admin/models` may take before it counts as failed.
const POLL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a load may take on a node (a big model from a slow disk).
const LOAD_TIMEOUT: Duration = Duration::from_secs(900);

/// A request to node `i`'s `path`, with its admin key (which opens `/v1/*` too).
pub(crate) fn request(
    sh: &Shared,
    i: usize,
    method: reqwest::Method,
    path: &str,
) -> Option<reqwest::RequestBuilder> {
    let (url, key) = {
        let c = sh.cluster();
        let n = c.nodes.get(i)?;
        (n.url.clone(), n.admin_key.clone())
    };
    let mut r = sh.http.request(method, format!("{url}{path}"));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    Some(r)
}

/// Polls node `i` now and then every `health_interval_ms`, for as long as the gateway runs.
pub fn spawn_poller(sh: Arc<Shared>, i: usize) {
    tokio::spawn(async move {
        let every = sh.config.health_interval();
        let forget = Duration::from_millis(sh.config.gateway.forget_after_ms);
        loop {
            poll(&sh, i).await;
            let gone = {
                let mut c = sh.cluster();
                let name = c.nodes[i].name.clone();
                let gone = c.forget_if_gone(i, forget);
                if gone {
                    tracing::warn!(node = %name, "node stayed down: forgotten until it joins again");
                }
                gone
            };
            if gone {
                sh.changed.notify_waiters();
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// One health check of node `i`: `/live` decides up or down; when up, its `/admin/models`
/// becomes the gateway's view of it, and pinned models it lacks are loaded again.
pub async fn poll(sh: &Arc<Shared>, i: usize) {
    let (name, was_up, epoch) = {
        let c = sh.cluster();
        let n = &c.nodes[i];
        (n.name.clone(), n.up, n.epoch)
    };
    let live = match request(sh, i, reqwest::Method::GET, "/live") {
        Some(r) => r.timeout(POLL_TIMEOUT).send().await,
        None => return,
    };
    if !live.is_ok_and(|r| r.status().is_success()) {
        if was_up {
            tracing::warn!(node = %name, "node failed its liveness check: marked down");
            sh.cluster().set_down(i);
            sh.changed.notify_waiters();
        }
        return;
    }
    let report = match list_models(sh, i).await {
        Ok(r) => r,
        Err(why) => {
            if was_up {
                tracing::warn!(node = %name, "node is alive but its models cannot be read: {why}");
            }
            // Alive but unreadable (admin disabled, wrong key): it can take no routed work.
            sh.cluster().set_down(i);
            return;
        }
    };
    {
        let mut c = sh.cluster();
        // A load or unload finished while the report was on its way: the report may predate
        // it, so only the next one is applied.
        if c.nodes[i].epoch != epoch {
            return;
        }
        c.sync(i, &report.0, report.1);
    }
    if !was_up {
        tracing::info!(node = %name, models = report.0.len(), "node is up");
    }
    sh.changed.notify_waiters();
    reload_pins(sh);
}

/// The node's loaded models and its memory limit, from its `/admin/models`.
async fn list_models(sh: &Shared, i: usize) -> Result<(Vec<Reported>, Option<u64>), String> {
    let r = request(sh, i, reqwest::Method::GET, "/admin/models")
        .ok_or("no such node")?
        .timeout(POLL_TIMEOUT)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let v: Value = r.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "/admin/models answered {status}: {}",
            error_text(&v)
        ));
    }
    let models = v["data"]
        .as_array()
        .ok_or("/admin/models has no `data` list")?
        .iter()
        .filter_map(reported)
        .collect();
    Ok((models, v["max_models_bytes"].as_u64()))
}

/// One model of a node's `/admin/models` answer.
fn reported(m: &Value) -> Option<Reported> {
    Some(Reported {
        id: m["id"].as_str()?.to_string(),
        bytes: m["bytes"].as_u64().unwrap_or(0),
        kv_free: m["kv_blocks_free"].as_u64().unwrap_or(0),
    })
}

/// The `message` of an OpenAI-shaped error body, or the body itself.
pub(crate) fn error_text(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Starts loads for pinned models missing from healthy nodes.
pub fn reload_pins(sh: &Arc<Shared>) {
    let loads = {
        let mut c = sh.cluster();
        let loads = c.pin_loads();
        for (i, m, evict, bytes) in &loads {
            c.begin_load(*i, m, *bytes, evict);
        }
        loads
    };
    for (i, m, evict, _) in loads {
        spawn_load(Arc::clone(sh), i, m, evict);
    }
}

/// Carries out a load that [`Cluster::begin_load`](crate::policy::Cluster::begin_load)
/// planned: unloads `evict` on node `i`, then loads `model` there under its catalogue name.
/// Runs apart from the request that asked for it, so a client that leaves does not cut a
/// load in half.
pub fn spawn_load(sh: Arc<Shared>, i: usize, model: String, evict: Vec<String>) {
    tokio::spawn(async move {
        let node = sh.cluster().nodes[i].name.clone();
        for e in &evict {
            match unload(&sh, i, e).await {
                Ok(()) => tracing::info!(node = %node, model = %e, "evicted"),
                Err(why) => tracing::warn!(node = %node, model = %e, "eviction failed: {why}"),
            }
            sh.metrics.eviction(e, &node);
            sh.cluster().finish_unload(i, e);
            sh.changed.notify_waiters();
        }
        let t0 = Instant::now();
        let result = load(&sh, i, &model).await;
        let secs = t0.elapsed().as_secs_f64();
        sh.metrics.load(&model, &node, result.is_ok(), secs);
        match result {
            Ok(r) => {
                tracing::info!(node = %node, model = %model, seconds = secs, "loaded");
                sh.cluster().finish_load(i, &model, Some(r));
            }
            Err(LoadError::Changed(why)) => {
                // Another gateway (or a load by hand) took the room this load counted on: no
                // fault of the node. The view is read again at once and waiting requests
                // route anew on it.
                tracing::info!(node = %node, model = %model, "load refused, the node's models changed: {why}");
                sh.cluster().finish_load(i, &model, None);
                poll(&sh, i).await;
            }
            Err(LoadError::Failed(why)) => {
                tracing::warn!(node = %node, model = %model, "load failed: {why}");
                sh.note_load_failure(
                    &model,
                    i,
                    format!("loading `{model}` on node `{node}` failed: {why}"),
                );
                sh.cluster().finish_load(i, &model, None);
            }
        }
        sh.changed.notify_waiters();
    });
}

/// Why a load did not happen.
enum LoadError {
    /// The node holds models this gateway did not know of (409 `models_changed`).
    Changed(String),
    Failed(String),
}

impl From<&str> for LoadError {
    fn from(why: &str) -> Self {
        LoadError::Failed(why.into())
    }
}

/// Asks node `i` to load `model` (its catalogue `source`, served under the catalogue name),
/// on condition that the node holds nothing beyond what this gateway counts there: with
/// several gateways side by side, a load planned on a view another one has overtaken is
/// refused by the node instead of taking the node past its room.
async fn load(sh: &Shared, i: usize, model: &str) -> Result<Reported, LoadError> {
    let (source, expect) = {
        let c = sh.cluster();
        let source = c
            .catalogue
            .get(model)
            .map(|s| s.source.clone())
            .ok_or("not in the catalogue")?;
        let expect: Vec<String> = c.nodes[i]
            .models
            .keys()
            .filter(|m| *m != model)
            .cloned()
            .collect();
        (source, expect)
    };
    let r = request(sh, i, reqwest::Method::POST, "/admin/models")
        .ok_or("no such node")?
        .timeout(LOAD_TIMEOUT)
        .json(&json!({"model": source, "id": model, "expect_loaded": expect}))
        .send()
        .await
        .map_err(|e| {
            sh.cluster().set_down(i);
            LoadError::Failed(format!("the node did not answer ({e})"))
        })?;
    let status = r.status();
    let v: Value = r
        .json()
        .await
        .map_err(|e| LoadError::Failed(e.to_string()))?;
    if status.is_success() {
        return reported(&v["loaded"]).ok_or_else(|| LoadError::Failed(format!("odd answer: {v}")));
    }
    if v["error"]["code"] == "model_exists" {
        // Already there (a load by hand, another gateway): what it takes comes with the next
        // poll.
        let bytes = sh.cluster().bytes_of(model);
        return Ok(Reported {
            id: model.into(),
            bytes,
            kv_free: 0,
        });
    }
    if v["error"]["code"] == "models_changed" {
        return Err(LoadError::Changed(error_text(&v)));
    }
    Err(LoadError::Failed(format!("{status}: {}", error_text(&v))))
}

/// Asks node `i` to unload `model`; one it does not have counts as unloaded.
pub async fn unload(sh: &Shared, i: usize, model: &str) -> Result<(), String> {
    let r = request(sh, i, reqwest::Method::POST, "/admin/models")
        .ok_or("no such node")?
        .timeout(POLL_TIMEOUT * 6)
        .json(&json!({"action": "unload", "id": model}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
        return Ok(());
    }
    let v: Value = r.json().await.unwrap_or(Value::Null);
    Err(format!("{status}: {}", error_text(&v)))
}

/// What a node sends to join: `POST /admin/nodes` with the gateway's admin key.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub admin_key: Option<String>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

/// Adds a node that joined by itself, or refreshes it (a heartbeat). Returns whether it was
/// new; a name taken by a `[[node]]` of the config is refused.
pub fn register(sh: &Arc<Shared>, r: Registration) -> Result<bool, String> {
    crate::config::check_name("node", &r.name).map_err(|e| e.to_string())?;
    crate::config::check_url(&r.url)?;
    let new = {
        let mut c = sh.cluster();
        match c.node_index(&r.name) {
            Some(i) => {
                let n = &mut c.nodes[i];
                if n.origin == Origin::Static {
                    return Err(format!(
                        "node name `{}` is taken by the gateway's config",
                        r.name
                    ));
                }
                let url = r.url.trim_end_matches('/');
                if n.url != url {
                    tracing::info!(node = %r.name, url, "node moved");
                    n.url = url.to_string();
                }
                n.admin_key = r.admin_key;
                n.room_configured = r.memory_mb.map(|m| m << 20);
                if n.forgotten {
                    // Back after it was forgotten: polled again from now.
                    n.forgotten = false;
                    n.down_since = None;
                    Some(i)
                } else {
                    None
                }
            }
            None => {
                let mut n = Node::new(&r.name, &r.url, r.admin_key, Origin::Registered);
                n.room_configured = r.memory_mb.map(|m| m << 20);
                c.nodes.push(n);
                Some(c.nodes.len() - 1)
            }
        }
    };
    if let Some(i) = new {
        tracing::info!(node = %r.name, url = %r.url, "node joined");
        spawn_poller(Arc::clone(sh), i);
    }
    Ok(new.is_some())
}
