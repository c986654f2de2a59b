//! Body plumbing: one boxed body type for both legs, and a wrapper that counts
//! the bytes a body yields without buffering it (streaming stays streaming).

pub mod capture;
pub mod meter;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type on every leg.
pub type ProxyBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A complete in-memory body (JSON answers made by the proxy).
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    full(Bytes::new())
}

/// Shared counters of a [`Counted`] body.
#[derive(Debug, Default)]
pub struct Tally {
    bytes: AtomicU64,
    failed: AtomicBool,
    ended: AtomicBool,
}

impl Tally {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    /// True when the wrapped body produced an error (the client hung up mid-body).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
    /// True once the wrapped body ended whole (its end was seen, or it
    /// said it had no more).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// Counts data bytes flowing through a body.
pub struct Counted<B> {
    inner: B,
    tally: Arc<Tally>,
}

impl<B> Counted<B> {
    pub fn new(inner: B) -> (Counted<B>, Arc<Tally>) {
        let tally = Arc::new(Tally::default());
        (
            Counted {
                inner,
                tally: tally.clone(),
            },
            tally,
        )
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.tally
                        .bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.tally.failed.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                self.tally.ended.store(true, Ordering::Relaxed);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.tally.ended.store(true, Ordering::Relaxed);
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
