//! The grammars a request asks for, before any model is involved: `response_format` (JSON
//! object, JSON schema, regex, Lark grammar) as an llguidance [`TopLevelGrammar`], and the
//! JSON layout smelt's schemas use. `smelt serve` compiles them against a model's tokenizer
//! (its `grammar` module); here they are only built and checked, so the fuzz target of the
//! request bodies needs no model.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::error::ApiError;

/// A JSON schema with llguidance's layout options: `", "` and `": "` between items (as
/// Python's `json.dumps` writes, what models saw most) and no free whitespace, so a model
/// cannot pad an answer with blank lines until it runs out of tokens. A schema that sets
/// `x-guidance` itself keeps its own.
pub fn with_layout(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The grammar a `response_format` asks for; `None` for plain text.
pub fn response_format(rf: &Value) -> Result<Option<TopLevelGrammar>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("response_format", m);
    let kind = rf
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("response_format needs a string `type`".into()))?;
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "json_schema"],
        "regex" => &["type", "regex"],
        "grammar" => &["type", "grammar"],
        other => {
            return Err(bad(format!(
                "response_format type {other:?} is not supported (text, json_object, \
                 json_schema, regex, grammar)"
            )))
        }
    };
    if let Some(k) = rf
        .as_object()
        .and_then(|o| o.keys().find(|k| !allowed.contains(&k.as_str())))
    {
        return Err(ApiError::invalid_param(
            &format!("response_format.{k}"),
            format!("`response_format.{k}` is not supported with type {kind:?}"),
        ));
    }
    let text = |k: &str| -> Result<&str, ApiError> {
        rf.get(k).and_then(Value::as_str).ok_or_else(|| {
            bad(format!(
                "response_format type {kind:?} needs a string `{k}`"
            ))
        })
    };
    Ok(match kind {
        "text" => None,
        "json_object" => Some(TopLevelGrammar::from_json_schema(with_layout(
            json!({"type": "object"}),
        ))),
        "json_schema" => {
            let js = rf
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("json_schema needs a `json_schema` object".into()))?;
            for k in js.keys() {
                if !["name", "description", "schema", "strict"].contains(&k.as_str()) {
                    return Err(ApiError::invalid_param(
                        &format!("response_format.json_schema.{k}"),
                        format!("`response_format.json_schema.{k}` is not supported"),
                    ));
                }
            }
            // Without a schema, any JSON object (OpenAI requires one; be lenient).
            let schema = js
                .get("schema")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            if !schema.is_object() {
                return Err(bad("json_schema.schema must be an object".into()));
            }
            Some(TopLevelGrammar::from_json_schema(with_layout(schema)))
        }
        "regex" => Some(TopLevelGrammar::from_regex(text("regex")?)),
        "grammar" => Some(TopLevelGrammar::from_lark(text("grammar")?.to_string())),
        _ => unreachable!("kinds are matched above"),
    })
}
