//! Tool calling on `/v1/chat/completions`: the request's `tools`, `tool_choice` and
//! `parallel_tool_calls` ([`ToolRequest`]), how the model is told about the tools and how it
//! answers ([`format`]: Hermes `<tool_call>` blocks or Llama 3 JSON), and reading the calls
//! back out of its text, whole or as a stream ([`parser`]).
//!
//! With `tool_choice: "required"` or a named function the output is constrained (a grammar
//! built by [`format::ToolFormat::call_grammar`]) to valid calls whose arguments match the
//! functions' JSON schemas; with `auto` the model decides and its text is parsed; with
//! `none` the tools are only shown to the template.

pub mod format;
pub mod parser;

use serde_json::Value;

use crate::error::ApiError;
use crate::json::Fields;

/// Most tools one request may declare.
pub const MAX_TOOLS: usize = 128;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema (`{}` when not given).
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// The tool fields of a chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// The request's `tools` as sent (what the chat template receives).
    pub raw: Value,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools (a
    /// `tool_choice` other than `none`/`auto` then is a 400).
    pub fn parse(f: &Fields) -> Result<Option<ToolRequest>, ApiError> {
        let tools = match f.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, t)| parse_tool(i, t))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(ApiError::invalid_param("tools", "`tools` must be an array")),
        };
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::invalid_param(
                "tools",
                format!("at most {MAX_TOOLS} tools may be given"),
            ));
        }
        let choice = parse_choice(f.get("tool_choice"), &tools)?;
        let parallel = f.bool_or("parallel_tool_calls", true)?;
        if tools.is_empty() {
            return Ok(None);
        }
        Ok(Some(ToolRequest {
            raw: f.get("tools").cloned().unwrap_or(Value::Null),
            tools,
            choice,
            parallel,
        }))
    }

    /// Whether the model's text is read for tool calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools a call may name: all, or the one `tool_choice` names.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Function(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        }
    }
}

fn parse_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("tools", format!("tools[{i}]: {m}"));
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("only tools of type `function` are supported"));
    }
    let f = t
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad("needs a `function` object"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("function.name must be a string"))?;
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if !name_ok {
        return Err(bad(
            "function.name must be 1 to 64 letters, digits, underscores, dashes or dots",
        ));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(bad("function.parameters must be a JSON schema object")),
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("function.description must be a string")),
    };
    Ok(Tool {
        name: name.to_string(),
        description,
        parameters,
    })
}

fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tool_choice", m);
    let default = if tools.is_empty() {
        ToolChoice::None
    } else {
        ToolChoice::Auto
    };
    let choice = match v {
        None | Some(Value::Null) => default,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "`{other}` is not a tool_choice (none, auto, required, or a function)"
                )));
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad(
                        r#"a named tool_choice is {"type": "function", "function": {"name": ...}}"#
                            .into(),
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(bad(format!(
                    "tool_choice names `{name}`, which is not in `tools`"
                )));
            }
            ToolChoice::Function(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(bad("tool_choice requires `tools`".into()));
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(v: Value) -> Fields {
        Fields(v.as_object().unwrap().clone())
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}])
    }

    #[test]
    fn tools_and_choices_are_read() {
        let t = ToolRequest::parse(&fields(json!({"tools": weather()})))
            .unwrap()
            .unwrap();
        assert_eq!(t.tools[0].name, "get_weather");
        assert_eq!((t.choice.clone(), t.parallel), (ToolChoice::Auto, true));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = ToolRequest::parse(&fields(
            json!({"tools": weather(), "tool_choice": named, "parallel_tool_calls": false}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        assert!(!t.parallel);
        assert_eq!(t.callable().len(), 1);
        assert_eq!(ToolRequest::parse(&fields(json!({}))).unwrap(), None);
        assert_eq!(
            ToolRequest::parse(&fields(json!({"tool_choice": "none"}))).unwrap(),
            None
        );
    }

    #[test]
    fn bad_tools_name_their_field() {
        let named = |n: &str| json!({"type": "function", "function": {"name": n}});
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools",
            ),
            (
                json!({"tools": weather(), "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": weather(), "tool_choice": named("nope")}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": weather(), "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
        ] {
            let e = ToolRequest::parse(&fields(body.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }
}
