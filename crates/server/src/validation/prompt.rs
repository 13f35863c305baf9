//! The prompt of a request, validated: completions' `prompt` (a string, strings, token ids or
//! lists of token ids) and chat's `messages` (roles, content as a string, `null` or text
//! parts), rendered with the model's chat template and tokenized — on the tokenizer pool,
//! never on the async runtime.

use crate::tools::ToolRequest;
use crate::tools::format::ToolPrompting;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::json::{Fields, as_i64};
use crate::state::{AppState, SharedState};

/// Most prompts in one completions request.
pub const MAX_PROMPTS: usize = 256;

/// One prompt as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

fn prompt_error(param: &'static str) -> ApiError {
    ApiError::invalid_param(
        param,
        format!(
            "`{param}` must be a string, an array of strings, an array of token ids or an \
             array of arrays of token ids"
        ),
    )
}

fn ids(a: &[Value], vocab: usize, param: &'static str) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| match as_i64(v) {
            Some(id) if id >= 0 && (id as u64) < vocab as u64 => Ok(id as u32),
            Some(id) => Err(ApiError::invalid_param(
                param,
                format!("token id {id} is outside the vocabulary (0..{vocab})"),
            )),
            None => Err(prompt_error(param)),
        })
        .collect()
}

/// Parses a prompt field named `param` (completions' `prompt`, embeddings' `input`): a
/// string, strings, token ids or lists of token ids.
pub fn parse_prompts(
    v: Option<&Value>,
    vocab: usize,
    param: &'static str,
) -> Result<Vec<PromptInput>, ApiError> {
    let prompts = match v {
        None => {
            return Err(ApiError::invalid_param(
                param,
                format!("`{param}` is required"),
            ));
        }
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid_param(
                param,
                format!("`{param}` is empty"),
            ));
        }
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(PromptInput::Text(s.clone())),
                    _ => Err(prompt_error(param)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Value::Number(_) => vec![PromptInput::Ids(ids(a, vocab, param)?)],
            Value::Array(_) => a
                .iter()
                .map(|v| match v {
                    Value::Array(inner) => Ok(PromptInput::Ids(ids(inner, vocab, param)?)),
                    _ => Err(prompt_error(param)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(prompt_error(param)),
        },
        Some(_) => return Err(prompt_error(param)),
    };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_param(
            param,
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    Ok(prompts)
}

/// Token ids of each prompt (text on the tokenizer pool; errors name `param`).
pub async fn tokenize_prompts(
    state: &AppState,
    prompts: &[PromptInput],
    add_special_tokens: bool,
    param: &'static str,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out = Vec::with_capacity(prompts.len());
    for p in prompts {
        out.push(match p {
            PromptInput::Text(t) => {
                state
                    .pool
                    .encode(t.clone(), add_special_tokens, param)
                    .await?
            }
            PromptInput::Ids(ids) => ids.clone(),
        });
    }
    Ok(out)
}

/// Most messages in one conversation.
const MAX_MESSAGES: usize = 4096;

/// Checks and normalises `messages` for the template: content parts joined into strings.
pub fn parse_messages(v: Option<&Value>) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("messages", msg);
    let Some(Value::Array(msgs)) = v else {
        return Err(bad("`messages` must be a non-empty array".into()));
    };
    if msgs.is_empty() || msgs.len() > MAX_MESSAGES {
        return Err(bad(format!(
            "`messages` must hold between 1 and {MAX_MESSAGES} messages"
        )));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(bad(format!("messages[{i}] must be an object")));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(bad(format!("messages[{i}].role must be a string")));
        };
        check_role_fields(i, role, m)?;
        let has_calls = m.contains_key("tool_calls");
        let mut m = m.clone();
        let content = match m.get("content") {
            // An assistant turn that only called tools: its calls are what the template reads.
            None | Some(Value::Null) if has_calls => Value::Null,
            // An assistant turn without content: empty text (templates add strings to it).
            None | Some(Value::Null) => Value::String(String::new()),
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                        _ => {
                            return Err(bad(format!(
                                "messages[{i}].content: only text parts are supported"
                            )));
                        }
                    }
                }
                Value::String(texts.join("\n"))
            }
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}].content must be a string or an array of parts"
                )));
            }
        };
        m.insert("content".into(), content);
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

/// Roles a conversation may hold (OpenAI's; `developer` is its newer `system`).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// What each role needs besides its role: content unless an assistant's (which may only call
/// tools), a `tool_call_id` for tool results, well-formed `tool_calls` for assistants.
fn check_role_fields(i: usize, role: &str, m: &Map<String, Value>) -> Result<(), ApiError> {
    let bad = |msg: String| ApiError::invalid_param("messages", msg);
    if !ROLES.contains(&role) {
        return Err(bad(format!(
            "messages[{i}].role `{role}` is not one of {}",
            ROLES.join(", ")
        )));
    }
    let has_content = !matches!(m.get("content"), None | Some(Value::Null));
    if role != "assistant" && !has_content {
        return Err(bad(format!("messages[{i}] ({role}) needs a `content`")));
    }
    if role == "tool" && !matches!(m.get("tool_call_id"), Some(Value::String(_))) {
        return Err(bad(format!(
            "messages[{i}] (tool) needs a string `tool_call_id`"
        )));
    }
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) if role == "assistant" => {
            for (k, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name_ok = f.and_then(|f| f.get("name")).is_some_and(Value::is_string);
                let args_ok = f
                    .and_then(|f| f.get("arguments"))
                    .is_none_or(|a| a.is_string() || a.is_object());
                if !name_ok || !args_ok {
                    return Err(bad(format!(
                        "messages[{i}].tool_calls[{k}] needs `function.name` (a string) and \
                         `function.arguments` (a JSON string)"
                    )));
                }
            }
        }
        Some(_) => {
            return Err(bad(format!(
                "messages[{i}].tool_calls must be an array on an assistant message"
            )));
        }
    }
    Ok(())
}

/// The template variables beyond `messages`: `tools`, `chat_template_kwargs`.
fn template_extra(f: &Fields) -> Result<Map<String, Value>, ApiError> {
    let mut extra = Map::new();
    match f.get("chat_template_kwargs") {
        None => {}
        Some(Value::Object(kw)) => extra.extend(kw.clone()),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ));
        }
    }
    match f.get("tools") {
        None => {}
        Some(t @ Value::Array(_)) => {
            extra.insert("tools".into(), t.clone());
        }
        Some(_) => {
            return Err(ApiError::invalid_param("tools", "`tools` must be an array"));
        }
    }
    Ok(extra)
}

/// A conversation checked and ready to render: `messages` normalised, the template flags
/// and variables read.
pub struct ChatPrompt {
    messages: Value,
    add_generation_prompt: bool,
    continue_final: bool,
    extra: Map<String, Value>,
}

impl ChatPrompt {
    /// Checks `messages`, `continue_final_message` / `add_generation_prompt` and the
    /// template variables of `f` (no tokenizer work).
    pub fn parse(f: &Fields) -> Result<ChatPrompt, ApiError> {
        let messages = parse_messages(f.get("messages"))?;
        let continue_final = f.bool_or("continue_final_message", false)?;
        let add_generation_prompt = f.bool_or("add_generation_prompt", !continue_final)?;
        if continue_final && add_generation_prompt {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ));
        }
        Ok(ChatPrompt {
            messages,
            add_generation_prompt,
            continue_final,
            extra: template_extra(f)?,
        })
    }

    /// Adapts the conversation to how the template meets tools ([`ToolPrompting::prepare`]).
    pub fn prepare_tools(&mut self, prompting: &ToolPrompting, tools: Option<&ToolRequest>) {
        prompting.prepare(&mut self.messages, tools);
    }

    /// The prompt text (on the tokenizer pool or the remote service). With
    /// `continue_final_message` the text ends right after the last message's content.
    pub async fn render(self, state: &AppState) -> Result<String, ApiError> {
        let last = self
            .messages
            .as_array()
            .and_then(|a| a.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut text = state
            .pool
            .render_chat(self.messages, self.add_generation_prompt, self.extra)
            .await?;
        if self.continue_final && !last.is_empty() {
            let Some(pos) = text.rfind(&last) else {
                return Err(ApiError::invalid_param(
                    "continue_final_message",
                    "the final message does not appear in the rendered conversation",
                ));
            };
            text.truncate(pos + last.len());
        }
        Ok(text)
    }
}

/// Renders the conversation of `f` to prompt text (`/tokenize` with `messages`).
pub async fn render_prompt(state: &SharedState, f: &Fields) -> Result<String, ApiError> {
    ChatPrompt::parse(f)?.render(state).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn prompt_shapes() {
        let p = |v: Value| parse_prompts(Some(&v), 100, "prompt");
        assert_eq!(
            p(json!("hi")).unwrap(),
            vec![PromptInput::Text("hi".into())]
        );
        assert_eq!(p(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(
            p(json!([1, 2])).unwrap(),
            vec![PromptInput::Ids(vec![1, 2])]
        );
        assert_eq!(p(json!([[1], [2, 3]])).unwrap().len(), 2);
        for bad in [
            json!([]),
            json!(5),
            json!(["a", 1]),
            json!([1, "a"]),
            json!([{}]),
        ] {
            assert_eq!(p(bad).unwrap_err().param.as_deref(), Some("prompt"));
        }
        assert!(p(json!([100])).unwrap_err().message.contains("outside"));
        assert!(p(json!([-1])).is_err());
        assert!(parse_prompts(None, 100, "prompt").is_err());
    }

    #[test]
    fn messages_are_normalised_and_checked() {
        let m = parse_messages(Some(&json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "name": "x"},
        ])))
        .unwrap();
        assert_eq!(m[0]["content"], "a\nb");
        assert_eq!(m[1]["name"], "x");
        assert_eq!(
            m[1]["content"], "",
            "a bare assistant turn renders as empty text"
        );
        let calls = json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"}]);
        let m = parse_messages(Some(&calls)).unwrap();
        assert!(m[0]["content"].is_null());
        for bad in [
            json!([]),
            json!("hi"),
            json!([{"content": "x"}]),
            json!([{"role": 1, "content": "x"}]),
            json!([{"role": "user", "content": 5}]),
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
            json!([3]),
            json!([{"role": "wizard", "content": "hi"}]),
            json!([{"role": "user"}]),
            json!([{"role": "system", "content": null}]),
            json!([{"role": "tool", "content": "42"}]),
            json!([{"role": "user", "content": "x", "tool_calls": []}]),
            json!([{"role": "assistant", "tool_calls": {}}]),
            json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]),
        ] {
            let e = parse_messages(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("messages"), "{bad}");
        }
    }
}
