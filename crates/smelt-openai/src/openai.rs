//! The OpenAI request bodies we accept and how they become generation parameters.
//!
//! A field smelt does not know or does not implement is a 400 naming it (a client must never
//! believe a setting took effect when it did not; a `null` value counts as absent); known
//! fields with a wrong type or an out-of-range value are a 400 naming the field too. A few
//! extensions that llama.cpp and vLLM accept (`top_k`, `min_p`, `repetition_penalty`,
//! `ignore_eos`, token-id prompts) are honoured.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// Fields shared by chat and text completions.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    /// Keep generating past end-of-generation tokens (benchmarks; vLLM's name).
    pub ignore_eos: Option<bool>,
    /// Token id (as a string) -> bias added to its logit, -100 to 100; -100 bans the token.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// The end user, for the caller's own abuse tracking: accepted and not used.
    pub user: Option<String>,
}

/// Fields every generation endpoint takes (those of [`Common`]).
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "ignore_eos",
    "logit_bias",
    "user",
];

/// Chat's own fields, besides [`COMMON_FIELDS`].
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Completions' own fields, besides [`COMMON_FIELDS`].
pub const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "best_of", "suffix"];

/// What a chat message may hold.
const MESSAGE_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "refusal",
];

/// A 400 naming the first field of `v` (an object) that is neither in `own` nor common,
/// unless its value is null. `prefix` names where the object sits (`messages[2].`).
pub fn unknown_fields(
    v: &Value,
    own: &[&str],
    common: &[&str],
    prefix: &str,
) -> Result<(), ApiError> {
    let Some(map) = v.as_object() else {
        return Ok(());
    };
    for (k, val) in map {
        if val.is_null() || own.contains(&k.as_str()) || common.contains(&k.as_str()) {
            continue;
        }
        return Err(ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid_param(
                &format!("{prefix}{k}"),
                format!(
                    "`{prefix}{k}` is not supported by this server (it would be ignored, so the \
                     request is refused): remove it"
                ),
            )
        });
    }
    Ok(())
}

/// Parses a chat body, refusing fields it does not implement.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let v: Value = parse(body)?;
    unknown_fields(&v, CHAT_FIELDS, COMMON_FIELDS, "")?;
    if let Some(msgs) = v.get("messages").and_then(Value::as_array) {
        for (i, m) in msgs.iter().enumerate() {
            unknown_fields(m, MESSAGE_FIELDS, &[], &format!("messages[{i}]."))?;
        }
    }
    from_value(v)
}

/// Parses a completions body, refusing fields it does not implement.
pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let v: Value = parse(body)?;
    unknown_fields(&v, COMPLETION_FIELDS, COMMON_FIELDS, "")?;
    from_value(v)
}

pub fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| {
        ApiError::bad_request(format!("the body does not match the request schema: {e}"))
    })
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// `{"type": "text" | "json_object" | "json_schema" | "regex" | "grammar", ...}`.
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    /// An assistant message's earlier calls: `[{id, type: "function", function: {name,
    /// arguments}}]`.
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message answers this call.
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// How many alternatives to report per token (0 to 20); absent or null: none.
    pub logprobs: Option<i64>,
    /// Answer the prompt's text before the completion (with its tokens' log-probabilities
    /// when `logprobs` is set: what evaluation harnesses score).
    pub echo: Option<bool>,
    /// Only 1 or equal to `n` is served (no server-side best-of ranking).
    pub best_of: Option<i64>,
    /// Text after the insertion point: no fill-in-the-middle here, so only "" is served.
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub common: Common,
}

/// A completion prompt: text, or token ids, alone or in a one-element list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// Text or token ids, once the one-element-list forms are unwrapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

impl Prompt {
    /// One prompt per request: batching prompts in one request is not served.
    pub fn single(self) -> Result<PromptInput, ApiError> {
        let many = || {
            ApiError::invalid_param(
                "prompt",
                "only one prompt per request is supported: send several requests",
            )
        };
        match self {
            Prompt::Text(t) => Ok(PromptInput::Text(t)),
            Prompt::Ids(ids) => Ok(PromptInput::Ids(ids)),
            Prompt::Texts(mut v) => match v.len() {
                1 => Ok(PromptInput::Text(v.remove(0))),
                0 => Err(ApiError::invalid_param(
                    "prompt",
                    "the prompt list is empty",
                )),
                _ => Err(many()),
            },
            Prompt::IdLists(mut v) => match v.len() {
                1 => Ok(PromptInput::Ids(v.remove(0))),
                0 => Err(ApiError::invalid_param(
                    "prompt",
                    "the prompt list is empty",
                )),
                _ => Err(many()),
            },
        }
    }
}

/// The sampling a request asks for, checked (the engine's sampler takes these as they are;
/// what a request cannot set keeps the sampler's default).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// 0 keeps all.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    /// 1 is off.
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

/// What a request asks of generation, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub model: Option<String>,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Choices to generate (each with seed `seed + i`).
    pub n: usize,
    /// (token id, bias) pairs, ids not yet checked against a vocabulary.
    pub logit_bias: Vec<(u32, f32)>,
}

/// Most choices per request.
pub const MAX_N: i64 = 16;

fn range(param: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid_param(
            param,
            format!("{param} must be between {lo} and {hi} (got {x})"),
        )),
    }
}

impl Common {
    /// Checks every field and builds the sampler's parameters. A missing seed is drawn from
    /// the clock, so unseeded sampling differs between requests as users expect.
    /// `zero_tokens`: `max_tokens` may be 0 (completions' echo, to score a prompt only).
    pub fn params(&self, zero_tokens: bool) -> Result<GenParams, ApiError> {
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid_param(
                    "n",
                    format!("n must be between 1 and {MAX_N} (got {n})"),
                ))
            }
        };
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => Some(("max_completion_tokens", m)),
            (None, Some(m)) => Some(("max_tokens", m)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((param, m)) if m < 1 && !(zero_tokens && m == 0) => {
                return Err(ApiError::invalid_param(
                    param,
                    format!("{param} must be at least 1 (got {m})"),
                ))
            }
            Some((_, m)) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => None,
        };
        let temperature = range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(1.0);
        let top_p = match self.top_p {
            Some(p) if !(p > 0.0 && p <= 1.0) => {
                return Err(ApiError::invalid_param(
                    "top_p",
                    format!("top_p must be in (0, 1] (got {p})"),
                ))
            }
            Some(p) => p as f32,
            None => 1.0,
        };
        let top_k = match self.top_k {
            Some(k) if k < 0 => {
                return Err(ApiError::invalid_param(
                    "top_k",
                    "top_k must be 0 (off) or more",
                ))
            }
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
            None => 0,
        };
        let min_p = range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(0.0);
        let presence = range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        let frequency = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let repeat = range("repetition_penalty", self.repetition_penalty, 0.01, 10.0)?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let seed = match self.seed {
            Some(s) => s as u64,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        };
        Ok(GenParams {
            model: self.model.clone(),
            max_tokens,
            sampling: Sampling {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty: repeat.unwrap_or(1.0),
                presence_penalty: presence.unwrap_or(0.0),
                frequency_penalty: frequency.unwrap_or(0.0),
                seed,
            },
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            n,
            logit_bias: self.logit_bias()?,
        })
    }
}

impl Common {
    fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(map.len());
        for (k, &b) in map {
            let id: u32 = k.trim().parse().map_err(|_| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias keys are token ids as strings (got {k:?})"),
                )
            })?;
            if !(b.is_finite() && (-100.0..=100.0).contains(&b)) {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("a logit_bias value must be between -100 and 100 (got {b} for {k})"),
                ));
            }
            out.push((id, b as f32));
        }
        Ok(out)
    }
}

impl ChatMessageIn {
    /// The message's text: a string, or its text parts joined by newlines.
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        let param = format!("messages[{index}].content");
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        ("text", None) => {
                            return Err(ApiError::invalid_param(
                                &param,
                                "a text part needs a `text` field",
                            ))
                        }
                        (other, _) => {
                            return Err(ApiError::invalid_param(
                                &param,
                                format!("content parts of type {other:?} are not supported"),
                            ))
                        }
                    }
                }
                Ok(texts.join("\n"))
            }
        }
    }
}

/// Parses a JSON body, turning serde's complaint into a 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the body does not match the request schema"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenParams, ApiError> {
        parse_chat(body.as_bytes())?.common.params(false)
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let p = chat(r#"{"model":"m","messages":[],"whatever":null,"user":"u"}"#).unwrap();
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.n, 1);
        assert!(!p.stream);
        for (body, param) in [
            (r#"{"messages":[],"whatever":{"x":1}}"#, "whatever"),
            (r#"{"messages":[],"functions":[]}"#, "functions"),
            (
                r#"{"messages":[{"role":"user","content":"hi","audio":{}}]}"#,
                "messages[0].audio",
            ),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
        }
        let e = parse_completion(br#"{"prompt":"a","suffix2":"b"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("suffix2"));
        assert!(parse_completion(br#"{"prompt":"a","echo":true,"best_of":1}"#).is_ok());
    }

    #[test]
    fn n_and_logit_bias() {
        let p = chat(r#"{"messages":[],"n":3,"logit_bias":{"7":-100,"12":2.5}}"#).unwrap();
        assert_eq!(p.n, 3);
        assert_eq!(p.logit_bias, vec![(12, 2.5), (7, -100.0)]);
        for body in [
            r#"{"messages":[],"logit_bias":{"x":1}}"#,
            r#"{"messages":[],"logit_bias":{"1":101}}"#,
        ] {
            assert_eq!(chat(body).unwrap_err().param.as_deref(), Some("logit_bias"));
        }
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        for (body, param) in [
            (r#"{"messages":[],"temperature":2.5}"#, "temperature"),
            (r#"{"messages":[],"temperature":-0.1}"#, "temperature"),
            (r#"{"messages":[],"top_p":0}"#, "top_p"),
            (r#"{"messages":[],"top_p":1.5}"#, "top_p"),
            (r#"{"messages":[],"max_tokens":0}"#, "max_tokens"),
            (
                r#"{"messages":[],"max_completion_tokens":-3}"#,
                "max_completion_tokens",
            ),
            (r#"{"messages":[],"n":0}"#, "n"),
            (r#"{"messages":[],"n":17}"#, "n"),
            (
                r#"{"messages":[],"presence_penalty":3}"#,
                "presence_penalty",
            ),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn bad_json_and_bad_types_are_400() {
        assert!(chat("{").unwrap_err().message.contains("not valid JSON"));
        let e = chat(r#"{"messages":[],"temperature":"hot"}"#).unwrap_err();
        assert!(e.message.contains("schema"), "{}", e.message);
        assert!(chat(r#"{"messages":"hi"}"#).is_err());
    }

    #[test]
    fn stop_and_max_tokens_forms() {
        let p = chat(r#"{"messages":[],"stop":"\n","max_tokens":5}"#).unwrap();
        assert_eq!(p.stop, vec!["\n"]);
        assert_eq!(p.max_tokens, Some(5));
        let p =
            chat(r#"{"messages":[],"stop":["a","b"],"max_tokens":5,"max_completion_tokens":7}"#)
                .unwrap();
        assert_eq!(p.stop, vec!["a", "b"]);
        assert_eq!(p.max_tokens, Some(7));
        let p = chat(r#"{"messages":[],"seed":42,"temperature":0}"#).unwrap();
        assert_eq!(p.sampling.seed, 42);
        assert_eq!(p.sampling.temperature, 0.0);
    }

    #[test]
    fn content_parts_join() {
        let r: ChatRequest = parse_chat(
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0].text(0).unwrap(), "a\nb");
        let r: ChatRequest =
            parse_chat(br#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
                .unwrap();
        assert_eq!(r.messages[0].text(0).unwrap_err().status, 400);
    }

    #[test]
    fn prompts() {
        let one = |b: &str| parse_completion(b.as_bytes()).unwrap().prompt.single();
        assert_eq!(
            one(r#"{"prompt":"hi"}"#).unwrap(),
            PromptInput::Text("hi".into())
        );
        assert_eq!(
            one(r#"{"prompt":["hi"]}"#).unwrap(),
            PromptInput::Text("hi".into())
        );
        assert_eq!(
            one(r#"{"prompt":[1,2]}"#).unwrap(),
            PromptInput::Ids(vec![1, 2])
        );
        assert_eq!(one(r#"{"prompt":["a","b"]}"#).unwrap_err().status, 400);
    }
}
