//! tokenmill-tokenizer
