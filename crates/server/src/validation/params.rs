//! The request-parameter fields shared by `/v1/completions`, `/v1/chat/completions` and
//! `/generate` (sampling, limits, stops, streaming):
//! parsed from the request body, range-checked (errors name the field), and turned into the
//! engine's [`RequestParams`] plus the edge's [`OutputOptions`].
//!
//! Ranges follow vLLM's `SamplingParams` checks (OpenAI's where stricter matters to clients):
//! `temperature ≥ 0`, `top_p ∈ (0, 1]`, `top_k = -1 | 0 | ≥ 1`, `min_p ∈ [0, 1]`, presence
//! and frequency penalties in `[-2, 2]`, `repetition_penalty > 0`, `logit_bias` values in
//! `[-100, 100]` on ids in the vocabulary, `logprobs ≤ 20`, `1 ≤ n ≤ 128`,
//! `min_tokens ≤ max_tokens`. `max_tokens` is checked against the context once the prompt
//! length is known ([`resolve_max_tokens`]).
//!
//! Stop tokens: the model's end-of-generation tokens are added to the client's
//! `stop_token_ids` unless `ignore_eos` (vLLM's behaviour); `stop_reason` reports only the
//! client's own.

use serde_json::Value;
use tokenmill_engine::sampler::MAX_LOGPROBS;
use tokenmill_engine::{RequestParams, SamplingParams};
use tokenmill_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::json::{Fields, as_i64};
use crate::output::OutputOptions;

/// Which route's conventions apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`: `logprobs` is an integer, `max_tokens` defaults to 16.
    Completions,
    /// `/v1/chat/completions`: `logprobs` is a boolean with `top_logprobs`,
    /// `max_completion_tokens` (or `max_tokens`) defaults to the rest of the context.
    Chat,
    /// vLLM's `/generate`: like completions.
    Generate,
}

/// Most choices per prompt.
pub const MAX_N: i64 = 128;
/// Most stop strings.
pub const MAX_STOP: usize = 64;
/// Longest stop string in bytes (bounds the holdback scan per token).
pub const MAX_STOP_BYTES: usize = 512;

/// What the sampling fields of a request ask for.
#[derive(Clone, Debug)]
pub struct Sampling {
    pub n: usize,
    /// `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    pub params: RequestParams,
    pub output: OutputOptions,
    pub stream: bool,
    pub include_usage: bool,
}

fn invalid(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// A token id in the vocabulary.
fn token_id(v: &Value, vocab: usize, param: &str) -> Result<u32, ApiError> {
    match as_i64(v) {
        Some(id) if id >= 0 && (id as u64) < vocab as u64 => Ok(id as u32),
        Some(id) => Err(invalid(
            param,
            format!("token id {id} is outside the vocabulary (0..{vocab})"),
        )),
        None => Err(invalid(
            param,
            format!("`{param}` must hold integer token ids"),
        )),
    }
}

/// Parses the request-parameter fields of `f` for `api`.
pub fn parse(f: &Fields, api: Api, tok: &Tokenizer) -> Result<Sampling, ApiError> {
    let (n, max_tokens, min_tokens) = parse_limits(f, api)?;
    let sampling = parse_sampling(f, api, tok.vocab_size())?;
    let stops = parse_stops(f, tok)?;
    let priority = f
        .i64_in("priority", i32::MIN as i64, i32::MAX as i64)?
        .unwrap_or(0) as i32;
    let (stream, include_usage) = parse_streaming(f)?;
    let output = OutputOptions {
        stop: stops.strings,
        include_stop_str_in_output: f.bool_or("include_stop_str_in_output", false)?,
        skip_special_tokens: f.bool_or("skip_special_tokens", true)?,
        stop_token_ids: stops.user_ids,
        logprobs: sampling.logprobs.is_some(),
    };
    let params = RequestParams {
        max_tokens,
        min_tokens,
        stop_token_ids: stops.engine_ids,
        eos_token_id: tok.eos_token_id(),
        ignore_eos: stops.ignore_eos,
        priority,
        prompt_logprobs: false,
        sampling,
        constraint: None,
        pooling: None,
    };
    Ok(Sampling {
        n,
        max_tokens,
        params,
        output,
        stream,
        include_usage,
    })
}

/// `n` (with `best_of` and `suffix` refused), `max_tokens` (chat: `max_completion_tokens`
/// first) and `min_tokens ≤ max_tokens`.
fn parse_limits(f: &Fields, api: Api) -> Result<(usize, Option<usize>, usize), ApiError> {
    let n = f.i64_in("n", 1, MAX_N)?.unwrap_or(1) as usize;
    if let Some(best_of) = f.i64("best_of")?
        && best_of != n as i64
    {
        return Err(invalid(
            "best_of",
            "best_of is not supported (it must be absent or equal to n)",
        ));
    }
    if f.has("suffix") {
        return Err(invalid("suffix", "suffix is not supported"));
    }
    let max_tokens = match api {
        Api::Chat => f
            .i64("max_completion_tokens")?
            .map(|v| ("max_completion_tokens", v))
            .or(f.i64("max_tokens")?.map(|v| ("max_tokens", v))),
        Api::Completions | Api::Generate => {
            Some(("max_tokens", f.i64("max_tokens")?.unwrap_or(16)))
        }
    };
    let max_tokens = match max_tokens {
        Some((name, v)) if v < 1 => {
            return Err(invalid(
                name,
                format!("`{name}` must be at least 1, got {v}"),
            ));
        }
        Some((_, v)) => Some(v.min(u32::MAX as i64) as usize),
        None => None,
    };
    let min_tokens = f.i64_in("min_tokens", 0, u32::MAX as i64)?.unwrap_or(0) as usize;
    if let Some(m) = max_tokens
        && min_tokens > m
    {
        return Err(invalid(
            "min_tokens",
            format!("min_tokens ({min_tokens}) must not exceed max_tokens ({m})"),
        ));
    }
    Ok((n, max_tokens, min_tokens))
}

/// The sampler's fields: temperature, nucleus / top-k / min-p, penalties, seed, logit bias
/// and logprobs (completions: an integer; chat: a boolean with `top_logprobs`).
fn parse_sampling(f: &Fields, api: Api, vocab: usize) -> Result<SamplingParams, ApiError> {
    let temperature = f.f64("temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(invalid("temperature", "`temperature` must be non-negative"));
    }
    let top_p = f.f64("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(invalid(
            "top_p",
            format!("`top_p` must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match f.i64("top_k")?.unwrap_or(0) {
        -1 | 0 => 0,
        k if k >= 1 => (k as u64).min(vocab as u64) as usize,
        k => {
            return Err(invalid(
                "top_k",
                format!("`top_k` must be -1, 0 or positive, got {k}"),
            ));
        }
    };
    let repetition_penalty = f.f64("repetition_penalty")?.unwrap_or(1.0);
    if repetition_penalty <= 0.0 {
        return Err(invalid(
            "repetition_penalty",
            "`repetition_penalty` must be positive",
        ));
    }
    Ok(SamplingParams {
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
        min_p: f.f64_in("min_p", 0.0, 0.0, 1.0)? as f32,
        seed: f.i64("seed")?.map(|s| s as u64),
        repetition_penalty: repetition_penalty as f32,
        presence_penalty: f.f64_in("presence_penalty", 0.0, -2.0, 2.0)? as f32,
        frequency_penalty: f.f64_in("frequency_penalty", 0.0, -2.0, 2.0)? as f32,
        logit_bias: parse_logit_bias(f, vocab)?,
        logprobs: parse_logprobs(f, api)?,
    })
}

fn parse_logprobs(f: &Fields, api: Api) -> Result<Option<usize>, ApiError> {
    Ok(match api {
        Api::Chat => {
            let want = f.bool_or("logprobs", false)?;
            let top = f.i64_in("top_logprobs", 0, MAX_LOGPROBS as i64)?;
            if top.is_some_and(|t| t > 0) && !want {
                return Err(invalid(
                    "top_logprobs",
                    "top_logprobs requires logprobs: true",
                ));
            }
            want.then(|| top.unwrap_or(0) as usize)
        }
        Api::Completions | Api::Generate => f
            .i64_in("logprobs", 0, MAX_LOGPROBS as i64)?
            .map(|n| n as usize),
    })
}

/// What ends a request: stop strings, the client's stop token ids, and the ids the engine
/// stops on (the client's plus the model's end-of-generation tokens unless `ignore_eos`).
struct Stops {
    strings: Vec<String>,
    user_ids: Vec<u32>,
    engine_ids: Vec<u32>,
    ignore_eos: bool,
}

fn parse_stops(f: &Fields, tok: &Tokenizer) -> Result<Stops, ApiError> {
    let strings = parse_stop(f)?;
    let user_ids = match f.get("stop_token_ids") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| token_id(v, tok.vocab_size(), "stop_token_ids"))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(invalid(
                "stop_token_ids",
                "`stop_token_ids` must be an array",
            ));
        }
    };
    let ignore_eos = f.bool_or("ignore_eos", false)?;
    let mut engine_ids = user_ids.clone();
    if !ignore_eos {
        engine_ids.extend(
            tok.stop_token_ids()
                .iter()
                .filter(|&&t| Some(t) != tok.eos_token_id()),
        );
    }
    Ok(Stops {
        strings,
        user_ids,
        engine_ids,
        ignore_eos,
    })
}

/// `stream` and `stream_options.include_usage` (only with `stream`).
fn parse_streaming(f: &Fields) -> Result<(bool, bool), ApiError> {
    let stream = f.bool_or("stream", false)?;
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(invalid(
                "stream_options",
                "stream_options may only be set when stream is true",
            ));
        }
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(invalid(
                    "stream_options",
                    "`stream_options.include_usage` must be a boolean",
                ));
            }
        },
        Some(_) => {
            return Err(invalid(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    Ok((stream, include_usage))
}

fn parse_stop(f: &Fields) -> Result<Vec<String>, ApiError> {
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(invalid(
                    "stop",
                    "`stop` must be a string or an array of strings",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(invalid(
                "stop",
                "`stop` must be a string or an array of strings",
            ));
        }
    };
    if stop.len() > MAX_STOP {
        return Err(invalid("stop", format!("at most {MAX_STOP} stop strings")));
    }
    if stop
        .iter()
        .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(invalid(
            "stop",
            format!("stop strings must be non-empty and at most {MAX_STOP_BYTES} bytes"),
        ));
    }
    Ok(stop)
}

fn parse_logit_bias(f: &Fields, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = f.get("logit_bias") else {
        return Ok(Vec::new());
    };
    let Value::Object(m) = v else {
        return Err(invalid(
            "logit_bias",
            "`logit_bias` must be an object of token id → bias",
        ));
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, b) in m {
        let id: u32 = k
            .trim()
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < vocab)
            .ok_or_else(|| {
                invalid(
                    "logit_bias",
                    format!("`{k}` is not a token id in the vocabulary"),
                )
            })?;
        let bias = b
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| invalid("logit_bias", "biases must be numbers in [-100, 100]"))?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

/// The output limit for a prompt of `prompt_len` tokens: the request's, or the rest of the
/// context; 400 if it cannot fit in the context or in the whole KV cache.
pub fn resolve_max_tokens(
    max_tokens: Option<usize>,
    prompt_len: usize,
    max_model_len: usize,
    block_size: usize,
    num_blocks: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    if prompt_len == 0 {
        return Err(invalid(prompt_param, "the prompt is empty"));
    }
    let too_long = |m: usize| {
        let msg = format!(
            "This model's maximum context length is {max_model_len} tokens. However, you \
             requested {} tokens ({prompt_len} in the {}, {m} in the completion). Please reduce \
             the length of the {} or completion.",
            prompt_len + m,
            if prompt_param == "messages" {
                "messages"
            } else {
                "prompt"
            },
            if prompt_param == "messages" {
                "messages"
            } else {
                "prompt"
            },
        );
        if max_tokens.is_some() && prompt_len < max_model_len {
            invalid("max_tokens", msg)
        } else {
            invalid(prompt_param, msg)
        }
    };
    let m = match max_tokens {
        Some(m) => m,
        None if prompt_len >= max_model_len => return Err(too_long(1)),
        None => max_model_len - prompt_len,
    };
    if prompt_len + m > max_model_len {
        return Err(too_long(m));
    }
    let needed_blocks = (prompt_len + m - 1).div_ceil(block_size.max(1));
    if needed_blocks > num_blocks {
        return Err(invalid(
            "max_tokens",
            format!(
                "prompt ({prompt_len} tokens) + max_tokens ({m}) needs {needed_blocks} KV \
                 blocks but the whole cache has {num_blocks}"
            ),
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_limits() {
        assert_eq!(
            resolve_max_tokens(Some(10), 5, 100, 16, 100, "prompt"),
            Ok(10)
        );
        assert_eq!(resolve_max_tokens(None, 5, 100, 16, 100, "prompt"), Ok(95));
        let e = resolve_max_tokens(Some(96), 5, 100, 16, 100, "prompt").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = resolve_max_tokens(None, 100, 100, 16, 100, "messages").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = resolve_max_tokens(Some(1), 0, 100, 16, 100, "prompt").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        // 5 + 60 - 1 = 64 KV tokens = 4 blocks of 16: fits in 4, not in 3.
        assert!(resolve_max_tokens(Some(60), 5, 100, 16, 4, "prompt").is_ok());
        assert!(resolve_max_tokens(Some(60), 5, 100, 16, 3, "prompt").is_err());
    }
}
