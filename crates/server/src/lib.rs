//! tokenmill-server
