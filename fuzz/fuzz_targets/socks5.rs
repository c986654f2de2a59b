//! The gateway's SOCKS5 server side (proxy/src/inbound/socks5.rs):
//! `handshake`, then `accept`, over a peer that hands out the input in
//! reads whose size the first byte sets (0 = all at once) and then ends.
//! Besides no panic and no hang: the same outcome whatever the reads; never
//! more than `MAX_HANDSHAKE` bytes consumed; credentials of 1 to 255 bytes
//! with no control character in the username; a name target non-empty,
//! normalized, of letters, digits, '-', '_' and '.', and no address
//! literal; the server's bytes are the protocol's answers.
#![no_main]

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use veris_proxy::inbound::socks5::{handshake, Request, Socks5Error, Target, MAX_HANDSHAKE};

/// The client: `input` in reads of at most `chunk` bytes, then end of
/// stream; what the server writes is kept.
struct Peer<'a> {
    input: &'a [u8],
    consumed: usize,
    chunk: usize,
    written: Vec<u8>,
}

impl AsyncRead for Peer<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let rest = &self.input[self.consumed..];
        let n = rest.len().min(self.chunk).min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.consumed += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn run(input: &[u8], chunk: usize) -> (String, usize, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut peer = Peer {
        input,
        consumed: 0,
        chunk,
        written: Vec::new(),
    };
    let outcome = rt.block_on(async {
        let h = handshake(&mut peer).await?;
        let c = h.credentials().clone();
        assert!((1..=255).contains(&c.username.len()));
        assert!((1..=255).contains(&c.password.len()));
        assert!(!c.username.chars().any(char::is_control));
        let request = h.accept(&mut peer).await?;
        Ok::<_, Socks5Error>((c, request))
    });
    if let Ok((_, request)) = &outcome {
        let target = match request {
            Request::Connect(t) => t,
            Request::Unsupported { target, .. } => target,
        };
        if let Target::Name { host, .. } = target {
            let name = host.as_str();
            assert!(!name.is_empty());
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)));
            assert_eq!(veris_host::Host::new(name), *host);
            assert!(host.ip().is_none(), "{name}");
        }
        assert_eq!(peer.written, [5, 2, 1, 0]);
    }
    let shown = match &outcome {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("{e:?}"),
    };
    (shown, peer.consumed, peer.written)
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let chunk = if chunk == 0 {
        usize::MAX
    } else {
        usize::from(chunk)
    };
    let (cut, consumed, written) = run(input, chunk);
    assert!(consumed <= MAX_HANDSHAKE, "{consumed}");
    assert!(consumed <= input.len());
    let (whole, consumed_whole, written_whole) = run(input, usize::MAX);
    assert_eq!(cut, whole);
    assert_eq!(consumed, consumed_whole);
    assert_eq!(written, written_whole);
    // Every answer starts with the method choice, when there is one.
    if !written.is_empty() {
        assert!(
            written.starts_with(&[5, 2]) || written == [5, 0xFF],
            "{written:?}"
        );
    }
});
