//! Connections: the accept loop, under a cap, serving HTTP/1.1 with limits on what a client
//! may hold.
//!
//! - **A cap on open connections** ([`HttpLimits::max_connections`]): one over it is answered
//!   `503` with an OpenAI-style body and `Connection: close` — after reading what the client
//!   already sent, so it gets the answer rather than a reset — and closed.
//! - **A header timeout** ([`HttpLimits::header_timeout`]): a request head must arrive whole
//!   within it, and a keep-alive connection may sit idle between requests no longer than it
//!   (hyper starts the same timer when it waits for the next head), so a slow-loris client
//!   cannot hold a connection. The body's own deadline is [`HttpLimits::body_timeout`],
//!   enforced where bodies are read (`json::JsonBody`, 408).
//! - **Header limits**: at most [`HttpLimits::max_headers`] headers and
//!   [`HttpLimits::max_header_bytes`] bytes of head, beyond which hyper answers `431`.
//!
//! Shutdown: when `stop` resolves the listener closes, idle connections close, and busy ones
//! finish their current exchange; [`serve`] returns once every connection is gone (the caller
//! bounds that wait).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// What one client may hold of the server (the `serve --max-connections`,
/// `--http-header-timeout` and `--http-body-timeout` flags).
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Open connections at most; one more is refused with 503.
    pub max_connections: usize,
    /// For a whole request head, and for a keep-alive connection's idle time.
    pub header_timeout: Duration,
    /// For a whole request body (408 beyond).
    pub body_timeout: Duration,
    /// Headers per request at most (431 beyond).
    pub max_headers: usize,
    /// Bytes of request head at most (431 beyond).
    pub max_header_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            max_headers: 100,
            max_header_bytes: 64 << 10,
        }
    }
}

/// How long a refused connection is given to finish sending its request (read and
/// dropped), and then to read the 503.
const REFUSAL_READ: Duration = Duration::from_millis(200);
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Refusals being answered at once, at most; beyond, a connection is closed unanswered.
const MAX_REFUSALS: usize = 64;

/// Serves `app` on `listener` until `stop` resolves (module doc); `on_refused` is called for
/// each connection refused over the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    on_refused: impl Fn() + Send + Sync + 'static,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_headers(limits.max_headers)
        .max_header_size(limits.max_header_bytes)
        .keep_alive(true);
    let service = TowerToHyperService::new(app);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSALS));
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning; a
                    // connection that died before it was accepted is nothing to wait for.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let conn =
                    graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
                tokio::spawn(async move {
                    // A client that goes away mid-exchange is an error here; nothing to do.
                    let _ = conn.await;
                    drop(permit);
                });
            }
            Err(_) => {
                on_refused();
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, limits.max_connections, permit));
                }
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers a connection over the cap: reads what it sent so far (so closing does not reset
/// it), writes the 503, closes its side, and reads on briefly until the client closes.
async fn refuse(mut stream: TcpStream, max: usize, _permit: OwnedSemaphorePermit) {
    let mut scratch = [0u8; 8192];
    let _ = tokio::time::timeout(REFUSAL_READ, stream.read(&mut scratch)).await;
    let _ = stream.write_all(&refusal(max)).await;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut total = 0usize;
        while let Ok(n) = stream.read(&mut scratch).await {
            total += n;
            if n == 0 || total > 1 << 20 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, drain).await;
}

/// The raw HTTP/1.1 503 for a connection over the cap.
fn refusal(max: usize) -> Vec<u8> {
    let body = ApiError::too_many_connections(max).body().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nx-request-id: {:032x}\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        rand::random::<u128>(),
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_whole_http_answer_with_an_openai_body() {
        let raw = String::from_utf8(refusal(7)).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains('7'));
        assert_eq!(v["error"]["type"], "service_unavailable");
    }
}
