//! Reading tool calls out of a model's text, as it streams: [`CallStream`] takes text deltas
//! and gives [`Piece`]s — content, the start of a call (its id and name), and deltas of the
//! call's `arguments` as they are generated, the way OpenAI streams them. A whole reply is
//! read by pushing it at once ([`parse_reply`]), so both paths share one parser.
//!
//! A call whose head is `{"name": "...", "arguments": ` (or `"parameters"`) streams its
//! arguments character by character, a small JSON scanner telling where the value ends. Any
//! other block is read whole when it closes. A block naming no declared tool, or that is not
//! JSON, stays content.

use std::collections::HashSet;

use serde_json::Value;

use super::format::ToolFormat;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Content(String),
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    Arguments {
        index: usize,
        delta: String,
    },
}

/// One complete call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A whole reply's content (`None` when only calls remain) and calls.
pub fn parse_reply(
    format: ToolFormat,
    names: HashSet<String>,
    text: &str,
) -> (Option<String>, Vec<ToolCall>) {
    let mut s = CallStream::new(format, names);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::CallStart { id, name, .. } => calls.push(ToolCall {
                id,
                name,
                arguments: String::new(),
            }),
            Piece::Arguments { index, delta } => calls[index].arguments.push_str(&delta),
        }
    }
    // Beside calls, only real text is content; a reply without calls is kept as it came
    // (the same text a stream of it delivers).
    let content = match calls.is_empty() {
        true => Some(content),
        false => Some(content.trim().to_string()).filter(|c| !c.is_empty()),
    };
    (content, calls)
}

/// A fresh call id (`call_` and 24 hex digits).
pub fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

enum State {
    /// Llama 3: nothing but whitespace (and the python tag) seen yet.
    Start,
    /// Plain text; Hermes watches for `<tool_call>`.
    Text,
    /// Inside a call, before its arguments: the head is being read.
    Head,
    /// Streaming the arguments value.
    Arguments(Scan),
    /// After the arguments, up to the end of the call.
    Tail,
    /// A call whose head is not the usual one: read whole at its close.
    Opaque,
}

pub struct CallStream {
    format: ToolFormat,
    names: HashSet<String>,
    state: State,
    /// Text not yet turned into pieces.
    buf: String,
    calls: usize,
}

impl CallStream {
    /// A parser for calls of the tools `names`.
    pub fn new(format: ToolFormat, names: HashSet<String>) -> CallStream {
        let state = match format {
            ToolFormat::Hermes => State::Text,
            ToolFormat::Llama3Json => State::Start,
        };
        CallStream {
            format,
            names,
            state,
            buf: String::new(),
            calls: 0,
        }
    }

    /// Calls started so far.
    pub fn num_calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The end of the reply: what is still held back comes out (an unclosed call is read
    /// as it is, or given back as content).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Tail) {
            State::Start | State::Text => push_content(&mut out, rest),
            State::Head | State::Opaque => {
                if !self.whole_call(&rest, &mut out) {
                    let open = if self.format == ToolFormat::Hermes {
                        OPEN
                    } else {
                        ""
                    };
                    push_content(&mut out, format!("{open}{rest}"));
                }
            }
            State::Arguments(_) | State::Tail => {}
        }
        out
    }

    /// One transition; `false` when more text is needed.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match &self.state {
            State::Start => self.start(),
            State::Text if self.format == ToolFormat::Llama3Json => {
                push_content(out, std::mem::take(&mut self.buf));
                false
            }
            State::Text => self.text(out),
            State::Head => self.head(out),
            State::Arguments(_) => self.arguments(out),
            State::Tail => self.tail(),
            State::Opaque => self.opaque(out),
        }
    }

    /// Llama 3: a reply that opens with `{` (after the python tag) is a call.
    fn start(&mut self) -> bool {
        let t = self.buf.trim_start();
        let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim_start();
        if t.is_empty() || PYTHON_TAG.starts_with(t) {
            return false;
        }
        if t.starts_with('{') {
            self.buf = t.to_string();
            self.state = State::Head;
        } else {
            self.state = State::Text;
        }
        true
    }

    /// Hermes text: content up to a `<tool_call>`, holding back what may be its start.
    /// Whitespace between calls is not content.
    fn text(&mut self, out: &mut Vec<Piece>) -> bool {
        if let Some(pos) = self.buf.find(OPEN) {
            let before: String = self.buf.drain(..pos + OPEN.len()).collect();
            let before = &before[..pos];
            if self.calls == 0 || !before.trim().is_empty() {
                push_content(out, before.to_string());
            }
            self.state = State::Head;
            return true;
        }
        let keep = partial_suffix(&self.buf, OPEN);
        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
        if self.calls == 0 || !emit.trim().is_empty() {
            push_content(out, emit);
        }
        false
    }

    fn head(&mut self, out: &mut Vec<Piece>) -> bool {
        match read_head(&self.buf) {
            Head::Incomplete => false,
            Head::Other => {
                self.state = State::Opaque;
                true
            }
            Head::Call { name, len } if self.names.contains(&name) => {
                self.buf.drain(..len);
                out.push(Piece::CallStart {
                    index: self.calls,
                    id: call_id(),
                    name,
                });
                self.state = State::Arguments(Scan::default());
                true
            }
            Head::Call { .. } => {
                // Not a declared tool: the block is text.
                let open = if self.format == ToolFormat::Hermes {
                    OPEN
                } else {
                    ""
                };
                let text = format!("{open}{}", std::mem::take(&mut self.buf));
                self.state = State::Text;
                push_content(out, text);
                false
            }
        }
    }

    /// Streams the arguments value as far as it has come.
    fn arguments(&mut self, out: &mut Vec<Piece>) -> bool {
        let State::Arguments(scan) = &mut self.state else {
            return false;
        };
        let end = self
            .buf
            .char_indices()
            .find(|&(_, c)| scan.step(c))
            .map(|(i, c)| i + c.len_utf8());
        let delta: String = self.buf.drain(..end.unwrap_or(self.buf.len())).collect();
        if !delta.is_empty() {
            out.push(Piece::Arguments {
                index: self.calls,
                delta,
            });
        }
        if end.is_some() {
            self.calls += 1;
            self.state = State::Tail;
        }
        end.is_some()
    }

    /// After the arguments: up to `</tool_call>` (Hermes); the rest of the reply (Llama 3).
    fn tail(&mut self) -> bool {
        match self.format {
            ToolFormat::Llama3Json => {
                self.buf.clear();
                false
            }
            ToolFormat::Hermes => match self.buf.find(CLOSE) {
                Some(pos) => {
                    self.buf.drain(..pos + CLOSE.len());
                    self.state = State::Text;
                    true
                }
                None => false,
            },
        }
    }

    /// A block with another head, read whole when it closes.
    fn opaque(&mut self, out: &mut Vec<Piece>) -> bool {
        let Some(pos) = self.buf.find(CLOSE) else {
            return false;
        };
        let block: String = self.buf.drain(..pos + CLOSE.len()).collect();
        if !self.whole_call(&block[..pos], out) {
            push_content(out, format!("{OPEN}{block}"));
        }
        self.state = State::Text;
        true
    }

    /// Reads `body` as one whole call JSON (`name` plus `arguments` or `parameters`).
    fn whole_call(&mut self, body: &str, out: &mut Vec<Piece>) -> bool {
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(body.trim()) else {
            return false;
        };
        let Some(name) = o.get("name").and_then(Value::as_str) else {
            return false;
        };
        if !self.names.contains(name) {
            return false;
        }
        let args = o.get("arguments").or_else(|| o.get("parameters"));
        let arguments = match args {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "{}".to_string(),
        };
        let index = self.calls;
        self.calls += 1;
        out.push(Piece::CallStart {
            index,
            id: call_id(),
            name: name.to_string(),
        });
        out.push(Piece::Arguments {
            index,
            delta: arguments,
        });
        true
    }
}

fn push_content(out: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Content(prev)) = out.last_mut() {
        prev.push_str(&text);
    } else {
        out.push(Piece::Content(text));
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

enum Head {
    Incomplete,
    /// Not `{"name": "...", "arguments": `.
    Other,
    /// The head of a call to `name`, `len` bytes long (through the `:` after the key).
    Call {
        name: String,
        len: usize,
    },
}

/// Reads `{"name": "<name>", "arguments": ` (or `"parameters"`), whitespace anywhere.
fn read_head(s: &str) -> Head {
    let mut p = Cursor { s, at: 0 };
    macro_rules! expect {
        ($lit:expr) => {
            match p.lit($lit) {
                Some(true) => {}
                Some(false) => return Head::Other,
                None => return Head::Incomplete,
            }
        };
    }
    expect!("{");
    expect!("\"name\"");
    expect!(":");
    let name = match p.string() {
        Some(Some(n)) => n,
        Some(None) => return Head::Other,
        None => return Head::Incomplete,
    };
    expect!(",");
    p.ws();
    let rest = &s[p.at..];
    let key = ["\"arguments\"", "\"parameters\""]
        .into_iter()
        .find(|k| rest.starts_with(k) || k.starts_with(rest));
    match key {
        None => return Head::Other,
        Some(k) if rest.len() < k.len() => return Head::Incomplete,
        Some(k) => p.at += k.len(),
    }
    expect!(":");
    p.ws();
    if p.at == s.len() {
        return Head::Incomplete;
    }
    Head::Call { name, len: p.at }
}

struct Cursor<'a> {
    s: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        let rest = &self.s[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `Some(true)`: matched and skipped; `Some(false)`: something else; `None`: the text
    /// ends inside it.
    fn lit(&mut self, lit: &str) -> Option<bool> {
        self.ws();
        let rest = &self.s[self.at..];
        if rest.starts_with(lit) {
            self.at += lit.len();
            Some(true)
        } else if lit.starts_with(rest) {
            None
        } else {
            Some(false)
        }
    }

    /// A JSON string: `Some(Some(text))`, `Some(None)` when not a string, `None` when the
    /// text ends inside it.
    fn string(&mut self) -> Option<Option<String>> {
        self.ws();
        let rest = &self.s[self.at..];
        if rest.is_empty() {
            return None;
        }
        if !rest.starts_with('"') {
            return Some(None);
        }
        let mut esc = false;
        for (i, c) in rest.char_indices().skip(1) {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => {
                    self.at += i + 1;
                    return Some(serde_json::from_str(&rest[..=i]).ok());
                }
                _ => {}
            }
        }
        None
    }
}

/// Where a streamed JSON value (object, array or string) ends.
#[derive(Default)]
struct Scan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl Scan {
    /// Takes the next character of the value; `true` when it was the last one.
    fn step(&mut self, c: char) -> bool {
        if !self.started {
            if c.is_whitespace() {
                return false;
            }
            self.started = true;
        }
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => {
                    self.in_string = false;
                    return self.depth == 0;
                }
                _ => {}
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ if self.depth == 0 => return true, // a bare scalar: one character at a time
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> HashSet<String> {
        ["get_weather".to_string(), "get_time".to_string()].into()
    }

    /// Streams `text` in pieces of `n` bytes (at char boundaries) and folds the pieces.
    fn streamed(format: ToolFormat, text: &str, n: usize) -> (String, Vec<(String, String)>) {
        let mut s = CallStream::new(format, names());
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut k = n.min(rest.len());
            while !rest.is_char_boundary(k) {
                k += 1;
            }
            pieces.extend(s.push(&rest[..k]));
            rest = &rest[k..];
        }
        pieces.extend(s.finish());
        let (mut content, mut calls) = (String::new(), Vec::<(String, String)>::new());
        for p in pieces {
            match p {
                Piece::Content(t) => content.push_str(&t),
                Piece::CallStart { index, name, .. } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                Piece::Arguments { index, delta } => calls[index].1.push_str(&delta),
            }
        }
        (content, calls)
    }

    #[test]
    fn hermes_calls_stream_the_same_in_any_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\\\" FR\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        for n in [1, 2, 3, 7, 1000] {
            let (content, calls) = streamed(ToolFormat::Hermes, text, n);
            assert_eq!(content, "Let me check.\n", "chunks of {n}");
            assert_eq!(calls.len(), 2, "chunks of {n}");
            assert_eq!(calls[0].0, "get_weather");
            let args: Value = serde_json::from_str(&calls[0].1).unwrap();
            assert_eq!(args["city"], "Paris \"}\" FR");
            assert_eq!(calls[1], ("get_time".to_string(), "{}".to_string()));
        }
    }

    #[test]
    fn other_heads_unknown_tools_and_plain_text() {
        // Keys in another order: read whole at the close.
        let t = "<tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}</tool_call>";
        let (content, calls) = streamed(ToolFormat::Hermes, t, 4);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        assert_eq!(calls[0].1, "{\"city\":\"Oslo\"}");
        // A tool nobody declared stays text.
        let t = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
        let (content, calls) = streamed(ToolFormat::Hermes, t, 5);
        assert!(calls.is_empty());
        assert_eq!(content, t);
        // Text that only looks like the start of a tag.
        let (content, calls) = streamed(ToolFormat::Hermes, "a <tool or <tool_ca", 2);
        assert_eq!((content.as_str(), calls.len()), ("a <tool or <tool_ca", 0));
        // An unclosed call at the end is still read.
        let t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}";
        let (_, calls) = streamed(ToolFormat::Hermes, t, 3);
        assert_eq!(calls[0].1, "{\"tz\": \"UTC\"}");
    }

    #[test]
    fn llama3_json_replies() {
        let t = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
        for n in [1, 4, 100] {
            let (content, calls) = streamed(ToolFormat::Llama3Json, t, n);
            assert_eq!(content, "");
            assert_eq!(
                calls,
                vec![("get_weather".into(), "{\"city\": \"Rome\"}".into())]
            );
        }
        let (content, calls) = streamed(ToolFormat::Llama3Json, "  It is sunny {ok}", 3);
        assert_eq!((content.as_str(), calls.len()), ("  It is sunny {ok}", 0));
    }

    #[test]
    fn whole_replies_split_content_and_calls() {
        let t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse_reply(ToolFormat::Hermes, names(), t);
        assert_eq!(content, None);
        assert_eq!(calls[0].name, "get_time");
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
        let (content, calls) = parse_reply(ToolFormat::Hermes, names(), "Just text.");
        assert_eq!((content.as_deref(), calls.len()), (Some("Just text."), 0));
    }
}
