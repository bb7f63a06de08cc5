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

/// How the load ended, as [`Lifecycle::ready`] sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadOutcome {
    Ready,
    Failed(String),
    /// The thread ended without saying (it panicked).
    Gone,
}

/// The parts of a running server its handle keeps: the load state, the stop trigger and
/// the supervisor task that returns when the server has stopped.
pub struct Lifecycle<E> {
    load: watch::Receiver<LoadState>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), E>>,
}

impl<E> Lifecycle<E> {
    /// A handle over `load` (the model thread's load state), `stop` (which begins the
    /// shutdown, see [`serve_until_stopped`]) and `done` (the supervisor).
    pub fn new(load: watch::Receiver<LoadState>, stop: oneshot::Sender<()>, done: tokio::task::JoinHandle<Result<(), E>>) -> Self {
        Lifecycle { load, stop: Some(stop), done }
    }

    /// Waits until the load has ended.
    pub async fn ready(&self) -> LoadOutcome {
        let mut rx = self.load.clone();
        match rx.wait_for(|s| *s != LoadState::Loading).await.map(|s| s.clone()) {
            Ok(LoadState::Ready) => LoadOutcome::Ready,
            Ok(LoadState::Failed(e)) => LoadOutcome::Failed(e),
            _ => LoadOutcome::Gone,
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

    /// Waits until the supervisor has returned; `None` if it panicked.
    pub async fn wait(self) -> Option<Result<(), E>> {
        let _keep = self.stop; // dropping the sender would also begin the shutdown
        self.done.await.ok()
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
