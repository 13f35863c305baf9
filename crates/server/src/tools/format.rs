//! How a model is told about tools and how it calls them.
//!
//! Two call formats are read and written:
//! - **Hermes** (Qwen2/2.5, Hermes, and any template without tool support):
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call;
//! - **Llama 3 JSON** (Llama 3.1+ templates): the whole reply is
//!   `{"name": "f", "parameters": {...}}`, optionally after `<|python_tag|>`.
//!
//! A template that uses `tools` renders them itself ([`ToolPrompting::native`]); its source
//! tells which format it teaches. A template that ignores `tools` (SmolLM2's plain ChatML)
//! gets them the way llama.cpp's generic handler does it: a system message listing the
//! tools and the Hermes format, with earlier assistant calls written back as `<tool_call>`
//! blocks and tool results as `<tool_response>` blocks.

use serde_json::{Map, Value, json};
use tokenmill_structured::spec::with_json_style;

use super::{Tool, ToolRequest};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
}

/// How one model's chat template meets tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolPrompting {
    pub format: ToolFormat,
    /// The template renders `tools` itself.
    pub native: bool,
}

impl ToolPrompting {
    /// Reads a chat template's source (`None`: no template).
    pub fn for_template(source: Option<&str>) -> ToolPrompting {
        let src = source.unwrap_or("");
        let native = src.contains("tools");
        let llama3 = src.contains("python_tag") || src.contains("\"parameters\"");
        let format = if native && !src.contains("<tool_call>") && llama3 {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        };
        ToolPrompting { format, native }
    }

    /// Adapts `messages` for a template without tool support (see the module docs); a native
    /// template gets `arguments` strings of earlier calls as objects, as HF templates expect.
    pub fn prepare(&self, messages: &mut Value, tools: Option<&ToolRequest>) {
        let Some(list) = messages.as_array_mut() else {
            return;
        };
        for m in list.iter_mut() {
            if self.native {
                arguments_as_objects(m);
            } else {
                write_back_tool_turns(m);
            }
        }
        if let Some(req) = tools.filter(|r| !self.native && r.parses_calls()) {
            let text = hermes_system_prompt(&req.callable());
            match list.first_mut() {
                Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
                    let own = first.get("content").and_then(Value::as_str).unwrap_or("");
                    first["content"] = Value::String(format!("{own}\n\n{text}").trim().into());
                }
                _ => list.insert(0, json!({"role": "system", "content": text})),
            }
        }
    }

    /// A Lark grammar whose sentences are valid calls of `req`'s callable tools (several,
    /// newline-separated, when parallel calls are allowed and the format has them).
    pub fn call_grammar(&self, req: &ToolRequest) -> String {
        let (key, parallel) = match self.format {
            ToolFormat::Hermes => ("arguments", req.parallel),
            ToolFormat::Llama3Json => ("parameters", false),
        };
        let mut rules = Vec::new();
        let mut bodies = Vec::new();
        for (i, t) in req.callable().into_iter().enumerate() {
            let head = format!("{{\"name\": {}, \"{key}\": ", Value::String(t.name.clone()));
            bodies.push(format!("fn{i}"));
            rules.push(format!("fn{i}: {} args{i} \"}}\"", Value::String(head)));
            rules.push(format!("args{i}: %json {}", with_json_style(&t.parameters)));
        }
        let start = match (self.format, parallel) {
            (ToolFormat::Hermes, true) => {
                "start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\""
            }
            (ToolFormat::Hermes, false) => {
                "start: call\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\""
            }
            (ToolFormat::Llama3Json, _) => "start: body",
        };
        format!(
            "{start}\nbody: {}\n{}\n",
            bodies.join(" | "),
            rules.join("\n")
        )
    }
}

/// The system text that teaches a template-less model the tools and the Hermes format.
fn hermes_system_prompt(tools: &[&Tool]) -> String {
    let mut list = String::new();
    for t in tools {
        let mut f = Map::new();
        f.insert("name".into(), Value::String(t.name.clone()));
        if let Some(d) = &t.description {
            f.insert("description".into(), Value::String(d.clone()));
        }
        f.insert("parameters".into(), t.parameters.clone());
        list.push_str(&json!({"type": "function", "function": f}).to_string());
        list.push('\n');
    }
    format!(
        "You may call one or more functions to help with the user's request. The functions \
         are listed in <tools></tools> tags:\n<tools>\n{list}</tools>\n\nTo call a function, \
         reply with a JSON object holding its name and arguments inside \
         <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}}\n</tool_call>"
    )
}

/// Earlier tool turns as text: an assistant's `tool_calls` become `<tool_call>` blocks after
/// its content; a `tool` message's content goes inside `<tool_response>`.
fn write_back_tool_turns(m: &mut Value) {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let content = m
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if role == "tool" {
        m["content"] = Value::String(format!("<tool_response>\n{content}\n</tool_response>"));
        return;
    }
    let Some(calls) = m.get("tool_calls").and_then(Value::as_array).cloned() else {
        return;
    };
    let mut text = content;
    for c in calls {
        let f = c.get("function").cloned().unwrap_or(Value::Null);
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
            Some(v) => v.clone(),
            None => json!({}),
        };
        let call =
            json!({"name": f.get("name").cloned().unwrap_or(Value::Null), "arguments": args});
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
    }
    if let Some(o) = m.as_object_mut() {
        o.remove("tool_calls");
        o.insert("content".into(), Value::String(text));
    }
}

/// `function.arguments` of earlier calls parsed from their JSON string.
fn arguments_as_objects(m: &mut Value) {
    let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return;
    };
    for c in calls {
        if let Some(args) = c.get_mut("function").and_then(|f| f.get_mut("arguments"))
            && let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok())
        {
            *args = parsed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    fn request(parallel: bool) -> ToolRequest {
        let tool = |name: &str| Tool {
            name: name.into(),
            description: Some("d".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        };
        ToolRequest {
            tools: vec![tool("get_weather"), tool("get_time")],
            raw: Value::Null,
            choice: ToolChoice::Required,
            parallel,
        }
    }

    #[test]
    fn templates_are_told_apart() {
        let p = |s: &str| ToolPrompting::for_template(Some(s));
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
        assert_eq!(
            p(chatml),
            ToolPrompting {
                format: ToolFormat::Hermes,
                native: false
            }
        );
        let qwen = "{% if tools %}<tools>{{ tools }}</tools> <tool_call>{% endif %}";
        assert_eq!(
            p(qwen),
            ToolPrompting {
                format: ToolFormat::Hermes,
                native: true
            }
        );
        let llama = "{% if tools %}{\"name\": ..., \"parameters\": ...}<|python_tag|>{% endif %}";
        assert_eq!(
            p(llama),
            ToolPrompting {
                format: ToolFormat::Llama3Json,
                native: true
            }
        );
    }

    #[test]
    fn a_plain_template_gets_a_system_prompt_and_tool_turns_as_text() {
        let p = ToolPrompting::for_template(Some("plain"));
        let mut messages = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]);
        p.prepare(&mut messages, Some(&request(true)));
        assert_eq!(messages[0]["role"], "system");
        let sys = messages[0]["content"].as_str().unwrap();
        assert!(
            sys.contains("\"name\":\"get_weather\"") && sys.contains("<tool_call>"),
            "{sys}"
        );
        assert_eq!(
            messages[2]["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert!(messages[2].get("tool_calls").is_none());
        assert_eq!(
            messages[3]["content"],
            "<tool_response>\n18 C\n</tool_response>"
        );
    }

    #[test]
    fn call_grammars_follow_the_format() {
        let hermes = ToolPrompting {
            format: ToolFormat::Hermes,
            native: true,
        };
        let g = hermes.call_grammar(&request(true));
        assert!(g.starts_with("start: call (\"\\n\" call)*"), "{g}");
        assert!(
            g.contains(r#"fn1: "{\"name\": \"get_time\", \"arguments\": " args1 "}""#),
            "{g}"
        );
        let g = hermes.call_grammar(&request(false));
        assert!(g.starts_with("start: call\n"), "{g}");
        let llama = ToolPrompting {
            format: ToolFormat::Llama3Json,
            native: true,
        };
        let g = llama.call_grammar(&request(true));
        assert!(
            g.starts_with("start: body\n") && g.contains("\\\"parameters\\\": "),
            "{g}"
        );
    }
}
