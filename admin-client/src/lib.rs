//! The one HTTP/1.1 client veris uses to talk to itself: its admin API
//! (`/status`, `/seal`, `/receipt`, `/events`), the twin's log, the canary
//! the proxy answers, and `CONNECT` through the proxy. Plain HTTP/1.1 over
//! loopback, or over a stream the caller opened (TLS, for the transparent
//! canary): one request per connection, no redirects, no pooling.
//!
//! Every read is bounded, because what answers at an announced address may
//! be anything (a port reused after a crash, a workload's listener): the
//! head at [`MAX_HEAD`], the body at the caller's limit, the time at the
//! caller's timeout. Bodies framed by `Content-Length`, `chunked` or the end
//! of the connection are all read. The core is a parser that sees bytes,
//! not sockets; an async driver (tokio) and a blocking one (std, for the
//! isolated tier's init process, which runs no runtime) feed it.

#![forbid(unsafe_code)]

mod parse;

use std::fmt;
use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use parse::Parser;
pub use parse::MAX_HEAD;

/// Bytes asked for per read.
const READ: usize = 16 << 10;

/// How much an exchange may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most body bytes read; a longer answer is refused.
    pub body: usize,
    /// The whole exchange, connecting included.
    pub time: Duration,
}

/// One request. The `Debug` form is absent on purpose: it may carry a token.
#[derive(Clone)]
pub struct Request<'a> {
    method: &'a str,
    target: &'a str,
    host: &'a str,
    headers: Vec<(&'static str, String)>,
    body: &'a [u8],
}

impl<'a> Request<'a> {
    /// `method target HTTP/1.1` with `Host: host`. `target` is a path (or,
    /// to a proxy, an absolute URL; for `CONNECT`, `host:port`).
    pub fn new(method: &'a str, target: &'a str, host: &'a str) -> Request<'a> {
        Request {
            method,
            target,
            host,
            headers: Vec::new(),
            body: b"",
        }
    }

    pub fn get(target: &'a str, host: &'a str) -> Request<'a> {
        Request::new("GET", target, host)
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer(self, token: &str) -> Request<'a> {
        self.header("authorization", format!("Bearer {token}"))
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Request<'a> {
        self.headers.push((name, value.into()));
        self
    }

    /// A body, sent with its `Content-Type` and `Content-Length`.
    pub fn body(self, content_type: &str, body: &'a [u8]) -> Request<'a> {
        let mut req = self.header("content-type", content_type);
        req.body = body;
        req
    }

    /// The bytes on the wire. Refuses a control character (a line break
    /// from a token file would write headers of its own).
    fn encode(&self) -> Result<Vec<u8>, ErrorKind> {
        let words = [self.method, self.target, self.host];
        let values = self.headers.iter().map(|(_, v)| v.as_str());
        if words
            .iter()
            .any(|w| w.is_empty() || w.contains([' ', '\t']))
            || words
                .into_iter()
                .chain(values)
                .any(|w| w.chars().any(|c| c.is_control() && c != '\t'))
        {
            return Err(ErrorKind::Request);
        }
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: {}\r\n",
            self.method, self.target, self.host
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !self.body.is_empty() || matches!(self.method, "POST" | "PUT" | "PATCH") {
            head.push_str(&format!("content-length: {}\r\n", self.body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(self.body);
        Ok(bytes)
    }
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What went wrong, and where.
#[derive(Debug)]
pub struct Error {
    addr: String,
    kind: ErrorKind,
}

#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The URL is not `http://host[:port][/path]`.
    Url(String),
    /// The request holds a space or control character where none may be.
    Request,
    /// Nothing accepted the connection.
    Connect(std::io::Error),
    /// No (whole) answer in time.
    Timeout(Duration),
    /// The connection failed while the request or answer was moving.
    Io(std::io::Error),
    /// What answered is not HTTP/1.
    Malformed(String),
    /// The body is over the caller's limit.
    TooLarge(usize),
    /// The connection ended before the answer did.
    Truncated(&'static str),
    /// A proxy answered `CONNECT` with this status line.
    Refused(String),
}

impl Error {
    fn new(addr: &str, kind: ErrorKind) -> Error {
        Error {
            addr: addr.to_string(),
            kind,
        }
    }

    /// `host:port` (or the URL) the error is about.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl Error {
    /// What failed, without the next step (for a message that wraps it).
    pub fn what(&self) -> String {
        let addr = &self.addr;
        match &self.kind {
            ErrorKind::Url(why) => format!("bad URL {addr:?}: {why}"),
            ErrorKind::Request => {
                format!("{addr}: the request holds a line break or space where none may be")
            }
            ErrorKind::Connect(e) => format!("cannot connect to {addr} ({e})"),
            ErrorKind::Timeout(after) => format!("{addr}: no answer within {after:?}"),
            ErrorKind::Io(e) => format!("{addr}: the connection failed mid-answer ({e})"),
            ErrorKind::Malformed(why) => format!("{addr} did not answer in HTTP/1 ({why})"),
            ErrorKind::TooLarge(limit) => {
                format!("{addr}: the answer is over {limit} bytes, refused")
            }
            ErrorKind::Truncated(why) => format!("{addr} {why}"),
            ErrorKind::Refused(line) => format!("{addr} refused the CONNECT: {line}"),
        }
    }

    /// What to do about it, when there is something to do.
    pub fn next_step(&self) -> Option<String> {
        let addr = &self.addr;
        Some(match &self.kind {
            ErrorKind::Url(_) => "give http://host:port".to_string(),
            ErrorKind::Request => "check the token (one line) and the path".to_string(),
            ErrorKind::Connect(_) => {
                format!("check that veris (or the twin) is running and listens at {addr}")
            }
            ErrorKind::Timeout(_) => {
                format!("check that what listens at {addr} is veris (or the twin) and is not stuck")
            }
            ErrorKind::Malformed(_) | ErrorKind::TooLarge(_) => {
                format!("check that {addr} is veris's address")
            }
            ErrorKind::Io(_) | ErrorKind::Truncated(_) | ErrorKind::Refused(_) => return None,
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.next_step() {
            Some(next) => write!(f, "{}. Next: {next}", self.what()),
            None => f.write_str(&self.what()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Connect(e) | ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// An `http://` URL split into where to connect and what to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `host:port` (an IPv6 host in brackets), the port always written.
    pub authority: String,
    /// The path and query as written (may be empty).
    pub path: String,
}

impl HttpUrl {
    pub fn parse(url: &str) -> Result<HttpUrl, Error> {
        let bad = |why: &str| Error::new(url, ErrorKind::Url(why.to_string()));
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some(_) => return Err(bad(
                "only http:// is supported; reach the admin port over loopback or a forwarded port",
            )),
            None => return Err(bad("no http:// scheme")),
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let at = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(at);
        if authority.contains('@') {
            return Err(bad("user info is not supported"));
        }
        if authority
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(bad("a space in the host"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, port) = v6
                .split_once(']')
                .ok_or_else(|| bad("no ] after an IPv6 host"))?;
            (format!("[{host}]"), port)
        } else {
            let (host, port) = authority.split_at(authority.find(':').unwrap_or(authority.len()));
            (host.to_string(), port)
        };
        let port = match port {
            "" | ":" => 80,
            p => p
                .strip_prefix(':')
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| bad("a bad port"))?,
        };
        if host.is_empty() || host == "[]" {
            return Err(bad("no host"));
        }
        Ok(HttpUrl {
            authority: format!("{host}:{port}"),
            path: path.to_string(),
        })
    }

    /// The request target: the path, `/` when there is none.
    pub fn target(&self) -> String {
        match self.path.as_str() {
            "" => "/".to_string(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_string(),
        }
    }
}

/// `method url`, with the bearer token when given, connecting included,
/// bounded by `limits`: one call for the admin API and the twin's log.
pub async fn call(
    method: &str,
    url: &str,
    bearer: Option<&str>,
    limits: Limits,
) -> Result<Response, Error> {
    let url = HttpUrl::parse(url)?;
    let target = url.target();
    let mut req = Request::new(method, &target, &url.authority);
    if let Some(token) = bearer {
        req = req.bearer(token);
    }
    within(&url.authority, limits.time, async {
        let tcp = connect(&url.authority).await?;
        exchange(tcp, &url.authority, &req, limits.body).await
    })
    .await
}

/// Runs `work` for at most `time`; then a [`ErrorKind::Timeout`] about `addr`.
pub async fn within<T>(
    addr: &str,
    time: Duration,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(time, work)
        .await
        .unwrap_or_else(|_| Err(Error::new(addr, ErrorKind::Timeout(time))))
}

/// A TCP connection to `addr` (`host:port`), unbounded in time: wrap it
/// in [`within`].
pub async fn connect(addr: &str) -> Result<TcpStream, Error> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| Error::new(addr, ErrorKind::Connect(e)))?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// Sends `req` on `io` and reads the whole answer, at most `limit` body
/// bytes. `addr` names the peer in errors. Unbounded in time: wrap it in
/// [`within`].
pub async fn exchange<IO>(
    io: IO,
    addr: &str,
    req: &Request<'_>,
    limit: usize,
) -> Result<Response, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let answer = send(io, addr, req).await?;
    let status = answer.status();
    let body = answer.body(limit).await?;
    Ok(Response { status, body })
}

/// Sends `req` on `io` and reads the answer's head; the body is read
/// from the [`Answer`] as it arrives (an event stream).
pub async fn send<IO>(mut io: IO, addr: &str, req: &Request<'_>) -> Result<Answer<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let bytes = req.encode().map_err(|kind| Error::new(addr, kind))?;
    let failed = |e| Error::new(addr, ErrorKind::Io(e));
    io.write_all(&bytes).await.map_err(failed)?;
    io.flush().await.map_err(failed)?;
    let mut answer = Answer {
        io,
        addr: addr.to_string(),
        parser: Parser::new(),
        ready: Vec::new(),
        ended: false,
        buf: vec![0; READ],
    };
    while answer.parser.status().is_none() {
        answer.fill().await?;
    }
    Ok(answer)
}

/// An answer whose head is read; its body comes with [`Answer::chunk`].
pub struct Answer<IO> {
    io: IO,
    addr: String,
    parser: Parser,
    /// Body bytes read but not yet handed on.
    ready: Vec<u8>,
    ended: bool,
    buf: Vec<u8>,
}

impl<IO: AsyncRead + Unpin> Answer<IO> {
    pub fn status(&self) -> u16 {
        self.parser.status().unwrap_or_default()
    }

    /// The next body bytes as they arrive; `None` at the body's end.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        loop {
            if !self.ready.is_empty() {
                return Ok(Some(std::mem::take(&mut self.ready)));
            }
            if self.ended || self.parser.done() {
                return Ok(None);
            }
            self.fill().await?;
        }
    }

    /// The rest of the body, refused when over `limit` bytes.
    pub async fn body(mut self, limit: usize) -> Result<Vec<u8>, Error> {
        let mut body = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            if body.len() + chunk.len() > limit {
                return Err(Error::new(&self.addr, ErrorKind::TooLarge(limit)));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One read, fed to the parser.
    async fn fill(&mut self) -> Result<(), Error> {
        let n = self
            .io
            .read(&mut self.buf)
            .await
            .map_err(|e| Error::new(&self.addr, ErrorKind::Io(e)))?;
        if n == 0 {
            self.ended = true;
            return self
                .parser
                .eof()
                .map_err(|why| Error::new(&self.addr, ErrorKind::Truncated(why)));
        }
        self.parser
            .push(&self.buf[..n], &mut self.ready)
            .map_err(|why| Error::new(&self.addr, ErrorKind::Malformed(why)))
    }
}

/// `CONNECT authority` on `io`, a connection to the proxy at `proxy`; Ok
/// once the proxy answered 2xx. Reads the answer's head and nothing past
/// it: a proxy sends nothing more until the client speaks, so bytes past
/// the head are refused rather than lost. Unbounded in time: wrap it in
/// [`within`].
pub async fn connect_tunnel<IO>(io: &mut IO, proxy: &str, authority: &str) -> Result<(), Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let err = |kind| Error::new(proxy, kind);
    let bytes = Request::new("CONNECT", authority, authority)
        .encode()
        .map_err(err)?;
    io.write_all(&bytes)
        .await
        .map_err(|e| err(ErrorKind::Io(e)))?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    let end = loop {
        if let Some(end) = parse::find(&head, b"\r\n\r\n") {
            break end;
        }
        if head.len() > MAX_HEAD {
            return Err(err(ErrorKind::Malformed(format!(
                "its head is over {MAX_HEAD} bytes"
            ))));
        }
        let n = io.read(&mut buf).await.map_err(|e| err(ErrorKind::Io(e)))?;
        if n == 0 {
            return Err(err(ErrorKind::Truncated(
                "closed the connection during CONNECT",
            )));
        }
        head.extend_from_slice(&buf[..n]);
    };
    if head.len() > end + 4 {
        return Err(err(ErrorKind::Malformed(
            "bytes after its CONNECT answer".into(),
        )));
    }
    let (status, _) = parse::head(&head[..end]).map_err(|why| err(ErrorKind::Malformed(why)))?;
    if !(200..300).contains(&status) {
        let line = String::from_utf8_lossy(&head[..end]);
        let line = line.lines().next().unwrap_or_default().to_string();
        return Err(err(ErrorKind::Refused(line)));
    }
    Ok(())
}

/// [`exchange`] on a blocking TCP connection to `addr`, for a process that
/// runs no async runtime: connecting, sending and every read within
/// `limits.time` in all.
pub fn call_blocking(
    addr: SocketAddr,
    req: &Request<'_>,
    limits: Limits,
) -> Result<Response, Error> {
    let name = addr.to_string();
    let err = |kind| Error::new(&name, kind);
    let io_err = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ErrorKind::Timeout(limits.time)
        }
        _ => ErrorKind::Io(e),
    };
    let deadline = Instant::now() + limits.time;
    let bytes = req.encode().map_err(err)?;
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, limits.time).map_err(|e| {
        err(match e.kind() {
            std::io::ErrorKind::TimedOut => ErrorKind::Timeout(limits.time),
            _ => ErrorKind::Connect(e),
        })
    })?;
    tcp.set_write_timeout(Some(limits.time))
        .and_then(|()| tcp.write_all(&bytes))
        .map_err(|e| err(io_err(e)))?;
    let mut parser = Parser::new();
    let mut body = Vec::new();
    let mut buf = vec![0u8; READ];
    while !parser.done() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(err(ErrorKind::Timeout(limits.time)));
        }
        tcp.set_read_timeout(Some(left))
            .map_err(|e| err(io_err(e)))?;
        let n = tcp.read(&mut buf).map_err(|e| err(io_err(e)))?;
        if n == 0 {
            parser.eof().map_err(|why| err(ErrorKind::Truncated(why)))?;
            break;
        }
        parser
            .push(&buf[..n], &mut body)
            .map_err(|why| err(ErrorKind::Malformed(why)))?;
        if body.len() > limits.body {
            return Err(err(ErrorKind::TooLarge(limits.body)));
        }
    }
    let status = parser.status().ok_or_else(|| {
        err(ErrorKind::Truncated(
            "closed the connection without an answer",
        ))
    })?;
    Ok(Response { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// A one-connection server on loopback: reads the request's head, sends
    /// `parts` (flushing between them), and reports the head it read.
    fn server(parts: Vec<Vec<u8>>) -> (SocketAddr, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
            for part in parts {
                if conn.write_all(&part).and_then(|()| conn.flush()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        (addr, rx)
    }

    const LIMITS: Limits = Limits {
        body: 1 << 20,
        time: Duration::from_secs(10),
    };

    fn url(addr: SocketAddr, path: &str) -> String {
        format!("http://{addr}{path}")
    }

    #[tokio::test]
    async fn status_body_and_the_bearer_token() {
        let (addr, heads) = server(vec![
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope".to_vec(),
        ]);
        let got = call("POST", &url(addr, "/seal?x=1"), Some("tok"), LIMITS)
            .await
            .unwrap();
        assert_eq!((got.status, got.body.as_slice()), (404, &b"nope"[..]));
        let head = heads.recv().unwrap();
        assert!(head.starts_with("POST /seal?x=1 HTTP/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {addr}\r\n")), "{head}");
        assert!(head.contains("authorization: Bearer tok\r\n"), "{head}");
        assert!(head.contains("content-length: 0\r\n"), "{head}");
    }

    #[tokio::test]
    async fn a_chunked_body_arrives_whole_and_streams_in_pieces() {
        let parts = vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel".to_vec(),
            b"lo\r\n6\r\n world\r\n".to_vec(),
            b"0\r\n\r\n".to_vec(),
        ];
        let (addr, _) = server(parts.clone());
        let got = call("GET", &url(addr, "/"), None, LIMITS).await.unwrap();
        assert_eq!(
            (got.status, got.body.as_slice()),
            (200, &b"hello world"[..])
        );

        let (addr, _) = server(parts);
        let tcp = connect(&addr.to_string()).await.unwrap();
        let mut answer = send(tcp, "x", &Request::get("/events", "x")).await.unwrap();
        let mut pieces = Vec::new();
        while let Some(piece) = answer.chunk().await.unwrap() {
            pieces.push(piece);
        }
        assert!(pieces.len() > 1, "{pieces:?}");
        assert_eq!(pieces.concat(), b"hello world");
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_refused() {
        let big = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{}",
            "x".repeat(100_000)
        );
        let (addr, _) = server(vec![big.clone().into_bytes()]);
        let limits = Limits {
            body: 1000,
            ..LIMITS
        };
        let e = call("GET", &url(addr, "/"), None, limits)
            .await
            .unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::TooLarge(1000)), "{e}");
        // A head that never ends, and the blocking driver.
        let (addr, _) = server(vec![
            b"HTTP/1.1 200 OK\r\n".to_vec(),
            vec![b'x'; MAX_HEAD + 10],
        ]);
        let e = call_blocking(addr, &Request::get("/", "x"), limits).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Malformed(_)), "{e}");
        let (addr, _) = server(vec![big.into_bytes()]);
        let e = call_blocking(addr, &Request::get("/", "x"), limits).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::TooLarge(1000)), "{e}");
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        // Accepts, reads the request, then sends the head and stops.
        let (addr, _) = server(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec(),
            Vec::new(),
        ]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = listener.local_addr().unwrap();
        let limits = Limits {
            time: Duration::from_millis(300),
            ..LIMITS
        };
        for e in [
            call("GET", &url(silent, "/"), None, limits)
                .await
                .unwrap_err(),
            call_blocking(silent, &Request::get("/", "x"), limits).unwrap_err(),
        ] {
            assert!(matches!(e.kind(), ErrorKind::Timeout(_)), "{e}");
            assert!(
                e.to_string().contains("no answer within 300ms. Next:"),
                "{e}"
            );
        }
        // The head came but not the body; the server's thread has ended.
        let e = call("GET", &url(addr, "/"), None, limits)
            .await
            .unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Truncated(_) | ErrorKind::Timeout(_)),
            "{e}"
        );
        drop(listener);
    }

    #[tokio::test]
    async fn a_refused_connection_says_what_to_do() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = call("GET", &url(addr, "/status"), None, LIMITS)
            .await
            .unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Connect(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot connect to {addr} (")),
            "{text}"
        );
        assert!(text.contains("Next: check that veris"), "{text}");
        let e = call_blocking(addr, &Request::get("/", "x"), LIMITS).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Connect(_)), "{e}");
    }

    #[test]
    fn the_blocking_driver_reads_an_answer_that_ends_with_the_connection() {
        let (addr, heads) = server(vec![
            b"HTTP/1.0 200 OK\r\n\r\n{\"veris_proxy\":true}".to_vec()
        ]);
        let req =
            Request::get("/__veris/canary", "canary.veris.internal").header("user-agent", "t");
        let got = call_blocking(addr, &req, LIMITS).unwrap();
        assert_eq!(
            (got.status, got.body.as_slice()),
            (200, &b"{\"veris_proxy\":true}"[..])
        );
        assert!(heads.recv().unwrap().contains("user-agent: t\r\n"));
    }

    #[tokio::test]
    async fn connect_opens_a_tunnel_or_says_why_not() {
        let (addr, heads) = server(vec![b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec()]);
        let mut tcp = connect(&addr.to_string()).await.unwrap();
        connect_tunnel(&mut tcp, "proxy", "api.stripe.com:443")
            .await
            .unwrap();
        let head = heads.recv().unwrap();
        assert!(
            head.starts_with("CONNECT api.stripe.com:443 HTTP/1.1\r\nhost: api.stripe.com:443\r\n"),
            "{head}"
        );

        let (addr, _) = server(vec![
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n".to_vec()
        ]);
        let mut tcp = connect(&addr.to_string()).await.unwrap();
        let e = connect_tunnel(&mut tcp, "proxy", "a:443")
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "proxy refused the CONNECT: HTTP/1.1 403 Forbidden"
        );
    }

    #[test]
    fn a_line_break_in_a_header_is_never_sent() {
        let req = Request::get("/status", "127.0.0.1:1").bearer("tok\r\nX-Veris: forged");
        assert!(matches!(req.encode(), Err(ErrorKind::Request)));
        assert!(Request::get("/a b", "h").encode().is_err());
    }

    #[test]
    fn urls() {
        let u = HttpUrl::parse("http://127.0.0.1:4567/admin?x=1#f").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.path.as_str()),
            ("127.0.0.1:4567", "/admin?x=1")
        );
        let u = HttpUrl::parse("HTTP://localhost").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.target().as_str()),
            ("localhost:80", "/")
        );
        let u = HttpUrl::parse("http://[::1]:8080?q").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.target().as_str()),
            ("[::1]:8080", "/?q")
        );
        for bad in [
            "https://x:1",
            "x:1",
            "http://",
            "http://a:b",
            "http://u@h",
            "http://[::1",
            "http://::1:80",
            "http://a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
