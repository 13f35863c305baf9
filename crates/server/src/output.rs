//! [`OutputProcessor`]: one choice's engine events → text deltas, logprobs and the finish.
//!
//! Runs on the tokenizer pool (it detokenizes). Per token: push it through the incremental
//! detokenizer, append the new text to `pending`, then look for stop strings in `pending`.
//!
//! **Stop strings and holdback.** A stop string cannot start inside text already sent,
//! because text is only sent once no stop string could still match across it: after each
//! batch the longest suffix of `pending` that is a proper prefix of some stop string is held
//! back and everything before it is released. So the search only ever scans `pending`
//! (a few bytes) and the client never sees text that a later token turns into a stop. When
//! a stop string matches, the text ends right before it (or after it, with
//! `include_stop_str_in_output`), the choice finishes with `stop` and `stop_reason` = the
//! string, and the caller drops the engine stream, which aborts the engine request.
//!
//! A token that ends the request by being a stop token or EOS adds no text (vLLM's rule)
//! unless `include_stop_str_in_output`.
//!
//! Invariant: the concatenation of all `Update::text`s equals the detokenized output up to
//! the stop (the same as `decode(ids)` when nothing stopped it).

use tokenmill_engine::{FinishReason, StreamEvent};
use tokenmill_tokenizer::{IncrementalDecoder, Tokenizer};

use crate::error::ApiError;

/// What the client asked for about the text of a choice.
#[derive(Clone, Debug, Default)]
pub struct OutputOptions {
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// The client's own stop token ids (reported as `stop_reason`).
    pub stop_token_ids: Vec<u32>,
    /// Collect per-token logprobs (with the top alternatives the engine returns).
    pub logprobs: bool,
}

/// One candidate token: id, text, raw bytes, logprob.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub token: u32,
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl Candidate {
    pub fn new(tok: &Tokenizer, token: u32, logprob: f32) -> Candidate {
        let text = tok.token_to_piece(token).unwrap_or_default();
        let bytes = tok
            .token_bytes(token)
            .map_or_else(|| text.as_bytes().to_vec(), |b| b.to_vec());
        Candidate {
            token,
            text,
            bytes,
            logprob,
        }
    }
}

/// One token with its logprob (`None` for the first prompt token) and its top alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub chosen: Candidate,
    pub has_logprob: bool,
    pub top: Vec<Candidate>,
}

impl TokenLogprob {
    pub fn new(tok: &Tokenizer, token: u32, logprob: f32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            chosen: Candidate::new(tok, token, logprob),
            has_logprob: true,
            top: top
                .iter()
                .map(|&(id, lp)| Candidate::new(tok, id, lp))
                .collect(),
        }
    }

    /// A prompt token without a logprob (the first one: nothing predicts it).
    pub fn without_logprob(tok: &Tokenizer, token: u32) -> TokenLogprob {
        TokenLogprob {
            chosen: Candidate::new(tok, token, 0.0),
            has_logprob: false,
            top: Vec::new(),
        }
    }
}

/// Why a choice stopped, as vLLM reports it in `stop_reason`.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

impl StopReason {
    pub fn to_json(reason: &Option<StopReason>) -> serde_json::Value {
        match reason {
            None => serde_json::Value::Null,
            Some(StopReason::Token(t)) => (*t).into(),
            Some(StopReason::Text(s)) => s.clone().into(),
        }
    }
}

/// The end of a choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(&self) -> &'static str {
        finish_reason_str(self.reason)
    }
}

/// OpenAI's name of a finish reason (`abort` is vLLM's).
pub fn finish_reason_str(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// What one batch of engine events produced for the client.
#[derive(Debug, Default)]
pub struct Update {
    /// Text that became final.
    pub text: String,
    /// Sampled tokens in this batch (up to a stop string).
    pub token_ids: Vec<u32>,
    /// Their logprobs, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Logprobs of prompt tokens (echo), in order from the second prompt token.
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub finish: Option<Finish>,
    pub error: Option<ApiError>,
}

impl Update {
    pub fn error(e: ApiError) -> Update {
        Update {
            error: Some(e),
            ..Update::default()
        }
    }

    pub fn is_last(&self) -> bool {
        self.finish.is_some() || self.error.is_some()
    }
}

pub struct OutputProcessor {
    opts: OutputOptions,
    decoder: IncrementalDecoder,
    /// Detokenized text not yet released (may hold the start of a stop string).
    pending: String,
    /// Output tokens so far.
    num_tokens: usize,
    done: bool,
}

impl OutputProcessor {
    pub fn new(tok: &Tokenizer, opts: OutputOptions) -> OutputProcessor {
        OutputProcessor {
            decoder: tok.decoder_with(opts.skip_special_tokens),
            opts,
            pending: String::new(),
            num_tokens: 0,
            done: false,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Processes a batch of events (in order); events after the end are ignored.
    pub fn process(&mut self, tok: &Tokenizer, events: Vec<StreamEvent>) -> Update {
        let mut up = Update::default();
        for ev in events {
            if self.done {
                break;
            }
            match ev {
                StreamEvent::PromptLogprobs { logprobs, .. } => {
                    up.prompt_logprobs.extend(
                        logprobs
                            .iter()
                            .map(|p| TokenLogprob::new(tok, p.token, p.logprob, &p.top)),
                    );
                }
                StreamEvent::Error(e) => {
                    self.done = true;
                    up.error = Some(ApiError::from_engine(&e));
                }
                StreamEvent::Embedding(_) => {
                    self.done = true;
                    up.error = Some(ApiError::internal("an embedding where tokens were due"));
                }
                StreamEvent::Token(t) => {
                    self.num_tokens += 1;
                    up.token_ids.push(t.token);
                    if self.opts.logprobs {
                        up.logprobs.push(TokenLogprob::new(
                            tok,
                            t.token,
                            t.logprob,
                            &t.top_logprobs,
                        ));
                    }
                    // The token that stopped the request (EOS or a stop token) is not part of
                    // the text (vLLM), unless stop strings are to be included. A plain token
                    // that completed an output constraint (a closing `}`) is text.
                    let stop_token = t.finish_reason == Some(FinishReason::Stop)
                        && !self.opts.include_stop_str_in_output
                        && (tok.is_special(t.token) || self.opts.stop_token_ids.contains(&t.token));
                    let piece = if stop_token {
                        Ok(String::new())
                    } else {
                        self.decoder.push(tok, t.token)
                    };
                    match piece {
                        Ok(s) => self.pending.push_str(&s),
                        Err(e) => {
                            self.done = true;
                            up.error = Some(ApiError::internal(format!("detokenizing: {e}")));
                            break;
                        }
                    }
                    if t.finish_reason.is_some()
                        && let Ok(rest) = self.decoder.flush(tok)
                    {
                        self.pending.push_str(&rest);
                    }
                    if let Some(f) = self.match_stop(&mut up.text) {
                        self.done = true;
                        up.finish = Some(f);
                    } else if let Some(reason) = t.finish_reason {
                        self.done = true;
                        let stop_reason = (reason == FinishReason::Stop
                            && self.opts.stop_token_ids.contains(&t.token))
                        .then_some(StopReason::Token(t.token));
                        up.finish = Some(Finish {
                            reason,
                            stop_reason,
                        });
                        up.text.push_str(&self.pending);
                        self.pending.clear();
                    }
                }
            }
        }
        if !self.done {
            self.release(&mut up.text);
        }
        up
    }

    /// Finds the earliest stop string in `pending`; on a match moves the text before it (and
    /// the string itself if asked) to `out`.
    fn match_stop(&mut self, out: &mut String) -> Option<Finish> {
        let (pos, stop) = self
            .opts
            .stop
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|(p, s)| (*p, std::cmp::Reverse(s.len())))?;
        let end = if self.opts.include_stop_str_in_output {
            pos + stop.len()
        } else {
            pos
        };
        out.push_str(&self.pending[..end]);
        let stop = stop.clone();
        self.pending.clear();
        Some(Finish {
            reason: FinishReason::Stop,
            stop_reason: Some(StopReason::Text(stop)),
        })
    }

    /// Moves to `out` everything of `pending` that no stop string can still claim.
    fn release(&mut self, out: &mut String) {
        // Only a suffix shorter than the longest stop string can be held back.
        let longest = self.opts.stop.iter().map(String::len).max().unwrap_or(0);
        let from = self.pending.len().saturating_sub(longest.saturating_sub(1));
        let keep = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .skip_while(|&i| i < from)
            .find(|&i| {
                let suffix = &self.pending[i..];
                self.opts.stop.iter().any(|s| s.starts_with(suffix))
            })
            .map_or(0, |i| self.pending.len() - i);
        let cut = self.pending.len() - keep;
        out.push_str(&self.pending[..cut]);
        self.pending.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_engine::TokenOutput;

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap()
    }

    fn tok_event(id: u32, finish: Option<FinishReason>) -> StreamEvent {
        StreamEvent::Token(TokenOutput {
            token: id,
            logprob: -0.5,
            top_logprobs: vec![(id, -0.5)],
            finish_reason: finish,
            num_cached_tokens: 0,
            queue_time: None,
        })
    }

    /// Feeds `text`'s tokens one event at a time; returns the released texts and the finish.
    fn run(tok: &Tokenizer, text: &str, stop: &[&str], include: bool) -> (Vec<String>, Finish) {
        let ids = tok.encode(text, false).unwrap();
        let mut p = OutputProcessor::new(
            tok,
            OutputOptions {
                stop: stop.iter().map(|s| s.to_string()).collect(),
                include_stop_str_in_output: include,
                skip_special_tokens: true,
                ..Default::default()
            },
        );
        let mut texts = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let last = i + 1 == ids.len();
            let up = p.process(
                tok,
                vec![tok_event(id, last.then_some(FinishReason::Length))],
            );
            texts.push(up.text);
            if let Some(f) = up.finish {
                return (texts, f);
            }
        }
        panic!("no finish");
    }

    #[test]
    fn no_stop_releases_everything() {
        let tok = tokenizer();
        let text = "Hello, world! The quick brown fox.";
        let (texts, f) = run(&tok, text, &[], false);
        assert_eq!(texts.concat(), text);
        assert_eq!(f.reason, FinishReason::Length);
        assert_eq!(f.stop_reason, None);
    }

    #[test]
    fn stop_string_across_tokens_is_never_released() {
        let tok = tokenizer();
        let text = "one two three four five";
        let (texts, f) = run(&tok, text, &["three fo"], false);
        assert_eq!(texts.concat(), "one two ");
        assert_eq!(f.reason, FinishReason::Stop);
        assert_eq!(f.stop_reason, Some(StopReason::Text("three fo".into())));
        // Nothing of the stop string was ever sent.
        assert!(texts.iter().all(|t| !t.contains("thr")));
        let (texts, _) = run(&tok, text, &["three fo"], true);
        assert_eq!(texts.concat(), "one two three fo");
    }

    #[test]
    fn earliest_stop_wins_and_partial_prefix_is_released_at_end() {
        let tok = tokenizer();
        let (texts, f) = run(&tok, "a b c d", &["d", "b"], false);
        assert_eq!(texts.concat(), "a ");
        assert_eq!(f.stop_reason, Some(StopReason::Text("b".into())));
        // A held-back prefix of a stop string that never completes comes out at the end.
        let (texts, f) = run(&tok, "alpha beta gam", &["gamma"], false);
        assert_eq!(texts.concat(), "alpha beta gam");
        assert_eq!(f.reason, FinishReason::Length);
    }

    #[test]
    fn stop_token_id_is_the_stop_reason() {
        let tok = tokenizer();
        let mut p = OutputProcessor::new(
            &tok,
            OutputOptions {
                stop_token_ids: vec![42],
                skip_special_tokens: true,
                logprobs: true,
                ..Default::default()
            },
        );
        let up = p.process(
            &tok,
            vec![
                tok_event(19556, None),
                tok_event(42, Some(FinishReason::Stop)),
            ],
        );
        assert_eq!(up.token_ids, vec![19556, 42]);
        assert_eq!(up.text, "Hello", "the stop token adds no text");
        assert_eq!(up.logprobs.len(), 2);
        assert_eq!(up.logprobs[0].chosen.text, "Hello");
        assert_eq!(up.logprobs[0].chosen.bytes, b"Hello");
        let f = up.finish.unwrap();
        assert_eq!(f.stop_reason, Some(StopReason::Token(42)));
        assert_eq!(p.num_tokens(), 2);
    }
}
