//! tokenmill-bench: load generation and the figures the field reports.
//!
//! - [`stats`]: per-request timing records and their summary (throughput, TTFT / TPOT / ITL /
//!   E2E percentiles), named as `vllm bench serve` names them;
//! - [`inprocess`]: a closed-loop load driving the engine handle directly (no HTTP), to
//!   measure the engine apart from the server.

pub mod inprocess;
pub mod stats;
