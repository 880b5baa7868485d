//! HTTP routes: the OpenAI endpoints, health, metrics, the API description, admin and the
//! chat page. Handlers parse and check a request, tokenize it, queue it on the model's
//! scheduler and hand its events to [`crate::reply`], which answers in OpenAI's shapes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use smelt_engine::sampler::SamplingParams;
use smelt_tokenizer::{ChatMessage, Tokenizer};
use tokio::sync::mpsc;
use tower_http::catch_panic::CatchPanicLayer;

use crate::error::ApiError;
use crate::models::{self, ModelEntry};
use crate::openai::{self, ChatRequest, CompletionRequest, GenParams, PromptInput};
use crate::reply::{collect, next_id, stream, Kind, Reply};
use crate::scheduler::{Constraint, Job, SubmitError};
use crate::tools::{self, Choice, ToolFormat};
use crate::{assets, grammar, guard, openapi, AppState};

type St = State<Arc<AppState>>;

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/tokenize", post(crate::tokenize::tokenize))
        .route("/detokenize", post(crate::tokenize::detokenize))
        .route("/tokenizer_info", get(crate::tokenize::tokenizer_info))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::api_auth,
        ));
    let admin = Router::new()
        .route("/admin/models", get(admin_list).post(admin_post))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::admin_auth,
        ));
    let metrics =
        Router::new()
            .route("/metrics", get(metrics))
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                guard::metrics_auth,
            ));
    Router::new()
        .merge(api)
        .merge(admin)
        .merge(metrics)
        .route("/health", get(health))
        .route("/live", get(live))
        .route("/openapi.json", get(openapi_json))
        .merge(assets::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the counter, so a caught panic is counted as the 500 it becomes.
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn_with_state(
            Arc::new(smelt_http::guard::Edge {
                hosts: state.hosts.clone(),
                cors: state.config.cors.clone(),
                body_timeout: state.config.body_timeout,
                body_limit: guard::BODY_LIMIT,
            }),
            smelt_http::guard::guard,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), count))
        .with_state(state)
}

/// A handler that panics answers 500 in the error shape instead of dropping the connection.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!("a handler panicked: {why}");
    ApiError::internal(format!("internal error: {why}")).into_response()
}

/// Counts every response by status for `/metrics`, and logs it at debug level.
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let (method, path, t0) = (
        req.method().clone(),
        req.uri().path().to_string(),
        Instant::now(),
    );
    let resp = next.run(req).await;
    st.stats.count_response(resp.status().as_u16());
    // For a stream this is the time to its headers; the scheduler logs the whole request.
    tracing::debug!(
        %method,
        path,
        status = resp.status().as_u16(),
        ms = t0.elapsed().as_secs_f64() * 1e3,
        "http"
    );
    resp
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {} (GET /openapi.json lists the endpoints)",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> Response {
    let mut e = ApiError::bad_request(format!(
        "method {} is not allowed on {}",
        req.method(),
        req.uri().path()
    ));
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e.into_response()
}

/// 200 only while a model can serve: 503 when shutting down or with no model loaded.
async fn health(State(st): St) -> Response {
    let ids: Vec<String> = st.models.list().iter().map(|m| m.id.clone()).collect();
    let status = if st.shutting_down.load(Ordering::SeqCst) {
        "shutting_down"
    } else if ids.is_empty() {
        "no_model"
    } else {
        return Json(json!({"status": "ok", "models": ids})).into_response();
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": status, "models": ids})),
    )
        .into_response()
}

/// Liveness: the process answers, whatever its models.
async fn live() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

async fn metrics(State(st): St) -> Response {
    let models: Vec<_> = st
        .models
        .list()
        .iter()
        .map(|m| (m.id.clone(), Arc::clone(&m.scheduler.stats)))
        .collect();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.stats.render(&models),
    )
        .into_response()
}

async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi::SPEC).into_response()
}

fn model_json(m: &ModelEntry) -> Value {
    json!({"id": m.id, "object": "model", "created": m.created, "owned_by": "smelt"})
}

async fn list_models(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st.models.list().iter().map(|m| model_json(m)).collect();
    Json(json!({"object": "list", "data": data}))
}

async fn get_model(State(st): St, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let m = st
        .models
        .get(Some(&id))
        .ok_or_else(|| ApiError::model_not_found(&id))?;
    Ok(Json(model_json(&m)))
}

/// The loaded models, with the memory limit they share (what a gateway plans loads with).
async fn admin_list(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st.models.list().iter().map(|m| admin_json(m)).collect();
    Json(json!({
        "object": "list",
        "data": data,
        "max_models_bytes": st.config.max_models_bytes,
    }))
}

fn admin_json(m: &ModelEntry) -> Value {
    let s = &m.scheduler.stats;
    json!({
        "id": m.id,
        "object": "model",
        "created": m.created,
        "reference": m.reference,
        "path": m.path.display().to_string(),
        "architecture": m.arch,
        "context": m.ctx,
        "chat_template": m.template.is_ok(),
        "bytes": m.bytes,
        "kv_blocks_total": m.total_blocks,
        "kv_blocks_free": s.kv_blocks_free.load(Ordering::Relaxed),
        "running": s.running.load(Ordering::Relaxed),
        "queue_depth": s.queue_depth.load(Ordering::Relaxed),
    })
}

/// `{"model": path-or-alias, "id"?: ..., "expect_loaded"?: [ids]}` loads;
/// `{"action": "unload", "id": ...}` (or just `{"id": ...}`) unloads. `expect_loaded` makes
/// the load conditional: refused (409 `models_changed`) when the server holds a model not in
/// the list, so a client that planned the load on what it last read of `/admin/models` (one
/// of several gateways) never loads into room another client took meanwhile.
async fn admin_post(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    let v: Value = openai::parse(&body.map_err(body_error)?)?;
    let field = |k: &str| -> Result<Option<String>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid_param(k, format!("{k} must be a string"))),
        }
    };
    let (action, model, id) = (field("action")?, field("model")?, field("id")?);
    let expect = match v.get("expect_loaded") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    ApiError::invalid_param("expect_loaded", "expect_loaded must list model ids")
                })?,
        ),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "expect_loaded",
                "expect_loaded must list model ids",
            ))
        }
    };
    let action = match (action.as_deref(), &model) {
        (Some(a), _) => a.to_string(),
        (None, Some(_)) => "load".into(),
        (None, None) => "unload".into(),
    };
    match action.as_str() {
        "load" => {
            let model = model.ok_or_else(|| {
                ApiError::invalid_param("model", "load needs `model`: a GGUF path or an alias")
            })?;
            let m = admin_load(&st, &model, id, expect).await?;
            Ok(Json(json!({"loaded": admin_json(&m)})))
        }
        "unload" => {
            let id = id.ok_or_else(|| ApiError::invalid_param("id", "unload needs `id`"))?;
            st.models
                .remove(&id)
                .ok_or_else(|| ApiError::model_not_found(&id))?;
            tracing::info!(model = %id, "unloaded");
            Ok(Json(json!({"unloaded": id})))
        }
        other => Err(ApiError::invalid_param(
            "action",
            format!("unknown action {other:?} (load or unload)"),
        )),
    }
}

/// A load asked for through `/admin/models`: a checked id, a reference inside the allowed
/// places, one load at a time within the memory limit and, with `expect`, only while the
/// server holds no model outside it; errors say what failed but never quote the file (the
/// server log has the loader's own words).
async fn admin_load(
    st: &Arc<AppState>,
    reference: &str,
    id: Option<String>,
    expect: Option<Vec<String>>,
) -> Result<Arc<ModelEntry>, ApiError> {
    if let Some(id) = &id {
        models::check_id(id).map_err(|e| ApiError::invalid_param("id", e))?;
    }
    let target = st.confine.check(reference)?;
    let _one = st.loading.lock().await;
    if let Some(expect) = &expect {
        // Checked under the load lock: no other load can slip in between check and load.
        let unexpected: Vec<String> = st
            .models
            .list()
            .iter()
            .map(|m| m.id.clone())
            .filter(|m| !expect.contains(m) && Some(m) != id.as_ref())
            .collect();
        if !unexpected.is_empty() {
            return Err(ApiError {
                status: StatusCode::CONFLICT,
                code: Some("models_changed"),
                ..ApiError::invalid_param(
                    "expect_loaded",
                    format!(
                        "the server holds models this load did not expect ({}): read \
                         /admin/models again and decide anew",
                        guard::clip(&unexpected.join(", "), 200)
                    ),
                )
            });
        }
    }
    let used = || st.models.list().iter().map(|m| m.bytes).sum::<u64>();
    let over = |need: u64| -> Option<ApiError> {
        let cap = st.config.max_models_bytes?;
        let used = used();
        (used.saturating_add(need) > cap).then(|| ApiError {
            status: StatusCode::CONFLICT,
            code: Some("memory_limit"),
            ..ApiError::invalid_param(
                "model",
                format!(
                    "loading `{}` would take the models' memory past the server's limit \
                     ({} MiB used of {} MiB, about {} MiB more needed): unload a model first",
                    guard::clip(reference, 100),
                    used >> 20,
                    cap >> 20,
                    need >> 20
                ),
            )
        })
    };
    // Before loading, the file's size (weights); after, the model's own estimate with its KV
    // cache.
    let on_disk = std::fs::metadata(&target)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len());
    if let Some(e) = over(on_disk) {
        return Err(e);
    }
    let m = load_inner(st, &target, reference, id).await.map_err(|e| {
        if e.status != StatusCode::BAD_REQUEST || e.code == Some("model_exists") {
            return e;
        }
        tracing::warn!(model = %reference, "admin load failed: {}", e.message);
        ApiError::invalid_param(
            "model",
            format!(
                "cannot load `{}`: it is not a model this server can load (the server log \
                 says why)",
                guard::clip(reference, 100)
            ),
        )
    })?;
    let others = used().saturating_sub(m.bytes);
    if let Some(cap) = st.config.max_models_bytes {
        if others.saturating_add(m.bytes) > cap {
            st.models.remove(&m.id);
            return Err(over(m.bytes).unwrap_or_else(|| ApiError {
                status: StatusCode::CONFLICT,
                code: Some("memory_limit"),
                ..ApiError::invalid_param("model", "the models' memory limit is reached")
            }));
        }
    }
    Ok(m)
}

/// Loads a model on its own scheduler thread and starts serving it.
pub(crate) async fn load_model(
    st: &Arc<AppState>,
    reference: &str,
    id: Option<String>,
) -> Result<Arc<ModelEntry>, ApiError> {
    load_inner(st, reference, reference, id).await
}

/// Loads `target` (what `reference` resolved to), serving it under `id` or the reference's
/// default id.
async fn load_inner(
    st: &Arc<AppState>,
    target: &str,
    reference: &str,
    id: Option<String>,
) -> Result<Arc<ModelEntry>, ApiError> {
    let id = id.unwrap_or_else(|| models::model_id(reference));
    if st.models.get(Some(&id)).is_some() {
        return Err(ApiError {
            code: Some("model_exists"),
            ..ApiError::invalid_param("id", format!("a model with id `{id}` is already loaded"))
        });
    }
    let (loader, r, ctx, cfg, tmpl, prefix) = (
        Arc::clone(&st.loader),
        target.to_string(),
        st.config.ctx,
        st.config.scheduler,
        st.config.chat_template.clone(),
        st.config.prefix_cache,
    );
    let id2 = id.clone();
    let t0 = Instant::now();
    let entry =
        tokio::task::spawn_blocking(move || models::load(&loader, &r, id2, ctx, cfg, tmpl, prefix))
            .await
            .map_err(|e| ApiError::internal(format!("the loading task failed: {e}")))?
            .map_err(|e| ApiError::invalid_param("model", e))?;
    let e = st.models.insert(entry).map_err(ApiError::bad_request)?;
    tracing::info!(
        model = %e.id,
        path = %e.path.display(),
        seconds = t0.elapsed().as_secs_f64(),
        "loaded"
    );
    Ok(e)
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

pub(crate) fn model_for(st: &AppState, id: Option<&str>) -> Result<Arc<ModelEntry>, ApiError> {
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    st.models.get(id).ok_or_else(|| match id {
        Some(id) => ApiError::model_not_found(id),
        None => ApiError::unavailable("no model is loaded"),
    })
}

/// llama.cpp's tokenization of a prompt, as `smelt run` does it: BOS as the GGUF says; a
/// chat prompt has its special tokens parsed (except in the `plain` ranges: message content)
/// and keeps one BOS when the template already wrote its text.
fn tokenize(tok: &Tokenizer, text: &str, chat: bool, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
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

/// A request body, or why it could not be read (too big, cut off).
pub(crate) type Body = Result<Bytes, BytesRejection>;

/// An unreadable body in the error shape, with the status axum chose (413 when too big).
pub(crate) fn body_error(r: BytesRejection) -> ApiError {
    let mut e = ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()));
    e.status = r.status();
    e
}

async fn chat(State(st): St, body: Body) -> Response {
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

async fn completions(State(st): St, body: Body) -> Response {
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

/// Whether a rendered chat prompt ends inside an opened `<think>` block (DeepSeek-R1's and
/// QwQ's templates open it in the generation prompt): its last tokens' text, special tokens
/// rendered.
fn opens_think(tok: &Tokenizer, ids: &[u32]) -> bool {
    let tail = &ids[ids.len().saturating_sub(16)..];
    String::from_utf8_lossy(&tok.detokenize(tail, false, true))
        .trim_end()
        .ends_with("<think>")
}

/// How a request's answer is shaped beyond sampling: echo, tool calls, reasoning, a grammar.
struct Shape {
    /// Completions' echo: the prompt's text.
    echo: Option<String>,
    tools: Option<ToolFormat>,
    think: bool,
    /// The prompt ends inside a `<think>` block the template opened.
    think_open: bool,
    grammar: Option<llguidance::api::TopLevelGrammar>,
    /// The field a grammar that does not compile is blamed on.
    grammar_param: &'static str,
}

/// Checks the prompt against the context, queues one job per choice, and answers.
async fn run(
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
