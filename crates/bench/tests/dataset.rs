//! Workloads built with the default model's tokenizer: exact token lengths, shared prefixes,
//! seeds, text prompts that re-tokenize to their length, and JSONL / ShareGPT files (with
//! their errors).

use tokenmill_bench::dataset::{
    DatasetError, OutputLenDist, PromptFormat, PromptInput, RandomSpec, drawable_ids, file_prompts,
    random_prompts,
};
use tokenmill_tokenizer::Tokenizer;

fn tok() -> Tokenizer {
    Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap()
}

fn spec() -> RandomSpec {
    RandomSpec {
        num_prompts: 20,
        input_len: 64,
        output_len: 16,
        range_ratio: 0.0,
        output_dist: OutputLenDist::Uniform,
        prefix_len: 0,
        seed: 5,
    }
}

#[test]
fn random_token_prompts_have_exact_lengths_and_shared_prefix() {
    let t = tok();
    let allowed = drawable_ids(&t);
    assert!(allowed.iter().all(|&id| !t.is_special(id)));
    let s = RandomSpec {
        prefix_len: 8,
        ..spec()
    };
    let ps = random_prompts(&s, &t, PromptFormat::Tokens).unwrap();
    assert_eq!(ps, random_prompts(&s, &t, PromptFormat::Tokens).unwrap());
    let other = RandomSpec { seed: 6, ..s };
    assert_ne!(
        ps,
        random_prompts(&other, &t, PromptFormat::Tokens).unwrap()
    );
    let ids = |p: &tokenmill_bench::dataset::Prompt| match &p.input {
        PromptInput::Tokens(ids) => ids.clone(),
        PromptInput::Text(_) => panic!("expected ids"),
    };
    let prefix = ids(&ps[0])[..8].to_vec();
    for p in &ps {
        let v = ids(p);
        assert_eq!((v.len(), p.prompt_len, p.output_len), (72, 72, 16));
        assert_eq!(v[..8], prefix[..]);
        assert!(v.iter().all(|id| allowed.binary_search(id).is_ok()));
    }
    let ranged = RandomSpec {
        range_ratio: 0.5,
        ..spec()
    };
    for p in random_prompts(&ranged, &t, PromptFormat::Tokens).unwrap() {
        assert!((32..=96).contains(&p.prompt_len) && (8..=24).contains(&p.output_len));
    }
    // Exponential output lengths: prompts keep their range, outputs spread around the mean
    // with a long tail (mean 16, at most 8 × 16).
    let tail = RandomSpec {
        num_prompts: 400,
        range_ratio: 0.5,
        output_dist: OutputLenDist::Exponential,
        ..spec()
    };
    let outs: Vec<usize> = random_prompts(&tail, &t, PromptFormat::Tokens)
        .unwrap()
        .iter()
        .map(|p| {
            assert!((32..=96).contains(&p.prompt_len));
            p.output_len
        })
        .collect();
    let mean = outs.iter().sum::<usize>() as f64 / outs.len() as f64;
    assert!((mean - 16.0).abs() < 2.5, "mean {mean}");
    assert!(outs.iter().all(|&n| (1..=128).contains(&n)));
    assert!(outs.iter().any(|&n| n > 48), "no tail: {outs:?}");
    let bad = RandomSpec {
        range_ratio: 1.0,
        ..spec()
    };
    assert!(matches!(
        random_prompts(&bad, &t, PromptFormat::Tokens),
        Err(DatasetError::Invalid(_))
    ));
}

#[test]
fn text_prompts_retokenize_to_their_length() {
    let t = tok();
    let ps = random_prompts(&spec(), &t, PromptFormat::Text).unwrap();
    let mut exact = 0;
    for p in &ps {
        let PromptInput::Text(text) = &p.input else {
            panic!("expected text")
        };
        let n = t.encode(text, false).unwrap().len();
        assert_eq!(n, p.prompt_len, "the recorded length is the real one");
        exact += usize::from(n == 64);
    }
    // Decode/re-encode converges for nearly every random prompt.
    assert!(exact >= 18, "{exact} of 20 exact");
}

#[test]
fn jsonl_and_sharegpt_files() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("w.jsonl");
    std::fs::write(
        &jsonl,
        "{\"prompt\": \"Hello there\", \"output_len\": 5}\n\n{\"prompt\": [1, 2, 3], \"max_tokens\": 7}\n",
    )
    .unwrap();
    let mut ps = file_prompts(&jsonl, 10, None, 0, &t).unwrap();
    ps.sort_by_key(|p| p.output_len);
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[0].input, PromptInput::Text("Hello there".into()));
    assert_eq!(
        ps[0].prompt_len,
        t.encode("Hello there", false).unwrap().len()
    );
    assert_eq!(
        (ps[1].input.clone(), ps[1].output_len),
        (PromptInput::Tokens(vec![1, 2, 3]), 7)
    );
    assert!(file_prompts(&jsonl, 1, Some(3), 0, &t).unwrap()[0].output_len == 3);

    let share = dir.path().join("sg.json");
    let conv = r#"[{"conversations": [{"from": "human", "value": "Why is the sky blue?"},
                   {"from": "gpt", "value": "Rayleigh scattering of sunlight."}]},
                   {"conversations": []}]"#;
    std::fs::write(&share, conv).unwrap();
    let ps = file_prompts(&share, 10, None, 0, &t).unwrap();
    assert_eq!(ps.len(), 1, "the empty conversation is skipped");
    let reply = t
        .encode("Rayleigh scattering of sunlight.", false)
        .unwrap()
        .len();
    assert_eq!(ps[0].output_len, reply);

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"x\", \"output_len\": 1}\nnot json\n").unwrap();
    assert!(matches!(
        file_prompts(&bad, 10, None, 0, &t),
        Err(DatasetError::Parse { line: 2, .. })
    ));
    std::fs::write(&bad, "{\"prompt\": \"no length\"}\n").unwrap();
    assert!(matches!(
        file_prompts(&bad, 10, None, 0, &t),
        Err(DatasetError::Parse { line: 1, .. })
    ));
    std::fs::write(&bad, "{\"prompt\": [1, -2], \"output_len\": 1}\n").unwrap();
    assert!(file_prompts(&bad, 10, None, 0, &t).is_err());
    std::fs::write(&bad, "").unwrap();
    assert!(matches!(
        file_prompts(&bad, 10, None, 0, &t),
        Err(DatasetError::Empty)
    ));
    let missing = dir.path().join("missing.jsonl");
    assert!(matches!(
        file_prompts(&missing, 1, None, 0, &t),
        Err(DatasetError::Io { .. })
    ));
}
