//! Compiled constraints on the default model's tokenizer, driven token by token the way the
//! engine drives them: fill the mask, pick an allowed token, accept it. Random walks through
//! each grammar must end complete, in text the grammar describes.

use serde_json::{Value, json};
use tokenmill_engine::{ConstraintState, TokenMask};
use tokenmill_structured::{GrammarCompiler, StructuredError, StructuredOutput};
use tokenmill_tokenizer::Tokenizer;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap()
}

/// A small seeded generator (xorshift), so walks are reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Walks `state` with random allowed tokens (EOS, when allowed, half the time) until it is
/// complete; returns the text, or panics after `max_steps`.
fn walk(
    tok: &Tokenizer,
    mut state: Box<dyn ConstraintState>,
    seed: u64,
    max_steps: usize,
) -> String {
    let mut rng = Rng(seed | 1);
    let mut mask = TokenMask::new(tok.vocab_size());
    let eos = tok.eos_token_id().unwrap();
    let mut ids = Vec::new();
    for _ in 0..max_steps {
        mask.clear();
        state.fill_mask(&mut mask).unwrap();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&t| mask.is_allowed(t))
            .collect();
        assert!(
            !allowed.is_empty(),
            "nothing allowed after {:?}",
            tok.decode(&ids, false)
        );
        let t = if mask.is_allowed(eos) && rng.below(2) == 0 {
            eos
        } else {
            allowed[rng.below(allowed.len())]
        };
        if t != eos {
            assert!(
                !tok.is_special(t),
                "special token {t} allowed inside the output"
            );
            ids.push(t);
        }
        if state.accept(t).unwrap() {
            return tok.decode(&ids, false).unwrap();
        }
    }
    panic!(
        "not complete after {max_steps} tokens: {:?}",
        tok.decode(&ids, false)
    );
}

fn walks(c: &GrammarCompiler, tok: &Tokenizer, spec: &StructuredOutput, n: u64) -> Vec<String> {
    let constraint = c.compile(spec).unwrap().constraint;
    (1..=n)
        .map(|seed| walk(tok, constraint.start(), seed * 7919, 600))
        .collect()
}

#[test]
fn json_schema_walks_end_in_valid_json() {
    let tok = tokenizer();
    let c = GrammarCompiler::new(&tok).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
            "kind": {"anyOf": [{"const": "cat"}, {"type": "boolean"}]},
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}
        },
        "required": ["name", "age", "tags", "kind", "code"],
        "additionalProperties": false
    });
    for text in walks(&c, &tok, &StructuredOutput::JsonSchema(schema), 12) {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 8, "{text}");
        let age = v["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{text}");
        let tags = v["tags"].as_array().unwrap();
        assert!((1..=3).contains(&tags.len()), "{text}");
        assert!(
            tags.iter()
                .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap()))
        );
        assert!(v["kind"] == "cat" || v["kind"].is_boolean(), "{text}");
        let code = v["code"].as_str().unwrap().as_bytes();
        assert!(
            code.len() == 4 && code[..2].iter().all(u8::is_ascii_uppercase),
            "{text}"
        );
        assert_eq!(v.as_object().unwrap().len(), 5, "{text}");
    }
}

#[test]
fn json_object_regex_and_choice_walks_match() {
    let tok = tokenizer();
    let c = GrammarCompiler::new(&tok).unwrap();
    // Any object: strings are unbounded, so no random walk; the tokens of one object.
    let mut state = c
        .compile(&StructuredOutput::JsonObject)
        .unwrap()
        .constraint
        .start();
    let mut mask = TokenMask::new(tok.vocab_size());
    state.fill_mask(&mut mask).unwrap();
    for (text, allowed) in [("{", true), ("[", false), ("hello", false)] {
        let t = tok.encode(text, false).unwrap()[0];
        assert_eq!(mask.is_allowed(t), allowed, "{text}");
    }
    let ids = tok.encode(r#"{"a": [1, "x"]}"#, false).unwrap();
    let complete: Vec<bool> = ids.iter().map(|&t| state.accept(t).unwrap()).collect();
    assert_eq!(complete.iter().filter(|&&c| c).count(), 1, "{complete:?}");
    assert!(complete.last().unwrap());
    let rx = StructuredOutput::Regex(r"(yes|no), [0-9]{1,3}!".into());
    for text in walks(&c, &tok, &rx, 8) {
        let (word, rest) = text.split_once(", ").unwrap();
        assert!(word == "yes" || word == "no", "{text}");
        let digits = rest.strip_suffix('!').unwrap();
        assert!((1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()));
    }
    let choices = vec![
        "red".to_string(),
        "green \"quoted\"".into(),
        "blue\nline".into(),
    ];
    for text in walks(&c, &tok, &StructuredOutput::Choice(choices.clone()), 8) {
        assert!(choices.contains(&text), "{text:?}");
    }
    let lark = StructuredOutput::Lark(
        r#"start: "n=" NUM ";"
NUM: /[0-9]+/"#
            .into(),
    );
    for text in walks(&c, &tok, &lark, 4) {
        assert!(text.starts_with("n=") && text.ends_with(';'), "{text}");
    }
}

#[test]
fn a_second_compile_of_the_same_grammar_is_a_cache_hit() {
    let tok = tokenizer();
    let c = GrammarCompiler::new(&tok).unwrap();
    let spec = StructuredOutput::JsonSchema(
        json!({"type": "object", "properties": {"x": {"type": "number"}}}),
    );
    let first = c.compile(&spec).unwrap();
    let second = c.compile(&spec).unwrap();
    assert!(!first.cached && second.cached);
    assert_eq!(first.constraint, second.constraint);
    let other = c.compile(&StructuredOutput::Regex("a+".into())).unwrap();
    assert!(!other.cached);
    assert_ne!(other.constraint, first.constraint);
}

#[test]
fn bad_grammars_are_errors_that_say_what_is_wrong() {
    let tok = tokenizer();
    let c = GrammarCompiler::new(&tok).unwrap();
    let bad = [
        StructuredOutput::Regex("(unclosed".into()),
        StructuredOutput::Lark("start: undefined_rule".into()),
        StructuredOutput::JsonSchema(json!({"type": "no-such-type"})),
        StructuredOutput::JsonSchema(
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}),
        ),
    ];
    for spec in bad {
        match c.compile(&spec) {
            Err(StructuredError::Invalid(m)) => assert!(!m.is_empty()),
            other => panic!("{spec:?}: {:?}", other.map(|c| c.cached)),
        }
    }
}

#[test]
fn hugging_face_folder_tokenizers_work_too() {
    for name in ["llama", "mistral", "qwen2"] {
        let dir = tokenmill_testutil::fixtures_dir("hf").join(name);
        let tok = Tokenizer::from_hf_dir(&dir).unwrap();
        let c = GrammarCompiler::new(&tok).unwrap();
        let choices = vec!["yes".to_string(), "no way".into()];
        let constraint = c
            .compile(&StructuredOutput::Choice(choices.clone()))
            .unwrap()
            .constraint;
        for seed in 1..=4 {
            let text = walk(&tok, constraint.start(), seed, 50);
            assert!(choices.contains(&text), "{name}: {text:?}");
        }
    }
}
