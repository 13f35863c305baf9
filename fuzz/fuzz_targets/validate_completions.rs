//! Fuzz target: `/v1/completions` and `/generate` request bodies through the server's own
//! body reader (`JsonBody`) and its one `validation::validate` (model, sampling fields,
//! prompt shapes and token ids, structured outputs, admission precheck, tokenization on the
//! tokenizer pool, context check), against the real model's tokenizer and a launched engine
//! (nothing is submitted to it).
//!
//! Property: `Ok` or a 4xx `ApiError`, never a panic or a 5xx; an accepted request satisfies
//! `tokenmill_fuzz::check_valid` (ids in the vocabulary, prompt + output within the context,
//! limits on `n` and stop strings).
//!
//! Input: the first byte picks the route (even: completions, odd: `/generate`), the rest is
//! the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmill_fuzz::{assert_client_error, check_valid, read_body, server};
use tokenmill_server::validation::{Api, validate};

// Load the model before fuzzing starts (outside the per-input timeout).
fuzz_target!(init: { tokenmill_fuzz::server(); }, |data: &[u8]| {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let api = if route & 1 == 0 {
        Api::Completions
    } else {
        Api::Generate
    };
    let fields = match read_body(body) {
        Ok(f) => f,
        Err(e) => return assert_client_error(&e, body),
    };
    let (rt, state) = server();
    match rt.block_on(validate(state, &fields, api)) {
        Ok(v) => {
            check_valid(&v);
            if api == Api::Generate {
                assert_eq!(v.generation.prompts.len(), 1);
            }
        }
        Err(e) => assert_client_error(&e, body),
    }
});
