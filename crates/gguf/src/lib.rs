//! tokenmill-gguf
