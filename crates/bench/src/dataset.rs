//! Workloads: the prompts a benchmark sends and how many tokens each should generate.
//!
//! - [`random_prompts`] — `vllm bench serve --dataset-name random`: each prompt is a shared
//!   prefix of `prefix_len` tokens followed by `input_len × U[1 − r, 1 + r]` random tokens, and
//!   asks for `output_len × U[1 − r, 1 + r]` tokens. Token ids are drawn uniformly from the
//!   tokenizer's non-special ids. As [`PromptFormat::Tokens`] the ids are sent as they are (a
//!   JSON list of ints, which tokenmill, vLLM and llama-server accept on `/v1/completions`), so
//!   the input length is exact. As [`PromptFormat::Text`] they are decoded and re-encoded until
//!   the text re-tokenizes to the target length (BPE merges across the random ids can change
//!   the count; the rare prompt that never converges keeps the length it has, recorded in
//!   [`Prompt::prompt_len`]).
//! - [`file_prompts`] — a JSONL file of `{"prompt": TEXT | [ids], "output_len": N}` lines, or a
//!   ShareGPT JSON array (`conversations`: first human turn = prompt, the reply's length =
//!   output length), shuffled with the seed, first `num_prompts` taken.
//!
//! Invariants: the same spec and seed always give the same prompts; every prompt has
//! `output_len ≥ 1`; bad files are a [`DatasetError`], never a panic.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokenmill_tokenizer::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("the dataset has no usable prompt")]
    Empty,
    #[error("the tokenizer has no non-special token to draw from")]
    NoVocab,
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    Invalid(String),
}

/// What the request's `prompt` carries.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Tokens(Vec<u32>),
    Text(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptFormat {
    /// Token ids (exact lengths; `/v1/completions` only).
    Tokens,
    /// Text made with the model's tokenizer (for chat endpoints and text-only servers).
    Text,
}

impl std::str::FromStr for PromptFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tokens" => Ok(PromptFormat::Tokens),
            "text" => Ok(PromptFormat::Text),
            _ => Err(format!("prompt format `{s}`: expected tokens or text")),
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub input: PromptInput,
    /// Prompt length in tokens, as far as the client knows (the server's usage wins).
    pub prompt_len: usize,
    pub output_len: usize,
}

/// How output lengths spread around `--output-len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputLenDist {
    /// Uniform over `len × [1 - range_ratio, 1 + range_ratio]` (vLLM's random dataset).
    #[default]
    Uniform,
    /// Exponential with mean `len` ([`exponential_len`]): the long tail
    /// of chat traffic, where most answers are short and a few are very long (ShareGPT's
    /// output lengths have a standard deviation about their mean, as an exponential does).
    Exponential,
}

impl std::str::FromStr for OutputLenDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(OutputLenDist::Uniform),
            "exponential" => Ok(OutputLenDist::Exponential),
            _ => Err(format!(
                "output length distribution `{s}`: expected uniform or exponential"
            )),
        }
    }
}

/// The exponential length of mean `mean` at uniform `u` in (0, 1]: `-mean · ln u`, rounded,
/// at least 1 and at most `8 × mean` (a tail beyond that has probability e^-8).
pub fn exponential_len(mean: usize, u: f64) -> usize {
    let mean = mean.max(1) as f64;
    (-mean * u.ln()).round().clamp(1.0, 8.0 * mean) as usize
}

/// `--dataset-name random`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomSpec {
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub range_ratio: f64,
    /// How output lengths spread (uniform by `range_ratio`, or exponential).
    pub output_dist: OutputLenDist,
    pub prefix_len: usize,
    pub seed: u64,
}

/// Uniform draw from `len × [1 − r, 1 + r]`, at least 1.
fn draw_len(rng: &mut StdRng, len: usize, r: f64) -> usize {
    let lo = ((len as f64) * (1.0 - r)).round().max(1.0) as usize;
    let hi = ((len as f64) * (1.0 + r)).round().max(lo as f64) as usize;
    rng.random_range(lo..=hi)
}

/// The ids random prompts draw from: every id the tokenizer does not mark special.
pub fn drawable_ids(tok: &Tokenizer) -> Vec<u32> {
    (0..tok.vocab_size() as u32)
        .filter(|&id| !tok.is_special(id))
        .collect()
}

pub fn random_prompts(
    spec: &RandomSpec,
    tok: &Tokenizer,
    format: PromptFormat,
) -> Result<Vec<Prompt>, DatasetError> {
    if !(0.0..1.0).contains(&spec.range_ratio) {
        return Err(DatasetError::Invalid(format!(
            "range ratio {} must be in [0, 1)",
            spec.range_ratio
        )));
    }
    let ids = drawable_ids(tok);
    if ids.is_empty() {
        return Err(DatasetError::NoVocab);
    }
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let draw = |rng: &mut StdRng, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| ids[rng.random_range(0..ids.len())])
            .collect()
    };
    let prefix = draw(&mut rng, spec.prefix_len);
    let mut out = Vec::with_capacity(spec.num_prompts);
    for _ in 0..spec.num_prompts {
        let n_in = draw_len(&mut rng, spec.input_len, spec.range_ratio);
        let n_out = match spec.output_dist {
            OutputLenDist::Uniform => draw_len(&mut rng, spec.output_len, spec.range_ratio),
            OutputLenDist::Exponential => {
                exponential_len(spec.output_len, 1.0 - rng.random::<f64>())
            }
        };
        let mut prompt = prefix.clone();
        prompt.extend(draw(&mut rng, n_in));
        let target = prompt.len();
        let (input, prompt_len) = match format {
            PromptFormat::Tokens => (PromptInput::Tokens(prompt), target),
            PromptFormat::Text => {
                let (text, n) = text_of_len(tok, prompt, target, &mut |k| draw(&mut rng, k))?;
                (PromptInput::Text(text), n)
            }
        };
        out.push(Prompt {
            input,
            prompt_len,
            output_len: n_out,
        });
    }
    Ok(out)
}

fn tok_err(e: impl std::fmt::Display) -> DatasetError {
    DatasetError::Tokenizer(e.to_string())
}

/// Decodes `ids` and re-encodes until the text is `target` tokens long (at most 8 rounds).
/// Returns the text and its token count.
fn text_of_len(
    tok: &Tokenizer,
    mut ids: Vec<u32>,
    target: usize,
    more: &mut dyn FnMut(usize) -> Vec<u32>,
) -> Result<(String, usize), DatasetError> {
    let mut best = (String::new(), 0usize);
    for _ in 0..8 {
        let text = tok.decode(&ids, true).map_err(tok_err)?;
        let re = tok.encode(&text, false).map_err(tok_err)?;
        best = (text, re.len());
        match re.len().cmp(&target) {
            std::cmp::Ordering::Equal => break,
            std::cmp::Ordering::Greater => ids = re[..target].to_vec(),
            std::cmp::Ordering::Less => {
                ids = re;
                ids.extend(more(target - ids.len()));
            }
        }
    }
    Ok(best)
}

/// A JSONL or ShareGPT file. `output_len` overrides the file's output lengths; without it a
/// line needs `output_len` (JSONL) or a reply (ShareGPT, measured with `tok`).
pub fn file_prompts(
    path: &Path,
    num_prompts: usize,
    output_len: Option<usize>,
    seed: u64,
    tok: &Tokenizer,
) -> Result<Vec<Prompt>, DatasetError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Io {
        path: name.clone(),
        source,
    })?;
    let perr = |line: usize, message: String| DatasetError::Parse {
        path: name.clone(),
        line,
        message,
    };
    let entries: Vec<(usize, Value)> = if text.trim_start().starts_with('[') {
        let v: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| perr(e.line(), e.to_string()))?;
        v.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect()
    } else {
        let mut v = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|l| !l.1.trim().is_empty()) {
            v.push((
                i + 1,
                serde_json::from_str(line).map_err(|e| perr(i + 1, e.to_string()))?,
            ));
        }
        v
    };
    let mut prompts = Vec::new();
    for (line, entry) in &entries {
        if let Some(p) = entry_prompt(entry, output_len, tok).map_err(|m| perr(*line, m))? {
            prompts.push(p);
        }
    }
    prompts.shuffle(&mut StdRng::seed_from_u64(seed));
    prompts.truncate(num_prompts);
    if prompts.is_empty() {
        return Err(DatasetError::Empty);
    }
    Ok(prompts)
}

/// One entry; `Ok(None)` = skipped (a ShareGPT conversation without a human turn and reply).
fn entry_prompt(
    v: &Value,
    output_len: Option<usize>,
    tok: &Tokenizer,
) -> Result<Option<Prompt>, String> {
    let count = |s: &str| {
        tok.encode(s, false)
            .map(|ids| ids.len())
            .map_err(|e| e.to_string())
    };
    let (input, prompt_len, file_out) = if let Some(turns) = v["conversations"].as_array() {
        let text_of = |t: &Value| {
            t["value"]
                .as_str()
                .or(t["content"].as_str())
                .map(str::to_string)
        };
        let Some(q) = turns.first().and_then(text_of) else {
            return Ok(None);
        };
        let reply = turns.get(1).and_then(text_of);
        let out = reply.as_deref().map(count).transpose()?;
        let n = count(&q)?;
        (PromptInput::Text(q), n, out)
    } else {
        let out = v["output_len"].as_u64().or(v["max_tokens"].as_u64());
        let out = out.map(|n| n as usize);
        match &v["prompt"] {
            Value::String(s) => (PromptInput::Text(s.clone()), count(s)?, out),
            Value::Array(a) => {
                let ids: Option<Vec<u32>> = a
                    .iter()
                    .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect();
                let ids = ids.ok_or("`prompt` must be a string or a list of token ids")?;
                let n = ids.len();
                (PromptInput::Tokens(ids), n, out)
            }
            _ => return Err("expected `prompt` or `conversations`".into()),
        }
    };
    let Some(output_len) = output_len.or(file_out) else {
        return Err("no output length: give `output_len` or --output-len".into());
    };
    Ok(Some(Prompt {
        input,
        prompt_len,
        output_len: output_len.max(1),
    }))
}
