//! `/v1/chat/completions`: checking a chat request (messages, tools and `tool_choice`,
//! `response_format`, logprobs) and rendering it through the model's chat template into
//! prompt tokens, with special-token text in message content kept as plain text. What
//! follows the prompt is [`super::generate`]'s.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use smelt_tokenizer::{ChatMessage, Tokenizer};

use super::generate::{run, tokenize, Shape};
use super::{body_error, model_for, Body, St};
use crate::error::ApiError;
use crate::models::ModelEntry;
use crate::openai::{self, ChatRequest};
use crate::reply::Kind;
use crate::tools::{self, Choice};
use crate::{grammar, AppState};

pub(super) async fn chat(State(st): St, body: Body) -> Response {
    match body {
        Ok(body) => chat_inner(st, body).await,
        Err(r) => Err(body_error(r)),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_inner(st: Arc<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: ChatRequest = openai::parse_chat(&body)?;
    let p = req.common.params(false)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(n)) if !(0..=20).contains(&n) => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs must be between 0 and 20",
            ))
        }
        (Some(true), n) => Some(n.unwrap_or(0) as usize),
        _ => None,
    };
    let model = model_for(&st, p.model.as_deref())?;
    let template = model.template.as_ref().map_err(|e| {
        ApiError::bad_request(format!(
            "model `{}` cannot do chat completions ({e}): use /v1/completions",
            model.id
        ))
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let tool_list = req.tools.clone().unwrap_or_default();
    tools::check(&tool_list)?;
    let choice = tools::choice(req.tool_choice.as_ref(), &tool_list)?;
    let tool_format = match (&choice, model.tool_format) {
        (Choice::None, _) => None,
        (_, Some(f)) => Some(f),
        (_, None) => {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "model `{}`'s chat template shows no tool-call format (Qwen/Hermes \
                     <tool_call>, Llama 3.1 JSON, Mistral [TOOL_CALLS]): start the server with \
                     a --chat-template that has one",
                    model.id
                ),
            ))
        }
    };
    let mut grammar = match &req.response_format {
        Some(rf) => grammar::response_format(rf)?,
        None => None,
    };
    if let Some(f) = tool_format {
        let only = match &choice {
            Choice::Named(n) => Some(n.as_str()),
            Choice::Required => None,
            _ => None,
        };
        if matches!(choice, Choice::Required | Choice::Named(_)) {
            if grammar.is_some() {
                return Err(ApiError::invalid_param(
                    "response_format",
                    "response_format cannot be combined with a required or named tool_choice",
                ));
            }
            let parallel = req.parallel_tool_calls.unwrap_or(true) && only.is_none();
            // A marker the vocabulary holds as a control token (Mistral's [TOOL_CALLS])
            // is forced as that token, the one the model was trained to write.
            let tok = &model.tokenizer;
            let control = |t: &str| tok.token_id(t).filter(|&id| tok.is_control(id));
            grammar = Some(tools::grammar(f, &tool_list, only, parallel, &control));
        }
    }
    // With tool_choice none the template still lists the tools (as vLLM does), and the
    // answer is read as plain text.
    let render_tools = model.tool_format.is_some() && !tool_list.is_empty();
    let mut msgs = Vec::with_capacity(req.messages.len());
    let mut rich = render_tools;
    let mut json_msgs = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!("role {other:?} is not supported (system, user, assistant, tool)"),
                ))
            }
        };
        let text = m.text(i)?;
        rich |= role == "tool" || m.tool_calls.is_some();
        json_msgs.push(tools::message_json(role, &text, m));
        msgs.push(ChatMessage::new(role, text));
    }
    let failed = |e| ApiError::bad_request(format!("the chat template failed: {e}"));
    let ids = if rich {
        // Tools and tool messages go through the template as OpenAI objects; where their
        // content lands is not marked, so special-token text in it is refused unless allowed.
        if !st.config.allow_special_in_content {
            special_text_check(&model, &msgs)?;
        }
        let tools_arg = render_tools.then_some(&tool_list[..]);
        let text = template
            .render_json(&json_msgs, tools_arg, true)
            .map_err(failed)?;
        tokenize(&model.tokenizer, &text, true, &[])
    } else if st.config.allow_special_in_content {
        let text = template.render(&msgs, true).map_err(failed)?;
        tokenize(&model.tokenizer, &text, true, &[])
    } else {
        match template.render_marked(&msgs, true).map_err(failed)? {
            Some((text, content)) => tokenize(&model.tokenizer, &text, true, &content),
            None => {
                // The template cuts content apart, so where it lands is unknown: served only
                // when no message holds special-token text.
                special_text_check(&model, &msgs)?;
                let text = template.render(&msgs, true).map_err(failed)?;
                tokenize(&model.tokenizer, &text, true, &[])
            }
        }
    };
    let think_open = model.think && opens_think(&model.tokenizer, &ids);
    let shape = Shape {
        echo: None,
        tools: tool_format,
        think: model.think,
        think_open,
        grammar,
        grammar_param: "response_format",
    };
    run(&model, ids, p, logprobs, Kind::Chat, arrived, shape).await
}

/// Special-token text in a message is refused where the prompt's content ranges are unknown.
fn special_text_check(model: &ModelEntry, msgs: &[ChatMessage]) -> Result<(), ApiError> {
    match msgs
        .iter()
        .position(|m| model.tokenizer.has_special_text(&m.content))
    {
        Some(i) => Err(ApiError::invalid_param(
            &format!("messages[{i}].content"),
            "this model's chat template rearranges message content, so special-token \
             text in it cannot be kept as plain text: remove it (or start the server \
             with --allow-special-in-content)",
        )),
        None => Ok(()),
    }
}

/// Whether a rendered chat prompt ends inside an opened `<think>` block (DeepSeek-R1's and
/// QwQ's templates open it in the generation prompt): its last tokens' text, special tokens
/// rendered.
fn opens_think(tok: &Tokenizer, ids: &[u32]) -> bool {
    let tail = &ids[ids.len().saturating_sub(16)..];
    String::from_utf8_lossy(&tok.detokenize(tail, false, true))
        .trim_end()
        .ends_with("<think>")
}
