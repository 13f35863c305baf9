//! Fuzz target: `/tokenize` and `/detokenize` request bodies through the routes' own handlers
//! (`routes::tokenize::{tokenize, detokenize}`: `JsonBody`, model check, prompt or chat
//! `messages` rendered with the real model's template, encode / decode on the tokenizer pool).
//!
//! Property: `Ok` or a 4xx `ApiError`, never a panic or a 5xx. `/tokenize`: `count` equals the
//! number of `tokens`, every id is in the vocabulary, `token_strs` (when asked) has one entry
//! per token. `/detokenize`: `prompt` is a string equal to the tokenizer's own `decode`.
//!
//! Input: the first byte picks the route (even: `/tokenize`, odd: `/detokenize`), the rest is
//! the body.
#![no_main]

use axum::Json;
use axum::extract::State;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tokenmill_fuzz::{assert_client_error, read_body, server};
use tokenmill_server::json::{JsonBody, as_i64};
use tokenmill_server::routes::tokenize::{detokenize, tokenize};

// Load the model before fuzzing starts (outside the per-input timeout).
fuzz_target!(init: { tokenmill_fuzz::server(); }, |data: &[u8]| {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let fields = match read_body(body) {
        Ok(f) => f,
        Err(e) => return assert_client_error(&e, body),
    };
    let (rt, state) = server();
    let tok = state.pool.tokenizer();
    let vocab = tok.vocab_size();
    if route & 1 == 0 {
        let strs = fields.0.get("return_token_strs") == Some(&Value::Bool(true));
        match rt.block_on(tokenize(State(state.clone()), JsonBody(fields))) {
            Ok(Json(v)) => {
                let tokens = v["tokens"].as_array().expect("tokens");
                assert_eq!(v["count"].as_u64(), Some(tokens.len() as u64));
                assert!(
                    tokens
                        .iter()
                        .all(|t| t.as_u64().is_some_and(|id| (id as usize) < vocab))
                );
                if strs {
                    assert_eq!(v["token_strs"].as_array().map(Vec::len), Some(tokens.len()));
                }
            }
            Err(e) => assert_client_error(&e, body),
        }
    } else {
        let ids: Option<Vec<u32>> =
            fields
                .0
                .get("tokens")
                .and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .map(|v| as_i64(v).and_then(|x| u32::try_from(x).ok()))
                        .collect()
                });
        let skip = fields.0.get("skip_special_tokens") == Some(&Value::Bool(true));
        match rt.block_on(detokenize(State(state.clone()), JsonBody(fields))) {
            Ok(Json(v)) => {
                let prompt = v["prompt"].as_str().expect("prompt is a string");
                let ids = ids.expect("detokenize accepted tokens");
                assert_eq!(
                    Ok(prompt.to_string()),
                    tok.decode(&ids, skip).map_err(|_| ())
                );
            }
            Err(e) => assert_client_error(&e, body),
        }
    }
});
