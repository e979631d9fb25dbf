//! The HTTP endpoint: `GET /metrics` (the OpenMetrics text) and `GET /`
//! (the status page, with every node's figures read from their own
//! `/metrics`), on a thread and runtime of its own so that a scraper,
//! however slow or eager, costs the store thread nothing but the short
//! locks of the metrics it reads.
//!
//! Read-only and small: only GET (and HEAD) are answered, request heads
//! are bounded, a connection that sends nothing is closed, and at most
//! [`CONNECTIONS`] are served at once (more are closed at accept).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::future::join_all;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use shoal_core::error::{Result, ShoalError};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::metrics::scrape::scrape;
use crate::metrics::Metrics;
use crate::supervisor::Supervisor;

/// Connections served at once.
const CONNECTIONS: usize = 16;
/// The endpoint thread's nice value (the store thread keeps the daemon's).
const ENDPOINT_NICE: libc::c_int = 10;
/// Longest a client may take to send a request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection is kept (keep-alive included).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);
/// Largest request head read (hyper's smallest buffer).
const HEAD_LIMIT: usize = 8192;

/// How long the status page waits for a peer's figures.
const PEER_TIMEOUT: Duration = Duration::from_millis(500);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `address` and serves it until the daemon stops; returns the
/// address bound. The status page's cluster table scrapes the other nodes
/// `metrics.info` knows at each request.
pub(super) fn start(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    supervisor: &Supervisor,
) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(address)
        .map_err(|e| ShoalError::io(&format!("bind the metrics address {address}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| ShoalError::io("make the metrics listener non-blocking", e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ShoalError::io("read the metrics address", e))?;
    let stop = CancellationToken::new();
    let thread = std::thread::Builder::new()
        .name("shoal-metrics".into())
        .spawn({
            let stop = stop.clone();
            move || serve(listener, metrics, stop)
        })
        .map_err(|e| ShoalError::io("start the metrics thread", e))?;
    let endpoint = Endpoint {
        stop,
        thread: Some(thread),
    };
    tracing::info!(address = %bound, "metrics and status page at http://{bound}/");
    // The task only owns the thread: when the supervisor drops it (the
    // daemon stopping), the thread is stopped and joined.
    supervisor.spawn_local("metrics endpoint", async move {
        let _endpoint = endpoint;
        std::future::pending::<()>().await;
    });
    Ok(bound)
}

/// The serving thread, stopped and joined when dropped.
struct Endpoint {
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            // Prompt: the thread's only await points all watch `stop`.
            let _ = thread.join();
        }
    }
}

fn serve(listener: std::net::TcpListener, metrics: Arc<Metrics>, stop: CancellationToken) {
    // Below the store thread when they compete for a core: a scraper that
    // floods the endpoint slows the endpoint, not the objects.
    // SAFETY: sets this thread's own nice value; no memory is involved.
    let niced = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            ENDPOINT_NICE,
        )
    };
    if niced != 0 {
        tracing::debug!("metrics endpoint: could not lower its priority");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(%err, "metrics endpoint: no runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(err) => {
                tracing::error!(%err, "metrics endpoint: listener");
                return;
            }
        };
        let slots = Arc::new(Semaphore::new(CONNECTIONS));
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.cancelled() => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::debug!(%err, "metrics endpoint: accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!("metrics endpoint: too many connections; one closed");
                continue;
            };
            let metrics = metrics.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |request| {
                    let metrics = metrics.clone();
                    async move { Ok::<_, Infallible>(answer(&metrics, &request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .max_buf_size(HEAD_LIMIT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = tokio::time::timeout(CONNECTION_LIFETIME, connection) => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    // Dropping the runtime ends every connection still open.
}

/// The answer to one request; never touches anything but `metrics` (and
/// the peers' endpoints, read).
async fn answer(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "read-only: only GET is answered\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/metrics" => reply(StatusCode::OK, OPENMETRICS, metrics.encode()),
        "/top" => reply(
            StatusCode::OK,
            "application/json",
            metrics
                .top
                .read((crate::metrics::unix_now() * 1000.0) as u64),
        ),
        "/" => {
            let peers = metrics.info.peers();
            let figures = join_all(peers.iter().map(|&(node, address)| async move {
                let samples = match address {
                    Some(address) => scrape(address, PEER_TIMEOUT).await,
                    None => None,
                };
                (node, address, samples)
            }))
            .await;
            reply(
                StatusCode::OK,
                "text/html; charset=utf-8",
                super::page::render(metrics, &figures),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: /metrics, /top or /\n".into(),
        ),
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The page runs no script and loads nothing: nothing on it can act.
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; frame-ancestors 'none'"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    response
}
