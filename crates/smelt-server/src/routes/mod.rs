//! HTTP routes: the OpenAI endpoints, health, metrics, the API description, admin and the
//! chat page. Handlers parse and check a request, tokenize it, queue it on the model's
//! scheduler and hand its events to [`crate::reply`], which answers in OpenAI's shapes.
//!
//! This module is the router and the layers around every route (auth, the edge guard, the
//! panic catcher, the response counter, the 404/405 fallbacks), plus what every handler
//! shares (the request body, the model a request names). The handlers live by job in its
//! children: [`info`] (health, liveness, metrics, the API description, `/v1/models`),
//! [`admin`] (`/admin/models`), [`load`] (starting a model, at startup or by admin),
//! [`chat`] and [`completions`] (the two generation endpoints) and [`generate`] (the path
//! they share from prompt tokens to a queued job and its answer).

mod admin;
mod chat;
mod completions;
mod generate;
mod info;
mod load;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;

use crate::error::ApiError;
use crate::models::ModelEntry;
use crate::{assets, guard, AppState};

pub(crate) use load::load_model;

type St = State<Arc<AppState>>;

/// The target of every log line the routes write, whichever child module writes it: the
/// handlers lived in this one module, and their lines keep the target they had.
const LOG_TARGET: &str = module_path!();

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(info::list_models))
        .route("/v1/models/{id}", get(info::get_model))
        .route("/tokenize", post(crate::tokenize::tokenize))
        .route("/detokenize", post(crate::tokenize::detokenize))
        .route("/tokenizer_info", get(crate::tokenize::tokenizer_info))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::api_auth,
        ));
    let admin = Router::new()
        .route(
            "/admin/models",
            get(admin::admin_list).post(admin::admin_post),
        )
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::admin_auth,
        ));
    let metrics = Router::new()
        .route("/metrics", get(info::metrics))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::metrics_auth,
        ));
    Router::new()
        .merge(api)
        .merge(admin)
        .merge(metrics)
        .route("/health", get(info::health))
        .route("/live", get(info::live))
        .route("/openapi.json", get(info::openapi_json))
        .merge(assets::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the counter, so a caught panic is counted as the 500 it becomes.
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn_with_state(
            Arc::new(smelt_http::guard::Edge {
                hosts: state.hosts.clone(),
                cors: state.config.cors.clone(),
                body_timeout: state.config.body_timeout,
                body_limit: guard::BODY_LIMIT,
            }),
            smelt_http::guard::guard,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), count))
        .with_state(state)
}

/// A handler that panics answers 500 in the error shape instead of dropping the connection.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!("a handler panicked: {why}");
    ApiError::internal(format!("internal error: {why}")).into_response()
}

/// Counts every response by status for `/metrics`, and logs it at debug level.
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let (method, path, t0) = (
        req.method().clone(),
        req.uri().path().to_string(),
        Instant::now(),
    );
    let resp = next.run(req).await;
    st.stats.count_response(resp.status().as_u16());
    // For a stream this is the time to its headers; the scheduler logs the whole request.
    tracing::debug!(
        %method,
        path,
        status = resp.status().as_u16(),
        ms = t0.elapsed().as_secs_f64() * 1e3,
        "http"
    );
    resp
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {} (GET /openapi.json lists the endpoints)",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> Response {
    let mut e = ApiError::bad_request(format!(
        "method {} is not allowed on {}",
        req.method(),
        req.uri().path()
    ));
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e.into_response()
}

pub(crate) fn model_for(st: &AppState, id: Option<&str>) -> Result<Arc<ModelEntry>, ApiError> {
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    st.models.get(id).ok_or_else(|| match id {
        Some(id) => ApiError::model_not_found(id),
        None => ApiError::unavailable("no model is loaded"),
    })
}

/// A request body, or why it could not be read (too big, cut off).
pub(crate) type Body = Result<Bytes, BytesRejection>;

/// An unreadable body in the error shape, with the status axum chose (413 when too big).
pub(crate) fn body_error(r: BytesRejection) -> ApiError {
    let mut e = ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()));
    e.status = r.status();
    e
}
