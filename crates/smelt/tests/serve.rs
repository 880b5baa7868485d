//! `smelt serve` as a process: with no `--model` it serves the default model under its alias,
//! answers a completion equal to `smelt run --json`'s greedy output, and a real SIGTERM
//! makes it stop gracefully and exit 0.

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

#[test]
fn serve_answers_like_run_and_exits_0_on_sigterm() {
    // The default model must be present (the alias resolves through .models/).
    model(SMOLLM);
    let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(["serve", "--port", "0", "--threads", "2", "--grace", "5"])
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
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("smelt serve says where it listens");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
    };

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
