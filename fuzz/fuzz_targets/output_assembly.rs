//! Fuzz target: the server's output assembly (`output::OutputProcessor`: incremental
//! detokenizer, stop strings with holdback, stop tokens, finish) over the real model's
//! tokenizer, with arbitrary in-vocabulary token ids, stop strings (arbitrary, or cut from
//! the decoded text so they do match, across token and UTF-8 boundaries), options, and an
//! arbitrary split of the token stream into event batches.
//!
//! Invariant checked (from `output.rs`): let `text_k` be the text of the first `k` tokens as
//! the incremental decoder emits it (the last token's text left out when it ended the request
//! as EOS / a special or client stop token and `include_stop_str_in_output` is off; the
//! decoder flushed after the last token). If some `text_k` contains a stop string, take the
//! first such `k` and in it the earliest occurrence (longest stop on a tie): the concatenated
//! `Update::text`s equal `text_k` cut right before it (right after it with
//! `include_stop_str_in_output`), the finish is `stop` with that string as `stop_reason`, and
//! the token ids reported are exactly the first `k`. Otherwise the text is the whole
//! `text_n` — which equals `Tokenizer::decode` of those ids, the non-streaming path — and the
//! finish is the last token's (`stop_reason` its id when it is a client stop token). However
//! the stream is batched, exactly one update carries the finish and nothing follows it.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenmill_engine::{FinishReason, StreamEvent, TokenOutput};
use tokenmill_fuzz::real_tokenizer;
use tokenmill_server::output::{Finish, OutputOptions, OutputProcessor, StopReason};
use tokenmill_server::validation::{MAX_STOP, MAX_STOP_BYTES};
use tokenmill_tokenizer::Tokenizer;

#[derive(Arbitrary, Debug)]
enum Stop {
    /// Bytes `start..start+len` of the decoded text (snapped to character boundaries).
    Cut(u16, u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    ids: Vec<u16>,
    stops: Vec<Stop>,
    include_stop_str_in_output: bool,
    skip_special_tokens: bool,
    logprobs: bool,
    /// The last token ends the request with `stop` (EOS / stop token / constraint) rather
    /// than `length`.
    finish_stop: bool,
    /// Client stop token ids, as indices into `ids`.
    stop_token_ids: Vec<u8>,
    batches: Vec<u8>,
}

/// Mostly the first ids (specials, bytes, short pieces), sometimes any id.
fn token_id(x: u16, vocab: usize) -> u32 {
    if x & 0x8000 != 0 {
        u32::from(x & 0x1ff) % vocab as u32
    } else {
        u32::from(x) % vocab as u32
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Earliest stop string occurrence in `text`, the longest on a tie.
fn earliest<'a>(text: &str, stops: &'a [String]) -> Option<(usize, &'a String)> {
    let mut best: Option<(usize, &String)> = None;
    for s in stops {
        if let Some(p) = text.find(s.as_str()) {
            let better = match best {
                None => true,
                Some((bp, bs)) => p < bp || (p == bp && s.len() > bs.len()),
            };
            if better {
                best = Some((p, s));
            }
        }
    }
    best
}

struct Expected {
    text: String,
    finish: Finish,
    tokens: usize,
}

fn expected(tok: &Tokenizer, ids: &[u32], opts: &OutputOptions, last: FinishReason) -> Expected {
    let n = ids.len();
    let last_id = ids[n - 1];
    let last_excluded = last == FinishReason::Stop
        && !opts.include_stop_str_in_output
        && (tok.is_special(last_id) || opts.stop_token_ids.contains(&last_id));
    let mut d = tok.decoder_with(opts.skip_special_tokens);
    let mut text = String::new();
    for (k, &id) in ids.iter().enumerate() {
        if !(k + 1 == n && last_excluded) {
            text.push_str(&d.push(tok, id).expect("in-vocabulary id"));
        }
        if k + 1 == n {
            text.push_str(&d.flush(tok).expect("flush"));
        }
        if let Some((pos, s)) = earliest(&text, &opts.stop) {
            let end = if opts.include_stop_str_in_output {
                pos + s.len()
            } else {
                pos
            };
            return Expected {
                text: text[..end].to_string(),
                finish: Finish {
                    reason: FinishReason::Stop,
                    stop_reason: Some(StopReason::Text(s.clone())),
                },
                tokens: k + 1,
            };
        }
    }
    // No stop string: the streamed text is the non-streaming decode.
    let used = if last_excluded { &ids[..n - 1] } else { ids };
    let decoded = tok
        .decode(used, opts.skip_special_tokens)
        .expect("in-vocabulary ids");
    assert_eq!(text, decoded, "incremental decoder differs from decode");
    let stop_reason = (last == FinishReason::Stop && opts.stop_token_ids.contains(&last_id))
        .then_some(StopReason::Token(last_id));
    Expected {
        text,
        finish: Finish {
            reason: last,
            stop_reason,
        },
        tokens: n,
    }
}

// Load the model before fuzzing starts (outside the per-input timeout).
fuzz_target!(init: { tokenmill_fuzz::real_tokenizer(); }, |inp: Input| {
    let tok: &Tokenizer = real_tokenizer();
    let vocab = tok.vocab_size();
    let ids: Vec<u32> = inp
        .ids
        .iter()
        .take(96)
        .map(|&x| token_id(x, vocab))
        .collect();
    if ids.is_empty() {
        return;
    }
    let full = tok
        .decode(&ids, inp.skip_special_tokens)
        .expect("in-vocabulary ids");
    // Stop strings as validation accepts them: 1..=MAX_STOP_BYTES bytes, at most MAX_STOP.
    let stop: Vec<String> = inp
        .stops
        .iter()
        .map(|s| match s {
            Stop::Cut(start, len) => {
                let a = floor_boundary(&full, *start as usize % (full.len() + 1));
                let b = floor_boundary(&full, a + 1 + *len as usize % 24);
                full[a..b].to_string()
            }
            Stop::Raw(s) => s.clone(),
        })
        .filter(|s| !s.is_empty() && s.len() <= MAX_STOP_BYTES)
        .take(MAX_STOP)
        .collect();
    let opts = OutputOptions {
        stop,
        include_stop_str_in_output: inp.include_stop_str_in_output,
        skip_special_tokens: inp.skip_special_tokens,
        stop_token_ids: inp
            .stop_token_ids
            .iter()
            .take(4)
            .map(|&i| ids[i as usize % ids.len()])
            .collect(),
        logprobs: inp.logprobs,
    };
    let last = if inp.finish_stop {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    let want = expected(tok, &ids, &opts, last);

    let events: Vec<StreamEvent> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            StreamEvent::Token(TokenOutput {
                token: id,
                logprob: -1.0,
                top_logprobs: vec![(id, -1.0)],
                finish_reason: (i + 1 == ids.len()).then_some(last),
                num_cached_tokens: 0,
                queue_time: None,
            })
        })
        .collect();
    let mut p = OutputProcessor::new(tok, opts);
    let mut events = events.into_iter();
    let mut sizes = inp
        .batches
        .iter()
        .map(|&b| b as usize % 8)
        .chain(std::iter::repeat(8));
    let (mut text, mut token_ids, mut finish) = (String::new(), Vec::new(), None);
    loop {
        let batch: Vec<StreamEvent> = events.by_ref().take(sizes.next().unwrap()).collect();
        let end = events.len() == 0;
        let up = p.process(tok, batch);
        assert!(up.error.is_none(), "{:?}", up.error);
        if finish.is_some() {
            assert!(up.text.is_empty() && up.token_ids.is_empty() && up.finish.is_none());
        }
        if inp.logprobs {
            assert_eq!(up.logprobs.len(), up.token_ids.len());
        } else {
            assert!(up.logprobs.is_empty());
        }
        text.push_str(&up.text);
        token_ids.extend_from_slice(&up.token_ids);
        if up.finish.is_some() {
            finish = up.finish;
        }
        if end {
            break;
        }
    }
    assert_eq!(text, want.text, "streamed text");
    assert_eq!(finish, Some(want.finish), "finish");
    assert_eq!(token_ids, ids[..want.tokens], "token ids");
    assert_eq!(p.num_tokens(), want.tokens);
});
