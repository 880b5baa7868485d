//! `smelt chat`: a scripted conversation through stdin.

mod common;

use common::{model, GEMMA};
use std::io::Write;
use std::process::{Command, Stdio};

fn chat(model: &str, input: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args([
            "chat",
            "--model",
            model,
            "--max-tokens",
            "12",
            "--threads",
            "2",
            "--verbose",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smelt runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("smelt ends");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "smelt chat failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

/// The answers, one per turn (the text after each "> " prompt).
fn answers(stdout: &str) -> Vec<String> {
    stdout
        .split("> ")
        .skip(1)
        .map(|a| a.trim_end_matches('\n').to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

#[test]
fn the_first_answer_is_what_run_chat_gives_and_the_conversation_goes_on() {
    let m = model(GEMMA);
    let m = m.to_str().expect("UTF-8 path");
    let (stdout, stderr) = chat(m, "What is the capital of France?\nAnd of Italy?\n/exit\n");
    let a = answers(&stdout);
    assert_eq!(a.len(), 2, "two answers: {stdout:?}");
    // The second turn extends the first: its prompt reuses the cached tokens.
    let reused: Vec<usize> = stderr
        .lines()
        .filter_map(|l| {
            let head = l.strip_suffix(" tokens reused from the cache]")?;
            head.rsplit('[').next()?.parse().ok()
        })
        .collect();
    assert_eq!(reused.len(), 2, "{stderr}");
    assert_eq!(reused[0], 0);
    assert!(
        reused[1] > 0,
        "the second turn reuses the first's tokens: {stderr}"
    );
    let run = common::smelt_ok(&[
        "run",
        "--model",
        m,
        "--prompt",
        "What is the capital of France?",
        "--chat",
        "--max-tokens",
        "12",
        "--threads",
        "2",
        "--json",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(run.lines().last().unwrap_or("")).expect("JSON last line");
    assert_eq!(a[0], v["text"].as_str().expect("text"));
}

#[test]
fn reset_forgets_and_ctrl_d_ends() {
    let m = model(GEMMA);
    let m = m.to_str().expect("UTF-8 path");
    // The same question after /reset gets the same (greedy) answer as the first time.
    let (stdout, stderr) = chat(m, "Name a colour.\n/reset\nName a colour.\n");
    let a = answers(&stdout);
    assert_eq!(a.len(), 2, "{stdout:?}");
    assert_eq!(a[0], a[1]);
    assert!(stderr.contains("cleared"), "{stderr}");
}
