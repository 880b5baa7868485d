//! The OpenAI endpoints against a real server with the real SmolLM2 model: answers, streams,
//! usage, logprobs, greedy equality with `smelt run`'s generation, and every error status.

mod common;

use common::{chunks, sse, start, start_default, Reference, MODEL_ID};
use serde_json::{json, Value};
use smelt_server::ServerConfig;

/// Adds an answer's usage to (prompt, completion) totals.
fn tally(sums: &mut (u64, u64), v: &Value) {
    sums.0 += v["usage"]["prompt_tokens"].as_u64().unwrap();
    sums.1 += v["usage"]["completion_tokens"].as_u64().unwrap();
}

fn assert_error_shape(v: &Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].as_str().is_some(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_endpoints_answer() {
    let s = start_default().await;
    let h: Value = s.get("/health").await.json().await.unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["models"], json!([MODEL_ID]));

    let m: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL_ID);
    assert_eq!(m["data"][0]["object"], "model");
    let one = s.get(&format!("/v1/models/{MODEL_ID}")).await;
    assert_eq!(one.status(), 200);

    let spec: Value = s.get("/openapi.json").await.json().await.unwrap();
    assert_eq!(spec["openapi"], "3.1.0");
    assert!(spec["paths"]["/v1/chat/completions"]["post"].is_object());

    let page = s.get("/").await;
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("<html"));
    for (path, ct) in [("/app.js", "text/javascript"), ("/style.css", "text/css")] {
        let r = s.get(path).await;
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with(ct));
    }

    let metrics = s.get("/metrics").await;
    assert!(metrics.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = metrics.text().await.unwrap();
    for family in [
        "smelt_requests_total{status=\"200\"}",
        "smelt_prompt_tokens_total",
        "smelt_generated_tokens_total",
        "smelt_time_to_first_token_seconds_bucket",
        "smelt_inter_token_latency_seconds_bucket",
        "smelt_queue_depth",
        "smelt_running_sequences",
        "smelt_kv_blocks_used",
        "smelt_kv_blocks_free",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_chat_and_completion_equal_smelt_run_with_usage() {
    let s = start_default().await;
    let mut r = Reference::new();
    let mut sums = (0, 0);

    let q = "What is the capital of France?";
    let ids = r.chat_ids(q);
    let (want_ids, want_text, want_finish) = r.greedy(&ids, 16);
    let v = s
        .ok(
            "/v1/chat/completions",
            &json!({"model": MODEL_ID, "messages": [{"role": "user", "content": q}],
                    "max_tokens": 16, "temperature": 0, "logprobs": true}),
        )
        .await;
    tally(&mut sums, &v);
    assert_eq!(v["object"], "chat.completion");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    assert_eq!(c["message"]["content"], want_text.as_str());
    assert_eq!(c["finish_reason"], want_finish);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], want_ids.len());
    assert_eq!(v["usage"]["total_tokens"], ids.len() + want_ids.len());
    // Token for token: the logprobs carry each generated token's bytes.
    let got: Vec<Vec<u8>> = c["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| serde_json::from_value(t["bytes"].clone()).unwrap())
        .collect();
    let want: Vec<Vec<u8>> = want_ids.iter().map(|&t| r.tok.token_bytes(t)).collect();
    assert_eq!(got, want);

    let p = "The three primary colors are";
    let ids = r.raw_ids(p);
    let (want_ids, want_text, want_finish) = r.greedy(&ids, 12);
    let v = s
        .ok(
            "/v1/completions",
            &json!({"model": MODEL_ID, "prompt": p, "max_tokens": 12, "temperature": 0}),
        )
        .await;
    tally(&mut sums, &v);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want_text.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], want_finish);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], want_ids.len());

    // A prompt longer than one step's token budget is prefilled in chunks (256 tokens here,
    // 512 in `smelt run`) and still gives the same tokens.
    let long = "The history of the city is long and full of surprises. ".repeat(40);
    let ids = r.raw_ids(&long);
    assert!(ids.len() > 300, "{} tokens", ids.len());
    let (want_ids, want_text, _) = r.greedy(&ids, 8);
    let v = s
        .ok(
            "/v1/completions",
            &json!({"prompt": long, "max_tokens": 8, "temperature": 0}),
        )
        .await;
    tally(&mut sums, &v);
    assert_eq!(v["choices"][0]["text"], want_text.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], want_ids.len());

    // max_completion_tokens wins over max_tokens; the array form of content is read.
    let v = s
        .ok(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": q}]}],
                    "max_tokens": 50, "max_completion_tokens": 3, "temperature": 0}),
        )
        .await;
    tally(&mut sums, &v);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // The token counters add up to the answers' usage, and every answer timed its first token.
    assert_eq!(s.metric("smelt_prompt_tokens_total").await, sums.0 as f64);
    assert_eq!(
        s.metric("smelt_generated_tokens_total").await,
        sums.1 as f64
    );
    let text = s.get("/metrics").await.text().await.unwrap();
    let ttft = format!("smelt_time_to_first_token_seconds_count{{model=\"{MODEL_ID}\"}} 4");
    assert!(text.contains(&ttft), "{text}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_match_the_non_streamed_answers() {
    let s = start_default().await;
    let body = json!({"messages": [{"role": "system", "content": "You are terse."},
                                   {"role": "user", "content": "Name a fruit."}],
                      "max_tokens": 10, "temperature": 0});
    let whole = s.ok("/v1/chat/completions", &body).await;

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let data = sse(s.post("/v1/chat/completions", &sbody).await).await;
    let cs = chunks(&data);
    assert_eq!(cs[0]["object"], "chat.completion.chunk");
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let finish: Vec<&Value> = cs
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&whole["choices"][0]["finish_reason"]]);
    // The usage chunk comes last, with no choices; earlier chunks carry usage: null.
    let last = cs.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], whole["usage"]);
    assert!(cs[0]["usage"].is_null());

    let cbody = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0});
    let whole = s.ok("/v1/completions", &cbody).await;
    let mut sbody = cbody.clone();
    sbody["stream"] = json!(true);
    let data = sse(s.post("/v1/completions", &sbody).await).await;
    let cs = chunks(&data);
    let text: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert!(
        cs.iter().all(|c| c.get("usage").is_none()),
        "no usage unless asked"
    );
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "length");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_seeds_and_logprobs() {
    let s = start_default().await;
    let base = json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 20, "temperature": 0});
    let free = s.ok("/v1/completions", &base).await;
    let free_text = free["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(
        free_text.contains('8'),
        "the model counts on: {free_text:?}"
    );
    let mut stopped = base.clone();
    stopped["stop"] = json!(["8", "never"]);
    let v = s.ok("/v1/completions", &stopped).await;
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, &free_text[..free_text.find('8').unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Sampling with a seed is reproducible; the same request without one still works.
    let sampled = json!({"prompt": "My favourite animal is", "max_tokens": 12,
                         "temperature": 1.2, "top_p": 0.95, "seed": 7});
    let a = s.ok("/v1/completions", &sampled).await;
    let b = s.ok("/v1/completions", &sampled).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let mut penalised = sampled.clone();
    penalised["presence_penalty"] = json!(1.5);
    penalised["frequency_penalty"] = json!(1.0);
    s.ok("/v1/completions", &penalised).await;

    // Chat logprobs: one entry per token, the greedy choice is the most likely.
    let v = s
        .ok(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 5,
                    "temperature": 0, "logprobs": true, "top_logprobs": 3}),
        )
        .await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], t["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
        assert!(top[1]["logprob"].as_f64().unwrap() <= lp);
    }
    // An end-of-generation token ends the answer with "stop", unless ignore_eos.
    let short = json!({"messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 40, "temperature": 0});
    let v = s.ok("/v1/chat/completions", &short).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 40);
    let mut long = short.clone();
    long["ignore_eos"] = json!(true);
    let v = s.ok("/v1/chat/completions", &long).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 40);

    // Completions logprobs (the legacy shape).
    let v = s
        .ok(
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logprobs": 2}),
        )
        .await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_error_has_its_status_and_shape() {
    let s = start(
        ServerConfig {
            ctx: 64,
            ..ServerConfig::default()
        },
        1024,
    )
    .await;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"temperature": 2.5})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": -1})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 0})),
            400,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 0})),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 17})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"5": 1}, "frobnicate": true})),
            400,
            Some("frobnicate"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 2, "best_of": 3}),
            400,
            Some("best_of"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 0})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 50, "logprobs": true})),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": "warm"})),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": "hi"})),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": []})),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "wizard", "content": "x"}]})),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "no-such-model"})),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"]}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [999999999]}),
            400,
            Some("prompt"),
        ),
        ("/v1/completions", json!({"max_tokens": 3}), 400, None),
        // Longer than the context of 64 tokens.
        (
            "/v1/completions",
            json!({"prompt": "word ".repeat(100)}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": "word ".repeat(100)}]})),
            400,
            Some("messages"),
        ),
    ];
    for (path, body, status, param) in cases {
        let r = s.post(path, &body).await;
        assert_eq!(r.status(), status, "{path} {body}");
        let v: Value = r.json().await.unwrap();
        assert_error_shape(&v);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body}: {v}");
        }
    }
    // Not JSON at all.
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_error_shape(&v);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    // A body over the 2 MiB limit: 413, still in the error shape.
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "x".repeat(3 << 20), "max_tokens": 1}),
        )
        .await;
    assert_eq!(r.status(), 413);
    assert_error_shape(&r.json().await.unwrap());
    // A known route with the wrong method.
    let r = s.get("/v1/chat/completions").await;
    assert_eq!(r.status(), 405);
    assert_error_shape(&r.json().await.unwrap());
    // Unknown route and unknown model by path.
    for path in ["/v2/nothing", "/v1/models/nope"] {
        let r = s.get(path).await;
        assert_eq!(r.status(), 404, "{path}");
        assert_error_shape(&r.json().await.unwrap());
    }
    // Errors are counted by status.
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("smelt_requests_total{status=\"400\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("smelt_requests_total{status=\"404\"}"),
        "{metrics}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_the_api_but_not_health() {
    let s = start(
        ServerConfig {
            api_key: Some("sekrit".into()),
            ..ServerConfig::default()
        },
        1024,
    )
    .await;
    let body = json!({"prompt": "Hi", "max_tokens": 1});
    for auth in [None, Some("Bearer wrong"), Some("sekrit")] {
        let mut req = s.client.post(s.url("/v1/completions")).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let v: Value = r.json().await.unwrap();
        assert_error_shape(&v);
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    assert_eq!(s.get("/v1/models").await.status(), 401);
    // Without an admin key, an API key turns admin off altogether (tests/security.rs).
    assert_eq!(s.get("/admin/models").await.status(), 403);
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.get("/health").await.status(), 200);
    assert_eq!(s.get("/metrics").await.status(), 200);
    s.shutdown().await;
}
