//! tokenmill-engine
