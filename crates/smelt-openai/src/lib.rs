//! The OpenAI request surface of `smelt serve`, with no model and no HTTP server in sight:
//! request bodies parsed and checked ([`openai`]), the grammars `response_format` asks for
//! ([`grammar`]), tool-call formats, parsing and streaming ([`tools`], [`tool_stream`]) and
//! errors in OpenAI's shape ([`error`]). Kept apart from `smelt-server` so what parses
//! untrusted bytes can be fuzzed, and built, on its own (fuzz/request_json).

pub mod error;
pub mod grammar;
pub mod openai;
pub mod tool_stream;
pub mod tools;

pub use error::ApiError;

/// At most `n` characters of `s`, for messages that quote what a client sent.
pub fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}
