//! Hostile clients at the HTTP layer, each test on its own server with tight limits: a
//! slow-loris head and an idle keep-alive connection are closed after the header timeout,
//! a body that trickles in gets a 408, a connection over the cap gets a 503 it can read,
//! oversized heads get 431, garbage gets 400 — and the server serves a good request after
//! each.

mod common;

use std::time::{Duration, Instant};

use common::{MODEL, TestServer, client, metric, post};
use serde_json::{Value, json};
use tokenmill_server::{HttpLimits, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADER_TIMEOUT: Duration = Duration::from_millis(800);
const BODY_TIMEOUT: Duration = Duration::from_millis(1500);

fn limits() -> HttpLimits {
    HttpLimits {
        max_connections: 4,
        header_timeout: HEADER_TIMEOUT,
        body_timeout: BODY_TIMEOUT,
        max_headers: 32,
        max_header_bytes: 16 << 10,
    }
}

fn start(http: HttpLimits) -> TestServer {
    TestServer::start(
        common::engine_options(),
        ServerConfig {
            http,
            ..common::server_config()
        },
    )
}

fn addr(s: &TestServer) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// Reads until the server closes the connection (or `limit` passes: `None`); what it sent.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read).await.ok()?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// The JSON body of a raw HTTP answer.
fn body_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// A keep-alive connection the server has accepted, proven by one whole `/health` exchange.
async fn accepted_keep_alive(s: &TestServer) -> TcpStream {
    let mut c = TcpStream::connect(addr(s)).await.unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    c
}

async fn serves_a_good_request(s: &TestServer) {
    let (status, r) = post(
        &client(),
        &s.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
}

#[tokio::test]
async fn a_slow_loris_head_and_an_idle_keep_alive_are_closed_after_the_header_timeout() {
    let s = start(limits());
    // A head sent a byte at a time, never finished.
    let mut slow = TcpStream::connect(addr(&s)).await.unwrap();
    let t = Instant::now();
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json";
    let mut closed = false;
    for b in head {
        if slow.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut probe = [0u8; 64];
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut probe)).await
        {
            assert!(
                matches!(r, Ok(0) | Err(_)),
                "the server answered a half head"
            );
            closed = true;
            break;
        }
    }
    assert!(closed, "a head trickled over {:?} was not cut", t.elapsed());
    let held = t.elapsed();
    assert!(
        held >= HEADER_TIMEOUT && held < HEADER_TIMEOUT * 4,
        "closed after {held:?} (timeout {HEADER_TIMEOUT:?})"
    );

    // A keep-alive connection after a whole exchange, then silent.
    let mut idle = accepted_keep_alive(&s).await;
    let t = Instant::now();
    let rest = read_until_closed(&mut idle, HEADER_TIMEOUT * 4).await;
    assert!(rest.is_some(), "an idle keep-alive connection stayed open");
    assert!(t.elapsed() >= HEADER_TIMEOUT / 2, "{:?}", t.elapsed());
    serves_a_good_request(&s).await;
}

#[tokio::test]
async fn a_body_that_trickles_in_gets_a_408() {
    let s = start(limits());
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .await
    .unwrap();
    let t = Instant::now();
    let answer = read_until_closed(&mut c, BODY_TIMEOUT * 4)
        .await
        .expect("no answer to a stalled body");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(t.elapsed() >= BODY_TIMEOUT, "{:?}", t.elapsed());
    let e = body_of(&answer);
    assert!(e["error"]["message"].as_str().unwrap().contains("body"));
    assert_eq!(e["error"]["type"], "invalid_request_error");
    serves_a_good_request(&s).await;
}

#[tokio::test]
async fn a_connection_over_the_cap_gets_a_503_it_can_read() {
    let s = start(HttpLimits {
        header_timeout: Duration::from_secs(30),
        ..limits()
    });
    // Four open connections (each proven accepted by a whole exchange) fill the cap.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(accepted_keep_alive(&s).await);
    }
    // The fifth sends a whole request and reads a 503 with an OpenAI-style body, no reset.
    let mut over = TcpStream::connect(addr(&s)).await.unwrap();
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}).to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    over.write_all(req.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut over, Duration::from_secs(10))
        .await
        .expect("the refused connection was not closed");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("retry-after: 1"));
    let e = body_of(&answer);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 4 open connections"),
        "{e}"
    );
    // Freed, the server takes new connections again, and counted the refusal.
    // Until the server has seen the four close, a scrape can itself be refused: count those.
    drop(held);
    let t = Instant::now();
    let mut scrapes_refused = 0;
    let m = loop {
        match client().get(s.url("/metrics")).send().await {
            Ok(r) if r.status() == 200 => break r.text().await.unwrap(),
            Ok(r) if r.status() == 503 => scrapes_refused += 1,
            _ => {}
        }
        assert!(t.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let refused = m
        .lines()
        .find(|l| l.starts_with("tokenmill_rejected_requests_total{reason=\"max_connections\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(refused, Some(1.0 + f64::from(scrapes_refused)), "{m}");
    assert!(metric(&m, "vllm:num_requests_running").is_some());
    serves_a_good_request(&s).await;
}

/// Heads too big, too many headers, and bytes that are not HTTP: hyper's 431 / 400, the
/// connection closed, the server unharmed.
#[tokio::test]
async fn oversized_and_malformed_heads_are_refused() {
    let s = start(limits());
    let many: String = (0..40).map(|i| format!("X-H{i}: v\r\n")).collect();
    let big = format!("X-Big: {}\r\n", "a".repeat(20 << 10));
    let cases: Vec<(String, &str)> = vec![
        (
            format!("GET /health HTTP/1.1\r\nHost: x\r\n{many}\r\n"),
            "431",
        ),
        (
            format!("GET /health HTTP/1.1\r\nHost: x\r\n{big}\r\n"),
            "431",
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "p".repeat(20 << 10)),
            "431",
        ),
        ("NOT HTTP AT ALL\r\n\r\n".into(), "400"),
        ("GET / HTTP/9.9\r\nHost: x\r\n\r\n".into(), "400"),
        ("GET /health HTTP/1.1\r\nBad Header\r\n\r\n".into(), "400"),
        (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\
             Content-Length: 6\r\n\r\nhello!"
                .into(),
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".into(),
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             zz\r\nhello\r\n0\r\n\r\n"
                .into(),
            "400",
        ),
        ("\u{0}\u{1}\u{2}\u{ff}garbage\r\n\r\n".into(), "400"),
    ];
    for (raw, status) in &cases {
        let mut c = TcpStream::connect(addr(&s)).await.unwrap();
        // The server may answer and close before the whole head is written; that is fine.
        let _ = c.write_all(raw.as_bytes()).await;
        let answer = read_until_closed(&mut c, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("no close after {:?}", &raw[..raw.len().min(60)]));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{:?} -> {answer:?}",
            &raw[..raw.len().min(60)]
        );
        serves_a_good_request(&s).await;
    }
}
