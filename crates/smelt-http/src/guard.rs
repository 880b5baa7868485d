//! What a request must pass before any handler sees it, so a web page the user happens to
//! visit cannot drive a local server or gateway: its `Host` must be one the server answers to
//! (DNS rebinding), a browser's cross-origin request is refused unless `--cors` allows its
//! origin, a POST body must be `application/json` (a page can send `text/plain` without
//! asking first), and the whole body must arrive within the body timeout. Bearer keys are
//! read and compared here too.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::error::ApiError;

/// What [`guard`] lets through.
#[derive(Debug, Clone)]
pub struct Edge {
    pub hosts: HostPolicy,
    /// Origins whose cross-origin browser requests are allowed (CORS; `*`: any).
    pub cors: Vec<String>,
    /// A request's whole body must arrive within this long of its headers.
    pub body_timeout: Duration,
    /// Largest request body, in bytes.
    pub body_limit: usize,
}

/// Which `Host` values the server answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPolicy {
    Any,
    /// Host names (lower case, no port).
    Only(Vec<String>),
}

impl HostPolicy {
    /// Loopback-bound servers answer to the localhost names and `extra`; others to anything
    /// unless `extra` names hosts. `*` in `extra` allows any host.
    pub fn new(bound_to_loopback: bool, extra: &[String]) -> HostPolicy {
        if extra.iter().any(|h| h.trim() == "*") || (!bound_to_loopback && extra.is_empty()) {
            return HostPolicy::Any;
        }
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.extend(
            extra
                .iter()
                .map(|h| host_name(h.trim()).to_ascii_lowercase()),
        );
        HostPolicy::Only(names)
    }

    pub fn allows(&self, host: &str) -> bool {
        match self {
            HostPolicy::Any => true,
            HostPolicy::Only(names) => {
                let name = host_name(host).to_ascii_lowercase();
                names.contains(&name)
            }
        }
    }
}

/// The name part of a `Host` value: `[::1]:8080` -> `::1`, `example.com:80` -> `example.com`.
pub fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// `scheme://host[:port]` of an `Origin` header, the host:port part.
fn origin_authority(origin: &str) -> Option<&str> {
    origin.split_once("://").map(|(_, rest)| rest)
}

/// 403 in the error shape with `code`.
pub fn forbidden(code: &'static str, message: String) -> Response {
    let mut e = ApiError::bad_request(message);
    e.status = StatusCode::FORBIDDEN;
    e.kind = "permission_error";
    e.code = Some(code);
    e.into_response()
}

/// Host, Origin (with CORS when allowed), content type and the body deadline, in that order.
pub async fn guard(State(st): State<Arc<Edge>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().unwrap_or("");
        if !st.hosts.allows(host) {
            return forbidden(
                "host_not_allowed",
                format!(
                    "this server does not answer to host `{}`: start it with --allow-host NAME",
                    clip(host_name(host), 64)
                ),
            );
        }
    }
    let origin = headers
        .get(header::ORIGIN)
        .map(|o| o.to_str().unwrap_or("").to_string());
    let mut allow_origin = None;
    if let Some(origin) = &origin {
        let listed = st
            .cors
            .iter()
            .any(|c| c == "*" || c.trim_end_matches('/').eq_ignore_ascii_case(origin));
        if listed {
            allow_origin = Some(origin.clone());
        } else {
            let same = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .zip(origin_authority(origin))
                .is_some_and(|(h, o)| h.eq_ignore_ascii_case(o));
            if !same {
                return forbidden(
                    "origin_not_allowed",
                    format!(
                        "cross-origin requests from `{}` are refused: start the server with \
                         --cors ORIGIN to allow them",
                        clip(origin, 100)
                    ),
                );
            }
        }
    }
    if let (Some(o), true) = (&allow_origin, req.method() == Method::OPTIONS) {
        return preflight(o);
    }
    let mut resp = checked_body(&st, req, next).await;
    if let Some(o) = allow_origin {
        add_cors(resp.headers_mut(), &o);
    }
    resp
}

/// Content type and body deadline, for requests that carry a body.
async fn checked_body(st: &Edge, req: Request, next: Next) -> Response {
    if !matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH) {
        return next.run(req).await;
    }
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_json(ct) {
        let mut e = ApiError::bad_request(format!(
            "the body must be JSON sent with `Content-Type: application/json` (got {})",
            if ct.is_empty() {
                "no content type".to_string()
            } else {
                format!("`{}`", clip(ct, 64))
            }
        ));
        e.status = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        e.code = Some("unsupported_media_type");
        return e.into_response();
    }
    let too_big = || {
        let mut e = ApiError::bad_request(format!(
            "the request body is larger than {} MiB",
            st.body_limit >> 20
        ));
        e.status = StatusCode::PAYLOAD_TOO_LARGE;
        e.into_response()
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > st.body_limit as u64) {
        // A client still sending its body when the connection closes sees a broken pipe,
        // not the 413 (reqwest and Python's requests both do): read and drop a body of up
        // to DRAIN_LIMITS limits first, within the body deadline. Larger ones are refused
        // at once.
        if n <= (st.body_limit as u64).saturating_mul(DRAIN_LIMITS) {
            let mut body = req.into_body();
            let _ = tokio::time::timeout(st.body_timeout, async {
                while let Some(Ok(_)) = body.frame().await {}
            })
            .await;
        }
        return close(too_big());
    }
    let (parts, body) = req.into_parts();
    let read =
        tokio::time::timeout(st.body_timeout, axum::body::to_bytes(body, st.body_limit)).await;
    let bytes = match read {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                return close(too_big());
            }
            return close(
                ApiError::bad_request(format!("cannot read the request body: {e}")).into_response(),
            );
        }
        Err(_) => {
            let mut e = ApiError::bad_request(format!(
                "the request body did not arrive within {} s",
                st.body_timeout.as_secs_f64()
            ));
            e.status = StatusCode::REQUEST_TIMEOUT;
            e.code = Some("body_timeout");
            return close(e.into_response());
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Bodies declared at up to this many times the limit are read (and dropped) before their
/// 413, so the client gets the answer ([`checked_body`]).
const DRAIN_LIMITS: u64 = 8;

/// The connection is not reused after a body that was not read to its end.
fn close(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// `application/json`, with parameters (`; charset=utf-8`), or a `+json` type.
fn is_json(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn preflight(origin: &str) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    add_cors(h, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    r
}

fn add_cors(h: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

pub use smelt_openai::clip;

/// The key of `Authorization: Bearer <key>`, the scheme in any case.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, key) = v.split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then_some(key.trim())
}

/// Compares without stopping at the first difference, so timing does not leak the key.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The request carries `key` (false when there is none).
pub fn holds(headers: &HeaderMap, key: &Option<String>) -> bool {
    match (bearer(headers), key) {
        (Some(given), Some(k)) => same(given.as_bytes(), k.as_bytes()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("::1"), "::1");
        assert_eq!(host_name("example.com"), "example.com");
    }

    #[test]
    fn loopback_servers_answer_to_localhost_names_only() {
        let p = HostPolicy::new(true, &[]);
        for ok in ["localhost:1", "127.0.0.1:8080", "[::1]:80", "LOCALHOST"] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in ["evil.example:8080", "127.0.0.2", "localhost.evil.example"] {
            assert!(!p.allows(bad), "{bad}");
        }
        assert!(HostPolicy::new(true, &["box.lan".into()]).allows("box.lan:8080"));
        assert_eq!(HostPolicy::new(false, &[]), HostPolicy::Any);
        assert_eq!(HostPolicy::new(true, &["*".into()]), HostPolicy::Any);
    }

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }

    #[test]
    fn bearer_scheme_in_any_case() {
        let mut h = HeaderMap::new();
        for v in ["Bearer k1", "bearer k1", "BEARER   k1 "] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            assert_eq!(bearer(&h), Some("k1"), "{v}");
        }
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic k1"));
        assert_eq!(bearer(&h), None);
    }
}
