//! tokenmill-bench
