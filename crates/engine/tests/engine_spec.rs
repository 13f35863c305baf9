//! Speculative decoding on the real default model is lossless: greedy output token for token
//! the same with prompt lookup on as off — on text that repeats (drafts mostly accepted) and
//! text that does not — and seeded sampling the same too, with stop tokens and `min_tokens`
//! landing where they land without speculation. The same with the model as its own draft
//! model; a draft model of another vocabulary is refused at launch.

mod real_model;

use real_model::{engine, fixture_prompts, params, small_config};
use tokenmill_engine::{
    EngineConfig, EngineError, EngineHandle, KvCacheMemory, KvDtype, ModelRunner, RequestParams,
    RequestStream, SamplingParams, SchedulerConfig, SpeculativeConfig, StreamEvent, launch, start,
};
use tokenmill_model::Model;

/// The fixture prompts, and each repeated twice and a half: the model continues copying,
/// which is what prompt lookup predicts.
fn prompts() -> Vec<Vec<u32>> {
    let plain = fixture_prompts();
    let repeated = plain.iter().map(|p| {
        let mut r = p.repeat(2);
        r.extend_from_slice(&p[..p.len() / 2]);
        r
    });
    plain.clone().into_iter().chain(repeated).collect()
}

fn config(speculative: Option<SpeculativeConfig>) -> SchedulerConfig {
    SchedulerConfig {
        speculative,
        ..small_config()
    }
}

/// Every draft prompt lookup finds, up to 5.
fn fixed() -> Option<SpeculativeConfig> {
    Some(SpeculativeConfig {
        adaptive: false,
        ..SpeculativeConfig::ngram(5)
    })
}

/// Tokens and logprobs of a stream.
fn collect(mut s: RequestStream) -> (Vec<u32>, Vec<f32>) {
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token(t) => {
                tokens.push(t.token);
                logprobs.push(t.logprob);
            }
            StreamEvent::PromptLogprobs { .. } | StreamEvent::Embedding(_) => {}
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (tokens, logprobs)
}

/// Runs every prompt, one request at a time or all at once.
fn run(h: &EngineHandle, prompts: &[Vec<u32>], p: &RequestParams, together: bool) -> Vec<Vec<u32>> {
    if together {
        let streams: Vec<_> = prompts
            .iter()
            .map(|pr| h.submit(pr.clone(), p.clone()))
            .collect();
        streams.into_iter().map(|s| collect(s).0).collect()
    } else {
        prompts
            .iter()
            .map(|pr| collect(h.submit(pr.clone(), p.clone())).0)
            .collect()
    }
}

#[test]
fn greedy_output_is_the_same_with_prompt_lookup_alone_and_batched() {
    let prompts = prompts();
    let p = params(32, SamplingParams::greedy());
    let off = engine(config(None));
    let want = run(&off, &prompts, &p, false);
    drop(off);
    for (name, spec) in [
        ("fixed", fixed()),
        ("adaptive", Some(SpeculativeConfig::ngram(5))),
    ] {
        let h = engine(config(spec));
        assert_eq!(run(&h, &prompts, &p, false), want, "{name}, alone");
        assert_eq!(run(&h, &prompts, &p, true), want, "{name}, batched");
        let s = h.stats().scheduler.spec_decode;
        eprintln!("{name}: {s:?}, acceptance {:.2}", s.acceptance_rate());
        assert!(s.num_accepted_tokens > 0, "{name}: nothing accepted: {s:?}");
    }
}

#[test]
fn seeded_sampling_stop_tokens_and_min_tokens_land_where_they_do_without_speculation() {
    let prompts = prompts();
    let sampling = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        repetition_penalty: 1.05,
        seed: Some(7),
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let off = engine(config(None));
    let on = engine(config(fixed()));
    for (i, prompt) in prompts.iter().enumerate() {
        let p = params(24, sampling.clone());
        let (want, want_lp) = collect(off.submit(prompt.clone(), p.clone()));
        let (got, got_lp) = collect(on.submit(prompt.clone(), p));
        assert_eq!(got, want, "prompt {i}: seeded sampling");
        for (a, b) in got_lp.iter().zip(&want_lp) {
            assert!((a - b).abs() < 1e-3, "prompt {i}: logprob {a} vs {b}");
        }
        // Stop at the 6th token's first occurrence; EOS = the 3rd token, banned for 4 tokens.
        let p = RequestParams {
            stop_token_ids: vec![want[5]],
            eos_token_id: Some(want[2]),
            min_tokens: 4,
            ignore_eos: false,
            ..params(24, sampling.clone())
        };
        let want = collect(off.submit(prompt.clone(), p.clone())).0;
        assert_eq!(
            collect(on.submit(prompt.clone(), p)).0,
            want,
            "prompt {i}: stops"
        );
    }
    assert!(on.stats().scheduler.spec_decode.num_accepted_tokens > 0);
}

/// An engine whose draft model is the default model itself.
fn self_drafting_engine(spec: SpeculativeConfig) -> EngineHandle {
    let config = config(Some(spec));
    let open = || Model::open(&tokenmill_testutil::model_path()).unwrap();
    let runner = ModelRunner::new(open(), &config)
        .with_draft(open(), &config, KvDtype::F32)
        .unwrap();
    start(runner, config).unwrap().0
}

#[test]
fn a_draft_model_changes_no_output_and_its_own_guesses_are_mostly_accepted() {
    let prompts = fixture_prompts();
    let p = params(32, SamplingParams::greedy());
    let off = engine(config(None));
    let want = run(&off, &prompts, &p, false);
    let seeded = params(
        24,
        SamplingParams {
            temperature: 0.8,
            seed: Some(3),
            ..SamplingParams::default()
        },
    );
    let want_seeded = run(&off, &prompts, &seeded, false);
    drop(off);
    let every = SpeculativeConfig {
        adaptive: false,
        ..SpeculativeConfig::draft_model(4)
    };
    let h = self_drafting_engine(every);
    assert_eq!(run(&h, &prompts, &p, false), want, "alone");
    assert_eq!(run(&h, &prompts, &p, true), want, "batched");
    // Greedy drafts of the same model are what the greedy target picks: the draft's KV holds
    // exactly the verified tokens (a stale slot would make it guess wrong).
    let s = h.stats().scheduler.spec_decode;
    eprintln!(
        "self-draft, greedy: {s:?}, acceptance {:.3}",
        s.acceptance_rate()
    );
    assert!(s.acceptance_rate() > 0.97, "{s:?}");
    assert_eq!(run(&h, &prompts, &seeded, false), want_seeded, "seeded");
}

#[test]
fn a_draft_model_must_share_the_vocabulary_and_be_asked_for() {
    let tiny = tokenmill_testutil::fixtures_dir("tiny").join("llama.gguf");
    let launch_with = |spec: Option<SpeculativeConfig>, path: Option<std::path::PathBuf>| {
        let config = EngineConfig {
            kv_cache_memory: KvCacheMemory::Bytes(64 << 20),
            speculative: spec,
            speculative_model: path,
            ..EngineConfig::default()
        };
        let model = Model::open(&tokenmill_testutil::model_path()).unwrap();
        match launch(&config, model) {
            Err(EngineError::InvalidConfig(m)) => m,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("launched"),
        }
    };
    let draft = Some(SpeculativeConfig::draft_model(4));
    let m = launch_with(draft, Some(tiny.clone()));
    assert!(m.contains("vocabulary"), "{m}");
    let m = launch_with(draft, None);
    assert!(m.contains("--speculative-model"), "{m}");
    let m = launch_with(Some(SpeculativeConfig::ngram(4)), Some(tiny));
    assert!(m.contains("draft model"), "{m}");
    let m = launch_with(draft, Some("/nonexistent/draft.gguf".into()));
    assert!(m.contains("/nonexistent/draft.gguf"), "{m}");
}
