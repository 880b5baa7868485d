//! The gateway's failure handling against scripted nodes (tiny axum servers that answer
//! `/live` and `/admin/models` like `smelt serve` and fail on cue): 429 moves a request to
//! another node or passes through with its Retry-After, 5xx is retried elsewhere, a node's
//! 4xx passes through without counting against it, a stream that breaks after its first
//! byte ends with an error event, and a stream's events reach the client as the node sends
//! them (unbuffered). Real nodes are in tests/server/test_gateway_*.py; these
//! cover what real nodes cannot be made to do on cue, in well under a second.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use smelt_gateway::{Config, Gateway};

/// What a scripted node does with a completion request.
#[derive(Clone, Copy, Debug)]
enum Act {
    Answer,
    TooMany,
    Fail500,
    Reject400,
    /// 200, one SSE event, then the connection breaks.
    BreakStream,
    /// 200, then the connection breaks before any byte of the body.
    BreakBeforeFirst,
    /// 200, one SSE event, then the end of the stream only once the test releases it.
    HoldStream,
}

struct Mock {
    url: String,
    act: Arc<Mutex<Act>>,
    hits: Arc<Mutex<u32>>,
    /// Whether `/admin/models` loads succeed here.
    loads_ok: Arc<Mutex<bool>>,
    /// Lets a held stream ([`Act::HoldStream`]) finish.
    release: Arc<tokio::sync::Notify>,
    /// The models the node holds (changed behind the gateway's back as another gateway
    /// would), and the most it ever held at once.
    models: Arc<Mutex<Vec<String>>>,
    most: Arc<Mutex<usize>>,
}

async fn mock(name: &'static str, kv_free: u64) -> Mock {
    let act = Arc::new(Mutex::new(Act::Answer));
    let hits = Arc::new(Mutex::new(0));
    let (a, h) = (Arc::clone(&act), Arc::clone(&hits));
    let release = Arc::new(tokio::sync::Notify::new());
    let r = Arc::clone(&release);
    let loads_ok = Arc::new(Mutex::new(true));
    let models = Arc::new(Mutex::new(vec!["m".to_string()]));
    let most = Arc::new(Mutex::new(1));
    let (m1, m2, ok, most2) = (
        Arc::clone(&models),
        Arc::clone(&models),
        Arc::clone(&loads_ok),
        Arc::clone(&most),
    );
    let entry = move |id: &str| json!({"id": id, "bytes": 100, "kv_blocks_free": kv_free});
    let admin = move || async move {
        let data: Vec<Value> = m1.lock().unwrap().iter().map(|id| entry(id)).collect();
        Json(json!({"object": "list", "max_models_bytes": 1u64 << 30, "data": data}))
    };
    // Loads and unloads as `smelt serve` does them, `expect_loaded` included.
    let load = move |body: Json<Value>| async move {
        let id = body["id"].as_str().unwrap().to_string();
        let mut held = m2.lock().unwrap();
        if body["action"] == "unload" {
            let Some(at) = held.iter().position(|m| *m == id) else {
                let e = json!({"error": {"message": "no such model", "type": "x", "param": null, "code": "model_not_found"}});
                return (StatusCode::NOT_FOUND, Json(e)).into_response();
            };
            held.remove(at);
            return Json(json!({"unloaded": id})).into_response();
        }
        if !*ok.lock().unwrap() {
            let e = json!({"error": {"message": "no such file", "type": "x", "param": null, "code": null}});
            return (StatusCode::BAD_REQUEST, Json(e)).into_response();
        }
        if let Some(expect) = body["expect_loaded"].as_array() {
            if held.iter().any(|m| !expect.iter().any(|e| e == m.as_str())) {
                let e = json!({"error": {"message": "the server holds models this load did not expect", "type": "x", "param": "expect_loaded", "code": "models_changed"}});
                return (StatusCode::CONFLICT, Json(e)).into_response();
            }
        }
        held.push(id.clone());
        let mut most = most2.lock().unwrap();
        *most = (*most).max(held.len());
        Json(json!({"loaded": entry(&id)})).into_response()
    };
    let app = Router::new()
        .route("/live", get(|| async { Json(json!({"status": "alive"})) }))
        .route("/admin/models", get(admin).post(load))
        .route(
            "/v1/chat/completions",
            post(move |body: Bytes| {
                let (a, h, r) = (Arc::clone(&a), Arc::clone(&h), Arc::clone(&r));
                async move {
                    *h.lock().unwrap() += 1;
                    let req: Value = serde_json::from_slice(&body).unwrap();
                    assert!(
                        req["model"].is_string(),
                        "the body reaches the node unchanged"
                    );
                    let act = *a.lock().unwrap();
                    respond(act, name, r)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Mock {
        url,
        act,
        hits,
        loads_ok,
        release,
        models,
        most,
    }
}

fn respond(act: Act, name: &str, release: Arc<tokio::sync::Notify>) -> Response {
    let err = |status: StatusCode, msg: &str| {
        (
            status,
            Json(json!({"error": {"message": msg, "type": "x", "param": null, "code": null}})),
        )
            .into_response()
    };
    match act {
        Act::Answer => Json(json!({"object": "chat.completion", "node": name})).into_response(),
        Act::TooMany => {
            let mut r = err(StatusCode::TOO_MANY_REQUESTS, "queue full");
            r.headers_mut()
                .insert(header::RETRY_AFTER, "7".parse().unwrap());
            r
        }
        Act::Fail500 => err(StatusCode::INTERNAL_SERVER_ERROR, "boom"),
        Act::Reject400 => err(StatusCode::BAD_REQUEST, "bad request from the node"),
        Act::BreakBeforeFirst => {
            let chunks = futures_util::stream::iter([Err::<Bytes, _>(std::io::Error::other(
                "the node died",
            ))]);
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(chunks),
            )
                .into_response()
        }
        Act::HoldStream => {
            let chunks = futures_util::stream::unfold(0, move |k| {
                let release = Arc::clone(&release);
                async move {
                    match k {
                        0 => Some((
                            Ok::<_, std::io::Error>(Bytes::from_static(b"data: {\"n\":1}\n\n")),
                            1,
                        )),
                        1 => {
                            release.notified().await;
                            Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), 2))
                        }
                        _ => None,
                    }
                }
            });
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(chunks),
            )
                .into_response()
        }
        Act::BreakStream => {
            // The event reaches the gateway (and its client) before the node dies.
            let chunks = futures_util::stream::unfold(0, |k| async move {
                match k {
                    0 => Some((Ok(Bytes::from_static(b"data: {\"n\":1}\n\n")), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Some((Err(std::io::Error::other("the node died")), 2))
                    }
                    _ => None,
                }
            });
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(chunks),
            )
                .into_response()
        }
    }
}

/// A gateway over nodes `a` (more free KV: first choice) and `b`, both with model `m`.
async fn setup() -> (String, Mock, Mock) {
    let (a, b) = (mock("a", 10).await, mock("b", 5).await);
    let config = Config::parse(&format!(
        "[gateway]\nadmin_key = \"adm\"\nhealth_interval_ms = 50\n\
         [[node]]\nname = \"a\"\nurl = \"{}\"\n[[node]]\nname = \"b\"\nurl = \"{}\"\n\
         [[model]]\nname = \"m\"\nsource = \"m.gguf\"\n\
         [[model]]\nname = \"x\"\nsource = \"x.gguf\"\n",
        a.url, b.url
    ))
    .unwrap();
    let gw = Gateway::bind(config, "127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", gw.local_addr().unwrap());
    tokio::spawn(gw.run(std::future::pending()));
    let http = reqwest::Client::new();
    for _ in 0..100 {
        let v: Value = http
            .get(format!("{url}/v1/models/m"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["loaded_on"].as_array().is_some_and(|l| l.len() == 2) {
            return (url, a, b);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the gateway never saw both nodes up");
}

async fn chat(url: &str, stream: bool) -> reqwest::Response {
    chat_with(url, "m", stream).await
}

async fn chat_with(url: &str, model: &str, stream: bool) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": model, "messages": [], "stream": stream}))
        .send()
        .await
        .unwrap()
}

fn set(m: &Mock, act: Act) {
    *m.act.lock().unwrap() = act;
}

fn hits(m: &Mock) -> u32 {
    *m.hits.lock().unwrap()
}

#[tokio::test]
async fn a_429_moves_to_the_other_node_else_passes_through_with_retry_after() {
    let (url, a, b) = setup().await;
    set(&a, Act::TooMany);
    let r = chat(&url, false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["node"], "b");
    assert_eq!((hits(&a), hits(&b)), (1, 1));
    set(&b, Act::TooMany);
    let r = chat(&url, false).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()[header::RETRY_AFTER.as_str()], "7");
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["message"],
        "queue full"
    );
}

#[tokio::test]
async fn a_5xx_is_retried_on_another_node_and_the_last_one_is_answered() {
    let (url, a, b) = setup().await;
    set(&a, Act::Fail500);
    let r = chat(&url, false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["node"], "b");
    set(&b, Act::Fail500);
    let r = chat(&url, false).await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["message"], "boom");
    let m = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("smelt_gateway_retries_total{model=\"m\",node=\"a\"} 2"),
        "{m}"
    );
}

#[tokio::test]
async fn a_nodes_4xx_passes_through_and_never_counts_against_it() {
    let (url, a, b) = setup().await;
    set(&a, Act::Reject400);
    for _ in 0..3 {
        let r = chat(&url, false).await;
        assert_eq!(r.status(), 400);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["message"],
            "bad request from the node"
        );
    }
    assert_eq!((hits(&a), hits(&b)), (3, 0), "no retry of a client's error");
    set(&a, Act::Answer);
    let r = chat(&url, false).await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["node"],
        "a",
        "a is still up"
    );
}

#[tokio::test]
async fn a_stream_that_breaks_after_its_first_byte_ends_with_an_error_event() {
    let (url, a, b) = setup().await;
    set(&a, Act::BreakStream);
    let r = chat(&url, true).await;
    assert_eq!(r.status(), 200);
    let text = String::from_utf8(r.bytes().await.unwrap().to_vec()).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text:?}");
    assert_eq!(
        events[0], "data: {\"n\":1}",
        "the node's bytes pass unchanged"
    );
    let err: Value = serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("node `a`"),
        "{err}"
    );
    assert_eq!(
        hits(&b),
        0,
        "a stream that reached the client is not retried"
    );
}

#[tokio::test]
async fn a_stream_reaches_the_client_before_the_node_finishes_it() {
    let (url, a, _b) = setup().await;
    set(&a, Act::HoldStream);
    let mut r = chat(&url, true).await;
    assert_eq!(r.status(), 200);
    // The node sent one event and holds the rest until the client has it: a gateway that
    // buffered the stream would hold that event back until this times out.
    let mut first = Vec::new();
    while !first.ends_with(b"\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .expect("the node's first event did not reach the client while the node held the rest")
            .unwrap()
            .expect("the stream ended early");
        first.extend_from_slice(&chunk);
    }
    assert_eq!(first, b"data: {\"n\":1}\n\n");
    a.release.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"data: [DONE]\n\n");
}

#[tokio::test]
async fn a_stream_that_breaks_before_its_first_byte_is_retried_elsewhere() {
    let (url, a, b) = setup().await;
    set(&a, Act::BreakBeforeFirst);
    let r = chat(&url, true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["node"], "b");
    assert_eq!((hits(&a), hits(&b)), (1, 1));
}

#[tokio::test]
async fn a_failed_load_moves_to_another_node_and_says_why_when_none_is_left() {
    let (url, a, b) = setup().await;
    // x is loaded nowhere: a (first in order) fails to load it, b loads it.
    *a.loads_ok.lock().unwrap() = false;
    let r = chat_with(&url, "x", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["node"], "b");
    let v: Value = reqwest::get(format!("{url}/v1/models/x"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["loaded_on"], json!(["b"]));
    // Another model nobody can load: 503 with the node's reason.
    *b.loads_ok.lock().unwrap() = false;
    let (url2, c, d) = setup().await;
    *c.loads_ok.lock().unwrap() = false;
    *d.loads_ok.lock().unwrap() = false;
    let r = chat_with(&url2, "x", false).await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.unwrap();
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("loading `x`") && msg.contains("no such file"),
        "{msg}"
    );
}

/// A model loaded on a node behind this gateway's back (by another gateway, between two
/// polls) takes the room this gateway planned a load into: the node refuses the load
/// (`expect_loaded`), the gateway reads the node again and makes room, and the node never
/// holds more than its room.
#[tokio::test]
async fn a_load_into_room_another_gateway_took_is_refused_and_planned_again() {
    let a = mock("a", 10).await;
    // Room for one model; polls far apart, so only the first one is seen before the request.
    let config = Config::parse(&format!(
        "[gateway]\nadmin_key = \"adm\"\nhealth_interval_ms = 600000\n\
         [[node]]\nname = \"a\"\nurl = \"{}\"\nmemory_mb = 1\n\
         [[model]]\nname = \"m\"\nsource = \"m.gguf\"\nmemory_mb = 1\n\
         [[model]]\nname = \"x\"\nsource = \"x.gguf\"\nmemory_mb = 1\n\
         [[model]]\nname = \"y\"\nsource = \"y.gguf\"\nmemory_mb = 1\n",
        a.url
    ))
    .unwrap();
    let gw = Gateway::bind(config, "127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", gw.local_addr().unwrap());
    tokio::spawn(gw.run(std::future::pending()));
    let models_of = || async {
        let v: Value = reqwest::get(format!("{url}/v1/models/m"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v
    };
    for _ in 0..100 {
        if models_of().await["loaded_on"] == json!(["a"]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(models_of().await["loaded_on"], json!(["a"]));
    // Another gateway swaps m for y; this one still sees m.
    *a.models.lock().unwrap() = vec!["y".into()];
    let r = chat_with(&url, "x", false).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(*a.models.lock().unwrap(), vec!["x".to_string()]);
    assert_eq!(
        *a.most.lock().unwrap(),
        1,
        "the node held more than its room"
    );
}
