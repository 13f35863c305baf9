//! HTTP handlers, one module per concern.

pub mod chat;
pub mod common;
pub mod completions;
pub mod dashboard;
pub mod embeddings;
pub mod generate;
pub mod info;
pub mod profile;
pub mod responses;
pub mod tokenize;
