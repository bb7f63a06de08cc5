//! The routing both servers wrap around their own endpoints: the `/v1` gate (API key, then
//! availability), `/health`, `/metrics`, the OpenAI 404 for any other path, the body limit,
//! and the count of every response by endpoint and status.

use crate::prom::StatusCounts;
use crate::{ApiError, Availability};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use std::sync::Arc;

/// What the shared routing reads of a server's state.
pub trait ApiState: Send + Sync + 'static {
    /// The paths `/metrics` counts by name; any other path counts as `other`.
    const ENDPOINTS: &'static [&'static str];
    /// The key `/v1` requests must carry (`Authorization: Bearer KEY`), if any.
    fn api_key(&self) -> Option<&str>;
    /// Whether the API takes requests now.
    fn availability(&self) -> Availability;
    /// The responses counted by endpoint and status.
    fn status_counts(&self) -> &StatusCounts;
}

/// The server's router: `v1` (its `/v1` routes) behind the gate (the API key, 401; then
/// [`ApiState::availability`], 503), `GET /health`, `/metrics` (`metrics`),
/// [`ApiError::no_route`] elsewhere, bodies up to `max_body_bytes` (413 beyond), and every
/// response counted by endpoint and status.
pub fn api_router<S: ApiState>(shared: Arc<S>, v1: Router<Arc<S>>, metrics: MethodRouter<Arc<S>>, max_body_bytes: usize) -> Router {
    Router::new()
        .merge(v1.layer(middleware::from_fn_with_state(shared.clone(), gate::<S>)))
        .route("/health", get(health::<S>))
        .route("/metrics", metrics)
        .fallback(|| async { ApiError::no_route() })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(shared.clone(), count_status::<S>))
        .with_state(shared)
}

/// Counts every response by endpoint ([`ApiState::ENDPOINTS`], else `other`) and status.
async fn count_status<S: ApiState>(State(s): State<Arc<S>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let endpoint = if S::ENDPOINTS.contains(&path) { path.to_string() } else { "other".to_string() };
    let r = next.run(req).await;
    s.status_counts().count(&endpoint, r.status().as_u16());
    r
}

/// The `/v1` routes' checks: the API key (401), then availability (503).
async fn gate<S: ApiState>(State(s): State<Arc<S>>, req: Request, next: Next) -> Response {
    if let Err(e) = crate::authorize(s.api_key(), req.headers()) {
        return e.into_response();
    }
    match s.availability().api_error() {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}

async fn health<S: ApiState>(State(s): State<Arc<S>>) -> Response {
    s.availability().health()
}
