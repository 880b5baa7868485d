//! vLLM's tokenizer endpoints, which clients use to count and build prompts in the server's
//! own token ids: `POST /tokenize` (`{"prompt", "add_special_tokens"}` -> `{"tokens",
//! "count", "max_model_len"}`), `POST /detokenize` (`{"tokens"}` -> `{"prompt"}`) and
//! `GET /tokenizer_info` (BOS/EOS text, chat template, context length). lm-eval's
//! `tokenizer_backend=remote` scores log-likelihoods through them, with no tokenizer of its own.
//!
//! As vLLM (a Hugging Face tokenizer): special-token text in the prompt becomes its token, and
//! `add_special_tokens` (default true) adds BOS as the GGUF says; detokenize renders control
//! tokens as their text.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai;
use crate::routes::{body_error, model_for, Body};
use crate::AppState;

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: String,
    add_special_tokens: Option<bool>,
    return_token_strs: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ModelQuery {
    model: Option<String>,
}

pub(crate) async fn tokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    match body {
        Ok(body) => tokenize_inner(&st, &body),
        Err(r) => Err(body_error(r)),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

fn tokenize_inner(st: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v: Value = openai::parse(body)?;
    if v.get("messages").is_some() {
        return Err(ApiError::invalid_param(
            "messages",
            "tokenizing chat messages is not supported: render the template and send `prompt`",
        ));
    }
    openai::unknown_fields(
        &v,
        &["model", "prompt", "add_special_tokens", "return_token_strs"],
        &[],
        "",
    )?;
    let req: TokenizeRequest = openai::from_value(v)?;
    let model = model_for(st, req.model.as_deref())?;
    let tok = &model.tokenizer;
    let tokens = tok.encode(&req.prompt, req.add_special_tokens.unwrap_or(true), true);
    let mut out = json!({
        "count": tokens.len(),
        "max_model_len": model.ctx,
        "tokens": tokens,
    });
    if req.return_token_strs == Some(true) {
        let strs: Vec<String> = tokens
            .iter()
            .map(|&t| String::from_utf8_lossy(&tok.piece(t, true)).into_owned())
            .collect();
        out["token_strs"] = json!(strs);
    }
    Ok(Json(out).into_response())
}

pub(crate) async fn detokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    match body {
        Ok(body) => detokenize_inner(&st, &body),
        Err(r) => Err(body_error(r)),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

fn detokenize_inner(st: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v: Value = openai::parse(body)?;
    openai::unknown_fields(&v, &["model", "tokens"], &[], "")?;
    let req: DetokenizeRequest = openai::from_value(v)?;
    let model = model_for(st, req.model.as_deref())?;
    let n = model.tokenizer.n_vocab();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= n) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is out of range (vocabulary of {n})"),
        ));
    }
    let bytes = model.tokenizer.detokenize(&req.tokens, false, true);
    Ok(Json(json!({"prompt": String::from_utf8_lossy(&bytes)})).into_response())
}

pub(crate) async fn tokenizer_info(
    State(st): State<Arc<AppState>>,
    Query(q): Query<ModelQuery>,
) -> Response {
    match model_for(&st, q.model.as_deref()) {
        Ok(model) => {
            let tok = &model.tokenizer;
            let text = |t: Option<u32>| {
                t.map(|t| String::from_utf8_lossy(&tok.piece(t, true)).into_owned())
            };
            Json(json!({
                "model": model.id,
                "bos_token": text(tok.bos()),
                "eos_token": text(tok.eos()),
                "pad_token": Value::Null,
                "add_bos_token": tok.add_bos(),
                "add_eos_token": tok.add_eos(),
                "chat_template": model.template.as_ref().ok().and_then(|t| t.jinja_source()),
                "model_max_length": model.ctx,
                "vocab_size": tok.n_vocab(),
            }))
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}
