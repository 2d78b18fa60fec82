//! The `/metrics` endpoint: HTTP/1 through hyper, `GET /metrics` only,
//! within bounds (a few connections at once, each with a deadline for its
//! request headers and a lifetime), so a client cannot hold the daemon.
//! When every slot is taken, a new connection takes the slot of the oldest
//! one that has sent no request yet (a slow client's): four slow
//! connections held every slot and no scraper was served.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Metrics;
use crate::shutdown::Shutdown;

/// Connections served at once (Prometheus needs one).
const MAX_CONNECTIONS: usize = 8;
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may stay open (a keep-alive scraper reconnects).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);
/// Largest request buffered (hyper's minimum): a scrape is a few hundred bytes.
const MAX_REQUEST_BUFFER: usize = 8192;
/// The endpoint's path.
pub const PATH: &str = "/metrics";

/// Why the endpoint cannot be served.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot serve metrics on {addr}: {source}; pick another --metrics address or stop what uses it"
)]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// What the system said.
    pub source: std::io::Error,
}

/// Binds the endpoint's address (first, so a taken port fails the start).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// One open connection, as the accept loop sees it.
struct Open {
    /// Numbers connections, to find this one again.
    id: u64,
    /// Whether it has sent a request: a connection that has not is the one
    /// that gives up its slot to a new one.
    served: Arc<AtomicBool>,
    /// Ends it.
    end: Arc<tokio::sync::Notify>,
}

/// Serves `/metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, mut shutdown: Shutdown) {
    let open: Arc<Mutex<Vec<Open>>> = Arc::default();
    let mut next_id = 0u64;
    let mut refused = crate::util::throttle::LogBudget::new(1);
    loop {
        let Some(stream) = shutdown.accept(&listener, "metrics").await else {
            return;
        };
        let (served, end) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(tokio::sync::Notify::new()),
        );
        {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= MAX_CONNECTIONS {
                // The oldest that has asked nothing yet makes room.
                match open.iter().position(|o| !o.served.load(Ordering::Relaxed)) {
                    Some(slow) => open.remove(slow).end.notify_one(),
                    None => {
                        if let Some(dropped) = refused.take() {
                            tracing::warn!(
                                dropped,
                                "metrics: refused a connection: {MAX_CONNECTIONS} are open already"
                            );
                        }
                        continue;
                    }
                }
            }
            next_id += 1;
            open.push(Open {
                id: next_id,
                served: served.clone(),
                end: end.clone(),
            });
        }
        let id = next_id;
        let _ = stream.set_nodelay(true);
        let metrics = metrics.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let asked = served.clone();
            let service = hyper::service::service_fn(move |request| {
                asked.store(true, Ordering::Relaxed);
                let answer = respond(&metrics, &request);
                async move { Ok::<_, Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BUFFER)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_LIFETIME, connection) => {}
                _ = end.notified() => {}
            }
            open.lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|o| o.id != id);
        });
    }
}

/// The answer to one request.
fn respond(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if request.uri().path() != PATH {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("not found: the metrics are at {PATH}\n"),
        )
    } else if request.method() != Method::GET {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            format!("{PATH} answers GET only\n"),
        )
    } else {
        (
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            metrics.encode(),
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}
