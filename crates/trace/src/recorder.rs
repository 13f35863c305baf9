//! The recorder: a global switch, per-thread event buffers and recording sessions.
//!
//! Invariants:
//! - Every recording call first reads [`enabled`] (one relaxed atomic load) and returns at
//!   once when it is off; a [`Scope`] made while off stays inert even if recording starts
//!   before it drops.
//! - A thread's buffer is written only by that thread; [`stop`] is the only other party that
//!   locks it, so the lock is uncontended while recording.
//! - A scope open when [`stop`] is called still records: `stop` waits (up to 5 s) for every
//!   open scope to drop before collecting, so a trace never ends with a step's children but
//!   not the step. Other events after `stop` are not recorded.
//! - At most one session runs at a time ([`start`] while running and [`stop`] while stopped
//!   are typed errors). Events recorded after `stop` by scopes that were already open are
//!   discarded by the next `start`.
//! - Events carry at most [`MAX_ARGS`] arguments inline (no allocation per event once a
//!   thread's buffer has its capacity); extra arguments are dropped.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use serde_json::{Map, Value};

use crate::format::{Trace, TraceError, TraceEvent};

/// Arguments stored inline per event.
pub const MAX_ARGS: usize = 4;
/// Events a thread's buffer reserves when it first records in a session.
const BUFFER_EVENTS: usize = 16 * 1024;
/// The `pid` written for every event (one process per trace).
const PID: u64 = 1;

static ENABLED: AtomicBool = AtomicBool::new(false);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
/// Scopes opened while recording and not yet dropped ([`stop`] waits for them).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// How long [`stop`] waits for open scopes to close.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Start of the running session (ns since the epoch), `None` when stopped.
static SESSION: Mutex<Option<u64>> = Mutex::new(None);
static REGISTRY: Mutex<Vec<Arc<ThreadBuf>>> = Mutex::new(Vec::new());
static METADATA: Mutex<Option<Map<String, Value>>> = Mutex::new(None);

/// Is recording on? One relaxed atomic load: cheap enough to test around every op.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the trace epoch.
pub fn now_ns() -> u64 {
    instant_ns(Instant::now())
}

/// `t` as nanoseconds since the trace epoch (0 for instants before it).
pub fn instant_ns(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// An event argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Int(i64),
    Float(f64),
    Str(&'static str),
    Text(String),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(v)
    }
}
impl From<usize> for Arg {
    fn from(v: usize) -> Arg {
        Arg::Int(v as i64)
    }
}
impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::Int(v as i64)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::Float(v)
    }
}
impl From<&'static str> for Arg {
    fn from(v: &'static str) -> Arg {
        Arg::Str(v)
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Arg {
        Arg::Text(v)
    }
}

impl Arg {
    fn to_json(&self) -> Value {
        match self {
            Arg::Int(v) => Value::from(*v),
            Arg::Float(v) => Value::from(*v),
            Arg::Str(s) => Value::from(*s),
            Arg::Text(s) => Value::from(s.as_str()),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Args {
    items: [(&'static str, Option<Arg>); MAX_ARGS],
    len: u8,
}

impl Args {
    fn push(&mut self, key: &'static str, v: Arg) {
        if let Some(slot) = self.items.get_mut(self.len as usize) {
            *slot = (key, Some(v));
            self.len += 1;
        }
    }

    fn from_slice(args: &[(&'static str, Arg)]) -> Args {
        let mut a = Args::default();
        for (k, v) in args {
            a.push(k, v.clone());
        }
        a
    }

    fn to_json(&self) -> Map<String, Value> {
        self.items[..self.len as usize]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), v.to_json())))
            .collect()
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Complete { dur: u64 },
    Instant,
    Counter,
    AsyncBegin { id: u64 },
    AsyncEnd { id: u64 },
}

#[derive(Clone, Debug)]
struct RawEvent {
    name: &'static str,
    cat: &'static str,
    kind: Kind,
    ts: u64,
    args: Args,
}

struct ThreadBuf {
    tid: u64,
    name: Mutex<String>,
    events: Mutex<Vec<RawEvent>>,
}

thread_local! {
    static LOCAL: OnceCell<Arc<ThreadBuf>> = const { OnceCell::new() };
    /// The thread's side track ([`complete_at_lane`]), if it has one.
    static LANE: OnceCell<Arc<ThreadBuf>> = const { OnceCell::new() };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn register() -> Arc<ThreadBuf> {
    let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
    let name = std::thread::current()
        .name()
        .map_or_else(|| format!("thread-{tid}"), str::to_string);
    register_track(tid, name)
}

fn register_track(tid: u64, name: String) -> Arc<ThreadBuf> {
    let buf = Arc::new(ThreadBuf {
        tid,
        name: Mutex::new(name),
        events: Mutex::new(Vec::new()),
    });
    lock(&REGISTRY).push(buf.clone());
    buf
}

fn with_local(f: impl FnOnce(&ThreadBuf)) {
    // `try_with`: a thread being torn down records nothing rather than panicking.
    let _ = LOCAL.try_with(|c| f(c.get_or_init(register)));
}

fn push(ev: RawEvent) {
    with_local(|b| push_to(b, ev));
}

fn push_to(b: &ThreadBuf, ev: RawEvent) {
    let mut v = lock(&b.events);
    if v.capacity() == 0 {
        v.reserve(BUFFER_EVENTS);
    }
    v.push(ev);
}

/// Names the calling thread's track (default: the std thread name, else `thread-N`).
pub fn set_thread_name(name: &str) {
    with_local(|b| *lock(&b.name) = name.to_string());
}

/// Sets a process-wide entry of every later trace's `otherData` (e.g. the model's shape).
pub fn set_metadata(key: &str, value: Value) {
    lock(&METADATA)
        .get_or_insert_with(Map::new)
        .insert(key.to_string(), value);
}

/// A timed region, recorded as a complete (`ph: "X"`) event when dropped.
#[must_use = "a scope records when it is dropped"]
pub struct Scope {
    open: Option<(u64, RawEvent)>,
}

/// Opens a scope named `name` in category `cat` on the calling thread's track; inert (and
/// free but for one atomic load) while recording is off.
#[inline]
pub fn scope(name: &'static str, cat: &'static str) -> Scope {
    if !enabled() {
        return Scope { open: None };
    }
    let ev = RawEvent {
        name,
        cat,
        kind: Kind::Instant,
        ts: 0,
        args: Args::default(),
    };
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    Scope {
        open: Some((now_ns(), ev)),
    }
}

impl Scope {
    /// Adds an argument (at most [`MAX_ARGS`]; a no-op on an inert scope).
    pub fn arg(&mut self, key: &'static str, v: impl Into<Arg>) {
        if let Some((_, ev)) = &mut self.open {
            ev.args.push(key, v.into());
        }
    }

    /// Whether this scope will record (recording was on when it opened).
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    /// Drops the scope without recording it (e.g. an engine step that ran nothing).
    pub fn cancel(mut self) {
        if self.open.take().is_some() {
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some((start, mut ev)) = self.open.take() {
            ev.ts = start;
            ev.kind = Kind::Complete {
                dur: now_ns().saturating_sub(start),
            };
            push(ev);
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Records a complete event from `start` to `end` on the calling thread's track.
pub fn complete_at(
    name: &'static str,
    cat: &'static str,
    start: Instant,
    end: Instant,
    args: &[(&'static str, Arg)],
) {
    if !enabled() {
        return;
    }
    push(complete_event(name, cat, start, end, args));
}

fn complete_event(
    name: &'static str,
    cat: &'static str,
    start: Instant,
    end: Instant,
    args: &[(&'static str, Arg)],
) -> RawEvent {
    let ts = instant_ns(start);
    RawEvent {
        name,
        cat,
        kind: Kind::Complete {
            dur: instant_ns(end).saturating_sub(ts),
        },
        ts,
        args: Args::from_slice(args),
    }
}

/// Records a complete event from `start` to `end` on the calling thread's side track, a track
/// of its own named `lane` (at its first use by this thread): what the thread does in another
/// role than its main one — the compute pool's caller running its share of a job, say, which
/// then reads like every other worker's track instead of nesting under the caller's ops.
pub fn complete_at_lane(
    lane: &str,
    name: &'static str,
    cat: &'static str,
    start: Instant,
    end: Instant,
    args: &[(&'static str, Arg)],
) {
    if !enabled() {
        return;
    }
    let ev = complete_event(name, cat, start, end, args);
    let _ = LANE.try_with(|c| {
        let b =
            c.get_or_init(|| register_track(NEXT_TID.fetch_add(1, Ordering::Relaxed), lane.into()));
        push_to(b, ev);
    });
}

/// Records an instant (`ph: "i"`, thread scope) event now.
pub fn instant(name: &'static str, cat: &'static str, args: &[(&'static str, Arg)]) {
    if !enabled() {
        return;
    }
    push(RawEvent {
        name,
        cat,
        kind: Kind::Instant,
        ts: now_ns(),
        args: Args::from_slice(args),
    });
}

/// Records counter values now (`ph: "C"`): one counter track per `name`, one series per key.
pub fn counter(name: &'static str, values: &[(&'static str, f64)]) {
    if !enabled() {
        return;
    }
    let mut args = Args::default();
    for (k, v) in values {
        args.push(k, Arg::Float(*v));
    }
    push(RawEvent {
        name,
        cat: "counter",
        kind: Kind::Counter,
        ts: now_ns(),
        args,
    });
}

/// Records an async span (`ph: "b"` … `"e"`, id `id`) from `start` to `end`, e.g. a
/// request's time in the queue, measured by another thread than the one it belongs to.
pub fn async_span(
    name: &'static str,
    cat: &'static str,
    id: u64,
    start: Instant,
    end: Instant,
    args: &[(&'static str, Arg)],
) {
    if !enabled() {
        return;
    }
    let (ts, te) = (instant_ns(start), instant_ns(end));
    let args = Args::from_slice(args);
    push(RawEvent {
        name,
        cat,
        kind: Kind::AsyncBegin { id },
        ts,
        args,
    });
    push(RawEvent {
        name,
        cat,
        kind: Kind::AsyncEnd { id },
        ts: te.max(ts),
        args: Args::default(),
    });
}

/// Starts a session: clears every thread's buffer and turns recording on.
pub fn start() -> Result<(), TraceError> {
    let mut session = lock(&SESSION);
    if session.is_some() {
        return Err(TraceError::AlreadyRunning);
    }
    for b in lock(&REGISTRY).iter() {
        lock(&b.events).clear();
    }
    *session = Some(now_ns());
    ENABLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether a session is running.
pub fn is_running() -> bool {
    lock(&SESSION).is_some()
}

/// Stops the session: turns recording off and collects every thread's events into a
/// [`Trace`] sorted by time, with one `thread_name` metadata event per track that recorded.
/// Events that ended before the session started are dropped.
pub fn stop() -> Result<Trace, TraceError> {
    let mut session = lock(&SESSION);
    let started = session.take().ok_or(TraceError::NotRunning)?;
    ENABLED.store(false, Ordering::SeqCst);
    let t = Instant::now();
    while IN_FLIGHT.load(Ordering::SeqCst) > 0 && t.elapsed() < STOP_WAIT {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let mut events = Vec::new();
    let mut names = Vec::new();
    for b in lock(&REGISTRY).iter() {
        let raw = std::mem::take(&mut *lock(&b.events));
        if raw.is_empty() {
            continue;
        }
        names.push(TraceEvent::thread_name(PID, b.tid, &lock(&b.name)));
        events.extend(
            raw.iter()
                .filter(|e| end_ns(e) >= started)
                .map(|e| to_event(e, b.tid)),
        );
    }
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    names.extend(events);
    let mut trace = Trace::new(names);
    trace.metadata = lock(&METADATA).clone().unwrap_or_default();
    Ok(trace)
}

fn end_ns(e: &RawEvent) -> u64 {
    match e.kind {
        Kind::Complete { dur } => e.ts + dur,
        _ => e.ts,
    }
}

fn to_event(e: &RawEvent, tid: u64) -> TraceEvent {
    let us = |ns: u64| ns as f64 / 1e3;
    let (ph, dur, id) = match e.kind {
        Kind::Complete { dur } => ("X", Some(us(dur)), None),
        Kind::Instant => ("i", None, None),
        Kind::Counter => ("C", None, None),
        Kind::AsyncBegin { id } => ("b", None, Some(id)),
        Kind::AsyncEnd { id } => ("e", None, Some(id)),
    };
    TraceEvent {
        name: e.name.to_string(),
        cat: e.cat.to_string(),
        ph: ph.to_string(),
        ts: us(e.ts),
        dur,
        pid: PID,
        tid,
        id: id.map(Value::from),
        s: (ph == "i").then(|| "t".to_string()),
        args: e.args.to_json(),
    }
}

/// Serialises tests that use the global recorder (sessions are process-wide).
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn session<T>(f: impl FnOnce() -> T) -> (T, Trace) {
        let _g = lock(&TEST_LOCK);
        start().unwrap();
        let r = f();
        (r, stop().unwrap())
    }

    #[test]
    fn off_records_nothing_and_inert_scopes_stay_inert() {
        let _g = lock(&TEST_LOCK);
        assert!(!enabled());
        let mut s = scope("before", "test");
        s.arg("x", 1usize);
        assert!(!s.is_recording());
        start().unwrap();
        drop(s); // opened while off: records nothing
        instant("inside", "test", &[]);
        let t = stop().unwrap();
        let names: Vec<&str> = t.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["thread_name", "inside"]);
        counter("after", &[("v", 1.0)]);
        assert!(!is_running());
    }

    #[test]
    fn a_lane_is_a_track_of_its_own_named_at_first_use() {
        let ((), t) = session(|| {
            std::thread::Builder::new()
                .name("main-role".into())
                .spawn(|| {
                    let _s = scope("work", "test");
                    let now = Instant::now();
                    complete_at_lane("side", "share", "test", now, now, &[]);
                    complete_at_lane("renamed?", "share", "test", now, now, &[]);
                })
                .unwrap()
                .join()
                .unwrap();
        });
        let names = t.thread_names();
        let track = |ev: &str| {
            let tids: Vec<u64> = t
                .events
                .iter()
                .filter(|e| e.name == ev)
                .map(|e| e.tid)
                .collect();
            assert!(tids.windows(2).all(|w| w[0] == w[1]), "{ev} on one track");
            names[&tids[0]].clone()
        };
        assert_eq!(track("work"), "main-role");
        assert_eq!(track("share"), "side");
    }

    #[test]
    fn scopes_nest_and_carry_args() {
        let ((), t) = session(|| {
            let mut outer = scope("outer", "test");
            outer.arg("layer", 3usize);
            outer.arg("kind", "decode");
            {
                let _inner = scope("inner", "test");
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let outer = t.events.iter().find(|e| e.name == "outer").unwrap();
        let inner = t.events.iter().find(|e| e.name == "inner").unwrap();
        assert_eq!((outer.ph.as_str(), inner.ph.as_str()), ("X", "X"));
        assert!(outer.ts <= inner.ts && inner.end() <= outer.end());
        assert!(inner.dur.unwrap() >= 2000.0, "{:?}", inner.dur);
        assert_eq!(outer.arg_i64("layer"), Some(3));
        assert_eq!(outer.args["kind"], "decode");
        assert_eq!(outer.tid, inner.tid);
    }

    #[test]
    fn threads_get_their_own_named_tracks() {
        let ((), t) = session(|| {
            std::thread::scope(|s| {
                for name in ["alpha", "beta"] {
                    s.spawn(move || {
                        set_thread_name(name);
                        let _s = scope("work", "test");
                    });
                }
            });
        });
        let names = t.thread_names();
        let work: Vec<&TraceEvent> = t.events.iter().filter(|e| e.name == "work").collect();
        assert_eq!(work.len(), 2);
        assert_ne!(work[0].tid, work[1].tid);
        let mut tracks: Vec<&str> = work.iter().map(|e| names[&e.tid].as_str()).collect();
        tracks.sort();
        assert_eq!(tracks, ["alpha", "beta"]);
    }

    #[test]
    fn counters_async_spans_and_instants_have_their_phases() {
        let ((), t) = session(|| {
            let a = Instant::now();
            let b = a + Duration::from_micros(1500);
            counter("batch", &[("seqs", 4.0), ("tokens", 130.0)]);
            async_span(
                "queue",
                "request",
                7,
                a,
                b,
                &[("prompt_tokens", Arg::Int(5))],
            );
            complete_at("op", "model", a, b, &[("layer", Arg::Int(2))]);
            instant("arrive", "request", &[("id", Arg::Text("r7".into()))]);
        });
        let by = |ph: &str| t.events.iter().filter(|e| e.ph == ph).collect::<Vec<_>>();
        let c = by("C");
        assert_eq!(c[0].arg_f64("seqs"), Some(4.0));
        assert_eq!(c[0].arg_f64("tokens"), Some(130.0));
        let (b, e) = (by("b"), by("e"));
        assert_eq!((b.len(), e.len()), (1, 1));
        assert_eq!(b[0].id, Some(Value::from(7)));
        assert!((e[0].ts - b[0].ts - 1500.0).abs() < 1e-6);
        let x = by("X");
        assert!((x[0].dur.unwrap() - 1500.0).abs() < 1e-6);
        assert_eq!(x[0].arg_i64("layer"), Some(2));
        assert_eq!(by("i")[0].s.as_deref(), Some("t"));
        // Sorted by time.
        assert!(t.events.windows(2).all(|w| w[0].ts <= w[1].ts));
    }

    #[test]
    fn sessions_are_exclusive_and_start_clears_leftovers() {
        let _g = lock(&TEST_LOCK);
        assert!(matches!(stop(), Err(TraceError::NotRunning)));
        start().unwrap();
        assert!(matches!(start(), Err(TraceError::AlreadyRunning)));
        // A scope open at stop: stop waits for it, and it is in the trace.
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let s = scope("open_at_stop", "test");
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let c = scope("cancelled", "test");
            c.cancel();
            drop(s);
        });
        rx.recv().unwrap();
        let t = stop().unwrap();
        worker.join().unwrap();
        assert!(t.events.iter().any(|e| e.name == "open_at_stop"));
        assert!(t.events.iter().all(|e| e.name != "cancelled"));
        // Events after stop are not recorded.
        instant("late", "test", &[]);
        start().unwrap();
        let t = stop().unwrap();
        assert!(t.events.iter().all(|e| e.name != "late"));
    }

    #[test]
    fn extra_args_are_dropped_not_panicking() {
        let ((), t) = session(|| {
            let mut s = scope("many", "test");
            for k in ["a", "b", "c", "d", "e", "f"] {
                s.arg(k, 1usize);
            }
        });
        let e = t.events.iter().find(|e| e.name == "many").unwrap();
        assert_eq!(e.args.len(), MAX_ARGS);
        assert!(e.args.get("e").is_none());
    }
}
