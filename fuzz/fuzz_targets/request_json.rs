//! Arbitrary bytes as the body of `/v1/chat/completions` and `/v1/completions`, through the
//! same parsing and checks the handlers run before anything is queued (crate smelt-openai,
//! which `smelt serve` uses, built here without its HTTP parts). Bad input may only be
//! refused with a 400 in the error shape: never a panic, never another status.

#![no_main]

#[path = "common/alloc_limit.rs"]
mod alloc_limit;

use libfuzzer_sys::fuzz_target;
use smelt_openai::openai::{parse_chat, parse_completion};
use smelt_openai::{grammar, tools, ApiError};

fn refused(e: &ApiError) {
    assert_eq!(e.status.as_u16(), 400, "{e:?}");
    assert!(!e.message.is_empty());
    let body = e.body();
    assert!(body["error"]["message"].is_string());
}

fuzz_target!(|data: &[u8]| {
    match parse_chat(data) {
        Ok(req) => {
            if let Err(e) = req.common.params(false) {
                refused(&e);
            }
            if let Some(rf) = &req.response_format {
                if let Err(e) = grammar::response_format(rf) {
                    refused(&e);
                }
            }
            let list = req.tools.clone().unwrap_or_default();
            if let Err(e) = tools::check(&list) {
                refused(&e);
            }
            if let Err(e) = tools::choice(req.tool_choice.as_ref(), &list) {
                refused(&e);
            }
            for i in 0..req.messages.len() {
                if let Err(e) = req.messages[i].text(i) {
                    refused(&e);
                }
            }
        }
        Err(e) => refused(&e),
    }
    match parse_completion(data) {
        Ok(req) => {
            if let Err(e) = req.common.params(req.echo.unwrap_or(false)) {
                refused(&e);
            }
            if let Err(e) = req.prompt.single() {
                refused(&e);
            }
        }
        Err(e) => refused(&e),
    }
});
