//! Speculative decoding over HTTP: a server with prompt lookup answers greedy completions —
//! streamed and not, with stop strings and logprobs — exactly as a server without it does,
//! and its `/metrics` counts the drafts it verified and accepted.

mod common;

use serde_json::{Value, json};
use tokenmill_engine::{EngineConfig, SpeculativeConfig};

use common::{MODEL, TestServer, client, metric, metrics, post, post_stream};

/// Text the model continues by copying: a list, then the same list again, cut short.
fn prompt() -> String {
    let items = "apples, pears, plums, cherries, grapes, lemons, limes, oranges, melons, figs";
    format!(
        "Shopping list: {items}.\nThe same list again: {}",
        &items[..20]
    )
}

fn completion(text: &Value) -> (String, Value) {
    let c = &text["choices"][0];
    (
        c["text"].as_str().unwrap().to_string(),
        c["logprobs"]["tokens"].clone(),
    )
}

#[tokio::test]
async fn replies_are_the_same_with_prompt_lookup_and_its_metrics_count_the_drafts() {
    let off = TestServer::start(common::engine_options(), common::server_config());
    let engine = EngineConfig {
        speculative: Some(SpeculativeConfig::ngram(5)),
        ..common::engine_options()
    };
    let on = TestServer::start(engine, common::server_config());
    let c = client();
    let bodies = [
        json!({"model": MODEL, "prompt": prompt(), "max_tokens": 48, "temperature": 0, "logprobs": 1}),
        json!({"model": MODEL, "prompt": prompt(), "max_tokens": 48, "temperature": 0, "stop": ["melons"]}),
    ];
    for body in &bodies {
        let (s_off, want) = post(&c, &off.url("/v1/completions"), body).await;
        let (s_on, got) = post(&c, &on.url("/v1/completions"), body).await;
        assert_eq!((s_off, s_on), (200, 200));
        assert_eq!(completion(&got), completion(&want), "{body}");
        assert_eq!(got["usage"], want["usage"]);
        assert_eq!(
            got["choices"][0]["finish_reason"],
            want["choices"][0]["finish_reason"]
        );
        // Streamed: the pieces join to the same text.
        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let chunks = post_stream(&c, &on.url("/v1/completions"), &stream).await;
        let text: String = chunks
            .iter()
            .filter_map(|ch| ch["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, completion(&want).0);
    }
    let m = metrics(&c, &on.base).await;
    let drafts = metric(&m, "vllm:spec_decode_num_draft_tokens_total").unwrap();
    let accepted = metric(&m, "vllm:spec_decode_num_accepted_tokens_total").unwrap();
    assert!(
        accepted > 0.0 && accepted <= drafts,
        "{drafts} drafts, {accepted} accepted"
    );
    assert!(metric(&m, "vllm:spec_decode_draft_acceptance_rate").unwrap() > 0.0);
    let m = metrics(&c, &off.base).await;
    assert!(
        !m.contains("spec_decode"),
        "speculation metrics without speculation"
    );
}
