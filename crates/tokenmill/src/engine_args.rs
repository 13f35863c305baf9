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
use tokenmill_model::{KvShape, Model};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchingArg {
    Continuous,
    Static,
}

/// `--kv-cache-dtype`: what the KV cache stores (shared by every command that makes one).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtypeArg {
    /// 4 bytes per element: exact.
    F32,
    /// 2 bytes per element (K after RoPE and V, or DeepSeek's latent rows, rounded to nearest
    /// even): twice the tokens in the same memory, half the bytes attention reads. The default.
    #[default]
    F16,
    /// 2 bytes per element, bfloat16: as f16, with f32's range and three fewer mantissa bits.
    Bf16,
    /// 1 byte per element plus f32 scales (four per KV head's key, one per value row;
    /// DeepSeek: one per 64 latent values), symmetric int8: about 0.58 of f16's bytes, so 1.7
    /// times the tokens, and fewer bytes for attention to read; costs some accuracy (see
    /// BENCHMARKS.md).
    Int8,
}

impl From<KvDtypeArg> for KvDtype {
    fn from(a: KvDtypeArg) -> KvDtype {
        match a {
            KvDtypeArg::F32 => KvDtype::F32,
            KvDtypeArg::F16 => KvDtype::F16,
            KvDtypeArg::Bf16 => KvDtype::BF16,
            KvDtypeArg::Int8 => KvDtype::I8,
        }
    }
}

/// `--activation-bits`: the precision the quantized matmuls quantize activations to (shared by
/// every command that runs the model).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationBits {
    /// 12-bit quants per block of 32 (A16): the top-1 logprob within ~0.014 of fp32 on the
    /// default model. The default.
    #[default]
    #[value(name = "12")]
    Twelve,
    /// 8-bit quants per block of 32 (A8, as llama.cpp's Q8 activations): about twice the
    /// integer multiply-adds per instruction for the Rows16 weights (Q4_0/Q4_1/Q5_0/Q4_K/Q6_K,
    /// and Q8_0 on AVX-512 VNNI) (faster prefill and batched decode), at less fidelity (see
    /// BENCHMARKS.md); weights without an 8-bit kernel on the tier keep 12.
    #[value(name = "8")]
    Eight,
}

#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// GGUF file, Hugging Face folder, or Hugging Face id `ORG/NAME[:QUANT]` from the local
    /// hub cache (default: SmolLM2-135M-Instruct Q4_1, fetched if missing).
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
    /// What the KV cache stores per element (f16 by default, as llama.cpp's; f32 is the
    /// reference numerics).
    #[arg(long, value_enum, default_value = "f16")]
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
    /// "num_speculative_tokens": 4, "prompt_lookup_max": 4}` (also `prompt_lookup_min`), or
    /// `{"model": "draft.gguf", "num_speculative_tokens": 4}` (method `draft_model`); and
    /// `adaptive`: false to verify every draft whatever the load.
    #[arg(long, value_parser = parse_speculative_config)]
    pub speculative_config: Option<SpecFlag>,
    /// A draft model for speculative decoding (any model tokenmill loads with the target's
    /// vocabulary; shorthand for `--speculative-config '{"model": PATH}'`).
    #[arg(long)]
    pub speculative_model: Option<PathBuf>,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Bits of the activation quants the integer matmuls take: 12 (default) or 8.
    #[arg(long, value_enum, default_value = "12")]
    pub activation_bits: ActivationBits,
}

/// `--speculative-config` as given (resolved with `--speculative-model` by
/// [`SpecFlag::resolve`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecFlag {
    method: Option<String>,
    model: Option<PathBuf>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup: (Option<usize>, Option<usize>),
    adaptive: Option<bool>,
}

/// `--speculative-config`: vLLM's keys; unknown keys are errors.
pub fn parse_speculative_config(text: &str) -> Result<SpecFlag, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let mut flag = SpecFlag::default();
    let count = |key: &str, v: &serde_json::Value| {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or(format!("{key} must be a non-negative integer"))
    };
    let string = |key: &str, v: &serde_json::Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or(format!("{key} must be a string"))
    };
    for (key, value) in obj {
        match key.as_str() {
            "method" => flag.method = Some(string(key, value)?),
            "model" => flag.model = Some(string(key, value)?.into()),
            "num_speculative_tokens" => flag.num_speculative_tokens = Some(count(key, value)?),
            "prompt_lookup_min" => flag.prompt_lookup.0 = Some(count(key, value)?),
            "prompt_lookup_max" => flag.prompt_lookup.1 = Some(count(key, value)?),
            "adaptive" => {
                flag.adaptive = Some(value.as_bool().ok_or("adaptive must be true or false")?);
            }
            _ => {
                return Err(format!(
                    "unknown key {key:?} (known: method, model, num_speculative_tokens, \
                     prompt_lookup_min, prompt_lookup_max, adaptive)"
                ));
            }
        }
    }
    // What can be checked without `--speculative-model` (which may name the draft).
    let draft = flag.method.as_deref() != Some("ngram") && flag.model.is_none();
    flag.resolve(draft.then(|| PathBuf::from("--speculative-model")))?;
    Ok(flag)
}

impl SpecFlag {
    /// The engine's speculation and draft model path, `model` being `--speculative-model`.
    pub fn resolve(
        &self,
        model: Option<PathBuf>,
    ) -> Result<(SpeculativeConfig, Option<PathBuf>), String> {
        let model = model.or(self.model.clone());
        let k = self.num_speculative_tokens.unwrap_or(4);
        let mut config = match (self.method.as_deref(), &model) {
            (Some("ngram"), None) => SpeculativeConfig::ngram(k),
            (Some("ngram"), Some(_)) => {
                return Err("method \"ngram\" takes no draft model".into());
            }
            (Some("draft_model") | None, Some(_)) => SpeculativeConfig::draft_model(k),
            (Some("draft_model"), None) => {
                return Err(
                    "method \"draft_model\" needs a \"model\" (or --speculative-model)".into(),
                );
            }
            (None, None) => {
                return Err("\"method\" (\"ngram\") or a draft \"model\" is required".into());
            }
            (Some(other), _) => {
                return Err(format!(
                    "method {other:?} is not supported: tokenmill speculates with \"ngram\" \
                     (prompt lookup) or \"draft_model\""
                ));
            }
        };
        if let Some(a) = self.adaptive {
            config.adaptive = a;
        }
        // As in vLLM, either bound alone sets both; neither keeps tokenmill's (2, 4).
        if let (SpecMethod::Ngram { .. }, (lo, hi)) = (config.method, self.prompt_lookup)
            && (lo.is_some() || hi.is_some())
        {
            config.method = SpecMethod::Ngram {
                prompt_lookup_min: lo.or(hi).unwrap_or(0),
                prompt_lookup_max: hi.or(lo).unwrap_or(0),
            };
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok((config, model))
    }
}

impl EngineArgs {
    /// The engine configuration these flags ask for.
    pub fn config(&self) -> anyhow::Result<EngineConfig> {
        let kv_cache_memory: KvCacheMemory = self.kv_cache_memory.parse()?;
        let ms = |v: Option<f64>| {
            v.filter(|v| *v > 0.0)
                .map(|v| Duration::from_secs_f64(v / 1e3))
        };
        let (speculative, speculative_model) =
            match (&self.speculative_config, &self.speculative_model) {
                (None, None) => (None, None),
                (flag, model) => {
                    let (c, m) = flag
                        .clone()
                        .unwrap_or_default()
                        .resolve(model.clone())
                        .map_err(|e| anyhow::anyhow!("--speculative-config: {e}"))?;
                    (
                        Some(c),
                        m.map(crate::model_path::resolve_given).transpose()?,
                    )
                }
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
            speculative,
            speculative_model,
        })
    }

    /// Loads the model and launches the engine. Returns the handle and the model path.
    pub fn start(&self) -> anyhow::Result<(EngineHandle, PathBuf)> {
        crate::init_threads(self.threads, self.activation_bits);
        let config = self.config()?;
        let path = crate::model_path::resolve(self.model.clone())?;
        let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
        let launched = tokenmill_engine::launch(&config, model)?;
        for w in &launched.warnings {
            eprintln!("warning: {w}");
        }
        let c = &launched.config;
        let shape = &launched.kv_shape;
        let expanded = shape.expanded_elems_per_token() * config.kv_cache_dtype.bytes();
        let latent = match shape {
            KvShape::Latent { .. } => format!(
                "; latent rows, 1/{:.1} of the {expanded} an expanded K/V cache would take",
                expanded as f64 / launched.kv_bytes_per_token as f64
            ),
            KvShape::Standard { .. } => String::new(),
        };
        eprintln!(
            "KV cache: {} blocks of {} tokens, {} bytes per token ({}{latent})",
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
        assert_eq!(parse(&[]).unwrap().kv_cache_dtype, KvDtypeArg::F16);
        let a = parse(&["--kv-cache-dtype", "f32"]).unwrap();
        assert_eq!(KvDtype::from(a.kv_cache_dtype), KvDtype::F32);
        let a = parse(&["--kv-cache-dtype", "f16"]).unwrap();
        assert_eq!(KvDtype::from(a.kv_cache_dtype), KvDtype::F16);
        let a = parse(&["--kv-cache-dtype", "bf16"]).unwrap();
        assert_eq!(KvDtype::from(a.kv_cache_dtype), KvDtype::BF16);
        let a = parse(&["--kv-cache-dtype", "int8"]).unwrap();
        assert_eq!(KvDtype::from(a.kv_cache_dtype), KvDtype::I8);
        let err = parse(&["--kv-cache-dtype", "fp8"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let msg = err.to_string();
        assert!(
            msg.contains("fp8") && msg.contains("f32, f16, bf16, int8"),
            "{msg}"
        );
    }

    fn speculative(args: &[&str]) -> anyhow::Result<(Option<SpeculativeConfig>, Option<PathBuf>)> {
        let c = parse(args).map_err(|e| anyhow::anyhow!("{e}"))?.config()?;
        Ok((c.speculative, c.speculative_model))
    }

    #[test]
    fn speculative_config_takes_vllms_json_and_refuses_what_it_cannot_do() {
        let flag = r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3}"#;
        let (c, m) = speculative(&["--speculative-config", flag]).unwrap();
        let c = c.unwrap();
        assert_eq!((c.num_speculative_tokens, c.adaptive, m), (6, true, None));
        let ngram = |lo, hi| SpecMethod::Ngram {
            prompt_lookup_min: lo,
            prompt_lookup_max: hi,
        };
        assert_eq!(c.method, ngram(3, 3));
        let both = r#"{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 5}"#;
        let c = speculative(&["--speculative-config", both])
            .unwrap()
            .0
            .unwrap();
        assert_eq!(c.method, ngram(1, 5));
        let default = speculative(&["--speculative-config", r#"{"method": "ngram"}"#]).unwrap();
        assert_eq!(default, (Some(SpeculativeConfig::ngram(4)), None));
        let fixed = r#"{"method": "ngram", "adaptive": false}"#;
        assert!(
            !speculative(&["--speculative-config", fixed])
                .unwrap()
                .0
                .unwrap()
                .adaptive
        );
        assert_eq!(speculative(&[]).unwrap(), (None, None));
        // A draft model: by the JSON's "model" or by --speculative-model.
        let draft = r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#;
        let want = (
            Some(SpeculativeConfig::draft_model(3)),
            Some("d.gguf".into()),
        );
        assert_eq!(speculative(&["--speculative-config", draft]).unwrap(), want);
        let k3 = r#"{"num_speculative_tokens": 3}"#;
        let args = ["--speculative-model", "d.gguf", "--speculative-config", k3];
        assert_eq!(speculative(&args).unwrap(), want);
        let only = speculative(&["--speculative-model", "d.gguf"]).unwrap();
        assert_eq!(only.0, Some(SpeculativeConfig::draft_model(4)));
        for (bad, says) in [
            (r#"{"method": "eagle"}"#, "not supported"),
            (r#"{"num_speculative_tokens": 4}"#, "required"),
            (r#"{"method": "draft_model"}"#, "needs a"),
            (r#"{"model": 3}"#, "must be a string"),
            (
                r#"{"method": "ngram", "model": "d.gguf"}"#,
                "no draft model",
            ),
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
            let err = speculative(&["--speculative-config", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = speculative(&[
            "--speculative-model",
            "d.gguf",
            "--speculative-config",
            fixed,
        ]);
        assert!(err.unwrap_err().to_string().contains("no draft model"));
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
        // int8: 30 layers · 3 heads · (2 · 64 + five 4-byte scales) = 13320 bytes per token.
        assert_eq!(blocks("int8"), (64 << 20) / (16 * 13320));
        let config = scheduler_config("f16");
        let runner = ModelRunner::with_kv_dtype(model, &config, KvDtype::F16);
        assert_eq!(runner.kv_bytes_per_token(), 46080 / 2);
    }
}
