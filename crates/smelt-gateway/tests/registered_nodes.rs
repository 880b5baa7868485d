//! Nodes that join by themselves (`smelt serve --gateway`) and then stay down are forgotten
//! after `forget_after_ms` (issue 22): they leave `/admin/nodes`, `/health` and `/metrics`,
//! and come back when they register again. A node of the config is never forgotten. The
//! nodes are tiny axum servers that answer like `smelt serve` and can be stopped.

use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use smelt_gateway::{Config, Gateway};
use tokio::sync::oneshot;

/// A node that answers until `stop` is sent.
async fn node() -> (String, oneshot::Sender<()>) {
    let app = Router::new()
        .route("/live", get(|| async { Json(json!({"status": "alive"})) }))
        .route(
            "/admin/models",
            get(|| async { Json(json!({"object": "list", "data": []})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .unwrap()
    });
    (url, tx)
}

async fn names(http: &reqwest::Client, gw: &str) -> Vec<(String, String)> {
    let v: Value = http
        .get(format!("{gw}/admin/nodes"))
        .bearer_auth("k-admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !check().await {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_nodes_that_stay_down_are_forgotten_until_they_return() {
    let (static_url, static_stop) = node().await;
    let text = format!(
        "[gateway]\nadmin_key = \"k-admin\"\nhealth_interval_ms = 25\nforget_after_ms = 300\n\n\
         [[node]]\nname = \"fixed\"\nurl = \"{static_url}\"\n"
    );
    let gw = Gateway::bind(Config::parse(&text).unwrap(), "127.0.0.1:0")
        .await
        .unwrap();
    let base = format!("http://{}", gw.local_addr().unwrap());
    tokio::spawn(async move { gw.run(std::future::pending()).await.unwrap() });
    let http = reqwest::Client::new();

    let (url, stop) = node().await;
    let register = |url: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/admin/nodes"))
                .bearer_auth("k-admin")
                .json(&json!({"name": "joined", "url": url}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    register(url).await;
    wait_for("both nodes up", async || {
        names(&http, &base)
            .await
            .iter()
            .filter(|(_, s)| s == "up")
            .count()
            == 2
    })
    .await;

    // Both go down; only the one that joined by itself is forgotten.
    stop.send(()).unwrap();
    static_stop.send(()).unwrap();
    wait_for("the joined node forgotten", async || {
        names(&http, &base).await == [("fixed".to_string(), "down".to_string())]
    })
    .await;
    let health: Value = http
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["nodes"], 1, "{health}");
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!metrics.contains("node=\"joined\""), "{metrics}");

    // It registers again (a restarted node): listed and polled again.
    let (url, _keep) = node().await;
    register(url).await;
    wait_for("the node back up", async || {
        names(&http, &base)
            .await
            .contains(&("joined".to_string(), "up".to_string()))
    })
    .await;
}
