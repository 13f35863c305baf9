//! Fuzz target: `/v1/chat/completions` request bodies through the server's body reader
//! (`JsonBody`) and `validation::validate` with `Api::Chat`: sampling fields, `messages`
//! (roles, content shapes, tool calls), `tools` / `tool_choice` (tool prompting adapted to the
//! template, call grammars), template flags and `chat_template_kwargs`, rendering with the real
//! model's chat template on the tokenizer pool, tokenization and the context check.
//!
//! Property: `Ok` or a 4xx `ApiError`, never a panic or a 5xx; an accepted request satisfies
//! `tokenmill_fuzz::check_valid`.
//!
//! Input: the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmill_fuzz::{assert_client_error, check_valid, read_body, server};
use tokenmill_server::validation::{Api, validate};

// Load the model before fuzzing starts (outside the per-input timeout).
fuzz_target!(init: { tokenmill_fuzz::server(); }, |body: &[u8]| {
    let fields = match read_body(body) {
        Ok(f) => f,
        Err(e) => return assert_client_error(&e, body),
    };
    let (rt, state) = server();
    match rt.block_on(validate(state, &fields, Api::Chat)) {
        Ok(v) => {
            check_valid(&v);
            assert_eq!(v.generation.prompts.len(), 1);
            assert!(v.inputs.is_empty());
        }
        Err(e) => assert_client_error(&e, body),
    }
});
