//! The scheduler under load, through HTTP: concurrent greedy streams equal their sequential
//! answers, disconnects free sequences, a full queue answers 429, a full KV cache preempts
//! (and a request that can never fit gets 503).

mod common;

use std::time::Duration;

use common::{chunks, sse, start, start_default, TestServer};
use futures_util::future::join_all;
use serde_json::{json, Value};
use smelt_server::{SchedulerConfig, ServerConfig};

const PROMPTS: [&str; 16] = [
    "Tell me about the sea.",
    "What is 2 + 2?",
    "Name three colors.",
    "Write a haiku about rain.",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What is the capital of Japan?",
    "Describe a cat in one sentence.",
    "What does a bee make?",
    "Translate 'hello' to Spanish.",
    "What is the largest planet?",
    "Say something kind.",
    "What is rust made of?",
    "Count to five.",
];

fn body(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
           "temperature": 0, "stream": stream, "stream_options": {"include_usage": true}})
}

/// The text and usage of a streamed chat answer.
async fn streamed(s: &TestServer, b: &Value) -> (String, Value) {
    let cs = chunks(&sse(s.post("/v1/chat/completions", b).await).await);
    let text = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    (text, cs.last().unwrap()["usage"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_greedy_streams_equal_their_sequential_answers() {
    let s = start_default().await;
    let mut sequential = Vec::new();
    for p in PROMPTS {
        let v = s.ok("/v1/chat/completions", &body(p, 12, false)).await;
        sequential.push((
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
            v["usage"].clone(),
        ));
    }
    let steps_before = s.metric("smelt_steps_total").await;
    let forward_before = s.metric("smelt_forward_microseconds_total").await;
    let busy_before = s.metric("smelt_scheduler_busy_microseconds_total").await;
    let bodies: Vec<Value> = PROMPTS.iter().map(|p| body(p, 12, true)).collect();
    let together = join_all(bodies.iter().map(|b| streamed(&s, b))).await;
    for (i, (got, want)) in together.iter().zip(&sequential).enumerate() {
        assert_eq!(got, want, "prompt {i} {:?}", PROMPTS[i]);
    }
    // Batched: far fewer steps than the 16 x 12 tokens one at a time would need.
    let steps = s.metric("smelt_steps_total").await - steps_before;
    let tokens: u64 = sequential
        .iter()
        .map(|(_, u)| u["completion_tokens"].as_u64().unwrap())
        .sum();
    assert!(
        steps < tokens as f64 * 0.6,
        "{steps} steps for {tokens} tokens: not batched"
    );
    s.wait_metric("smelt_running_sequences", 0.0, Duration::from_secs(5))
        .await;
    s.wait_metric("smelt_kv_blocks_used", 0.0, Duration::from_secs(5))
        .await;
    // (Read once the batch is empty: the loop adds its busy time after its step.)
    // The scheduler's time: its forwards are part of its busy time, and most of it here
    // (a CPU engine's forward is far longer than the host work around it).
    let forward = s.metric("smelt_forward_microseconds_total").await - forward_before;
    let busy = s.metric("smelt_scheduler_busy_microseconds_total").await - busy_before;
    assert!(
        forward > 0.0 && forward <= busy && forward > 0.5 * busy,
        "forward {forward} us of {busy} us busy"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_sequence() {
    let s = start_default().await;
    // Streaming: read a few chunks, then drop the response.
    let mut r = s
        .post(
            "/v1/chat/completions",
            &body("Write a long story about a dragon.", 2000, true),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut seen = 0;
    while seen < 3 {
        let c = r.chunk().await.unwrap().expect("stream still open");
        seen += c.windows(6).filter(|w| w == b"data: ").count();
    }
    assert_eq!(s.metric("smelt_running_sequences").await, 1.0);
    assert!(s.metric("smelt_kv_blocks_used").await > 0.0);
    drop(r);
    s.wait_metric("smelt_running_sequences", 0.0, Duration::from_secs(10))
        .await;
    s.wait_metric("smelt_kv_blocks_used", 0.0, Duration::from_secs(5))
        .await;

    // Not streaming: the request future is dropped while the answer is generated.
    let client = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let b = body("Write a long story about a knight.", 2000, false);
    let pending = tokio::spawn(async move { client.post(url).json(&b).send().await });
    let t0 = std::time::Instant::now();
    while s.metric("smelt_running_sequences").await < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pending.abort();
    s.wait_metric("smelt_running_sequences", 0.0, Duration::from_secs(10))
        .await;
    s.wait_metric("smelt_kv_blocks_used", 0.0, Duration::from_secs(5))
        .await;
    let generated = s.metric("smelt_generated_tokens_total").await;
    assert!(generated < 1500.0, "cancelled requests ran on: {generated}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_nothing_fails() {
    let s = start(
        ServerConfig {
            scheduler: SchedulerConfig {
                max_batch: 1,
                max_queue: 1,
                ..SchedulerConfig::default()
            },
            ..ServerConfig::default()
        },
        1024,
    )
    .await;
    let b = json!({"prompt": "The weather today is", "max_tokens": 16, "temperature": 0});
    let answers = join_all((0..10).map(|_| async {
        let r = s.post("/v1/completions", &b).await;
        let status = r.status().as_u16();
        let retry = r.headers().get("retry-after").cloned();
        let v: Value = r.json().await.unwrap();
        (status, retry, v)
    }))
    .await;
    let mut ok_text = None;
    let (mut ok, mut busy) = (0, 0);
    for (status, retry, v) in &answers {
        match status {
            200 => {
                ok += 1;
                let t = v["choices"][0]["text"].clone();
                assert_eq!(ok_text.get_or_insert(t.clone()), &t, "same greedy answer");
            }
            429 => {
                busy += 1;
                assert!(retry.is_some(), "429 without Retry-After");
                assert_eq!(v["error"]["type"], "rate_limit_error");
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    assert!(ok >= 2, "{ok} answered: one running and one waiting fit");
    assert!(busy >= 1, "no 429 among {} requests", answers.len());
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("smelt_requests_total{status=\"429\"}"));
    s.wait_metric("smelt_queue_depth", 0.0, Duration::from_secs(5))
        .await;
    // The server still serves after the burst.
    s.ok("/v1/completions", &b).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_kv_cache_preempts_and_recomputes_and_an_impossible_request_gets_503() {
    // 96 tokens of KV (6 blocks of 16) for three requests of ~35 prompt tokens + 24 new.
    let s = start(ServerConfig::default(), 96).await;
    let prompts = [
        "Tell me about the sea.",
        "What is the capital of Japan?",
        "Name three colors.",
    ];
    let mut sequential = Vec::new();
    for p in prompts {
        let v = s.ok("/v1/chat/completions", &body(p, 24, false)).await;
        sequential.push(v["choices"][0]["message"]["content"].clone());
    }
    let bodies: Vec<Value> = prompts.iter().map(|p| body(p, 24, false)).collect();
    let together = join_all(bodies.iter().map(|b| s.ok("/v1/chat/completions", b))).await;
    for (i, v) in together.iter().enumerate() {
        assert_eq!(
            v["choices"][0]["message"]["content"], sequential[i],
            "prompt {i}"
        );
    }
    assert!(
        s.metric("smelt_preemptions_total").await >= 1.0,
        "the cache was never full"
    );
    // Fits the context (4096) but never the 96-token cache.
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "word ".repeat(120), "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("KV cache"),
        "{v}"
    );
    // Fits at first, then outgrows the whole cache while generating alone: cut by length
    // when the 96 cached tokens plus the last sampled one are reached.
    let v = s
        .ok(
            "/v1/completions",
            &json!({"prompt": "Count: 1, 2, 3,", "max_tokens": 500, "temperature": 0}),
        )
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["total_tokens"], 97, "{v}");
    s.wait_metric("smelt_kv_blocks_used", 0.0, Duration::from_secs(5))
        .await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_kv_cache_and_a_full_queue_together_corrupt_no_answer() {
    // 96 tokens of KV (6 blocks of 16) for a batch of up to 4 sequences of ~20 tokens
    // (3 blocks each once generating), and 2 places in the queue: some requests wait for the
    // cache, the ones past the queue get 429, and every answer equals its answer alone.
    let s = start(
        ServerConfig {
            scheduler: SchedulerConfig {
                max_batch: 4,
                max_queue: 2,
                ..SchedulerConfig::default()
            },
            ..ServerConfig::default()
        },
        96,
    )
    .await;
    let prompts = [
        "The weather today is",
        "Once upon a time",
        "The capital of France",
        "My favourite food is",
        "In the year 2000,",
    ];
    let body = |p: &str| json!({"prompt": p, "max_tokens": 16, "temperature": 0});
    let mut alone = Vec::new();
    for p in prompts {
        let v = s.ok("/v1/completions", &body(p)).await;
        alone.push(v["choices"][0]["text"].clone());
    }
    let server = &s;
    let answers = join_all((0..12).map(|i| async move {
        let r = server
            .post("/v1/completions", &body(prompts[i % prompts.len()]))
            .await;
        let status = r.status().as_u16();
        (i, status, r.json::<Value>().await.unwrap())
    }))
    .await;
    let (mut ok, mut busy) = (0, 0);
    for (i, status, v) in &answers {
        match status {
            200 => {
                ok += 1;
                assert_eq!(
                    v["choices"][0]["text"],
                    alone[i % prompts.len()],
                    "request {i}"
                );
            }
            429 => busy += 1,
            other => panic!("request {i}: unexpected status {other}: {v}"),
        }
    }
    assert!(ok >= 4, "only {ok} of 12 answered");
    assert!(
        busy >= 1,
        "no 429 among 12 requests for 4 places and a queue of 2"
    );
    assert!(
        s.metric("smelt_preemptions_total").await >= 1.0,
        "the cache was never full"
    );
    s.wait_metric("smelt_kv_blocks_used", 0.0, Duration::from_secs(5))
        .await;
    s.shutdown().await;
}
