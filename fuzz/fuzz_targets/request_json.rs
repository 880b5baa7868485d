//! Arbitrary bytes as the body of `/v1/chat/completions` and `/v1/completions`, through the
//! same parsing and checks the handlers run before anything is queued. Bad input may only be
//! refused with a 400 in the error shape: never a panic, never another status.

#![no_main]

use libfuzzer_sys::fuzz_target;
use smelt_server::openai::{parse, ChatRequest, CompletionRequest};
use smelt_server::ApiError;

fn refused(e: &ApiError) {
    assert_eq!(e.status.as_u16(), 400, "{e:?}");
    assert!(!e.message.is_empty());
    let body = e.body();
    assert!(body["error"]["message"].is_string());
}

fuzz_target!(|data: &[u8]| {
    match parse::<ChatRequest>(data) {
        Ok(req) => {
            if let Err(e) = req.common.params() {
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
    match parse::<CompletionRequest>(data) {
        Ok(req) => {
            if let Err(e) = req.common.params() {
                refused(&e);
            }
            if let Err(e) = req.prompt.single() {
                refused(&e);
            }
        }
        Err(e) => refused(&e),
    }
});
