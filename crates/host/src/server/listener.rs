//! Serving one listener with the HTTP limits of `[server]` (see "Security and limits" in
//! `docs/operations.md`), with hyper's and tokio's own settings rather than timers of our own:
//!
//! - at most `max_connections` connections at once: a semaphore permit is taken before each
//!   `accept`, so the rest wait in the kernel's queue and cost the process nothing;
//! - hyper's `header_read_timeout` (`header_read_timeout_secs`), which also closes a kept-alive
//!   connection that sends no next request in that time;
//! - `write_timeout_secs` (tokio-io-timeout's write timeout on the socket): a write that waits
//!   that long, its client reading nothing, fails, and hyper closes the connection; its
//!   response is dropped, which cancels the request and frees its admission. Without it a
//!   client that stopped reading held its connection, its answer's memory and its model's
//!   `max_in_flight` place for as long as it kept the socket open;
//! - [`read_body_within`]: the whole body within `body_read_timeout_secs` (HTTP 408), no more
//!   than `max_body_bytes` (HTTP 413, at once when `Content-Length` says so), and within the
//!   budget of all bodies held at once, `max_buffered_body_bytes` (HTTP 503), before the router
//!   sees the request; the router's extractors get `max_body_bytes` as their limit;
//! - on the admin listener, the peer address as [`axum::extract::ConnectInfo`], for the admin
//!   guard;
//! - `TCP_NODELAY` on every connection ([`configure_accepted`]), so streamed tokens leave at once;
//! - on stop, no new connections, and the open ones finish by the stop's deadline
//!   (hyper-util's `GracefulShutdown`), after which they are dropped.
//!
//! The body limits and the peer address are applied in the connection's service function, not
//! as router layers: a layer on the router wraps every route, and is boxed and cloned per
//! request.
//!
//! The server speaks HTTP/1.1 only, as before (axum's `http2` feature was never enabled).

use super::error::ApiError;
use crate::config::ServerConfig;
use axum::{
    body::{Body, Bytes},
    extract::{ConnectInfo, DefaultBodyLimit},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{sync::Arc, task::Poll, time::Duration};
use tokio::{
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tower::{Layer, ServiceExt};

/// The limits one listener enforces, from `[server]` (read once at start).
#[derive(Clone, Debug)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub write_timeout: Duration,
    pub max_body_bytes: usize,
    pub max_connections: usize,
    pub max_buffered_body_bytes: usize,
    /// `max_buffered_body_bytes`, a permit per byte, shared by the listeners made from clones
    /// of these limits (see [`read_body_within`]).
    body_budget: Arc<Semaphore>,
    retry_after_secs: u32,
}

impl HttpLimits {
    pub fn of(server: &ServerConfig) -> Self {
        Self {
            header_read_timeout: Duration::from_secs_f64(server.header_read_timeout_secs),
            body_read_timeout: Duration::from_secs_f64(server.body_read_timeout_secs),
            write_timeout: Duration::from_secs_f64(server.write_timeout_secs),
            max_body_bytes: server.max_body_bytes,
            max_connections: server.max_connections,
            max_buffered_body_bytes: server.buffered_body_budget(),
            body_budget: Arc::new(Semaphore::new(server.buffered_body_budget())),
            retry_after_secs: server.retry_after_secs,
        }
    }
}

/// Bodies up to this size are not charged to `max_buffered_body_bytes`: most requests are this
/// small, a shared counter per request costs every one of them, and `max_connections` bodies of
/// this size are a few megabytes.
const UNCHARGED_BODY_BYTES: usize = 4 * 1024;

/// Whether a listener's requests carry their peer's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// As a [`ConnectInfo`] extension (the admin listener, whose guard trusts loopback peers).
    Extension,
    /// Not at all (the main listener: nothing there reads it).
    Unused,
}

/// Tells listeners to stop: `Some(deadline)` by which their open connections must finish.
pub type Stop = tokio::sync::watch::Receiver<Option<tokio::time::Instant>>;

/// Serves `app` on `listener` until `stop` names a deadline; then stops accepting and gives the
/// open connections until that deadline to finish their responses.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    peer_info: Peer,
    mut stop: Stop,
) -> std::io::Result<()> {
    // The body is whole and within the limit before the router sees it; its extractors get
    // the same limit (their default is 2 MB).
    let app = DefaultBodyLimit::max(limits.max_body_bytes).layer(app);
    let limits = Arc::new(limits);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stopped(&mut stop) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        configure_accepted(&stream, peer);
        let write_timeout = limits.write_timeout;
        let (app, limits) = (app.clone(), limits.clone());
        let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
            let (app, limits) = (app.clone(), limits.clone());
            async move {
                let (mut parts, body) = request.into_parts();
                if peer_info == Peer::Extension {
                    parts.extensions.insert(ConnectInfo(peer));
                }
                match read_body_within(&limits, &parts.headers, body).await {
                    Ok((bytes, charge)) => {
                        if let Some(charge) = charge {
                            parts.extensions.insert(charge);
                        }
                        let request = axum::extract::Request::from_parts(parts, Body::from(bytes));
                        app.oneshot(request).await
                    }
                    Err(refused) => Ok(refused),
                }
            }
        });
        // The timer runs only while a write waits (the socket's buffer full): a client that
        // reads, however slowly, is never cut.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(write_timeout));
        let io = TokioIo::new(Box::pin(stream));
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let deadline = stop.borrow().unwrap_or_else(tokio::time::Instant::now);
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with connections open; dropping them");
    }
    Ok(())
}

/// The socket options of an accepted connection: `TCP_NODELAY`. A streamed answer is many small
/// writes, and with Nagle's algorithm each one that follows a still-unacknowledged one waits for
/// the client's delayed ACK (40 ms on Linux), so tokens arrive in bursts. Measured before: of six
/// echo streams of 200 tokens 5 ms apart over loopback, four stalled once for 41–43 ms, with the
/// tokens behind the stall delivered together (`docs/operations.md`).
fn configure_accepted(stream: &tokio::net::TcpStream, peer: std::net::SocketAddr) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
}

async fn stopped(stop: &mut Stop) {
    let _ = stop.wait_for(Option::is_some).await;
}

/// Reads a request's whole body within the body-read timeout, the size limit and the budget
/// of all bodies held at once, so that no handler waits on a trickling client and no number of
/// clients holds more than `max_buffered_body_bytes` of bodies; or the error response.
async fn read_body_within(
    limits: &HttpLimits,
    headers: &HeaderMap,
    body: hyper::body::Incoming,
) -> Result<(Bytes, Option<BodyCharge>), Response> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(refusal(limits, Unread::TooLarge));
    }
    // A small body has usually arrived with its headers: one poll reads it, and the timer (a
    // registration in tokio's wheel and its removal, most of this step's cost) is armed only
    // for a body still on its way.
    let mut collect = std::pin::pin!(collect_charged(limits, body));
    let read = match futures_util::poll!(collect.as_mut()) {
        Poll::Ready(read) => read,
        Poll::Pending => tokio::time::timeout(limits.body_read_timeout, collect)
            .await
            .unwrap_or(Err(Unread::TimedOut)),
    };
    read.map_err(|unread| refusal(limits, unread))
}

/// Why a body was not read whole.
enum Unread {
    TooLarge,
    TimedOut,
    OverBudget,
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

/// A body's share of `max_buffered_body_bytes`, released when the last clone is gone. The
/// body's bytes hold one, and the request's extensions another, for a handler whose extractor
/// copies the body out of its bytes and drops them (multipart: the transcription handler holds
/// it until the clip is admitted).
#[derive(Clone)]
pub struct BodyCharge {
    _permit: Arc<OwnedSemaphorePermit>,
}

/// The body's frames, joined; past [`UNCHARGED_BODY_BYTES`] each frame is charged to the body
/// budget as it arrives, and the bytes returned hold their charge until the last reference to
/// them is gone (through the parse, and a wait for a parse turn).
async fn collect_charged<B>(
    limits: &HttpLimits,
    mut body: B,
) -> Result<(Bytes, Option<BodyCharge>), Unread>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut frames: Vec<Bytes> = Vec::new();
    let (mut len, mut charged) = (0, 0);
    let mut charge: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| Unread::Failed(e.into()))?.into_data() else {
            continue; // trailers
        };
        len += data.len();
        if len > limits.max_body_bytes {
            return Err(Unread::TooLarge);
        }
        if len > UNCHARGED_BODY_BYTES {
            let owed = u32::try_from(len - charged).map_err(|_| Unread::OverBudget)?;
            let permit = limits
                .body_budget
                .clone()
                .try_acquire_many_owned(owed)
                .map_err(|_| Unread::OverBudget)?;
            match &mut charge {
                Some(charge) => charge.merge(permit),
                None => charge = Some(permit),
            }
            charged = len;
        }
        frames.push(data);
    }
    let bytes = match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap(),
        _ => {
            let mut joined = Vec::with_capacity(len);
            frames.iter().for_each(|f| joined.extend_from_slice(f));
            Bytes::from(joined)
        }
    };
    Ok(match charge {
        Some(charge) => {
            let charge = BodyCharge {
                _permit: Arc::new(charge),
            };
            let bytes = Bytes::from_owner(Charged {
                bytes,
                _charge: charge.clone(),
            });
            (bytes, Some(charge))
        }
        None => (bytes, None),
    })
}

/// A body and its share of the budget, released with the bytes.
struct Charged {
    bytes: Bytes,
    _charge: BodyCharge,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

fn refusal(limits: &HttpLimits, unread: Unread) -> Response {
    let error = match unread {
        Unread::TooLarge => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "invalid_body",
            format!(
                "the request body exceeds max_body_bytes = {}",
                limits.max_body_bytes
            ),
        ),
        Unread::TimedOut => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "body_timeout",
            format!(
                "the request body did not arrive within body_read_timeout_secs = {}",
                limits.body_read_timeout.as_secs_f64()
            ),
        ),
        Unread::OverBudget => ApiError {
            retry_after: Some(limits.retry_after_secs),
            ..ApiError::unavailable(format!(
                "the request bodies being read and parsed have reached \
                 max_buffered_body_bytes = {}; retry later",
                limits.max_buffered_body_bytes
            ))
        },
        Unread::Failed(e) => ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_body",
            format!("reading the request body failed: {e}"),
        ),
    };
    close(error)
}

/// An error after which the connection is not reused (its body may be half read).
fn close(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::{collect_charged, configure_accepted, HttpLimits, Unread};
    use crate::config::ServerConfig;
    use axum::body::Bytes;
    use http_body_util::Full;

    #[test]
    fn a_large_body_holds_its_charge_while_its_bytes_or_its_charge_live() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let limits = HttpLimits::of(&ServerConfig {
            max_body_bytes: 64 * 1024,
            max_buffered_body_bytes: Some(100 * 1024),
            ..ServerConfig::default()
        });
        let budget = || limits.body_budget.available_permits();
        let collect = |n: usize| {
            runtime.block_on(collect_charged(
                &limits,
                Full::new(Bytes::from(vec![b'x'; n])),
            ))
        };
        // A small body is not charged.
        let Ok((small, None)) = collect(1000) else {
            panic!("a small body is read, uncharged")
        };
        assert_eq!((small.len(), budget()), (1000, 100 * 1024));
        // A large one is, until both its bytes and the charge a handler may keep are gone:
        // a multipart reader copies the bytes out and drops them long before its form is read.
        let Ok((bytes, Some(charge))) = collect(60 * 1024) else {
            panic!("a large body is read and charged")
        };
        assert_eq!(budget(), 40 * 1024);
        // Past the budget: refused, and nothing more is held.
        assert!(matches!(collect(60 * 1024), Err(Unread::OverBudget)));
        assert_eq!(budget(), 40 * 1024);
        drop(bytes);
        assert_eq!(budget(), 40 * 1024, "the handler's charge still holds it");
        drop(charge);
        assert_eq!(budget(), 100 * 1024);
    }

    #[test]
    fn accepted_connections_send_small_writes_at_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
            let (client, accepted) = tokio::join!(client, listener.accept());
            let (stream, peer) = accepted.unwrap();
            assert!(!stream.nodelay().unwrap(), "Nagle is on by default");
            configure_accepted(&stream, peer);
            assert!(stream.nodelay().unwrap());
            drop(client);
        });
    }
}
