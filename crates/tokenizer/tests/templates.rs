//! Differential test: chat templates rendered here (minijinja) against transformers' own
//! renderer (Jinja2), on templates modelled on Qwen2.5 (tools), Llama 3.1, Mistral,
//! DeepSeek-R1, Gemma and on the Python string methods templates use.
//! Fixture: `tests/fixtures/templates.json`, made by `tests/fixtures/make_template_fixtures.py`.

use minijinja::Value;
use tokenmill_tokenizer::{ChatTemplate, TokenizerError};

fn fixtures() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/templates.json");
    let text = std::fs::read_to_string(path).unwrap();
    // Deserialised straight into template values so that objects keep their key order, as
    // Python dicts do (`tojson` of a tool schema must match byte for byte).
    serde_json::from_str(&text).unwrap()
}

fn get(v: &Value, key: &str) -> Value {
    v.get_attr(key).unwrap()
}

#[test]
fn templates_render_like_transformers() {
    let fx = fixtures();
    let cases = get(&fx, "cases");
    let mut checked = 0;
    for case in cases.try_iter().unwrap() {
        let name = get(&case, "template");
        let conv = get(&case, "conversation");
        let source = get(&get(&fx, "templates"), name.as_str().unwrap());
        let messages = get(&get(&fx, "conversations"), conv.as_str().unwrap());
        let agp = get(&case, "add_generation_prompt").is_true();
        let tools = get(&case, "tools");
        let extra = if tools.is_none() {
            Value::UNDEFINED
        } else {
            minijinja::context! { tools => tools }
        };
        let template = ChatTemplate::new(
            source.as_str().unwrap(),
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap();
        let got = template.render_value(messages, agp, extra);
        let what = format!("{name} / {conv} / agp={agp}");
        match (
            got,
            get(&case, "text").as_str(),
            get(&case, "error").as_str(),
        ) {
            (Ok(text), Some(want), _) => assert_eq!(text, want, "{what}"),
            (Err(TokenizerError::TemplateRaised(msg)), None, Some(want)) => {
                assert_eq!(msg, want, "{what}")
            }
            (got, text, error) => {
                panic!("{what}: got {got:?}, want text {text:?} / error {error:?}")
            }
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} cases");
}
