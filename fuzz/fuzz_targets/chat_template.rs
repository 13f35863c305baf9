//! Fuzz target: hostile chat templates and hostile conversations through tokenmill's chat
//! template code (`ChatTemplate::new` + `render_json`, what the server's chat rendering runs,
//! `tokenizer_pool::render_chat_local`), with the limits the server applies (the crate's
//! `DEFAULT_FUEL` and `DEFAULT_MAX_OUTPUT_BYTES`: every `ChatTemplate::new` gets them).
//!
//! Property: compiling is `Ok` or `TemplateSyntax`; rendering is `Ok` (output within the byte
//! limit) or one of the template errors (`Template`, `TemplateLimit`, `TemplateRaised`) —
//! never a panic, and within libFuzzer's time and memory limits.
//!
//! Input: the template source, a NUL byte, then `arbitrary` data for the conversation
//! (messages with roles, content of every JSON shape, tool calls), the generation-prompt flag
//! and extra variables (`tools`, `chat_template_kwargs`). An empty template stands for the
//! real model's template, so conversations are fuzzed against a real template too.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use tokenmill_tokenizer::TokenizerError;
use tokenmill_tokenizer::chat::{ChatTemplate, DEFAULT_MAX_OUTPUT_BYTES};

/// A JSON value of bounded depth.
#[derive(Debug)]
struct J(Value);

impl<'a> Arbitrary<'a> for J {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<J> {
        fn go(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
            let leaf = depth >= 4;
            Ok(match u.int_in_range(0..=if leaf { 4 } else { 6 })? {
                0 => Value::Null,
                1 => Value::Bool(u.arbitrary()?),
                2 => json!(u.arbitrary::<i32>()?),
                3 => json!(u.arbitrary::<f32>()?),
                4 => Value::String(u.arbitrary()?),
                5 => {
                    let n = u.int_in_range(0..=4)?;
                    Value::Array((0..n).map(|_| go(u, depth + 1)).collect::<Result<_, _>>()?)
                }
                _ => {
                    let n = u.int_in_range(0..=4)?;
                    let mut m = Map::new();
                    for _ in 0..n {
                        m.insert(u.arbitrary()?, go(u, depth + 1)?);
                    }
                    Value::Object(m)
                }
            })
        }
        go(u, 0).map(J)
    }
}

const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "ipython",
];

#[derive(Arbitrary, Debug)]
enum Content {
    Text(String),
    Null,
    Parts(Vec<String>),
    Any(J),
}

#[derive(Arbitrary, Debug)]
struct Msg {
    role: u8,
    content: Content,
    tool_calls: Option<Vec<(String, J)>>,
    extra: Option<(String, J)>,
}

#[derive(Arbitrary, Debug)]
struct Conversation {
    messages: Vec<Msg>,
    add_generation_prompt: bool,
    tools: Option<Vec<(String, J)>>,
    kwargs: Option<Vec<(String, J)>>,
    bos: Option<String>,
    eos: Option<String>,
}

fn messages(c: &Conversation) -> Value {
    let msgs = c
        .messages
        .iter()
        .take(32)
        .map(|m| {
            let mut o = Map::new();
            o.insert("role".into(), ROLES[m.role as usize % ROLES.len()].into());
            let content = match &m.content {
                Content::Text(s) => Value::String(s.clone()),
                Content::Null => Value::Null,
                Content::Parts(p) => p
                    .iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect(),
                Content::Any(j) => j.0.clone(),
            };
            o.insert("content".into(), content);
            if let Some(calls) = &m.tool_calls {
                let calls: Vec<Value> = calls
                    .iter()
                    .take(4)
                    .map(|(name, args)| {
                        json!({"id": "call_0", "type": "function",
                               "function": {"name": name, "arguments": args.0}})
                    })
                    .collect();
                o.insert("tool_calls".into(), calls.into());
            }
            if let Some((k, v)) = &m.extra {
                o.insert(k.clone(), v.0.clone());
            }
            Value::Object(o)
        })
        .collect();
    Value::Array(msgs)
}

const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fuzz_target!(|data: &[u8]| {
    let (src, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(src) = std::str::from_utf8(src) else {
        return;
    };
    let src = if src.is_empty() {
        SMOLLM2_TEMPLATE
    } else {
        src
    };
    let Ok(conv) = Conversation::arbitrary_take_rest(Unstructured::new(rest)) else {
        return;
    };
    let template = match ChatTemplate::new(src, conv.bos.clone(), conv.eos.clone()) {
        Ok(t) => t,
        Err(TokenizerError::TemplateSyntax(_)) => return,
        Err(e) => panic!("compiling gave a non-syntax error: {e:?}"),
    };
    let mut extra = Map::new();
    if let Some(kw) = &conv.kwargs {
        for (k, v) in kw.iter().take(8) {
            extra.insert(k.clone(), v.0.clone());
        }
    }
    if let Some(tools) = &conv.tools {
        let tools: Vec<Value> = tools
            .iter()
            .take(4)
            .map(|(name, params)| {
                json!({"type": "function", "function": {"name": name, "parameters": params.0}})
            })
            .collect();
        extra.insert("tools".into(), tools.into());
    }
    match template.render_json(&messages(&conv), conv.add_generation_prompt, &extra) {
        Ok(text) => assert!(text.len() <= DEFAULT_MAX_OUTPUT_BYTES),
        Err(
            TokenizerError::Template(_)
            | TokenizerError::TemplateLimit(_)
            | TokenizerError::TemplateRaised(_),
        ) => {}
        Err(e) => panic!("rendering gave a non-template error: {e:?}"),
    }
});
