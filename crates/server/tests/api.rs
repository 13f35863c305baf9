//! The HTTP API end to end on the real default model: every route, streaming and not,
//! sampling fields, logprobs, stop strings, and a bad-input matrix. One server is shared by
//! the tests of this file (they only need it to answer correctly, not to be idle).

mod common;

use std::sync::OnceLock;

use common::{MODEL, TestServer, client, post, post_stream};
use serde_json::{Value, json};

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(common::engine_options(), common::server_config()))
}

fn url(path: &str) -> String {
    server().url(path)
}

fn text_of_chunks(chunks: &[Value], field: impl Fn(&Value) -> Option<&str>) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|ch| field(&ch).map(str::to_string))
        .collect()
}

#[tokio::test]
async fn completions_streaming_matches_non_streaming() {
    let c = client();
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12,
                      "temperature": 0, "ignore_eos": true});
    let (status, r) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["model"], MODEL);
    assert!(r["id"].as_str().unwrap().starts_with("cmpl-"));
    let choice = &r["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(!text.is_empty());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(r["usage"]["prompt_tokens"], 5);
    assert_eq!(r["usage"]["completion_tokens"], 12);
    assert_eq!(r["usage"]["total_tokens"], 17);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let chunks = post_stream(&c, &url("/v1/completions"), &sbody).await;
    assert_eq!(text_of_chunks(&chunks, |ch| ch["text"].as_str()), text);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], r["usage"]);
    for ch in &chunks[..chunks.len() - 1] {
        assert!(ch["usage"].is_null() && ch.get("usage").is_some(), "{ch}");
        assert_eq!(ch["object"], "text_completion");
    }
    let finishes: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .map(|ch| &ch["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, vec!["length"]);

    // Without include_usage there is no usage chunk.
    sbody.as_object_mut().unwrap().remove("stream_options");
    let chunks = post_stream(&c, &url("/v1/completions"), &sbody).await;
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(text_of_chunks(&chunks, |ch| ch["text"].as_str()), text);
}

#[tokio::test]
async fn chat_completions_streaming_and_not() {
    let c = client();
    let body = json!({"model": MODEL, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
        "max_completion_tokens": 10, "temperature": 0});
    let (status, r) = post(&c, &url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    let msg = &r["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap();
    assert!(!content.is_empty());
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    let n = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=10).contains(&n));

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = post_stream(&c, &url("/v1/chat/completions"), &sbody).await;
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed = text_of_chunks(&chunks, |ch| ch["delta"]["content"].as_str());
    assert_eq!(streamed, content);
    let last = chunks.last().unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"],
        r["choices"][0]["finish_reason"]
    );
}

#[tokio::test]
async fn n_choices_with_seed_are_reproducible() {
    let c = client();
    let body = json!({"prompt": "Once upon a time", "n": 3, "max_tokens": 8,
                      "temperature": 1.0, "seed": 7, "ignore_eos": true});
    let (s1, r1) = post(&c, &url("/v1/completions"), &body).await;
    let (s2, r2) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!((s1, s2), (200, 200), "{r1} {r2}");
    let texts = |r: &Value| -> Vec<String> {
        r["choices"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                assert_eq!(ch["index"], i);
                ch["text"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let (t1, t2) = (texts(&r1), texts(&r2));
    assert_eq!(t1.len(), 3);
    assert_eq!(t1, t2, "same seed, same choices");
    assert!(
        t1[0] != t1[1] || t1[1] != t1[2],
        "choices sample differently"
    );
    assert_eq!(r1["usage"]["completion_tokens"], 24);

    // Several prompts × n: prompt i's choices are i*n .. i*n+n.
    let body = json!({"prompt": ["Hello", "The sky is"], "n": 2, "max_tokens": 3,
                      "temperature": 0, "ignore_eos": true});
    let (status, r) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let ch = r["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 4);
    assert_eq!(ch[0]["text"], ch[1]["text"], "greedy choices agree");
    assert_eq!(ch[2]["text"], ch[3]["text"]);
    assert_eq!(r["usage"]["prompt_tokens"], 1 + 3);
    assert_eq!(r["usage"]["completion_tokens"], 12);
}

#[tokio::test]
async fn stop_strings_and_stop_token_ids() {
    let c = client();
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0,
                      "ignore_eos": true});
    let (_, r) = post(&c, &url("/v1/completions"), &body).await;
    let full = r["choices"][0]["text"].as_str().unwrap().to_string();
    // A 3-character stop string from the middle of the greedy output.
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() > 10, "{full:?}");
    let (start, _) = chars[chars.len() / 2];
    let end = chars.get(chars.len() / 2 + 3).map_or(full.len(), |c| c.0);
    let stop = &full[start..end];
    let expected = &full[..full.find(stop).unwrap()];

    let mut sbody = body.clone();
    sbody["stop"] = json!([stop, "zzzz-never"]);
    let (status, r) = post(&c, &url("/v1/completions"), &sbody).await;
    assert_eq!(status, 200, "{r}");
    let ch = &r["choices"][0];
    assert_eq!(ch["text"], expected, "stop {stop:?} in {full:?}");
    assert_eq!(ch["finish_reason"], "stop");
    assert_eq!(ch["stop_reason"], stop);
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() < 16);

    sbody["stream"] = json!(true);
    let chunks = post_stream(&c, &url("/v1/completions"), &sbody).await;
    assert_eq!(text_of_chunks(&chunks, |ch| ch["text"].as_str()), expected);

    sbody["stream"] = json!(false);
    sbody["include_stop_str_in_output"] = json!(true);
    let (_, r) = post(&c, &url("/v1/completions"), &sbody).await;
    assert_eq!(r["choices"][0]["text"], format!("{expected}{stop}"));

    // A stop token id: the third token of the greedy output (as re-tokenized: for plain
    // text this is the generated token).
    let (_, t) = post(
        &c,
        &url("/tokenize"),
        &json!({"prompt": full, "add_special_tokens": false}),
    )
    .await;
    let third = t["tokens"][2].as_u64().unwrap();
    let mut tbody = body.clone();
    tbody["stop_token_ids"] = json!([third]);
    let (_, r) = post(&c, &url("/v1/completions"), &tbody).await;
    let ch = &r["choices"][0];
    assert_eq!(ch["finish_reason"], "stop", "{r}");
    assert_eq!(ch["stop_reason"], third);
    assert!(full.starts_with(ch["text"].as_str().unwrap()));
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}

#[tokio::test]
async fn logprobs_and_echo() {
    let c = client();
    let prompt = "The capital of France is";
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 3,
                      "ignore_eos": true});
    let (status, r) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let ch = &r["choices"][0];
    let lp = &ch["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 4);
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, ch["text"]);
    for i in 0..4 {
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!((1..=4).contains(&top.len()), "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((best - chosen).abs() < 1e-4, "greedy picks the most likely");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));

    // Echo with logprobs: the prompt's tokens first, the first without a logprob.
    let body = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 1,
                      "echo": true, "ignore_eos": true});
    let (status, r) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let ch = &r["choices"][0];
    assert!(ch["text"].as_str().unwrap().starts_with(prompt));
    let lp = &ch["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5 + 3);
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["top_logprobs"][0].is_null());
    for i in 1..8 {
        assert!(lp["token_logprobs"][i].as_f64().unwrap() <= 0.0);
    }
    // Streaming echo: the prompt arrives first.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = post_stream(&c, &url("/v1/completions"), &sbody).await;
    let streamed = text_of_chunks(&chunks, |ch| ch["text"].as_str());
    assert_eq!(streamed, ch["text"]);

    // Chat logprobs.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                      "temperature": 0, "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
    let (status, r) = post(&c, &url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for e in content {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert!(e["bytes"].is_array());
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
}

#[tokio::test]
async fn sampling_fields_are_accepted() {
    let c = client();
    let body = json!({"prompt": "Hello", "max_tokens": 6, "temperature": 0.8, "top_p": 0.9,
        "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.5,
        "repetition_penalty": 1.1, "logit_bias": {"28": -100}, "seed": 1, "min_tokens": 6,
        "priority": 3, "user": "u", "best_of": 1, "skip_special_tokens": true});
    let (status, r) = post(&c, &url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["usage"]["completion_tokens"], 6,
        "min_tokens = max_tokens"
    );
}

#[tokio::test]
async fn tokenize_and_detokenize_match_the_fixture() {
    let c = client();
    let path = tokenmill_testutil::fixtures_dir("smollm2").join("tokenize.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let (status, r) = post(&c, &url("/tokenize"), &json!({"prompt": case["text"]})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["tokens"], case["ids"], "{}", case["text"]);
        assert_eq!(r["count"], case["ids"].as_array().unwrap().len());
        assert_eq!(r["max_model_len"], 1024);
        assert!(r["token_strs"].is_null());
        let (status, d) = post(&c, &url("/detokenize"), &json!({"tokens": case["ids"]})).await;
        assert_eq!(status, 200, "{d}");
        assert_eq!(d["prompt"], case["decoded"]);
    }
    let (_, r) = post(
        &c,
        &url("/tokenize"),
        &json!({"prompt": "Hello, world!", "return_token_strs": true}),
    )
    .await;
    assert_eq!(r["token_strs"], json!(["Hello", ",", " world", "!"]));
    let (status, r) = post(
        &c,
        &url("/tokenize"),
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["count"].as_u64().unwrap() > 3);

    // GET /tokenizer_info (what lm-eval's remote tokenizer reads): the special tokens as text,
    // which /tokenize turns back into their ids, and the chat template.
    let info: Value = c
        .get(url("/tokenizer_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert_eq!(info["bos_token"], "<|im_start|>", "{info}");
    assert_eq!(info["model_max_length"], 1024);
    assert_eq!(info["vocab_size"], 49152);
    assert!(
        info["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>")
    );
    let eos = json!({"prompt": info["eos_token"], "add_special_tokens": false});
    let (_, r) = post(&c, &url("/tokenize"), &eos).await;
    assert_eq!(r["tokens"], json!([2]));
}

#[tokio::test]
async fn generate_route_plain_and_streaming() {
    let c = client();
    let body = json!({"prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (status, r) = post(&c, &url("/generate"), &body).await;
    assert_eq!(status, 200, "{r}");
    let text = r["text"][0].as_str().unwrap().to_string();
    assert!(text.starts_with("Hello") && text.len() > 5);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let resp = c.post(url("/generate")).json(&sbody).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!lines.is_empty());
    assert_eq!(lines.last().unwrap()["text"][0], text.as_str());
}

#[tokio::test]
async fn info_routes() {
    let c = client();
    let get = |p: &str| c.get(url(p)).send();
    let r: Value = get("/v1/models").await.unwrap().json().await.unwrap();
    assert_eq!(r["object"], "list");
    assert_eq!(r["data"][0]["id"], MODEL);
    assert_eq!(r["data"][1]["id"], "alias");
    assert_eq!(r["data"][0]["max_model_len"], 1024);
    let r: Value = get("/version").await.unwrap().json().await.unwrap();
    assert!(r["version"].is_string());
    let r: Value = get("/server_info").await.unwrap().json().await.unwrap();
    assert_eq!(r["served_model_name"], MODEL);
    assert!(r["model_path"].as_str().unwrap().ends_with(".gguf"));
    assert_eq!(get("/health").await.unwrap().status(), 200);

    let m = get("/metrics").await.unwrap().text().await.unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "tokenmill_step_time_predicted_seconds",
        "tokenmill_step_time_measured_seconds",
        "tokenmill_step_time_tail_ratio",
        "tokenmill_batch_size",
    ] {
        assert!(
            m.contains(&format!("{name}{{model_name=\"{MODEL}\"}}")),
            "{name} missing:\n{m}"
        );
    }
    for name in [
        "vllm:request_success_total{finished_reason=\"stop\"",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"182\"",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_sum",
        "tokenmill_rejected_requests_total{reason=\"max_waiting_requests\"",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }

    // Unknown routes and methods answer in the OpenAI error shape.
    let r = get("/v1/nope").await.unwrap();
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].is_string());
    let r = get("/v1/completions").await.unwrap();
    assert_eq!(r.status(), 405);
    // CORS is off by default.
    let r = c
        .get(url("/v1/models"))
        .header("Origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// A request that must fail: route, body, status, the `param` the error must name.
struct Bad {
    route: &'static str,
    body: Vec<u8>,
    status: u16,
    param: Option<&'static str>,
}

fn bad(route: &'static str, body: Value, status: u16, param: Option<&'static str>) -> Bad {
    Bad {
        route,
        body: body.to_string().into_bytes(),
        status,
        param,
    }
}

fn raw(route: &'static str, body: &[u8], status: u16) -> Bad {
    Bad {
        route,
        body: body.to_vec(),
        status,
        param: None,
    }
}

#[tokio::test]
async fn bad_input_matrix_then_a_good_request() {
    const C: &str = "/v1/completions";
    const CHAT: &str = "/v1/chat/completions";
    const R: &str = "/v1/responses";
    const E: &str = "/v1/embeddings";
    let p = |extra: Value| {
        let mut v = json!({"prompt": "Hi", "max_tokens": 2});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let chat = |extra: Value| {
        let mut v = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let long_ids: Vec<u32> = vec![504; 1100];
    let cases = vec![
        raw(C, b"{\"prompt\": ", 400),
        raw(C, b"{\"prompt\": \"\xff\xfe\"}", 400),
        raw(C, b"[1, 2]", 400),
        raw(C, b"", 400),
        raw(C, b"null", 400),
        bad(C, json!({"max_tokens": 2}), 400, Some("prompt")),
        bad(C, p(json!({"prompt": 5})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": ""})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": []})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": [99999999]})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": [-1]})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": [[1], "x"]})), 400, Some("prompt")),
        bad(C, p(json!({"prompt": long_ids})), 400, Some("prompt")),
        bad(
            C,
            p(json!({"temperature": "hot"})),
            400,
            Some("temperature"),
        ),
        bad(C, p(json!({"temperature": -1})), 400, Some("temperature")),
        bad(C, p(json!({"top_p": 0})), 400, Some("top_p")),
        bad(C, p(json!({"top_p": 1.5})), 400, Some("top_p")),
        bad(C, p(json!({"top_k": -5})), 400, Some("top_k")),
        bad(C, p(json!({"min_p": 2})), 400, Some("min_p")),
        bad(C, p(json!({"max_tokens": 0})), 400, Some("max_tokens")),
        bad(C, p(json!({"max_tokens": "ten"})), 400, Some("max_tokens")),
        bad(C, p(json!({"max_tokens": 2.5})), 400, Some("max_tokens")),
        bad(C, p(json!({"max_tokens": 100000})), 400, Some("max_tokens")),
        bad(C, p(json!({"n": 0})), 400, Some("n")),
        bad(C, p(json!({"n": 1000})), 400, Some("n")),
        bad(C, p(json!({"best_of": 3})), 400, Some("best_of")),
        bad(C, p(json!({"logprobs": 21})), 400, Some("logprobs")),
        bad(C, p(json!({"logprobs": true})), 400, Some("logprobs")),
        bad(
            C,
            p(json!({"presence_penalty": 3})),
            400,
            Some("presence_penalty"),
        ),
        bad(
            C,
            p(json!({"frequency_penalty": -3})),
            400,
            Some("frequency_penalty"),
        ),
        bad(
            C,
            p(json!({"repetition_penalty": 0})),
            400,
            Some("repetition_penalty"),
        ),
        bad(
            C,
            p(json!({"logit_bias": {"abc": 1}})),
            400,
            Some("logit_bias"),
        ),
        bad(
            C,
            p(json!({"logit_bias": {"5": 500}})),
            400,
            Some("logit_bias"),
        ),
        bad(C, p(json!({"logit_bias": [1]})), 400, Some("logit_bias")),
        bad(C, p(json!({"stop": 5})), 400, Some("stop")),
        bad(C, p(json!({"stop": [""]})), 400, Some("stop")),
        bad(
            C,
            p(json!({"stop_token_ids": [99999999]})),
            400,
            Some("stop_token_ids"),
        ),
        bad(C, p(json!({"min_tokens": 5})), 400, Some("min_tokens")),
        bad(C, p(json!({"seed": "x"})), 400, Some("seed")),
        bad(C, p(json!({"echo": "yes"})), 400, Some("echo")),
        bad(C, p(json!({"ignore_eos": 1})), 400, Some("ignore_eos")),
        bad(C, p(json!({"priority": 1e20})), 400, Some("priority")),
        bad(C, p(json!({"suffix": "x"})), 400, Some("suffix")),
        bad(
            C,
            p(json!({"stream_options": {"include_usage": true}})),
            400,
            Some("stream_options"),
        ),
        bad(C, p(json!({"model": "gpt-4"})), 404, Some("model")),
        bad(CHAT, json!({"max_tokens": 2}), 400, Some("messages")),
        bad(CHAT, chat(json!({"messages": []})), 400, Some("messages")),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": 5}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"content": "x"}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": "word ".repeat(1500)}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"top_logprobs": 2})),
            400,
            Some("top_logprobs"),
        ),
        bad(
            CHAT,
            chat(json!({"logprobs": true, "top_logprobs": 30})),
            400,
            Some("top_logprobs"),
        ),
        bad(
            CHAT,
            chat(json!({"max_completion_tokens": 0})),
            400,
            Some("max_completion_tokens"),
        ),
        bad(
            CHAT,
            chat(json!({"response_format": {"type": "yaml"}})),
            400,
            Some("response_format"),
        ),
        bad(CHAT, chat(json!({"model": "nope"})), 404, Some("model")),
        bad("/tokenize", json!({"text": "x"}), 400, Some("prompt")),
        bad("/detokenize", json!({"tokens": [-1]}), 400, Some("tokens")),
        bad("/detokenize", json!({"tokens": "abc"}), 400, Some("tokens")),
        bad(
            "/generate",
            json!({"prompt": ["a", "b"]}),
            400,
            Some("prompt"),
        ),
        bad(
            "/generate",
            json!({"prompt": "a", "top_p": -1}),
            400,
            Some("top_p"),
        ),
        // Conversations the chat template must never see (issue 21's validation gaps).
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user"}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "tool", "content": "42"}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "assistant", "tool_calls": "x"}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})),
            400,
            Some("messages"),
        ),
        bad(
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})),
            400,
            Some("messages"),
        ),
        bad(CHAT, chat(json!({"messages": "hi"})), 400, Some("messages")),
        bad(
            CHAT,
            chat(json!({"messages": ["hi"]})),
            400,
            Some("messages"),
        ),
        bad(CHAT, chat(json!({"tools": "x"})), 400, Some("tools")),
        bad(
            CHAT,
            chat(json!({"tool_choice": "sometimes"})),
            400,
            Some("tool_choice"),
        ),
        bad(
            CHAT,
            chat(json!({"response_format": {"type": "json_schema"}})),
            400,
            Some("response_format"),
        ),
        bad(
            CHAT,
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 5}}}})),
            400,
            Some("response_format"),
        ),
        bad(CHAT, chat(json!({"stream": "yes"})), 400, Some("stream")),
        bad(CHAT, chat(json!({"logprobs": 5})), 400, Some("logprobs")),
        bad(
            CHAT,
            chat(json!({"n": 2, "best_of": 3})),
            400,
            Some("best_of"),
        ),
        bad(
            C,
            p(json!({"guided_regex": "("})),
            400,
            Some("guided_regex"),
        ),
        bad(C, p(json!({"logprobs": -1})), 400, Some("logprobs")),
        bad(C, p(json!({"max_tokens": -3})), 400, Some("max_tokens")),
        bad(C, p(json!({"prompt": [[]]})), 400, Some("prompt")),
        bad(
            C,
            p(json!({"presence_penalty": "x"})),
            400,
            Some("presence_penalty"),
        ),
        raw(C, b"{\"prompt\": \"x\", \"temperature\": 1e400}", 400),
        raw(C, b"\xef\xbb\xbf{\"prompt\": \"x\"}", 400),
        Bad {
            route: C,
            body: format!("{{\"prompt\": {}1{}}}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            status: 400,
            param: None,
        },
        bad("/tokenize", json!({"prompt": 5}), 400, Some("prompt")),
        bad("/tokenize", json!({"messages": "x"}), 400, Some("messages")),
        bad(
            "/tokenize",
            json!({"prompt": "x", "add_special_tokens": "yes"}),
            400,
            Some("add_special_tokens"),
        ),
        bad("/detokenize", json!({}), 400, Some("tokens")),
        bad(
            "/detokenize",
            json!({"tokens": [99999999]}),
            400,
            Some("tokens"),
        ),
        bad("/generate", json!({}), 400, Some("prompt")),
        bad(
            "/generate",
            json!({"prompt": "a", "max_tokens": -1}),
            400,
            Some("max_tokens"),
        ),
        bad(
            "/generate",
            json!({"prompt": "a", "stream": 1}),
            400,
            Some("stream"),
        ),
        // The Responses API: its own parameters, then everything the chat validation checks.
        bad(R, json!({}), 400, Some("input")),
        bad(R, json!({"input": 42}), 400, Some("input")),
        bad(R, json!({"input": [{"content": "hi"}]}), 400, Some("input")),
        bad(
            R,
            json!({"input": [{"role": "wizard", "content": "hi"}]}),
            400,
            Some("input"),
        ),
        bad(R, json!({"input": [{"role": "user"}]}), 400, Some("input")),
        bad(
            R,
            json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            400,
            Some("input"),
        ),
        bad(
            R,
            json!({"input": [{"type": "function_call_output", "output": "x"}]}),
            400,
            Some("input"),
        ),
        bad(
            R,
            json!({"input": "hi", "previous_response_id": "resp_nope"}),
            400,
            Some("previous_response_id"),
        ),
        bad(
            R,
            json!({"input": "hi", "previous_response_id": 7}),
            400,
            Some("previous_response_id"),
        ),
        bad(
            R,
            json!({"input": "hi", "tools": [{"type": "web_search"}]}),
            400,
            Some("tools"),
        ),
        bad(
            R,
            json!({"input": "hi", "tools": {"name": "f"}}),
            400,
            Some("tools"),
        ),
        bad(
            R,
            json!({"input": "hi", "tools": [{"type": "function"}]}),
            400,
            Some("tools"),
        ),
        bad(
            R,
            json!({"input": "hi", "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"}}),
            400,
            Some("tool_choice"),
        ),
        bad(
            R,
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            400,
            Some("input"),
        ),
        bad(
            R,
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]}),
            400,
            Some("input"),
        ),
        bad(
            R,
            json!({"input": "hi", "text": {"format": {"type": "json_schema"}}}),
            400,
            Some("text.format"),
        ),
        bad(
            R,
            json!({"input": "hi", "instructions": 5}),
            400,
            Some("instructions"),
        ),
        bad(
            R,
            json!({"input": "hi", "max_output_tokens": -1}),
            400,
            Some("max_output_tokens"),
        ),
        bad(
            R,
            json!({"input": "hi", "temperature": "hot"}),
            400,
            Some("temperature"),
        ),
        bad(
            R,
            json!({"input": "hi", "store": "yes"}),
            400,
            Some("store"),
        ),
        bad(
            R,
            json!({"input": "hi", "model": "other"}),
            404,
            Some("model"),
        ),
        bad(E, json!({}), 400, Some("input")),
        bad(E, json!({"input": ""}), 400, Some("input")),
        bad(E, json!({"input": []}), 400, Some("input")),
        bad(E, json!({"input": [[]]}), 400, Some("input")),
        bad(E, json!({"input": 7}), 400, Some("input")),
        bad(E, json!({"input": [1, "a"]}), 400, Some("input")),
        bad(E, json!({"input": ["a", 1]}), 400, Some("input")),
        bad(E, json!({"input": [-1]}), 400, Some("input")),
        bad(E, json!({"input": [1u64 << 40]}), 400, Some("input")),
        bad(E, json!({"input": vec![1; 5000]}), 400, Some("input")),
        bad(E, json!({"input": vec!["a"; 300]}), 400, Some("input")),
        bad(
            E,
            json!({"input": "hi", "encoding_format": "int8"}),
            400,
            Some("encoding_format"),
        ),
        bad(
            E,
            json!({"input": "hi", "encoding_format": 1}),
            400,
            Some("encoding_format"),
        ),
        bad(
            E,
            json!({"input": "hi", "dimensions": 8}),
            400,
            Some("dimensions"),
        ),
        bad(
            E,
            json!({"input": "hi", "dimensions": "576"}),
            400,
            Some("dimensions"),
        ),
        bad(
            E,
            json!({"input": "hi", "normalize": "yes"}),
            400,
            Some("normalize"),
        ),
        bad(
            E,
            json!({"input": "hi", "truncate_prompt_tokens": -2}),
            400,
            Some("truncate_prompt_tokens"),
        ),
        bad(
            E,
            json!({"input": "hi", "add_special_tokens": 1}),
            400,
            Some("add_special_tokens"),
        ),
        bad(
            E,
            json!({"input": "hi", "model": "other"}),
            404,
            Some("model"),
        ),
        raw(E, b"[1, 2]", 400),
        raw("/no/such/route", b"{}", 404),
        raw("/v1/models", b"{}", 405),
        Bad {
            route: C,
            body: format!("{{\"prompt\": \"{}\"}}", "x".repeat(2 << 20)).into_bytes(),
            status: 413,
            param: None,
        },
    ];
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let c = client();
    let mut failures = Vec::new();
    for case in &cases {
        let r = c
            .post(url(case.route))
            .header("content-type", "application/json")
            .body(case.body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let shown = String::from_utf8_lossy(&case.body[..case.body.len().min(120)]).into_owned();
        if status != case.status {
            failures.push(format!("{} {status} {shown}: {text}", case.route));
            continue;
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{shown}: {text}"));
        let e = &v["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        assert!(e["type"].is_string(), "{text}");
        let o = e.as_object().unwrap();
        assert!(o.contains_key("param") && o.contains_key("code"), "{text}");
        if let Some(param) = case.param
            && e["param"] != param
        {
            failures.push(format!(
                "{} param {} {shown}: {text}",
                case.route, e["param"]
            ));
        }
        // Alive after each.
        let health = c.get(url("/health")).send().await.unwrap();
        assert_eq!(health.status(), 200, "after {shown}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The server is fine afterwards.
    let (status, r) = post(&c, &url(C), &json!({"prompt": "Hello", "max_tokens": 3})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["choices"][0]["text"].as_str().map(|t| !t.is_empty()),
        Some(true)
    );
}

/// A client that writes its whole oversized body before reading (Python's `urllib` does)
/// gets the 413, not a reset connection: the server reads the rest before answering.
#[tokio::test]
async fn an_oversized_body_written_whole_still_gets_its_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url("").trim_start_matches("http://").to_string();
    let body = format!(
        r#"{{"model": "{MODEL}", "prompt": "{}"}}"#,
        "a".repeat(30 << 20)
    );
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes())
        .await
        .expect("the server stopped reading the body");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .await
        .expect("the connection was reset");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("larger than the server's limit"),
        "{answer}"
    );
}

/// Every answer carries an `X-Request-Id`: the client's when it sent one, else a fresh one —
/// successes, 400s, 404s and 405s alike.
#[tokio::test]
async fn every_response_names_its_request_id() {
    let c = client();
    let good = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1});
    let bad = json!({"model": MODEL, "prompt": "Hi", "temperature": -1});
    let sent = c
        .post(url("/v1/completions"))
        .header("x-request-id", "trace-abc-123")
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 400);
    assert_eq!(sent.headers()["x-request-id"], "trace-abc-123");
    let mut seen = Vec::new();
    for r in [
        c.post(url("/v1/completions"))
            .json(&good)
            .send()
            .await
            .unwrap(),
        c.post(url("/v1/completions"))
            .json(&bad)
            .send()
            .await
            .unwrap(),
        c.get(url("/no/such/route")).send().await.unwrap(),
        c.get(url("/v1/completions")).send().await.unwrap(),
    ] {
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        seen.push((r.status().as_u16(), id));
    }
    let statuses: Vec<u16> = seen.iter().map(|s| s.0).collect();
    assert_eq!(statuses, [200, 400, 404, 405]);
    let distinct: std::collections::HashSet<&String> = seen.iter().map(|s| &s.1).collect();
    assert_eq!(distinct.len(), 4, "ids must differ: {seen:?}");
}
