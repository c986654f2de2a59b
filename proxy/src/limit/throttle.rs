//! Pacing a client connection's bytes by its sandbox's byte limit. A
//! [`Throttled`] stream pays every byte read from it and written to it into
//! the sandbox's one bucket ([`super::Limiter::bytes`]) after it moved, and
//! before the next read or write waits on a tokio timer until the bucket's
//! debt is paid: traffic is slowed, never dropped, and a waiting stream
//! costs nothing until its timer fires. Each wait is a hit of
//! [`Limit::Bytes`] for the sandbox's ledger.
//!
//! The stream also holds the connection's [`Tenancy`] once the sandbox is
//! known — at once for SOCKS5, at the first authenticated request of an
//! HTTP proxy connection — and with it the connection's permit under the
//! sandbox's connection cap, for as long as the stream lives (an upgraded
//! `CONNECT` outlives the HTTP service that admitted it).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use super::{Limit, Limiter};

/// A client connection's sandbox: whose bucket paces it, whose connection
/// cap it counts against.
#[derive(Debug)]
pub struct Tenancy {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) _permit: OwnedSemaphorePermit,
}

/// Where a connection's [`Tenancy`] is set once it is known.
pub type Seat = Arc<OnceLock<Tenancy>>;

/// A stream paced by its tenancy's byte limit (unpaced until it has one,
/// or when the sandbox has no byte limit).
pub struct Throttled<IO> {
    inner: IO,
    seat: Seat,
    read_wait: Option<Pin<Box<Sleep>>>,
    write_wait: Option<Pin<Box<Sleep>>>,
}

impl<IO> Throttled<IO> {
    /// A stream whose tenancy is set later through the returned [`Seat`].
    pub fn unseated(inner: IO) -> (Throttled<IO>, Seat) {
        let seat = Seat::default();
        let stream = Throttled {
            inner,
            seat: seat.clone(),
            read_wait: None,
            write_wait: None,
        };
        (stream, seat)
    }

    /// A stream of a known tenancy.
    pub fn seated(inner: IO, tenancy: Tenancy) -> Throttled<IO> {
        let (stream, seat) = Throttled::unseated(inner);
        let _ = seat.set(tenancy);
        stream
    }
}

/// Ready once the sandbox's bucket has no debt; else waits (a timer, no
/// polling) and counts the wait as a hit of its byte limit.
fn pace(seat: &Seat, wait: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> Poll<()> {
    let Some(limiter) = seat.get().map(|t| &t.limiter) else {
        return Poll::Ready(());
    };
    let Some(bucket) = limiter.bytes() else {
        return Poll::Ready(());
    };
    // Bounded: each round either returns or arms a timer of at least 1 ms.
    loop {
        if let Some(sleep) = wait.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            *wait = None;
        }
        match bucket.debt() {
            None => return Poll::Ready(()),
            Some(d) => {
                limiter.hit(Limit::Bytes, d);
                *wait = Some(Box::pin(tokio::time::sleep(d)));
            }
        }
    }
}

/// Pays `n` bytes that moved.
fn pay(seat: &Seat, n: usize) {
    if let Some(bucket) = seat.get().and_then(|t| t.limiter.bytes()) {
        bucket.debit(n as u64);
    }
}

/// The most one write may carry: a second of the limit, so one large
/// buffer does not leave the whole sandbox a long debt.
fn most(seat: &Seat, len: usize) -> usize {
    match seat.get().and_then(|t| t.limiter.bytes()) {
        Some(bucket) => len.min(usize::try_from(bucket.burst()).unwrap_or(usize::MAX).max(1)),
        None => len,
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Throttled<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(pace(&this.seat, &mut this.read_wait, cx));
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        pay(&this.seat, buf.filled().len() - before);
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Throttled<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(pace(&this.seat, &mut this.write_wait, cx));
        let buf = &buf[..most(&this.seat, buf.len())];
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        pay(&this.seat, n);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(pace(&this.seat, &mut this.write_wait, cx));
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        pay(&this.seat, n);
        Poll::Ready(Ok(n))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::recorder::MemoryRecorder;
    use crate::Limits;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;
    use veris_receipt::Entry;

    fn tenancy(max_bytes_per_sec: u64, recorder: Arc<MemoryRecorder>) -> Tenancy {
        let limits = Limits {
            max_bytes_per_sec,
            ..Limits::default()
        };
        let limiter = Limiter::new(
            limits,
            recorder,
            TaskTracker::new(),
            CancellationToken::new(),
            "sbx".into(),
        );
        let permit = Arc::new(tokio::sync::Semaphore::new(1))
            .try_acquire_owned()
            .unwrap();
        Tenancy {
            limiter,
            _permit: permit,
        }
    }

    /// Copies `total` bytes through a throttled stream both ways; the time
    /// it took on the paused clock.
    async fn echo_through(seat_with: Option<Tenancy>, total: usize) -> (Vec<u8>, Duration) {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let (mut near, seat) = Throttled::unseated(near);
        if let Some(t) = seat_with {
            let _ = seat.set(t);
        }
        let sent: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        let echo = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(far);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        let started = tokio::time::Instant::now();
        let data = sent.clone();
        let (mut r, mut w) = tokio::io::split(&mut near);
        let write = async {
            w.write_all(&data).await.unwrap();
        };
        let mut got = Vec::new();
        let read = async {
            while got.len() < total {
                let mut chunk = [0u8; 4096];
                let n = r.read(&mut chunk).await.unwrap();
                assert!(n > 0, "early end");
                got.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::join!(write, read);
        let took = started.elapsed();
        echo.abort();
        assert_eq!(got, sent, "every byte arrives, in order");
        (got, took)
    }

    #[tokio::test(start_paused = true)]
    async fn a_limited_stream_is_slowed_to_its_rate_and_loses_nothing() {
        let recorder = Arc::new(MemoryRecorder::default());
        // 200 KB each way through a 100 KB/s bucket shared by both: about
        // 3 s beyond the first second's burst.
        let (_, took) = echo_through(Some(tenancy(100_000, recorder.clone())), 200_000).await;
        assert!(
            took >= Duration::from_millis(2_900) && took <= Duration::from_secs(5),
            "{took:?}"
        );
        let lines = recorder.wait_for(1).await;
        assert!(
            matches!(&lines[0], Entry::Blocked(b) if b.reason.contains("100000 bytes a second"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unseated_or_unlimited_stream_is_not_slowed() {
        let (_, took) = echo_through(None, 200_000).await;
        assert!(took < Duration::from_millis(10), "{took:?}");
        let recorder = Arc::new(MemoryRecorder::default());
        let (_, took) = echo_through(Some(tenancy(0, recorder.clone())), 200_000).await;
        assert!(took < Duration::from_millis(10), "{took:?}");
        assert!(recorder.entries().is_empty());
    }
}
