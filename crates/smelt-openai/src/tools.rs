//! Tool calling: which format a model writes its calls in (found from its chat template),
//! turning that text into OpenAI `tool_calls`, the grammar that forces a call when
//! `tool_choice` is `required` or names a function, and `<think>` text split off as
//! `reasoning_content`.
//!
//! Formats: Qwen/Hermes (`<tool_call>{"name", "arguments"}</tool_call>`, one block per call),
//! Llama 3.1+ (a bare `{"name", "parameters"}` object, optionally after `<|python_tag|>`;
//! several separated by `;`), Mistral (`[TOOL_CALLS]` then a JSON list of `{"name",
//! "arguments"}`).

use std::sync::atomic::{AtomicU64, Ordering};

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::error::ApiError;

/// How a model family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
}

impl ToolFormat {
    /// The format a chat template's source asks for; `None` when it shows no tool support.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|start_header_id|>")
            && template.contains("tools")
            && template.contains("parameters")
        {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// Text that starts a call in this format (the stream holds content back from here).
    pub fn marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "{",
        }
    }
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `arguments` is a string).
    pub arguments: String,
}

pub fn call_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("call_{:016x}", t.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n)
}

/// A call object `{"name", "arguments"|"parameters"}` as a [`ToolCall`].
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall {
        id: call_id(),
        name,
        arguments,
    })
}

/// Splits a finished answer into its content and its tool calls. Text that does not parse
/// as calls stays content. Arguments are the model's own JSON text without the whitespace
/// outside strings (what a stream sends in pieces: [`crate::tool_stream`]).
pub fn parse(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
    let (content, mut calls) = parse_values(format, text);
    let raw = crate::tool_stream::scan(format, text);
    if raw.len() == calls.len() {
        for (c, r) in calls.iter_mut().zip(raw) {
            if let (Some(name), Some(args), true) = (r.name, r.arguments, r.arguments_done) {
                if name == c.name {
                    c.arguments = args;
                }
            }
        }
    }
    (content, calls)
}

fn parse_values(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
    match format {
        ToolFormat::Hermes => {
            let mut content = String::new();
            let mut calls = Vec::new();
            let mut rest = text;
            while let Some(start) = rest.find("<tool_call>") {
                let after = &rest[start + "<tool_call>".len()..];
                let (body, next) = match after.find("</tool_call>") {
                    Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
                    None => (after, ""),
                };
                match serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .as_ref()
                    .and_then(call_of)
                {
                    Some(c) => {
                        content.push_str(&rest[..start]);
                        calls.push(c);
                    }
                    None => content.push_str(&rest[..rest.len() - next.len()]),
                }
                rest = next;
            }
            content.push_str(rest);
            (content.trim().to_string(), calls)
        }
        ToolFormat::Mistral => {
            let Some(start) = text.find("[TOOL_CALLS]") else {
                return (text.to_string(), Vec::new());
            };
            let body = text[start + "[TOOL_CALLS]".len()..].trim();
            let calls: Vec<ToolCall> = match serde_json::from_str::<Value>(body) {
                Ok(Value::Array(items)) => items.iter().filter_map(call_of).collect(),
                Ok(v) => call_of(&v).into_iter().collect(),
                Err(_) => return cut_off(format, text, &text[..start]),
            };
            if calls.is_empty() {
                return (text.to_string(), Vec::new());
            }
            (text[..start].trim().to_string(), calls)
        }
        ToolFormat::Llama3 => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            if !body.starts_with('{') {
                return (text.to_string(), Vec::new());
            }
            // One object, or several separated by `;` (a `;` inside a string would split
            // wrongly, so the whole text is tried first).
            if let Some(c) = serde_json::from_str::<Value>(body)
                .ok()
                .as_ref()
                .and_then(call_of)
            {
                return (String::new(), vec![c]);
            }
            let mut calls = Vec::new();
            for part in body.split(';') {
                match serde_json::from_str::<Value>(part.trim())
                    .ok()
                    .as_ref()
                    .and_then(call_of)
                {
                    Some(c) => calls.push(c),
                    None => return cut_off(format, text, ""),
                }
            }
            (String::new(), calls)
        }
    }
}

/// An answer whose calls do not all parse, most often because `max_tokens` cut the last
/// one off: its complete calls, and the unfinished rest as content after `before` (the
/// text before the calls), as the Hermes reader keeps an unfinished `<tool_call>`.
fn cut_off(format: ToolFormat, text: &str, before: &str) -> (String, Vec<ToolCall>) {
    let (done, rest) = crate::tool_stream::complete_calls(format, text);
    if done.is_empty() {
        return (text.to_string(), Vec::new());
    }
    let calls = done
        .into_iter()
        .map(|(name, arguments)| ToolCall {
            id: call_id(),
            name,
            arguments,
        })
        .collect();
    let content = [before.trim(), text[rest..].trim()]
        .iter()
        .filter(|t| !t.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    (content, calls)
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Auto,
    None,
    Required,
    Named(String),
}

/// Reads `tool_choice` (absent: `auto` with tools, `none` without).
pub fn choice(v: Option<&Value>, tools: &[Value]) -> Result<Choice, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tool_choice", m);
    let c = match v {
        None | Some(Value::Null) => {
            if tools.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => Choice::None,
            "required" => Choice::Required,
            other => return Err(bad(format!("unknown tool_choice {other:?}"))),
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                })?;
            if !tools.iter().any(|t| tool_name(t) == Some(name)) {
                return Err(bad(format!(
                    "tool_choice names {name:?}, which is not in tools"
                )));
            }
            Choice::Named(name.to_string())
        }
    };
    if matches!(c, Choice::Required | Choice::Named(_)) && tools.is_empty() {
        return Err(bad("tool_choice needs tools".into()));
    }
    Ok(c)
}

fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}

/// Checks `tools`: function tools with a name (and an object schema for parameters).
pub fn check(tools: &[Value]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid_param(
                &p,
                "only tools of type \"function\" are supported",
            ));
        }
        if tool_name(t).is_none() {
            return Err(ApiError::invalid_param(
                &format!("{p}.function.name"),
                "a function tool needs a name",
            ));
        }
        if let Some(params) = t.get("function").and_then(|f| f.get("parameters")) {
            if !params.is_object() {
                return Err(ApiError::invalid_param(
                    &format!("{p}.function.parameters"),
                    "parameters must be a JSON schema object",
                ));
            }
        }
    }
    Ok(())
}

/// A message as the chat template sees it: OpenAI's fields, with each earlier call's
/// `arguments` as an object (templates write them with `tojson`, as Hugging Face's do).
pub fn message_json(role: &str, content: &str, m: &crate::openai::ChatMessageIn) -> Value {
    let mut v = json!({"role": role, "content": content});
    if let Some(n) = &m.name {
        v["name"] = json!(n);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if let Some(calls) = &m.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(f) = c.get_mut("function") {
                    if let Some(Value::String(a)) = f.get("arguments") {
                        if let Ok(parsed) = serde_json::from_str::<Value>(a) {
                            f["arguments"] = parsed;
                        }
                    }
                }
                c
            })
            .collect();
        v["tool_calls"] = Value::Array(calls);
    }
    v
}

/// A JSON string literal as Lark writes it.
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The grammar that forces calls to `tools` (all of them, or the named one) in `format`;
/// one call, or one or more when `parallel`. `control` gives the id of a marker (such as
/// Mistral's `[TOOL_CALLS]`) that the model's vocabulary holds as one control token: the
/// grammar then forces that token, as the model writes it, rather than the marker spelled
/// out in text pieces (control tokens are never produced from text).
pub fn grammar(
    format: ToolFormat,
    tools: &[Value],
    only: Option<&str>,
    parallel: bool,
    control: &dyn Fn(&str) -> Option<u32>,
) -> TopLevelGrammar {
    // A marker: its control token where the vocabulary has one, else its text.
    let marker = |text: &str| match control(text) {
        Some(id) => format!("<[{id}]>"),
        None => lark_str(text),
    };
    let args_key = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let alts: Vec<Value> = tools
        .iter()
        .filter(|t| only.is_none() || tool_name(t) == only)
        .map(|t| {
            let f = &t["function"];
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    args_key: params,
                },
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = if alts.len() == 1 {
        alts[0].clone()
    } else {
        json!({"anyOf": alts})
    };
    let call = format!("%json {}", crate::grammar::with_layout(schema));
    let lark = match format {
        ToolFormat::Hermes => {
            // `<tool_call>\n{...}\n</tool_call>`, several separated by a newline.
            let one = format!(
                "{} \"\\n\" {call} \"\\n\" {}",
                marker("<tool_call>"),
                marker("</tool_call>")
            );
            if parallel {
                format!("start: call (\"\\n\" call)*\ncall: {one}\n")
            } else {
                format!("start: {one}\n")
            }
        }
        ToolFormat::Mistral => {
            let sep = if parallel { "(\", \" call)*" } else { "" };
            format!(
                "start: {} \"[\" call {sep} \"]\"\ncall: {call}\n",
                marker("[TOOL_CALLS]")
            )
        }
        ToolFormat::Llama3 => {
            if parallel {
                format!("start: call (\"; \" call)*\ncall: {call}\n")
            } else {
                format!("start: {call}\n")
            }
        }
    };
    TopLevelGrammar::from_lark(lark)
}

/// Splits `<think>...</think>` off an answer: (reasoning, content). Text before a lone
/// `</think>` counts as reasoning too (templates that open the block in the prompt).
pub fn split_think(text: &str) -> (Option<String>, String) {
    let Some(end) = text.find("</think>") else {
        if let Some(rest) = text.trim_start().strip_prefix("<think>") {
            // Cut off while thinking.
            return (Some(rest.trim().to_string()), String::new());
        }
        return (None, text.to_string());
    };
    let head = &text[..end];
    let reasoning = head
        .trim_start()
        .strip_prefix("<think>")
        .unwrap_or(head)
        .trim()
        .to_string();
    let content = text[end + "</think>".len()..].trim_start().to_string();
    (Some(reasoning), content)
}

/// [`split_think`] for an answer whose `<think>` block the prompt opened (the template's
/// generation prompt ends with `<think>`, as DeepSeek-R1's and QwQ's do): the answer starts
/// inside the block, so with no `</think>` all of it is reasoning (a thought cut off by
/// `max_tokens`), as vLLM's reasoning parsers read it.
pub fn split_think_opened(text: &str) -> (Option<String>, String) {
    if text.contains("</think>") {
        return split_think(text);
    }
    let reasoning = text.trim();
    (
        (!reasoning.is_empty()).then(|| reasoning.to_string()),
        String::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_found_from_templates() {
        assert_eq!(
            ToolFormat::detect("{% if tools %}<tool_call>{% endif %}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("[TOOL_CALLS] {{ x }}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>{% if tools %}\"parameters\"{% endif %}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(ToolFormat::detect("<|im_start|>{{ m }}"), None);
    }

    #[test]
    fn calls_parse_in_each_format() {
        let (c, calls) = parse(
            ToolFormat::Hermes,
            "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call>",
        );
        assert_eq!(c, "ok");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("f", "{\"x\":1}")
        );
        assert_ne!(calls[0].id, calls[1].id);
        let (c, calls) = parse(
            ToolFormat::Llama3,
            "{\"name\": \"f\", \"parameters\": {\"a\": \"b\"}}",
        );
        assert_eq!(
            (c.as_str(), calls[0].arguments.as_str()),
            ("", "{\"a\":\"b\"}")
        );
        let (_, calls) = parse(
            ToolFormat::Llama3,
            "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {}}",
        );
        assert_eq!(calls.len(), 2);
        let (c, calls) = parse(ToolFormat::Llama3, "plain {text}");
        assert_eq!((c.as_str(), calls.len()), ("plain {text}", 0));
        let (c, calls) = parse(
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
        );
        assert_eq!((c.as_str(), calls.len()), ("", 1));
        // Cut off by max_tokens in the second call: the first is kept, the rest is text.
        let (c, calls) = parse(
            ToolFormat::Llama3,
            "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"para",
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (calls[0].name.as_str(), c.as_str()),
            ("f", "{\"name\": \"g\", \"para")
        );
        let (c, calls) = parse(
            ToolFormat::Mistral,
            "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"k\": 2}}, {\"name\": \"g",
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, "{\"k\":2}");
        assert_eq!(c, "{\"name\": \"g");
        let (c, calls) = parse(ToolFormat::Hermes, "<tool_call>not json</tool_call>");
        assert_eq!(
            (c.as_str(), calls.len()),
            ("<tool_call>not json</tool_call>", 0)
        );
    }

    /// A marker the vocabulary holds as a control token is forced as that token; without
    /// one, as text.
    #[test]
    fn markers_are_control_tokens_where_the_vocabulary_has_them() {
        let tools = [
            json!({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {}}}}),
        ];
        let lark = |format, control: &dyn Fn(&str) -> Option<u32>| -> String {
            let g = grammar(format, &tools, None, false, control);
            g.grammars[0].lark_grammar.clone().expect("a Lark grammar")
        };
        let mistral = lark(ToolFormat::Mistral, &|t| (t == "[TOOL_CALLS]").then_some(5));
        assert!(mistral.starts_with("start: <[5]> \"[\""), "{mistral}");
        let text = lark(ToolFormat::Mistral, &|_| None);
        assert!(text.starts_with("start: \"[TOOL_CALLS]\" \"[\""), "{text}");
        let hermes = lark(ToolFormat::Hermes, &|t| match t {
            "<tool_call>" => Some(7),
            "</tool_call>" => Some(8),
            _ => None,
        });
        assert!(hermes.starts_with("start: <[7]> \"\\n\" %json"), "{hermes}");
        assert!(hermes.trim_end().ends_with("\"\\n\" <[8]>"), "{hermes}");
    }

    #[test]
    fn think_is_split_off() {
        assert_eq!(
            split_think("<think>\nhmm\n</think>\n\nyes"),
            (Some("hmm".into()), "yes".into())
        );
        assert_eq!(
            split_think("hmm</think>yes"),
            (Some("hmm".into()), "yes".into())
        );
        assert_eq!(split_think("just text"), (None, "just text".into()));
        // The prompt opened the block: no closing tag means all of it is reasoning.
        assert_eq!(
            split_think_opened("\nstill thinking"),
            (Some("still thinking".into()), String::new())
        );
        assert_eq!(
            split_think_opened("hmm\n</think>\n\nyes"),
            (Some("hmm".into()), "yes".into())
        );
        assert_eq!(split_think_opened(""), (None, String::new()));
    }
}
