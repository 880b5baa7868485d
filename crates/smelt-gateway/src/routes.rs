//! The gateway's HTTP surface: the OpenAI endpoints (forwarded by [`crate::proxy`]),
//! `/v1/models` (the catalogue with where each model is), `/health`, `/metrics`, and its own
//! admin: `/admin/nodes` (list; nodes join with POST) and `/admin/models` (load, unload, pin
//! and unpin on a node by hand). Every error is in OpenAI's shape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use smelt_http::guard::{bearer, holds, same};

use crate::error::{clip, ApiError};
use crate::nodes::{self, Registration};
use crate::policy::{Cluster, Origin, Phase};
use crate::{proxy, Shared};

type St = State<Arc<Shared>>;

/// Request bodies up to this size are forwarded (long prompts).
const BODY_LIMIT: usize = 32 << 20;

/// The routes; `loopback`: the gateway listens on a loopback address (localhost Host names
/// only, unless `allow_hosts` says more).
pub(crate) fn router(sh: Arc<Shared>, loopback: bool) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&sh), api_auth));
    let admin = Router::new()
        .route("/admin/nodes", get(admin_nodes).post(admin_register))
        .route("/admin/models", get(admin_models).post(admin_models_post))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&sh), admin_auth));
    let metrics =
        Router::new()
            .route("/metrics", get(metrics))
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&sh),
                metrics_auth,
            ));
    let g = &sh.config.gateway;
    let edge = Arc::new(smelt_http::Edge {
        hosts: smelt_http::HostPolicy::new(loopback, &g.allow_hosts),
        cors: g.cors.clone(),
        body_timeout: Duration::from_millis(g.body_timeout_ms),
        body_limit: BODY_LIMIT,
    });
    Router::new()
        .merge(api)
        .merge(admin)
        .merge(metrics)
        .route("/health", get(health))
        .route("/live", get(|| async { Json(json!({"status": "alive"})) }))
        .fallback(|req: Request| async move {
            ApiError::not_found(format!(
                "no route for {} {}",
                req.method(),
                clip(req.uri().path(), 100)
            ))
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            edge,
            smelt_http::guard::guard,
        ))
        .with_state(sh)
}

/// `/v1/*`: one of `api_keys` when there are any (the admin key works too).
async fn api_auth(State(sh): St, req: Request, next: Next) -> Response {
    let g = &sh.config.gateway;
    if !g.api_keys.is_empty() {
        let given = bearer(req.headers()).unwrap_or("").as_bytes();
        let ok = g.api_keys.iter().any(|k| same(k.as_bytes(), given))
            || holds(req.headers(), &g.admin_key);
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// `/admin/*`: the admin key; without one in the config, admin is disabled.
async fn admin_auth(State(sh): St, req: Request, next: Next) -> Response {
    match &sh.config.gateway.admin_key {
        None => ApiError::forbidden(
            "the gateway's admin is disabled: set admin_key in its [gateway] section or start \
             it with --admin-key",
        )
        .into_response(),
        key if holds(req.headers(), key) => next.run(req).await,
        Some(_) => ApiError {
            message: "missing or invalid admin key: send `Authorization: Bearer <admin key>`"
                .into(),
            ..ApiError::unauthorized()
        }
        .into_response(),
    }
}

/// `/metrics`: the metrics key when one is set (the admin key works too).
async fn metrics_auth(State(sh): St, req: Request, next: Next) -> Response {
    let g = &sh.config.gateway;
    if g.metrics_key.is_some()
        && !holds(req.headers(), &g.metrics_key)
        && !holds(req.headers(), &g.admin_key)
    {
        return ApiError {
            message: "missing or invalid metrics key: send `Authorization: Bearer <metrics key>`"
                .into(),
            ..ApiError::unauthorized()
        }
        .into_response();
    }
    next.run(req).await
}

async fn chat(State(sh): St, body: Bytes) -> Response {
    proxy::forward(sh, "/v1/chat/completions", body).await
}

async fn completions(State(sh): St, body: Bytes) -> Response {
    proxy::forward(sh, "/v1/completions", body).await
}

async fn embeddings(State(sh): St, body: Bytes) -> Response {
    proxy::forward(sh, "/v1/embeddings", body).await
}

/// Every catalogue model (and any model a node serves of its own), with where it is.
fn models_json(sh: &Shared, c: &Cluster) -> Vec<Value> {
    let mut names: Vec<&String> = c.catalogue.keys().collect();
    for n in &c.nodes {
        for m in n.models.keys() {
            if !names.contains(&m) {
                names.push(m);
            }
        }
    }
    names
        .into_iter()
        .map(|m| {
            let on = |phase: Phase| -> Vec<&str> {
                c.nodes
                    .iter()
                    .filter(|n| n.up && n.models.get(m).is_some_and(|p| p.phase == phase))
                    .map(|n| n.name.as_str())
                    .collect()
            };
            let (loaded, loading) = (on(Phase::Loaded), on(Phase::Loading));
            let pinned: Vec<&str> = c
                .nodes
                .iter()
                .filter(|n| n.pins.contains(m))
                .map(|n| n.name.as_str())
                .collect();
            let state = if !loaded.is_empty() {
                "loaded"
            } else if !loading.is_empty() {
                "loading"
            } else {
                "unloaded"
            };
            json!({
                "id": m,
                "object": "model",
                "created": sh.started,
                "owned_by": "smelt",
                "state": state,
                "loaded_on": loaded,
                "loading_on": loading,
                "pinned_on": pinned,
                "in_catalogue": c.catalogue.contains_key(m),
            })
        })
        .collect()
}

async fn list_models(State(sh): St) -> Json<Value> {
    let data = models_json(&sh, &sh.cluster());
    Json(json!({"object": "list", "data": data}))
}

async fn get_model(State(sh): St, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let data = models_json(&sh, &sh.cluster());
    data.into_iter()
        .find(|m| m["id"] == id.as_str())
        .map(Json)
        .ok_or_else(|| ApiError::model_not_found(&id))
}

/// 200 while at least one node is up; 503 otherwise.
async fn health(State(sh): St) -> Response {
    let (up, total) = {
        let c = sh.cluster();
        let known = c.nodes.iter().filter(|n| !n.forgotten).count();
        (c.nodes.iter().filter(|n| n.up).count(), known)
    };
    let body = Json(json!({
        "status": if up > 0 { "ok" } else { "no_node" },
        "nodes_up": up,
        "nodes": total,
    }));
    if up > 0 {
        body.into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn metrics(State(sh): St) -> Response {
    let text = sh.metrics.render(&sh.cluster());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn admin_nodes(State(sh): St) -> Json<Value> {
    let c = sh.cluster();
    let data: Vec<Value> = c
        .nodes
        .iter()
        .filter(|n| !n.forgotten)
        .map(|n| {
            let models: Vec<Value> = n
                .models
                .iter()
                .map(|(m, p)| {
                    json!({
                        "id": m,
                        "state": p.phase.as_str(),
                        "bytes": p.bytes,
                        "in_flight": p.in_flight,
                        "kv_blocks_free": p.kv_free,
                        "pinned": n.pins.contains(m),
                        "last_used": p.last_used,
                    })
                })
                .collect();
            let room = n.room();
            json!({
                "name": n.name,
                "url": n.url,
                "origin": match n.origin { Origin::Static => "config", Origin::Registered => "registered" },
                "state": if n.up { "up" } else { "down" },
                "room_bytes": (room != u64::MAX).then_some(room),
                "used_bytes": n.used(),
                "in_flight": n.in_flight,
                "pins": n.pins,
                "models": models,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// A node joins (or sends its heartbeat): `{"name", "url", "admin_key"?, "memory_mb"?}`.
/// A URL on an unspecified address (0.0.0.0) gets the address the request came from.
async fn admin_register(
    State(sh): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut r: Registration = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "a node registration is {{\"name\", \"url\", \"admin_key\"?, \"memory_mb\"?}}: {e}"
        ))
    })?;
    for unspecified in ["0.0.0.0", "[::]"] {
        if let Some(rest) = r.url.strip_prefix(&format!("http://{unspecified}")) {
            let ip = match peer.ip() {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            r.url = format!("http://{ip}{rest}");
        }
    }
    let name = r.name.clone();
    let new = nodes::register(&sh, r).map_err(|e| ApiError {
        status: StatusCode::CONFLICT,
        ..ApiError::bad_request(e)
    })?;
    Ok(Json(json!({
        "registered": name,
        "new": new,
        "heartbeat_ms": sh.config.gateway.health_interval_ms,
    })))
}

async fn admin_models(State(sh): St) -> Json<Value> {
    let data = models_json(&sh, &sh.cluster());
    Json(json!({"object": "list", "data": data}))
}

/// `{"action": "load" | "unload" | "pin" | "unpin", "model": NAME, "node": NODE}`: by hand,
/// on one node. A load evicts as a routed one would; pin also loads.
async fn admin_models_post(State(sh): St, body: Bytes) -> Result<Json<Value>, ApiError> {
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let field = |k: &'static str| -> Result<String, ApiError> {
        v.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ApiError::invalid_param(k, format!("`{k}` (a string) is required")))
    };
    let (action, model, node) = (field("action")?, field("model")?, field("node")?);
    let i = sh.cluster().node_index(&node).ok_or_else(|| {
        ApiError::invalid_param("node", format!("no node is named `{}`", clip(&node, 100)))
    })?;
    match action.as_str() {
        "load" | "pin" => {
            if !sh.cluster().catalogue.contains_key(&model) {
                return Err(ApiError::model_not_found(&model));
            }
            if action == "pin" {
                sh.cluster().nodes[i].pins.insert(model.clone());
            }
            load_by_hand(&sh, i, &model).await?;
            Ok(Json(
                json!({"action": action, "model": model, "node": node, "state": "loaded"}),
            ))
        }
        "unpin" => {
            sh.cluster().nodes[i].pins.remove(&model);
            Ok(Json(
                json!({"action": action, "model": model, "node": node}),
            ))
        }
        "unload" => {
            {
                let mut c = sh.cluster();
                let n = &mut c.nodes[i];
                if n.pins.contains(&model) {
                    return Err(ApiError::bad_request(format!(
                        "model `{model}` is pinned on node `{node}`: unpin it first"
                    )));
                }
                match n.models.get_mut(&model) {
                    Some(p) if p.phase == Phase::Loaded => p.phase = Phase::Unloading,
                    Some(p) => {
                        return Err(ApiError::bad_request(format!(
                            "model `{model}` is {} on node `{node}`",
                            p.phase.as_str()
                        )))
                    }
                    None => return Err(ApiError::model_not_found(&model)),
                }
            }
            let r = nodes::unload(&sh, i, &model).await;
            sh.cluster().finish_unload(i, &model);
            sh.changed.notify_waiters();
            r.map_err(ApiError::bad_gateway)?;
            Ok(Json(
                json!({"action": action, "model": model, "node": node, "state": "unloaded"}),
            ))
        }
        other => Err(ApiError::invalid_param(
            "action",
            format!(
                "unknown action {:?} (load, unload, pin, unpin)",
                clip(other, 40)
            ),
        )),
    }
}

/// Loads `model` on node `i` (evicting as the policy says) and waits until it is there.
async fn load_by_hand(sh: &Arc<Shared>, i: usize, model: &str) -> Result<(), ApiError> {
    let before = sh.load_failure(model).count;
    {
        let mut c = sh.cluster();
        if !c.nodes[i].up {
            return Err(ApiError::unavailable(format!(
                "node `{}` is down",
                c.nodes[i].name
            )));
        }
        if !c.nodes[i].models.contains_key(model) {
            let need = c.bytes_of(model);
            let evict = c.evictions(i, need).ok_or_else(|| {
                ApiError::unavailable(format!(
                    "no room for model `{model}` on node `{}`: what is loaded there is pinned or \
                     serving requests",
                    c.nodes[i].name
                ))
            })?;
            c.begin_load(i, model, need, &evict);
            drop(c);
            nodes::spawn_load(Arc::clone(sh), i, model.to_string(), evict);
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
    loop {
        let notified = sh.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let phase = sh.cluster().nodes[i].models.get(model).map(|p| p.phase);
        match phase {
            Some(Phase::Loaded) => return Ok(()),
            None | Some(Phase::Unloading) => {
                let f = sh.load_failure(model);
                return Err(ApiError::bad_gateway(if f.count > before {
                    f.why
                } else {
                    format!("model `{model}` did not stay loaded")
                }));
            }
            Some(Phase::Loading) => {}
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(ApiError::unavailable(format!(
                "model `{model}` is still loading"
            )));
        }
    }
}
