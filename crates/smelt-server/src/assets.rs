//! The chat page at `/`: static files embedded in the binary, so `smelt serve` needs nothing
//! beside itself. Markdown goes through three vendored libraries (no CDN): marked 18.2.1
//! (MIT) renders it, DOMPurify 3.4.18 (Apache-2.0 / MPL-2.0) strips whatever could run from
//! the HTML, since the text comes from a model, and highlight.js 11.12.0 (BSD-3-Clause, its
//! build of the common languages) colours code blocks (licenses in `static/vendor/`).

use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::AppState;

const INDEX_HTML: &str = include_str!("../static/index.html");
const APP_JS: &str = include_str!("../static/app.js");
const STYLE_CSS: &str = include_str!("../static/style.css");
const MARKED_JS: &str = include_str!("../static/vendor/marked.umd.js");
const PURIFY_JS: &str = include_str!("../static/vendor/purify.min.js");
const HIGHLIGHT_JS: &str = include_str!("../static/vendor/highlight.min.js");

/// A script answered with its content type.
fn script(body: &'static str) -> axum::response::Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        body,
    )
        .into_response()
}

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
        .route("/app.js", get(|| async { script(APP_JS) }))
        .route("/vendor/marked.js", get(|| async { script(MARKED_JS) }))
        .route("/vendor/purify.js", get(|| async { script(PURIFY_JS) }))
        .route(
            "/vendor/highlight.js",
            get(|| async { script(HIGHLIGHT_JS) }),
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
