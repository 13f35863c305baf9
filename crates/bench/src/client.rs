//! One streaming request to an OpenAI-compatible server, timed as `vllm bench serve` times it.
//!
//! The body asks for a stream with `stream_options.include_usage` (so output tokens are the
//! server's count), `max_tokens` (or `max_completion_tokens` on chat), `ignore_eos` and
//! optionally `min_tokens` so output lengths are exact where the server supports them.
//! [`SseParser`] splits the byte stream into `data:` payloads whatever the chunking; each
//! payload with non-empty text (`choices[0].text` or `choices[0].delta.content`) is one
//! arrival. The stream must end with `[DONE]`; anything else is a failure of a
//! [`ErrorKind`] (429, 5xx, other 4xx, connect, disconnect, timeout, bad payload). No response
//! can make this panic.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::dataset::{Prompt, PromptInput};
use crate::stats::{ErrorKind, RequestError, RequestRecord};

/// Which OpenAI route to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "/v1/completions" => Ok(Endpoint::Completions),
            "/v1/chat/completions" => Ok(Endpoint::ChatCompletions),
            _ => Err(format!(
                "endpoint `{s}`: expected /v1/completions or /v1/chat/completions"
            )),
        }
    }
}

/// The server under test.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// e.g. `http://127.0.0.1:8080` (no trailing slash needed).
    pub base_url: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    /// The served model name.
    pub model: String,
}

impl Target {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }
}

/// Request fields that do not depend on the prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOptions {
    pub ignore_eos: bool,
    /// Also send `min_tokens = max_tokens` (vLLM, tokenmill).
    pub min_tokens: bool,
    pub temperature: f64,
    /// Fields merged into every request body last (`--extra-body`: a `response_format`,
    /// `guided_json`, sampling extras).
    pub extra_body: serde_json::Map<String, Value>,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions {
            ignore_eos: true,
            min_tokens: false,
            temperature: 0.0,
            extra_body: serde_json::Map::new(),
        }
    }
}

/// The JSON body for `prompt`; token-id prompts only go to `/v1/completions`.
pub fn request_body(target: &Target, p: &Prompt, opts: &RequestOptions) -> Result<Value, String> {
    let mut body = json!({
        "model": target.model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": opts.temperature,
        "ignore_eos": opts.ignore_eos,
    });
    match (target.endpoint, &p.input) {
        (Endpoint::Completions, PromptInput::Tokens(ids)) => body["prompt"] = json!(ids),
        (Endpoint::Completions, PromptInput::Text(t)) => body["prompt"] = json!(t),
        (Endpoint::ChatCompletions, PromptInput::Text(t)) => {
            body["messages"] = json!([{"role": "user", "content": t}]);
        }
        (Endpoint::ChatCompletions, PromptInput::Tokens(_)) => {
            return Err("/v1/chat/completions needs text prompts (--prompt-format text)".into());
        }
    }
    let max_key = match target.endpoint {
        Endpoint::Completions => "max_tokens",
        Endpoint::ChatCompletions => "max_completion_tokens",
    };
    body[max_key] = json!(p.output_len);
    if opts.min_tokens {
        body["min_tokens"] = json!(p.output_len);
    }
    for (k, v) in &opts.extra_body {
        body[k.as_str()] = v.clone();
    }
    Ok(body)
}

/// Splits a server-sent-events byte stream into the payloads of its `data:` fields.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the payload of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend(bytes.iter().filter(|&&b| b != b'\r'));
        let mut out = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

fn fail(rec: &mut RequestRecord, kind: ErrorKind, message: impl Into<String>) {
    rec.error.get_or_insert(RequestError {
        kind,
        message: message.into(),
    });
}

fn transport_kind(e: &reqwest::Error, in_body: bool) -> ErrorKind {
    if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() {
        ErrorKind::Connect
    } else if in_body {
        ErrorKind::Disconnected
    } else {
        ErrorKind::Protocol
    }
}

/// Applies one payload to `rec`; returns true on `[DONE]`.
fn apply_payload(rec: &mut RequestRecord, payload: &str, at: Duration) -> bool {
    if payload.trim() == "[DONE]" {
        return true;
    }
    let v: Value = match serde_json::from_str(payload) {
        Ok(v) => v,
        Err(e) => {
            fail(rec, ErrorKind::Protocol, format!("bad chunk: {e}"));
            return false;
        }
    };
    if !v["error"].is_null() {
        fail(rec, ErrorKind::ServerError, v["error"].to_string());
        return false;
    }
    let choice = &v["choices"][0];
    let text = choice["text"]
        .as_str()
        .or(choice["delta"]["content"].as_str())
        .or(choice["delta"]["reasoning_content"].as_str());
    if text.is_some_and(|t| !t.is_empty()) {
        rec.token_times.push(at);
    }
    let usage = &v["usage"];
    if let Some(n) = usage["completion_tokens"].as_u64() {
        rec.reported_output_tokens = Some(n as usize);
    }
    if let Some(n) = usage["prompt_tokens"].as_u64() {
        rec.prompt_tokens = n as usize;
    }
    false
}

/// Sends `body` and reads its stream to the end. `start` is the send time from the start of
/// the benchmark (for the record); `prompt_len` is used until the server reports usage.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_len: usize,
    start: Duration,
) -> RequestRecord {
    let mut rec = RequestRecord {
        prompt_tokens: prompt_len,
        start,
        ..RequestRecord::default()
    };
    let mut req = client.post(target.url(target.endpoint.path())).json(body);
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
    }
    let sent = Instant::now();
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            fail(&mut rec, transport_kind(&e, false), e.to_string());
            return rec;
        }
    };
    let status = resp.status();
    if !status.is_success() {
        let kind = match status.as_u16() {
            429 => ErrorKind::RateLimited,
            500..=599 => ErrorKind::ServerError,
            _ => ErrorKind::ClientError,
        };
        let text = resp.text().await.unwrap_or_default();
        fail(&mut rec, kind, format!("HTTP {status}: {text}"));
        return rec;
    }
    let (mut parser, mut done, mut stream) = (SseParser::default(), false, resp.bytes_stream());
    while let Some(chunk) = stream.next().await {
        let at = sent.elapsed();
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => {
                fail(&mut rec, transport_kind(&e, true), e.to_string());
                return rec;
            }
        };
        for payload in parser.feed(&bytes) {
            done |= apply_payload(&mut rec, &payload, at);
        }
    }
    if !done {
        fail(
            &mut rec,
            ErrorKind::Disconnected,
            "stream ended before [DONE]",
        );
    }
    rec
}

/// The first model `GET /v1/models` lists.
pub async fn served_model(
    client: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
) -> Result<String, String> {
    let url = format!("{}/v1/models", base_url.trim_end_matches('/'));
    let mut req = client.get(&url);
    if let Some(key) = api_key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.map_err(|e| format!("GET {url}: {e}"))?;
    let v: Value = resp.json().await.map_err(|e| format!("GET {url}: {e}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("GET {url}: no model listed in {v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_any_chunking() {
        let stream = b"data: {\"a\":1}\r\n\r\n: comment\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut p = SseParser::default();
            let mut got = p.feed(&stream[..split]);
            got.extend(p.feed(&stream[split..]));
            assert_eq!(got, vec!["{\"a\":1}", "x\ny", "[DONE]"], "split at {split}");
        }
    }

    #[test]
    fn payloads_update_the_record() {
        let mut r = RequestRecord::default();
        let t = Duration::from_millis;
        assert!(!apply_payload(
            &mut r,
            r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            t(1)
        ));
        assert!(!apply_payload(
            &mut r,
            r#"{"choices":[{"delta":{"content":"a"}}]}"#,
            t(5)
        ));
        assert!(!apply_payload(
            &mut r,
            r#"{"choices":[{"text":"b"}]}"#,
            t(7)
        ));
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;
        assert!(!apply_payload(&mut r, usage, t(8)));
        assert!(apply_payload(&mut r, "[DONE]", t(9)));
        assert_eq!(r.token_times, vec![t(5), t(7)]);
        assert_eq!((r.prompt_tokens, r.output_tokens(), r.ok()), (9, 3, true));
        apply_payload(&mut r, r#"{"error":{"message":"boom"}}"#, t(10));
        assert_eq!(
            r.error.as_ref().map(|e| e.kind),
            Some(ErrorKind::ServerError)
        );
        let mut bad = RequestRecord::default();
        apply_payload(&mut bad, "not json", t(1));
        assert_eq!(bad.error.map(|e| e.kind), Some(ErrorKind::Protocol));
    }

    #[test]
    fn bodies_follow_the_endpoint() {
        let mut target = Target {
            base_url: "http://x/".into(),
            endpoint: Endpoint::Completions,
            api_key: None,
            model: "m".into(),
        };
        assert_eq!(target.url("/v1/models"), "http://x/v1/models");
        let p = Prompt {
            input: PromptInput::Tokens(vec![1, 2]),
            prompt_len: 2,
            output_len: 4,
        };
        let opts = RequestOptions {
            min_tokens: true,
            ..RequestOptions::default()
        };
        let b = request_body(&target, &p, &opts).unwrap();
        assert_eq!(b["prompt"], json!([1, 2]));
        assert_eq!(
            (b["max_tokens"].clone(), b["min_tokens"].clone()),
            (json!(4), json!(4))
        );
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        target.endpoint = Endpoint::ChatCompletions;
        assert!(request_body(&target, &p, &opts).is_err());
        let text = Prompt {
            input: PromptInput::Text("hi".into()),
            ..p
        };
        let b = request_body(&target, &text, &RequestOptions::default()).unwrap();
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["max_completion_tokens"], 4);
        assert!(b.get("min_tokens").is_none());
    }
}
