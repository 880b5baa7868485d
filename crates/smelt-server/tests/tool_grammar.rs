//! A forced tool call against a real vocabulary: where the call marker is one control token
//! of the model (Mistral's `[TOOL_CALLS]` is), the grammar forces that very token, the one
//! the model was trained to write, and not the marker spelled out in text pieces (control
//! tokens never come from text). SmolLM2 has no `[TOOL_CALLS]`, so its control token
//! `<|im_start|>` stands in for one; the same grammar without it forces the text.

mod common;

use std::sync::Arc;

use serde_json::json;
use smelt_engine::Engine;
use smelt_openai::tools::{self, ToolFormat};
use smelt_server::grammar::Grammars;
use smelt_tokenizer::Tokenizer;

#[test]
fn a_control_token_marker_is_forced_as_that_token() {
    let engine = Engine::load(&common::model_path(), &common::engine_options(64)).expect("model");
    let tok = Arc::new(Tokenizer::from_gguf(engine.gguf().metadata()).expect("tokenizer"));
    let marker = tok
        .token_id("<|im_start|>")
        .expect("SmolLM2 has <|im_start|>");
    assert!(tok.is_control(marker));
    let grammars = Grammars::new(Arc::clone(&tok));
    let tools = [
        json!({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}),
    ];

    // The marker as the control token: the first step allows that token alone.
    let g = tools::grammar(ToolFormat::Mistral, &tools, None, false, &|t| {
        (t == "[TOOL_CALLS]").then_some(marker)
    });
    let mut m = grammars.matcher(g, "tools").expect("compiles");
    let mask = m.compute_mask().expect("mask");
    assert_eq!(mask.num_set(), 1);
    assert!(mask.is_allowed(marker));
    m.consume_token(marker).expect("the marker is accepted");
    // Then the call's JSON as text: the list opens.
    let open = tok.token_id("[").expect("[ is one token");
    assert!(m.compute_mask().expect("mask").is_allowed(open));

    // Without a control token the marker is text, and the control token is never allowed.
    let g = tools::grammar(ToolFormat::Mistral, &tools, None, false, &|_| None);
    let mut m = grammars.matcher(g, "tools").expect("compiles");
    let mask = m.compute_mask().expect("mask");
    assert!(!mask.is_allowed(marker));
    assert!(mask.num_set() >= 1);
}
