//! Chat templates: `tokenizer.chat_template` / `tokenizer_config.json` Jinja rendered with
//! minijinja the way transformers' `apply_chat_template` renders it.
//!
//! Environment (matching transformers' `ImmutableSandboxedEnvironment`):
//! - `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the source dropped,
//!   `loop_controls` (`break`/`continue`) on, no auto-escaping;
//! - Python string/dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, `.get()`,
//!   ...) through `minijinja_contrib::pycompat`;
//! - globals `raise_exception(msg)`, `strftime_now(fmt)` (UTC) and `namespace()` (whose
//!   cycles, `{% set ns.me = ns %}`, are broken after each render: `namespaces.rs`); a
//!   `tojson` filter that writes JSON like Python's `json.dumps(..., ensure_ascii=False)` (`", "` and `": "`
//!   separators, `indent=`, `sort_keys=`, `ensure_ascii=` keyword arguments);
//! - variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` /
//!   `documents` set to none unless given;
//! - maps keep insertion order (minijinja's `preserve_order`), so `tojson` and `.items()`
//!   follow the caller's key order as Python dicts do.
//!
//! Sandbox and limits: templates have no file or network access (minijinja has none), every
//! render gets [`DEFAULT_FUEL`] instructions of fuel and may write at most
//! [`DEFAULT_MAX_OUTPUT_BYTES`]; a runaway or hostile template (a huge loop, a string blown up
//! in a loop) stops with [`TokenizerError::TemplateLimit`] instead of spinning or eating memory.
//! Not bounded: memory of values built without being printed (a string doubled in a loop
//! grows exponentially within the fuel budget); templates are trusted model metadata, not
//! request input.
//! A syntax error is a [`TokenizerError::TemplateSyntax`] from [`ChatTemplate::new`];
//! `raise_exception` is a [`TokenizerError::TemplateRaised`] (the conversation was rejected,
//! a client error), anything else a [`TokenizerError::Template`].

use std::io;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::TokenizerError;

/// Instructions one render may execute. Real templates use a few hundred per message.
pub const DEFAULT_FUEL: u64 = 5_000_000;

/// Bytes one render may produce.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 32 << 20;

const NAME: &str = "chat_template";

/// A template value (minijinja's), for [`ChatTemplate::render_value`]. Deserialise request
/// JSON straight into it (`serde_json::from_str::<TemplateValue>(text)`) to keep object key
/// order as Python dicts do, which `tojson` of a tool schema needs to match transformers.
pub use minijinja::Value as TemplateValue;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template. `Send + Sync`; rendering takes `&self`.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    max_output_bytes: usize,
}

/// The error `raise_exception` attaches, found again in the error's source chain.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of the BOS/EOS tokens the template may
    /// print (`{{ bos_token }}`).
    pub fn new(
        source: &str,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        // No source excerpts at render time (see [`describe`]); on by default in debug builds
        // only, so off here for the same messages in every build.
        env.set_debug(false);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(DEFAULT_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("namespace", crate::namespaces::namespace);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| TokenizerError::TemplateSyntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos,
            eos_token: eos,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        })
    }

    /// Replaces the fuel (instructions per render) and output size limits.
    pub fn with_limits(mut self, fuel: u64, max_output_bytes: usize) -> ChatTemplate {
        self.env.set_fuel(Some(fuel));
        self.max_output_bytes = max_output_bytes;
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the template appends the header of the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_value(
            Value::from_serialize(messages),
            add_generation_prompt,
            Value::UNDEFINED,
        )
    }

    /// Renders arbitrary JSON messages (e.g. OpenAI messages with tool calls); `extra` adds or
    /// overrides template variables (`tools`, `documents`, custom flags). Objects keep the key
    /// order of the `serde_json` maps (insertion order only with serde_json's
    /// `preserve_order` feature).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        self.render_value(
            Value::from_serialize(messages),
            add_generation_prompt,
            Value::from_serialize(extra),
        )
    }

    /// Renders template values (see [`TemplateValue`]); `extra` (a map, or
    /// `TemplateValue::UNDEFINED`) adds or overrides variables such as `tools`.
    pub fn render_value(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        extra: Value,
    ) -> Result<String, TokenizerError> {
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let defaults = minijinja::context! { tools => (), documents => () };
        // Later maps take precedence.
        let ctx = minijinja::value::merge_maps([defaults, extra, base]);
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        let mut out = LimitedWriter {
            buf: Vec::new(),
            limit: self.max_output_bytes,
            exceeded: false,
        };
        let _render = crate::namespaces::Render::begin();
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => {
                String::from_utf8(out.buf).map_err(|e| TokenizerError::Template(e.to_string()))
            }
            Err(_) if out.exceeded => Err(TokenizerError::TemplateLimit(format!(
                "output larger than {} bytes",
                self.max_output_bytes
            ))),
            Err(e) => Err(map_render_error(e)),
        }
    }
}

fn map_render_error(e: Error) -> TokenizerError {
    if e.kind() == ErrorKind::OutOfFuel {
        return TokenizerError::TemplateLimit("ran out of fuel (runaway loop?)".into());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(Raised(msg)) = s.downcast_ref::<Raised>() {
            return TokenizerError::TemplateRaised(msg.clone());
        }
        source = s.source();
    }
    TokenizerError::Template(describe(&e))
}

/// `e`'s kind, detail and line (`kind: detail (in chat_template:LINE)`), then its causes.
///
/// Never minijinja's alternate form (`{e:#}`): that appends a source excerpt drawn from the
/// error's span, and for some malformed templates the span ends before it starts on the same
/// line — minijinja's printer then subtracts past zero and panics (found by fuzzing
/// `tokenizer_json`; 2.24.0's `debug.rs`).
fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Collects output, failing the write once `limit` bytes would be exceeded.
struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("chat template output limit exceeded"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let ser_err = |e: serde_json::Error| Error::new(ErrorKind::BadSerialization, e.to_string());
    let indent = indent.map(|n| vec![b' '; n.min(64)]);
    let mut out = Vec::new();
    let fmt = PyFormatter {
        indent: indent.as_deref(),
        open: Vec::new(),
        ensure_ascii: ensure_ascii == Some(true),
    };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    if sort_keys == Some(true) {
        let mut json = serde_json::to_value(value).map_err(ser_err)?;
        json.sort_all_objects();
        serde::Serialize::serialize(&json, &mut ser).map_err(ser_err)?;
    } else {
        // Straight from the minijinja value: its maps keep insertion order.
        serde::Serialize::serialize(value, &mut ser).map_err(ser_err)?;
    }
    let s = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    Ok(Value::from_safe_string(s))
}

/// Python `json.dumps` layout: `", "`/`": "` separators when compact, `","` + newline and
/// indentation when `indent` is given; `\uXXXX` escapes for non-ASCII when `ensure_ascii`.
struct PyFormatter<'a> {
    indent: Option<&'a [u8]>,
    /// One entry per open container: whether it is still empty.
    open: Vec<bool>,
    ensure_ascii: bool,
}

impl PyFormatter<'_> {
    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(ind) = self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.open.len() {
                w.write_all(ind)?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, c: &[u8]) -> io::Result<()> {
        self.open.push(true);
        w.write_all(c)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, c: &[u8]) -> io::Result<()> {
        let empty = self.open.pop().unwrap_or(true);
        if !empty {
            self.newline(w)?;
        }
        w.write_all(c)
    }

    fn item<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if let Some(top) = self.open.last_mut() {
            *top = false;
        }
        if !first {
            w.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyFormatter<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if !self.ensure_ascii || fragment.is_ascii() {
            return w.write_all(fragment.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// `strftime_now(format)`: the current UTC time formatted with the common `strftime`
/// directives (`%Y %y %m %d %e %H %I %M %S %p %B %b %A %a %j %%`); others are copied as is.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (h, mi, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(m - 1) as usize];
    let yday = before + d + i64::from(leap && m > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m - 1) as usize];

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    #[test]
    fn chatml_like_template() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                   {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let out = t.render(&msgs(&[("user", "hi")]), true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn variables_and_python_methods() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m['content'].strip().upper() }}\
                   {% if m.role.startswith('us') %}!{% endif %}{% endfor %}{{ eos_token }}\
                   {% if tools is none %}[no tools]{% endif %}";
        let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "  hi  ")]), false).unwrap(),
            "<s>HI!</s>[no tools]"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
        let t = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "a"), ("user", "b")]), false)
                .unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn syntax_error_is_typed() {
        let e = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err();
        assert!(matches!(e, TokenizerError::TemplateSyntax(_)), "{e:?}");
        let e = ChatTemplate::new("{{ 1 + }}", None, None).unwrap_err();
        assert!(matches!(e, TokenizerError::TemplateSyntax(_)), "{e:?}");
    }

    /// Errors name the kind, the detail and the line, and never carry minijinja's source
    /// excerpt (whose printer panics on some malformed templates; see `describe`).
    #[test]
    fn errors_name_the_line_without_a_source_excerpt() {
        let syntax = ChatTemplate::new("hi\n{{ 1 + }}", None, None).unwrap_err();
        let t = ChatTemplate::new("a\n\n{{ messages[0].content + 1 }}", None, None).unwrap();
        let render = t.render(&msgs(&[("user", "x")]), false).unwrap_err();
        for (e, line) in [(syntax, 2), (render, 3)] {
            let (TokenizerError::TemplateSyntax(m) | TokenizerError::Template(m)) = &e else {
                panic!("{e:?}");
            };
            assert!(m.contains(&format!("(in chat_template:{line})")), "{m}");
            assert!(!m.contains('\n'), "an excerpt in {m:?}");
        }
    }

    #[test]
    fn raise_exception_is_typed() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('need a system message') }}{% endif %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        match t.render(&msgs(&[("user", "x")]), false) {
            Err(TokenizerError::TemplateRaised(m)) => assert_eq!(m, "need a system message"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_templates_stop() {
        let cases = [
            "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}",
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            "{% for i in range(1000) %}{{ 'x' * 10000000 }}{% endfor %}",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "{% for i in range(999999999999) %}x{% endfor %}",
        ];
        for src in cases {
            let t = ChatTemplate::new(src, None, None).unwrap();
            let start = std::time::Instant::now();
            let r = t.render(&[], false);
            assert!(r.is_err(), "{src}");
            assert!(
                start.elapsed().as_secs() < 20,
                "{src} took {:?}",
                start.elapsed()
            );
        }
        let t = ChatTemplate::new(cases[0], None, None).unwrap();
        assert!(matches!(
            t.render(&[], false),
            Err(TokenizerError::TemplateLimit(_))
        ));
    }

    #[test]
    fn tojson_is_python_style() {
        let src = "{{ messages | tojson }}|{{ {'b': [1, 2], 'a': {}} | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=true) }}\
                   |{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let out = t.render(&msgs(&[("user", "<é>")]), false).unwrap();
        assert_eq!(
            out,
            "[{\"role\": \"user\", \"content\": \"<é>\"}]|{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": {}\n}|\"\\u00e9\"|{\"a\": 2, \"b\": 1}"
        );
    }

    #[test]
    fn strftime_formats() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_309;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %e %H:%M:%S %j %y %I%p %%", t),
            "Friday July 26 13:25:09 208 24 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
    }
}
