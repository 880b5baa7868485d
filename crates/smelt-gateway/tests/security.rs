//! A gateway that is safe to expose (issues 17 and 22), tried from the outside as an
//! attacker would, as `smelt serve` is in crates/smelt-server/tests/security.rs: half-open
//! and slow clients, foreign hosts and origins, non-JSON bodies, the clients', admin and
//! metrics keys, and node admin keys that must never reach a client. One scripted node (a
//! tiny axum server) stands behind it; these run in about a second.

use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use smelt_gateway::{Config, Gateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NODE_KEY: &str = "k-node-secret-7f3a";

/// A node that answers like `smelt serve` with one model `m` loaded.
async fn node() -> String {
    let app = Router::new()
        .route("/live", get(|| async { Json(json!({"status": "alive"})) }))
        .route(
            "/admin/models",
            get(|| async {
                Json(json!({"object": "list", "max_models_bytes": 1u64 << 30,
                    "data": [{"id": "m", "bytes": 100, "kv_blocks_free": 10}]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            post(|| async { Json(json!({"object": "chat.completion", "choices": []})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

struct Gw {
    addr: String,
    http: reqwest::Client,
}

impl Gw {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .request(method.parse().unwrap(), self.url(path))
            .body(body.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("request sent")
    }
}

/// A gateway over one scripted node, with `extra` lines in its `[gateway]` section.
async fn gateway(extra: &str) -> Gw {
    let node = node().await;
    let text = format!(
        "[gateway]\nhealth_interval_ms = 50\n{extra}\n\n[[node]]\nname = \"a\"\nurl = \
         \"{node}\"\nadmin_key = \"{NODE_KEY}\"\n\n[[model]]\nname = \"m\"\nsource = \"m\"\n"
    );
    let config = Config::parse(&text).expect("config parses");
    let gw = Gateway::bind(config, "127.0.0.1:0").await.expect("binds");
    let addr = gw.local_addr().unwrap().to_string();
    tokio::spawn(async move { gw.run(std::future::pending()).await.unwrap() });
    let http = reqwest::Client::new();
    let g = Gw { addr, http };
    // Until the node is up (its model loaded there).
    for _ in 0..100 {
        let v: Value = g
            .http
            .get(g.url("/health"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["nodes_up"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g
}

async fn half_open(g: &Gw, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = TcpStream::connect(&g.addr).await.expect("connect");
        c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: loc")
            .await
            .unwrap();
        held.push(c);
    }
    held
}

async fn answers_fast(g: &Gw) {
    let t0 = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(1), g.send("GET", "/v1/models", &[], ""))
        .await
        .expect("answered within 1 s");
    assert_eq!(r.status(), 200);
    assert!(t0.elapsed() < Duration::from_secs(1));
}

async fn closed_within(c: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(limit, c.read_to_end(&mut got))
        .await
        .expect("the gateway closed the connection in time")
        .ok();
    got
}

async fn error_code(r: reqwest::Response) -> String {
    let v: Value = r.json().await.expect("JSON error");
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_and_slow_clients_do_not_hold_the_gateway() {
    smelt_http::conn::raise_fd_limit();
    let g = gateway("").await;
    let held = half_open(&g, 2000).await;
    answers_fast(&g).await;
    drop(held);

    let g = gateway("header_timeout_ms = 300\nbody_timeout_ms = 300\nmax_connections = 50").await;
    // Past the connection limit, the oldest idle connections are closed.
    let mut held = half_open(&g, 200).await;
    answers_fast(&g).await;
    assert!(closed_within(&mut held[0], Duration::from_secs(2))
        .await
        .is_empty());
    drop(held);
    // Half a header: closed after the header timeout.
    let mut c = half_open(&g, 1).await.remove(0);
    let t0 = Instant::now();
    closed_within(&mut c, Duration::from_secs(3)).await;
    assert!(t0.elapsed() >= Duration::from_millis(250));
    // A body that never arrives: 408.
    let mut c = TcpStream::connect(&g.addr).await.unwrap();
    c.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: \
          application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let got = closed_within(&mut c, Duration::from_secs(3)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_origins_and_content_types() {
    let g = gateway("").await;
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}"#;
    let json = ("content-type", "application/json");
    let r = g
        .send("GET", "/v1/models", &[("host", "evil.example:8000")], "")
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(error_code(r).await, "host_not_allowed");
    let page = ("origin", "http://evil.example");
    let r = g
        .send(
            "POST",
            "/v1/chat/completions",
            &[page, ("content-type", "text/plain")],
            body,
        )
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(error_code(r).await, "origin_not_allowed");
    let r = g
        .send(
            "POST",
            "/v1/chat/completions",
            &[("content-type", "text/plain")],
            body,
        )
        .await;
    assert_eq!(r.status(), 415);
    let r = g.send("POST", "/v1/chat/completions", &[json], body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let g = gateway("cors = [\"https://app.example\"]\nallow_hosts = [\"gw.lan\"]").await;
    let app = ("origin", "https://app.example");
    let r = g
        .send(
            "OPTIONS",
            "/v1/chat/completions",
            &[app, ("access-control-request-method", "POST")],
            "",
        )
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let r = g
        .send("POST", "/v1/chat/completions", &[app, json], body)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let r = g
        .send(
            "POST",
            "/v1/chat/completions",
            &[("origin", "https://other.example"), json],
            body,
        )
        .await;
    assert_eq!(r.status(), 403);
    let r = g
        .send("GET", "/v1/models", &[("host", "gw.lan:8000")], "")
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_separate_and_node_keys_never_reach_clients() {
    let g =
        gateway("api_keys = [\"k-user\"]\nadmin_key = \"k-admin\"\nmetrics_key = \"k-metrics\"")
            .await;
    let user = ("authorization", "Bearer k-user");
    let admin = ("authorization", "Bearer k-admin");
    let metrics = ("authorization", "Bearer k-metrics");
    let node_header = format!("Bearer {NODE_KEY}");
    let nodek = ("authorization", node_header.as_str());
    assert_eq!(g.send("GET", "/v1/models", &[], "").await.status(), 401);
    assert_eq!(g.send("GET", "/v1/models", &[user], "").await.status(), 200);
    assert_eq!(
        g.send(
            "GET",
            "/v1/models",
            &[("authorization", "bearer k-user")],
            ""
        )
        .await
        .status(),
        200
    );
    // The clients' key is not the admin key, nor is a node's.
    for k in [user, nodek, metrics] {
        let r = g.send("GET", "/admin/nodes", &[k], "").await;
        assert_eq!(r.status(), 401, "{k:?}");
    }
    assert_eq!(
        g.send("GET", "/v1/models", &[nodek], "").await.status(),
        401
    );
    assert_eq!(g.send("GET", "/metrics", &[], "").await.status(), 401);
    assert_eq!(g.send("GET", "/metrics", &[user], "").await.status(), 401);
    assert_eq!(
        g.send("GET", "/metrics", &[metrics], "").await.status(),
        200
    );
    assert_eq!(g.send("GET", "/metrics", &[admin], "").await.status(), 200);
    // Everything a client or an admin can read says nothing of the node's key.
    for (path, k) in [
        ("/admin/nodes", admin),
        ("/admin/models", admin),
        ("/v1/models", user),
        ("/metrics", metrics),
        ("/health", user),
    ] {
        let r = g.send("GET", path, &[k], "").await;
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        assert!(
            !text.contains(NODE_KEY),
            "{path} shows the node's key: {text}"
        );
    }
    let r = g
        .send(
            "POST",
            "/admin/models",
            &[admin, ("content-type", "application/json")],
            r#"{"action": "bogus"}"#,
        )
        .await;
    assert!(!r.text().await.unwrap().contains(NODE_KEY));

    // No admin key in the config: admin is disabled, whatever key is sent.
    let g = gateway("").await;
    let r = g.send("GET", "/admin/nodes", &[admin], "").await;
    assert_eq!(r.status(), 403);
    assert_eq!(g.send("GET", "/metrics", &[], "").await.status(), 200);
}
