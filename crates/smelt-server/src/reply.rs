//! Answers in OpenAI's shapes: a request's scheduler events become one JSON body
//! (`chat.completion` / `text_completion`) or server-sent `chunk`s ending in `data: [DONE]`,
//! with usage and log-probabilities where asked.

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

/// The legacy completions `logprobs` object for some tokens; `offset` is the text length
/// before the first of them.
fn completion_logprobs(lps: &[(TokenLogprob, usize)]) -> Value {
    json!({
        "tokens": lps.iter().map(|(l, _)| token_str(&l.bytes)).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|(l, _)| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|(l, _)| {
            let mut m = serde_json::Map::new();
            for (b, p) in &l.top {
                m.insert(token_str(b), json!(p));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": lps.iter().map(|(_, o)| o).collect::<Vec<_>>(),
    })
}

/// Waits for the whole generation and answers one JSON body. If the client goes away, this
/// future is dropped with the receiver, and the scheduler drops the sequence at its next step.
pub(crate) async fn collect(
    mut rx: mpsc::UnboundedReceiver<Event>,
    r: Reply,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps: Vec<(TokenLogprob, usize)> = Vec::new();
    let (finish, prompt_tokens, completion_tokens) = loop {
        match rx.recv().await {
            Some(Event::Token {
                text: t, logprob, ..
            }) => {
                if let Some(l) = logprob {
                    lps.push((l, text.len()));
                }
                text.push_str(&t);
            }
            Some(Event::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            }) => break (finish_reason, prompt_tokens, completion_tokens),
            Some(Event::Error(e)) => return Err(e),
            None => return Err(ApiError::internal("the scheduler dropped the request")),
        }
    };
    let logprobs = if !r.logprobs {
        Value::Null
    } else if r.kind == Kind::Chat {
        json!({"content": lps.iter().map(|(l, _)| chat_logprob(l)).collect::<Vec<_>>()})
    } else {
        completion_logprobs(&lps)
    };
    let body = match r.kind {
        Kind::Chat => json!({
            "id": r.id,
            "object": "chat.completion",
            "created": r.created,
            "model": r.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_str(finish),
            }],
            "usage": usage(prompt_tokens, completion_tokens),
        }),
        Kind::Completion => json!({
            "id": r.id,
            "object": "text_completion",
            "created": r.created,
            "model": r.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_str(finish),
            }],
            "usage": usage(prompt_tokens, completion_tokens),
        }),
    };
    Ok(Json(body).into_response())
}

/// A streaming response's state between events.
struct StreamState {
    rx: mpsc::UnboundedReceiver<Event>,
    r: Reply,
    pending: VecDeque<SseEvent>,
    started: bool,
    done: bool,
    /// Text length so far (completions' text_offset).
    offset: usize,
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

    fn token(&mut self, text: String, logprob: Option<TokenLogprob>) {
        if text.is_empty() && logprob.is_none() {
            return;
        }
        let choice = match self.r.kind {
            Kind::Chat => json!({
                "index": 0,
                "delta": {"content": text},
                "logprobs": logprob.as_ref().map(|l| json!({"content": [chat_logprob(l)]})),
                "finish_reason": null,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": logprob.map(|l| completion_logprobs(&[(l, self.offset)])),
                "finish_reason": null,
            }),
        };
        self.offset += text.len();
        let c = self.chunk(choice, None);
        self.pending.push_back(c);
    }

    fn done(&mut self, finish: FinishReason, prompt: usize, completion: usize) {
        let choice = match self.r.kind {
            Kind::Chat => json!({
                "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_str(finish),
            }),
            Kind::Completion => json!({
                "index": 0, "text": "", "logprobs": null, "finish_reason": finish_str(finish),
            }),
        };
        let c = self.chunk(choice, None);
        self.pending.push_back(c);
        if self.r.include_usage {
            let c = self.chunk(Value::Null, Some(usage(prompt, completion)));
            self.pending.push_back(c);
        }
        self.end();
    }

    fn end(&mut self) {
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

/// Server-sent events: OpenAI's chunks, then `data: [DONE]`. Dropping the stream (the client
/// went away) drops the receiver, which the scheduler notices at its next step.
pub(crate) fn stream(
    rx: mpsc::UnboundedReceiver<Event>,
    r: Reply,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = StreamState {
        rx,
        r,
        pending: Default::default(),
        started: false,
        done: false,
        offset: 0,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.pending.pop_front() {
                return Some((Ok(ev), s));
            }
            if s.done {
                return None;
            }
            if !s.started && s.r.kind == Kind::Chat {
                s.started = true;
                let c = s.chunk(
                    json!({
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null,
                        "finish_reason": null,
                    }),
                    None,
                );
                s.pending.push_back(c);
                continue;
            }
            match s.rx.recv().await {
                Some(Event::Token { text, logprob, .. }) => s.token(text, logprob),
                Some(Event::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                }) => s.done(finish_reason, prompt_tokens, completion_tokens),
                Some(Event::Error(e)) => {
                    s.pending
                        .push_back(SseEvent::default().data(e.body().to_string()));
                    s.end();
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
