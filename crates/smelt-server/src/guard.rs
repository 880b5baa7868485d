//! The server's keys: the API key on `/v1/*`, the separate admin key on `/admin/*` and the
//! optional metrics key on `/metrics`. The checks every request passes first (Host, Origin,
//! content type, body deadline) are `smelt_http`'s, shared with the gateway.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
pub use smelt_http::guard::{clip, HostPolicy};
use smelt_http::guard::{forbidden, holds};

use crate::error::ApiError;
use crate::AppState;

/// Largest request body (the OpenAI requests we serve are far smaller).
pub(crate) const BODY_LIMIT: usize = 2 << 20;

/// `/v1/*`: the API key when the server has one (the admin key works too).
pub(crate) async fn api_auth(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if st.config.api_key.is_some()
        && !holds(req.headers(), &st.config.api_key)
        && !holds(req.headers(), &st.config.admin_key)
    {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// `/admin/*`: the admin key when there is one; without one, admin is open only on a
/// loopback-bound server with no API key, and disabled otherwise.
pub(crate) async fn admin_auth(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    match &st.config.admin_key {
        Some(_) if holds(req.headers(), &st.config.admin_key) => next.run(req).await,
        Some(_) => ApiError {
            message: "missing or invalid admin key: send `Authorization: Bearer <admin key>`"
                .into(),
            ..ApiError::unauthorized()
        }
        .into_response(),
        None if st.admin_open => next.run(req).await,
        None => forbidden(
            "admin_disabled",
            "the admin endpoints are disabled: start the server with --admin-key KEY".into(),
        ),
    }
}

/// `/metrics`: the metrics key when one is set (the admin key works too).
pub(crate) async fn metrics_auth(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if st.config.metrics_key.is_some()
        && !holds(req.headers(), &st.config.metrics_key)
        && !holds(req.headers(), &st.config.admin_key)
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
