//! Reading a TLS ClientHello off a redirected connection before anyone else
//! does. The transparent tier must know the SNI (to route) before it decides
//! between terminating and passing through, and passthrough must replay the
//! exact bytes the client sent, so the hello is read here, by hand, from the
//! record layer up: records are reassembled into one handshake message (a
//! hello with a post-quantum key share is ~1.6 KB and clients split it over
//! TCP segments and sometimes over several records), bounded by a byte limit,
//! and the SNI, ALPN and Encrypted Client Hello (0xfe0d) extensions are picked
//! out. Every byte read is kept in [`ClientHello::raw`] for the replay.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Default bound on the bytes read for one ClientHello (records included).
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// TLS record content type `handshake`.
const CONTENT_HANDSHAKE: u8 = 22;
/// Handshake message type `client_hello`.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Largest plaintext record fragment TLS allows (2^14).
const MAX_FRAGMENT: usize = 1 << 14;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
/// Encrypted Client Hello (draft-ietf-tls-esni), also sent as GREASE.
pub const EXT_ECH: u16 = 0xfe0d;

/// What was read: the raw bytes and what the proxy needs from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// Every byte read from the client, in order (at least the hello's records).
    pub raw: Vec<u8>,
    /// The server name, lower-cased, without a trailing dot.
    pub sni: Option<String>,
    /// ALPN protocols offered, in the client's order.
    pub alpn: Vec<Vec<u8>>,
    /// The ECH extension was present (real or GREASE: they look the same).
    pub ech: bool,
}

/// Why no ClientHello could be read.
#[derive(Debug, thiserror::Error)]
pub enum ClientHelloError {
    #[error("the client sent something other than a TLS handshake record")]
    NotTls,
    #[error("the ClientHello exceeds {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the client closed the connection after {read} bytes, before a complete ClientHello")]
    Closed { read: usize },
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
    #[error("reading the ClientHello")]
    Io(#[source] std::io::Error),
}

/// Reads from `io` until one complete ClientHello has arrived, at most `limit`
/// bytes. The bytes stay in the returned value; the caller replays them.
pub async fn read<R>(io: &mut R, limit: usize) -> Result<ClientHello, ClientHelloError>
where
    R: AsyncRead + Unpin,
{
    read_with(io, &mut Parser::new(limit)).await
}

/// [`read`] into a parser the caller owns, which may already hold the first
/// bytes (a sniffed prefix). When this fails, or is cancelled (a timeout),
/// every byte read so far is still in [`Parser::buffered`].
pub async fn read_with<R>(io: &mut R, parser: &mut Parser) -> Result<ClientHello, ClientHelloError>
where
    R: AsyncRead + Unpin,
{
    let limit = parser.limit;
    let mut chunk = [0u8; 4096];
    // Bounded: every pass reads at least one byte or returns, and the parser
    // refuses more than `limit` bytes.
    loop {
        let want = chunk
            .len()
            .min(limit.saturating_sub(parser.buf.len()).max(1));
        let n = io
            .read(&mut chunk[..want])
            .await
            .map_err(ClientHelloError::Io)?;
        if n == 0 {
            return Err(ClientHelloError::Closed {
                read: parser.buf.len(),
            });
        }
        if let Some(hello) = parser.push(&chunk[..n])? {
            return Ok(hello);
        }
    }
}

/// Incremental record-layer parser: feed bytes with [`Parser::push`] until it
/// returns the hello. Work is linear in the bytes fed, however they are split.
#[derive(Debug)]
pub struct Parser {
    limit: usize,
    buf: Vec<u8>,
    /// Offset in `buf` of the next record header not yet consumed.
    next_record: usize,
    /// Handshake bytes reassembled from the records consumed so far.
    handshake: Vec<u8>,
}

impl Parser {
    pub fn new(limit: usize) -> Parser {
        Parser {
            limit,
            buf: Vec::new(),
            next_record: 0,
            handshake: Vec::new(),
        }
    }

    /// The bytes pushed so far and not yet handed out in a [`ClientHello`].
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Adds bytes; `Ok(Some)` once a complete ClientHello is in.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Option<ClientHello>, ClientHelloError> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.limit {
            return Err(ClientHelloError::TooLarge { limit: self.limit });
        }
        loop {
            let header = match self.buf.get(self.next_record..self.next_record + 5) {
                Some(h) => h,
                None => {
                    // Reject garbage as soon as its first byte is seen.
                    if let Some(&t) = self.buf.get(self.next_record) {
                        if t != CONTENT_HANDSHAKE {
                            return Err(ClientHelloError::NotTls);
                        }
                    }
                    return Ok(None);
                }
            };
            if header[0] != CONTENT_HANDSHAKE || header[1] != 3 {
                return Err(ClientHelloError::NotTls);
            }
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if len == 0 || len > MAX_FRAGMENT {
                return Err(ClientHelloError::Malformed("bad record length"));
            }
            let start = self.next_record + 5;
            let Some(fragment) = self.buf.get(start..start + len) else {
                return Ok(None);
            };
            self.handshake.extend_from_slice(fragment);
            self.next_record = start + len;

            if self.handshake.len() >= 4 {
                if self.handshake[0] != HANDSHAKE_CLIENT_HELLO {
                    return Err(ClientHelloError::Malformed(
                        "first handshake message is not a ClientHello",
                    ));
                }
                let body_len = usize::from(self.handshake[1]) << 16
                    | usize::from(self.handshake[2]) << 8
                    | usize::from(self.handshake[3]);
                if body_len + 4 > self.limit {
                    return Err(ClientHelloError::TooLarge { limit: self.limit });
                }
                if self.handshake.len() >= 4 + body_len {
                    let fields = parse_body(&self.handshake[4..4 + body_len])?;
                    return Ok(Some(ClientHello {
                        raw: std::mem::take(&mut self.buf),
                        sni: fields.sni,
                        alpn: fields.alpn,
                        ech: fields.ech,
                    }));
                }
            }
        }
    }
}

struct Fields {
    sni: Option<String>,
    alpn: Vec<Vec<u8>>,
    ech: bool,
}

/// A cursor over a byte slice that fails instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ClientHelloError> {
        if self.0.len() < n {
            return Err(ClientHelloError::Malformed("field runs past its end"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, ClientHelloError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ClientHelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Result<&'a [u8], ClientHelloError> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], ClientHelloError> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The SNI of a bare ClientHello body (after the 4-byte handshake header),
/// for callers that reassembled the message themselves (the QUIC sink reads
/// it from CRYPTO frames); `None` when absent or malformed.
pub fn sni_of_body(body: &[u8]) -> Option<String> {
    parse_body(body).ok().and_then(|fields| fields.sni)
}

fn parse_body(body: &[u8]) -> Result<Fields, ClientHelloError> {
    let mut c = Cursor(body);
    c.take(2)?; // legacy_version
    c.take(32)?; // random
    c.vec8()?; // legacy_session_id
    c.vec16()?; // cipher_suites
    c.vec8()?; // legacy_compression_methods
    let mut fields = Fields {
        sni: None,
        alpn: Vec::new(),
        ech: false,
    };
    if c.is_empty() {
        // A hello without extensions (SSLv3-era) is legal: no SNI.
        return Ok(fields);
    }
    let mut exts = Cursor(c.vec16()?);
    while !exts.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        match kind {
            EXT_SERVER_NAME => fields.sni = server_name(data)?,
            EXT_ALPN => {
                let mut list = Cursor(Cursor(data).vec16()?);
                while !list.is_empty() {
                    fields.alpn.push(list.vec8()?.to_vec());
                }
            }
            EXT_ECH => fields.ech = true,
            _ => {}
        }
    }
    Ok(fields)
}

/// The `host_name` entry of a server_name extension, validated as a DNS name.
fn server_name(data: &[u8]) -> Result<Option<String>, ClientHelloError> {
    let mut list = Cursor(Cursor(data).vec16()?);
    while !list.is_empty() {
        let name_type = list.u8()?;
        let name = list.vec16()?;
        if name_type != 0 {
            continue;
        }
        let valid = !name.is_empty()
            && name
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !valid {
            return Err(ClientHelloError::Malformed("server name is not a DNS name"));
        }
        // Checked ASCII above, so this cannot fail.
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name).to_string();
        return Ok(Some(name));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello body with the given extensions (type, data).
    fn body(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend([7u8; 32]);
        b.push(32);
        b.extend([9u8; 32]);
        b.extend([0, 4, 0x13, 0x01, 0x13, 0x02]);
        b.extend([1, 0]);
        let mut e = Vec::new();
        for (kind, data) in exts {
            e.extend(kind.to_be_bytes());
            e.extend((data.len() as u16).to_be_bytes());
            e.extend(data);
        }
        b.extend((e.len() as u16).to_be_bytes());
        b.extend(e);
        b
    }

    fn sni_ext(name: &str) -> (u16, Vec<u8>) {
        let mut entry = vec![0];
        entry.extend((name.len() as u16).to_be_bytes());
        entry.extend(name.as_bytes());
        let mut d = (entry.len() as u16).to_be_bytes().to_vec();
        d.extend(entry);
        (EXT_SERVER_NAME, d)
    }

    fn alpn_ext(protos: &[&str]) -> (u16, Vec<u8>) {
        let mut list = Vec::new();
        for p in protos {
            list.push(p.len() as u8);
            list.extend(p.as_bytes());
        }
        let mut d = (list.len() as u16).to_be_bytes().to_vec();
        d.extend(list);
        (EXT_ALPN, d)
    }

    /// The handshake message split into records of at most `per_record` bytes.
    fn records(body: &[u8], per_record: usize) -> Vec<u8> {
        let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut out = Vec::new();
        for frag in hs.chunks(per_record) {
            out.extend([CONTENT_HANDSHAKE, 3, 1]);
            out.extend((frag.len() as u16).to_be_bytes());
            out.extend(frag);
        }
        out
    }

    fn padded_hello() -> Vec<u8> {
        // Like a post-quantum hello: a 1.2 KB key share pushes it past one segment.
        body(&[
            sni_ext("API.Stripe.com."),
            alpn_ext(&["h2", "http/1.1"]),
            (51, vec![0x11; 1216]),
            (EXT_ECH, vec![0, 1, 2]),
        ])
    }

    #[test]
    fn one_record_one_push() {
        let wire = records(&padded_hello(), MAX_FRAGMENT);
        let hello = Parser::new(MAX_CLIENT_HELLO).push(&wire).unwrap().unwrap();
        assert_eq!(hello.sni.as_deref(), Some("api.stripe.com"));
        assert_eq!(hello.alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(hello.ech);
        assert_eq!(hello.raw, wire);
    }

    #[test]
    fn split_records_fed_one_byte_at_a_time() {
        // 100-byte records, each byte its own TCP segment.
        let wire = records(&padded_hello(), 100);
        assert!(wire.len() > 1300);
        let mut p = Parser::new(MAX_CLIENT_HELLO);
        let mut got = None;
        for (i, b) in wire.iter().enumerate() {
            match p.push(&[*b]).unwrap() {
                Some(h) => {
                    assert_eq!(i, wire.len() - 1, "complete only at the last byte");
                    got = Some(h);
                }
                None => assert!(i < wire.len() - 1),
            }
        }
        let hello = got.unwrap();
        assert_eq!(hello.sni.as_deref(), Some("api.stripe.com"));
        assert_eq!(hello.raw, wire);
    }

    #[test]
    fn fragmented_header_across_records() {
        // The 4-byte handshake header itself split over records of 1 and 3 bytes.
        let wire = records(&body(&[sni_ext("a.example")]), 1);
        let hello = Parser::new(MAX_CLIENT_HELLO).push(&wire).unwrap().unwrap();
        assert_eq!(hello.sni.as_deref(), Some("a.example"));
        assert!(!hello.ech);
        assert!(hello.alpn.is_empty());
    }

    #[test]
    fn no_extensions_means_no_sni() {
        let mut b = body(&[]);
        b.truncate(b.len() - 2); // drop the empty extensions block entirely
        let hello = Parser::new(MAX_CLIENT_HELLO)
            .push(&records(&b, MAX_FRAGMENT))
            .unwrap()
            .unwrap();
        assert_eq!(hello.sni, None);
    }

    #[test]
    fn oversized_hello_is_refused_early() {
        // Declares a 100 KB body: refused from the header, before it arrives.
        let mut wire = vec![
            CONTENT_HANDSHAKE,
            3,
            1,
            0,
            4,
            HANDSHAKE_CLIENT_HELLO,
            1,
            0x86,
            0xa0,
        ];
        let err = Parser::new(MAX_CLIENT_HELLO).push(&wire).unwrap_err();
        assert!(matches!(err, ClientHelloError::TooLarge { .. }));
        // A stream of small records that never completes hits the byte bound.
        let mut p = Parser::new(1000);
        wire = records(&vec![0u8; 2000], 50);
        let err = wire
            .chunks(100)
            .find_map(|c| p.push(c).err())
            .expect("the bound is reached");
        assert!(matches!(err, ClientHelloError::TooLarge { limit: 1000 }));
    }

    #[test]
    fn garbage_is_not_tls() {
        let err = Parser::new(MAX_CLIENT_HELLO)
            .push(b"GET / HTTP/1.1\r\n")
            .unwrap_err();
        assert!(matches!(err, ClientHelloError::NotTls));
        // Detected on the very first byte.
        let err = Parser::new(MAX_CLIENT_HELLO).push(b"G").unwrap_err();
        assert!(matches!(err, ClientHelloError::NotTls));
        // A handshake record whose message is not a ClientHello.
        let mut wire = records(&body(&[]), MAX_FRAGMENT);
        wire[5] = 2;
        assert!(matches!(
            Parser::new(MAX_CLIENT_HELLO).push(&wire).unwrap_err(),
            ClientHelloError::Malformed(_)
        ));
        // Truncated extension data inside a complete message.
        let mut b = body(&[sni_ext("x.example")]);
        let n = b.len();
        b[n - 14] = 0xff; // the SNI list length now runs past the end
        assert!(matches!(
            Parser::new(MAX_CLIENT_HELLO)
                .push(&records(&b, MAX_FRAGMENT))
                .unwrap_err(),
            ClientHelloError::Malformed(_)
        ));
        // A server name with bytes no DNS name has.
        let b = body(&[sni_ext("evil/host")]);
        assert!(Parser::new(MAX_CLIENT_HELLO)
            .push(&records(&b, MAX_FRAGMENT))
            .is_err());
    }

    #[tokio::test]
    async fn read_reports_a_close_mid_hello() {
        let wire = records(&padded_hello(), 512);
        let mut short = &wire[..700];
        let err = read(&mut short, MAX_CLIENT_HELLO).await.unwrap_err();
        assert!(matches!(err, ClientHelloError::Closed { read: 700 }));
        let mut full = &wire[..];
        let hello = read(&mut full, MAX_CLIENT_HELLO).await.unwrap();
        assert_eq!(hello.raw.len(), wire.len());
    }
}
