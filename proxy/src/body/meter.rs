//! Counting what really moved. A [`Metered`] stream counts the bytes read
//! from it and written to it into a shared [`Meter`], so the count survives
//! the stream (and an error that ends a copy mid-way): what the ledger says
//! was moved is what was moved, not what a copy loop returned on success.
//! It also notes whether the peer ended its side (a read that returned
//! end-of-file or failed), which tells a client that closed from a
//! connection the proxy closed itself. A [`Delivered`] body counts the
//! bytes of a response handed to the client and reports a body that ended
//! short: with an error, or dropped (the client left) before its end.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::body::{End, Watch, Watched};

/// Shared counters of a [`Metered`] stream.
#[derive(Debug, Default)]
pub struct Meter {
    read: AtomicU64,
    written: AtomicU64,
    peer_closed: AtomicBool,
}

impl Meter {
    /// Bytes read from the stream (what its peer sent).
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
    /// Bytes the stream accepted for writing (what went to its peer).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
    /// True once a read saw the peer's end (end-of-file, reset, error).
    pub fn peer_closed(&self) -> bool {
        self.peer_closed.load(Ordering::Relaxed)
    }
}

/// A stream whose bytes are counted in a shared [`Meter`].
pub struct Metered<IO> {
    inner: IO,
    meter: Arc<Meter>,
}

impl<IO> Metered<IO> {
    pub fn new(inner: IO) -> (Metered<IO>, Arc<Meter>) {
        let meter = Arc::new(Meter::default());
        (
            Metered {
                inner,
                meter: meter.clone(),
            },
            meter,
        )
    }

    pub fn get_mut(&mut self) -> &mut IO {
        &mut self.inner
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let asked = buf.remaining() > 0;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                this.meter.read.fetch_add(n, Ordering::Relaxed);
                if n == 0 && asked {
                    this.meter.peer_closed.store(true, Ordering::Relaxed);
                }
            }
            Poll::Ready(Err(_)) => this.meter.peer_closed.store(true, Ordering::Relaxed),
            Poll::Pending => {}
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            this.meter.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            this.meter.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Why a response body ended short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The source body (the twin's) failed before its end.
    Source,
    /// The body was dropped before its end: the client's connection went.
    Dropped,
}

/// A body that ended short, with the bytes handed on before it did.
pub type OnShort = Box<dyn FnOnce(u64, Cut) + Send + Sync>;

/// A response body that counts the bytes handed to the client's connection
/// and calls `on_short` once if it ends with an error or is dropped before
/// its end. A body that ends cleanly (or reports its end, as an empty body
/// for `HEAD` does) calls nothing.
pub type Delivered<B> = Watched<B, Short>;

/// The watcher of a [`Delivered`] body.
pub struct Short {
    bytes: u64,
    on_short: Option<OnShort>,
}

impl<B: Body> Delivered<B> {
    pub fn new(inner: B, on_short: OnShort) -> Delivered<B> {
        Watched::watch(
            inner,
            Short {
                bytes: 0,
                on_short: Some(on_short),
            },
        )
    }
}

impl Watch for Short {
    fn data(&mut self, data: &Bytes) {
        self.bytes += data.len() as u64;
    }
    fn end(&mut self, end: End) {
        let cut = match end {
            End::Whole => None,
            End::Failed => Some(Cut::Source),
            End::Dropped => Some(Cut::Dropped),
        };
        if let (Some(on_short), Some(cut)) = (self.on_short.take(), cut) {
            on_short(self.bytes, cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BoxError;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn counts_survive_an_error_and_note_the_peer_closing() {
        let (a, mut b) = tokio::io::duplex(64);
        let (mut m, meter) = Metered::new(a);
        m.write_all(b"hello").await.unwrap();
        b.write_all(b"abc").await.unwrap();
        let mut got = [0u8; 3];
        m.read_exact(&mut got).await.unwrap();
        assert!(!meter.peer_closed());
        drop(b);
        let mut rest = Vec::new();
        m.read_to_end(&mut rest).await.unwrap();
        assert!(meter.peer_closed());
        // The peer is gone: the write fails, the counts stay.
        assert!(m.write_all(b"more").await.is_err());
        assert_eq!((meter.read(), meter.written()), (3, 5));
    }

    type Boxed = http_body_util::combinators::BoxBody<Bytes, BoxError>;

    fn watched(body: Boxed) -> (Delivered<Boxed>, std::sync::mpsc::Receiver<(u64, Cut)>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let on_short: OnShort = Box::new(move |bytes, cut| {
            let _ = tx.send((bytes, cut));
        });
        (Delivered::new(body, on_short), rx)
    }

    #[tokio::test]
    async fn a_body_that_fails_or_is_dropped_early_is_reported_once() {
        // The source fails after 3 bytes.
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
        tx.send_data(Bytes::from_static(b"abc")).await.unwrap();
        tx.abort(Box::from("cut"));
        let (mut d, rx) = watched(body.boxed());
        assert_eq!(
            d.frame().await.unwrap().unwrap().into_data().unwrap(),
            "abc"
        );
        assert!(d.frame().await.unwrap().is_err());
        drop(d);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [(3, Cut::Source)]);

        // The reader (the client's connection) goes after 2 bytes.
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
        tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
        let (mut d, rx) = watched(body.boxed());
        d.frame().await.unwrap().unwrap();
        drop(d);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [(2, Cut::Dropped)]);
    }

    #[tokio::test]
    async fn complete_and_empty_bodies_report_nothing() {
        let (d, rx) = watched(crate::body::full("hello"));
        assert_eq!(d.collect().await.unwrap().to_bytes(), "hello");
        assert!(rx.try_recv().is_err());
        // Dropped right after its last frame, never asked for the end.
        let (mut d, rx) = watched(crate::body::full("hello"));
        d.frame().await.unwrap().unwrap();
        drop(d);
        assert!(rx.try_recv().is_err());
        // Nothing to send, never polled.
        let (d, rx) = watched(crate::body::empty());
        drop(d);
        assert!(rx.try_recv().is_err());
    }
}
