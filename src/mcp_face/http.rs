//! The MCP face over streamable HTTP (docs/agents.md): `POST /mcp` with
//! one JSON-RPC message; a request is answered with its response as JSON,
//! or, when the client accepts `text/event-stream`, as a stream of events
//! (its progress, then its response; a `subscriptions/listen` stream stays
//! open). Sessions are not kept (`Mcp-Session-Id` is never set), so `GET`
//! and `DELETE` are answered 405, as the specification allows.
//!
//! Who may connect: a browser page's request (one with an `Origin` header)
//! only from a loopback origin, so a web page cannot reach the tools;
//! with a token, every request must carry it (`Authorization: Bearer`);
//! served off loopback, a token is required. Bounded: connections at once,
//! the time to send headers, the size of a message.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use super::conversation::{Conversation, PARSE_ERROR};
use super::stdio::MAX_LINE_BYTES;
use crate::shutdown::Shutdown;

/// The endpoint's path.
pub const PATH: &str = "/mcp";
/// Connections served at once; one more is closed at once.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A response body: whole, or a stream of events.
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Why the endpoint cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot serve MCP on {addr}: {source}; pick another --http address or stop what uses it"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "serving MCP on {addr}, off loopback, needs a bearer token: set TOOLBOXD_MCP_TOKEN to a \
         secret every client sends as `Authorization: Bearer <token>` (or serve on 127.0.0.1)"
    )]
    NoToken { addr: SocketAddr },
}

/// Who may use the endpoint.
#[derive(Clone)]
struct Door {
    /// The bearer token every request must carry, if any.
    token: Option<Arc<str>>,
}

/// Binds `addr`, refusing to serve off loopback without `token`.
pub async fn bind(addr: SocketAddr, token: Option<&str>) -> Result<TcpListener, HttpError> {
    if !addr.ip().is_loopback() && token.is_none_or(|t| t.trim().is_empty()) {
        return Err(HttpError::NoToken { addr });
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serves `conversation` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    conversation: Arc<Conversation>,
    token: Option<String>,
    mut shutdown: Shutdown,
) {
    let door = Door {
        token: token.map(Arc::from),
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Some(stream) = shutdown.accept(&listener, "mcp http").await else {
            return;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!("mcp http: refused a connection: {MAX_CONNECTIONS} are open already");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (conversation, door) = (conversation.clone(), door.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (conversation, door) = (conversation.clone(), door.clone());
                async move { Ok::<_, Infallible>(respond(&conversation, &door, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(slot);
        });
    }
}

/// A response with a short text, or a JSON body.
fn plain(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    plain(status, "text/plain; charset=utf-8", format!("{body}\n"))
}

/// Whether `given` is `secret`, compared in time that does not depend on
/// where they differ.
fn same_secret(given: &str, secret: &str) -> bool {
    let (given, secret) = (given.as_bytes(), secret.as_bytes());
    let differ = given
        .iter()
        .zip(secret)
        .fold(given.len() ^ secret.len(), |acc, (a, b)| {
            acc | usize::from(a ^ b)
        });
    differ == 0
}

/// Whether `origin` (an `Origin` header) names a page of this machine.
fn loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => rest.split(':').next().unwrap_or(""),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The answer to one HTTP request.
async fn respond(
    conversation: &Arc<Conversation>,
    door: &Door,
    request: Request<Incoming>,
) -> Response<Body> {
    if request.uri().path() != PATH {
        return text(
            StatusCode::NOT_FOUND,
            &format!("not found: MCP is served at {PATH}"),
        );
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        if !origin.to_str().is_ok_and(loopback_origin) {
            return text(
                StatusCode::FORBIDDEN,
                "a request from a web page of another origin is refused (DNS rebinding)",
            );
        }
    }
    if let Some(token) = &door.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, given)| given.trim());
        if !given.is_some_and(|given| same_secret(given, token)) {
            let mut refused = text(
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (Authorization: Bearer <TOOLBOXD_MCP_TOKEN>)",
            );
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return refused;
        }
    }
    if request.method() != Method::POST {
        let mut refused = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "toolboxd keeps no MCP session: POST each message",
        );
        refused
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return refused;
    }
    let streams = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // A body that never comes must not hold the connection's slot.
    let body = Limited::new(request.into_body(), MAX_LINE_BYTES).collect();
    let body = match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a message is at most {MAX_LINE_BYTES} bytes"),
            )
        }
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the message did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        }
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(e) => {
            let error = serde_json::json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": PARSE_ERROR, "message": format!("the body is not JSON: {e}")}});
            return plain(
                StatusCode::BAD_REQUEST,
                "application/json",
                error.to_string(),
            );
        }
    };
    let id = message
        .get("id")
        .filter(|_| message.get("method").is_some())
        .cloned();
    let (out, mut outgoing) = mpsc::unbounded_channel::<Value>();
    conversation.handle(message, &out);
    drop(out);
    let Some(id) = id else {
        // A notification (or a response): nothing to answer with but this,
        // unless the message was malformed.
        return match outgoing.try_recv() {
            Ok(error) => plain(
                StatusCode::BAD_REQUEST,
                "application/json",
                error.to_string(),
            ),
            Err(_) => plain(StatusCode::ACCEPTED, "text/plain", String::new()),
        };
    };
    let answers =
        move |message: &Value| message.get("id") == Some(&id) && message.get("method").is_none();
    if streams {
        // Events until the response (a listen stream: until the client goes).
        let events = futures_util::stream::unfold(Some(outgoing), move |state| {
            let answers = answers.clone();
            async move {
                let mut outgoing = state?;
                let message = outgoing.recv().await?;
                let last = answers(&message);
                let event = format!("event: message\ndata: {message}\n\n");
                let next = (!last).then_some(outgoing);
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(event))), next))
            }
        });
        let mut response = Response::new(StreamBody::new(events.boxed()).boxed_unsync());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        return response;
    }
    while let Some(message) = outgoing.recv().await {
        if answers(&message) {
            return plain(StatusCode::OK, "application/json", message.to_string());
        }
    }
    // Cancelled: no response, as MCP says.
    plain(StatusCode::ACCEPTED, "text/plain", String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_the_same_only_when_every_byte_is() {
        assert!(same_secret("s3cret", "s3cret"));
        assert!(!same_secret("s3cre", "s3cret"));
        assert!(!same_secret("s3cret!", "s3cret"));
        assert!(!same_secret("S3cret", "s3cret"));
        assert!(!same_secret("", "s3cret"));
    }

    #[test]
    fn only_pages_of_this_machine_are_loopback_origins() {
        for origin in [
            "http://localhost:6274",
            "http://127.0.0.1",
            "https://[::1]:8080",
        ] {
            assert!(loopback_origin(origin), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "null",
            "http://192.168.1.2:80",
        ] {
            assert!(!loopback_origin(origin), "{origin}");
        }
    }
}
