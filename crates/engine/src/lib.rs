//! tokenmill-engine: what turns requests into batches — the sampler today; the KV block
//! pool, scheduler and engine loop thread as the serving core lands.

pub mod sampler;

pub use sampler::{Sampler, SamplingParams, argmax, top_logprobs};
