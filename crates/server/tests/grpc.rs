//! The gRPC tokenizer service: it round-trips the fixture strings exactly as the local
//! tokenizer does, renders chats identically, keeps client errors client errors, and an HTTP
//! server using it (`serve --tokenizer-endpoint`) answers as a local one does.

mod common;

use std::sync::Arc;

use common::{TestServer, client, post};
use serde_json::{Map, Value, json};
use tokenmill_server::grpc::{RemoteTokenizer, serve_tokenizer};
use tokenmill_server::{AppState, TokenizerPool};
use tokenmill_testutil::server::serve_on_ephemeral_port;
use tokenmill_tokenizer::Tokenizer;

/// Starts the service on an ephemeral port on its own runtime; returns its URL.
fn start_service(tok: Arc<Tokenizer>) -> String {
    let (addr, _thread) = serve_on_ephemeral_port(move |listener| async move {
        serve_tokenizer(listener, tok, 2, std::future::pending())
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

fn fixture_cases() -> Vec<Value> {
    let path = tokenmill_testutil::fixtures_dir("smollm2").join("tokenize.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

#[tokio::test]
async fn remote_tokenizer_round_trips_the_fixtures_like_the_local_one() {
    let local = Arc::new(Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap());
    let url = start_service(local.clone());
    let remote = RemoteTokenizer::connect(&url).await.unwrap();
    let info = remote.info().await.unwrap();
    assert_eq!(info.vocab_size as usize, local.vocab_size());
    assert_eq!(info.eos_token_id, local.eos_token_id());
    assert!(info.has_chat_template);

    let cases = fixture_cases();
    assert!(!cases.is_empty());
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        let ids = remote.encode(text.to_string(), true).await.unwrap();
        assert_eq!(ids, local.encode(text, true).unwrap(), "{text:?}");
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(ids, want, "{text:?}");
        let decoded = remote.decode(ids.clone(), false).await.unwrap();
        assert_eq!(decoded, local.decode(&ids, false).unwrap());
        assert_eq!(decoded, case["decoded"].as_str().unwrap());
        if case["roundtrip"] == true {
            assert_eq!(decoded, text);
        }
    }

    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there ✨"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]);
    for add in [true, false] {
        let r = remote
            .render_chat(&messages, add, &Map::new())
            .await
            .unwrap();
        let l = local
            .chat_template()
            .unwrap()
            .render_json(&messages, add, &Map::new())
            .unwrap();
        assert_eq!(r, l);
    }

    // A client error stays one across the wire.
    let e = remote.decode(vec![u32::MAX], false).await.unwrap_err();
    assert_eq!(e.0.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.to_api("tokens").status, 400);
    let mut raw = tokenmill_server::grpc::pb::tokenizer_client::TokenizerClient::connect(url)
        .await
        .unwrap();
    let e = raw
        .render_chat(tokenmill_server::grpc::pb::RenderChatRequest {
            messages_json: "{not json".into(),
            add_generation_prompt: true,
            extra_json: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(remote.encode("still up".into(), false).await.is_ok());
}

#[tokio::test]
async fn http_server_with_a_remote_tokenizer() {
    let loaded = common::load_default_model(&common::engine_options());
    let url = start_service(loaded.tokenizer.clone());
    let remote = RemoteTokenizer::connect(&url).await.unwrap();
    let pool = TokenizerPool::new(loaded.tokenizer.clone(), 2).with_remote(remote);
    let s = TestServer::start_with(AppState::new(common::server_config(), loaded.engine, pool));
    let c = client();
    let r: Value = c
        .get(s.url("/server_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["remote_tokenizer"], true);
    for case in fixture_cases().iter().take(8) {
        let (status, r) = post(&c, &s.url("/tokenize"), &json!({"prompt": case["text"]})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["tokens"], case["ids"]);
    }
    let (status, r) = post(
        &c,
        &s.url("/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 4);
    let (status, r) = post(
        &c,
        &s.url("/v1/completions"),
        &json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = post(&c, &s.url("/detokenize"), &json!({"tokens": [19556, 28]})).await;
    assert_eq!((status, &r["prompt"]), (200, &json!("Hello,")));
}
