//! Serving one client connection's HTTP (every listener and the admin API):
//! HTTP/1.1 with upgrades, or HTTP/2 by its preface, bounded in head size
//! and closed when idle or at shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_util::sync::CancellationToken;

/// Largest request head a client may send (HTTP/1.1 read buffer, HTTP/2
/// header list): more gets `431` from the proxy itself, instead of a twin
/// that refuses it being reported as unreachable.
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// Requests in flight on one connection, and when the last one ended: a
/// connection that carries none for the idle time is closed. HTTP/1.1 has
/// its head timeout for that, but neither HTTP/2 (a client that answers
/// pings stays) nor the moment before the protocol is known (after a TLS
/// handshake, nothing sent) has one.
pub(crate) struct Activity {
    start: Instant,
    in_flight: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `start` to the end of the last request.
    last_end_ms: std::sync::atomic::AtomicU64,
}

impl Activity {
    /// When the connection becomes idle for `idle`, or `None` while a
    /// request is in flight.
    fn idle_at(&self, idle: Duration) -> Option<Instant> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.in_flight.load(SeqCst) > 0 {
            return None;
        }
        Some(self.start + Duration::from_millis(self.last_end_ms.load(SeqCst)) + idle)
    }
}

/// Counts a request in flight until dropped.
pub(crate) struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: &Arc<Activity>) -> Busy {
        a.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.store(ms, SeqCst);
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// Serves one connection as HTTP/1.1 (upgrades allowed) or HTTP/2 (by its
/// preface) until it ends, or until it carries no request for
/// `head_timeout` (closed gracefully: a response still streaming finishes);
/// once `cancel` fires, in-flight requests finish and the connection closes.
pub(crate) async fn serve_auto<IO, S, B>(
    io: IO,
    service: S,
    cancel: &CancellationToken,
    head_timeout: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_REQUEST_HEAD);
    // A peer that stops answering pings is closed; one that answers them but
    // sends no request is closed by the idle check below.
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(head_timeout)
        .keep_alive_timeout(head_timeout)
        .max_header_list_size(u32::try_from(MAX_REQUEST_HEAD).unwrap_or(u32::MAX));
    let activity = Arc::new(Activity {
        start: Instant::now(),
        in_flight: 0.into(),
        last_end_ms: 0.into(),
    });
    let counted = activity.clone();
    let service = service_fn(move |req| {
        let busy = Busy::new(&counted);
        let answer = hyper::service::Service::call(&service, req);
        async move {
            let _busy = busy;
            answer.await
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    loop {
        let idle_at = activity.idle_at(head_timeout);
        tokio::select! {
            r = conn.as_mut() => return r,
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(idle_at.unwrap_or_else(|| Instant::now() + head_timeout).into()) => {
                if activity.idle_at(head_timeout).is_some_and(|at| at <= Instant::now()) {
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// Serves one HTTP/1.1 connection (upgrades allowed) until it ends, or
/// until a request head (or the next one, on an idle keep-alive
/// connection) takes longer than `head_timeout`; once `cancel` fires,
/// in-flight requests finish and the connection closes.
pub async fn serve_http1<IO, S, B>(
    stream: IO,
    service: S,
    cancel: &CancellationToken,
    head_timeout: Duration,
) -> Result<(), hyper::Error>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: 'static,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_REQUEST_HEAD)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    use http::StatusCode;

    const IDLE: Duration = Duration::from_secs(5);

    fn serve(io: tokio::io::DuplexStream) -> tokio::task::JoinHandle<()> {
        let service = service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"ok"),
            )))
        });
        tokio::spawn(async move {
            let _ = serve_auto(io, service, &CancellationToken::new(), IDLE).await;
        })
    }

    /// Time is paused: the runtime jumps to the next timer whenever every
    /// task waits, so these run at once however long the idle time is.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
        let (_client, server) = tokio::io::duplex(1 << 16);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(IDLE * 10, serve(server))
            .await
            .expect("the connection was held past the idle time")
            .unwrap();
        assert!(started.elapsed() >= IDLE, "closed before the idle time");
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_that_answers_pings_but_sends_nothing_is_closed() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let server = serve(server);
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                .await
                .unwrap();
        // The client side answers the server's pings for as long as it runs.
        let client_conn = tokio::spawn(conn);
        let resp = send
            .send_request(
                Request::get("http://twin/")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        drop(resp);
        tokio::time::timeout(IDLE * 10, server)
            .await
            .expect("an idle HTTP/2 connection was held")
            .unwrap();
        let _ = client_conn.await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_request_head_gets_431() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let _server = serve(server);
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = send
            .send_request(
                Request::get("http://twin/")
                    .header("x-big", "a".repeat(MAX_REQUEST_HEAD + 1))
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
}
