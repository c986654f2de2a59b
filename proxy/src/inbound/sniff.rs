//! Telling protocols apart by the first bytes a redirected client sends. The
//! transparent tier receives every outbound TCP port of the workload, so a
//! connection to port 443 may speak plain HTTP, one to port 3128 may be a
//! `CONNECT` meant for some other proxy, and one to port 25 may wait for the
//! server to speak first. [`classify`] is the pure decision over a prefix;
//! [`sniff`] reads that prefix off a connection, bounded in bytes
//! ([`SNIFF_LIMIT`]) and in time, keeping every byte for the replay.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

/// The most bytes read before the protocol must be decided. An HTTP request
/// line still undecided at this length is handed to the HTTP server, whose
/// own limits answer it; anything else is opaque.
pub const SNIFF_LIMIT: usize = 8 * 1024;

/// The longest method token taken for HTTP (WebDAV's are the longest in use).
const MAX_METHOD: usize = 32;

/// What a connection's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A TLS handshake record (content type 22, major version 3).
    Tls,
    /// An HTTP request: an HTTP/1.x request line or the HTTP/2 preface.
    Http,
    /// An HTTP `CONNECT`: a client that thinks it talks to a proxy.
    Connect,
    /// Anything else.
    Opaque,
}

/// How the first bytes of a connection turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    /// The bytes said which protocol (or ran out of time or room to).
    Spoke(Protocol),
    /// Nothing arrived in time: a server-speaks-first protocol (SMTP, FTP,
    /// MySQL) or an idle client.
    Silent,
    /// The client closed (or the read failed) before sending a byte.
    Closed,
}

/// Decides the protocol of a prefix, or `None` while more bytes could
/// still change the answer.
pub fn classify(bytes: &[u8]) -> Option<Protocol> {
    let (&first, rest) = bytes.split_first()?;
    if first == 0x16 {
        // A TLS record header: type, then the major version 3.
        return match rest.first() {
            None => None,
            Some(3) => Some(Protocol::Tls),
            Some(_) => Some(Protocol::Opaque),
        };
    }
    match request_line(bytes) {
        Line::Request { connect: true } => Some(Protocol::Connect),
        Line::Request { connect: false } => Some(Protocol::Http),
        Line::Partial { .. } => None,
        Line::Not => Some(Protocol::Opaque),
    }
}

/// The decision for a prefix that will not grow (the client paused, closed,
/// or hit [`SNIFF_LIMIT`]): a request line cut inside its target is HTTP
/// (the HTTP server answers what follows), every other undecided prefix
/// opaque.
pub fn settle(bytes: &[u8]) -> Protocol {
    if let Some(protocol) = classify(bytes) {
        return protocol;
    }
    match request_line(bytes) {
        Line::Partial {
            plausible: true,
            connect: true,
        } => Protocol::Connect,
        Line::Partial {
            plausible: true,
            connect: false,
        } => Protocol::Http,
        _ => Protocol::Opaque,
    }
}

/// Reads the client's first bytes into `buf` until they decide the protocol,
/// [`SNIFF_LIMIT`] bytes are in, or time runs out: `first` bounds the wait
/// for the first byte ([`Sniff::Silent`] when none came), `total` the whole
/// read (then the prefix is [`settle`]d). Bytes already in `buf` count. Safe
/// to cancel: every byte read is in `buf` at each await.
pub async fn sniff<R>(io: &mut R, buf: &mut Vec<u8>, first: Duration, total: Duration) -> Sniff
where
    R: AsyncRead + Unpin,
{
    let start = Instant::now();
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(protocol) = classify(buf) {
            return Sniff::Spoke(protocol);
        }
        if buf.len() >= SNIFF_LIMIT {
            return Sniff::Spoke(settle(buf));
        }
        let deadline = start + if buf.is_empty() { first } else { total };
        let want = chunk.len().min(SNIFF_LIMIT - buf.len());
        match tokio::time::timeout_at(deadline, io.read(&mut chunk[..want])).await {
            Err(_) if buf.is_empty() => return Sniff::Silent,
            Err(_) => return Sniff::Spoke(settle(buf)),
            Ok(Ok(0)) | Ok(Err(_)) if buf.is_empty() => return Sniff::Closed,
            Ok(Ok(0)) | Ok(Err(_)) => return Sniff::Spoke(settle(buf)),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// How far a prefix matches `METHOD SP target SP HTTP/d.d`.
enum Line {
    /// The version's `HTTP/d.d` is in: a request line (the HTTP/2 preface,
    /// `PRI * HTTP/2.0`, is one too).
    Request { connect: bool },
    /// Consistent so far; `plausible` once a request target has begun after
    /// the method (`/`, `*`, `http…`, or anything after `CONNECT`).
    Partial { plausible: bool, connect: bool },
    /// Not a request line.
    Not,
}

fn request_line(bytes: &[u8]) -> Line {
    let method_len = bytes.iter().take_while(|&&b| is_tchar(b)).count();
    if method_len > MAX_METHOD {
        return Line::Not;
    }
    let Some(&after_method) = bytes.get(method_len) else {
        return Line::Partial {
            plausible: false,
            connect: false,
        };
    };
    if method_len == 0 || after_method != b' ' {
        return Line::Not;
    }
    let connect = &bytes[..method_len] == b"CONNECT";
    let rest = &bytes[method_len + 1..];
    let target_len = rest.iter().take_while(|&&b| b.is_ascii_graphic()).count();
    let Some(&after_target) = rest.get(target_len) else {
        let plausible = match rest.first() {
            None => false,
            Some(_) if connect => true,
            Some(b'/' | b'*') => true,
            Some(_) => rest.len() >= 4 && rest[..4].eq_ignore_ascii_case(b"http"),
        };
        return Line::Partial { plausible, connect };
    };
    if target_len == 0 || after_target != b' ' {
        return Line::Not;
    }
    let version = &rest[target_len + 1..];
    // `HTTP/` digit `.` digit, matched as far as it has arrived.
    const SHAPE: &[u8] = b"HTTP/0.0";
    for (i, &b) in version.iter().take(SHAPE.len()).enumerate() {
        let fits = match SHAPE[i] {
            b'0' => b.is_ascii_digit(),
            s => b == s,
        };
        if !fits {
            return Line::Not;
        }
    }
    if version.len() < SHAPE.len() {
        Line::Partial {
            plausible: true,
            connect,
        }
    } else {
        Line::Request { connect }
    }
}

/// RFC 9110 §5.6.2 `tchar`: what a method token is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::{AsyncWriteExt, ReadBuf};

    const FIRST: Duration = Duration::from_secs(5);
    const TOTAL: Duration = Duration::from_secs(5);

    /// Hands out one byte per read: first bytes split across TCP segments.
    struct OneByte<IO>(IO);

    impl<IO: AsyncRead + Unpin> AsyncRead for OneByte<IO> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let mut one = [0u8; 1];
            let mut small = ReadBuf::new(&mut one);
            match Pin::new(&mut self.get_mut().0).poll_read(cx, &mut small) {
                Poll::Ready(Ok(())) => {
                    buf.put_slice(small.filled());
                    Poll::Ready(Ok(()))
                }
                other => other,
            }
        }
    }

    /// What `bytes` sniff as when the client sends them and then waits.
    async fn sniffed(bytes: &[u8]) -> (Sniff, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(SNIFF_LIMIT * 2);
        client.write_all(bytes).await.unwrap();
        let mut buf = Vec::new();
        let got = sniff(
            &mut server,
            &mut buf,
            Duration::from_millis(200),
            Duration::from_millis(200),
        )
        .await;
        drop(client);
        (got, buf)
    }

    /// A real TLS 1.3 ClientHello, as rustls sends it.
    fn client_hello() -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("api.stripe.com").unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn tls_is_told_by_its_record_header() {
        let hello = client_hello();
        assert_eq!(classify(&hello), Some(Protocol::Tls));
        assert_eq!(classify(&hello[..2]), Some(Protocol::Tls));
        // One byte could still be TLS; settled alone it is not.
        assert_eq!(classify(&hello[..1]), None);
        assert_eq!(settle(&hello[..1]), Protocol::Opaque);
        // Handshake type with another major version: not TLS.
        assert_eq!(classify(&[0x16, 0x02, 0x00]), Some(Protocol::Opaque));
    }

    #[test]
    fn http_methods_and_the_h2_preface_are_http() {
        for line in [
            "GET / HTTP/1.1\r\nHost: api.stripe.com\r\n\r\n",
            "POST /v1/charges HTTP/1.1\r\n",
            "HEAD /x?y=1 HTTP/1.0\r\n",
            "PROPFIND /dav/ HTTP/1.1\r\n",
            "OPTIONS * HTTP/1.1\r\n",
            "GET http://api.stripe.com/v1/customers HTTP/1.1\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            assert_eq!(classify(line.as_bytes()), Some(Protocol::Http), "{line:?}");
        }
        // The version decides, not the line end.
        assert_eq!(classify(b"GET / HTTP/1.1"), Some(Protocol::Http));
        assert_eq!(classify(b"GET / HTTP/1."), None);
    }

    #[test]
    fn connect_is_a_proxy_request() {
        assert_eq!(
            classify(b"CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\n\r\n"),
            Some(Protocol::Connect)
        );
        // Cut after the method: still a CONNECT once settled.
        assert_eq!(classify(b"CONNECT api.str"), None);
        assert_eq!(settle(b"CONNECT api.str"), Protocol::Connect);
        // A method that only starts like CONNECT is not one.
        assert_eq!(classify(b"CONNECTX a:1 HTTP/1.1\r\n"), Some(Protocol::Http));
    }

    #[test]
    fn other_bytes_are_opaque() {
        for bytes in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"[..],
            b"EHLO mail.example\r\n",
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f", // PostgreSQL SSLRequest
            b"\x80\x2e\x01\x03\x01",             // SSLv2-style hello
            b"GET\t/ HTTP/1.1\r\n",
            b"GET / FTP/1.1\r\n",
            b"GET  / HTTP/1.1\r\n",
            b" GET / HTTP/1.1\r\n",
            b"\r\nGET / HTTP/1.1\r\n",
            b"GET /\x01 HTTP/1.1\r\n",
        ] {
            assert_eq!(classify(bytes), Some(Protocol::Opaque), "{bytes:?}");
        }
        // A method token longer than any method is garbage, not a method.
        let long = vec![b'A'; MAX_METHOD + 1];
        assert_eq!(classify(&long), Some(Protocol::Opaque));
        // An undecided token without its space never becomes HTTP.
        assert_eq!(classify(b"HELO"), None);
        assert_eq!(settle(b"HELO"), Protocol::Opaque);
    }

    #[tokio::test]
    async fn first_bytes_split_one_per_read_are_reassembled() {
        for (bytes, want) in [
            (client_hello(), Protocol::Tls),
            (
                b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\n\r\n".to_vec(),
                Protocol::Http,
            ),
            (
                b"CONNECT api.stripe.com:443 HTTP/1.1\r\n\r\n".to_vec(),
                Protocol::Connect,
            ),
            (b"SSH-2.0-x y\r\n".to_vec(), Protocol::Opaque),
        ] {
            let (mut client, server) = tokio::io::duplex(64);
            let writer = {
                let bytes = bytes.clone();
                tokio::spawn(async move {
                    // Written whole; the reader below sees one byte at a time.
                    let _ = client.write_all(&bytes).await;
                    client
                })
            };
            let mut buf = Vec::new();
            let got = sniff(&mut OneByte(server), &mut buf, FIRST, TOTAL).await;
            assert_eq!(got, Sniff::Spoke(want), "{bytes:?}");
            // Bytes past the decision stay unread, for the protocol's own reader.
            assert!(bytes.starts_with(&buf), "{buf:?}");
            drop(writer.await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_is_silent_after_the_first_wait() {
        let (_client, mut server) = tokio::io::duplex(64);
        let mut buf = Vec::new();
        let started = std::time::Instant::now();
        let got = sniff(
            &mut server,
            &mut buf,
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(got, Sniff::Silent);
        assert!(buf.is_empty());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "bounded by `first`"
        );
    }

    #[tokio::test]
    async fn a_client_that_stalls_mid_line_is_settled_at_the_deadline() {
        let (got, buf) = sniffed(b"GET /v1/customers").await;
        assert_eq!(got, Sniff::Spoke(Protocol::Http));
        assert_eq!(buf, b"GET /v1/customers");
        let (got, _) = sniffed(b"\x16").await;
        assert_eq!(got, Sniff::Spoke(Protocol::Opaque));
        // A token and a space are not yet a request line.
        for stalled in [&b"220 "[..], b"EHLO mail.example"] {
            let (got, _) = sniffed(stalled).await;
            assert_eq!(got, Sniff::Spoke(Protocol::Opaque), "{stalled:?}");
        }
    }

    #[tokio::test]
    async fn a_client_that_closes_is_closed_or_settled() {
        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        let mut buf = Vec::new();
        assert_eq!(
            sniff(&mut server, &mut buf, FIRST, TOTAL).await,
            Sniff::Closed
        );
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"GE").await.unwrap();
        drop(client);
        assert_eq!(
            sniff(&mut server, &mut buf, FIRST, TOTAL).await,
            Sniff::Spoke(Protocol::Opaque)
        );
    }

    #[tokio::test]
    async fn the_read_is_bounded_in_bytes() {
        // A request target that never ends: HTTP, handed on at the limit.
        let mut endless = b"GET /".to_vec();
        endless.resize(SNIFF_LIMIT * 2, b'a');
        let (got, buf) = sniffed(&endless).await;
        assert_eq!(got, Sniff::Spoke(Protocol::Http));
        assert_eq!(buf.len(), SNIFF_LIMIT);
        // Printable noise with no space: opaque long before the limit.
        let noise = vec![b'x'; SNIFF_LIMIT * 2];
        let (got, buf) = sniffed(&noise).await;
        assert_eq!(got, Sniff::Spoke(Protocol::Opaque));
        assert!(buf.len() <= SNIFF_LIMIT);
    }

    #[tokio::test]
    async fn bytes_already_in_the_buffer_count() {
        let (_client, mut server) = tokio::io::duplex(64);
        let mut buf = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        let got = sniff(&mut server, &mut buf, FIRST, TOTAL).await;
        assert_eq!(got, Sniff::Spoke(Protocol::Connect));
    }
}
