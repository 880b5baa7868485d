//! The endpoints that answer from the server's state without running a model: health,
//! liveness, the Prometheus metrics, the API description and `/v1/models`. Kept apart from
//! the router so it reads as the list of routes, and from admin, whose view of a model is
//! fuller and guarded by another key.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::St;
use crate::error::ApiError;
use crate::models::ModelEntry;
use crate::openapi;

/// 200 only while a model can serve: 503 when shutting down or with no model loaded.
pub(super) async fn health(State(st): St) -> Response {
    let ids: Vec<String> = st.models.list().iter().map(|m| m.id.clone()).collect();
    let status = if st.shutting_down.load(Ordering::SeqCst) {
        "shutting_down"
    } else if ids.is_empty() {
        "no_model"
    } else {
        return Json(json!({"status": "ok", "models": ids})).into_response();
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": status, "models": ids})),
    )
        .into_response()
}

/// Liveness: the process answers, whatever its models.
pub(super) async fn live() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

pub(super) async fn metrics(State(st): St) -> Response {
    let models: Vec<_> = st
        .models
        .list()
        .iter()
        .map(|m| (m.id.clone(), Arc::clone(&m.scheduler.stats)))
        .collect();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.stats.render(&models),
    )
        .into_response()
}

pub(super) async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi::SPEC).into_response()
}

fn model_json(m: &ModelEntry) -> Value {
    json!({"id": m.id, "object": "model", "created": m.created, "owned_by": "smelt"})
}

pub(super) async fn list_models(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st.models.list().iter().map(|m| model_json(m)).collect();
    Json(json!({"object": "list", "data": data}))
}

pub(super) async fn get_model(
    State(st): St,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let m = st
        .models
        .get(Some(&id))
        .ok_or_else(|| ApiError::model_not_found(&id))?;
    Ok(Json(model_json(&m)))
}
