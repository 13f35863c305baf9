//! `GET /dashboard`: a live page of the server's own numbers — output tokens/s, running and
//! waiting requests, batch size, step time and TTFT/ITL percentiles against the SLA targets,
//! KV usage — drawn by the page's script from `/metrics` and `/server_info`, polled every
//! second. The page (`dashboard.html`) is compiled in; it loads nothing from elsewhere.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("../dashboard.html");

pub async fn dashboard() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE)
}
