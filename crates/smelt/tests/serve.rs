//! `smelt serve` as a process: with no `--model` it serves the default model under its alias,
//! answers a completion equal to `smelt run --json`'s greedy output, and a real SIGTERM
//! makes it stop gracefully and exit 0; a model that cannot cache prompt prefixes (recurrent
//! layers) says so in its log and in `/metrics`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{model, smelt_ok, SMOLLM};
use serde_json::Value;

/// One HTTP/1.1 request on a fresh connection; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let status = resp[9..12].parse().expect("status code");
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Starts `smelt serve ARGS` on a free port; the child, its address and the stderr lines up
/// to its "listening" line.
fn serve(args: &[&str]) -> (std::process::Child, String, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smelt serve starts");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let t0 = Instant::now();
    let mut lines = Vec::new();
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("smelt serve says where it listens: {lines:?}"));
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_string();
        }
        lines.push(line);
        assert!(t0.elapsed() < Duration::from_secs(60));
    };
    (child, addr, lines)
}

/// `smelt_prefix_cache_enabled`'s value in `/metrics`.
fn prefix_cache_enabled(addr: &str) -> String {
    let (status, body) = http(addr, "GET", "/metrics", "");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find(|l| l.starts_with("smelt_prefix_cache_enabled{"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or_else(|| panic!("no smelt_prefix_cache_enabled in {body}"))
        .to_string()
}

#[test]
fn serve_answers_like_run_and_exits_0_on_sigterm() {
    // The default model must be present (the alias resolves through .models/).
    model(SMOLLM);
    let (mut child, addr, lines) = serve(&["--port", "0", "--threads", "2", "--grace", "5"]);
    assert!(
        !lines.iter().any(|l| l.contains("no prefix caching")),
        "{lines:?}"
    );
    assert_eq!(prefix_cache_enabled(&addr), "1");

    let (status, body) = http(&addr, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
    let h: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(h["models"][0], "smollm2-135m");

    let prompt = "The capital of France is";
    let req = serde_json::json!({"model": "smollm2-135m", "prompt": prompt,
                                 "max_tokens": 8, "temperature": 0});
    let (status, body) = http(&addr, "POST", "/v1/completions", &req.to_string());
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let out = smelt_ok(&[
        "run",
        "--model",
        "smollm2-135m",
        "--raw",
        "--prompt",
        prompt,
        "--max-tokens",
        "8",
        "--json",
        "--threads",
        "2",
    ]);
    let run: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["choices"][0]["text"], run["text"]);
    assert_eq!(
        v["usage"]["completion_tokens"],
        run["tokens"].as_array().unwrap().len()
    );
    assert_eq!(
        v["usage"]["prompt_tokens"],
        run["prompt_tokens"].as_array().unwrap().len()
    );

    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("smelt serve did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
}

/// A Gated DeltaNet hybrid (Qwen3.5's shape, two random layers) keeps a recurrent state that
/// cached KV blocks do not hold, so it cannot share prompt prefixes: the start-up log says
/// so, `/metrics` shows the cache off, and a repeated prompt finds no hits.
#[test]
fn a_recurrent_model_says_it_caches_no_prefixes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("qwen35-tiny.gguf");
    let tokenizer = model(SMOLLM);
    smelt_ok(&[
        "synth",
        "--shape",
        "qwen35-tiny",
        "--quant",
        "q8_0",
        "--tokenizer-from",
        tokenizer.to_str().expect("UTF-8 path"),
        "-o",
        file.to_str().expect("UTF-8 path"),
    ]);
    let path = file.to_str().expect("UTF-8 path");
    let (mut child, addr, lines) = serve(&["-m", path, "--port", "0", "--threads", "1"]);
    let said = lines
        .iter()
        .find(|l| l.contains("no prefix caching"))
        .unwrap_or_else(|| panic!("the log does not say the prefix cache is off: {lines:?}"));
    assert!(said.contains("recurrent"), "{said}");
    assert_eq!(prefix_cache_enabled(&addr), "0");
    // The same long prompt twice: nothing found in a cache that is not there.
    let prompt = "one two three four five six seven eight nine ten ".repeat(8);
    let req = serde_json::json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    for _ in 0..2 {
        let (status, body) = http(&addr, "POST", "/v1/completions", &req.to_string());
        assert_eq!(status, 200, "{body}");
    }
    let (_, metrics) = http(&addr, "GET", "/metrics", "");
    let hits = metrics
        .lines()
        .find(|l| l.starts_with("smelt_prefix_cache_hit_tokens_total{"))
        .expect("the hit counter");
    assert!(hits.ends_with(" 0"), "{hits}");
    let _ = child.kill();
    let _ = child.wait();
}
