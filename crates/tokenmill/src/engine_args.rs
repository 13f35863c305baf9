//! Engine flags shared by the commands that run the serving engine (`serve`, `bench-engine`,
//! `profile`), mapped onto the engine's one configuration, [`EngineConfig`]; the engine
//! itself is started by [`tokenmill_engine::launch`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokenmill_engine::{
    Batching, EngineConfig, EngineHandle, KvCacheMemory, KvDtype, STATIC_BATCH_MAX_WAIT,
    SchedulingPolicy, SlaTargets, SpecMethod, SpeculativeConfig,
};
use tokenmill_model::Model;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchingArg {
    Continuous,
    Static,
}

/// `--kv-cache-dtype`: what the KV cache stores (shared by every command that makes one).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtypeArg {
    /// 4 bytes per element: exact.
    #[default]
    F32,
    /// 2 bytes per element (K after RoPE and V rounded to nearest even): twice the tokens in
    /// the same memory, half the bytes attention reads. Llama-family models; DeepSeek's latent
    /// cache stays f32.
    F16,
}

impl From<KvDtypeArg> for KvDtype {
    fn from(a: KvDtypeArg) -> KvDtype {
        match a {
            KvDtypeArg::F32 => KvDtype::F32,
            KvDtypeArg::F16 => KvDtype::F16,
        }
    }
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
    /// What the KV cache stores per element.
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache_dtype: KvDtypeArg,
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
    /// Speculative decoding, as vLLM spells it: a JSON object, e.g. `{"method": "ngram",
    /// "num_speculative_tokens": 4, "prompt_lookup_max": 4}` (also `prompt_lookup_min`, and
    /// `adaptive`: false to verify every draft found whatever the load).
    #[arg(long, value_parser = parse_speculative_config)]
    pub speculative_config: Option<SpeculativeConfig>,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `--speculative-config`: vLLM's keys; unknown keys and methods are errors.
pub fn parse_speculative_config(text: &str) -> Result<SpeculativeConfig, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let mut config = SpeculativeConfig::ngram(4);
    let (mut lo, mut hi) = (None, None);
    let count = |key: &str, v: &serde_json::Value| {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or(format!("{key} must be a non-negative integer"))
    };
    for (key, value) in obj {
        match key.as_str() {
            "method" => match value.as_str() {
                Some("ngram") => {}
                other => {
                    return Err(format!(
                        "method {other:?} is not supported: tokenmill speculates with \"ngram\" \
                         (prompt lookup)"
                    ));
                }
            },
            "num_speculative_tokens" => config.num_speculative_tokens = count(key, value)?,
            "prompt_lookup_min" => lo = Some(count(key, value)?),
            "prompt_lookup_max" => hi = Some(count(key, value)?),
            "adaptive" => {
                config.adaptive = value.as_bool().ok_or("adaptive must be true or false")?;
            }
            _ => {
                return Err(format!(
                    "unknown key {key:?} (known: method, num_speculative_tokens, \
                     prompt_lookup_min, prompt_lookup_max, adaptive)"
                ));
            }
        }
    }
    if !obj.contains_key("method") {
        return Err("\"method\" is required (\"ngram\")".into());
    }
    // As in vLLM, either bound alone sets both; neither keeps tokenmill's (2, 4).
    if lo.is_some() || hi.is_some() {
        let (lo, hi) = (lo.or(hi).unwrap_or(0), hi.or(lo).unwrap_or(0));
        config.method = SpecMethod::Ngram {
            prompt_lookup_min: lo,
            prompt_lookup_max: hi,
        };
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

impl EngineArgs {
    /// The engine configuration these flags ask for.
    pub fn config(&self) -> anyhow::Result<EngineConfig> {
        let kv_cache_memory: KvCacheMemory = self.kv_cache_memory.parse()?;
        let ms = |v: Option<f64>| {
            v.filter(|v| *v > 0.0)
                .map(|v| Duration::from_secs_f64(v / 1e3))
        };
        Ok(EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            kv_cache_memory,
            kv_cache_dtype: self.kv_cache_dtype.into(),
            block_size: self.block_size,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            policy: if self.priority_scheduling {
                SchedulingPolicy::Priority
            } else {
                SchedulingPolicy::Fcfs
            },
            batching: match self.batching {
                BatchingArg::Continuous => Batching::Continuous,
                BatchingArg::Static => Batching::Static {
                    max_wait: STATIC_BATCH_MAX_WAIT,
                },
            },
            sla: SlaTargets {
                ttft: ms(self.target_ttft_ms),
                tpot: ms(self.target_tpot_ms),
            },
            speculative: self.speculative_config,
        })
    }

    /// Loads the model and launches the engine. Returns the handle and the model path.
    pub fn start(&self) -> anyhow::Result<(EngineHandle, PathBuf)> {
        crate::init_threads(self.threads);
        let config = self.config()?;
        let path = crate::model_path::resolve(self.model.clone())?;
        let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
        let launched = tokenmill_engine::launch(&config, model)?;
        for w in &launched.warnings {
            eprintln!("warning: {w}");
        }
        let c = &launched.config;
        eprintln!(
            "KV cache: {} blocks of {} tokens, {} bytes per token ({})",
            c.num_blocks, c.block_size, launched.kv_bytes_per_token, config.kv_cache_dtype
        );
        Ok((launched.handle, path))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use tokenmill_engine::ModelRunner;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    fn parse(args: &[&str]) -> Result<EngineArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("tokenmill").chain(args.iter().copied()))
            .map(|c| c.engine)
    }

    #[test]
    fn kv_cache_dtype_flag_parses_and_rejects_unknown_values() {
        assert_eq!(parse(&[]).unwrap().kv_cache_dtype, KvDtypeArg::F32);
        let a = parse(&["--kv-cache-dtype", "f16"]).unwrap();
        assert_eq!(KvDtype::from(a.kv_cache_dtype), KvDtype::F16);
        let err = parse(&["--kv-cache-dtype", "bf16"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let msg = err.to_string();
        assert!(msg.contains("bf16") && msg.contains("f32, f16"), "{msg}");
    }

    #[test]
    fn speculative_config_takes_vllms_json_and_refuses_what_it_cannot_do() {
        let flag = r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3}"#;
        let c = parse(&["--speculative-config", flag])
            .unwrap()
            .speculative_config
            .unwrap();
        assert_eq!(c.num_speculative_tokens, 6);
        assert!(c.adaptive);
        let SpecMethod::Ngram {
            prompt_lookup_min,
            prompt_lookup_max,
        } = c.method;
        assert_eq!((prompt_lookup_min, prompt_lookup_max), (3, 3));
        let both = r#"{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 5}"#;
        let c = parse_speculative_config(both).unwrap();
        assert_eq!(
            c.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 1,
                prompt_lookup_max: 5
            }
        );
        let default = parse_speculative_config(r#"{"method": "ngram"}"#).unwrap();
        assert_eq!(default, SpeculativeConfig::ngram(4));
        let fixed = parse_speculative_config(r#"{"method": "ngram", "adaptive": false}"#);
        assert!(!fixed.unwrap().adaptive);
        assert!(parse(&[]).unwrap().speculative_config.is_none());
        for (bad, says) in [
            (r#"{"method": "eagle"}"#, "not supported"),
            (r#"{"num_speculative_tokens": 4}"#, "required"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "1..=16",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": -1}"#,
                "non-negative",
            ),
            (
                r#"{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}"#,
                "at most",
            ),
            (r#"{"method": "ngram", "draft": 1}"#, "unknown key"),
            ("[4]", "not a JSON object"),
        ] {
            let err = parse(&["--speculative-config", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn f16_kv_cache_holds_twice_the_blocks_of_the_same_memory() {
        let model = Model::open(&tokenmill_testutil::model_path()).unwrap();
        let scheduler_config = |dtype: &str| {
            let a = parse(&["--kv-cache-memory", "64MiB", "--kv-cache-dtype", dtype]).unwrap();
            a.config().unwrap().scheduler_config(&model).unwrap().0
        };
        let blocks = |dtype: &str| scheduler_config(dtype).num_blocks;
        let (f32_blocks, f16_blocks) = (blocks("f32"), blocks("f16"));
        // SmolLM2: 46080 bytes per token in f32; 64 MiB / (16 · 46080) = 91 blocks.
        assert_eq!(f32_blocks, 91);
        assert_eq!(f16_blocks, 2 * f32_blocks);
        let config = scheduler_config("f16");
        let runner = ModelRunner::with_kv_dtype(model, &config, KvDtype::F16);
        assert_eq!(runner.kv_bytes_per_token(), 46080 / 2);
    }
}
