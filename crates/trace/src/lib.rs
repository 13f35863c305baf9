//! `tokenmill-trace`: a small in-process trace recorder whose output opens in Perfetto and
//! chrome://tracing (the [Chrome Trace Event format]).
//!
//! Design:
//! - **One global switch** ([`enabled`]): an atomic read once per scope. When off, a scope is
//!   that load and a branch — nothing is timed, nothing is written.
//! - **Per-thread buffers** ([`recorder`]): each recording thread appends to its own
//!   preallocated `Vec` behind an uncontended mutex (the owner is the only writer; the
//!   collector locks it once, at [`stop`]). No event crosses threads while recording.
//! - **Sessions**: [`start`] clears every buffer and turns recording on; [`stop`] turns it off,
//!   drains all buffers into a [`Trace`] (events sorted by time, thread-name metadata added)
//!   and drops events that began before the session.
//! - **Plain output** ([`format`]): [`Trace`] is the owned, serde form of a trace file, used
//!   both to write one and to read one back (the profiler's report reads its own traces).
//!
//! Timestamps are nanoseconds since a process-wide epoch (the first use of the recorder),
//! written as microseconds with a fractional part, as the format asks.
//!
//! [Chrome Trace Event format]: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

pub mod format;
pub mod recorder;

pub use format::{Trace, TraceError, TraceEvent};
pub use recorder::{
    Arg, Scope, async_span, complete_at, complete_at_lane, counter, enabled, instant, instant_ns,
    is_running, now_ns, scope, set_metadata, set_thread_name, start, stop,
};
