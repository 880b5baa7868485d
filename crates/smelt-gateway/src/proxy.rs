//! Forwarding one `/v1/chat/completions` or `/v1/completions` request: pick a node with
//! [`policy`](crate::policy) (waiting while its model loads), send the body unchanged, and
//! answer with the node's answer. A node that fails before answering (connection error,
//! timeout, 5xx) is left for another, up to two more tries; a 429 moves the request to
//! another node that has the model loaded, else goes back to the client with its
//! Retry-After. A stream is retried only until its first byte reaches the client; after
//! that its bytes pass through as they come, and a node failure ends it with an error
//! event. Dropping the response (a client that left) drops the node's connection, which
//! cancels the request there.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{stream, StreamExt};
use serde_json::Value;

use crate::error::ApiError;
use crate::nodes;
use crate::policy::Route;
use crate::Shared;

/// Tries per request: the first and up to two more.
const TRIES: usize = 3;
/// Longest a request waits for its model to load (and for room to settle).
const LOAD_WAIT: Duration = Duration::from_secs(900);

/// A request counted in flight on a node (and its model there) until dropped.
struct Lease {
    sh: Arc<Shared>,
    node: usize,
    model: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.sh.cluster().end(self.node, &self.model);
    }
}

/// Where a request goes: a node with the model loaded, counted in flight there. While the
/// model loads, the request counts in flight on the loading node. `only_loaded`: after a
/// 429, only another node that has the model loaded will do.
async fn acquire(
    sh: &Arc<Shared>,
    model: &str,
    tried: &[usize],
    only_loaded: bool,
) -> Result<Lease, ApiError> {
    let deadline = Instant::now() + LOAD_WAIT;
    // Loads of this model that failed while this request waited: their nodes are left out
    // (a node that died mid-load), and after TRIES of them the last reason is the answer.
    let mut failures_seen = sh.load_failure(model).count;
    let mut load_failed: Vec<usize> = Vec::new();
    let mut load_error: Option<String> = None;
    let mut pending: Option<Lease> = None;
    loop {
        let notified = sh.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let f = sh.load_failure(model);
        if f.count > failures_seen {
            failures_seen = f.count;
            load_failed.push(f.node);
            if load_failed.len() >= TRIES {
                return Err(ApiError::unavailable(f.why));
            }
            load_error = Some(f.why);
        }
        let (old, load) = {
            let mut c = sh.cluster();
            let exclude: Vec<usize> = tried.iter().chain(&load_failed).copied().collect();
            match c.route(model, &exclude) {
                Route::Serve(i) => {
                    c.start(i, model);
                    drop(c);
                    drop(pending);
                    return Ok(Lease {
                        sh: Arc::clone(sh),
                        node: i,
                        model: model.to_string(),
                    });
                }
                Route::Unknown => return Err(ApiError::model_not_found(model)),
                Route::Unavailable(why) => {
                    return Err(ApiError::unavailable(load_error.unwrap_or(why)))
                }
                _ if only_loaded => {
                    return Err(ApiError::unavailable(format!(
                        "no other node has model `{model}` loaded"
                    )))
                }
                Route::Wait(i) => {
                    let old = if pending.as_ref().is_some_and(|p| p.node == i) {
                        None
                    } else {
                        c.start(i, model);
                        pending.replace(Lease {
                            sh: Arc::clone(sh),
                            node: i,
                            model: model.to_string(),
                        })
                    };
                    (old, None)
                }
                Route::Load { node, evict, bytes } => {
                    c.begin_load(node, model, bytes, &evict);
                    c.start(node, model);
                    let old = pending.replace(Lease {
                        sh: Arc::clone(sh),
                        node,
                        model: model.to_string(),
                    });
                    (old, Some((node, evict)))
                }
            }
        };
        drop(old);
        if let Some((node, evict)) = load {
            nodes::spawn_load(Arc::clone(sh), node, model.to_string(), evict);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, notified).await.is_err() {
            return Err(ApiError::unavailable(format!(
                "model `{model}` did not become ready within {} s",
                LOAD_WAIT.as_secs()
            )));
        }
    }
}

/// What the gateway reads of a request body: the model, and whether it streams.
fn peek(body: &[u8]) -> Result<(String, bool), ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let model = match &v["model"] {
        Value::String(m) if !m.is_empty() => m.clone(),
        Value::Null => {
            return Err(ApiError::invalid_param(
                "model",
                "`model` is required: the gateway routes by it (GET /v1/models lists them)",
            ))
        }
        _ => {
            return Err(ApiError::invalid_param(
                "model",
                "`model` must be a non-empty string",
            ))
        }
    };
    Ok((model, v["stream"].as_bool().unwrap_or(false)))
}

/// Forwards a request to `path` on a node; see the module's doc.
pub async fn forward(sh: Arc<Shared>, path: &'static str, body: Bytes) -> Response {
    let (model, streamed) = match peek(&body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut tries = Tries::default();
    let mut only_loaded = false;
    for _ in 0..TRIES {
        let lease = match acquire(&sh, &model, &tries.tried, only_loaded).await {
            Ok(l) => l,
            Err(e) => {
                // A node's own failure, when there is one, says more (a 429 with its
                // Retry-After, a 5xx) than "no other node".
                if tries.last.is_none() {
                    tries.last = Some((e.into_response(), String::new()));
                }
                break;
            }
        };
        let node = lease.node;
        let name = sh.cluster().nodes[node].name.clone();
        let sent = nodes::request(&sh, node, reqwest::Method::POST, path)
            .expect("a leased node exists")
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        if let Some(prev) = tries.retry_of.take() {
            sh.metrics.retry(&model, &prev);
        }
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                let answer = broke(&sh, node, &name, &model, format!("did not answer: {e}"));
                tries.failed(node, name, answer);
                continue;
            }
        };
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            // Busy, not broken: another node with the model loaded, or this answer.
            tries.failed(node, name, buffered(resp).await.0);
            only_loaded = true;
            continue;
        }
        if status.is_server_error() {
            // Retried elsewhere, but the node stays up: its /live decides that.
            tracing::warn!(node = %name, model = %model, "the node answered {status}");
            tries.failed(node, name, buffered(resp).await.0);
            continue;
        }
        if status == StatusCode::NOT_FOUND {
            // The node no longer has the model (unloaded behind the gateway's back): route
            // again; the next poll corrects the view.
            let (answer, v) = buffered(resp).await;
            if v["error"]["code"] == "model_not_found" {
                sh.cluster().nodes[node].models.remove(&model);
                tries.failed(node, name, answer);
                continue;
            }
            sh.metrics.request(&model, &name, status.as_u16());
            return answer;
        }
        if !streamed || !status.is_success() {
            let headers = resp.headers().clone();
            match resp.bytes().await {
                Ok(b) => {
                    drop(lease);
                    sh.metrics.request(&model, &name, status.as_u16());
                    return with_headers(status, &headers, Body::from(b));
                }
                Err(e) => {
                    let answer = broke(&sh, node, &name, &model, format!("failed mid-answer: {e}"));
                    tries.failed(node, name, answer);
                    continue;
                }
            }
        }
        // A stream: its first chunk decides whether a retry is still possible.
        let headers = resp.headers().clone();
        let mut upstream = resp.bytes_stream();
        let first = match upstream.next().await {
            Some(Ok(b)) => b,
            other => {
                let e = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "the stream ended before its first byte".into(),
                };
                let why = format!("failed before streaming: {e}");
                let answer = broke(&sh, node, &name, &model, why);
                tries.failed(node, name, answer);
                continue;
            }
        };
        sh.metrics.request(&model, &name, status.as_u16());
        let sh2 = Arc::clone(&sh);
        let rest = upstream.scan(false, move |ended, item| {
            let out = match item {
                _ if *ended => None,
                Ok(b) => Some(b),
                Err(e) => {
                    *ended = true;
                    tracing::warn!(node = %name, "stream broke mid-way: {e}");
                    sh2.cluster().set_down(node);
                    sh2.changed.notify_waiters();
                    Some(error_event(&format!(
                        "node `{name}` failed during the stream: {e}"
                    )))
                }
            };
            std::future::ready(out)
        });
        let body = stream::once(std::future::ready(first))
            .chain(rest)
            .map(move |b| {
                // The lease lives as long as the stream: in flight until it ends or the
                // client leaves.
                let _ = &lease;
                Ok::<Bytes, Infallible>(b)
            });
        return with_headers(status, &headers, Body::from_stream(body));
    }
    match tries.last {
        Some((r, node)) => {
            sh.metrics.request(&model, &node, r.status().as_u16());
            r
        }
        None => unreachable!("the loop answers or leaves a last failure"),
    }
}

/// One request's tries so far.
#[derive(Default)]
struct Tries {
    /// Nodes that failed it (or answered 429): not tried again.
    tried: Vec<usize>,
    /// The node whose failure the next try retries, counted once that try is sent.
    retry_of: Option<String>,
    /// The answer to give if no node does better: the last failure, and its node.
    last: Option<(Response, String)>,
}

impl Tries {
    fn failed(&mut self, node: usize, name: String, answer: Response) {
        self.tried.push(node);
        self.retry_of = Some(name.clone());
        self.last = Some((answer, name));
    }
}

/// A node broke (connection error, timeout, cut-off answer): it is marked down until it
/// answers `/live` again, and the client would see a 502 if no other node serves.
fn broke(sh: &Shared, node: usize, name: &str, model: &str, why: String) -> Response {
    tracing::warn!(node = %name, model = %model, "request failed on the node: {why}");
    sh.cluster().set_down(node);
    sh.changed.notify_waiters();
    ApiError::bad_gateway(format!("node `{name}` {why}")).into_response()
}

/// A node's answer read whole (an error: small), as a response and as JSON.
async fn buffered(resp: reqwest::Response) -> (Response, Value) {
    let status = resp.status();
    let headers = resp.headers().clone();
    let b = resp.bytes().await.unwrap_or_default();
    let v = serde_json::from_slice(&b).unwrap_or(Value::Null);
    (with_headers(status, &headers, Body::from(b)), v)
}

/// The node's status and the headers that matter to a client, over `body`.
fn with_headers(status: StatusCode, from: &reqwest::header::HeaderMap, body: Body) -> Response {
    let mut r = (status, body).into_response();
    for h in [
        header::CONTENT_TYPE,
        header::RETRY_AFTER,
        header::CACHE_CONTROL,
    ] {
        if let Some(v) = from.get(&h) {
            if let Ok(v) = HeaderValue::from_bytes(v.as_bytes()) {
                r.headers_mut().insert(h, v);
            }
        }
    }
    r
}

/// An SSE event carrying an error in OpenAI's shape (how a broken stream ends).
fn error_event(message: &str) -> Bytes {
    let e = ApiError::bad_gateway(message);
    Bytes::from(format!("data: {}\n\n", e.body()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_reads_model_and_stream_and_names_what_is_wrong() {
        assert_eq!(
            peek(br#"{"model":"m","stream":true}"#).unwrap(),
            ("m".into(), true)
        );
        assert_eq!(peek(br#"{"model":"m"}"#).unwrap(), ("m".into(), false));
        assert_eq!(peek(b"{").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(peek(b"[]").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(
            peek(br#"{"x":1}"#).unwrap_err().param.as_deref(),
            Some("model")
        );
        assert_eq!(
            peek(br#"{"model":3}"#).unwrap_err().param.as_deref(),
            Some("model")
        );
    }

    #[test]
    fn a_broken_stream_ends_with_an_openai_error_event() {
        let e = error_event("boom");
        let s = std::str::from_utf8(&e).unwrap();
        let json: Value = serde_json::from_str(s.strip_prefix("data: ").unwrap().trim()).unwrap();
        assert_eq!(json["error"]["message"], "boom");
        assert!(s.ends_with("\n\n"));
    }
}
