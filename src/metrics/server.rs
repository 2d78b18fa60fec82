//! The `/metrics` endpoint: HTTP/1 through hyper, `GET /metrics` only,
//! within bounds (a few connections at once, each with a deadline for its
//! request headers and a lifetime), so a client cannot hold the daemon.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Metrics;
use crate::shutdown::Shutdown;

/// Connections served at once; more are closed at once (Prometheus needs one).
const MAX_CONNECTIONS: usize = 4;
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

/// Serves `/metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, mut shutdown: Shutdown) {
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused = crate::throttle::LogBudget::new(1);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.recv() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = open.clone().try_acquire_owned() else {
            if let Some(dropped) = refused.take() {
                tracing::warn!(
                    dropped,
                    "metrics: refused a connection: {MAX_CONNECTIONS} are open already"
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = respond(&metrics, &request);
                async move { Ok::<_, Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BUFFER)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(slot);
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
