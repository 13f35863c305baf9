//! The HTTP driver against a scripted fake OpenAI server on loopback.
//!
//! The first token id of each prompt picks the script:
//! 0 = stream `max_tokens` tokens, the first at 100 ms after the request arrived and then
//!     one every 20 ms (on a fixed schedule from arrival, so delays never accumulate), then a
//!     usage chunk and `[DONE]`;
//! 1 = HTTP 429; 2 = HTTP 500; 3 = two tokens then the connection is cut;
//! 4 = stalls (8 s) past the client's timeout (3 s); 5 = a 200 stream whose payload is not JSON.
//!
//! Timing bounds: a sleep never ends early, so every lower bound below is exact (the server
//! sends token k no earlier than 100 + 20k ms after the client sent the request). Upper bounds
//! are loose (+1.5 s) because this 2-core machine is shared with compilers and a sleeping
//! task can be woken late; the exact arithmetic of the figures is tested on synthetic records
//! in `stats`, and here the summary is checked against the records it came from.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::stream;
use serde_json::{Value, json};
use tokenmill_bench::arrival::Arrival;
use tokenmill_bench::client::{Endpoint, RequestOptions, Target};
use tokenmill_bench::dataset::{Prompt, PromptInput};
use tokenmill_bench::memory::MemorySource;
use tokenmill_bench::runner::{RunSpec, run};
use tokenmill_bench::stats::{ErrorKind, Slo, percentile};
use tokio::time::Instant;

const TTFT: Duration = Duration::from_millis(100);
const GAP: Duration = Duration::from_millis(20);
const SLACK: Duration = Duration::from_millis(1500);

#[derive(Default)]
struct Fake {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

struct InFlight(Arc<Fake>);

impl InFlight {
    fn new(f: &Arc<Fake>) -> InFlight {
        let n = f.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        f.max_in_flight.fetch_max(n, Ordering::SeqCst);
        InFlight(f.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn completions(State(f): State<Arc<Fake>>, Json(body): Json<Value>) -> Response {
    let arrived = Instant::now();
    let guard = InFlight::new(&f);
    let script = body["prompt"][0].as_u64().unwrap_or(0);
    let n = body["max_tokens"].as_u64().unwrap_or(1) as u32;
    match script {
        1 => return (StatusCode::TOO_MANY_REQUESTS, "busy").into_response(),
        2 => return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        4 => tokio::time::sleep(Duration::from_secs(8)).await,
        5 => return Response::new(Body::from("data: not json\n\ndata: [DONE]\n\n")),
        _ => {}
    }
    let tokens = if script == 3 { 2 } else { n };
    let s = stream::unfold((0u32, guard), move |(k, guard)| async move {
        if k < tokens {
            tokio::time::sleep_until(arrived + TTFT + GAP * k).await;
            let chunk = json!({"choices": [{"index": 0, "text": format!("t{k}")}]});
            Some((Ok::<Bytes, std::io::Error>(sse(&chunk)), (k + 1, guard)))
        } else if k == tokens && script == 3 {
            Some((Err(std::io::Error::other("cut")), (k + 1, guard)))
        } else if k == tokens {
            let usage =
                json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}});
            let done = [sse(&usage), Bytes::from("data: [DONE]\n\n")].concat();
            Some((Ok(Bytes::from(done)), (k + 1, guard)))
        } else {
            None
        }
    });
    let mut resp = Response::new(Body::from_stream(s));
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": "fake-model"}]}))
}

async fn start() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), fake)
}

fn prompt(script: u32, output_len: usize) -> Prompt {
    Prompt {
        input: PromptInput::Tokens(vec![script, 11, 12]),
        prompt_len: 3,
        output_len,
    }
}

fn spec(arrival: Arrival, slo: Slo) -> RunSpec {
    RunSpec {
        arrival,
        options: RequestOptions::default(),
        percentiles: vec![50.0, 95.0, 99.0],
        slo,
        memory: MemorySource {
            pid: Some(std::process::id()),
            metrics_url: None,
        },
        seed: 0,
        progress: false,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn target(base: &str) -> Target {
    let client = reqwest::Client::new();
    let model = tokenmill_bench::client::served_model(&client, base, None)
        .await
        .unwrap();
    assert_eq!(model, "fake-model");
    Target {
        base_url: base.into(),
        endpoint: Endpoint::Completions,
        api_key: None,
        model,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_and_errors_from_a_scripted_server() {
    let (base, fake) = start().await;
    let target = target(&base).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut prompts: Vec<Prompt> = (0..6).map(|_| prompt(0, 5)).collect();
    prompts.extend([1, 2, 3, 4, 5].map(|s| prompt(s, 5)));
    let warmups = [prompt(0, 2), prompt(2, 2)];
    // 99 ms < every possible TTFT; 10 s > any TTFT here: goodput is exact either way.
    let strict = Slo::parse(&["ttft:99".into()]).unwrap();
    let s = spec(Arrival::Closed { concurrency: 3 }, strict);
    let r = run(&client, &target, &warmups, &prompts, &s).await.unwrap();
    let sum = &r.summary;
    assert_eq!((sum.completed, sum.failed), (6, 5), "{sum:?}");
    let kinds: Vec<(ErrorKind, usize)> = sum.errors.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(
        kinds,
        vec![
            (ErrorKind::RateLimited, 1),
            (ErrorKind::ServerError, 1),
            (ErrorKind::Disconnected, 1),
            (ErrorKind::Timeout, 1),
            (ErrorKind::Protocol, 1),
        ]
    );
    assert_eq!(sum.good_requests, Some(0));
    assert_eq!((sum.input_tokens, sum.output_tokens), (6 * 7, 6 * 5));
    // Warm-ups are not in the records; the cap held.
    assert_eq!(r.records.len(), prompts.len());
    assert!(fake.max_in_flight.load(Ordering::SeqCst) <= 3);
    for rec in r.records.iter().filter(|r| r.ok()) {
        assert_eq!(rec.token_times.len(), 5);
        let (ttft, e2e) = (rec.ttft().unwrap(), rec.e2e().unwrap());
        assert!(ttft >= TTFT && ttft < TTFT + SLACK, "ttft {ttft:?}");
        assert!(
            e2e >= TTFT + GAP * 4 && e2e < TTFT + GAP * 4 + SLACK,
            "e2e {e2e:?}"
        );
        assert_eq!(rec.tpot().unwrap(), (e2e - ttft) / 4);
    }
    // The summary is exactly the records' figures.
    let ok: Vec<_> = r.records.iter().filter(|r| r.ok()).collect();
    let mut ttfts: Vec<f64> = ok.iter().map(|r| ms(r.ttft().unwrap())).collect();
    ttfts.sort_by(f64::total_cmp);
    let mean = ttfts.iter().sum::<f64>() / ttfts.len() as f64;
    assert!((sum.ttft.mean - mean).abs() < 1e-9);
    assert_eq!(sum.ttft.at(99.0), percentile(&ttfts, 99.0));
    let mut itls: Vec<f64> = ok.iter().flat_map(|r| r.itls()).map(ms).collect();
    itls.sort_by(f64::total_cmp);
    assert_eq!(itls.len(), 6 * 4);
    assert_eq!(sum.itl.median, percentile(&itls, 50.0).unwrap());
    assert!(sum.e2el.mean >= ms(TTFT + GAP * 4));
    let tput = 30.0 / sum.duration.as_secs_f64();
    assert!((sum.output_throughput() - tput).abs() < 1e-9);
    // Memory of "the server" (this process) was sampled.
    assert!(sum.memory.peak_bytes().unwrap() > 0);
    let j = r.to_json();
    assert_eq!(j["requests"].as_array().unwrap().len(), prompts.len());
    assert_eq!(j["errors"]["rate_limited"], 1);
    assert!(r.summary.render("x").contains("disconnected mid-stream:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_respects_send_times_and_generous_slos() {
    let (base, _fake) = start().await;
    let target = target(&base).await;
    let client = reqwest::Client::new();
    let prompts: Vec<Prompt> = (0..5).map(|_| prompt(0, 3)).collect();
    let arrival = Arrival::Open {
        rate: 20.0,
        burstiness: 1.0,
        max_concurrency: None,
    };
    let slo = Slo::parse(&[
        "ttft:10000".into(),
        "tpot:10000".into(),
        "e2el:10000".into(),
    ]);
    let s = spec(arrival, slo.unwrap());
    let r = run(&client, &target, &[], &prompts, &s).await.unwrap();
    let offsets = arrival.offsets(5, 0).unwrap();
    for (rec, off) in r.records.iter().zip(&offsets) {
        assert!(rec.ok(), "{:?}", rec.error);
        assert!(rec.start >= *off, "sent at {:?} before {off:?}", rec.start);
    }
    assert_eq!(r.summary.good_requests, Some(5));
    assert_eq!(r.summary.request_rate, Some(20.0));
    assert!(r.summary.duration >= offsets[4] + TTFT + GAP * 2);
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let target = Target {
        base_url: format!("http://{addr}"),
        endpoint: Endpoint::Completions,
        api_key: None,
        model: "m".into(),
    };
    let s = spec(Arrival::Closed { concurrency: 1 }, Slo::default());
    let r = run(&reqwest::Client::new(), &target, &[], &[prompt(0, 2)], &s)
        .await
        .unwrap();
    assert_eq!(r.summary.errors.get(&ErrorKind::Connect), Some(&1));
    assert_eq!(r.summary.completed, 0);
    assert!(r.summary.render("x").contains("Successful requests:"));
}
