//! Shared by the server tests: a real server on a free port with the real SmolLM2 model,
//! an HTTP client, and an SSE reader.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use smelt_engine::generate::{generate, GenerateParams};
use smelt_engine::{Engine, EngineOptions};
use smelt_server::{gguf_loader, Server, ServerConfig, ShutdownHandle};
use smelt_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The test model fetched by `scripts/fetch-models.sh`; a missing one fails the test.
pub fn model_path() -> PathBuf {
    let dir = std::env::var_os("SMELT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.models"));
    let p = dir.join(SMOLLM2);
    assert!(
        p.is_file(),
        "test model {} is missing: run scripts/fetch-models.sh all",
        p.display()
    );
    p
}

/// The id the server gives the test model (its file stem).
pub const MODEL_ID: &str = "SmolLM2-135M-Instruct.Q4_1";

pub fn engine_options(kv_tokens: usize) -> EngineOptions {
    EngineOptions {
        threads: Some(2),
        kv_tokens,
        ..EngineOptions::default()
    }
}

pub struct TestServer {
    pub base: String,
    pub stop: ShutdownHandle,
    pub done: tokio::task::JoinHandle<Result<(), smelt_server::ServerError>>,
    pub client: reqwest::Client,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request sent")
    }

    /// A POST that must succeed; its JSON body.
    pub async fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body).await;
        let status = r.status();
        let text = r.text().await.expect("body");
        assert_eq!(status, 200, "{path} {body}: {text}");
        serde_json::from_str(&text).expect("JSON body")
    }

    /// One gauge or counter of `/metrics` for the test model.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.expect("metrics");
        let prefix = format!("{name}{{model=\"{MODEL_ID}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
            .trim()
            .parse()
            .expect("a number")
    }

    /// Waits until `metric` reads `want` (gauges move at the scheduler's next step).
    pub async fn wait_metric(&self, name: &str, want: f64, within: Duration) {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.metric(name).await;
            if v == want {
                return;
            }
            assert!(
                t0.elapsed() < within,
                "{name} is {v}, not {want}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn shutdown(self) {
        self.stop.shutdown();
        tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("the server stops within its grace period")
            .expect("the server task did not panic")
            .expect("the server returns Ok");
    }
}

/// A server on 127.0.0.1 with a free port serving the test model.
pub async fn start(mut config: ServerConfig, kv_tokens: usize) -> TestServer {
    config.addr = "127.0.0.1:0".into();
    let loader = gguf_loader(engine_options(kv_tokens));
    let model = model_path().display().to_string();
    let server = Server::bind(config, loader, &[model])
        .await
        .expect("the server starts");
    let addr = server.local_addr().expect("bound");
    let stop = server.shutdown_handle();
    let done = tokio::spawn(server.run());
    TestServer {
        base: format!("http://{addr}"),
        stop,
        done,
        // A fresh connection per request: a server answering 413 before it has read the
        // whole body closes the connection, and a pooled client could send the next
        // request on it before seeing the close (hyper's IncompleteMessage, a flaky test).
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client"),
    }
}

pub async fn start_default() -> TestServer {
    start(ServerConfig::default(), 4096).await
}

/// Reads a whole SSE response: every `data:` payload, in order.
pub async fn sse(resp: reqwest::Response) -> Vec<String> {
    assert_eq!(resp.status(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let text = resp.text().await.expect("stream body");
    data_lines(&text)
}

pub fn data_lines(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .map(str::to_string)
        })
        .collect()
}

/// The JSON chunks of a stream, checking it ends with `[DONE]`.
pub fn chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect()
}

/// What `smelt run` generates for these prompt ids (it calls the same `generate`), greedy.
pub struct Reference {
    pub engine: Engine,
    pub tok: Tokenizer,
    pub template: ChatTemplate,
}

impl Reference {
    pub fn new() -> Reference {
        let engine = Engine::load(&model_path(), &engine_options(2048)).expect("model loads");
        let tok = Tokenizer::from_gguf(engine.gguf().metadata()).expect("tokenizer");
        let template = ChatTemplate::from_gguf(engine.gguf().metadata(), &tok).expect("template");
        Reference {
            engine,
            tok,
            template,
        }
    }

    /// `smelt run --chat`'s prompt ids for one user message.
    pub fn chat_ids(&self, user: &str) -> Vec<u32> {
        let text = self
            .template
            .render(&[ChatMessage::new("user", user)], true)
            .expect("render");
        let mut ids = self.tok.encode(&text, true, true);
        if let Some(bos) = self.tok.bos() {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        ids
    }

    /// `smelt run`'s prompt ids for raw text.
    pub fn raw_ids(&self, text: &str) -> Vec<u32> {
        self.tok.encode(text, true, false)
    }

    /// Greedy generation: (token ids, text, finish reason as the API names it).
    pub fn greedy(&mut self, ids: &[u32], max_tokens: usize) -> (Vec<u32>, String, &'static str) {
        let seq = self.engine.new_sequence();
        let params = GenerateParams {
            max_tokens,
            ..GenerateParams::default()
        };
        let g = generate(&mut self.engine, seq, &[], ids, &self.tok, &params, |_| {})
            .expect("generation");
        self.engine.free_sequence(seq);
        let finish = match g.finish_reason.as_str() {
            "length" => "length",
            _ => "stop",
        };
        (g.tokens, g.text, finish)
    }
}

pub fn shared<T>(v: T) -> Arc<T> {
    Arc::new(v)
}
