//! tokenmill-model
