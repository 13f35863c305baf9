//! tokenmill-structured: structured outputs. A request's JSON schema, regex, choice or
//! grammar ([`StructuredOutput`]) becomes, through llguidance, the engine's output
//! [`tokenmill_engine::Constraint`]: per step, a mask of the tokens that keep the output
//! valid.
//!
//! - [`spec`]: what a request may ask for, its size limits, and its llguidance grammar;
//! - [`tok_env`]: the tokenizer as llguidance sees it (token bytes in a trie);
//! - [`compiler`]: compile once per distinct grammar (cached), run per request.

pub mod compiler;
pub mod error;
pub mod spec;
pub mod tok_env;

pub use compiler::{CACHE_ENTRIES, Compiled, GrammarCompiler};
pub use error::StructuredError;
pub use spec::{MAX_CHOICES, MAX_SCHEMA_DEPTH, MAX_SPEC_BYTES, StructuredOutput};
