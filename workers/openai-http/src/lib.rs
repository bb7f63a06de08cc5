//! HTTP conventions shared by the workers' OpenAI-compatible servers (`llm-server` behind
//! `llm-worker serve`, and `sd-worker serve`), so that both answer alike:
//!
//! - [`ApiError`]: the OpenAI error object `{"error": {"message", "type", "param", "code"}}`
//!   with its status (and `Retry-After` on a 429), and constructors for the cases both
//!   servers meet (bad field, unknown model, full queue, shutting down).
//! - [`authorize`]: the `Authorization: Bearer KEY` check (401), compared in constant time.
//! - [`parse_json`]: a request body read under axum's `DefaultBodyLimit` (413 beyond) and
//!   parsed as JSON (400 with serde's message when malformed or missing a field).
//! - [`shutdown_signal`] (SIGTERM/SIGINT) and [`no_delay`] (accepted connections without
//!   Nagle's algorithm); [`Listen`], the `--host`, `--port`, `--api-key` flags of both
//!   `serve` commands.
//! - [`lifecycle`]: loading on the model's own thread (503 until it ends) and the graceful
//!   shutdown (stop admitting, a grace period for in-flight requests, cancel, close).
//! - [`prom`]: the few Prometheus text-format pieces the servers write (counters by status,
//!   gauges, histograms).
//! - [`routes`]: the router around a server's own endpoints ([`api_router`]: the `/v1`
//!   gate, `/health`, `/metrics`, the 404, the body limit, the status counts).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::net::SocketAddr;

pub mod lifecycle;
pub mod prom;
pub mod routes;

pub use lifecycle::{run_until_signal, serve_until_stopped, Lifecycle, LoadState, Supervised};
pub use routes::{api_router, ApiState};

/// The listening flags of a `serve` command (`#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug)]
pub struct Listen {
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
}

impl Listen {
    /// The socket address of `--host` and `--port`; the error names the bad `--host`.
    pub fn addr(&self) -> Result<SocketAddr, String> {
        let ip: std::net::IpAddr = self.host.parse().map_err(|e| format!("--host {:?}: {e}", self.host))?;
        Ok(SocketAddr::new(ip, self.port))
    }
}

/// An OpenAI error response: the status, and the body's `type`, `message`, `param`, `code`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// The `type` field (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>, param: Option<&'static str>, code: Option<&'static str>) -> Self {
        Self { status, kind, message: message.into(), param, code, retry_after: None }
    }

    /// 400 `invalid_request_error`: a malformed or unsupported request (field `param`).
    pub fn bad(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, param, None)
    }

    /// 503 `service_unavailable`: loading, shutting down, or the model's thread gone.
    pub fn unavailable(message: &str) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", message, None, None)
    }

    /// 500 `server_error`: the request was valid and running it failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message, None, None)
    }

    /// 404 for a route the server does not have.
    pub fn no_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", "no such route", None, None)
    }

    /// 429 `rate_limit_error` (code `queue_full`) with `Retry-After: retry_after_s`.
    pub fn queue_full(retry_after_s: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "the request queue is full; retry later", None, Some("queue_full"));
        e.retry_after = Some(retry_after_s);
        e
    }
}

/// Whether a server takes API requests now: its `/v1` gate and its `/health` answer from
/// the same state, in the same order (shutting down, then a stopped thread, then loading).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    Ready,
    ShuttingDown,
    /// The thread that runs the requests (named, e.g. "engine", "worker") has ended.
    Stopped(&'static str),
    Loading,
}

impl Availability {
    /// From the server's flags: `draining` (shutdown begun), `stopped` (its `thread` ended)
    /// and `loaded`.
    pub fn of(draining: bool, stopped: bool, loaded: bool, thread: &'static str) -> Self {
        if draining {
            Self::ShuttingDown
        } else if stopped {
            Self::Stopped(thread)
        } else if !loaded {
            Self::Loading
        } else {
            Self::Ready
        }
    }

    /// The 503 a `/v1` request gets, or `None` when ready.
    pub fn api_error(self) -> Option<ApiError> {
        match self {
            Self::Ready => None,
            Self::ShuttingDown => Some(ApiError::unavailable("the server is shutting down")),
            Self::Stopped(t) => Some(ApiError::unavailable(&format!("the {t} has stopped"))),
            Self::Loading => Some(ApiError::unavailable("the model is loading")),
        }
    }

    /// `GET /health`: 200 `ok` when ready, else 503 with the reason.
    pub fn health(self) -> Response {
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        match self {
            Self::Ready => (StatusCode::OK, "ok\n".to_string()),
            Self::ShuttingDown => (unavailable, "shutting down\n".to_string()),
            Self::Stopped(t) => (unavailable, format!("{t} stopped\n")),
            Self::Loading => (unavailable, "loading\n".to_string()),
        }
        .into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        let mut r = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// 404 `model_not_found` unless `requested` is the `served` model's id.
pub fn check_model(requested: &str, served: &str) -> Result<(), ApiError> {
    if requested == served {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("the model `{requested}` does not exist (this server serves `{served}`)"),
        Some("model"),
        Some("model_not_found"),
    ))
}

/// With a `key`, the request must carry `Authorization: Bearer KEY` (401
/// `authentication_error`, code `invalid_api_key`, otherwise); no key: everything passes.
/// The comparison takes the same time wherever the strings differ.
pub fn authorize(key: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = key else { return Ok(()) };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let ok = given.is_some_and(|g| g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0);
    if ok {
        return Ok(());
    }
    let msg = if given.is_none() { "missing API key (Authorization: Bearer KEY)" } else { "incorrect API key" };
    Err(ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", msg, None, Some("invalid_api_key")))
}

/// A JSON request body: the body as axum's `Bytes` extractor gave it (413
/// `request_too_large` past the router's `DefaultBodyLimit`, or its other rejections with
/// their status) parsed into `T` (400 with serde's message when it does not parse or a
/// field is missing or of the wrong type).
pub fn parse_json<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        let status = e.status();
        let kind = if status == StatusCode::PAYLOAD_TOO_LARGE { "request_too_large" } else { "invalid_request_error" };
        ApiError::new(status, kind, e.body_text(), None, None)
    })?;
    serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("invalid request body: {e}"), None))
}

/// Installs the SIGINT (Ctrl-C) and, on Unix, SIGTERM handlers now (inside a tokio runtime)
/// and returns a future that resolves on the first of them.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// `listener` with Nagle's algorithm off on every accepted connection: a streamed token is
/// one small write, and with Nagle on it can wait for the client's delayed ACK of the
/// previous one (tens of milliseconds) before it leaves.
pub fn no_delay(listener: tokio::net::TcpListener) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("could not turn Nagle's algorithm off on a connection: {e}");
        }
    })
}

/// Seconds since the Unix epoch (the `created` field of responses); 0 if the clock is
/// before it.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(e: ApiError) -> (StatusCode, Option<String>, serde_json::Value) {
        let r = e.into_response();
        let status = r.status();
        let retry = r.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn error_object_shape_and_retry_after() {
        let (st, retry, v) = body_json(ApiError::queue_full(3)).await;
        assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry.as_deref(), Some("3"));
        assert_eq!(v, json!({"error": {"message": "the request queue is full; retry later", "type": "rate_limit_error", "param": null, "code": "queue_full"}}));
        let (st, retry, v) = body_json(ApiError::bad("n must be 1..=4", Some("n"))).await;
        assert_eq!((st, retry), (StatusCode::BAD_REQUEST, None));
        assert_eq!(v["error"]["param"], "n");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn api_key_check() {
        let mut h = HeaderMap::new();
        assert!(authorize(None, &h).is_ok());
        let e = authorize(Some("k1"), &h).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNAUTHORIZED, Some("invalid_api_key")));
        assert!(e.message.contains("missing"));
        for wrong in ["Bearer k2", "Bearer k1x", "Bearer k", "k1", "Basic k1"] {
            h.insert(header::AUTHORIZATION, wrong.parse().unwrap());
            assert_eq!(authorize(Some("k1"), &h).unwrap_err().status, StatusCode::UNAUTHORIZED, "{wrong}");
        }
        h.insert(header::AUTHORIZATION, "Bearer k1".parse().unwrap());
        assert!(authorize(Some("k1"), &h).is_ok());
    }

    #[test]
    fn model_check() {
        assert!(check_model("m", "m").is_ok());
        let e = check_model("other", "m").unwrap_err();
        assert_eq!((e.status, e.param, e.code), (StatusCode::NOT_FOUND, Some("model"), Some("model_not_found")));
        assert!(e.message.contains("`other`") && e.message.contains("`m`"));
    }

    #[test]
    fn json_bodies() {
        #[derive(serde::Deserialize, Debug)]
        struct R {
            #[allow(dead_code)]
            prompt: String,
        }
        assert!(parse_json::<R>(Ok(Bytes::from_static(br#"{"prompt": "x"}"#))).is_ok());
        for bad in [&b"{oops"[..], br#"{"prompt": 3}"#, b"{}"] {
            let e = parse_json::<R>(Ok(Bytes::copy_from_slice(bad))).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.starts_with("invalid request body"), "{}", e.message);
        }
    }

    #[test]
    fn availability_reports_shutdown_then_a_stopped_thread_then_loading() {
        use Availability::*;
        assert_eq!(Availability::of(true, true, false, "engine"), ShuttingDown);
        assert_eq!(Availability::of(false, true, false, "engine"), Stopped("engine"));
        assert_eq!(Availability::of(false, false, false, "engine"), Loading);
        assert_eq!(Availability::of(false, false, true, "engine"), Ready);
        assert!(Ready.api_error().is_none());
        let e = Stopped("worker").api_error().unwrap();
        assert_eq!((e.status, e.message.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "the worker has stopped"));
        assert_eq!(Ready.health().status(), StatusCode::OK);
        assert_eq!(Loading.health().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
