//! Models loaded and unloaded at run time, and graceful shutdown: in-flight requests finish
//! within the grace period, the rest are ended, and the server returns Ok.

mod common;

use std::time::{Duration, Instant};

use common::{chunks, data_lines, model_path, start, start_default, MODEL_ID};
use serde_json::{json, Value};
use smelt_server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_loads_and_unloads_models() {
    let s = start_default().await;
    let list: Value = s.get("/admin/models").await.json().await.unwrap();
    assert_eq!(list["data"][0]["id"], MODEL_ID);
    assert_eq!(
        list["data"][0]["path"],
        model_path().display().to_string().as_str()
    );
    assert_eq!(list["data"][0]["chat_template"], true);

    let path = model_path().display().to_string();
    let v = s
        .ok("/admin/models", &json!({"model": path, "id": "second"}))
        .await;
    assert_eq!(v["loaded"]["id"], "second");
    let models: Value = s.get("/v1/models").await.json().await.unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![MODEL_ID, "second"]);

    // Both answer, the same way (same weights, greedy).
    let ask = |model: &str| json!({"model": model, "prompt": "The sun is", "max_tokens": 6, "temperature": 0});
    let a = s.ok("/v1/completions", &ask(MODEL_ID)).await;
    let b = s.ok("/v1/completions", &ask("second")).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(b["model"], "second");
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("smelt_generated_tokens_total{model=\"second\"} 6"));

    // A taken id, a missing file, a bad action.
    let r = s
        .post("/admin/models", &json!({"model": path, "id": "second"}))
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_exists");
    let r = s
        .post("/admin/models", &json!({"model": "/no/such/model.gguf"}))
        .await;
    assert_eq!(
        r.status(),
        403,
        "outside the start-up models and --models-dir"
    );
    let r = s
        .post("/admin/models", &json!({"action": "explode", "id": "x"}))
        .await;
    assert_eq!(r.status(), 400);

    let v = s
        .ok(
            "/admin/models",
            &json!({"action": "unload", "id": "second"}),
        )
        .await;
    assert_eq!(v["unloaded"], "second");
    let r = s.post("/v1/completions", &ask("second")).await;
    assert_eq!(r.status(), 404);
    let r = s.post("/admin/models", &json!({"id": "second"})).await;
    assert_eq!(r.status(), 404);
    let list: Value = s.get("/admin/models").await.json().await.unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    s.ok("/v1/completions", &ask(MODEL_ID)).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let s = start_default().await;
    let mut r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Tell me a story."}],
                    "max_tokens": 40, "temperature": 0, "stream": true}),
        )
        .await;
    let mut text = String::from_utf8(r.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    s.stop.shutdown();
    while let Some(c) = r.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&c).unwrap());
    }
    let cs = chunks(&data_lines(&text));
    assert_eq!(
        cs.last().unwrap()["choices"][0]["finish_reason"],
        "length",
        "the in-flight stream ran to its end"
    );
    let base = s.base.clone();
    tokio::time::timeout(Duration::from_secs(10), s.done)
        .await
        .expect("stopped once the stream finished")
        .unwrap()
        .expect("Ok");
    // Nothing listens any more.
    let after = reqwest::Client::new()
        .get(format!("{base}/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(after.is_err(), "still answering after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_still_running_after_the_grace_period_are_ended() {
    let s = start(
        ServerConfig {
            grace: Duration::from_millis(300),
            ..ServerConfig::default()
        },
        4096,
    )
    .await;
    let mut r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0,
                    "stream": true}),
        )
        .await;
    let mut text = String::from_utf8(r.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    let t0 = Instant::now();
    s.stop.shutdown();
    while let Some(c) = r.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&c).unwrap());
    }
    let data = data_lines(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{err}"
    );
    tokio::time::timeout(Duration::from_secs(10), s.done)
        .await
        .expect("stopped")
        .unwrap()
        .expect("Ok");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_with_one_id_are_refused_at_start() {
    let model = model_path().display().to_string();
    let loader = smelt_server::gguf_loader(common::engine_options(256));
    let config = ServerConfig {
        addr: "127.0.0.1:0".into(),
        ..ServerConfig::default()
    };
    let err = match smelt_server::Server::bind(config, loader, &[model.clone(), model]).await {
        Ok(_) => panic!("the same id twice was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("already loaded"), "{err}");
    // A file that is not there is named in the error.
    let loader = smelt_server::gguf_loader(common::engine_options(256));
    let config = ServerConfig {
        addr: "127.0.0.1:0".into(),
        ..ServerConfig::default()
    };
    let err = match smelt_server::Server::bind(config, loader, &["/no/such.gguf".into()]).await {
        Ok(_) => panic!("a missing file loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("/no/such.gguf"), "{err}");
}
