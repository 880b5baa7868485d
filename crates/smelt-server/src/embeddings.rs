//! `POST /v1/embeddings` in OpenAI's shape: text or token-id inputs, one or a list, each
//! embedded as a sequence of its own, pooled as the GGUF says (`{arch}.pooling_type`: mean,
//! first token or last token; the mean when it says nothing, as `--pooling` may override)
//! and L2-normalized, as llama.cpp's server does; `encoding_format` `float` or `base64`
//! (little-endian f32, what the `openai` client asks for by default).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use smelt_engine::embed::{normalize, FilePooling};
use smelt_engine::Pooling;

use crate::error::ApiError;
use crate::models::ModelEntry;
use crate::openai;
use crate::routes::{body_error, model_for, Body};
use crate::AppState;

/// The request fields smelt implements (`user` is accepted and not used, as OpenAI's).
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// Most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    model: Option<String>,
    input: Input,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    #[allow(dead_code)]
    user: Option<String>,
}

/// What `input` may be: a text, token ids, or a list of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

enum Texts {
    Text(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Input {
    fn list(self) -> Texts {
        match self {
            Input::Text(t) => Texts::Text(vec![t]),
            Input::Texts(v) => Texts::Text(v),
            Input::Ids(ids) => Texts::Ids(vec![ids]),
            Input::IdLists(v) => Texts::Ids(v),
        }
    }
}

/// The pooling `/v1/embeddings` uses for `m`, or why the model cannot embed.
fn pooling(m: &ModelEntry, forced: Option<Pooling>) -> Result<Pooling, ApiError> {
    if let Some(p) = forced {
        return Ok(p);
    }
    let refuse = |why: String| {
        ApiError::invalid_param(
            "model",
            format!(
                "model `{}` cannot give embeddings: {why} (start the server with --pooling \
                 mean|cls|last to pool its hidden states anyway)",
                m.id
            ),
        )
    };
    match m.pooling {
        FilePooling::Pool(p) => Ok(p),
        FilePooling::Unset => Ok(Pooling::Mean),
        FilePooling::Rank => Err(refuse(
            "it is a reranker (pooling_type rank), whose output is a relevance score".into(),
        )),
        FilePooling::Unknown(n) => Err(refuse(format!("its GGUF has pooling_type {n}"))),
    }
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= c.len() {
                ABC[(n >> shift) as usize & 63] as char
            } else {
                '='
            });
        }
    }
    out
}

pub(crate) async fn embeddings(State(st): State<Arc<AppState>>, body: Body) -> Response {
    match body {
        Ok(body) => embeddings_inner(st, body).await,
        Err(r) => Err(body_error(r)),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

async fn embeddings_inner(st: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let v: Value = openai::parse(&body)?;
    openai::unknown_fields(&v, FIELDS, &[], "")?;
    let req: EmbeddingRequest = openai::from_value(v)?;
    let base64_out = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("encoding_format {other:?} is not one of float, base64"),
            ))
        }
    };
    let model = model_for(&st, req.model.as_deref())?;
    let pooling = pooling(&model, st.config.pooling)?;
    if let Some(d) = req.dimensions {
        if usize::try_from(d).ok() != Some(model.n_embd) {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!(
                    "model `{}` gives embeddings of {} dimensions only (shortened ones are not \
                     supported)",
                    model.id, model.n_embd
                ),
            ));
        }
    }
    let inputs: Vec<Vec<u32>> = match req.input.list() {
        Texts::Text(texts) => {
            if let Some(i) = texts.iter().position(String::is_empty) {
                return Err(ApiError::invalid_param(
                    "input",
                    format!("input {i} is an empty string"),
                ));
            }
            // As llama.cpp: BOS as the GGUF says, special-token text stays text.
            texts
                .iter()
                .map(|t| model.tokenizer.encode(t, true, false))
                .collect()
        }
        Texts::Ids(ids) => ids,
    };
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!(
                "input must hold 1 to {MAX_INPUTS} items (it has {})",
                inputs.len()
            ),
        ));
    }
    for (i, ids) in inputs.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::invalid_param(
                "input",
                format!("input {i} has no tokens"),
            ));
        }
        if ids.len() > model.ctx {
            return Err(ApiError::invalid_param(
                "input",
                format!(
                    "input {i} has {} tokens, more than the context of {} (--ctx)",
                    ids.len(),
                    model.ctx
                ),
            ));
        }
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = model.scheduler.embed(inputs, pooling).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            normalize(&mut e);
            let embedding = if base64_out {
                let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64(&bytes))
            } else {
                json!(e)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
        assert_eq!(base64(&1.0f32.to_le_bytes()), "AACAPw==");
    }
}
