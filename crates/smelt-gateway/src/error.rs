//! Errors in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`) with the
//! status a client expects: the same type `smelt serve` answers with (`smelt_http`), so a
//! client sees the same errors through the gateway as from a node.

pub use smelt_http::error::ApiError;
pub use smelt_http::guard::clip;
