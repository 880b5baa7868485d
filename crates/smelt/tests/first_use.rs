//! What a new user does first (issue 21): `smelt run` and `smelt chat` with no flag but a
//! prompt, on the default model, answer the question on a real terminal (a pseudo-terminal
//! here) and through a pipe; `chat` edits lines, recalls history with the Up arrow and stops
//! an answer on Ctrl-C without quitting; `smelt --version` names the build and its GPU
//! kernels; logs are coloured on a terminal only. Flags whose defaults serve these commands
//! (threads, model, template) are left out on purpose.

mod common;

use common::{model, smelt_ok, SMOLLM};
use rexpect::process::WaitStatus;
use rexpect::session::{spawn_with_options, Options, PtySession};
use std::process::Command;

/// SmolLM2-135M-Instruct answers this one in a few tokens ("The answer is 4.").
const QUESTION: &str = "What is 2 + 2?";

/// The prompt on a new line after an answer (the editor starts its line with a carriage
/// return).
const PROMPT_AGAIN: &str = "\n\r?> ";

#[test]
fn run_with_only_a_prompt_answers_through_the_chat_template() {
    model(SMOLLM); // fetched already: the default model needs no download here
    let out = smelt_ok(&["run", "--prompt", QUESTION]);
    let answer = out.trim();
    assert!(!answer.is_empty(), "no answer: {out:?}");
    // The instruct model answers the question (without its template it printed nothing).
    assert!(answer.contains('4'), "{answer:?}");
    // --raw is plain completion: a different text from the same prompt.
    let raw = smelt_ok(&["run", "--raw", "--prompt", QUESTION, "--max-tokens", "16"]);
    assert_ne!(
        raw.trim(),
        answer,
        "--raw gives the template-free completion"
    );
}

/// `smelt ARGS` on a pseudo-terminal, 60 s per expectation; `strip` drops escape codes.
fn on_a_terminal(args: &[&str], history: &std::path::Path, strip: bool) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smelt"));
    cmd.args(args)
        .env("TERM", "xterm")
        .env("SMELT_HISTORY", history)
        .env_remove("NO_COLOR");
    spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(60_000))
            .strip_ansi_escape_codes(strip),
    )
    .expect("smelt starts on a pseudo-terminal")
}

/// `smelt chat` on a pseudo-terminal.
fn chat_on_a_terminal(history: &std::path::Path) -> PtySession {
    on_a_terminal(&["chat"], history, true)
}

#[test]
fn run_on_a_terminal_answers_the_question() {
    model(SMOLLM);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = on_a_terminal(
        &["run", "--prompt", QUESTION],
        &dir.path().join("history"),
        true,
    );
    let out = s.exp_eof().expect("smelt run ends");
    let status = s.process().wait().expect("exit status");
    assert!(
        matches!(status, WaitStatus::Exited(_, 0)),
        "smelt run exits 0: {status:?}: {out:?}"
    );
    assert!(out.contains('4'), "no answer on the terminal: {out:?}");
}

#[test]
fn version_names_the_build_and_the_gpu_kernels() {
    let out = smelt_ok(&["--version"]);
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("smelt {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    // Built from this checkout, so the commit is known.
    assert!(first.contains("commit "), "{out}");
    assert!(!first.contains("unknown"), "{out}");
    assert!(
        out.contains("GPU kernels:") && out.contains("q4_k"),
        "{out}"
    );
}

#[test]
fn logs_on_a_terminal_are_coloured() {
    model(SMOLLM);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = on_a_terminal(
        &["serve", "--port", "0", "--threads", "1"],
        &dir.path().join("history"),
        false,
    );
    let before = s.exp_string("listening on").expect("smelt serve starts");
    let _ = s.process_mut().kill(rexpect::process::Signal::SIGTERM);
    assert!(
        before.contains("\x1b["),
        "no colour on a terminal: {before:?}"
    );
}

#[test]
fn chat_with_no_flags_answers_recalls_history_and_stops_on_ctrl_c() {
    model(SMOLLM);
    let dir = tempfile::tempdir().expect("temp dir");
    let history = dir.path().join("history");
    let mut s = chat_on_a_terminal(&history);
    s.exp_string("Ctrl-C stops an answer").expect("the banner");
    s.exp_string("> ").expect("the first prompt");
    // Below, PROMPT_AGAIN is a prompt after an answer: the editor redraws a line being
    // typed after a carriage return, never a newline.

    // The question, typed with a mistake the line editor fixes: Left puts the cursor before
    // the "?", Backspace deletes the extra "2".
    s.send("What is 2 + 22?").unwrap();
    s.send("\x1b[D").unwrap();
    s.send("\x7f").unwrap();
    s.send("\r").unwrap();
    s.flush().unwrap();
    let (first, _) = s
        .exp_regex(PROMPT_AGAIN)
        .expect("an answer, then the prompt again");
    assert!(first.contains('4'), "the first answer: {first:?}");

    // Up recalls the corrected question from the history.
    s.send("\x1b[A").unwrap();
    s.flush().unwrap();
    s.exp_string(QUESTION).expect("Up shows the last question");
    // Ctrl-U clears it again; nothing is sent.
    s.send_control('u').unwrap();

    // A long answer, stopped by Ctrl-C part way: the chat goes on.
    s.send("Write a very long story about a dragon who learns to bake bread.\r")
        .unwrap();
    s.flush().unwrap();
    // Wait for some of the answer (after the newline that ends the typed line) before
    // interrupting it.
    s.exp_regex(r"\n\W*\w+\W+\w+\W+\w+")
        .expect("the story starts");
    s.send_control('c').unwrap();
    s.exp_string("(stopped)").expect("Ctrl-C stops the answer");
    s.exp_regex(PROMPT_AGAIN).expect("and the chat goes on");
    assert!(
        s.process()
            .status()
            .is_some_and(|st| st == WaitStatus::StillAlive),
        "Ctrl-C must not end the chat"
    );

    s.send("/exit\r").unwrap();
    s.flush().unwrap();
    s.exp_eof().expect("the chat ends");
    let status = s.process().wait().expect("exit status");
    assert!(
        matches!(status, WaitStatus::Exited(_, 0)),
        "smelt chat exits 0 after /exit: {status:?}"
    );
    let saved = std::fs::read_to_string(&history).expect("history saved");
    assert!(saved.contains(QUESTION), "{saved:?}");
}

/// The stderr lines of `smelt serve ARGS` up to its "listening" line; the server is then
/// stopped.
fn serve_until_listening(args: &[&str]) -> Vec<String> {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .arg("serve")
        .args(args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("smelt serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.expect("stderr is text");
        let done = line.contains("listening on");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn logs_to_a_pipe_have_no_colour_clean_paths_and_a_json_form() {
    model(SMOLLM);
    let text = serve_until_listening(&["--port", "0", "--threads", "1"]);
    let all = text.join("\n");
    assert!(all.contains("listening on"), "{all}");
    assert!(
        !all.contains('\x1b'),
        "colour codes in a log that is not a terminal: {all:?}"
    );
    let loaded = text
        .iter()
        .find(|l| l.contains("loaded"))
        .unwrap_or_else(|| panic!("a 'loaded' line: {all}"));
    assert!(!loaded.contains(".."), "an unclean path: {loaded}");
    assert!(loaded.contains("path=/"), "an absolute path: {loaded}");

    let json = serve_until_listening(&["--port", "0", "--threads", "1", "--log-format", "json"]);
    let logs: Vec<serde_json::Value> = json
        .iter()
        .filter(|l| !l.contains("listening on"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let loaded = logs
        .iter()
        .find(|v| v["fields"]["message"] == "loaded")
        .unwrap_or_else(|| panic!("a 'loaded' object: {json:?}"));
    assert_eq!(loaded["fields"]["model"], "smollm2-135m", "{loaded}");
    assert_eq!(loaded["level"], "INFO", "{loaded}");
}

#[test]
fn a_port_in_use_is_reported_before_any_model_loads() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port().to_string();
    let t0 = std::time::Instant::now();
    // A model that cannot load: were the port bound after loading, this error would show.
    let out = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(["serve", "--port", &port, "--model", "/no/such/model.gguf"])
        .output()
        .expect("smelt serve runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cannot listen on") && err.contains(&port),
        "{err}"
    );
    assert!(
        !err.contains("model.gguf"),
        "the model was tried first: {err}"
    );
    assert!(t0.elapsed().as_secs() < 30, "reported late: {err}");
}
