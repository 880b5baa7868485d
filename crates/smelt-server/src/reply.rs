//! Answers in OpenAI's shapes: a request's scheduler events (one stream per choice, tagged
//! with the choice's index) become one JSON body (`chat.completion` / `text_completion`) or
//! server-sent `chunk`s ending in `data: [DONE]`, with usage and log-probabilities where
//! asked; chat text is read for tool calls and `<think>` reasoning as the model's format says.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::Stream;
use serde_json::{json, Value};
use smelt_engine::generate::FinishReason;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::scheduler::{Event, TokenLogprob};
use crate::tool_stream;
use crate::tools::{self, ToolCall, ToolFormat};

/// Which endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// What a response needs besides the events.
#[derive(Clone)]
pub(crate) struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub logprobs: bool,
    pub include_usage: bool,
    /// Choices, each with its own event stream.
    pub n: usize,
    /// Completions' `echo`: the prompt's text, answered before each choice's text.
    pub echo: Option<String>,
    /// Chat: the tool-call format to read calls in (when the request has tools).
    pub tools: Option<ToolFormat>,
    /// Chat: split `<think>` text off into `reasoning_content`.
    pub think: bool,
    /// Chat: the prompt ends inside an opened `<think>` block, so the answer starts as
    /// reasoning (until `</think>`, or all of it without one).
    pub think_open: bool,
}

/// A unique response id (`chatcmpl-...` / `cmpl-...`).
pub(crate) fn next_id(kind: Kind) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!("{prefix}-{t:x}{n:06x}")
}

/// The events of all choices, each tagged with its index.
pub(crate) type Events = mpsc::UnboundedReceiver<(usize, Event)>;

fn finish_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Eog => "stop",
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn token_str(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat's `logprobs.content[]` entry.
fn chat_logprob(lp: &TokenLogprob) -> Value {
    json!({
        "token": token_str(&lp.bytes),
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": lp.top.iter().map(|(b, l)| json!({
            "token": token_str(b),
            "logprob": l,
            "bytes": b,
        })).collect::<Vec<_>>(),
    })
}

/// A token of a completions `logprobs` object: its bytes, its log-probability (none for a
/// prompt's first token) and its offset in the answer's text.
type Scored = (Vec<u8>, Option<TokenLogprob>, usize);

/// The legacy completions `logprobs` object for some tokens.
fn completion_logprobs(lps: &[Scored]) -> Value {
    json!({
        "tokens": lps.iter().map(|(b, _, _)| token_str(b)).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|(_, l, _)| l.as_ref().map(|l| l.logprob)).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|(_, l, _)| l.as_ref().map(|l| {
            let mut m = serde_json::Map::new();
            for (b, p) in &l.top {
                m.insert(token_str(b), json!(p));
            }
            Value::Object(m)
        })).collect::<Vec<_>>(),
        "text_offset": lps.iter().map(|(_, _, o)| o).collect::<Vec<_>>(),
    })
}

/// Prompt tokens as scored tokens, with offsets from 0.
fn prompt_scored(prompt: Vec<(Vec<u8>, Option<TokenLogprob>)>) -> Vec<Scored> {
    let mut off = 0;
    prompt
        .into_iter()
        .map(|(b, l)| {
            let o = off;
            off += token_str(&b).len();
            (b, l, o)
        })
        .collect()
}

/// OpenAI's `tool_calls` entries.
fn calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect(),
    )
}

/// A chat answer's message: content, and tool calls and reasoning where the text holds them;
/// whether it made tool calls.
fn chat_message(r: &Reply, text: String) -> (Value, bool) {
    let (reasoning, text) = if r.think_open {
        tools::split_think_opened(&text)
    } else if r.think {
        tools::split_think(&text)
    } else {
        (None, text)
    };
    let (content, calls) = match r.tools {
        Some(f) => tools::parse(f, &text),
        None => (text, Vec::new()),
    };
    let mut m = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        if content.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = calls_json(&calls);
    }
    if let Some(rc) = reasoning {
        m["reasoning_content"] = json!(rc);
    }
    (m, !calls.is_empty())
}

/// One choice's answer as it arrives.
#[derive(Default)]
struct Collected {
    text: String,
    lps: Vec<Scored>,
    finish: Option<FinishReason>,
    completion_tokens: usize,
}

/// Waits for every choice's whole generation and answers one JSON body. If the client goes
/// away, this future is dropped with the receiver, and the scheduler drops the sequences at
/// their next step.
pub(crate) async fn collect(mut rx: Events, r: Reply) -> Result<Response, ApiError> {
    let mut choices: Vec<Collected> = (0..r.n).map(|_| Collected::default()).collect();
    if let Some(e) = &r.echo {
        for c in &mut choices {
            c.text.push_str(e);
        }
    }
    let mut prompt_tokens = 0;
    let mut left = r.n;
    while left > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the scheduler dropped the request"));
        };
        let c = &mut choices[i];
        match ev {
            Event::Prompt(p) => c.lps = prompt_scored(p),
            Event::Token {
                text: t, logprob, ..
            } => {
                if let Some(l) = logprob {
                    c.lps.push((l.bytes.clone(), Some(l), c.text.len()));
                }
                c.text.push_str(&t);
            }
            Event::Done {
                finish_reason,
                prompt_tokens: p,
                completion_tokens,
            } => {
                c.finish = Some(finish_reason);
                c.completion_tokens = completion_tokens;
                prompt_tokens = p;
                left -= 1;
            }
            Event::Error(e) => return Err(e),
        }
    }
    let completion_tokens: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let out: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let finish = finish_str(c.finish.unwrap_or(FinishReason::Stop));
            let logprobs = if !r.logprobs {
                Value::Null
            } else if r.kind == Kind::Chat {
                json!({"content": c.lps.iter().filter_map(|(_, l, _)| l.as_ref().map(chat_logprob)).collect::<Vec<_>>()})
            } else {
                completion_logprobs(&c.lps)
            };
            match r.kind {
                Kind::Chat => {
                    let (message, called) = chat_message(&r, c.text);
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": logprobs,
                        // Cut off by max_tokens, an answer says so even after calls
                        // (its last call may be unfinished), as OpenAI's does.
                        "finish_reason": if called && finish != "length" { "tool_calls" } else { finish },
                    })
                }
                Kind::Completion => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let object = match r.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    Ok(Json(json!({
        "id": r.id,
        "object": object,
        "created": r.created,
        "model": r.model,
        "choices": out,
        "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// Where a streamed chat choice's text goes while it is read for calls and reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing sent yet: the first text decides (a `<think>` block, a bare JSON call).
    Start,
    Content,
    Reasoning,
    /// A tool call started: the text is held, and each call goes out in pieces as it is
    /// read ([`crate::tool_stream`]).
    Calls,
}

/// One streamed choice's state.
struct ChoiceState {
    started: bool,
    /// Text length so far (completions' text_offset).
    offset: usize,
    mode: Mode,
    /// Text not sent yet (a possible marker's start, or calls).
    held: String,
    /// Tool calls streamed so far: their ids and the arguments text sent.
    calls: Vec<(String, String)>,
    /// Some reasoning went out already (before it, leading whitespace is dropped, as the
    /// non-streamed answer trims it).
    reasoning_sent: bool,
    /// A `<think>` block just ended: the whitespace after it is dropped (as the non-streamed
    /// answer trims it) until the answer's first text.
    after_think: bool,
    done: bool,
}

/// A streaming response's state between events.
struct StreamState {
    rx: Events,
    r: Reply,
    pending: VecDeque<SseEvent>,
    choices: Vec<ChoiceState>,
    done: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// The length of the longest end of `text` that is a proper start of `marker`.
fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k) && marker.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

impl StreamState {
    fn chunk(&self, choice: Value, usage: Option<Value>) -> SseEvent {
        let object = match self.r.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let mut v = json!({
            "id": self.r.id,
            "object": object,
            "created": self.r.created,
            "model": self.r.model,
            "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
        });
        if self.r.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        SseEvent::default().data(v.to_string())
    }

    fn push(&mut self, choice: Value) {
        let c = self.chunk(choice, None);
        self.pending.push_back(c);
    }

    fn delta(&mut self, i: usize, delta: Value, logprob: Option<&TokenLogprob>) {
        self.push(json!({
            "index": i,
            "delta": delta,
            "logprobs": logprob.map(|l| json!({"content": [chat_logprob(l)]})),
            "finish_reason": null,
        }));
    }

    /// Chat text through the choice's reader: what can be sent now goes out as content or
    /// reasoning; a possible call is held.
    fn chat_text(&mut self, i: usize, text: &str, logprob: Option<&TokenLogprob>) {
        let (think, tools) = (self.r.think, self.r.tools);
        let st = &mut self.choices[i];
        st.held.push_str(text);
        let mut content = String::new();
        let mut reasoning = String::new();
        loop {
            match st.mode {
                Mode::Start => {
                    if st.after_think {
                        st.held = st.held.trim_start().to_string();
                    }
                    let t = st.held.trim_start();
                    if t.is_empty() {
                        break;
                    }
                    st.after_think = false;
                    if think && "<think>".starts_with(t) && t.len() < "<think>".len() {
                        break;
                    }
                    if think && t.starts_with("<think>") {
                        st.held = t["<think>".len()..].trim_start().to_string();
                        st.mode = Mode::Reasoning;
                        continue;
                    }
                    if tools == Some(ToolFormat::Llama3) {
                        let body = t.strip_prefix("<|python_tag|>").unwrap_or(t);
                        if "<|python_tag|>".starts_with(t) {
                            break;
                        }
                        if body.starts_with('{') {
                            st.mode = Mode::Calls;
                            continue;
                        }
                    }
                    st.mode = Mode::Content;
                }
                Mode::Reasoning => {
                    if !st.reasoning_sent {
                        st.held = st.held.trim_start().to_string();
                    }
                    if let Some(end) = st.held.find("</think>") {
                        // The whitespace before the tag is not reasoning (trimmed as the
                        // non-streamed answer is).
                        reasoning.push_str(st.held[..end].trim_end());
                        st.held = st.held[end + "</think>".len()..].trim_start().to_string();
                        // What follows is read as a fresh answer (a bare JSON call too).
                        st.mode = Mode::Start;
                        st.after_think = true;
                        continue;
                    }
                    // Held back: a possible start of `</think>`, and trailing whitespace,
                    // which is reasoning only if more reasoning follows it.
                    let keep = partial_marker(&st.held, "</think>");
                    let send = st.held[..st.held.len() - keep].trim_end().len();
                    reasoning.push_str(&st.held[..send]);
                    st.held.drain(..send);
                    break;
                }
                Mode::Content => {
                    let Some(f) = tools.filter(|&f| f != ToolFormat::Llama3) else {
                        content.push_str(&st.held);
                        st.held.clear();
                        break;
                    };
                    if let Some(at) = st.held.find(f.marker()) {
                        content.push_str(&st.held[..at]);
                        st.held.drain(..at);
                        st.mode = Mode::Calls;
                        continue;
                    }
                    let keep = partial_marker(&st.held, f.marker());
                    let send = st.held.len() - keep;
                    content.push_str(&st.held[..send]);
                    st.held.drain(..send);
                    break;
                }
                Mode::Calls => break,
            }
        }
        if !reasoning.is_empty() {
            self.choices[i].reasoning_sent = true;
            self.delta(i, json!({"reasoning_content": reasoning}), None);
        }
        if !content.is_empty() || logprob.is_some() {
            self.delta(i, json!({"content": content}), logprob);
        }
        if let (Mode::Calls, Some(f)) = (self.choices[i].mode, tools) {
            self.stream_calls(i, f);
        }
    }

    /// Sends what is new in the held calls: a call's id and name once its name is read,
    /// then its arguments as they grow; the next call only once this one is complete.
    fn stream_calls(&mut self, i: usize, f: ToolFormat) {
        let parts = tool_stream::scan(f, &self.choices[i].held);
        for (k, p) in parts.iter().enumerate() {
            let Some(name) = &p.name else {
                break;
            };
            if k == self.choices[i].calls.len() {
                let id = tools::call_id();
                self.delta(
                    i,
                    json!({"tool_calls": [{"index": k, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    None,
                );
                self.choices[i].calls.push((id, String::new()));
            }
            if let Some(a) = &p.arguments {
                let sent = &self.choices[i].calls[k].1;
                if a.len() > sent.len() && a.starts_with(sent.as_str()) {
                    let piece = a[sent.len()..].to_string();
                    self.choices[i].calls[k].1 = a.clone();
                    self.delta(
                        i,
                        json!({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}),
                        None,
                    );
                }
            }
            if !p.done {
                break;
            }
        }
    }

    fn token(&mut self, i: usize, text: String, logprob: Option<TokenLogprob>) {
        if self.r.kind == Kind::Chat {
            if self.r.tools.is_some() || self.r.think {
                self.chat_text(i, &text, logprob.as_ref());
            } else if !text.is_empty() || logprob.is_some() {
                self.delta(i, json!({"content": text}), logprob.as_ref());
            }
            return;
        }
        if text.is_empty() && logprob.is_none() {
            return;
        }
        let off = self.choices[i].offset;
        self.push(json!({
            "index": i,
            "text": text,
            "logprobs": logprob.map(|l| completion_logprobs(&[(l.bytes.clone(), Some(l), off)])),
            "finish_reason": null,
        }));
        self.choices[i].offset += text.len();
    }

    /// Completions' echo: the prompt's text (and its tokens' log-probabilities) first.
    fn echo(&mut self, i: usize, prompt: Option<Vec<(Vec<u8>, Option<TokenLogprob>)>>) {
        let text = self.r.echo.clone().unwrap_or_default();
        let lps = prompt.map(prompt_scored);
        self.push(json!({
            "index": i,
            "text": text,
            "logprobs": lps.map(|l| completion_logprobs(&l)),
            "finish_reason": null,
        }));
        self.choices[i].offset += text.len();
    }

    fn finish(&mut self, i: usize, finish: FinishReason) {
        let mut reason = finish_str(finish);
        if self.r.kind == Kind::Chat {
            let st = &mut self.choices[i];
            let held = std::mem::take(&mut st.held);
            match (st.mode, self.r.tools) {
                (Mode::Calls, Some(f)) => {
                    let (content, calls) = tools::parse(f, &held);
                    let streamed = std::mem::take(&mut self.choices[i].calls);
                    if !content.is_empty() {
                        self.delta(i, json!({"content": content}), None);
                    }
                    for (k, c) in calls.iter().enumerate() {
                        // As OpenAI streams a call: id and name first, then the arguments;
                        // what the stream sent already is not sent again.
                        let sent = match streamed.get(k) {
                            Some((_, sent)) => sent.as_str(),
                            None => {
                                self.delta(
                                    i,
                                    json!({"tool_calls": [{"index": k, "id": c.id,
                                        "type": "function",
                                        "function": {"name": c.name, "arguments": ""}}]}),
                                    None,
                                );
                                ""
                            }
                        };
                        match c.arguments.strip_prefix(sent) {
                            Some("") => {}
                            Some(rest) => self.delta(
                                i,
                                json!({"tool_calls": [{"index": k, "function": {"arguments": rest}}]}),
                                None,
                            ),
                            None => tracing::warn!(
                                "streamed tool-call arguments {sent:?} are not a prefix of \
                                 the parsed {:?}",
                                c.arguments
                            ),
                        }
                    }
                    if (!calls.is_empty() || !streamed.is_empty()) && finish != FinishReason::Length
                    {
                        reason = "tool_calls";
                    }
                }
                (Mode::Reasoning, _) => {
                    // Cut off while thinking: the rest is reasoning, its end trimmed.
                    let rest = held.trim_end();
                    let rest = if st.reasoning_sent {
                        rest
                    } else {
                        rest.trim_start()
                    };
                    if !rest.is_empty() {
                        self.delta(i, json!({"reasoning_content": rest}), None);
                    }
                }
                _ => {
                    // Only whitespace after a `<think>` block: no content, as not streamed.
                    let held = if st.after_think {
                        held.trim_start()
                    } else {
                        &held
                    };
                    if !held.is_empty() {
                        self.delta(i, json!({"content": held}), None);
                    }
                }
            }
            self.push(json!({
                "index": i, "delta": {}, "logprobs": null, "finish_reason": reason,
            }));
        } else {
            self.push(json!({
                "index": i, "text": "", "logprobs": null, "finish_reason": reason,
            }));
        }
        self.choices[i].done = true;
    }

    fn all_done(&mut self) {
        if self.r.include_usage {
            let c = self.chunk(
                Value::Null,
                Some(usage(self.prompt_tokens, self.completion_tokens)),
            );
            self.pending.push_back(c);
        }
        self.end();
    }

    fn end(&mut self) {
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }

    /// The first chunk of choice `i`: chat's role, completions' echo (unless the prompt's
    /// log-probabilities come with it).
    fn start(&mut self, i: usize, ev: &Event) {
        if self.choices[i].started {
            return;
        }
        self.choices[i].started = true;
        match self.r.kind {
            Kind::Chat => self.push(json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            })),
            Kind::Completion => {
                if self.r.echo.is_some() && !matches!(ev, Event::Prompt(_)) {
                    self.echo(i, None);
                }
            }
        }
    }
}

/// Server-sent events: OpenAI's chunks, then `data: [DONE]`. Dropping the stream (the client
/// went away) drops the receiver, which the scheduler notices at its next step.
pub(crate) fn stream(rx: Events, r: Reply) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = StreamState {
        choices: (0..r.n)
            .map(|_| ChoiceState {
                started: false,
                offset: 0,
                mode: if r.think_open {
                    Mode::Reasoning
                } else {
                    Mode::Start
                },
                held: String::new(),
                calls: Vec::new(),
                reasoning_sent: false,
                after_think: false,
                done: false,
            })
            .collect(),
        rx,
        r,
        pending: Default::default(),
        done: false,
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.pending.pop_front() {
                return Some((Ok(ev), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some((i, ev)) => {
                    s.start(i, &ev);
                    match ev {
                        Event::Prompt(p) => s.echo(i, Some(p)),
                        Event::Token { text, logprob, .. } => s.token(i, text, logprob),
                        Event::Done {
                            finish_reason,
                            prompt_tokens,
                            completion_tokens,
                        } => {
                            s.prompt_tokens = prompt_tokens;
                            s.completion_tokens += completion_tokens;
                            s.finish(i, finish_reason);
                            if s.choices.iter().all(|c| c.done) {
                                s.all_done();
                            }
                        }
                        Event::Error(e) => {
                            s.pending
                                .push_back(SseEvent::default().data(e.body().to_string()));
                            s.end();
                        }
                    }
                }
                None => {
                    let e = ApiError::internal("the scheduler dropped the request");
                    s.pending
                        .push_back(SseEvent::default().data(e.body().to_string()));
                    s.end();
                }
            }
        }
    })
}
