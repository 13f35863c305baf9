//! Structured-output fields of a request, in every spelling clients send:
//!
//! - OpenAI's `response_format`: `{"type": "text"}`, `{"type": "json_object"}`,
//!   `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
//! - vLLM's `structured_outputs` object: `json` (a schema, object or string), `regex`,
//!   `choice`, `grammar` (Lark), `json_object: true`;
//! - vLLM's older extra parameters: `guided_json`, `guided_regex`, `guided_choice`,
//!   `guided_grammar` (`guided_decoding_backend` and `guided_whitespace_pattern` are
//!   accepted and ignored: there is one backend, llguidance).
//!
//! At most one may be given. What comes out is a [`StructuredOutput`] and the name of the
//! field it came from (which a compile error then names). Compiling happens in
//! [`compile`], on the blocking pool.

use std::sync::Arc;

use serde_json::Value;
use tokenmill_engine::Constraint;
use tokenmill_structured::{GrammarCompiler, StructuredError, StructuredOutput};

use crate::error::ApiError;
use crate::json::Fields;

/// A requested output structure and the field that asked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputSpec {
    pub spec: StructuredOutput,
    pub param: &'static str,
}

/// Reads the structured-output fields of `f` (see the module docs).
pub fn parse(f: &Fields) -> Result<Option<OutputSpec>, ApiError> {
    let mut found: Vec<OutputSpec> = Vec::new();
    if let Some(rf) = f.get("response_format") {
        found.extend(response_format(rf)?);
    }
    if let Some(so) = f.get("structured_outputs") {
        found.extend(structured_outputs(so)?);
    }
    for (param, kind) in [
        ("guided_json", Kind::Json),
        ("guided_regex", Kind::Regex),
        ("guided_choice", Kind::Choice),
        ("guided_grammar", Kind::Grammar),
    ] {
        if let Some(v) = f.get(param).filter(|v| !v.is_null()) {
            found.push(OutputSpec {
                spec: kind.read(v, param)?,
                param,
            });
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|s| s.param).collect();
        return Err(ApiError::invalid_param(
            found[1].param,
            format!(
                "only one structured-output constraint may be given; got {}",
                names.join(", ")
            ),
        ));
    }
    Ok(found.pop())
}

#[derive(Clone, Copy)]
enum Kind {
    Json,
    Regex,
    Choice,
    Grammar,
}

impl Kind {
    fn read(self, v: &Value, param: &'static str) -> Result<StructuredOutput, ApiError> {
        let bad = |m: &str| ApiError::invalid_param(param, format!("`{param}` {m}"));
        match self {
            Kind::Json => Ok(StructuredOutput::JsonSchema(schema_value(v, param)?)),
            Kind::Regex => match v {
                Value::String(s) => Ok(StructuredOutput::Regex(s.clone())),
                _ => Err(bad("must be a string (a regular expression)")),
            },
            Kind::Grammar => match v {
                Value::String(s) => Ok(StructuredOutput::Lark(s.clone())),
                _ => Err(bad("must be a string (a Lark grammar)")),
            },
            Kind::Choice => match v {
                Value::Array(a) => a
                    .iter()
                    .map(|c| c.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .map(StructuredOutput::Choice)
                    .ok_or_else(|| bad("must be an array of strings")),
                _ => Err(bad("must be an array of strings")),
            },
        }
    }
}

/// A schema given as an object, a boolean, or a string holding JSON.
fn schema_value(v: &Value, param: &'static str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid_param(param, format!("`{param}` is not valid JSON: {e}"))
        }),
        _ => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be a JSON schema (an object)"),
        )),
    }
}

fn response_format(rf: &Value) -> Result<Option<OutputSpec>, ApiError> {
    const P: &str = "response_format";
    let bad = |m: &str| ApiError::invalid_param(P, m.to_string());
    let spec = match rf.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => StructuredOutput::JsonObject,
        Some("json_schema") => {
            let js = rf
                .get("json_schema")
                .ok_or_else(|| bad("response_format json_schema needs a `json_schema` object"))?;
            // OpenAI's shape is {name, schema, strict}; some clients send the schema itself.
            let schema = match js.get("schema") {
                Some(s) => s,
                None if js.get("type").is_some() || js.get("properties").is_some() => js,
                None => return Err(bad("response_format.json_schema needs a `schema`")),
            };
            StructuredOutput::JsonSchema(schema_value(schema, P)?)
        }
        Some(other) => {
            return Err(bad(&format!(
                "response_format type `{other}` is not supported (text, json_object, json_schema)"
            )));
        }
        None => return Err(bad("response_format needs a string `type`")),
    };
    Ok(Some(OutputSpec { spec, param: P }))
}

fn structured_outputs(so: &Value) -> Result<Option<OutputSpec>, ApiError> {
    const P: &str = "structured_outputs";
    let Value::Object(m) = so else {
        return Err(ApiError::invalid_param(
            P,
            "`structured_outputs` must be an object",
        ));
    };
    let mut specs = Vec::new();
    for (key, v) in m {
        if v.is_null() || v == &Value::Bool(false) {
            continue;
        }
        let spec = match key.as_str() {
            "json" => Kind::Json.read(v, P)?,
            "regex" => Kind::Regex.read(v, P)?,
            "choice" => Kind::Choice.read(v, P)?,
            "grammar" => Kind::Grammar.read(v, P)?,
            "json_object" => StructuredOutput::JsonObject,
            "disable_any_whitespace"
            | "disable_fallback"
            | "disable_additional_properties"
            | "whitespace_pattern"
            | "backend" => continue,
            other => {
                return Err(ApiError::invalid_param(
                    P,
                    format!(
                        "structured_outputs.{other} is not supported (json, regex, choice, \
                         grammar, json_object)"
                    ),
                ));
            }
        };
        specs.push(spec);
    }
    if specs.len() > 1 {
        return Err(ApiError::invalid_param(
            P,
            "structured_outputs may set only one of json, regex, choice, grammar, json_object",
        ));
    }
    Ok(specs.pop().map(|spec| OutputSpec { spec, param: P }))
}

/// Compiles `spec` on the blocking pool (or takes it from the compiler's cache). A grammar
/// that does not compile, or a server without a compiler, is a 400 naming the field.
pub async fn compile(
    compiler: &Result<Arc<GrammarCompiler>, String>,
    spec: OutputSpec,
) -> Result<Constraint, ApiError> {
    let compiler = Arc::clone(compiler.as_ref().map_err(|e| {
        ApiError::invalid_param(
            spec.param,
            format!("structured outputs are unavailable for this model: {e}"),
        )
    })?);
    let param = spec.param;
    let compiled = tokio::task::spawn_blocking(move || compiler.compile(&spec.spec))
        .await
        .map_err(|e| ApiError::internal(format!("grammar compiler: {e}")))?;
    match compiled {
        Ok(c) => Ok(c.constraint),
        Err(e @ (StructuredError::Invalid(_) | StructuredError::TooLarge(_))) => Err(
            ApiError::invalid_param(param, format!("`{param}` cannot be used: {e}")),
        ),
        Err(e @ StructuredError::Tokenizer(_)) => Err(ApiError::internal(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(v: Value) -> Fields {
        Fields(v.as_object().unwrap().clone())
    }

    fn spec(v: Value) -> Option<StructuredOutput> {
        parse(&fields(v)).unwrap().map(|s| s.spec)
    }

    #[test]
    fn every_spelling_is_read() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let want = Some(StructuredOutput::JsonSchema(schema.clone()));
        assert_eq!(spec(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object"}})),
            Some(StructuredOutput::JsonObject)
        );
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert_eq!(spec(json!({"response_format": rf})), want);
        assert_eq!(spec(json!({"guided_json": schema})), want);
        assert_eq!(spec(json!({"guided_json": schema.to_string()})), want);
        assert_eq!(spec(json!({"structured_outputs": {"json": schema}})), want);
        assert_eq!(
            spec(json!({"guided_choice": ["a", "b"]})),
            Some(StructuredOutput::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"regex": "a+", "disable_any_whitespace": true}})),
            Some(StructuredOutput::Regex("a+".into()))
        );
        assert_eq!(
            spec(json!({"guided_grammar": "start: \"x\""})),
            Some(StructuredOutput::Lark("start: \"x\"".into()))
        );
        assert_eq!(spec(json!({"guided_json": null})), None);
    }

    #[test]
    fn malformed_or_conflicting_fields_name_the_field() {
        for (body, param) in [
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
            ),
            (json!({"response_format": "json"}), "response_format"),
            (json!({"guided_regex": 5}), "guided_regex"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
            (json!({"guided_json": "{not json"}), "guided_json"),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"xml": "a"}}),
                "structured_outputs",
            ),
            (
                json!({"guided_regex": "a", "guided_choice": ["b"]}),
                "guided_choice",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
                "guided_regex",
            ),
        ] {
            let e = parse(&fields(body.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }
}
