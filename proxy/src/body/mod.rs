//! Body plumbing: one boxed body type for both legs, and [`Watched`], the
//! one wrapper that sees a body's bytes and its end without buffering it
//! (streaming stays streaming). Three watchers use it: [`Counted`] (bytes
//! and end into a shared [`Tally`]), [`meter::Delivered`] (a response
//! that ended short) and [`capture::Tee`] (a capped copy for capture).

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

/// How a [`Watched`] body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its end was seen, or it said it had no more.
    Whole,
    /// The wrapped body produced an error (the client hung up mid-body,
    /// the twin's body broke off).
    Failed,
    /// It was dropped before its end (its reader went).
    Dropped,
}

/// What a [`Watched`] body tells its watcher: each data frame as it
/// passes, then how the body ended, once.
pub trait Watch {
    fn data(&mut self, data: &Bytes);
    fn end(&mut self, end: End);
}

/// A body passed on unchanged while `W` watches it: the one `poll_frame`
/// behind the byte-counting wrappers ([`Counted`], [`meter::Delivered`],
/// [`capture::Tee`]), which differ only in what they note.
pub struct Watched<B, W: Watch> {
    inner: B,
    watch: W,
    ended: bool,
}

impl<B: Body, W: Watch> Watched<B, W> {
    /// `inner` watched by `watch`. A body with nothing to send (`HEAD`,
    /// 204, 304) may never be polled, so one that says so already has
    /// ended whole.
    pub fn watch(inner: B, watch: W) -> Watched<B, W> {
        let mut watched = Watched {
            inner,
            watch,
            ended: false,
        };
        if watched.inner.is_end_stream() {
            watched.end(End::Whole);
        }
        watched
    }
}

impl<B, W: Watch> Watched<B, W> {
    fn end(&mut self, end: End) {
        if !std::mem::replace(&mut self.ended, true) {
            self.watch.end(end);
        }
    }
}

impl<B, W> Body for Watched<B, W>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    W: Watch + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.watch.data(data);
                }
                // A connection may stop polling once the body says it has
                // ended, without asking for the final `None`.
                if this.inner.is_end_stream() {
                    this.end(End::Whole);
                }
            }
            Poll::Ready(Some(Err(_))) => this.end(End::Failed),
            Poll::Ready(None) => this.end(End::Whole),
            Poll::Pending => {}
        }
        polled.map(|o| o.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B, W: Watch> Drop for Watched<B, W> {
    fn drop(&mut self) {
        self.end(End::Dropped);
    }
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

impl Watch for Arc<Tally> {
    fn data(&mut self, data: &Bytes) {
        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
    fn end(&mut self, end: End) {
        match end {
            End::Whole => self.ended.store(true, Ordering::Relaxed),
            End::Failed => self.failed.store(true, Ordering::Relaxed),
            End::Dropped => {}
        }
    }
}

/// Counts data bytes flowing through a body into a shared [`Tally`].
pub type Counted<B> = Watched<B, Arc<Tally>>;

impl<B: Body> Counted<B> {
    pub fn new(inner: B) -> (Counted<B>, Arc<Tally>) {
        let tally = Arc::new(Tally::default());
        (Watched::watch(inner, tally.clone()), tally)
    }
}
