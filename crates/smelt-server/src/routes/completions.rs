//! `/v1/completions`: checking a plain completion request (echo, logprobs, `best_of`,
//! `suffix`) and turning its prompt, text or token ids, into prompt tokens. What follows
//! the prompt is [`super::generate`]'s.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::generate::{run, tokenize, Shape};
use super::{body_error, model_for, Body, St};
use crate::error::ApiError;
use crate::openai::{self, CompletionRequest, PromptInput};
use crate::reply::Kind;
use crate::AppState;

pub(super) async fn completions(State(st): St, body: Body) -> Response {
    match body {
        Ok(body) => completions_inner(st, body).await,
        Err(r) => Err(body_error(r)),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

async fn completions_inner(st: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: CompletionRequest = openai::parse_completion(&body)?;
    let echo = req.echo.unwrap_or(false);
    let p = req.common.params(echo)?;
    let logprobs = match req.logprobs {
        Some(n) if !(0..=20).contains(&n) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                "logprobs must be between 0 and 20",
            ))
        }
        Some(n) => Some(n as usize),
        None => None,
    };
    if let Some(b) = req.best_of {
        if b != 1 && b != p.n as i64 {
            return Err(ApiError::invalid_param(
                "best_of",
                "best_of is served only as 1 or equal to n (no server-side ranking)",
            ));
        }
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    let prompt = req.prompt.single()?;
    let model = model_for(&st, p.model.as_deref())?;
    let (ids, text) = match prompt {
        PromptInput::Text(t) => (tokenize(&model.tokenizer, &t, false, &[]), t),
        PromptInput::Ids(ids) => {
            let n = model.tokenizer.n_vocab();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is out of range (vocabulary of {n})"),
                ));
            }
            let text = model.tokenizer.decode(&ids);
            (ids, text)
        }
    };
    let shape = Shape {
        echo: echo.then_some(text),
        tools: None,
        think: false,
        think_open: false,
        grammar: None,
        grammar_param: "",
    };
    run(&model, ids, p, logprobs, Kind::Completion, arrived, shape).await
}
