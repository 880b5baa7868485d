//! `/admin/models`: the loaded models with what a gateway plans loads with, and loading or
//! unloading one on request. Apart from the other handlers because a load asked for over
//! HTTP is checked as none other is: a confined reference, one load at a time, the memory
//! limit, and the `expect_loaded` condition.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::load::load_inner;
use super::{body_error, Body, St, LOG_TARGET};
use crate::error::ApiError;
use crate::models::{self, ModelEntry};
use crate::{guard, openai, AppState};

/// The loaded models, with the memory limit they share (what a gateway plans loads with).
pub(super) async fn admin_list(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st.models.list().iter().map(|m| admin_json(m)).collect();
    Json(json!({
        "object": "list",
        "data": data,
        "max_models_bytes": st.config.max_models_bytes,
    }))
}

fn admin_json(m: &ModelEntry) -> Value {
    let s = &m.scheduler.stats;
    json!({
        "id": m.id,
        "object": "model",
        "created": m.created,
        "reference": m.reference,
        "path": m.path.display().to_string(),
        "architecture": m.arch,
        "context": m.ctx,
        "chat_template": m.template.is_ok(),
        "bytes": m.bytes,
        "kv_blocks_total": m.total_blocks,
        "kv_blocks_free": s.kv_blocks_free.load(Ordering::Relaxed),
        "running": s.running.load(Ordering::Relaxed),
        "queue_depth": s.queue_depth.load(Ordering::Relaxed),
    })
}

/// `{"model": path-or-alias, "id"?: ..., "expect_loaded"?: [ids]}` loads;
/// `{"action": "unload", "id": ...}` (or just `{"id": ...}`) unloads. `expect_loaded` makes
/// the load conditional: refused (409 `models_changed`) when the server holds a model not in
/// the list, so a client that planned the load on what it last read of `/admin/models` (one
/// of several gateways) never loads into room another client took meanwhile.
pub(super) async fn admin_post(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    let v: Value = openai::parse(&body.map_err(body_error)?)?;
    let field = |k: &str| -> Result<Option<String>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid_param(k, format!("{k} must be a string"))),
        }
    };
    let (action, model, id) = (field("action")?, field("model")?, field("id")?);
    let expect = match v.get("expect_loaded") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    ApiError::invalid_param("expect_loaded", "expect_loaded must list model ids")
                })?,
        ),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "expect_loaded",
                "expect_loaded must list model ids",
            ))
        }
    };
    let action = match (action.as_deref(), &model) {
        (Some(a), _) => a.to_string(),
        (None, Some(_)) => "load".into(),
        (None, None) => "unload".into(),
    };
    match action.as_str() {
        "load" => {
            let model = model.ok_or_else(|| {
                ApiError::invalid_param("model", "load needs `model`: a GGUF path or an alias")
            })?;
            let m = admin_load(&st, &model, id, expect).await?;
            Ok(Json(json!({"loaded": admin_json(&m)})))
        }
        "unload" => {
            let id = id.ok_or_else(|| ApiError::invalid_param("id", "unload needs `id`"))?;
            st.models
                .remove(&id)
                .ok_or_else(|| ApiError::model_not_found(&id))?;
            tracing::info!(target: LOG_TARGET, model = %id, "unloaded");
            Ok(Json(json!({"unloaded": id})))
        }
        other => Err(ApiError::invalid_param(
            "action",
            format!("unknown action {other:?} (load or unload)"),
        )),
    }
}

/// A load asked for through `/admin/models`: a checked id, a reference inside the allowed
/// places, one load at a time within the memory limit and, with `expect`, only while the
/// server holds no model outside it; errors say what failed but never quote the file (the
/// server log has the loader's own words).
async fn admin_load(
    st: &Arc<AppState>,
    reference: &str,
    id: Option<String>,
    expect: Option<Vec<String>>,
) -> Result<Arc<ModelEntry>, ApiError> {
    if let Some(id) = &id {
        models::check_id(id).map_err(|e| ApiError::invalid_param("id", e))?;
    }
    let target = st.confine.check(reference)?;
    let _one = st.loading.lock().await;
    if let Some(expect) = &expect {
        // Checked under the load lock: no other load can slip in between check and load.
        let unexpected: Vec<String> = st
            .models
            .list()
            .iter()
            .map(|m| m.id.clone())
            .filter(|m| !expect.contains(m) && Some(m) != id.as_ref())
            .collect();
        if !unexpected.is_empty() {
            return Err(ApiError {
                status: StatusCode::CONFLICT,
                code: Some("models_changed"),
                ..ApiError::invalid_param(
                    "expect_loaded",
                    format!(
                        "the server holds models this load did not expect ({}): read \
                         /admin/models again and decide anew",
                        guard::clip(&unexpected.join(", "), 200)
                    ),
                )
            });
        }
    }
    let used = || st.models.list().iter().map(|m| m.bytes).sum::<u64>();
    let over = |need: u64| -> Option<ApiError> {
        let cap = st.config.max_models_bytes?;
        let used = used();
        (used.saturating_add(need) > cap).then(|| ApiError {
            status: StatusCode::CONFLICT,
            code: Some("memory_limit"),
            ..ApiError::invalid_param(
                "model",
                format!(
                    "loading `{}` would take the models' memory past the server's limit \
                     ({} MiB used of {} MiB, about {} MiB more needed): unload a model first",
                    guard::clip(reference, 100),
                    used >> 20,
                    cap >> 20,
                    need >> 20
                ),
            )
        })
    };
    // Before loading, the file's size (weights); after, the model's own estimate with its KV
    // cache.
    let on_disk = std::fs::metadata(&target)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len());
    if let Some(e) = over(on_disk) {
        return Err(e);
    }
    let m = load_inner(st, &target, reference, id).await.map_err(|e| {
        if e.status != StatusCode::BAD_REQUEST || e.code == Some("model_exists") {
            return e;
        }
        tracing::warn!(target: LOG_TARGET, model = %reference, "admin load failed: {}", e.message);
        ApiError::invalid_param(
            "model",
            format!(
                "cannot load `{}`: it is not a model this server can load (the server log \
                 says why)",
                guard::clip(reference, 100)
            ),
        )
    })?;
    let others = used().saturating_sub(m.bytes);
    if let Some(cap) = st.config.max_models_bytes {
        if others.saturating_add(m.bytes) > cap {
            st.models.remove(&m.id);
            return Err(over(m.bytes).unwrap_or_else(|| ApiError {
                status: StatusCode::CONFLICT,
                code: Some("memory_limit"),
                ..ApiError::invalid_param("model", "the models' memory limit is reached")
            }));
        }
    }
    Ok(m)
}
