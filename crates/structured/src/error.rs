//! [`StructuredError`]: why a structured-output request cannot be served. Every variant is
//! the client's to fix (an HTTP 400 naming the problem), except [`StructuredError::Tokenizer`],
//! which is found at start-up.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StructuredError {
    /// The schema, regex or grammar does not compile (llguidance's message).
    #[error("{0}")]
    Invalid(String),
    /// The schema or grammar is larger or deeper than this server compiles.
    #[error("{0}")]
    TooLarge(String),
    /// The tokenizer could not be described to the grammar engine.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}
