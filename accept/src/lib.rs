//! The one TCP accept loop of every veris listener: the proxy's explicit
//! and transparent listeners, the admin API, the DNS stub over TCP and the
//! built-in twin. [`accept_until`] accepts until shutdown, hands each
//! connection to the caller (who spawns what serves it), and applies one
//! policy to accept errors ([`OnError`]).
//!
//! A crate of its own because the twin does not depend on the proxy (the
//! proxy's tests depend on the twin), and both need the loop.
#![forbid(unsafe_code)]

use std::future::Future;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

/// How long the loop waits after a failed accept before the next one: out
/// of descriptors (EMFILE) the listener stays readable, and accepting again
/// at once would spin.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// What the loop does when `accept` fails. Either way the error is logged
/// and, when the loop goes on, followed by [`BACKOFF`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Accept again, whatever the error: the listener serves until shutdown
    /// (the proxy's listeners, the admin API, the DNS stub).
    Retry,
    /// Accept again after a transient error ([`is_transient`]); any other
    /// error ends the loop and is returned (the twin).
    StopOnFatal,
}

/// Accepts connections on `listener` until `shutdown` resolves, calling
/// `handle` with each one, then drops the listener and returns `Ok`. With
/// [`OnError::StopOnFatal`], a fatal accept error is returned instead.
pub async fn accept_until<F>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    on_error: OnError,
    mut handle: F,
) -> io::Result<()>
where
    F: FnMut(TcpStream, SocketAddr),
{
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => handle(stream, peer),
                Err(e) if on_error == OnError::StopOnFatal && !is_transient(&e) => return Err(e),
                Err(e) => {
                    let addr = listener.local_addr().ok();
                    warn!(error = %e, listener = ?addr, "accept failed; retrying");
                    tokio::time::sleep(BACKOFF).await;
                }
            }
        }
    }
}

/// An accept error that says nothing about the listener: the connection
/// went away before it was accepted, or the process or system is out of
/// descriptors, memory or buffers for now (ENOMEM, ENFILE, EMFILE, ENOBUFS).
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::TimedOut
    ) || matches!(e.raw_os_error(), Some(12 | 23 | 24 | 105))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_connection_is_handed_over_until_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(accept_until(
            listener,
            async move {
                let _ = stop_rx.await;
            },
            OnError::Retry,
            move |_stream, peer| {
                let _ = seen_tx.send(peer);
            },
        ));
        for _ in 0..3 {
            let client = TcpStream::connect(addr).await.unwrap();
            let peer = seen_rx.recv().await.unwrap();
            assert_eq!(peer, client.local_addr().unwrap());
        }
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
        // The listener was dropped: nothing accepts there any more.
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn running_out_of_descriptors_is_transient_a_bad_socket_is_not() {
        assert!(is_transient(&io::Error::from_raw_os_error(24)));
        assert!(is_transient(&io::Error::from(ErrorKind::ConnectionAborted)));
        assert!(!is_transient(&io::Error::from_raw_os_error(9)));
    }
}
