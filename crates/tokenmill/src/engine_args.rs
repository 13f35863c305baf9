//! Engine flags shared by the commands that run the serving engine (`bench-engine`, and the
//! server), and building the engine from them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use tokenmill_engine::{
    Batching, EngineHandle, KvCacheMemory, KvLayout, ModelRunner, SchedulerConfig,
    SchedulingPolicy, SlaTargets, num_blocks_for_memory, system_memory_bytes,
};
use tokenmill_model::Model;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchingArg {
    Continuous,
    Static,
}

#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Prompt + output tokens of one request at most (default: the model's context length).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// KV cache size: bytes (4GiB, 512MiB, ...) or a fraction of RAM (0.25).
    #[arg(long, default_value = "1GiB")]
    pub kv_cache_memory: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Admit waiting requests by `priority` (lower first) instead of arrival order.
    #[arg(long)]
    pub priority_scheduling: bool,
    #[arg(long, value_enum, default_value = "continuous")]
    pub batching: BatchingArg,
    /// SLA target for time to first token: caps prefill-only steps.
    #[arg(long)]
    pub target_ttft_ms: Option<f64>,
    /// SLA target for time per output token: the largest batch predicted to keep it.
    #[arg(long)]
    pub target_tpot_ms: Option<f64>,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl EngineArgs {
    /// Loads the model and starts the engine thread. Returns the handle and the model path.
    pub fn start(&self) -> anyhow::Result<(EngineHandle, PathBuf)> {
        crate::init_threads(self.threads);
        let path = crate::model_path::resolve(self.model.clone())?;
        let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
        let config = self.scheduler_config(&model)?;
        let runner = ModelRunner::new(model, &config);
        eprintln!(
            "KV cache: {} blocks of {} tokens, {} bytes per token",
            config.num_blocks,
            config.block_size,
            runner.kv_bytes_per_token()
        );
        let (handle, _thread) = tokenmill_engine::start(runner, config)?;
        Ok((handle, path))
    }

    pub fn scheduler_config(&self, model: &Model) -> anyhow::Result<SchedulerConfig> {
        let memory: KvCacheMemory = self.kv_cache_memory.parse()?;
        let budget = memory.resolve(system_memory_bytes().unwrap_or(8 << 30));
        let num_blocks = num_blocks_for_memory(
            &KvLayout::from_model(model),
            self.block_size.max(1),
            4,
            budget,
        );
        if num_blocks == 0 {
            bail!(
                "--kv-cache-memory {} holds no KV block",
                self.kv_cache_memory
            );
        }
        let ms = |v: Option<f64>| {
            v.filter(|v| *v > 0.0)
                .map(|v| Duration::from_secs_f64(v / 1e3))
        };
        let max_model_len = self
            .max_model_len
            .unwrap_or(model.context_length())
            .min(model.context_length());
        let config = SchedulerConfig {
            block_size: self.block_size,
            num_blocks,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len,
            policy: if self.priority_scheduling {
                SchedulingPolicy::Priority
            } else {
                SchedulingPolicy::Fcfs
            },
            enable_prefix_caching: !self.no_enable_prefix_caching,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: None,
            batching: match self.batching {
                BatchingArg::Continuous => Batching::Continuous,
                BatchingArg::Static => Batching::Static {
                    max_wait: Duration::from_millis(100),
                },
            },
            sliding_window: None,
            sla: SlaTargets {
                ttft: ms(self.target_ttft_ms),
                tpot: ms(self.target_tpot_ms),
            },
        };
        config.validate()?;
        Ok(config)
    }
}
