//! The server side of SOCKS5 (RFC 1928) with username/password
//! authentication (RFC 1929), for the gateway tier (G1): a sandbox platform
//! tunnels a sandbox's outbound TCP to the gateway over SOCKS5 with that
//! sandbox's credentials, and the gateway tells sandboxes apart by them.
//!
//! The exchange, in the order it happens:
//!
//! 1. [`handshake`] reads the greeting, picks username/password (the only
//!    method offered: a gateway never serves an unauthenticated client) and
//!    reads the credentials, **without answering them**: the caller checks
//!    them and then calls [`Handshake::accept`] or [`Handshake::refuse`].
//! 2. [`Handshake::accept`] answers "authenticated" and reads the request.
//!    A `CONNECT` is [`Request::Connect`]; `BIND`, `UDP ASSOCIATE` and
//!    commands RFC 1928 does not define are [`Request::Unsupported`], for
//!    the caller to record and answer with [`refuse_command`] (reply 0x07).
//! 3. The caller dials and answers with [`reply`], then the connection is
//!    the tunnel.
//!
//! Every read is of an exact length the protocol gives (a length byte at
//! most 255, or a fixed field), so a whole handshake reads at most
//! [`MAX_HANDSHAKE`] bytes and never a byte past the request: what follows
//! is the client's first tunneled bytes, left unread for the caller. Reads
//! are bounded in bytes, not in time: the caller wraps the handshake in a
//! timeout.
//!
//! A malformed message is answered here, where the protocol has an answer
//! for it, before the error is returned (the caller only logs and closes):
//! no acceptable method → `05 FF`; a bad authentication message → `01 01`;
//! a request with an unknown address type → reply 0x08 (address type not
//! supported); a domain name that cannot name a host → reply 0x04 (host
//! unreachable: RFC 1928 has no code for a malformed name, and no host is
//! reachable by it); any other bad request field → reply 0x01 (general
//! failure). A greeting whose version is not 5 is not SOCKS5 and gets no
//! answer.
//!
//! A domain name is taken only as letters, digits, `-`, `_` and `.` (IDNs
//! arrive as A-labels, `xn--…`): control bytes, spaces, `:`, `[`, `%`, `/`
//! and non-ASCII bytes are refused, so that the name a ledger records, the
//! name routing matches and the name resolved are one string. A domain that
//! is an address literal (`"127.0.0.1"`, `"::1"`) is [`Target::Addr`]. A
//! name that the system resolver reads as an address in another form
//! (`127.1`, `2130706433`) stays a name: the dial policy
//! ([`crate::outbound::policy`]) judges the address it resolves to.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use veris_host::Host;

/// The SOCKS protocol version this module speaks.
pub const VERSION: u8 = 5;
/// The version of the username/password sub-negotiation (RFC 1929).
const AUTH_VERSION: u8 = 1;
/// The username/password authentication method.
const METHOD_USERNAME_PASSWORD: u8 = 0x02;
/// "No acceptable methods" (RFC 1928 §3).
const NO_ACCEPTABLE_METHODS: u8 = 0xFF;

const CMD_CONNECT: u8 = 0x01;
const CMD_BIND: u8 = 0x02;
const CMD_UDP_ASSOCIATE: u8 = 0x03;

const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// The most bytes a handshake reads: greeting (2 + 255 methods), auth
/// (2 + 255 + 1 + 255) and request (4 + 1 + 255 domain + 2).
pub const MAX_HANDSHAKE: usize = (2 + 255) + (2 + 255 + 1 + 255) + (4 + 1 + 255 + 2);

/// What a connection's first byte says it speaks, for a listener that
/// serves SOCKS5, HTTP proxy requests and TLS on one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// 0x05: a SOCKS5 greeting.
    Socks5,
    /// 0x16: a TLS handshake record (SOCKS5 or CONNECT over TLS, `--tls`).
    Tls,
    /// An ASCII upper-case letter: the first letter of an HTTP method
    /// (`CONNECT`, `GET`, …).
    Http,
    /// Anything else (SOCKS4 starts with 0x04).
    Other,
}

/// Tells the gateway's protocols apart by the first byte a client sends.
pub fn first_byte(b: u8) -> Inbound {
    match b {
        VERSION => Inbound::Socks5,
        0x16 => Inbound::Tls,
        b'A'..=b'Z' => Inbound::Http,
        _ => Inbound::Other,
    }
}

/// Where a client asks to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A domain name (ATYP 0x03), normalized by the one host rule
    /// ([`veris_host::Host`]): lower-case, no trailing dot, never empty,
    /// never an address literal.
    Name { host: Host, port: u16 },
    /// An IPv4 (ATYP 0x01) or IPv6 (ATYP 0x04) address, or a domain that
    /// was an address literal.
    Addr(SocketAddr),
}

impl Target {
    pub fn port(&self) -> u16 {
        match self {
            Target::Name { port, .. } => *port,
            Target::Addr(addr) => addr.port(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name { host, port } => write!(f, "{host}:{port}"),
            Target::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

/// A username and password (RFC 1929, or HTTP `Basic`). Each is 1 to 255
/// bytes of UTF-8; the username has no control characters (it may end up
/// in a log line). [`fmt::Debug`] never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// The longest username or password (RFC 1929's one length byte).
pub const MAX_CREDENTIAL: usize = 255;

impl Credentials {
    /// Checks the limits above; the error says which part broke which.
    pub fn new(username: &[u8], password: &[u8]) -> Result<Credentials, &'static str> {
        if username.is_empty() {
            return Err("the username is empty");
        }
        if password.is_empty() {
            return Err("the password is empty");
        }
        if username.len() > MAX_CREDENTIAL {
            return Err("the username is over 255 bytes");
        }
        if password.len() > MAX_CREDENTIAL {
            return Err("the password is over 255 bytes");
        }
        let username = std::str::from_utf8(username).map_err(|_| "the username is not UTF-8")?;
        if username.chars().any(char::is_control) {
            return Err("the username has a control character");
        }
        let password = std::str::from_utf8(password).map_err(|_| "the password is not UTF-8")?;
        Ok(Credentials {
            username: username.to_string(),
            password: password.to_string(),
        })
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// A command other than `CONNECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Bind,
    UdpAssociate,
    /// A command RFC 1928 does not define.
    Other(u8),
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Bind => f.write_str("BIND"),
            Command::UdpAssociate => f.write_str("UDP ASSOCIATE"),
            Command::Other(c) => write!(f, "command {c:#04x}"),
        }
    }
}

/// The client's request, read after authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `CONNECT`: dial the target, then [`reply`].
    Connect(Target),
    /// `BIND`, `UDP ASSOCIATE` or an unknown command: not served. Record
    /// it, then answer with [`refuse_command`].
    Unsupported { command: Command, target: Target },
}

/// The reply codes of RFC 1928 §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    NetworkUnreachable = 3,
    HostUnreachable = 4,
    ConnectionRefused = 5,
    TtlExpired = 6,
    CommandNotSupported = 7,
    AddressTypeNotSupported = 8,
}

/// Which message of the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Greeting,
    Auth,
    Request,
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Message::Greeting => "greeting",
            Message::Auth => "username/password message",
            Message::Request => "request",
        })
    }
}

/// Why a handshake failed. Field names are RFC 1928's and RFC 1929's
/// (`NMETHODS`, `UNAME`, `DST.ADDR`, …).
#[derive(Debug, thiserror::Error)]
pub enum Socks5Error {
    /// The client closed the connection between messages (before the
    /// greeting: it connected and left).
    #[error("the client closed the connection before its SOCKS5 {0}")]
    Closed(Message),
    /// The client closed the connection in the middle of a message.
    #[error("the client's SOCKS5 {message} was cut off in its {field} field")]
    Truncated {
        message: Message,
        field: &'static str,
    },
    /// The version byte was not 5 (not SOCKS5; SOCKS4 sends 4).
    #[error("not SOCKS5: the {message} has version {version}")]
    BadVersion { message: Message, version: u8 },
    /// The client offers no username/password authentication; it was
    /// answered `05 FF`.
    #[error("the client offers no username/password authentication (methods {methods:02x?}); it needs the sandbox's credentials in its proxy URL")]
    NoAcceptableMethod { methods: Vec<u8> },
    /// The sub-negotiation's version was not 1 (RFC 1929); answered `01 01`.
    #[error("the username/password message has version {0}, not 1 (RFC 1929)")]
    BadAuthVersion(u8),
    /// A field held a value the protocol (or this gateway) does not take;
    /// answered where the protocol has an answer (see the module docs).
    #[error("the client's SOCKS5 {message} has a bad {field}: {why}")]
    BadField {
        message: Message,
        field: &'static str,
        why: &'static str,
    },
    /// Reading from or writing to the client failed.
    #[error("SOCKS5 connection to the client failed")]
    Io(#[source] io::Error),
}

/// Reads exactly `buf.len()` bytes. End of stream before the first byte of
/// a message (`starts_message`) is [`Socks5Error::Closed`]; anywhere else
/// it is [`Socks5Error::Truncated`] in `field`.
async fn read_field<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buf: &mut [u8],
    message: Message,
    field: &'static str,
    starts_message: bool,
) -> Result<(), Socks5Error> {
    let mut filled = 0;
    while filled < buf.len() {
        match io.read(&mut buf[filled..]).await {
            Ok(0) if filled == 0 && starts_message => return Err(Socks5Error::Closed(message)),
            Ok(0) => return Err(Socks5Error::Truncated { message, field }),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Socks5Error::Io(e)),
        }
    }
    Ok(())
}

async fn read_u8<IO: AsyncRead + Unpin>(
    io: &mut IO,
    message: Message,
    field: &'static str,
    starts_message: bool,
) -> Result<u8, Socks5Error> {
    let mut b = [0u8; 1];
    read_field(io, &mut b, message, field, starts_message).await?;
    Ok(b[0])
}

async fn write_flush<IO: AsyncWrite + Unpin>(io: &mut IO, bytes: &[u8]) -> io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// A client that authenticated with credentials the caller has not judged
/// yet: it waits for [`Handshake::accept`] or [`Handshake::refuse`].
#[derive(Debug)]
pub struct Handshake {
    credentials: Credentials,
}

/// Reads the greeting and the username/password message; see the module
/// docs for what is answered on the way.
pub async fn handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
) -> Result<Handshake, Socks5Error> {
    let greeting = Message::Greeting;
    let version = read_u8(io, greeting, "VER", true).await?;
    if version != VERSION {
        return Err(Socks5Error::BadVersion {
            message: greeting,
            version,
        });
    }
    let n = read_u8(io, greeting, "NMETHODS", false).await?;
    let mut methods = [0u8; 255];
    let methods = &mut methods[..usize::from(n)];
    read_field(io, methods, greeting, "METHODS", false).await?;
    if !methods.contains(&METHOD_USERNAME_PASSWORD) {
        write_flush(io, &[VERSION, NO_ACCEPTABLE_METHODS])
            .await
            .map_err(Socks5Error::Io)?;
        return Err(Socks5Error::NoAcceptableMethod {
            methods: methods.to_vec(),
        });
    }
    write_flush(io, &[VERSION, METHOD_USERNAME_PASSWORD])
        .await
        .map_err(Socks5Error::Io)?;

    let auth = Message::Auth;
    let version = read_u8(io, auth, "VER", true).await?;
    if version != AUTH_VERSION {
        let _ = write_flush(io, &[AUTH_VERSION, 1]).await;
        return Err(Socks5Error::BadAuthVersion(version));
    }
    let ulen = read_u8(io, auth, "ULEN", false).await?;
    let mut username = [0u8; 255];
    let username = &mut username[..usize::from(ulen)];
    read_field(io, username, auth, "UNAME", false).await?;
    let plen = read_u8(io, auth, "PLEN", false).await?;
    let mut password = [0u8; 255];
    let password = &mut password[..usize::from(plen)];
    read_field(io, password, auth, "PASSWD", false).await?;
    match Credentials::new(username, password) {
        Ok(credentials) => Ok(Handshake { credentials }),
        Err(why) => {
            let _ = write_flush(io, &[AUTH_VERSION, 1]).await;
            let field = if why.starts_with("the username") {
                "UNAME"
            } else {
                "PASSWD"
            };
            Err(Socks5Error::BadField {
                message: auth,
                field,
                why,
            })
        }
    }
}

impl Handshake {
    /// The credentials the client sent, for the caller to check.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Answers "authenticated" (`01 00`) and reads the request.
    pub async fn accept<IO: AsyncRead + AsyncWrite + Unpin>(
        self,
        io: &mut IO,
    ) -> Result<Request, Socks5Error> {
        write_flush(io, &[AUTH_VERSION, 0])
            .await
            .map_err(Socks5Error::Io)?;
        read_request(io).await
    }

    /// Answers "authentication failed" (`01 01`); the caller closes.
    pub async fn refuse<IO: AsyncWrite + Unpin>(self, io: &mut IO) -> Result<(), Socks5Error> {
        write_flush(io, &[AUTH_VERSION, 1])
            .await
            .map_err(Socks5Error::Io)
    }
}

async fn read_request<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
) -> Result<Request, Socks5Error> {
    let request = Message::Request;
    let bad = |field, why| Socks5Error::BadField {
        message: request,
        field,
        why,
    };
    let version = read_u8(io, request, "VER", true).await?;
    let command = read_u8(io, request, "CMD", false).await?;
    let reserved = read_u8(io, request, "RSV", false).await?;
    let atyp = read_u8(io, request, "ATYP", false).await?;
    // The address is read whole before any field is judged: a reply then
    // leaves nothing of the request unread.
    let target = match atyp {
        ATYP_IPV4 => {
            let mut a = [0u8; 4];
            read_field(io, &mut a, request, "DST.ADDR", false).await?;
            Dst::Addr(IpAddr::from(Ipv4Addr::from(a)))
        }
        ATYP_IPV6 => {
            let mut a = [0u8; 16];
            read_field(io, &mut a, request, "DST.ADDR", false).await?;
            Dst::Addr(IpAddr::from(Ipv6Addr::from(a)))
        }
        ATYP_DOMAIN => {
            let len = read_u8(io, request, "DST.ADDR", false).await?;
            let mut name = [0u8; 255];
            let name = &mut name[..usize::from(len)];
            read_field(io, name, request, "DST.ADDR", false).await?;
            domain(name)
        }
        _ => {
            // The address's length is unknown: nothing more can be read.
            let _ = reply(io, Reply::AddressTypeNotSupported, UNSPECIFIED).await;
            return Err(bad("ATYP", "not IPv4 (1), a domain name (3) or IPv6 (4)"));
        }
    };
    let mut port = [0u8; 2];
    read_field(io, &mut port, request, "DST.PORT", false).await?;
    let port = u16::from_be_bytes(port);
    let refused = if version != VERSION {
        Some(("VER", "not 5"))
    } else if reserved != 0 {
        Some(("RSV", "not 0"))
    } else {
        None
    };
    if let Some((field, why)) = refused {
        let _ = reply(io, Reply::GeneralFailure, UNSPECIFIED).await;
        return Err(bad(field, why));
    }
    let target = match target {
        Dst::Addr(ip) => Target::Addr(SocketAddr::new(ip, port)),
        Dst::Name(host) => Target::Name { host, port },
        Dst::Bad(why) => {
            let _ = reply(io, Reply::HostUnreachable, UNSPECIFIED).await;
            return Err(bad("DST.ADDR", why));
        }
    };
    Ok(match command {
        CMD_CONNECT => Request::Connect(target),
        CMD_BIND => Request::Unsupported {
            command: Command::Bind,
            target,
        },
        CMD_UDP_ASSOCIATE => Request::Unsupported {
            command: Command::UdpAssociate,
            target,
        },
        other => Request::Unsupported {
            command: Command::Other(other),
            target,
        },
    })
}

/// A request's destination address field, judged.
enum Dst {
    Addr(IpAddr),
    Name(Host),
    Bad(&'static str),
}

/// A domain field: an address literal, a name, or why it is neither.
fn domain(raw: &[u8]) -> Dst {
    if raw.is_empty() {
        return Dst::Bad("the domain name is empty");
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return Dst::Bad("the domain name is not UTF-8");
    };
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Dst::Addr(ip);
    }
    if raw.iter().any(|b| b.is_ascii_control()) {
        return Dst::Bad("the domain name has a control byte");
    }
    if !raw
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Dst::Bad("the domain name has a byte other than a letter, digit, '-', '_' or '.'");
    }
    // Only lower-cases and drops trailing dots here: with these bytes the
    // text has no port and no brackets. Without its dots it may be a
    // literal (`127.0.0.1.`).
    let host = Host::new(text);
    if host.as_str().is_empty() {
        return Dst::Bad("the domain name is only dots");
    }
    match host.ip() {
        Some(ip) => Dst::Addr(ip),
        None => Dst::Name(host),
    }
}

/// The bound address of a reply that has none to give.
pub const UNSPECIFIED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// Writes a reply (RFC 1928 §6): `code` and the address the gateway dialed
/// from (`BND.ADDR`, `BND.PORT`; [`UNSPECIFIED`] when there is none), as
/// IPv4 or IPv6 by its family.
pub async fn reply<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    code: Reply,
    bound: SocketAddr,
) -> io::Result<()> {
    let mut out = [0u8; 4 + 16 + 2];
    out[..3].copy_from_slice(&[VERSION, code as u8, 0]);
    let end = match bound.ip() {
        IpAddr::V4(ip) => {
            out[3] = ATYP_IPV4;
            out[4..8].copy_from_slice(&ip.octets());
            8
        }
        IpAddr::V6(ip) => {
            out[3] = ATYP_IPV6;
            out[4..20].copy_from_slice(&ip.octets());
            20
        }
    };
    out[end..end + 2].copy_from_slice(&bound.port().to_be_bytes());
    write_flush(io, &out[..end + 2]).await
}

/// Answers a [`Request::Unsupported`] with reply 0x07 (command not
/// supported); the caller closes.
pub async fn refuse_command<IO: AsyncWrite + Unpin>(io: &mut IO) -> io::Result<()> {
    reply(io, Reply::CommandNotSupported, UNSPECIFIED).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    fn greeting(methods: &[u8]) -> Vec<u8> {
        let mut v = vec![5, methods.len() as u8];
        v.extend_from_slice(methods);
        v
    }

    fn auth(user: &[u8], pass: &[u8]) -> Vec<u8> {
        let mut v = vec![1, user.len() as u8];
        v.extend_from_slice(user);
        v.push(pass.len() as u8);
        v.extend_from_slice(pass);
        v
    }

    fn request(cmd: u8, addr: &[u8], port: u16) -> Vec<u8> {
        let mut v = vec![5, cmd, 0];
        v.extend_from_slice(addr);
        v.extend_from_slice(&port.to_be_bytes());
        v
    }

    fn name(n: &[u8]) -> Vec<u8> {
        let mut v = vec![ATYP_DOMAIN, n.len() as u8];
        v.extend_from_slice(n);
        v
    }

    /// Runs `input` (then end of stream) through a handshake and, when
    /// authenticated, `accept`; returns the outcome and every byte the
    /// server wrote.
    async fn run(input: &[u8]) -> (Result<(Credentials, Request), Socks5Error>, Vec<u8>) {
        let (mut client, mut server) = duplex(4096);
        client.write_all(input).await.unwrap();
        // The writer is dropped: a handshake waiting for more sees the end.
        client.shutdown().await.unwrap();
        let outcome = async {
            let h = handshake(&mut server).await?;
            let creds = h.credentials().clone();
            let request = h.accept(&mut server).await?;
            Ok((creds, request))
        }
        .await;
        drop(server);
        let mut written = Vec::new();
        client.read_to_end(&mut written).await.unwrap();
        (outcome, written)
    }

    fn full(target: &[u8], cmd: u8) -> Vec<u8> {
        let mut v = greeting(&[0, 2]);
        v.extend(auth(b"sbx-1", b"s3cret"));
        v.extend(request(cmd, target, 443));
        v
    }

    #[tokio::test]
    async fn a_connect_by_name_ipv4_and_ipv6_is_read_whole() {
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let mut v6_field = vec![ATYP_IPV6];
        v6_field.extend_from_slice(&v6.octets());
        for (addr, want) in [
            (
                name(b"API.Stripe.com."),
                Target::Name {
                    host: Host::new("api.stripe.com"),
                    port: 443,
                },
            ),
            (
                vec![ATYP_IPV4, 203, 0, 113, 9],
                Target::Addr("203.0.113.9:443".parse().unwrap()),
            ),
            (v6_field, Target::Addr("[2001:db8::1]:443".parse().unwrap())),
            // A domain that is a literal is the address.
            (name(b"::1"), Target::Addr("[::1]:443".parse().unwrap())),
            (
                name(b"127.0.0.1"),
                Target::Addr("127.0.0.1:443".parse().unwrap()),
            ),
            (
                name(b"127.0.0.1.."),
                Target::Addr("127.0.0.1:443".parse().unwrap()),
            ),
        ] {
            let (outcome, written) = run(&full(&addr, CMD_CONNECT)).await;
            let (creds, request) = outcome.unwrap();
            assert_eq!(creds.username, "sbx-1");
            assert_eq!(creds.password, "s3cret");
            assert_eq!(request, Request::Connect(want));
            // Method 0x02 chosen, then authenticated; no reply yet.
            assert_eq!(written, [5, 2, 1, 0]);
        }
    }

    #[tokio::test]
    async fn the_handshake_leaves_the_tunneled_bytes_unread_and_replies_by_family() {
        let (mut client, mut server) = duplex(4096);
        let mut input = full(&name(b"vendor.test"), CMD_CONNECT);
        input.extend_from_slice(b"GET / HTTP/1.1\r\n");
        client.write_all(&input).await.unwrap();
        let h = handshake(&mut server).await.unwrap();
        let r = h.accept(&mut server).await.unwrap();
        assert!(matches!(r, Request::Connect(Target::Name { .. })));
        reply(&mut server, Reply::Succeeded, "[::1]:8080".parse().unwrap())
            .await
            .unwrap();
        reply(
            &mut server,
            Reply::Succeeded,
            "10.0.0.1:80".parse().unwrap(),
        )
        .await
        .unwrap();
        let mut rest = [0u8; 16];
        server.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"GET / HTTP/1.1\r\n");
        let mut out = vec![0u8; 4 + 22 + 10];
        client.read_exact(&mut out).await.unwrap();
        let mut v6 = vec![5, 0, 0, 4];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&8080u16.to_be_bytes());
        assert_eq!(&out[4..26], &v6[..]);
        assert_eq!(&out[26..], &[5, 0, 0, 1, 10, 0, 0, 1, 0, 80]);
    }

    #[tokio::test]
    async fn a_message_cut_at_any_byte_is_an_error_naming_where() {
        let whole = full(&name(b"vendor.test"), CMD_CONNECT);
        let greeting_len = 4;
        let auth_len = 2 + 5 + 1 + 6;
        for cut in 0..whole.len() {
            let (outcome, _) = run(&whole[..cut]).await;
            let err = outcome.expect_err("a cut handshake cannot succeed");
            let message = if cut < greeting_len {
                Message::Greeting
            } else if cut < greeting_len + auth_len {
                Message::Auth
            } else {
                Message::Request
            };
            match err {
                Socks5Error::Closed(m) => {
                    assert_eq!(m, message, "cut at {cut}");
                    assert!(
                        [0, greeting_len, greeting_len + auth_len].contains(&cut),
                        "cut at {cut} is mid-message"
                    );
                }
                Socks5Error::Truncated { message: m, field } => {
                    assert_eq!(m, message, "cut at {cut}");
                    assert!(!field.is_empty());
                }
                other => panic!("cut at {cut}: {other}"),
            }
        }
        // A few by name.
        let (e, _) = run(&whole[..1]).await;
        assert!(matches!(
            e.unwrap_err(),
            Socks5Error::Truncated {
                field: "NMETHODS",
                ..
            }
        ));
        let (e, _) = run(&whole[..greeting_len + 3]).await;
        assert!(matches!(
            e.unwrap_err(),
            Socks5Error::Truncated { field: "UNAME", .. }
        ));
        let (e, _) = run(&whole[..whole.len() - 1]).await;
        assert!(matches!(
            e.unwrap_err(),
            Socks5Error::Truncated {
                field: "DST.PORT",
                ..
            }
        ));
    }

    #[tokio::test]
    async fn usernames_and_passwords_of_255_bytes_pass_and_empty_ones_do_not() {
        let long = [b'a'; 255];
        let mut input = greeting(&[2]);
        input.extend(auth(&long, &long));
        input.extend(request(CMD_CONNECT, &[ATYP_IPV4, 1, 2, 3, 4], 80));
        let (outcome, _) = run(&input).await;
        let (creds, _) = outcome.unwrap();
        assert_eq!(creds.username.len(), 255);
        assert_eq!(creds.password.len(), 255);

        for (user, pass, field) in [
            (&b""[..], &b"p"[..], "UNAME"),
            (b"u", b"", "PASSWD"),
            (b"\xff", b"p", "UNAME"),
            (b"u\n", b"p", "UNAME"),
            (b"u", b"\xc3", "PASSWD"),
        ] {
            let mut input = greeting(&[2]);
            input.extend(auth(user, pass));
            let (outcome, written) = run(&input).await;
            match outcome.unwrap_err() {
                Socks5Error::BadField {
                    message: Message::Auth,
                    field: f,
                    ..
                } => assert_eq!(f, field, "{user:?} {pass:?}"),
                other => panic!("{other}"),
            }
            assert_eq!(written, [5, 2, 1, 1], "refused in the protocol's words");
        }
        // The length byte says how much follows: a ULEN past the data is a cut.
        let mut input = greeting(&[2]);
        input.extend([1, 200, b'a']);
        assert!(matches!(
            run(&input).await.0.unwrap_err(),
            Socks5Error::Truncated { field: "UNAME", .. }
        ));
        assert!(Credentials::new(&[b'a'; 256], b"p").is_err());
        assert!(Credentials::new(b"u", &[b'a'; 256]).is_err());
    }

    #[tokio::test]
    async fn bind_and_udp_associate_are_their_own_value_and_answered_0x07() {
        for (cmd, want) in [
            (CMD_BIND, Command::Bind),
            (CMD_UDP_ASSOCIATE, Command::UdpAssociate),
            (0x09, Command::Other(9)),
        ] {
            let (mut client, mut server) = duplex(4096);
            client
                .write_all(&full(&[ATYP_IPV4, 0, 0, 0, 0], cmd))
                .await
                .unwrap();
            let h = handshake(&mut server).await.unwrap();
            match h.accept(&mut server).await.unwrap() {
                Request::Unsupported { command, target } => {
                    assert_eq!(command, want);
                    assert_eq!(target, Target::Addr("0.0.0.0:443".parse().unwrap()));
                }
                other => panic!("{other:?}"),
            }
            refuse_command(&mut server).await.unwrap();
            drop(server);
            let mut written = Vec::new();
            client.read_to_end(&mut written).await.unwrap();
            assert_eq!(written, [5, 2, 1, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
        }
    }

    #[tokio::test]
    async fn a_client_without_username_password_gets_0xff() {
        for methods in [&[0u8][..], &[0, 1, 3, 0x80], &[]] {
            let (outcome, written) = run(&greeting(methods)).await;
            match outcome.unwrap_err() {
                Socks5Error::NoAcceptableMethod { methods: m } => assert_eq!(m, methods),
                other => panic!("{other}"),
            }
            assert_eq!(written, [5, 0xFF]);
        }
        // SOCKS4 and HTTP get no answer at all.
        for input in [&[4u8, 1, 0, 80, 127, 0, 0, 1, 0][..], b"GET / HTTP/1.1\r\n"] {
            let (outcome, written) = run(input).await;
            assert!(matches!(
                outcome.unwrap_err(),
                Socks5Error::BadVersion {
                    message: Message::Greeting,
                    ..
                }
            ));
            assert!(written.is_empty());
        }
        let mut input = greeting(&[2]);
        input.extend([5, 1, b'u', 1, b'p']);
        let (outcome, written) = run(&input).await;
        assert!(matches!(
            outcome.unwrap_err(),
            Socks5Error::BadAuthVersion(5)
        ));
        assert_eq!(written, [5, 2, 1, 1]);
    }

    #[tokio::test]
    async fn refusing_the_credentials_answers_01_01_and_reads_no_request() {
        let (mut client, mut server) = duplex(4096);
        client.write_all(&full(&name(b"x.test"), 1)).await.unwrap();
        let h = handshake(&mut server).await.unwrap();
        h.refuse(&mut server).await.unwrap();
        let mut out = [0u8; 4];
        client.read_exact(&mut out).await.unwrap();
        assert_eq!(out, [5, 2, 1, 1]);
        // The request is still unread.
        let mut ver = [0u8; 1];
        server.read_exact(&mut ver).await.unwrap();
        assert_eq!(ver, [5]);
    }

    #[tokio::test]
    async fn bad_request_fields_are_answered_with_their_reply_code() {
        let unspecified_reply = |code: u8| {
            let mut v = vec![5, 2, 1, 0];
            v.extend([5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
            v
        };
        let with_request = |req: Vec<u8>| {
            let mut v = greeting(&[2]);
            v.extend(auth(b"u", b"p"));
            v.extend(req);
            v
        };
        let mut rsv = request(1, &[ATYP_IPV4, 1, 1, 1, 1], 80);
        rsv[2] = 1;
        let mut ver = request(1, &[ATYP_IPV4, 1, 1, 1, 1], 80);
        ver[0] = 4;
        for (req, field, code) in [
            (request(1, &name(b""), 80), "DST.ADDR", 4),
            (request(1, &name(b"a\0b.test"), 80), "DST.ADDR", 4),
            (request(1, &name(b"a\r\nHost: x"), 80), "DST.ADDR", 4),
            (request(1, &name(b"\xff\xfe"), 80), "DST.ADDR", 4),
            (request(1, &name(b"evil.test:1"), 80), "DST.ADDR", 4),
            (request(1, &name(b"[::1]"), 80), "DST.ADDR", 4),
            (
                request(1, &name("bücher.test".as_bytes()), 80),
                "DST.ADDR",
                4,
            ),
            (request(1, &name(b"..."), 80), "DST.ADDR", 4),
            (request(1, &[0x05, 1, 2, 3, 4], 80), "ATYP", 8),
            (rsv, "RSV", 1),
            (ver, "VER", 1),
        ] {
            let (outcome, written) = run(&with_request(req.clone())).await;
            match outcome.unwrap_err() {
                Socks5Error::BadField {
                    message: Message::Request,
                    field: f,
                    ..
                } => assert_eq!(f, field, "{req:?}"),
                other => panic!("{req:?}: {other}"),
            }
            assert_eq!(written, unspecified_reply(code), "{req:?}");
        }
    }

    #[test]
    fn the_password_never_shows_in_debug() {
        let c = Credentials::new(b"sbx", b"hunter2-secret").unwrap();
        let shown = format!(
            "{c:?} {:?}",
            Handshake {
                credentials: c.clone()
            }
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("sbx"), "{shown}");
    }

    #[test]
    fn the_first_byte_tells_the_protocols_apart() {
        assert_eq!(first_byte(5), Inbound::Socks5);
        assert_eq!(first_byte(0x16), Inbound::Tls);
        for b in b'A'..=b'Z' {
            assert_eq!(first_byte(b), Inbound::Http);
        }
        for b in [4u8, 0, b'a', b'@', b'[', 0x17, 0xff] {
            assert_eq!(first_byte(b), Inbound::Other, "{b}");
        }
    }

    #[tokio::test]
    async fn no_handshake_reads_more_than_its_bound() {
        // The longest handshake there is, then more bytes than it may read.
        let long = [b'a'; 255];
        let mut input = greeting(&[2; 255]);
        input.extend(auth(&long, &long));
        input.extend(request(1, &name(&long), 1));
        assert_eq!(input.len(), MAX_HANDSHAKE);
        input.extend([0xAA; 64]);
        let (mut client, mut server) = duplex(8192);
        client.write_all(&input).await.unwrap();
        client.shutdown().await.unwrap();
        let h = handshake(&mut server).await.unwrap();
        h.accept(&mut server).await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, [0xAA; 64]);
    }
}
