//! Decoding a streamed chat completion (1000 `chat.completion.chunk` events of ~190 bytes,
//! a usage event and `[DONE]`) into its `data:` payloads, per event, under three ways the
//! reads can split it: one event per read (a server flushing each token, the usual case),
//! 64 KiB reads (a client that fell behind) and 7-byte reads (the worst case).
//!
//! - `sse_stream`: the `sse-stream` crate, what `tokenmill bench` decodes with;
//! - `eventsource_stream`: the `eventsource-stream` crate, the other common choice;
//! - `hand_written`: the parser `tokenmill bench` had before (kept here as the baseline).
//!
//! ```text
//! cargo bench -p tokenmill-bench --bench sse
//! ```

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use eventsource_stream::Eventsource;
use futures_util::{FutureExt, StreamExt, stream};

const EVENTS: usize = 1000;

fn body() -> Vec<u8> {
    let mut s = String::new();
    for k in 0..EVENTS {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-7f3a9c\",\"object\":\"chat.completion.chunk\",\
             \"created\":1764633600,\"model\":\"smollm2\",\"choices\":[{{\"index\":0,\
             \"delta\":{{\"content\":\" w{k}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        ));
    }
    s.push_str(
        "data: {\"id\":\"chatcmpl-7f3a9c\",\"choices\":[],\
         \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1000}}\n\ndata: [DONE]\n\n",
    );
    s.into_bytes()
}

fn reads(body: &[u8], how: &str) -> Vec<Bytes> {
    match how {
        "one_event_per_read" => body
            .split_inclusive(|&b| b == b'\n')
            .collect::<Vec<_>>()
            .chunks(2)
            .map(|event| Bytes::from(event.concat()))
            .collect(),
        "64k_reads" => body.chunks(64 << 10).map(Bytes::copy_from_slice).collect(),
        "7_byte_reads" => body.chunks(7).map(Bytes::copy_from_slice).collect(),
        _ => unreachable!(),
    }
}

/// The hand-written parser `tokenmill bench` used before `sse-stream`.
#[derive(Default)]
struct HandWritten {
    buf: Vec<u8>,
}

impl HandWritten {
    fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend(bytes.iter().filter(|&&b| b != b'\r'));
        let mut out = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

/// Total payload bytes (so every decoder's output is checked against the others).
fn hand_written(reads: &[Bytes]) -> usize {
    let mut p = HandWritten::default();
    let mut n = 0;
    for r in reads {
        for payload in p.feed(r) {
            n += black_box(payload).len();
        }
    }
    n
}

fn sse_stream(reads: &[Bytes]) -> usize {
    let body = stream::iter(reads.iter().cloned().map(Ok::<_, std::io::Error>));
    let mut events = sse_stream::SseByteStream::new(body);
    let mut n = 0;
    while let Some(Some(event)) = events.next().now_or_never() {
        if let Some(data) = event.unwrap().data {
            n += black_box(data).len();
        }
    }
    n
}

fn eventsource_stream(reads: &[Bytes]) -> usize {
    let body = stream::iter(reads.iter().cloned().map(Ok::<_, std::io::Error>));
    let mut events = body.eventsource();
    let mut n = 0;
    while let Some(Some(event)) = events.next().now_or_never() {
        n += black_box(event.unwrap().data).len();
    }
    n
}

fn bench(c: &mut Criterion) {
    let body = body();
    for how in ["one_event_per_read", "64k_reads", "7_byte_reads"] {
        let reads = reads(&body, how);
        let want = hand_written(&reads);
        assert_eq!(sse_stream(&reads), want, "{how}");
        assert_eq!(eventsource_stream(&reads), want, "{how}");
        let mut g = c.benchmark_group(format!("sse_{how}"));
        g.throughput(Throughput::Elements(EVENTS as u64 + 2));
        g.bench_function("sse_stream", |b| b.iter(|| sse_stream(&reads)));
        g.bench_function("eventsource_stream", |b| {
            b.iter(|| eventsource_stream(&reads))
        });
        g.bench_function("hand_written", |b| b.iter(|| hand_written(&reads)));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
