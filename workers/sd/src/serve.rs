//! `sd-worker serve`: OpenAI's images API (`POST /v1/images/generations`) over HTTP, with the
//! LLM server's conventions (through `openai-http`): OpenAI error objects, `Authorization:
//! Bearer KEY`, a body size limit (413), 429 with `Retry-After` when the queue is full, 503
//! until the model is loaded and while shutting down, loopback by default, and a graceful
//! shutdown on SIGTERM/SIGINT.
//!
//! # Design
//! - One worker thread loads the [`Pipeline`] and owns it (device handles need not be
//!   `Send`); requests reach it through a bounded channel, one job (all `n` images of a
//!   request) at a time, in arrival order.
//! - Admission: at most `max_queue` jobs wait besides the one running; beyond that 429.
//! - A client that disconnects drops its reply channel: the worker skips its job if it has
//!   not started, and stops it at the next denoising step if it has ([`Progress::cancelled`]).
//! - Shutdown ([`Server::shutdown`], or a signal under [`run`]): new requests get 503, the
//!   running and queued jobs may finish for [`ServeConfig::shutdown_grace`], then they are
//!   cancelled (their clients get 503), the worker thread ends and [`Server::wait`] returns.
//! - Image `k` of a request with seed `s` uses seed `s + k` (as `sd-worker generate
//!   --images`); without a seed, one is drawn from the clock.

use crate::{Pipeline, Progress, Request, SdConfig, SdError};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use openai_http::prom::{self, Histogram, StatusCounts};
use openai_http::{ApiError, Availability, Lifecycle, LoadState};
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Server settings (the `sd-worker serve` flags other than the model's).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The model id clients may name in `"model"` and `/v1/models` lists.
    pub model_name: String,
    /// Requests must carry `Authorization: Bearer KEY` (401 otherwise); `None`: no key.
    pub api_key: Option<String>,
    /// Requests waiting for the worker besides the one it runs; one more gets 429.
    pub max_queue: usize,
    /// Largest `n` (images per request).
    pub max_images: usize,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// How long running and queued requests may go on after shutdown begins before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    /// The `Retry-After` seconds of a 429.
    pub retry_after_s: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self { model_name: "sd".into(), api_key: None, max_queue: 16, max_images: 4, max_body_bytes: 1 << 20, shutdown_grace: Duration::from_secs(30), retry_after_s: 5 }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
    #[error("loading the model: {0}")]
    Load(String),
    #[error("the worker thread panicked")]
    WorkerPanicked,
}

/// Largest `steps` a request may ask for.
pub const MAX_STEPS: usize = 150;

/// What a request may ask of the loaded model.
#[derive(Clone, Debug)]
struct Limits {
    cfg: SdConfig,
    /// Width and height must be multiples of this (8, or the VAE's scale if larger).
    multiple: usize,
    /// Largest width or height: twice the model's native size.
    max_side: usize,
}

impl Limits {
    fn of(cfg: &SdConfig) -> Self {
        Self { cfg: cfg.clone(), multiple: cfg.latent_scale().max(8), max_side: 2 * cfg.width.max(cfg.height) }
    }
}

struct Job {
    reqs: Vec<Request>,
    reply: oneshot::Sender<Result<Vec<Vec<u8>>, SdError>>,
}

/// Upper bounds (seconds) of the per-image generation histogram: a tiny model on a CPU to
/// SDXL at 30 steps on a slow device.
const GEN_BUCKETS: [f64; 14] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0];

struct Metrics {
    requests: StatusCounts,
    images: AtomicU64,
    /// Jobs skipped or stopped because their client had gone.
    abandoned: AtomicU64,
    /// Seconds per image on the worker thread (text encoding, steps, decode, PNG).
    image_seconds: Histogram,
}

struct Shared {
    config: ServeConfig,
    limits: OnceLock<Limits>,
    jobs: Mutex<Option<mpsc::SyncSender<Job>>>,
    /// Requests admitted and not answered (running, queued, or between the two).
    in_flight: AtomicUsize,
    /// Jobs in the channel, not yet taken by the worker.
    queued: AtomicUsize,
    draining: AtomicBool,
    /// Set when the shutdown grace is over: the worker cancels what it runs and has queued.
    cancel: AtomicBool,
    worker_down: AtomicBool,
    metrics: Metrics,
}

impl openai_http::ApiState for Shared {
    const ENDPOINTS: &'static [&'static str] = &["/v1/images/generations", "/v1/models", "/health", "/metrics"];

    fn api_key(&self) -> Option<&str> {
        self.config.api_key.as_deref()
    }

    fn availability(&self) -> Availability {
        Availability::of(self.draining.load(Ordering::SeqCst), self.worker_down.load(Ordering::SeqCst), self.limits.get().is_some(), "worker")
    }

    fn status_counts(&self) -> &StatusCounts {
        &self.metrics.requests
    }
}

/// A running server: its address, readiness, shutdown and completion.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    life: Lifecycle<ServeError>,
}

impl Server {
    /// Starts serving on `listener` (inside a tokio runtime) and loading the pipeline with
    /// `load` on a new worker thread. The API answers 503 until the load ends.
    pub fn start<F>(config: ServeConfig, listener: tokio::net::TcpListener, load: F) -> Result<Server, ServeError>
    where
        F: FnOnce() -> Result<Pipeline, SdError> + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let (job_tx, job_rx) = mpsc::sync_channel(config.max_queue + 1);
        let shared = Arc::new(Shared {
            config,
            limits: OnceLock::new(),
            jobs: Mutex::new(Some(job_tx)),
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            worker_down: AtomicBool::new(false),
            metrics: Metrics { requests: StatusCounts::default(), images: AtomicU64::new(0), abandoned: AtomicU64::new(0), image_seconds: Histogram::with_buckets(&GEN_BUCKETS) },
        });
        let (load_tx, load_rx) = watch::channel(LoadState::Loading);
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new().name("sd-worker".into()).spawn(move || worker_thread(load, worker_shared, job_rx, load_tx))?;

        let app = router(shared.clone());
        let (draining, over, finish) = (shared.clone(), shared.clone(), shared.clone());
        let life = Lifecycle::start(
            listener,
            app,
            load_rx,
            worker,
            shared.config.shutdown_grace,
            move || draining.draining.store(true, Ordering::SeqCst),
            move || {
                tracing::warn!(in_flight = over.in_flight.load(Ordering::SeqCst), "shutdown grace over: cancelling in-flight requests");
                over.cancel.store(true, Ordering::SeqCst);
            },
            // No more jobs: the worker thread ends once the channel is empty.
            move || {
                finish.cancel.store(true, Ordering::SeqCst);
                finish.jobs.lock().unwrap().take();
            },
            (ServeError::Load, || ServeError::WorkerPanicked),
        );
        Ok(Server { addr, shared, life })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the pipeline is loaded (Ok) or its loader failed (Err).
    pub async fn ready(&self) -> Result<(), ServeError> {
        self.life.ready().await
    }

    /// Begins a graceful shutdown (idempotent); [`Server::wait`] returns when it is over.
    pub fn shutdown(&mut self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.life.shutdown();
    }

    /// Waits until the server has stopped (after [`Server::shutdown`]).
    pub async fn wait(self) -> Result<(), ServeError> {
        self.life.wait().await
    }
}

/// What `sd-worker serve` calls: binds `addr`, loads the pipeline with `load` on the worker
/// thread, serves until SIGTERM or SIGINT, shuts down gracefully and returns `Ok(())`.
/// Builds its own multi-threaded tokio runtime.
pub fn run<F>(config: ServeConfig, addr: SocketAddr, load: F) -> Result<(), ServeError>
where
    F: FnOnce() -> Result<Pipeline, SdError> + Send + 'static,
{
    openai_http::run_until_signal(addr, |source| ServeError::Bind { addr, source }, |listener| Server::start(config, listener, load))
}

impl openai_http::Supervised for Server {
    type Error = ServeError;
    fn local_addr(&self) -> SocketAddr {
        Server::local_addr(self)
    }
    async fn ready(&self) -> Result<(), ServeError> {
        Server::ready(self).await
    }
    fn shutdown(&mut self) {
        Server::shutdown(self)
    }
    async fn wait(self) -> Result<(), ServeError> {
        Server::wait(self).await
    }
}

/// Stops a generation whose client has gone or when the shutdown grace is over.
struct Watch<'a> {
    reply: &'a oneshot::Sender<Result<Vec<Vec<u8>>, SdError>>,
    cancel: &'a AtomicBool,
}

impl Progress for Watch<'_> {
    fn cancelled(&self) -> bool {
        self.reply.is_closed() || self.cancel.load(Ordering::SeqCst)
    }
}

fn worker_thread<F>(load: F, shared: Arc<Shared>, jobs: mpsc::Receiver<Job>, load_tx: watch::Sender<LoadState>)
where
    F: FnOnce() -> Result<Pipeline, SdError>,
{
    /// Marks the worker down however the thread ends (a panic included).
    struct Down(Arc<Shared>);
    impl Drop for Down {
        fn drop(&mut self) {
            self.0.worker_down.store(true, Ordering::SeqCst);
        }
    }
    let _down = Down(shared.clone());
    let t0 = Instant::now();
    let pipe = match load() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "loading the model failed");
            let _ = load_tx.send(LoadState::Failed(e.to_string()));
            return;
        }
    };
    let _ = shared.limits.set(Limits::of(&pipe.cfg));
    tracing::info!(load_s = t0.elapsed().as_secs_f64(), "model loaded");
    let _ = load_tx.send(LoadState::Ready);
    while let Ok(job) = jobs.recv() {
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        if job.reply.is_closed() {
            shared.metrics.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::info!("client gone before its turn: request skipped");
            continue;
        }
        let mut pngs = Vec::with_capacity(job.reqs.len());
        let mut result = Ok(());
        for req in &job.reqs {
            let t = Instant::now();
            match pipe.generate(req, &mut Watch { reply: &job.reply, cancel: &shared.cancel }).and_then(|g| crate::png_bytes(&g.image)) {
                Ok(png) => {
                    shared.metrics.images.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.image_seconds.observe(t.elapsed().as_secs_f64());
                    pngs.push(png);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if matches!(result, Err(SdError::Cancelled)) && job.reply.is_closed() {
            shared.metrics.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::info!("client gone: generation stopped");
        }
        let _ = job.reply.send(result.map(|()| pngs));
    }
    tracing::info!("worker thread stopped");
}

fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.max_body_bytes;
    let v1 = Router::new().route("/v1/images/generations", post(generations)).route("/v1/models", get(models));
    openai_http::api_router(shared, v1, get(metrics), limit)
}

type St = State<Arc<Shared>>;

async fn metrics(State(s): St) -> Response {
    let m = &s.metrics;
    let mut o = String::new();
    m.requests.write(&mut o, "sd_requests_total", "HTTP responses by endpoint and status.");
    prom::write_value(&mut o, "sd_images_generated_total", "counter", "Images generated and sent.", m.images.load(Ordering::Relaxed));
    prom::write_value(&mut o, "sd_requests_abandoned_total", "counter", "Requests skipped or stopped because their client had gone.", m.abandoned.load(Ordering::Relaxed));
    prom::write_value(&mut o, "sd_requests_in_flight", "gauge", "Requests admitted and not answered.", s.in_flight.load(Ordering::SeqCst));
    prom::write_value(&mut o, "sd_queue_depth", "gauge", "Requests waiting for the worker thread.", s.queued.load(Ordering::SeqCst));
    m.image_seconds.write(&mut o, "sd_image_generation_seconds", "Worker-thread time per image (text encoding, denoising steps, VAE decode, PNG).");
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], o).into_response()
}

async fn models(State(s): St) -> Response {
    let l = s.limits.get().expect("gate checked");
    Json(json!({"object": "list", "data": [{
        "id": s.config.model_name, "object": "model", "created": 0, "owned_by": "sd-worker",
        "default_size": format!("{}x{}", l.cfg.width, l.cfg.height), "max_side": l.max_side, "size_multiple": l.multiple,
    }]}))
    .into_response()
}

/// `POST /v1/images/generations`: OpenAI's fields, and `seed`, `steps`, `guidance_scale`,
/// `negative_prompt` as extensions. Other OpenAI fields (`quality`, `style`, `user`) are
/// accepted and ignored.
#[derive(Deserialize)]
struct ImagesRequest {
    prompt: String,
    model: Option<String>,
    n: Option<i64>,
    size: Option<String>,
    response_format: Option<String>,
    seed: Option<u64>,
    steps: Option<i64>,
    guidance_scale: Option<f64>,
    negative_prompt: Option<String>,
}

/// The pipeline requests of `r` (one per image), or why it is invalid.
fn validate(r: ImagesRequest, limits: &Limits, config: &ServeConfig) -> Result<Vec<Request>, ApiError> {
    if let Some(m) = &r.model {
        openai_http::check_model(m, &config.model_name)?;
    }
    if r.prompt.trim().is_empty() {
        return Err(ApiError::bad("prompt must not be empty", Some("prompt")));
    }
    match r.response_format.as_deref() {
        None | Some("b64_json") => {}
        Some("url") => return Err(ApiError::bad("response_format `url` is not supported: this server keeps no images; use `b64_json` (the PNG inline, base64)", Some("response_format"))),
        Some(f) => return Err(ApiError::bad(format!("response_format must be `b64_json`, got `{f}`"), Some("response_format"))),
    }
    let max_n = config.max_images;
    let n = r.n.unwrap_or(1);
    if n < 1 || n as u64 > max_n as u64 {
        return Err(ApiError::bad(format!("n must be in [1, {max_n}], got {n}"), Some("n")));
    }
    let cfg = &limits.cfg;
    let (width, height) = match r.size.as_deref() {
        None | Some("auto") => (cfg.width, cfg.height),
        Some(s) => {
            let (m, top) = (limits.multiple, limits.max_side);
            let bad = || ApiError::bad(format!("size must be \"WxH\" with W and H multiples of {m} in [{m}, {top}] (this model's default is {}x{}), got {s:?}", cfg.width, cfg.height), Some("size"));
            let (w, h) = s.split_once('x').ok_or_else(bad)?;
            let (w, h): (usize, usize) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
            if [w, h].iter().any(|&v| v < m || v > top || v % m != 0) {
                return Err(bad());
            }
            (w, h)
        }
    };
    let mut base = Request::new(cfg, &r.prompt, 0);
    base.width = width;
    base.height = height;
    base.negative_prompt = r.negative_prompt.unwrap_or_default();
    if let Some(steps) = r.steps {
        if steps < 1 || steps as u64 > MAX_STEPS as u64 {
            return Err(ApiError::bad(format!("steps must be in [1, {MAX_STEPS}], got {steps}"), Some("steps")));
        }
        base.steps = steps as usize;
    }
    if let Some(g) = r.guidance_scale {
        if !(0.0..=50.0).contains(&g) {
            return Err(ApiError::bad(format!("guidance_scale must be in [0, 50], got {g}"), Some("guidance_scale")));
        }
        base.guidance = g;
    }
    let seed = r.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0));
    Ok((0..n as u64).map(|k| Request { seed: seed.wrapping_add(k), ..base.clone() }).collect())
}

/// Releases an admitted request's slot however its handler ends (answered, or dropped by a
/// disconnecting client).
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn generations(State(s): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let r: ImagesRequest = openai_http::parse_json(body)?;
    let limits = s.limits.get().expect("gate checked");
    let reqs = validate(r, limits, &s.config)?;
    let n = reqs.len();
    if s.in_flight.fetch_add(1, Ordering::SeqCst) > s.config.max_queue {
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::queue_full(s.config.retry_after_s));
    }
    let _slot = Slot(s.clone());
    let start = Instant::now();
    let (reply, rx) = oneshot::channel();
    {
        let jobs = s.jobs.lock().unwrap();
        let Some(tx) = jobs.as_ref() else { return Err(ApiError::unavailable("the server is shutting down")) };
        s.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = tx.try_send(Job { reqs, reply }) {
            s.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(match e {
                mpsc::TrySendError::Full(_) => ApiError::queue_full(s.config.retry_after_s),
                mpsc::TrySendError::Disconnected(_) => ApiError::unavailable("the worker has stopped"),
            });
        }
    }
    let pngs = match rx.await {
        Ok(Ok(pngs)) => pngs,
        Ok(Err(SdError::Cancelled)) => return Err(ApiError::unavailable("the server is shutting down: the request was cancelled")),
        Ok(Err(SdError::Invalid(m))) => return Err(ApiError::bad(m, None)),
        Ok(Err(e)) => return Err(ApiError::internal(format!("generation failed: {e}"))),
        Err(_) => return Err(ApiError::unavailable("the worker has stopped")),
    };
    tracing::info!(target: "sd_worker::request", images = n, total_ms = start.elapsed().as_secs_f64() * 1e3, "request");
    let b64 = base64::engine::general_purpose::STANDARD;
    let data: Vec<_> = pngs.iter().map(|p| json!({"b64_json": b64.encode(p)})).collect();
    Ok(Json(json!({"created": openai_http::unix_now(), "data": data})).into_response())
}
