//! The HTTP edge `smelt serve` and `smelt gateway` share, so both are equally safe to expose
//! (issue 17): errors in OpenAI's shape ([`error`]), an accept loop with header, idle and
//! write timeouts and a connection limit ([`conn`]), and the checks every request passes
//! before a handler sees it: Host allow-list, Origin/CORS, JSON-only bodies with a deadline,
//! and bearer keys compared in constant time ([`guard`]).

pub mod conn;
pub mod guard;

/// Errors in OpenAI's shape: `smelt-openai`'s type, which answers as an axum response.
pub mod error {
    pub use smelt_openai::error::*;
}

pub use error::ApiError;
pub use guard::{Edge, HostPolicy};
