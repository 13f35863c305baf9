//! Output constraints through the whole engine on the real default model: the mask decides
//! what is sampled, a complete constraint ends the request, a failing one fails only its own
//! request, and requests without a constraint generate exactly what they generate alone.
//!
//! The constraints here are small hand-written ones (the engine knows only the two traits);
//! the grammar-backed ones are tested in `tokenmill-structured` and the server.

mod real_model;

use std::sync::Arc;

use real_model::params;

use tokenmill_engine::{
    Constraint, ConstraintState, EngineError, EngineHandle, FinishReason, OutputConstraint,
    RequestParams, RequestStream, SamplingParams, SchedulerConfig, StreamEvent, TokenMask,
};

const PROMPTS: [&[u32]; 3] = [
    &[1, 504, 3458, 282, 4649, 314],
    &[1, 2683, 253, 1345, 28, 957, 314, 260],
    &[1, 378, 5065, 4217, 30],
];

/// Exactly these tokens, then complete.
struct Sequence(Vec<u32>);

struct SequenceState {
    tokens: Vec<u32>,
    at: usize,
}

impl OutputConstraint for Sequence {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(SequenceState {
            tokens: self.0.clone(),
            at: 0,
        })
    }
    fn describe(&self) -> String {
        format!("sequence {:?}", self.0)
    }
}

impl ConstraintState for SequenceState {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        mask.allow(self.tokens[self.at]);
        Ok(())
    }
    fn accept(&mut self, token: u32) -> Result<bool, String> {
        if token != self.tokens[self.at] {
            return Err(format!("{token} is not {}", self.tokens[self.at]));
        }
        self.at += 1;
        Ok(self.at == self.tokens.len())
    }
}

/// Only token ids that are a multiple of `modulus`; never complete. With `fail_after`, the
/// mask fails once that many tokens were accepted.
struct Multiples {
    modulus: u32,
    fail_after: Option<usize>,
}

struct MultiplesState {
    modulus: u32,
    fail_after: Option<usize>,
    accepted: usize,
}

impl OutputConstraint for Multiples {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(MultiplesState {
            modulus: self.modulus,
            fail_after: self.fail_after,
            accepted: 0,
        })
    }
    fn describe(&self) -> String {
        format!("multiples of {}", self.modulus)
    }
}

impl ConstraintState for MultiplesState {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        if self.fail_after == Some(self.accepted) {
            return Err("step limit reached".into());
        }
        for t in (0..mask.num_tokens() as u32).step_by(self.modulus as usize) {
            mask.allow(t);
        }
        Ok(())
    }
    fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.accepted += 1;
        match token % self.modulus {
            0 => Ok(false),
            _ => Err(format!("{token} is not allowed")),
        }
    }
}

fn constraint(c: impl OutputConstraint + 'static) -> Option<Constraint> {
    Some(Constraint::new(Arc::new(c)))
}

/// The default model with `num_blocks` KV blocks of 16, up to 8 sequences.
fn engine(num_blocks: usize) -> EngineHandle {
    let config = SchedulerConfig {
        num_blocks,
        block_size: 16,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: 512,
        ..SchedulerConfig::default()
    };
    real_model::engine(config)
}

/// Tokens and finish reason of a stream, or the error that ended it.
fn collect(mut s: RequestStream) -> Result<(Vec<u32>, FinishReason), (Vec<u32>, EngineError)> {
    let mut tokens = Vec::new();
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token(t) => {
                tokens.push(t.token);
                if let Some(r) = t.finish_reason {
                    return Ok((tokens, r));
                }
            }
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => {}
            StreamEvent::Error(e) => return Err((tokens, e)),
        }
    }
    panic!("stream ended without a finish reason");
}

#[test]
fn a_sequence_constraint_forces_its_tokens_and_ends_the_request() {
    let h = engine(64);
    let forced = vec![42, 7, 4242, 2];
    let sampled = SamplingParams {
        temperature: 1.0,
        seed: Some(5),
        ..SamplingParams::default()
    };
    for sampling in [SamplingParams::greedy(), sampled] {
        let p = RequestParams {
            constraint: constraint(Sequence(forced.clone())),
            ..params(32, sampling)
        };
        let (tokens, reason) = collect(h.submit(PROMPTS[0].to_vec(), p)).unwrap();
        assert_eq!(tokens, forced);
        // Complete before max_tokens, despite ignore_eos: a stop.
        assert_eq!(reason, FinishReason::Stop);
    }
}

#[test]
fn the_constraint_wins_over_a_min_tokens_ban() {
    let h = engine(64);
    let eos = 2;
    let p = RequestParams {
        min_tokens: 4,
        // As the server sends it: EOS both as the EOS and among the stop tokens.
        stop_token_ids: vec![eos],
        eos_token_id: Some(eos),
        ignore_eos: false,
        constraint: constraint(Sequence(vec![eos])),
        ..params(8, SamplingParams::greedy())
    };
    let (tokens, reason) = collect(h.submit(PROMPTS[1].to_vec(), p)).unwrap();
    assert_eq!((tokens, reason), (vec![eos], FinishReason::Stop));
}

#[test]
fn free_requests_beside_constrained_ones_generate_what_they_generate_alone() {
    let h = engine(256);
    let free = params(20, SamplingParams::greedy());
    let alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| collect(h.submit(p.to_vec(), free.clone())).unwrap().0)
        .collect();
    let constrained = RequestParams {
        constraint: constraint(Multiples {
            modulus: 3,
            fail_after: None,
        }),
        ..params(20, SamplingParams::greedy())
    };
    let constrained_alone = collect(h.submit(PROMPTS[2].to_vec(), constrained.clone()))
        .unwrap()
        .0;
    // One batch: every free prompt between constrained copies.
    let mut streams = Vec::new();
    for p in PROMPTS {
        streams.push((true, h.submit(PROMPTS[2].to_vec(), constrained.clone())));
        streams.push((false, h.submit(p.to_vec(), free.clone())));
    }
    let mut free_batched = Vec::new();
    for (is_constrained, s) in streams {
        let (tokens, _) = collect(s).unwrap();
        if is_constrained {
            assert!(tokens.iter().all(|t| t % 3 == 0), "{tokens:?}");
            assert_eq!(tokens, constrained_alone);
        } else {
            free_batched.push(tokens);
        }
    }
    assert_eq!(free_batched, alone);
    // The constraint did change what the model says.
    assert_ne!(constrained_alone, alone[2]);
}

#[test]
fn constrained_output_survives_preemption() {
    let constrained = RequestParams {
        constraint: constraint(Multiples {
            modulus: 2,
            fail_after: None,
        }),
        ..params(60, SamplingParams::greedy())
    };
    let roomy = engine(256);
    let alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            collect(roomy.submit(p.to_vec(), constrained.clone()))
                .unwrap()
                .0
        })
        .collect();
    drop(roomy);
    // 9 blocks of 16 for three requests that grow to ~70 tokens: some must be preempted
    // and recomputed, and their constraint state must carry on where it was.
    let tight = engine(9);
    let streams: Vec<RequestStream> = PROMPTS
        .iter()
        .map(|p| tight.submit(p.to_vec(), constrained.clone()))
        .collect();
    let batched: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).unwrap().0).collect();
    assert_eq!(batched, alone);
    let stats = tight.stats();
    assert!(stats.scheduler.num_preemptions > 0, "{:?}", stats.scheduler);
}

#[test]
fn a_failing_constraint_fails_its_request_alone() {
    let h = engine(64);
    let failing = RequestParams {
        constraint: constraint(Multiples {
            modulus: 5,
            fail_after: Some(3),
        }),
        ..params(16, SamplingParams::greedy())
    };
    let free = params(16, SamplingParams::greedy());
    let bad = h.submit(PROMPTS[0].to_vec(), failing);
    let good = h.submit(PROMPTS[1].to_vec(), free);
    let (tokens, err) = collect(bad).unwrap_err();
    assert_eq!(tokens.len(), 3);
    assert!(
        matches!(&err, EngineError::Constraint { message, .. } if message == "step limit reached"),
        "{err}"
    );
    let (tokens, reason) = collect(good).unwrap();
    assert_eq!((tokens.len(), reason), (16, FinishReason::Length));
    // The failed request's blocks came back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while h.stats().scheduler.num_running > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(h.stats().scheduler.num_running, 0);
}
