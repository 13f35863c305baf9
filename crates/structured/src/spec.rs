//! [`StructuredOutput`]: what a request asks its output to be, and the llguidance grammar
//! that says it. JSON schemas go to llguidance's JSON compiler; regexes and Lark grammars
//! are llguidance's own syntaxes; a choice is a Lark alternation of string literals.

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use crate::error::StructuredError;

/// Longest schema, regex or grammar text compiled (bytes).
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// Deepest nesting of a JSON schema (objects and arrays) compiled.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Most alternatives of a choice.
pub const MAX_CHOICES: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
pub enum StructuredOutput {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON matching a JSON schema.
    JsonSchema(Value),
    /// Text matching a regular expression (whole output).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect; may embed `%json { schema }`).
    Lark(String),
}

impl StructuredOutput {
    /// The llguidance grammar, after the size checks.
    pub fn grammar(&self) -> Result<TopLevelGrammar, StructuredError> {
        let too_large = |what: &str, n: usize| {
            StructuredError::TooLarge(format!(
                "the {what} is {n} bytes; at most {MAX_SPEC_BYTES} are accepted"
            ))
        };
        match self {
            StructuredOutput::JsonObject => Ok(TopLevelGrammar::from_json_schema(with_json_style(
                &json!({"type": "object"}),
            ))),
            StructuredOutput::JsonSchema(schema) => {
                check_schema(schema)?;
                let n = serde_json::to_string(schema).map_or(0, |s| s.len());
                if n > MAX_SPEC_BYTES {
                    return Err(too_large("JSON schema", n));
                }
                Ok(TopLevelGrammar::from_json_schema(with_json_style(schema)))
            }
            StructuredOutput::Regex(rx) if rx.len() > MAX_SPEC_BYTES => {
                Err(too_large("regex", rx.len()))
            }
            StructuredOutput::Regex(rx) => Ok(TopLevelGrammar::from_regex(rx)),
            StructuredOutput::Choice(choices) => choice_grammar(choices),
            StructuredOutput::Lark(g) if g.len() > MAX_SPEC_BYTES => {
                Err(too_large("grammar", g.len()))
            }
            StructuredOutput::Lark(g) => Ok(TopLevelGrammar::from_lark(g.clone())),
        }
    }

    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::JsonSchema(_) => "json_schema",
            StructuredOutput::Regex(_) => "regex",
            StructuredOutput::Choice(_) => "choice",
            StructuredOutput::Lark(_) => "grammar",
        }
    }
}

/// How generated JSON is laid out, unless the schema's own `x-guidance` says otherwise:
/// one line, `", "` between items and `": "` after keys (OpenAI's and Python's `json.dumps`
/// style), so a small model cannot wander off into whitespace; and `oneOf` read as `anyOf`
/// (Pydantic writes `oneOf` for tagged unions). A `true` schema is `{}`.
pub fn with_json_style(schema: &Value) -> Value {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        other => other.clone(),
    };
    if let Value::Object(m) = &mut schema {
        let mut style = json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
            "coerce_one_of": true,
        });
        if let (Some(Value::Object(own)), Value::Object(style)) = (m.get("x-guidance"), &mut style)
        {
            style.extend(own.clone());
        }
        m.insert("x-guidance".into(), style);
    }
    schema
}

/// A schema is an object or a boolean, nested at most [`MAX_SCHEMA_DEPTH`] deep.
fn check_schema(schema: &Value) -> Result<(), StructuredError> {
    if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
        return Err(StructuredError::Invalid(
            "a JSON schema must be an object or a boolean".into(),
        ));
    }
    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    let d = depth(schema);
    if d > MAX_SCHEMA_DEPTH {
        return Err(StructuredError::TooLarge(format!(
            "the JSON schema nests {d} levels deep; at most {MAX_SCHEMA_DEPTH} are accepted"
        )));
    }
    Ok(())
}

fn choice_grammar(choices: &[String]) -> Result<TopLevelGrammar, StructuredError> {
    if choices.is_empty() {
        return Err(StructuredError::Invalid(
            "a choice needs at least one string".into(),
        ));
    }
    if choices.len() > MAX_CHOICES {
        return Err(StructuredError::TooLarge(format!(
            "{} choices; at most {MAX_CHOICES} are accepted",
            choices.len()
        )));
    }
    let n: usize = choices.iter().map(String::len).sum();
    if n > MAX_SPEC_BYTES {
        return Err(StructuredError::TooLarge(format!(
            "the choices are {n} bytes; at most {MAX_SPEC_BYTES} are accepted"
        )));
    }
    // A JSON string literal is a Lark string literal with the same escapes.
    let alternatives: Vec<String> = choices
        .iter()
        .map(|c| Value::String(c.clone()).to_string())
        .collect();
    Ok(TopLevelGrammar::from_lark(format!(
        "start: {}",
        alternatives.join(" | ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_depth_limits_are_errors_not_work() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        let e = StructuredOutput::JsonSchema(deep).grammar().unwrap_err();
        assert!(
            matches!(e, StructuredError::TooLarge(ref m) if m.contains("deep")),
            "{e}"
        );
        let e = StructuredOutput::Regex("a".repeat(MAX_SPEC_BYTES + 1))
            .grammar()
            .unwrap_err();
        assert!(matches!(e, StructuredError::TooLarge(_)));
        let e = StructuredOutput::Choice(vec![]).grammar().unwrap_err();
        assert!(matches!(e, StructuredError::Invalid(_)));
        let e = StructuredOutput::JsonSchema(json!("string"))
            .grammar()
            .unwrap_err();
        assert!(matches!(e, StructuredError::Invalid(_)));
    }
}
