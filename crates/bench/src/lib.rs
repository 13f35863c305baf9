//! tokenmill-bench: load generation and the figures the field reports, after
//! `vllm bench serve`.
//!
//! - [`dataset`]: workloads (random prompts of exact token lengths, as ids or text; JSONL and
//!   ShareGPT files);
//! - [`arrival`]: when requests are sent (closed loop, Poisson/gamma open loop, caps);
//! - [`client`]: one streaming request to an OpenAI-compatible server, timed per chunk;
//! - [`runner`]: the HTTP load driver, SLA sweeps and A/B comparisons;
//! - [`stats`]: per-request records and their summary (throughput, goodput, TTFT / TPOT / ITL
//!   / E2EL percentiles, errors by kind), named as vLLM names them;
//! - [`report`]: sweep tables with the best point under an SLA, side-by-side ratios;
//! - [`memory`]: server memory from `/proc` or its metrics;
//! - [`spec_decode`]: the server's speculative-decoding counters over a run;
//! - [`plot`]: PNG/SVG charts with an embedded font;
//! - [`inprocess`]: a closed-loop load driving the engine handle directly (no HTTP), to
//!   measure the engine apart from the server.

pub mod arrival;
pub mod client;
pub mod dataset;
pub mod inprocess;
pub mod memory;
pub mod plot;
pub mod report;
pub mod runner;
pub mod spec_decode;
pub mod stats;
