//! A server's life around its model thread: loading (the API answers 503 until it ends),
//! serving, and the graceful shutdown both servers share: stop admitting, let in-flight
//! requests run for a grace period, cancel what is left, close the connections.

use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// Where the model (or pipeline) a server loads on its own thread stands.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadState {
    Loading,
    Ready,
    /// The loader's error message.
    Failed(String),
}

/// A server's errors for a model thread whose load failed (with the loader's message) and
/// for one that ended without saying (a panic).
pub type ThreadErrors<E> = (fn(String) -> E, fn() -> E);

/// A running server's life: the load state of its model thread, the stop trigger, and the
/// supervisor task that returns when the server has stopped.
pub struct Lifecycle<E> {
    load: watch::Receiver<LoadState>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), E>>,
    /// The server's error for a failed load (with the loader's message).
    failed: fn(String) -> E,
    /// The server's error for a model thread (or supervisor) that ended without saying.
    gone: fn() -> E,
}

impl<E: From<std::io::Error> + Send + 'static> Lifecycle<E> {
    /// Serves `app` on `listener` (inside a tokio runtime) while `thread` loads the model
    /// (its state in `load`) and then runs the requests. [`Lifecycle::shutdown`] stops it
    /// as [`serve_until_stopped`] does (`drain`, `grace`, then `grace_over`), after which
    /// `finish` runs (cancel what is left, close the thread's queue so that it ends) and
    /// the thread is joined. `failed` and `gone` make the server's errors for a failed load
    /// and for a thread that ended without saying (a panic).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        listener: tokio::net::TcpListener,
        app: axum::Router,
        load: watch::Receiver<LoadState>,
        thread: std::thread::JoinHandle<()>,
        grace: Duration,
        drain: impl FnOnce() + Send + 'static,
        grace_over: impl FnOnce() + Send + 'static,
        finish: impl FnOnce() + Send + 'static,
        (failed, gone): ThreadErrors<E>,
    ) -> Self {
        let (stop, stop_rx) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let io = serve_until_stopped(listener, app, stop_rx, drain, grace, grace_over).await;
            finish();
            match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Ok(())) => Ok(io?),
                _ => Err(gone()),
            }
        });
        Lifecycle { load, stop: Some(stop), done, failed, gone }
    }

    /// Waits until the load has ended: `Ok` when the model is loaded.
    pub async fn ready(&self) -> Result<(), E> {
        let mut rx = self.load.clone();
        match rx.wait_for(|s| *s != LoadState::Loading).await.map(|s| s.clone()) {
            Ok(LoadState::Ready) => Ok(()),
            Ok(LoadState::Failed(e)) => Err((self.failed)(e)),
            _ => Err((self.gone)()),
        }
    }

    /// Begins the shutdown; `false` if it had begun already.
    pub fn shutdown(&mut self) -> bool {
        match self.stop.take() {
            Some(tx) => {
                let _ = tx.send(());
                true
            }
            None => false,
        }
    }

    /// Waits until the supervisor has returned (the server has stopped).
    pub async fn wait(self) -> Result<(), E> {
        let _keep = self.stop; // dropping the sender would also begin the shutdown
        self.done.await.unwrap_or_else(|_| Err((self.gone)()))
    }
}

/// Serves `app` on `listener` until `stop` fires (or its sender is dropped), then shuts
/// down gracefully: `drain` runs (new requests get 503 from then on), in-flight requests
/// get `grace` to finish, then `cancel` runs and the connections get 5 more seconds before
/// they are closed. Returns axum's result (`Ok` where connections were closed by force).
pub async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: oneshot::Receiver<()>,
    drain: impl FnOnce() + Send + 'static,
    grace: Duration,
    cancel: impl FnOnce(),
) -> std::io::Result<()> {
    let (begun_tx, begun_rx) = oneshot::channel::<()>();
    let graceful = async move {
        let _ = stop.await;
        drain();
        tracing::info!("shutting down: no new requests");
        let _ = begun_tx.send(());
    };
    let mut serve = tokio::spawn(async move { axum::serve(crate::no_delay(listener), app).with_graceful_shutdown(graceful).await });
    let mut served = None;
    tokio::select! {
        r = &mut serve => served = Some(r),
        _ = begun_rx => {}
    }
    if served.is_none() {
        served = tokio::time::timeout(grace, &mut serve).await.ok();
    }
    if served.is_none() {
        cancel();
        served = tokio::time::timeout(Duration::from_secs(5), &mut serve).await.ok();
    }
    if served.is_none() {
        tracing::warn!("connections still open after cancelling: closing them");
        serve.abort();
    }
    match served {
        Some(Ok(r)) => r,
        _ => Ok(()),
    }
}

/// A server [`run_until_signal`] drives: started on a listener, ready once its model has
/// loaded, then shut down gracefully and awaited.
pub trait Supervised: Sized {
    /// The server's error.
    type Error;
    /// The address it serves on.
    fn local_addr(&self) -> std::net::SocketAddr;
    /// Waits until the model is loaded (Ok) or its loader failed (Err).
    fn ready(&self) -> impl std::future::Future<Output = Result<(), Self::Error>>;
    /// Begins the graceful shutdown (idempotent).
    fn shutdown(&mut self);
    /// Waits until the server has stopped.
    fn wait(self) -> impl std::future::Future<Output = Result<(), Self::Error>>;
}

/// What a server binary's `serve` command calls: builds a multi-threaded tokio runtime,
/// installs the SIGTERM/SIGINT handlers, binds `addr` (`bind_error` names a failure),
/// starts the server with `start`, serves once the model has loaded until a signal, then
/// shuts down gracefully. `Ok(())` (exit 0) after a signal; a failed load is the server's
/// error (after the same shutdown).
pub fn run_until_signal<S: Supervised>(
    addr: std::net::SocketAddr,
    bind_error: impl FnOnce(std::io::Error) -> S::Error,
    start: impl FnOnce(tokio::net::TcpListener) -> Result<S, S::Error>,
) -> Result<(), S::Error>
where
    S::Error: From<std::io::Error>,
{
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        // Handlers first, so that a signal arriving at any later point is seen.
        let signal = crate::shutdown_signal()?;
        tokio::pin!(signal);
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind_error)?;
        let mut server = start(listener)?;
        tracing::info!(addr = %server.local_addr(), "listening; loading the model");
        let loaded = tokio::select! {
            r = server.ready() => Some(r),
            _ = &mut signal => None,
        };
        match loaded {
            Some(Ok(())) => {
                tracing::info!(addr = %server.local_addr(), "model loaded: ready");
                signal.await;
                tracing::info!("signal received");
            }
            Some(Err(e)) => {
                server.shutdown();
                let _ = server.wait().await;
                return Err(e);
            }
            None => {}
        }
        server.shutdown();
        server.wait().await
    })
}
