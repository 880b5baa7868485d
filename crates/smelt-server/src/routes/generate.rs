//! The generation path chat and completions share: a prompt's text into tokens as
//! llama.cpp makes them, and those tokens checked against the model, queued as one job
//! per choice on its scheduler and answered, streamed or whole, through [`crate::reply`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use smelt_engine::sampler::SamplingParams;
use smelt_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::models::ModelEntry;
use crate::openai::{self, GenParams};
use crate::reply::{collect, next_id, stream, Kind, Reply};
use crate::scheduler::{Constraint, Job, SubmitError};
use crate::tools::ToolFormat;

/// llama.cpp's tokenization of a prompt, as `smelt run` does it: BOS as the GGUF says; a
/// chat prompt has its special tokens parsed (except in the `plain` ranges: message content)
/// and keeps one BOS when the template already wrote its text.
pub(super) fn tokenize(
    tok: &Tokenizer,
    text: &str,
    chat: bool,
    plain: &[std::ops::Range<usize>],
) -> Vec<u32> {
    let mut ids = if chat {
        tok.encode_with_plain(text, true, plain)
    } else {
        tok.encode(text, true, false)
    };
    if chat {
        if let Some(bos) = tok.bos() {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
    }
    ids
}

/// How a request's answer is shaped beyond sampling: echo, tool calls, reasoning, a grammar.
pub(super) struct Shape {
    /// Completions' echo: the prompt's text.
    pub(super) echo: Option<String>,
    pub(super) tools: Option<ToolFormat>,
    pub(super) think: bool,
    /// The prompt ends inside a `<think>` block the template opened.
    pub(super) think_open: bool,
    pub(super) grammar: Option<llguidance::api::TopLevelGrammar>,
    /// The field a grammar that does not compile is blamed on.
    pub(super) grammar_param: &'static str,
}

/// Checks the prompt against the context, queues one job per choice, and answers.
pub(super) async fn run(
    model: &ModelEntry,
    prompt: Vec<u32>,
    p: GenParams,
    logprobs: Option<usize>,
    kind: Kind,
    arrived: Instant,
    shape: Shape,
) -> Result<Response, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "the prompt tokenizes to nothing",
        ));
    }
    if prompt.len() > model.ctx {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid_param(
                if kind == Kind::Chat {
                    "messages"
                } else {
                    "prompt"
                },
                format!(
                    "the prompt has {} tokens, more than the context of {} tokens",
                    prompt.len(),
                    model.ctx
                ),
            )
        });
    }
    let n_vocab = model.tokenizer.n_vocab();
    if let Some((bad, _)) = p.logit_bias.iter().find(|(id, _)| *id as usize >= n_vocab) {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!("token id {bad} is out of range (vocabulary of {n_vocab})"),
        ));
    }
    // The last sampled token is never fed back, so a full context still yields one token.
    let room = model.ctx + 1 - prompt.len();
    let max_tokens = p.max_tokens.unwrap_or(room).min(room);
    let (tx, rx) = mpsc::unbounded_channel();
    for i in 0..p.n {
        let grammar = match &shape.grammar {
            Some(g) => Some(Box::new(
                model.grammars.matcher(g.clone(), shape.grammar_param)?,
            )),
            None => None,
        };
        let (job_tx, mut job_rx) = mpsc::unbounded_channel();
        let mut sampling = engine_sampling(&p.sampling);
        sampling.seed = sampling.seed.wrapping_add(i as u64);
        let job = Job {
            prompt: prompt.clone(),
            max_tokens,
            sampling,
            stop: p.stop.clone(),
            logprobs,
            ignore_eog: p.ignore_eos,
            events: job_tx,
            arrived,
            constraint: Constraint {
                logit_bias: p.logit_bias.clone(),
                grammar,
                prompt_logprobs: if shape.echo.is_some() { logprobs } else { None },
                ..Constraint::default()
            },
        };
        model.scheduler.submit(job).map_err(|e| match e {
            SubmitError::QueueFull => ApiError::queue_full(&model.id),
            SubmitError::Stopped => {
                ApiError::unavailable(format!("model `{}` is unloading", model.id))
            }
        })?;
        // Each choice's events, tagged with its index, into the one stream the reply reads;
        // when the reply goes away the forwarder drops the job's receiver, which the
        // scheduler sees.
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = job_rx.recv().await {
                if tx.send((i, ev)).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let reply = Reply {
        id: next_id(kind),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: model.id.clone(),
        kind,
        logprobs: logprobs.is_some(),
        include_usage: p.include_usage,
        n: p.n,
        echo: shape.echo,
        tools: shape.tools,
        think: shape.think,
        think_open: shape.think_open,
    };
    if p.stream {
        let mut headers = HeaderMap::new();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok((
            headers,
            Sse::new(stream(rx, reply)).keep_alive(KeepAlive::default()),
        )
            .into_response())
    } else {
        collect(rx, reply).await
    }
}

/// A request's checked sampling as the engine's sampler takes it.
fn engine_sampling(s: &openai::Sampling) -> SamplingParams {
    SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        seed: s.seed,
        ..SamplingParams::default()
    }
}
