//! The gRPC tokenizer service (`proto/tokenizer.proto`): [`serve_tokenizer`] (`service.rs`) serves a local
//! tokenizer (what `tokenmill tokenizer-server` runs); [`RemoteTokenizer`] (`client.rs`) is the client that
//! `tokenmill serve --tokenizer-endpoint URL` uses instead of its local pool.
//!
//! Errors keep their meaning across the wire: a request the tokenizer rejects (unknown ids, a
//! conversation the template refuses) is `INVALID_ARGUMENT` and becomes a 400 on the HTTP
//! side; a service that cannot be reached is a 503.
//!
//! The service runs its jobs on a local [`crate::tokenizer_pool::TokenizerPool`]; the pool, in
//! turn, may delegate to the client. So the two halves live apart: the client depends on
//! nothing of the server's but its error type, the service on the pool.

pub mod client;
pub mod service;

pub use client::{RemoteError, RemoteTokenizer};
pub use service::{TokenizerService, serve_tokenizer};

/// Generated protobuf types and service stubs.
pub mod pb {
    tonic::include_proto!("tokenmill.tokenizer.v1");
}

/// Largest message either side accepts (long prompts as JSON or token ids).
const MAX_MESSAGE_BYTES: usize = 64 << 20;
