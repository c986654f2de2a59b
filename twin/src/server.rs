//! Serving: accept loop, optional TLS, HTTP/1.1 + HTTP/2 per connection, graceful stop.
//!
//! Plaintext connections are auto-detected (HTTP/1.1, or h2c with prior knowledge) by
//! hyper-util's `auto` builder; with TLS the handshake offers ALPN `h2` and `http/1.1`
//! (when the given config names no protocols) and the same builder serves what was
//! negotiated. On shutdown the listener is dropped, every connection is told to finish
//! its in-flight requests and close, and stragglers are aborted after a grace period.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use veris_accept::{accept_until, OnError};

use crate::{Twin, TwinError};

/// How long in-flight requests get to finish after shutdown.
const GRACE: Duration = Duration::from_secs(5);
/// How long a client gets to complete a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves until `shutdown` resolves, then stops accepting and lets in-flight requests
/// finish (up to 5 s). HTTP/1.1 and h2c (prior knowledge) are auto-detected on
/// plaintext; with `tls`, ALPN offers h2 and http/1.1.
///
/// Connections are accepted by the one accept loop ([`veris_accept::accept_until`]):
/// transient accept errors (a connection reset before accept, too many open files) are
/// logged and retried; any other accept error ends serving with [`TwinError::Accept`].
pub async fn serve(
    listener: TcpListener,
    twin: Arc<Twin>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), TwinError> {
    let acceptor = tls.map(|config| {
        let config = if config.alpn_protocols.is_empty() {
            let mut c = (*config).clone();
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Arc::new(c)
        } else {
            config
        };
        TlsAcceptor::from(config)
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    // Cancelled when the grace period ran out: connections still open are
    // dropped where they stand.
    let abort = CancellationToken::new();
    let connections = TaskTracker::new();
    let result = accept_until(listener, shutdown, OnError::StopOnFatal, |stream, peer| {
        tracing::debug!(%peer, "twin connection");
        let served = connection(stream, Arc::clone(&twin), acceptor.clone(), stop_rx.clone());
        let abort = abort.clone();
        connections.spawn(async move {
            tokio::select! {
                () = served => {}
                () = abort.cancelled() => {}
            }
        });
    })
    .await
    .map_err(TwinError::Accept);
    // Receivers outlive the sender only inside connection tasks; a send error means none are left.
    let _ = stop_tx.send(true);
    connections.close();
    if tokio::time::timeout(GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::info!(
            remaining = connections.len(),
            "grace period over; closing remaining twin connections"
        );
        abort.cancel();
        connections.wait().await;
    }
    result
}

async fn connection(
    stream: TcpStream,
    twin: Arc<Twin>,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    // Small JSON answers: don't let Nagle hold them back.
    let _ = stream.set_nodelay(true);
    match tls {
        None => serve_io(TokioIo::new(stream), twin, stop).await,
        Some(acceptor) => {
            let handshake = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => r,
                () = stopped(&mut stop) => return,
            };
            match handshake {
                Ok(Ok(tls_stream)) => serve_io(TokioIo::new(tls_stream), twin, stop).await,
                Ok(Err(e)) => tracing::debug!(error = %e, "twin TLS handshake failed"),
                Err(_) => tracing::debug!("twin TLS handshake timed out"),
            }
        }
    }
}

/// How long a client may take to send a request head.
const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn serve_io<I>(io: I, twin: Arc<Twin>, mut stop: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let twin = Arc::clone(&twin);
        async move { Ok::<_, Infallible>(twin.handle(req).await) }
    });
    // A slow or idle client is closed after 30 s without a request head
    // (HTTP/2: without answering a ping), so idle connections cannot pile up.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(CLIENT_TIMEOUT);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(CLIENT_TIMEOUT)
        .keep_alive_timeout(CLIENT_TIMEOUT)
        // As large a request head as the proxy lets through (64 KiB).
        .max_header_list_size(64 * 1024);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "twin connection ended with an error");
            }
        }
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "twin connection ended with an error during shutdown");
            }
        }
    }
}

/// Resolves once shutdown was signalled (or the signal's sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // Drop the borrowed value at once: holding it across an await would make the task !Send.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
