//! The chat page at `/`: static files embedded in the binary, so `smelt serve` needs nothing
//! beside itself.

use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::AppState;

const INDEX_HTML: &str = include_str!("../static/index.html");
const APP_JS: &str = include_str!("../static/app.js");
const STYLE_CSS: &str = include_str!("../static/style.css");

pub(crate) fn routes() -> Router<Arc<AppState>> {
    let page = || async {
        (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            INDEX_HTML,
        )
    };
    Router::new()
        .route("/", get(page))
        .route("/index.html", get(page))
        .route(
            "/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    APP_JS,
                )
                    .into_response()
            }),
        )
        .route(
            "/style.css",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
                    STYLE_CSS,
                )
                    .into_response()
            }),
        )
}
