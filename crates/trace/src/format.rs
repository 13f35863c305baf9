//! The Chrome Trace Event JSON file: [`Trace`] (the JSON object form, `{"traceEvents": […]}`)
//! and [`TraceEvent`], serialised and parsed with serde_json.
//!
//! Only the fields tokenmill writes are modelled: `name`, `cat`, `ph` (`X` complete, `i`
//! instant, `C` counter, `b`/`e` async, `M` metadata), `ts`/`dur` in microseconds, `pid`,
//! `tid`, `id`, `s` and `args`. Reading accepts any trace with those fields (missing ones
//! take defaults), so the profiler's report can read files written by an older tokenmill.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("a profiling session is already running")]
    AlreadyRunning,
    #[error("no profiling session is running")]
    NotRunning,
    #[error("trace file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("trace JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// One event as written in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cat: String,
    pub ph: String,
    /// Start, µs since the trace epoch.
    #[serde(default)]
    pub ts: f64,
    /// Duration in µs (complete events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    #[serde(default)]
    pub pid: u64,
    #[serde(default)]
    pub tid: u64,
    /// Async span id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// Instant event scope (`t`: thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub args: Map<String, Value>,
}

impl TraceEvent {
    /// A `thread_name` metadata event naming track `tid`.
    pub fn thread_name(pid: u64, tid: u64, name: &str) -> TraceEvent {
        let mut args = Map::new();
        args.insert("name".into(), Value::from(name));
        TraceEvent {
            name: "thread_name".into(),
            cat: String::new(),
            ph: "M".into(),
            ts: 0.0,
            dur: None,
            pid,
            tid,
            id: None,
            s: None,
            args,
        }
    }

    /// A complete event (for hand-built traces and tests).
    pub fn complete(name: &str, cat: &str, tid: u64, ts: f64, dur: f64) -> TraceEvent {
        TraceEvent {
            name: name.into(),
            cat: cat.into(),
            ph: "X".into(),
            ts,
            dur: Some(dur),
            pid: 1,
            tid,
            id: None,
            s: None,
            args: Map::new(),
        }
    }

    /// Adds an argument (builder style).
    pub fn with_arg(mut self, key: &str, v: impl Into<Value>) -> TraceEvent {
        self.args.insert(key.into(), v.into());
        self
    }

    /// End time in µs (`ts` for events without a duration).
    pub fn end(&self) -> f64 {
        self.ts + self.dur.unwrap_or(0.0)
    }

    pub fn arg_i64(&self, key: &str) -> Option<i64> {
        self.args.get(key).and_then(Value::as_i64)
    }

    pub fn arg_f64(&self, key: &str) -> Option<f64> {
        self.args.get(key).and_then(Value::as_f64)
    }

    pub fn arg_str(&self, key: &str) -> Option<&str> {
        self.args.get(key).and_then(Value::as_str)
    }

    /// Async span id as an integer.
    pub fn id_u64(&self) -> Option<u64> {
        self.id.as_ref().and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
    }
}

/// A whole trace file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    #[serde(rename = "traceEvents")]
    pub events: Vec<TraceEvent>,
    #[serde(rename = "displayTimeUnit", default = "default_unit")]
    pub display_time_unit: String,
    /// Free-form facts about the run (`otherData`), e.g. the model's shape.
    #[serde(rename = "otherData", default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

fn default_unit() -> String {
    "ms".into()
}

impl Trace {
    pub fn new(events: Vec<TraceEvent>) -> Trace {
        Trace {
            events,
            display_time_unit: default_unit(),
            metadata: Map::new(),
        }
    }

    /// Track id → thread name, from the `thread_name` metadata events.
    pub fn thread_names(&self) -> BTreeMap<u64, String> {
        self.events
            .iter()
            .filter(|e| e.ph == "M" && e.name == "thread_name")
            .filter_map(|e| Some((e.tid, e.arg_str("name")?.to_string())))
            .collect()
    }

    /// Complete events named `name`, in file order.
    pub fn complete_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a TraceEvent> {
        self.events
            .iter()
            .filter(move |e| e.ph == "X" && e.name == name)
    }

    pub fn to_writer(&self, w: impl Write) -> Result<(), TraceError> {
        Ok(serde_json::to_writer(w, self)?)
    }

    pub fn from_reader(r: impl Read) -> Result<Trace, TraceError> {
        Ok(serde_json::from_reader(r)?)
    }

    /// Writes the trace to `path` (buffered).
    pub fn write_file(&self, path: &Path) -> Result<(), TraceError> {
        let io = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::create(path).map_err(io)?;
        let mut w = BufWriter::new(f);
        self.to_writer(&mut w)?;
        w.flush().map_err(io)
    }

    pub fn read_file(path: &Path) -> Result<Trace, TraceError> {
        let f = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Trace::from_reader(BufReader::new(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_chrome_trace_object_form() {
        let mut t = Trace::new(vec![
            TraceEvent::thread_name(1, 2, "engine"),
            TraceEvent::complete("step", "engine", 2, 10.5, 3.25).with_arg("tokens", 17),
        ]);
        t.metadata.insert("model".into(), Value::from("x"));
        let mut buf = Vec::new();
        t.to_writer(&mut buf).unwrap();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["displayTimeUnit"], "ms");
        assert_eq!(v["otherData"]["model"], "x");
        let evs = v["traceEvents"].as_array().unwrap();
        assert_eq!(evs[0]["ph"], "M");
        assert_eq!(evs[0]["args"]["name"], "engine");
        assert!(evs[0].get("dur").is_none());
        assert_eq!(evs[1]["ph"], "X");
        assert_eq!(evs[1]["ts"], 10.5);
        assert_eq!(evs[1]["dur"], 3.25);
        assert_eq!(evs[1]["args"]["tokens"], 17);
        assert_eq!(Trace::from_reader(&buf[..]).unwrap(), t);
    }

    #[test]
    fn reads_foreign_traces_with_missing_fields_and_rejects_garbage() {
        let t = Trace::from_reader(&br#"{"traceEvents":[{"name":"a","ph":"X"}]}"#[..]).unwrap();
        assert_eq!(t.events[0].ts, 0.0);
        assert_eq!(t.display_time_unit, "ms");
        assert!(Trace::from_reader(&b"[1,2"[..]).is_err());
        assert!(Trace::from_reader(&br#"{"traceEvents":[{"ph":"X"}]}"#[..]).is_err());
        let missing = Trace::read_file(Path::new("/nonexistent/trace.json")).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/trace.json"));
    }

    #[test]
    fn thread_names_and_ids() {
        let mut b = TraceEvent::complete("q", "r", 1, 0.0, 1.0);
        b.id = Some(Value::from("42"));
        let t = Trace::new(vec![TraceEvent::thread_name(1, 9, "http"), b.clone()]);
        assert_eq!(t.thread_names()[&9], "http");
        assert_eq!(b.id_u64(), Some(42));
        assert_eq!(t.complete_named("q").count(), 1);
    }
}
