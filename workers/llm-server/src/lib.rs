//! OpenAI-compatible HTTP front end of the LLM worker, over any [`llm_engine::Engine`].
//!
//! Endpoints: `POST /v1/completions` and `POST /v1/chat/completions` (plain JSON, or server-sent
//! events ending in `data: [DONE]` with `"stream": true`), `GET /v1/models`, `GET /health` (503
//! until the model is loaded and while shutting down, then 200) and `GET /metrics` (Prometheus
//! text). Errors are OpenAI error objects (`{"error": {"message", "type", "param", "code"}}`).
//!
//! # Design
//! - The model side is two things a loader closure returns on the engine thread: a
//!   [`ServedModel`] (tokenizer, chat template, name, limits, EOS ids; shared with the HTTP
//!   handlers, which tokenize and detokenize) and an `Engine<R>` (which never leaves its
//!   thread, so the runner need not be `Send`).
//! - The engine thread loops: take queued commands (add a request, cancel everything), run
//!   [`llm_engine::Engine::step`] while there is work, publish occupancy for `/metrics`.
//!   Each request's events come back through its own tokio receiver; a handler dropped by a
//!   disconnecting client drops that receiver, and the engine's next step cancels the sequence
//!   and frees its blocks.
//! - Admission: at most `max_num_seqs + max_queue` requests in flight; beyond that 429 with
//!   `Retry-After`. Prompts longer than the model, or with no room for `max_tokens`, are 400
//!   (never truncated).
//! - Shutdown ([`Server::shutdown`], or SIGTERM/SIGINT under [`run`]): new requests get 503,
//!   in-flight ones may finish for [`ServerConfig::shutdown_grace`], then they are cancelled
//!   (streams end with `finish_reason: "abort"`), the engine thread ends and [`Server::wait`]
//!   returns.
//! - One `tracing` info line per request (target `llm_server::request`) with its timings.

mod api;
mod metrics;

pub use api::ChatMessage;

use llm_engine::{Engine, EngineError, Event, ModelRunner, Receiver, SamplingParams, SeqId};
use metrics::Metrics;
use openai_http::{Availability, Lifecycle, LoadState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{oneshot, watch};

/// The text side of a served model: what the HTTP handlers need besides the engine.
pub trait ServedModel: Send + Sync + 'static {
    /// The model id clients name in `"model"` and `/v1/models` lists.
    fn name(&self) -> &str;
    /// Longest sequence (prompt + completion) in tokens; must equal the engine's `max_model_len`.
    fn max_model_len(&self) -> usize;
    /// Token ids that end a completion (EOS, end of turn); never sent to clients.
    fn eos_token_ids(&self) -> Vec<u32>;
    /// Token ids of `text`; `add_special_tokens` adds the tokenizer's own (a BOS) as a plain
    /// completion prompt needs; a rendered chat template is encoded without.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String>;
    /// The text of `ids`, special tokens skipped.
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
    /// The chat template rendered for `messages`, ending with the opening of the assistant's
    /// turn (`add_generation_prompt`); an error when the model has no template.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String>;
    /// The model side's own Prometheus series (complete `# HELP`/`# TYPE` blocks, each line
    /// ending in a newline), appended to `/metrics`; none by default.
    fn metrics(&self) -> String {
        String::new()
    }
}

/// Server settings (the `llm-worker serve` flags other than the model's).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Requests must carry `Authorization: Bearer KEY` (401 otherwise); `None`: no key.
    pub api_key: Option<String>,
    /// Requests waiting for a batch slot at most; the `max_num_seqs + max_queue + 1`-th
    /// request in flight gets 429.
    pub max_queue: usize,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// How long in-flight requests may run on after shutdown begins before they are cancelled.
    pub shutdown_grace: Duration,
    /// The `Retry-After` seconds of a 429.
    pub retry_after_s: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_queue: 256,
            max_body_bytes: 4 << 20,
            shutdown_grace: Duration::from_secs(30),
            retry_after_s: 1,
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
    #[error("loading the model: {0}")]
    Load(String),
    #[error("the model's max_model_len {model} differs from the engine's {engine}")]
    Mismatch { model: usize, engine: usize },
    #[error("the engine thread panicked")]
    EnginePanicked,
}

/// What the loader closure returns: the text side and the engine (built on the engine thread).
pub type Loaded<M, R> = (M, Engine<R>);

/// A loader's error.
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) enum Cmd {
    Add {
        prompt: Vec<u32>,
        params: SamplingParams,
        reply: oneshot::Sender<Result<(SeqId, Receiver<Event>), EngineError>>,
    },
    CancelAll,
}

/// State shared by the handlers, the engine thread and the supervisor.
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) model: OnceLock<Arc<dyn ServedModel>>,
    /// `max_num_seqs + max_queue`, set once loaded.
    pub(crate) max_in_flight: AtomicUsize,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) draining: AtomicBool,
    /// The engine thread has ended (after shutdown, or a panic in the runner).
    pub(crate) engine_down: AtomicBool,
    pub(crate) cmds: Mutex<Option<mpsc::Sender<Cmd>>>,
    pub(crate) metrics: Metrics,
    pub(crate) next_id: AtomicUsize,
}

impl openai_http::ApiState for Shared {
    const ENDPOINTS: &'static [&'static str] = &["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"];

    fn api_key(&self) -> Option<&str> {
        self.config.api_key.as_deref()
    }

    fn availability(&self) -> Availability {
        Availability::of(self.draining.load(Ordering::SeqCst), self.engine_down.load(Ordering::SeqCst), self.model.get().is_some(), "engine")
    }

    fn status_counts(&self) -> &openai_http::prom::StatusCounts {
        &self.metrics.requests
    }
}

impl Shared {

    pub(crate) fn send(&self, cmd: Cmd) -> bool {
        self.cmds.lock().unwrap().as_ref().is_some_and(|tx| tx.send(cmd).is_ok())
    }
}

/// A running server: its address, readiness, shutdown and completion.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    life: Lifecycle<ServerError>,
}

impl Server {
    /// Starts serving on `listener` (inside a tokio runtime) and loading the model on a new
    /// engine thread with `load`. `/health` answers 503 and the API 503 until the load ends.
    pub fn start<M, R, F>(config: ServerConfig, listener: tokio::net::TcpListener, load: F) -> Result<Server, ServerError>
    where
        M: ServedModel,
        R: ModelRunner + 'static,
        F: FnOnce() -> Result<Loaded<M, R>, LoadError> + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            config,
            model: OnceLock::new(),
            max_in_flight: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            engine_down: AtomicBool::new(false),
            cmds: Mutex::new(Some(cmd_tx)),
            metrics: Metrics::default(),
            next_id: AtomicUsize::new(0),
        });
        let (load_tx, load_rx) = watch::channel(LoadState::Loading);
        let engine_shared = shared.clone();
        let engine = std::thread::Builder::new()
            .name("llm-engine".into())
            .spawn(move || engine_thread(load, engine_shared, cmd_rx, load_tx))?;

        let app = api::router(shared.clone());
        let (draining, over, finish) = (shared.clone(), shared.clone(), shared.clone());
        let life = Lifecycle::start(
            listener,
            app,
            load_rx,
            engine,
            shared.config.shutdown_grace,
            move || draining.draining.store(true, Ordering::SeqCst),
            move || {
                tracing::warn!(in_flight = over.in_flight.load(Ordering::SeqCst), "shutdown grace over: cancelling in-flight requests");
                over.send(Cmd::CancelAll);
            },
            // No more commands: the engine thread ends once its work is done.
            move || {
                finish.send(Cmd::CancelAll);
                finish.cmds.lock().unwrap().take();
            },
            (ServerError::Load, || ServerError::EnginePanicked),
        );
        Ok(Server { addr, shared, life })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the model is loaded (Ok) or its loader failed (Err).
    pub async fn ready(&self) -> Result<(), ServerError> {
        self.life.ready().await
    }

    /// Begins a graceful shutdown (idempotent); [`Server::wait`] returns when it is over.
    pub fn shutdown(&mut self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.life.shutdown();
    }

    /// Waits until the server has stopped (after [`Server::shutdown`]).
    pub async fn wait(self) -> Result<(), ServerError> {
        self.life.wait().await
    }
}

/// What `llm-worker serve` calls: binds `addr`, loads the model with `load` on the engine
/// thread, serves until SIGTERM or SIGINT, shuts down gracefully and returns `Ok(())` (exit 0).
/// Builds its own multi-threaded tokio runtime.
pub fn run<M, R, F>(config: ServerConfig, addr: SocketAddr, load: F) -> Result<(), ServerError>
where
    M: ServedModel,
    R: ModelRunner + 'static,
    F: FnOnce() -> Result<Loaded<M, R>, LoadError> + Send + 'static,
{
    openai_http::run_until_signal(addr, |source| ServerError::Bind { addr, source }, |listener| Server::start(config, listener, load))
}

impl openai_http::Supervised for Server {
    type Error = ServerError;
    fn local_addr(&self) -> SocketAddr {
        Server::local_addr(self)
    }
    async fn ready(&self) -> Result<(), ServerError> {
        Server::ready(self).await
    }
    fn shutdown(&mut self) {
        Server::shutdown(self)
    }
    async fn wait(self) -> Result<(), ServerError> {
        Server::wait(self).await
    }
}

pub use openai_http::{no_delay, shutdown_signal};

fn engine_thread<M, R, F>(load: F, shared: Arc<Shared>, cmds: mpsc::Receiver<Cmd>, load_tx: watch::Sender<LoadState>)
where
    M: ServedModel,
    R: ModelRunner + 'static,
    F: FnOnce() -> Result<Loaded<M, R>, LoadError>,
{
    /// Marks the engine down however the thread ends (a runner panic included).
    struct Down(Arc<Shared>);
    impl Drop for Down {
        fn drop(&mut self) {
            self.0.engine_down.store(true, Ordering::SeqCst);
        }
    }
    let _down = Down(shared.clone());
    let t0 = std::time::Instant::now();
    let (model, engine) = match load() {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "loading the model failed");
            let _ = load_tx.send(LoadState::Failed(e.to_string()));
            return;
        }
    };
    let engine_len = engine.config().max_model_len;
    if model.max_model_len() != engine_len {
        let e = ServerError::Mismatch { model: model.max_model_len(), engine: engine_len };
        let _ = load_tx.send(LoadState::Failed(e.to_string()));
        return;
    }
    let model: Arc<dyn ServedModel> = Arc::new(model);
    let dec = model.clone();
    let mut engine = engine.with_decoder(Box::new(move |ids: &[u32]| dec.decode(ids).unwrap_or_default()));
    shared.max_in_flight.store(engine.config().max_num_seqs + shared.config.max_queue, Ordering::SeqCst);
    let _ = shared.model.set(model);
    shared.metrics.publish(&engine.stats());
    tracing::info!(load_s = t0.elapsed().as_secs_f64(), "model loaded");
    let _ = load_tx.send(LoadState::Ready);

    let mut ids: Vec<SeqId> = Vec::new();
    let mut closed = false;
    // The end of the last step while work continued (for the time spent between steps).
    let mut last_step: Option<std::time::Instant> = None;
    loop {
        loop {
            let cmd = if engine.has_work() || closed {
                match cmds.try_recv() {
                    Ok(c) => c,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            } else {
                match cmds.recv_timeout(Duration::from_millis(50)) {
                    Ok(c) => c,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            };
            match cmd {
                Cmd::Add { prompt, params, reply } => {
                    let r = engine.add_request(prompt, params);
                    if let Ok((id, _)) = &r {
                        ids.push(*id);
                    }
                    // A handler gone meanwhile drops the receiver: the next step cancels it.
                    let _ = reply.send(r);
                }
                Cmd::CancelAll => {
                    for id in ids.drain(..) {
                        engine.cancel(id);
                    }
                }
            }
        }
        if engine.has_work() {
            let t = std::time::Instant::now();
            let r = engine.step();
            let end = std::time::Instant::now();
            shared.metrics.engine_step((end - t).as_secs_f64(), last_step.map_or(0.0, |l| (t - l).as_secs_f64()));
            last_step = Some(end);
            if let Err(e) = r {
                tracing::error!(error = %e, "engine step failed; its sequences ended with an error");
            }
        } else {
            ids.clear();
            last_step = None;
        }
        shared.metrics.publish(&engine.stats());
        if closed && !engine.has_work() {
            break;
        }
    }
    tracing::info!("engine thread stopped");
}
